"""The compiler base class with its memory and disk caches, and :class:`CompileError`.

A device plugin subclasses :class:`Compiler` and implements :meth:`Compiler.compile`;
everyone else calls :meth:`Compiler.compile_cached`, which looks in a per-instance
dictionary, then in the on-disk cache, and compiles only on a double miss.

Disk cache layout: one file per entry in ``cache_dir()/"compile"``, named by
``sha256(cachekey + "\\0" + src)``. A file holds ``MAGIC + sha256(payload) + payload``.
Entries are written to a temporary file in the same folder and renamed into place, so a
reader never sees half an entry; an entry that fails the checks (wrong magic, wrong
checksum, truncated) is deleted and recompiled, never used.
"""
from __future__ import annotations

import abc
import hashlib
import os
import pathlib
import tempfile
import warnings

from ember.helpers import CACHELEVEL, DEBUG, GlobalCounters, cache_dir

#: First bytes of every disk cache entry (bump the digit when the layout changes).
MAGIC = b"EMBERCC1"
_DIGEST_LEN = 32

# Cache folders that failed with an IO error, per direction: warned about once, then skipped for the process.
_unreadable_dirs: set[str] = set()
_unwritable_dirs: set[str] = set()


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
        path = self._disk_path(src)
        if path is not None:
            binary = self._disk_read(path)
        if binary is None:
            binary = self.compile(src)
            GlobalCounters.kernels_compiled += 1
            if path is not None:
                self._disk_write(path, binary)
        self.memory_cache[src] = binary
        return binary

    # ---- disk cache ----

    def _disk_path(self, src: str) -> pathlib.Path | None:
        """Where the entry for ``src`` lives, or ``None`` when the disk cache is off."""
        if self.cachekey is None or CACHELEVEL.value <= 0:
            return None
        folder = cache_dir() / "compile"
        name = hashlib.sha256(f"{self.cachekey}\0{src}".encode()).hexdigest()
        return folder / name

    def _disk_read(self, path: pathlib.Path) -> bytes | None:
        """The payload stored at ``path`` if it is present and intact, else ``None`` (a bad entry is deleted)."""
        if str(path.parent) in _unreadable_dirs:
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            _disk_failed(path.parent, e, _unreadable_dirs, "read")
            return None
        head = len(MAGIC) + _DIGEST_LEN
        payload = data[head:]
        intact = len(data) >= head and data[:len(MAGIC)] == MAGIC
        if intact and hashlib.sha256(payload).digest() == data[len(MAGIC):head]:
            return payload
        if DEBUG >= 1:
            print(f"compile cache: ignoring corrupt entry {path}")
        try:
            path.unlink()
        except OSError:
            pass  # a concurrent reader may have deleted it; the rewrite below replaces it anyway
        return None

    def _disk_write(self, path: pathlib.Path, payload: bytes) -> None:
        """Store ``payload`` at ``path`` atomically; an IO error only warns (once per folder) and stops writes there."""
        if str(path.parent) in _unwritable_dirs:
            return
        tmp_name = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp_name, path)
        except OSError as e:
            if tmp_name is not None:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass
            _disk_failed(path.parent, e, _unwritable_dirs, "write")


def _disk_failed(folder: pathlib.Path, error: OSError, broken: set[str], action: str) -> None:
    """Warn once per folder and direction, then stop trying that direction."""
    key = str(folder)
    if key not in broken:
        broken.add(key)
        warnings.warn(f"compile cache: cannot {action} {folder} ({error}); continuing without it",
                      RuntimeWarning, stacklevel=4)
