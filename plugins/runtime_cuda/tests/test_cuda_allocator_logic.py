"""The allocator's staging logic without a GPU: a host-memory model of the driver's memory calls.

``HostMemoryDriver`` keeps "device" memory in numpy arrays and performs each copy when it is queued, so
these tests check what the allocator itself decides: how a copy is cut into staging chunks, which chunk
is reused when, offsets of views and of chunks, and the order of events, with chunks of a few bytes.
What the real driver does is tested on a GPU (test_cuda_runtime.py).
"""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
from ember_cuda import allocator as cuda_allocator
from ember_cuda.allocator import CUDAAllocator


class HostMemoryDriver:
    """The memory and event calls of ``cuda.bindings.driver``, on host memory, with a log of the calls."""

    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)

    def __init__(self):
        self.memory: dict[int, np.ndarray] = {}
        self.pinned: list[ctypes.Array] = []
        self.log: list[tuple] = []
        self.next_address = 1 << 32

    def _device(self, ptr: int, n: int) -> np.ndarray:
        """The bytes [ptr, ptr + n) of the allocation holding them."""
        for base, mem in self.memory.items():
            if base <= ptr and ptr + n <= base + mem.size:
                return mem[ptr - base:ptr - base + n]
        raise AssertionError(f"bytes [{ptr:#x}, {ptr + n:#x}) are outside every allocation")

    def _host(self, addr: int, n: int) -> np.ndarray:
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr))

    def cuMemAlloc(self, n):
        ptr = self.next_address
        self.next_address += n + 256
        self.memory[ptr] = np.full(n, 0xEE, np.uint8)
        return (0, ptr)

    def cuMemFree(self, ptr):
        del self.memory[ptr]
        return (0,)

    def cuMemHostAlloc(self, n, flags):
        buf = (ctypes.c_uint8 * n)()
        self.pinned.append(buf)
        return (0, ctypes.addressof(buf))

    def cuMemFreeHost(self, addr):
        self.pinned = [b for b in self.pinned if ctypes.addressof(b) != addr]
        return (0,)

    def cuEventCreate(self, flags):
        return (0, object())

    def cuEventRecord(self, event, stream):
        self.log.append(("record", id(event)))
        return (0,)

    def cuEventSynchronize(self, event):
        self.log.append(("wait", id(event)))
        return (0,)

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self._device(dst, n)[:] = self._host(src, n)
        self.log.append(("htod", dst, n))
        return (0,)

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        self._host(dst, n)[:] = self._device(src, n)
        self.log.append(("dtoh", src, n))
        return (0,)

    def cuMemcpyDtoDAsync(self, dst, src, n, stream):
        self._device(dst, n)[:] = self._device(src, n)
        return (0,)


@pytest.fixture
def alloc(monkeypatch) -> CUDAAllocator:
    monkeypatch.setattr(cuda_allocator, "STAGING_CHUNK", 16)
    driver = HostMemoryDriver()
    device = SimpleNamespace(driver=driver, device="CUDA", stream=None, activate=lambda: None,
                             synchronize=lambda: None)
    return CUDAAllocator(device)


@pytest.mark.parametrize("nbytes", [1, 15, 16, 17, 32, 33, 100])
def test_copies_through_staging_chunks(alloc, nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    buf = alloc.alloc(nbytes)
    alloc.copyin(buf, memoryview(data))
    out = np.zeros(nbytes, np.uint8)
    alloc.copyout(memoryview(out), buf)
    np.testing.assert_array_equal(out, data)
    uploads = [e for e in alloc.driver.log if e[0] == "htod"]
    assert [n for _, _, n in uploads] == [min(16, nbytes - s) for s in range(0, nbytes, 16)]
    assert [dst - buf.ptr for _, dst, _ in uploads] == list(range(0, nbytes, 16))


def test_a_chunk_is_reused_only_after_its_copy_finished(alloc):
    buf = alloc.alloc(64)
    alloc.copyin(buf, memoryview(np.arange(64, dtype=np.uint8)))
    log = [e[0] for e in alloc.driver.log]
    # chunks 0 and 1 are filled without waiting; chunk 0's reuse (third piece) waits for its first upload
    assert log[:4] == ["htod", "record", "htod", "record"] and log[4] == "wait"


def test_copyout_of_an_offset_view(alloc):
    data = np.arange(100, dtype=np.uint8)
    buf = alloc.alloc(100)
    alloc.copyin(buf, memoryview(data))
    view = alloc.offset(alloc.offset(buf, 10, 80), 30, 40)  # a view of a view starts at byte 40
    assert view.root is buf and view.offset == 40
    out = np.zeros(40, np.uint8)
    alloc.copyout(memoryview(out), view)
    np.testing.assert_array_equal(out, data[40:80])


def test_copy_size_checks(alloc):
    buf = alloc.alloc(8)
    with pytest.raises(ValueError, match="copyin of 9 bytes into a buffer of 8 bytes"):
        alloc.copyin(buf, memoryview(np.zeros(9, np.uint8)))
    with pytest.raises(ValueError, match="transfer of 9 bytes"):
        alloc.transfer(buf, buf, 9, None, None)


def test_device_to_device_transfer_on_one_gpu(alloc):
    device = alloc.device
    src, dst = alloc.alloc(40), alloc.alloc(40)
    alloc.copyin(src, memoryview(np.arange(40, dtype=np.uint8)))
    alloc.transfer(dst, src, 24, device, device)
    out = np.zeros(40, np.uint8)
    alloc.copyout(memoryview(out), dst)
    np.testing.assert_array_equal(out[:24], np.arange(24))
    assert (out[24:] == 0xEE).all()  # only nbytes were copied


def test_staging_is_released_and_made_again(alloc):
    buf = alloc.alloc(20)
    alloc.copyin(buf, memoryview(np.arange(20, dtype=np.uint8)))
    assert len(alloc.driver.pinned) == 2
    alloc.release_staging()
    assert alloc.driver.pinned == []
    out = np.zeros(20, np.uint8)
    alloc.copyout(memoryview(out), buf)  # new chunks on the next copy
    np.testing.assert_array_equal(out, np.arange(20))
