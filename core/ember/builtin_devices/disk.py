"""The built-in DISK device: a file seen as one flat buffer of bytes, memory-mapped.

A device name carries the file: ``DISK:/abs/path/to/file`` (only ``DISK`` is upper-cased when a
name is canonicalized, the path keeps its case). DISK stores bytes and cannot compute: it has no
renderer, compiler or runtime, and a kernel scheduled on it raises :class:`DiskComputeError`. What
it can do is what weights loading needs:

* ``Tensor.empty(n, dtype=dtypes.uint8, device="DISK:/path")`` views the first ``n`` bytes of a
  file (created, or grown with zeros, when it is shorter), and ``t.to("DISK:/path")`` writes a
  tensor's bytes into a file;
* the allocator memory-maps the file (:mod:`mmap`), so nothing is read until somebody touches
  the bytes; ``alloc(nbytes, "r")`` maps an existing file read-only;
* :meth:`DiskAllocator.offset` gives zero-copy sub-buffers (one tensor's bytes inside a weights
  file), :meth:`DiskAllocator.as_buffer` a :class:`memoryview` of them, so copying a DISK tensor
  ``.to("CPU")`` reads (and pages in) only that tensor's bytes.

A mapping lives as long as some buffer or memoryview made from it; it is never unmapped while in
use. Rewriting a mapped file in place (truncating it) is unsafe for any mmap user: replace files
atomically instead (:func:`ember.nn.state.safe_save` does).
"""
from __future__ import annotations

import errno
import mmap
import os
from typing import Any

from ember.device.allocator import Allocator

#: ``options`` of :meth:`DiskAllocator.alloc`: map an existing file read-only.
READ_ONLY = "r"
#: ``options`` of :meth:`DiskAllocator.alloc`: map read-write, creating or growing the file (the default).
READ_WRITE = "r+"


class DiskComputeError(RuntimeError):
    """A kernel was scheduled on a DISK device, which stores bytes and cannot compute."""


class _Mapping:
    """One memory map of (the first ``nbytes`` bytes of) one file."""

    __slots__ = ("path", "nbytes", "writable", "mm", "__weakref__")

    def __init__(self, path: str, nbytes: int, writable: bool, mm: mmap.mmap | None):
        self.path, self.nbytes, self.writable, self.mm = path, nbytes, writable, mm

    def view(self) -> memoryview:
        """A memoryview of the whole mapping (read-only when the mapping is)."""
        if self.mm is None:  # mmap cannot map 0 bytes
            return memoryview(bytearray(0) if self.writable else b"")
        return memoryview(self.mm)


class DiskBuffer:
    """The opaque handle of a DISK buffer: ``nbytes`` bytes starting ``offset`` bytes into a mapped file."""

    __slots__ = ("mapping", "offset", "nbytes")

    def __init__(self, mapping: _Mapping, offset: int, nbytes: int):
        self.mapping, self.offset, self.nbytes = mapping, offset, nbytes

    @property
    def path(self) -> str:
        """The absolute path of the file."""
        return self.mapping.path

    @property
    def readonly(self) -> bool:
        """True when the file is mapped read-only."""
        return not self.mapping.writable

    def view(self) -> memoryview:
        """A zero-copy memoryview of this buffer's bytes (read-only when the mapping is)."""
        return self.mapping.view()[self.offset:self.offset + self.nbytes]

    def __repr__(self) -> str:
        mode = "r" if self.readonly else "r+"
        return f"<DiskBuffer {self.path!r} [{self.offset}, {self.offset + self.nbytes}) {mode}>"


class DiskAllocator(Allocator):
    """Memory-maps the device's file; buffers are windows into that mapping.

    Mapped file bytes are not device memory, so :attr:`ember.helpers.GlobalCounters.mem_used`
    does not count them.
    """

    def __init__(self, device: str, path: str):
        self.device_name, self.path = device, path

    def alloc(self, nbytes: int, options: Any = None) -> DiskBuffer:
        """Map the first ``nbytes`` bytes of the file.

        ``options`` is :data:`READ_WRITE` (``None`` means the same: open read-write, creating the
        file or growing it with zeros to ``nbytes``; a file we may not write is mapped read-only
        when it is long enough) or :data:`READ_ONLY` (the file must exist and hold ``nbytes``).
        """
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"cannot map {nbytes!r} bytes of {self.path}: the size must be an int >= 0")
        return self._alloc(nbytes, options)

    def free(self, opaque: Any, nbytes: int, options: Any = None) -> None:
        """Drop a buffer; the file is unmapped once no buffer or memoryview uses the mapping."""
        self._free(opaque, nbytes, options)

    def _alloc(self, nbytes: int, options: Any) -> DiskBuffer:
        if options not in (None, READ_ONLY, READ_WRITE):
            raise ValueError(f"unknown DISK allocation options {options!r}: use {READ_ONLY!r} or {READ_WRITE!r}")
        if options == READ_ONLY:
            return DiskBuffer(self._map_read_only(nbytes), 0, nbytes)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            # a file we may only read can still back a read-only view of its bytes
            if os.path.isfile(self.path) and os.path.getsize(self.path) >= nbytes:
                return DiskBuffer(self._map_read_only(nbytes), 0, nbytes)
            raise
        try:
            if os.fstat(fd).st_size < nbytes:
                os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes, access=mmap.ACCESS_WRITE) if nbytes else None
        finally:
            os.close(fd)
        return DiskBuffer(_Mapping(self.path, nbytes, True, mm), 0, nbytes)

    def _map_read_only(self, nbytes: int) -> _Mapping:
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < nbytes:
                raise ValueError(f"cannot map {nbytes} bytes of {self.path}: the file has only {size} bytes")
            mm = mmap.mmap(f.fileno(), nbytes, access=mmap.ACCESS_READ) if nbytes else None
        return _Mapping(self.path, nbytes, False, mm)

    def _free(self, opaque: Any, nbytes: int, options: Any) -> None:
        pass  # the mapping closes itself when its last user is garbage-collected

    def copyin(self, dest: DiskBuffer, src: memoryview) -> None:
        """Write the bytes of host memory ``src`` into the start of ``dest`` (that is, into the file)."""
        src = memoryview(src).cast("B")
        if dest.readonly:
            raise OSError(errno.EROFS, f"cannot write into {dest.path}: it is mapped read-only")
        if src.nbytes > dest.nbytes:
            raise ValueError(f"copyin of {src.nbytes} bytes into a DISK buffer of {dest.nbytes} bytes ({dest.path})")
        dest.view()[:src.nbytes] = src

    def copyout(self, dest: memoryview, src: DiskBuffer) -> None:
        """Read ``dest.nbytes`` bytes from the start of ``src`` into the writable host memory ``dest``."""
        out = memoryview(dest).cast("B")
        if out.nbytes > src.nbytes:
            raise ValueError(f"copyout of {out.nbytes} bytes from a DISK buffer of {src.nbytes} bytes ({src.path})")
        out[:] = src.view()[:out.nbytes]

    def as_buffer(self, opaque: DiskBuffer) -> memoryview:
        """A zero-copy memoryview of the buffer's bytes in the mapped file (read-only when mapped so)."""
        return opaque.view()

    def offset(self, opaque: DiskBuffer, byte_offset: int, nbytes: int) -> DiskBuffer:
        """``nbytes`` bytes starting ``byte_offset`` into ``opaque``, sharing its mapping (no copy, no I/O)."""
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a DISK buffer of "
                             f"{opaque.nbytes} bytes ({opaque.path})")
        return DiskBuffer(opaque.mapping, opaque.offset + byte_offset, nbytes)


class DiskDevice:
    """The device ``DISK:/path/to/file``: storage only, no kernels.

    ``renderer``, ``compiler`` and ``runtime`` raise :class:`DiskComputeError`, which is what a
    computation scheduled on DISK runs into: move such tensors to a compute device first.
    """

    graph = None

    def __init__(self, device: str):
        _, _, path = device.partition(":")
        if not path:
            raise ValueError("the DISK device needs a file: name it DISK:/path/to/file "
                             "(e.g. Tensor.empty(n, dtype=dtypes.uint8, device='DISK:/tmp/data.bin'))")
        self.device = device
        self.path = os.path.abspath(os.path.expanduser(path))
        self.allocator = DiskAllocator(device, self.path)
        self.allocator.device = self

    def _no_compute(self) -> DiskComputeError:
        return DiskComputeError(
            f"{self.device} stores bytes and cannot compute: there is no kernel compiler for DISK. Move the "
            "tensor to a compute device first, e.g. t.to('CPU') or t.to(Device.DEFAULT), then reshape, slice, "
            "cast or compute there (only whole, contiguous DISK tensors can be copied off the disk)")

    @property
    def renderer(self) -> Any:
        """DISK has no renderer: raises :class:`DiskComputeError`."""
        raise self._no_compute()

    @property
    def compiler(self) -> Any:
        """DISK has no compiler: raises :class:`DiskComputeError`."""
        raise self._no_compute()

    @property
    def runtime(self) -> Any:
        """DISK has no runtime: raises :class:`DiskComputeError`."""
        raise self._no_compute()

    def synchronize(self) -> None:
        """Nothing to wait for: reads and writes of a mapping are synchronous."""

    def __repr__(self) -> str:
        return f"<DiskDevice {self.device}>"


__all__ = ["READ_ONLY", "READ_WRITE", "DiskAllocator", "DiskBuffer", "DiskComputeError", "DiskDevice"]
