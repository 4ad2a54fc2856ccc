"""A small, crash-safe on-disk key/value cache (compiled kernels, lowered programs).

Layout: one file per entry in ``cache_dir()/<table>``, named ``sha256(key)``. A file holds
``MAGIC + sha256(payload) + payload``. Entries are written to a temporary file in the same
folder and renamed into place, so a reader never sees half an entry; an entry that fails
the checks (wrong magic, wrong checksum, truncated) is deleted and treated as a miss, never
trusted. IO errors (read-only or full disk) warn once per folder and direction, then that
direction is skipped for the rest of the process. ``CACHELEVEL=0`` turns the cache off.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
import warnings

from ember.helpers import CACHELEVEL, DEBUG, cache_dir

#: First bytes of every entry (bump the digit when the layout changes).
MAGIC = b"EMBERCC1"
_DIGEST_LEN = 32

# Cache folders that failed with an IO error, per direction: warned about once, then skipped for the process.
_unreadable_dirs: set[str] = set()
_unwritable_dirs: set[str] = set()


def entry_path(table: str, key: str) -> pathlib.Path | None:
    """Where the entry for ``key`` in ``table`` lives, or ``None`` when the disk cache is off."""
    if CACHELEVEL.value <= 0:
        return None
    return cache_dir() / table / hashlib.sha256(key.encode()).hexdigest()


def read(path: pathlib.Path) -> bytes | None:
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
        print(f"disk cache: ignoring corrupt entry {path}")
    try:
        path.unlink()
    except OSError:
        pass  # a concurrent reader may have deleted it; the rewrite replaces it anyway
    return None


def write(path: pathlib.Path, payload: bytes) -> None:
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
        warnings.warn(f"disk cache: cannot {action} {folder} ({error}); continuing without it",
                      RuntimeWarning, stacklevel=4)
