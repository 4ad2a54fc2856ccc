"""The compiler base class with its memory and disk caches, and :class:`CompileError`.

A device plugin subclasses :class:`Compiler` and implements :meth:`Compiler.compile`;
everyone else calls :meth:`Compiler.compile_cached` (or :meth:`Compiler.compile_cached_many` for the
kernels of a whole schedule, :meth:`Compiler.compile_cached_stream` for kernels still being rendered),
which looks in a per-instance dictionary, then in the on-disk cache, and compiles only on a double miss.

A driver whose every build has a large fixed cost (a kernel compiler that parses a large built-in
header for each program, or a compiler started as a process) also overrides
:meth:`Compiler.compile_batch` to build the misses of a schedule together; each source still gets
its own cache entry.

Disk cache entries live in ``cache_dir()/"compile"``, keyed by ``cachekey + "\\0" + src``
(see :mod:`ember.diskcache` for the layout): a corrupt entry, or one written for another key, is
recompiled, never used; an intact binary the runtime refuses to load is dropped with :meth:`Compiler.invalidate`
and rebuilt.
"""
from __future__ import annotations

import abc
import pathlib
from collections.abc import Iterable, Sequence

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

    def compile_batch(self, srcs: Sequence[str]) -> list[bytes]:
        """Compile several sources; return one binary per source, in order.

        The default compiles them one by one. Override it when one build of many kernels costs
        much less than many builds; the binary returned for each source must then load (through
        the device's runtime, with that source's kernel name) on its own. Raise
        :class:`CompileError` naming the source that failed.
        """
        return [self.compile(src) for src in srcs]

    def compile_cached(self, src: str) -> bytes:
        """Like :meth:`compile`, but served from the memory or disk cache when possible."""
        return self.compile_cached_many([src])[0]

    def compile_cached_many(self, srcs: Sequence[str]) -> list[bytes]:
        """Like :meth:`compile_batch`, but each source is served from the memory or disk cache when
        possible; only the misses are compiled, together in one :meth:`compile_batch` call."""
        found: dict[str, bytes] = {}
        misses: list[str] = []
        for src in srcs:
            if src in found or src in misses:
                continue
            if (binary := self.cached(src)) is None:
                misses.append(src)
            else:
                found[src] = binary
        if misses:
            binaries = self.compile_batch(misses) if len(misses) > 1 else [self.compile(misses[0])]
            if len(binaries) != len(misses):
                raise RuntimeError(f"{type(self).__name__}.compile_batch returned {len(binaries)} binaries for "
                                   f"{len(misses)} sources")
            for src, binary in zip(misses, binaries):
                found[src] = self.store(src, binary)
        return [found[src] for src in srcs]

    def compile_cached_stream(self, srcs: Iterable[str]) -> list[bytes]:
        """Like :meth:`compile_cached_many`, for sources still being produced: ``srcs`` may be a generator
        that renders each kernel when asked.

        The default takes them all, then compiles the misses together. A compiler that builds in
        other processes overrides it to start building while the rest are still being rendered.
        """
        return self.compile_cached_many(list(srcs))

    def quick_tier(self) -> Compiler | None:
        """A compiler for a cheaper build of the same sources, run first when tiered compilation is on
        (``TIERED=1``, :mod:`ember.engine.tiers`), or ``None`` (the default: no quick tier).

        Its binaries must load through the same runtime, and its ``cachekey`` must differ from this
        compiler's (it makes other binaries). Its results may differ in the last bits (contraction into
        fused multiply-adds follows the optimizer), never otherwise."""
        return None

    def background(self) -> Compiler:
        """The compiler to make the optimized builds with while kernels already run from quick ones (same
        binaries, same cache entries). The default is this compiler; one that builds in other processes may
        return a copy that runs them at a low priority, so they take the cores the program leaves idle. Its
        builds may still be under way when the interpreter exits: it must not start thread pools then."""
        return self

    def cached(self, src: str) -> bytes | None:
        """``src``'s binary from the memory or disk cache, or ``None`` (then it must be compiled)."""
        binary = self.memory_cache.get(src)
        if binary is None and (path := self._entry(src)) is not None:
            binary = diskcache.read(path)
            if binary is not None:
                self.memory_cache[src] = binary
        return binary

    def store(self, src: str, binary: bytes) -> bytes:
        """Keep a freshly compiled ``binary`` for ``src`` (memory and disk) and count it; return it."""
        GlobalCounters.kernels_compiled += 1
        if (path := self._entry(src)) is not None:
            diskcache.write(path, binary)
        self.memory_cache[src] = binary
        return binary

    def invalidate(self, src: str) -> None:
        """Forget ``src``'s binary (memory and disk): it was found unusable, so the next request rebuilds it."""
        self.memory_cache.pop(src, None)
        diskcache.invalidate(self._entry(src))

    def _entry(self, src: str) -> pathlib.Path | None:
        """Where ``src``'s binary is cached on disk, or ``None`` when this compiler or the disk cache is off."""
        return None if self.cachekey is None else diskcache.entry_path("compile", f"{self.cachekey}\0{src}")
