"""Load compiled kernels (shared objects held in memory) and call them through cffi.

Every kernel has the same C signature::

    void NAME(void **bufs, const long long *vals);

``bufs[i]`` points at buffer parameter ``i`` and ``vals[j]`` is int variable ``j``. The
shared object is loaded from an anonymous memory file (``memfd_create`` and
``dlopen("/proc/self/fd/N")``), falling back to a temporary file that is deleted right
after loading.

The dynamic loader recognises an already loaded library by its path, and a memory file's
path ``/proc/self/fd/N`` repeats once ``N`` is reused. So the file descriptor stays open
for as long as the library is loaded, and it is only closed after ``dlclose`` really
unloaded the library (checked with ``RTLD_NOLOAD``); otherwise it is kept open for good.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
import weakref
from typing import Any

from ember.device import KernelBinary, sha256
from ember_cpu import cdefs

#: the declarations of :data:`ember_cpu.cdefs.CDEF` (prebuilt: parsing them at start-up costs ~65 ms)
ffi = cdefs.load()


def _open_libdl() -> Any:
    """The dl* functions: in libc itself on current glibc, in libdl on older systems."""
    for name in (None, "libdl.so.2", "libdl.so", "libc.so.6"):
        try:
            lib = ffi.dlopen(name)
            lib.dlopen  # noqa: B018 - make sure the symbol resolves here
            return lib
        except (OSError, AttributeError):
            continue
    raise OSError("cannot find dlopen/dlsym in this process")


_dl = _open_libdl()
_RTLD_NOW: int = getattr(os, "RTLD_NOW", 2)
_RTLD_LOCAL: int = getattr(os, "RTLD_LOCAL", 0)
_RTLD_NOLOAD: int = getattr(os, "RTLD_NOLOAD", 4)
_RTLD_NODELETE: int = getattr(os, "RTLD_NODELETE", 0x1000)
# OpenMP runtimes a kernel may pull in. Once one is loaded it is made permanent: unloading it
# together with the last kernel that used it would pull the code from under its idle worker threads.
_OPENMP_RUNTIMES: list[bytes] = [b"libgomp.so.1", b"libomp.so.5", b"libiomp5.so"]
# entries per program in each argument array cache (cleared when full)
_ARRAY_CACHE_SIZE = 64
# memory files whose library could not be unloaded: never closed, so their path is never reused
_pinned_fds: list[int] = []


def _dl_error() -> str:
    err = _dl.dlerror()
    return ffi.string(err).decode(errors="replace") if err != ffi.NULL else "unknown dlopen error"


def _is_loaded(path: str) -> bool:
    """Whether a library with this path is loaded in the process (without loading it)."""
    handle = _dl.dlopen(path.encode(), _RTLD_NOW | _RTLD_NOLOAD)
    if handle == ffi.NULL:
        return False
    _dl.dlclose(handle)
    return True


def _pin_openmp_runtimes(binary: bytes) -> None:
    """Make the OpenMP runtimes that ``binary`` links never unloaded (``RTLD_NOLOAD | RTLD_NODELETE``)."""
    for name in list(_OPENMP_RUNTIMES):
        if name not in binary:  # the soname is in the dynamic string table of a library that needs it
            continue
        handle = _dl.dlopen(name, _RTLD_NOW | _RTLD_NOLOAD | _RTLD_NODELETE)
        if handle != ffi.NULL:
            _dl.dlclose(handle)  # the runtime stays: it is pinned for the life of the process
            try:
                _OPENMP_RUNTIMES.remove(name)
            except ValueError:  # another thread pinned it first
                pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class SharedObject:
    """A shared object loaded from bytes; unloaded by :meth:`close` or when garbage collected."""

    def __init__(self, binary: bytes):
        self.handle: Any = ffi.NULL
        self.fd: int | None = None
        self.path = ""
        if hasattr(os, "memfd_create"):
            self._load_memfd(binary)
        if self.handle == ffi.NULL:
            self._load_tempfile(binary)
        if _OPENMP_RUNTIMES:
            _pin_openmp_runtimes(binary)

    def _load_memfd(self, binary: bytes) -> None:
        try:
            fd = os.memfd_create("ember-kernel", os.MFD_CLOEXEC)
        except OSError:
            return
        path = f"/proc/self/fd/{fd}"
        try:
            _write_all(fd, binary)
            handle = ffi.NULL if _is_loaded(path) else _dl.dlopen(path.encode(), _RTLD_NOW | _RTLD_LOCAL)
        except OSError:
            handle = ffi.NULL
        if handle == ffi.NULL:  # /proc not mounted, noexec memory files ...: use a real file
            os.close(fd)
            return
        self.handle, self.fd, self.path = handle, fd, path

    def _load_tempfile(self, binary: bytes) -> None:
        fd, path = tempfile.mkstemp(prefix="ember-kernel-", suffix=".so")
        try:
            try:
                _write_all(fd, binary)
            finally:
                os.close(fd)
            if _is_loaded(path):
                raise OSError(f"a different library named {path} is already loaded")
            handle = _dl.dlopen(path.encode(), _RTLD_NOW | _RTLD_LOCAL)
            if handle == ffi.NULL:
                raise OSError(f"cannot load compiled kernel: {_dl_error()}")
        finally:
            os.unlink(path)
        self.handle, self.path = handle, path

    def function(self, name: str, ctype: str = "ember_kernel_fn") -> Any:
        """The exported function ``name`` as a cffi function pointer of type ``ctype``."""
        if self.handle == ffi.NULL:
            raise ValueError("the shared object was closed")
        _dl.dlerror()
        sym = _dl.dlsym(self.handle, name.encode())
        if sym == ffi.NULL:
            raise AttributeError(f"compiled kernel has no function {name!r}: {_dl_error()}")
        return ffi.cast(ctype, sym)

    def close(self) -> None:
        """Unload the library; function pointers taken from it must not be called afterwards."""
        if self.handle == ffi.NULL:
            return
        _dl.dlclose(self.handle)
        self.handle = ffi.NULL
        if self.fd is not None:
            if _is_loaded(self.path):
                _pinned_fds.append(self.fd)  # still resident: never let another library get this path
            else:
                os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down globals already
            pass


# shared objects loaded now, by content: the kernels compiled in one batch share one library
_loaded: weakref.WeakValueDictionary[bytes, SharedObject] = weakref.WeakValueDictionary()
_loaded_lock = threading.Lock()


def load_shared_object(binary: bytes) -> SharedObject:
    """The loaded library for the shared object ``binary`` (loaded once while anything holds it)."""
    key = sha256(binary).digest()
    with _loaded_lock:
        lib = _loaded.get(key)
        if lib is None:
            lib = _loaded[key] = SharedObject(binary)
        return lib


class CPUProgram:
    """A compiled kernel: ``CPUProgram(name, binary)(*bufs, vals=(...), wait=False)``.

    Buffers are the allocator's :class:`~ember_cpu.allocator.CPUBuffer` handles (anything
    with a cffi pointer in ``.ptr``). ``global_size`` and ``local_size`` are accepted for
    the common signature and ignored: a CPU kernel runs its loops itself.
    """

    def __init__(self, name: str, binary: bytes):
        self.name = name
        try:
            kb = KernelBinary.unpack(binary)
        except ValueError as e:
            raise ValueError(f"kernel {name}: {e}") from None
        self.lib = load_shared_object(kb.program)  # kept alive with the program
        self.fn: Any = self.lib.function(kb.kernel_symbol(name))
        # Argument arrays reused across launches. Keyed by the pointer values they hold, so a
        # hit is always right even when a buffer was freed and its address handed out again.
        self._arg_arrays: dict[tuple[int, ...], Any] = {}
        self._val_arrays: dict[tuple[int, ...], Any] = {(): ffi.NULL}

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        key = tuple([b.address for b in bufs])
        args = self._arg_arrays.get(key)
        if args is None:
            if len(self._arg_arrays) >= _ARRAY_CACHE_SIZE:
                self._arg_arrays.clear()
            args = self._arg_arrays[key] = ffi.new("void*[]", [b.ptr for b in bufs]) if bufs else ffi.NULL
        if type(vals) is not tuple:
            vals = tuple(vals)
        ints = self._val_arrays.get(vals)
        if ints is None:
            if len(self._val_arrays) >= _ARRAY_CACHE_SIZE:
                self._val_arrays.clear()
                self._val_arrays[()] = ffi.NULL
            ints = self._val_arrays[vals] = ffi.new("long long[]", list(vals))
        if wait:
            start = time.perf_counter()
            self.fn(args, ints)
            return time.perf_counter() - start
        self.fn(args, ints)
        return None

    def __repr__(self) -> str:
        return f"<CPUProgram {self.name}>"
