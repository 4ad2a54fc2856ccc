"""The compiler base class with its memory and disk caches, and :class:`CompileError`.

A device plugin subclasses :class:`Compiler` and implements :meth:`Compiler.compile`;
everyone else calls :meth:`Compiler.compile_cached`, which looks in a per-instance
dictionary, then in the on-disk cache, and compiles only on a double miss.

Disk cache entries live in ``cache_dir()/"compile"``, keyed by ``cachekey + "\\0" + src``
(see :mod:`ember.diskcache` for the crash-safe layout): a corrupt entry is recompiled, never used.
"""
from __future__ import annotations

import abc

from ember import diskcache
from ember.diskcache import MAGIC  # noqa: F401  (part of the documented cache format)
from ember.helpers import GlobalCounters


class CompileError(RuntimeError):
    """A kernel failed to compile. The message shows the numbered source and the compiler's output."""

    def __init__(self, src: str, output: str, what: str = "compile failed"):
        self.src, self.output, self.what = src, output, what
        super().__init__(format_compile_error(src, output, what))

    def __reduce__(self) -> tuple[type[CompileError], tuple[str, str, str]]:
        # The default pickling would call __init__ with the formatted message only (multiprocessing needs this).
        return (CompileError, (self.src, self.output, self.what))


def format_compile_error(src: str, output: str, what: str = "compile failed") -> str:
    """The text of a :class:`CompileError`: a headline, the source with line numbers, the compiler output."""
    lines = src.splitlines()
    width = len(str(len(lines)))
    numbered = "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, start=1))
    return f"{what}\n--- source ---\n{numbered}\n--- compiler output ---\n{output.rstrip()}"


class Compiler(abc.ABC):
    """Turns source text into a device binary.

    ``cachekey`` names everything besides the source that decides the binary: the
    compiler, its version, its flags and the target. Two compilers with the same key must
    produce interchangeable binaries. ``None`` turns the disk cache off for this compiler.
    """

    def __init__(self, cachekey: str | None):
        self.cachekey = cachekey
        self.memory_cache: dict[str, bytes] = {}

    @abc.abstractmethod
    def compile(self, src: str) -> bytes:
        """Compile ``src`` to a binary; raise :class:`CompileError` on failure."""

    def compile_cached(self, src: str) -> bytes:
        """Like :meth:`compile`, but served from the memory or disk cache when possible."""
        binary = self.memory_cache.get(src)
        if binary is not None:
            return binary
        path = diskcache.entry_path("compile", f"{self.cachekey}\0{src}") if self.cachekey is not None else None
        if path is not None:
            binary = diskcache.read(path)
        if binary is None:
            binary = self.compile(src)
            GlobalCounters.kernels_compiled += 1
            if path is not None:
                diskcache.write(path, binary)
        self.memory_cache[src] = binary
        return binary
