"""Load kernels into compute pipelines and launch them in command buffers.

One launch is one command buffer holding one compute encoder::

    [encoder setComputePipelineState:pipeline]
    [encoder setBuffer:buf offset:view_offset atIndex:i]       for each buffer i, in parameter order
    [encoder setBytes:vals length:8*n atIndex:VALS_INDEX]      when the kernel has int variables
    [encoder dispatchThreads:global_size threadsPerThreadgroup:local_size]
    [encoder endEncoding]; [command_buffer commit]

``dispatchThreads`` runs exactly ``global_size`` threads (threadgroups at the edge are cut short), so
kernels need no bounds check. The time of a launch is the command buffer's GPU time
(``GPUEndTime - GPUStartTime``).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from ember.device import KernelBinary
from ember_metal.objc import COMMAND_BUFFER_ERROR, ObjC, obj, size3, uint
from ember_metal.renderer import VALS_INDEX


def threadgroup_size(global_size: Sequence[int], max_threads: int) -> tuple[int, int, int]:
    """A threadgroup shape for a launch that names none: as wide as the grid allows along x, then y, then z,
    with at most ``max_threads`` threads."""
    g = (tuple(int(s) for s in global_size) + (1, 1, 1))[:3]
    x = max(1, min(g[0], max_threads))
    y = max(1, min(g[1], max_threads // x))
    z = max(1, min(g[2], max_threads // (x * y)))
    return x, y, z


def encode_dispatch(objc: ObjC, encoder: int, pipeline: int, bufs: Sequence[Any], vals: Sequence[int],
                    global_size: Sequence[int], local_size: Sequence[int]) -> None:
    """Encode one kernel launch into the compute encoder ``encoder`` (see the module docstring)."""
    objc.send(encoder, "setComputePipelineState:", obj(pipeline), restype=None)
    for i, buf in enumerate(bufs):
        objc.send(encoder, "setBuffer:offset:atIndex:", obj(buf.mtl), uint(buf.offset), uint(i), restype=None)
    if vals:
        # setBytes copies the values at encoding time: the array need not outlive this call
        values = (ctypes.c_int64 * len(vals))(*vals)
        objc.send(encoder, "setBytes:length:atIndex:", ctypes.cast(values, ctypes.c_void_p),
                  uint(ctypes.sizeof(values)), uint(VALS_INDEX), restype=None)
    objc.send(encoder, "dispatchThreads:threadsPerThreadgroup:", size3(tuple(global_size)),
              size3(tuple(local_size)), restype=None)


def check_launch(name: str, bufs: Sequence[Any], global_size: Sequence[int], local_size: Sequence[int] | None,
                 max_threads: int) -> None:
    """``ValueError`` naming the kernel for a launch Metal would reject."""
    if len(bufs) > VALS_INDEX:
        raise ValueError(f"kernel {name}: {len(bufs)} buffers; Metal binds at most {VALS_INDEX} besides the int "
                         "variables")
    if len(global_size) > 3 or any(int(s) < 0 for s in global_size):
        raise ValueError(f"kernel {name}: global size {tuple(global_size)} is not up to three sizes >= 0")
    if local_size is not None:
        threads = 1
        for s in local_size:
            threads *= int(s)
        if len(local_size) > 3 or threads < 1 or threads > max_threads:
            raise ValueError(f"kernel {name}: local size {tuple(local_size)} has {threads} threads; this "
                             f"pipeline allows 1 to {max_threads}")


class MetalProgram:
    """A kernel as a compute pipeline: ``MetalProgram(device, name, binary)(*bufs, global_size=...)``.

    ``binary`` is what :class:`~ember_metal.compiler.MetalCompiler` returns: a
    :class:`~ember.device.KernelBinary` naming the kernel's symbol in a library source that may hold
    the other kernels of its batch; kernels of one source share one ``MTLLibrary``.
    """

    def __init__(self, device: Any, name: str, binary: bytes):
        self.device, self.name, self.objc = device, name, device.objc
        try:
            kb = KernelBinary.unpack(binary)
        except ValueError as e:
            raise ValueError(f"kernel {name}: {e}") from None
        self.symbol = kb.kernel_symbol(name)
        library = device.load_library(kb.program)
        objc = self.objc
        with objc.pool():
            function = objc.send(library, "newFunctionWithName:", obj(objc.nsstring(self.symbol)))
            if not function:
                raise ValueError(f"kernel {name}: the library has no function {self.symbol}")
            error = ctypes.c_void_p(None)
            self.pipeline = objc.send(device.mtl_device, "newComputePipelineStateWithFunction:error:", obj(function),
                                      ctypes.byref(error))
            objc.release(function)
            if not self.pipeline:
                raise RuntimeError(f"kernel {name}: no compute pipeline: {objc.error_text(error.value)}")
        self.max_threads = int(objc.send(self.pipeline, "maxTotalThreadsPerThreadgroup", restype=ctypes.c_ulong))

    def __call__(self, *bufs: Any, global_size: Sequence[int] = (1, 1, 1), local_size: Sequence[int] | None = None,
                 vals: Sequence[int] = (), wait: bool = False) -> float | None:
        check_launch(self.name, bufs, global_size, local_size, self.max_threads)
        if 0 in tuple(int(s) for s in global_size):  # an empty grid: nothing to run
            return 0.0 if wait else None
        local = tuple(local_size) if local_size is not None else threadgroup_size(global_size, self.max_threads)
        objc, device = self.objc, self.device
        with objc.pool():
            command_buffer = objc.retain(objc.send(device.queue, "commandBuffer"))
            encoder = objc.send(command_buffer, "computeCommandEncoder")
            encode_dispatch(objc, encoder, self.pipeline, bufs, vals, global_size, local)
            objc.send(encoder, "endEncoding", restype=None)
            objc.send(command_buffer, "commit", restype=None)
        return device.track(command_buffer, wait)

    def __del__(self) -> None:
        pipeline = getattr(self, "pipeline", None)
        if pipeline:
            self.objc.release(pipeline)

    def __repr__(self) -> str:
        return f"<MetalProgram {self.name} on {self.device.device}>"


def finish(objc: ObjC, command_buffer: int) -> float:
    """Wait for ``command_buffer``; its GPU time in seconds. ``RuntimeError`` with Metal's description when
    it failed. The caller still owns (and releases) it."""
    objc.send(command_buffer, "waitUntilCompleted", restype=None)
    if objc.send(command_buffer, "status", restype=ctypes.c_ulong) == COMMAND_BUFFER_ERROR:
        with objc.pool():
            why = objc.error_text(objc.send(command_buffer, "error"))
        raise RuntimeError(f"Metal command buffer failed: {why}")
    start = objc.send(command_buffer, "GPUStartTime", restype=ctypes.c_double)
    end = objc.send(command_buffer, "GPUEndTime", restype=ctypes.c_double)
    return float(end - start)
