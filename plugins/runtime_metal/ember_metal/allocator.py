"""Device memory for the METAL device: shared-storage ``MTLBuffer``s, copied with ``memmove``.

Apple GPUs share the system memory, so buffers are made with ``MTLResourceStorageModeShared`` and
the host reads and writes them through ``[buffer contents]``. A copy first waits for the GPU work
already committed (it may still read or write the buffer).
"""
from __future__ import annotations

import ctypes
from typing import Any

from ember.device import LRUAllocator, copyin_source, copyout_dest
from ember_metal.objc import STORAGE_MODE_SHARED, uint


class MetalBuffer:
    """An opaque buffer handle: ``nbytes`` bytes at ``offset`` in the ``MTLBuffer`` ``mtl``.

    An offset view shares its ``root``'s ``MTLBuffer`` (kernels bind it with that offset) and keeps
    the root alive.
    """

    __slots__ = ("mtl", "nbytes", "offset", "root")

    def __init__(self, mtl: int, nbytes: int, offset: int = 0, root: MetalBuffer | None = None):
        self.mtl, self.nbytes, self.offset, self.root = mtl, nbytes, offset, root

    def __repr__(self) -> str:
        view = f" at offset {self.offset}" if self.root is not None else ""
        return f"<MetalBuffer {self.nbytes} bytes{view}>"


class MetalAllocator(LRUAllocator):
    """Allocates shared-storage buffers on ``device`` (a :class:`~ember_metal.device.MetalDevice`)."""

    def __init__(self, device: Any):
        super().__init__()
        self.device = device
        self.objc = device.objc
        self.max_alloc = int(self.objc.send(device.mtl_device, "maxBufferLength", restype=ctypes.c_ulong))

    def _alloc(self, nbytes: int, options: Any) -> MetalBuffer:
        if nbytes > self.max_alloc:
            raise MemoryError(f"{self.device.device}: a buffer of {nbytes} bytes is larger than the device's "
                              f"largest buffer ({self.max_alloc} bytes, maxBufferLength)")
        # Metal has no empty buffers: a 0-byte buffer is backed by 1 byte
        mtl = self.objc.send(self.device.mtl_device, "newBufferWithLength:options:", uint(max(nbytes, 1)),
                             uint(STORAGE_MODE_SHARED))
        if not mtl:
            raise MemoryError(f"{self.device.device}: newBufferWithLength:{nbytes} returned nil (out of memory)")
        return MetalBuffer(mtl, nbytes)

    def _free(self, opaque: MetalBuffer, nbytes: int, options: Any) -> None:
        # a graph or a queued kernel may still use it: wait, then give up this allocation's reference
        self.device.synchronize()
        self.objc.release(opaque.mtl)

    def address(self, buf: MetalBuffer) -> int:
        """The host address of the first byte of ``buf``."""
        return int(self.objc.send(buf.mtl, "contents")) + buf.offset

    def copyin(self, dest: MetalBuffer, src: memoryview) -> None:
        """Copy the host bytes ``src`` into the start of ``dest`` (after the GPU's committed work)."""
        src = copyin_source(src, dest.nbytes)
        if src.nbytes:
            self.device.synchronize()
            ctypes.memmove(self.address(dest), (ctypes.c_char * src.nbytes).from_buffer_copy(src), src.nbytes)

    def copyout(self, dest: memoryview, src: MetalBuffer) -> None:
        """Fill the writable memoryview ``dest`` from the start of ``src``, after the GPU's committed work."""
        dest = copyout_dest(dest, src.nbytes)
        if dest.nbytes:
            self.device.synchronize()
            ctypes.memmove((ctypes.c_char * dest.nbytes).from_buffer(dest), self.address(src), dest.nbytes)

    def as_buffer(self, opaque: MetalBuffer) -> memoryview:
        """A zero-copy host view of the buffer's bytes (valid while the buffer lives; synchronize first)."""
        self.device.synchronize()
        return memoryview((ctypes.c_char * opaque.nbytes).from_address(self.address(opaque))).cast("B")

    def transfer(self, dest: MetalBuffer, src: MetalBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        """Copy ``nbytes`` between buffers of METAL devices (one memory: a memmove after both devices' work)."""
        if nbytes > src.nbytes or nbytes > dest.nbytes:
            raise ValueError(f"transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
        if nbytes:
            src_dev.synchronize()
            dest_dev.synchronize()
            ctypes.memmove(self.address(dest), src_dev.allocator.address(src), nbytes)

    def offset(self, opaque: MetalBuffer, byte_offset: int, nbytes: int) -> MetalBuffer:
        """A view of ``nbytes`` bytes at ``byte_offset`` in ``opaque``, sharing its memory.

        Kernels bind it with ``setBuffer:offset:atIndex:``; Metal wants that offset aligned to the
        element size, which holds for every view of a tensor of one dtype.
        """
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a buffer of "
                             f"{opaque.nbytes} bytes")
        root = opaque.root if opaque.root is not None else opaque
        return MetalBuffer(root.mtl, nbytes, opaque.offset + byte_offset, root)
