"""AMD GPU memory: KFD allocations, the opaque buffers ember holds, and the allocator.

A :class:`GPUMemory` is one KFD allocation: an address range reserved with ``mmap``, allocated in
VRAM or GTT at that address (``ALLOC_MEMORY_OF_GPU``), mapped to the GPU and, when the host needs
it, into the process through the render node, so GPU address == host address. The device object
(:class:`ember_amd.device.AMDDevice`) makes the ioctls; this module holds what ember sees.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ember.device import BufferSpec, LRUAllocator, copyin_source, copyout_dest, profiled_copy

if TYPE_CHECKING:
    from ember_amd.device import AMDDevice

#: bytes of host-visible staging one copy to or from the host goes through at a time
STAGING_BYTES = 16 << 20


def round_up(n: int, align: int) -> int:
    """``n`` rounded up to a multiple of ``align``."""
    return -(-n // align) * align


@dataclass(eq=False)
class GPUMemory:
    """One KFD allocation at GPU address ``va`` (== its host address when ``host`` is true)."""

    va: int
    size: int  # page-rounded
    handle: int
    flags: int
    host: bool

    def view(self, nbytes: int | None = None, offset: int = 0) -> memoryview:
        """The host's view of the memory (host-visible allocations only)."""
        assert self.host, "not mapped into the process"
        n = self.size - offset if nbytes is None else nbytes
        return memoryview((ctypes.c_char * n).from_address(self.va + offset)).cast("B")


class AMDBuffer:
    """An opaque AMD buffer: GPU address ``va``, ``nbytes``, and the allocation it lies in."""

    __slots__ = ("mem", "nbytes", "va")

    def __init__(self, mem: GPUMemory, va: int, nbytes: int):
        self.mem, self.va, self.nbytes = mem, va, nbytes

    def __repr__(self) -> str:
        return f"<AMDBuffer {self.nbytes} bytes at 0x{self.va:x}>"


class AMDAllocator(LRUAllocator):
    """Device memory in VRAM; ``BufferSpec(host_visible / cpu_access)`` memory in GTT, mapped into the process.

    Copies to and from the host go through host-visible staging and the SDMA copy queue, ordered
    after earlier work by the device's timeline.
    """

    oom_errors = (MemoryError,)

    def __init__(self, dev: AMDDevice):
        super().__init__()
        self.dev = dev
        self._staging: GPUMemory | None = None

    def _alloc(self, nbytes: int, options: Any) -> AMDBuffer:
        host = isinstance(options, BufferSpec) and (options.host_visible or options.cpu_access)
        mem = self.dev.mem_alloc(max(nbytes, 1), vram=not host, host=host, uncached=bool(host and options.uncached))
        return AMDBuffer(mem, mem.va, nbytes)

    def _free(self, opaque: AMDBuffer, nbytes: int, options: Any) -> None:
        self.dev.synchronize()  # queued work may still use it
        self.dev.mem_free(opaque.mem)

    def offset(self, opaque: AMDBuffer, byte_offset: int, nbytes: int) -> AMDBuffer:
        """A view of ``nbytes`` at ``byte_offset`` inside ``opaque`` (same memory, never freed itself)."""
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a buffer of "
                             f"{opaque.nbytes} bytes")
        return AMDBuffer(opaque.mem, opaque.va + byte_offset, nbytes)

    def as_buffer(self, opaque: AMDBuffer) -> memoryview:
        """A zero-copy host view, for host-visible buffers only (VRAM is not mapped into the process)."""
        if not opaque.mem.host:
            raise NotImplementedError("VRAM buffers are not mapped into the process: copy them out")
        self.dev.synchronize()
        return opaque.mem.view(opaque.nbytes, opaque.va - opaque.mem.va)

    def staging(self) -> GPUMemory:
        if self._staging is None:
            self._staging = self.dev.mem_alloc(STAGING_BYTES, vram=False, host=True, uncached=False)
        return self._staging

    def _copy(self, dest_va: int, src_va: int, nbytes: int) -> None:
        dev = self.dev
        q = dev.copy_queue()
        profiled_copy(dev, q, _Span(dest_va, nbytes), _Span(src_va, nbytes), nbytes)
        value = dev.submit_and_signal(q)
        dev.timeline.signal.wait(value, timeout=dev.timeout)

    def copyin(self, dest: AMDBuffer, src: memoryview) -> None:
        """Copy ``src`` into the start of ``dest`` through staging and the SDMA queue."""
        data = _bytes_view(copyin_source(src, dest.nbytes))
        staging = self.staging()
        for off in range(0, data.nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, data.nbytes - off)
            staging.view(n)[:] = data[off:off + n]
            self._copy(dest.va + off, staging.va, n)

    def copyout(self, dest: memoryview, src: AMDBuffer) -> None:
        """Fill ``dest`` from the start of ``src`` through the SDMA queue and staging."""
        out = _bytes_view(copyout_dest(dest, src.nbytes))
        staging = self.staging()
        for off in range(0, out.nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, out.nbytes - off)
            self._copy(staging.va, src.va + off, n)
            out[off:off + n] = staging.view(n)

    def transfer(self, dest: AMDBuffer, src: AMDBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        """Device-to-device on one GPU: one SDMA copy. Between GPUs core goes through the host."""
        if src_dev is not dest_dev:
            raise NotImplementedError("copies between AMD GPUs go through the host")
        if nbytes > src.nbytes or nbytes > dest.nbytes:
            raise ValueError(f"transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
        if nbytes:
            self._copy(dest.va, src.va, nbytes)


def _bytes_view(view: memoryview) -> memoryview:
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


@dataclass(frozen=True)
class _Span:
    """An address and size a copy command reads or writes (what :class:`~ember.device.hcq.Copy` carries)."""

    va: int
    nbytes: int
