"""Host memory for the CPU device: 64-byte aligned blocks with a cached cffi pointer."""
from __future__ import annotations

import ctypes
import sys
from typing import Any

from ember.device import LRUAllocator, copyin_source, copyout_dest
from ember_cpu.runtime import ffi

#: Alignment of every buffer (a cache line; enough for AVX-512 aligned loads).
ALIGNMENT = 64

# malloc without zero-filling: a fresh buffer's contents are undefined anyway
_raw_alloc = ffi.new_allocator(should_clear_after_alloc=False)

#: Buffers at least this large ask the kernel for transparent huge pages (as numpy does for its arrays): a
#: kernel streaming tens of MiB otherwise spends a measurable part of its time on TLB misses of 4 KiB pages.
HUGE_PAGE_MIN = 4 << 20
_MADV_HUGEPAGE, _PAGE = 14, 4096


def _madvise_huge() -> Any:
    """libc's ``madvise`` on Linux (where transparent huge pages are often given only on request), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_madvise = _madvise_huge()


def _ask_huge_pages(address: int, nbytes: int) -> None:
    """Advise huge pages for the whole pages inside ``[address, address + nbytes)``; a refusal is harmless."""
    start, end = -(-address // _PAGE) * _PAGE, (address + nbytes) // _PAGE * _PAGE
    if _madvise is not None and end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)  # fails only where THP is off: small pages as before


class CPUBuffer:
    """An opaque CPU buffer handle.

    ``ptr`` is a cffi ``char *`` to the first byte (what programs receive), ``address`` the
    same as an int, ``view`` a writable memoryview of exactly ``nbytes`` bytes. ``base``
    keeps the owning memory alive (the raw block, or the parent buffer of an offset view).
    """

    __slots__ = ("address", "base", "nbytes", "ptr", "view")

    def __init__(self, base: Any, ptr: Any, address: int, view: memoryview, nbytes: int):
        self.base, self.ptr, self.address, self.view, self.nbytes = base, ptr, address, view, nbytes

    def __repr__(self) -> str:
        return f"<CPUBuffer {self.nbytes} bytes at 0x{self.address:x}>"


class CPUAllocator(LRUAllocator):
    """Allocates aligned host memory; copies are single ``memmove`` calls and ``as_buffer`` is zero-copy."""

    def _alloc(self, nbytes: int, options: Any) -> CPUBuffer:
        block = _raw_alloc("char[]", nbytes + ALIGNMENT)  # size-0 buffers still get a valid, aligned address
        raw = int(ffi.cast("uintptr_t", block))
        pad = -raw % ALIGNMENT
        if nbytes >= HUGE_PAGE_MIN:  # before anything touches the memory, so its first faults get huge pages
            _ask_huge_pages(raw + pad, nbytes)
        view = memoryview(ffi.buffer(block))[pad:pad + nbytes]  # the memoryview keeps `block` alive
        return CPUBuffer(block, ffi.cast("char *", block) + pad, raw + pad, view, nbytes)

    def _free(self, opaque: CPUBuffer, nbytes: int, options: Any) -> None:
        # The memory goes back to malloc when the last reference (handle, views, memoryviews) is dropped.
        pass

    def copyin(self, dest: CPUBuffer, src: memoryview) -> None:
        """Copy ``src`` (any C-contiguous buffer) into the start of ``dest``."""
        src = copyin_source(src, dest.nbytes)
        if src.nbytes:
            ffi.memmove(dest.ptr, src, src.nbytes)

    def copyout(self, dest: memoryview, src: CPUBuffer) -> None:
        """Fill the writable memoryview ``dest`` from the start of ``src``."""
        dest = copyout_dest(dest, src.nbytes)
        if dest.nbytes:
            ffi.memmove(dest, src.ptr, dest.nbytes)

    def as_buffer(self, opaque: CPUBuffer) -> memoryview:
        """A writable memoryview sharing the buffer's memory."""
        return opaque.view

    def offset(self, opaque: CPUBuffer, byte_offset: int, nbytes: int) -> CPUBuffer:
        """A view of ``nbytes`` bytes at ``byte_offset`` inside ``opaque`` (shares memory, never freed itself)."""
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a buffer of "
                             f"{opaque.nbytes} bytes")
        return CPUBuffer(opaque, opaque.ptr + byte_offset, opaque.address + byte_offset,
                         opaque.view[byte_offset:byte_offset + nbytes], nbytes)

    def transfer(self, dest: CPUBuffer, src: CPUBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        """Copy ``nbytes`` from ``src`` to ``dest`` (both host memory, so a plain ``memmove``)."""
        if nbytes > src.nbytes or nbytes > dest.nbytes:
            raise ValueError(f"transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
        if nbytes:
            ffi.memmove(dest.ptr, src.ptr, nbytes)

