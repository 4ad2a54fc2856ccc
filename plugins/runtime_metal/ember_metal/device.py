"""The METAL device object: the system's default Metal GPU with its command queue, allocator, renderer,
compiler and runtime. Every Metal call goes through an :class:`~ember_metal.objc.ObjC` layer."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import platform

from ember.device import Compiled
from ember_metal.allocator import MetalAllocator
from ember_metal.compiler import MetalCompiler, build_library
from ember_metal.graph import MetalGraph
from ember_metal.objc import GPU_FAMILY_APPLE7, GPU_FAMILY_MAC2, ObjC, ObjCError, system_objc
from ember_metal.renderer import MetalRenderer
from ember_metal.runtime import MetalProgram, finish


class MetalDevice(Compiled):
    """``METAL``: the system's default Metal GPU (``MTLCreateSystemDefaultDevice``).

    ``objc`` is the Objective-C layer (the system's unless a test passes a fake). Attributes beyond
    :class:`~ember.device.Compiled`: ``mtl_device`` and ``queue`` (owned ``MTLDevice`` and
    ``MTLCommandQueue`` references).
    """

    def __init__(self, device: str = "METAL", objc: ObjC | None = None):
        if device.partition(":")[2] not in ("", "0"):
            raise ValueError(f"{device}: the METAL device is the system's default GPU; only METAL (METAL:0) exists")
        self.objc = objc if objc is not None else system_objc()
        mtl_device = self.objc.default_device()
        if not mtl_device:
            raise ObjCError("no Metal device: MTLCreateSystemDefaultDevice() returned nil")
        self.mtl_device = mtl_device
        reason = self.objc.unusable_gpu(mtl_device)
        if reason is not None:
            raise ObjCError(f"{device}: {reason}")
        simdgroup_matrix = any(self.objc.supports_family(mtl_device, f) for f in (GPU_FAMILY_APPLE7, GPU_FAMILY_MAC2))
        self.queue = self.objc.send(mtl_device, "newCommandQueue")
        with self.objc.pool():
            self.gpu_name = self.objc.string(self.objc.send(mtl_device, "name"))
        self._in_flight: list[int] = []
        self._libraries: dict[bytes, int] = {}
        shared = int(self.objc.send(mtl_device, "maxThreadgroupMemoryLength", restype=ctypes.c_ulong))
        compiler = MetalCompiler(self.objc, mtl_device, self.gpu_name, platform.mac_ver()[0] or platform.release())
        renderer = MetalRenderer(shared_max=shared, simdgroup_matrix=simdgroup_matrix, device=device)
        super().__init__(device, MetalAllocator(self), renderer, compiler, functools.partial(MetalProgram, self),
                         MetalGraph)

    def load_library(self, source: bytes) -> int:
        """The ``MTLLibrary`` built from a kernel source, built once per device and shared by its kernels."""
        key = hashlib.sha256(source).digest()
        library = self._libraries.get(key)
        if library is None:
            compiler = self.compiler
            assert isinstance(compiler, MetalCompiler)
            with self.objc.pool():
                library = self._libraries[key] = build_library(self.objc, self.mtl_device, compiler.options,
                                                               source.decode())
        return library

    def track(self, command_buffer: int, wait: bool) -> float | None:
        """Keep a committed (retained) command buffer until it is waited for; with ``wait``, wait for it now
        and return its GPU time."""
        self._in_flight.append(command_buffer)
        if not wait:
            return None
        try:
            seconds = finish(self.objc, command_buffer)
        finally:
            self.synchronize()  # releases it (and any earlier one, all done by now: one queue runs in order)
        return seconds

    def synchronize(self) -> None:
        """Wait for every committed command buffer (and release it); ``RuntimeError`` if one failed."""
        in_flight, self._in_flight = self._in_flight, []
        error: RuntimeError | None = None
        for command_buffer in in_flight:
            try:
                finish(self.objc, command_buffer)
            except RuntimeError as e:
                error = error or e
            finally:
                self.objc.release(command_buffer)
        if error is not None:
            raise error

    def finalize(self) -> None:
        """Release the libraries, the command queue and the device (at interpreter exit, after synchronize)."""
        for library in self._libraries.values():
            self.objc.release(library)
        self._libraries.clear()
        self.objc.release(self.queue)
        # MTLCreateSystemDefaultDevice returns an owned reference
        self.objc.release(self.mtl_device)
