"""A small on-disk key/value cache that trusts nothing it reads (compiled kernels, lowered programs).

Layout: one file per entry in ``cache_dir()/<table>``, named ``sha256(key)``. A file holds
``MAGIC + sha256(key) + sha256(payload) + payload``: the entry names the key it was written for, so a
file copied or renamed onto another key's name (or swapped with another entry) is refused, as is one
with a wrong magic, a wrong checksum or a truncated body. A refused entry is deleted and treated as a
miss, so the caller rebuilds and rewrites it. A caller that finds an intact entry unusable anyway (a
binary its runtime will not load) calls :func:`invalidate`.

Entries are written to a temporary file (mode 0600) in the same folder and renamed into place, so a
reader never sees half an entry. Only the current user's own things are trusted, whatever their mode
and even for root: a folder (the cache root or a table) owned by another user is not used, and an entry
owned by another user, or writable by others, is refused (deleted when we can). Folders are created
with mode 0700 whatever the umask; one of ours that others could write to is closed (its entries are
then checked one by one as they are read). IO errors (a read-only folder or disk, a full disk) warn
once per cache and direction, then that folder and direction are skipped for the rest of the process,
so kernels are compiled in memory. ``CACHELEVEL=0`` turns the cache off.

Size: ``EMBER_CACHE_MB`` (default 1024) bounds the whole cache. A read refreshes an entry's time,
and when writes take the cache over the limit the least recently used entries are deleted until it
is at 90% of it. ``python -m ember.cache`` shows and clears the cache.
"""
from __future__ import annotations

import errno
import io
import os
import pathlib
import pickle
import shutil
import stat
import tempfile
import warnings
from typing import Any

from ember.helpers import CACHELEVEL, DEBUG, cache_dir, getenv, sha256

#: First bytes of every entry (bump the digit when the layout changes).
MAGIC = b"EMBERCC2"
_DIGEST_LEN = 32
_HEAD = len(MAGIC) + 2 * _DIGEST_LEN

# Cache folders that failed with an IO error, per direction: warned about once, then skipped for the process.
_unreadable_dirs: set[str] = set()
_unwritable_dirs: set[str] = set()
# Folders checked (and made private) this process; bytes written since the last size check.
_checked_dirs: set[str] = set()
# (cache root, action) pairs already warned about
_warned: set[tuple[str, str]] = set()
_written_since_check = 0


def limit_bytes() -> int:
    """The size bound of the whole cache in bytes (``EMBER_CACHE_MB``, default 1024 MB; 0 means no bound)."""
    return int(getenv("EMBER_CACHE_MB", 1024)) * 1024 * 1024


def entry_path(table: str, key: str) -> pathlib.Path | None:
    """Where the entry for ``key`` in ``table`` lives, or ``None`` when the disk cache is off."""
    if CACHELEVEL.value <= 0:
        return None
    return cache_dir() / table / sha256(key.encode()).hexdigest()


def _key_digest(path: pathlib.Path) -> bytes | None:
    """The sha256 of the key an entry at ``path`` belongs to (its name), or None for a name no key has."""
    try:
        digest = bytes.fromhex(path.name)
    except ValueError:
        return None
    return digest if len(digest) == _DIGEST_LEN else None


class _Untrusted(Exception):
    """Something in the cache that may not be used: not ours, open to other users' writes, or not a file."""


def _euid() -> int | None:
    """The user the cache must belong to (``None`` where the platform has no owners)."""
    return os.geteuid() if hasattr(os, "geteuid") else None


def _read_own_file(path: pathlib.Path) -> bytes:
    """The bytes of ``path``, refused (raising :class:`_Untrusted`) unless it is a plain file of ours that only
    we can write. Checked on the opened file, so a swap between the check and the read changes nothing."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise _Untrusted("a folder where an entry belongs") from None
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise _Untrusted("a symbolic link where an entry belongs") from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _Untrusted("a folder where an entry belongs")
        if not stat.S_ISREG(st.st_mode):
            raise _Untrusted("not a plain file")
        uid = _euid()
        if uid is not None and st.st_uid != uid:
            raise _Untrusted(f"owned by uid {st.st_uid}, not by this user (uid {uid})")
        if uid is not None and stat.S_IMODE(st.st_mode) & 0o022:
            raise _Untrusted(f"other users may write to it (mode {stat.S_IMODE(st.st_mode):o})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def read(path: pathlib.Path) -> bytes | None:
    """The payload stored at ``path`` if it is present, intact and written for this key, else ``None``
    (a bad entry is deleted)."""
    folder = str(path.parent)
    if folder in _unreadable_dirs or not _private_dir(path.parent, create=False):
        return None
    try:
        data = _read_own_file(path)
    except FileNotFoundError:
        return None
    except _Untrusted as e:
        _discard(path, str(e))
        return None
    except OSError as e:
        _disk_failed(path.parent, e, _unreadable_dirs, "read")
        return None
    payload = data[_HEAD:]
    key = _key_digest(path)
    intact = (len(data) >= _HEAD and data[:len(MAGIC)] == MAGIC and key is not None
              and data[len(MAGIC):len(MAGIC) + _DIGEST_LEN] == key
              and sha256(payload).digest() == data[len(MAGIC) + _DIGEST_LEN:_HEAD])
    if intact:
        try:
            os.utime(path)  # least recently *used*: a hit keeps the entry young
        except OSError:
            pass
        return payload
    _discard(path, "corrupt or written for another key")
    return None


def write(path: pathlib.Path, payload: bytes) -> None:
    """Store ``payload`` at ``path`` atomically, bound to the key ``path`` is named for; an IO error only
    warns (once per folder) and stops writes there."""
    global _written_since_check
    key = _key_digest(path)
    if str(path.parent) in _unwritable_dirs or key is None:
        return
    tmp_name = None
    try:
        if not _private_dir(path.parent, create=True):
            return
        try:
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except FileNotFoundError:  # the folder was removed since it was checked (a clear): make it again
            _checked_dirs.discard(str(path.parent))
            if not _private_dir(path.parent, create=True):
                return
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + key + sha256(payload).digest() + payload)
        os.replace(tmp_name, path)
    except OSError as e:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass
        _disk_failed(path.parent, e, _unwritable_dirs, "write")
        return
    _written_since_check += len(payload) + _HEAD
    limit = limit_bytes()
    if limit and _written_since_check >= limit // 16:
        _written_since_check = 0
        prune(limit)


def invalidate(path: pathlib.Path | None) -> None:
    """Delete the entry at ``path``: it was intact but its user could not use it (it gets rebuilt)."""
    if path is not None:
        _discard(path, "unusable")


def restricted_loads(payload: bytes) -> Any:
    """Unpickle a cache payload, allowing only ember's own classes and plain builtins (never code)."""
    return _RestrictedUnpickler(io.BytesIO(payload)).load()


#: the only classes a cache payload may name besides plain builtins: data classes whose construction runs no
#: code of the payload's choosing. A forged entry cannot reach any other callable, ember's own functions
#: included (a module-wide allow-list would let it call, say, a file-writing helper with its own arguments).
PICKLE_CLASSES = frozenset({"ember.codegen.opts.Opt"})


class _RestrictedUnpickler(pickle.Unpickler):
    _BUILTINS = frozenset({"tuple", "list", "dict", "set", "frozenset", "int", "float", "str", "bytes", "bool",
                           "complex", "slice", "NoneType"})

    def find_class(self, module: str, name: str) -> Any:
        if (module == "builtins" and name in self._BUILTINS) or f"{module}.{name}" in PICKLE_CLASSES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"disk cache: refusing to load {module}.{name}")


# --- folders ---------------------------------------------------------------------------------------
def _private_dir(folder: pathlib.Path, create: bool) -> bool:
    """Whether ``folder`` (and the cache root above it) may be used: each must be a folder owned by the current
    user, whatever its mode and even for root (another user's folder is refused with one warning). One of ours
    that others could write to is closed first; one we cannot close (a read-only disk) is refused. Created with
    mode 0700 when ``create``."""
    key = str(folder)
    if key in _checked_dirs:
        return True
    if key in _unreadable_dirs and key in _unwritable_dirs:
        return False
    root = cache_dir()
    chain = [folder] if folder == root else [root, folder]
    for d in chain:
        if create:
            try:
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
            except FileExistsError:
                pass
        try:
            why = _untrusted_dir(d)
        except OSError as e:  # missing (a read before any write), or a file where the folder belongs
            if create and not isinstance(e, FileNotFoundError):
                raise
            return False
        if why is not None:
            _refuse_dir(d, folder, why)
            return False
    _checked_dirs.add(key)
    return True


def _untrusted_dir(d: pathlib.Path) -> str | None:
    """Why folder ``d`` may not be used, or ``None``; closes a folder of ours that others could write to."""
    uid = _euid()
    link = d.lstat()
    if stat.S_ISLNK(link.st_mode) and uid is not None and link.st_uid not in (uid, 0):
        return f"a symbolic link made by uid {link.st_uid}"
    st = d.stat()
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if uid is None:
        return None
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        # ours but open to others (made under a permissive umask by an older version): close it, keeping our own
        # bits, so a folder the user made read-only stays read-only
        try:
            os.chmod(d, mode & 0o700)
        except OSError as e:
            if mode & 0o022:
                return f"other users may write to it (mode {mode:o}) and it cannot be closed ({e})"
    return None


def _refuse_dir(d: pathlib.Path, folder: pathlib.Path, why: str) -> None:
    """Stop using ``d`` and ``folder`` below it in both directions for the rest of the process, with a warning."""
    _disk_failed(d, PermissionError(why), _unreadable_dirs, "trust")
    for k in {str(d), str(folder)}:
        _unreadable_dirs.add(k)
        _unwritable_dirs.add(k)


def _discard(path: pathlib.Path, why: str) -> None:
    if DEBUG >= 1:
        print(f"disk cache: deleting {path} ({why})")
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass  # a concurrent reader may have deleted it; the rewrite replaces it anyway


def _disk_failed(folder: pathlib.Path, error: OSError, broken: set[str], action: str) -> None:
    """Stop trying that direction in ``folder``; warn once per cache root and action (a read-only cache fails in
    every table: one warning says it)."""
    key = str(folder)
    if key in broken:
        return
    broken.add(key)
    said = (str(cache_dir()), action)
    if said not in _warned:
        _warned.add(said)
        warnings.warn(f"disk cache: cannot {action} {folder} ({error}); continuing without it (kernels are "
                      "compiled in memory)", RuntimeWarning, stacklevel=4)


# --- size: usage, eviction, clearing ---------------------------------------------------------------------
def _entries(root: pathlib.Path | None = None) -> list[tuple[float, int, pathlib.Path]]:
    """(last use, size, path) of every file in the cache's tables."""
    root = cache_dir() if root is None else root
    out: list[tuple[float, int, pathlib.Path]] = []
    try:
        tables = [t for t in root.iterdir() if t.is_dir() and not t.is_symlink()]
    except OSError:
        return out
    for table in tables:
        try:
            with os.scandir(table) as it:
                for e in it:
                    try:
                        if e.is_file(follow_symlinks=False) or e.is_symlink():
                            st = e.stat(follow_symlinks=False)
                            out.append((st.st_mtime, st.st_size, pathlib.Path(e.path)))
                    except OSError:
                        continue
        except OSError:
            continue
    return out


def usage() -> dict[str, tuple[int, int]]:
    """Per table: (number of entries, bytes)."""
    out: dict[str, tuple[int, int]] = {}
    for _, size, path in _entries():
        n, b = out.get(path.parent.name, (0, 0))
        out[path.parent.name] = (n + 1, b + size)
    return out


def prune(limit: int) -> int:
    """Delete least recently used entries until the cache holds at most 90% of ``limit`` bytes (when it is over
    ``limit``); returns how many were deleted."""
    entries = _entries()
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return 0
    target, deleted = limit * 9 // 10, 0
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= target:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        deleted += 1
    return deleted


def clear(table: str | None = None) -> int:
    """Delete every entry (of ``table`` only, when given); returns how many were deleted."""
    deleted = 0
    for _, _, path in _entries():
        if table is None or path.parent.name == table:
            try:
                path.unlink()
                deleted += 1
            except OSError:
                pass
    return deleted
