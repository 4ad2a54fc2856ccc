"""The CUDA device's NCCL capability (ember.device.NCCLMemory): declared on the class, the pointer and stream it
hands to the nccl backend, and the device count (checked without a GPU; with one, against the driver)."""
from __future__ import annotations

from typing import Any

from ember_cuda.allocator import CUDABuffer
from ember_cuda.device import CUDADevice
from ember_cuda.driver import driver_problem, gpu_count

from ember.distributed.nccl import NCCL_METHODS


def test_the_device_class_declares_the_capability() -> None:
    assert all(callable(getattr(CUDADevice, m, None)) for m in NCCL_METHODS)


def test_pointer_of_a_buffer_and_of_a_view() -> None:
    dev = CUDADevice.__new__(CUDADevice)  # no GPU: the methods read only the buffer and the stream
    root = CUDABuffer(0x7F0000001000, 256)
    assert dev.nccl_pointer(root) == 0x7F0000001000
    assert dev.nccl_pointer(CUDABuffer(root.ptr + 64, 128, root, 64)) == 0x7F0000001040


def test_stream_is_the_device_stream_with_its_context_current() -> None:
    class Stream:  # cuda-python's CUstream converts to its handle with int()
        def __int__(self) -> int:
            return 0x5EED

    dev = CUDADevice.__new__(CUDADevice)
    activated: list[Any] = []
    dev.stream = Stream()
    dev.activate = lambda: activated.append(True)  # type: ignore[method-assign]
    assert dev.nccl_stream() == 0x5EED and activated == [True]


def test_device_count_is_the_drivers() -> None:
    assert CUDADevice.nccl_device_count() == (0 if driver_problem() is not None else gpu_count())
