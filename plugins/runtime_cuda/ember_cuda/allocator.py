"""GPU memory for the CUDA device: ``cuMemAlloc`` buffers, copies on the device's stream through pinned
host staging, device-to-device and GPU-to-GPU copies that never touch the host, and offset views.

Host copies go through page-locked (pinned) staging buffers, because only pinned memory copies
asynchronously and at full PCIe speed. ``copyin`` copies the host bytes into a staging chunk and
queues the upload; it returns as soon as every byte is staged, before the upload finishes, and
waits for a chunk's previous upload only when it reuses that chunk. ``copyout`` queues the
download of one chunk while it copies the previous one out to the caller (double buffering).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ember.device import LRUAllocator, copyin_source, copyout_dest
from ember_cuda.driver import CUDAError, check

#: bytes per pinned staging chunk (two chunks per device)
STAGING_CHUNK = 16 << 20


class CUDABuffer:
    """An opaque GPU buffer handle: the device address ``ptr`` and the usable size ``nbytes``.

    An offset view keeps its ``root`` buffer alive and remembers where it starts in it (``offset``).
    A 0-byte buffer is backed by 1 byte (``cuMemAlloc`` refuses 0).
    """

    __slots__ = ("ptr", "nbytes", "offset", "root")

    def __init__(self, ptr: int, nbytes: int, root: CUDABuffer | None = None, offset: int = 0):
        self.ptr, self.nbytes, self.root, self.offset = ptr, nbytes, root, offset

    def __repr__(self) -> str:
        view = f" at offset {self.offset}" if self.root is not None else ""
        return f"<CUDABuffer {self.nbytes} bytes at 0x{self.ptr:x}{view}>"


class _Staging:
    """One pinned host chunk and the event that marks the end of the last copy using it."""

    def __init__(self, driver: Any, nbytes: int):
        self.driver = driver
        self.addr = int(check(driver.cuMemHostAlloc(nbytes, 0), "cuMemHostAlloc"))
        self.view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.addr))
        self.event = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self.busy = False

    def wait(self) -> None:
        """Block until the last copy through this chunk has finished."""
        if self.busy:
            check(self.driver.cuEventSynchronize(self.event), "cuEventSynchronize")
            self.busy = False

    def done_after(self, stream: Any) -> None:
        """Mark the chunk busy until the work queued on ``stream`` so far has finished."""
        check(self.driver.cuEventRecord(self.event, stream), "cuEventRecord")
        self.busy = True


class CUDAAllocator(LRUAllocator):
    """Allocates memory on ``device``'s GPU; copies run on its stream (see the module docstring)."""

    def __init__(self, device: Any):
        super().__init__()
        self.device = device
        self.driver = device.driver
        self.oom_errors = (MemoryError,)
        self._staging: list[_Staging] = []

    def _chunks(self) -> list[_Staging]:
        """The two pinned staging chunks, made on first use (pinning memory is slow)."""
        if not self._staging:
            self.device.activate()
            self._staging = [_Staging(self.driver, STAGING_CHUNK) for _ in range(2)]
        return self._staging

    def release_staging(self) -> None:
        """Give the pinned staging chunks back (they are made again on the next host copy)."""
        chunks, self._staging = self._staging, []
        for chunk in chunks:
            chunk.wait()
            check(self.driver.cuMemFreeHost(chunk.addr), "cuMemFreeHost")

    def _alloc(self, nbytes: int, options: Any) -> CUDABuffer:
        self.device.activate()
        try:
            ptr = check(self.driver.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")
        except CUDAError as e:
            if getattr(e.status, "name", "") == "CUDA_ERROR_OUT_OF_MEMORY":
                raise MemoryError(f"{self.device.device}: out of GPU memory allocating {nbytes} bytes") from e
            raise
        return CUDABuffer(int(ptr), nbytes)

    def _free(self, opaque: CUDABuffer, nbytes: int, options: Any) -> None:
        # queued kernels may still read the buffer: let them finish before its memory can be handed out again
        self.device.synchronize()
        check(self.driver.cuMemFree(opaque.ptr), "cuMemFree")

    def copyin(self, dest: CUDABuffer, src: memoryview) -> None:
        """Queue the upload of the host bytes ``src`` to the start of ``dest`` (``src`` may be reused at once)."""
        src = copyin_source(src, dest.nbytes)
        if not src.nbytes:
            return
        self.device.activate()
        data = np.frombuffer(src.cast("B"), dtype=np.uint8)
        chunks = self._chunks()
        for i, start in enumerate(range(0, src.nbytes, STAGING_CHUNK)):
            n = min(STAGING_CHUNK, src.nbytes - start)
            chunk = chunks[i % 2]
            chunk.wait()
            chunk.view[:n] = data[start:start + n]
            check(self.driver.cuMemcpyHtoDAsync(dest.ptr + start, chunk.addr, n, self.device.stream),
                  "cuMemcpyHtoDAsync")
            chunk.done_after(self.device.stream)

    def copyout(self, dest: memoryview, src: CUDABuffer) -> None:
        """Fill the writable memoryview ``dest`` from the start of ``src``, after all work queued on the device."""
        dest = copyout_dest(dest, src.nbytes)
        if not dest.nbytes:
            return
        self.device.activate()
        out = np.frombuffer(dest.cast("B"), dtype=np.uint8)
        chunks = self._chunks()
        starts = list(range(0, dest.nbytes, STAGING_CHUNK))

        def queue(i: int) -> None:
            n = min(STAGING_CHUNK, dest.nbytes - starts[i])
            chunk = chunks[i % 2]
            chunk.wait()
            check(self.driver.cuMemcpyDtoHAsync(chunk.addr, src.ptr + starts[i], n, self.device.stream),
                  "cuMemcpyDtoHAsync")
            chunk.done_after(self.device.stream)

        queue(0)
        for i, start in enumerate(starts):
            if i + 1 < len(starts):
                queue(i + 1)  # the next download runs while this chunk is copied out
            chunk = chunks[i % 2]
            chunk.wait()
            n = min(STAGING_CHUNK, dest.nbytes - start)
            out[start:start + n] = chunk.view[:n]

    def transfer(self, dest: CUDABuffer, src: CUDABuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        """Copy ``nbytes`` from ``src`` (on ``src_dev``) to ``dest`` (on ``dest_dev``) on the GPU side.

        On one GPU this is a device-to-device copy; between GPUs a peer copy (over NVLink or PCIe, through
        the driver, never through this process's memory). The copy runs on the destination's stream after
        the source's queued work, and the source's later work waits for it. Devices are CUDA device
        objects or their names.
        """
        if nbytes > src.nbytes or nbytes > dest.nbytes:
            raise ValueError(f"transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
        if not nbytes:
            return
        src_dev, dest_dev = _device_object(src_dev), _device_object(dest_dev)
        driver = self.driver
        if src_dev is dest_dev:
            dest_dev.activate()
            check(driver.cuMemcpyDtoDAsync(dest.ptr, src.ptr, nbytes, dest_dev.stream), "cuMemcpyDtoDAsync")
            return
        dest_dev.enable_peer_access(src_dev)
        src_dev.activate()
        check(driver.cuEventRecord(src_dev.copy_event, src_dev.stream), "cuEventRecord")
        dest_dev.activate()
        check(driver.cuStreamWaitEvent(dest_dev.stream, src_dev.copy_event, 0), "cuStreamWaitEvent")
        check(driver.cuMemcpyPeerAsync(dest.ptr, dest_dev.context, src.ptr, src_dev.context, nbytes,
                                       dest_dev.stream), "cuMemcpyPeerAsync")
        check(driver.cuEventRecord(dest_dev.copy_event, dest_dev.stream), "cuEventRecord")
        src_dev.activate()
        check(driver.cuStreamWaitEvent(src_dev.stream, dest_dev.copy_event, 0), "cuStreamWaitEvent")

    def offset(self, opaque: CUDABuffer, byte_offset: int, nbytes: int) -> CUDABuffer:
        """A view of ``nbytes`` bytes at ``byte_offset`` in ``opaque``, sharing its memory (any offset works:
        it is a device address plus the offset)."""
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a buffer of "
                             f"{opaque.nbytes} bytes")
        root = opaque.root if opaque.root is not None else opaque
        return CUDABuffer(opaque.ptr + byte_offset, nbytes, root, opaque.offset + byte_offset)


def _device_object(dev: Any) -> Any:
    """A CUDA device object from itself or its name."""
    if isinstance(dev, str):
        from ember.device import Device

        return Device[dev]
    return dev
