"""The CUDA device object: one GPU with its primary context, a stream, allocator, renderer, compiler and runtime."""
from __future__ import annotations

import functools
import hashlib
import threading
from typing import Any

from ember.device import Compiled
from ember_cuda.allocator import CUDAAllocator, CUDABuffer
from ember_cuda.compiler import CUDACompiler
from ember_cuda.driver import check, device_index, gpu_count, gpu_info, init_driver
from ember_cuda.graph import CUDAGraph
from ember_cuda.renderer import CUDARenderer
from ember_cuda.runtime import CUDAProgram

# the context current on each thread, as far as ember set it (saves a driver call per launch)
_current = threading.local()


class CUDADevice(Compiled):
    """``CUDA`` (the first GPU) or ``CUDA:N`` (the N-th).

    Attributes beyond :class:`~ember.device.compiled.Compiled`: ``info`` (a
    :class:`~ember_cuda.driver.GPUInfo`), ``context`` (the GPU's primary context, shared with any other
    CUDA library in the process) and ``stream`` (where every copy and kernel of this device runs, in order).
    """

    def __init__(self, device: str = "CUDA"):
        self.driver = driver = init_driver()
        self.info = info = gpu_info(device_index(device))
        self.context = check(driver.cuDevicePrimaryCtxRetain(info.handle), "cuDevicePrimaryCtxRetain")
        self.activate()
        self.stream = check(driver.cuStreamCreate(0), "cuStreamCreate")
        self.timing_events = [check(driver.cuEventCreate(0), "cuEventCreate") for _ in range(2)]
        # orders GPU-to-GPU copies against the source's stream (see CUDAAllocator.transfer)
        self.copy_event = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self._modules: dict[bytes, Any] = {}  # CUmodule by the sha256 of its image
        self._peers: set[int] = set()
        renderer = CUDARenderer.from_attributes(info.compute_capability, info.shared_max, info.max_threads_per_block,
                                                info.max_block_dims, info.max_grid_dims, info.warp_size, device)
        super().__init__(device, CUDAAllocator(self), renderer, CUDACompiler(info.arch),
                         functools.partial(CUDAProgram, self), CUDAGraph)

    def activate(self) -> None:
        """Make this GPU's context current on the calling thread (driver calls act on the current context)."""
        if getattr(_current, "context", None) is not self.context:
            check(self.driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            _current.context = self.context

    def load_module(self, image: bytes) -> Any:
        """The ``CUmodule`` for a CUBIN or PTX image, loaded once per device and shared by its kernels."""
        key = hashlib.sha256(image).digest()
        module = self._modules.get(key)
        if module is None:
            self.activate()
            module = self._modules[key] = check(self.driver.cuModuleLoadData(image), "cuModuleLoadData")
        return module

    def enable_peer_access(self, peer: CUDADevice) -> None:
        """Let this GPU's context map ``peer``'s memory when the hardware allows it (once per pair); peer
        copies work either way, the driver stages them on the GPUs when there is no direct path."""
        if peer.info.index in self._peers:
            return
        self._peers.add(peer.info.index)
        can = check(self.driver.cuDeviceCanAccessPeer(self.info.handle, peer.info.handle), "cuDeviceCanAccessPeer")
        if can:
            self.activate()
            status = self.driver.cuCtxEnablePeerAccess(peer.context, 0)[0]
            if int(status) != 0 and getattr(status, "name", "") != "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED":
                check((status,), "cuCtxEnablePeerAccess")

    def elapsed_since(self, start_event: Any) -> float:
        """Record the end event after the queued work, wait for it, and return the GPU seconds since ``start_event``."""
        end = self.timing_events[1]
        check(self.driver.cuEventRecord(end, self.stream), "cuEventRecord")
        check(self.driver.cuEventSynchronize(end), "cuEventSynchronize")
        return float(check(self.driver.cuEventElapsedTime(start_event, end), "cuEventElapsedTime")) * 1e-3

    def synchronize(self) -> None:
        """Wait until every copy and kernel queued on this GPU has finished."""
        self.activate()
        check(self.driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # --- buffers NCCL can address (ember.device.NCCLMemory): the nccl distributed backend runs on them in place
    @classmethod
    def nccl_device_count(cls) -> int:
        """Every GPU the driver lists: NCCL addresses their memory with the pointers this plugin allocates."""
        return gpu_count()

    def nccl_pointer(self, opaque: CUDABuffer) -> int:
        """The device address of ``opaque`` (a view's address includes its offset)."""
        return opaque.ptr

    def nccl_stream(self) -> int:
        """This GPU's stream, where its copies and kernels run in order; its context is made current, as NCCL
        queues on the current device."""
        self.activate()
        return int(self.stream)

    def finalize(self) -> None:
        """At exit: free cached buffers and pinned staging, unload modules, destroy the stream and release the
        primary context. Each step is tried on its own (the driver may already be partly shut down)."""
        driver, allocator = self.driver, self.allocator
        assert isinstance(allocator, CUDAAllocator)
        steps = [self.activate, allocator.free_cache, allocator.release_staging,
                 *(lambda m=m: driver.cuModuleUnload(m) for m in self._modules.values()),
                 lambda: driver.cuStreamDestroy(self.stream),
                 lambda: driver.cuDevicePrimaryCtxRelease(self.info.handle)]
        self._modules.clear()
        for step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001, S112 - best effort at interpreter exit
                continue
        _current.context = None
