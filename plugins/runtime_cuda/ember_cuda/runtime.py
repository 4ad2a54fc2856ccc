"""Load CUBIN/PTX modules (``cuModuleLoadData``) and launch their kernels (``cuLaunchKernel``).

A kernel's parameters are its int variables (``long long``) first, then its buffers (device
addresses), in the order :class:`~ember_cuda.renderer.CUDARenderer` declares them: trailing
buffers the kernel never touches are simply not read by the driver.

Without a ``local_size`` from codegen, the block shape is chosen here (:func:`launch_dims`):
up to :data:`DEFAULT_BLOCK_THREADS` threads, filling the innermost dimension first; the grid
covers the global size and is capped at the GPU's limits (the kernels' grid-stride loops cover
the rest).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from ember.device import KernelBinary
from ember_cuda.driver import check

#: threads per block when codegen gives no local size (a multiple of the warp size that keeps several
#: blocks per multiprocessor on every architecture)
DEFAULT_BLOCK_THREADS = 256


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def launch_dims(global_size: Sequence[int], local_size: Sequence[int] | None, max_threads: int,
                max_block_dims: Sequence[int], max_grid_dims: Sequence[int]) -> tuple[tuple[int, int, int],
                                                                                        tuple[int, int, int]]:
    """The ``(grid, block)`` of a launch covering ``global_size`` threads (3 dimensions, innermost first).

    ``local_size`` fixes the block (it must fit ``max_threads`` and ``max_block_dims``: ``ValueError``
    otherwise). Without it, the block takes up to ``min(max_threads, DEFAULT_BLOCK_THREADS)`` threads,
    dimension 0 first. The grid has enough blocks to cover the global size, at most ``max_grid_dims``.
    """
    g = [int(x) for x in global_size] + [1] * (3 - len(global_size))
    if len(g) != 3 or any(x < 0 for x in g):
        raise ValueError(f"global size must be up to 3 sizes >= 0, got {tuple(global_size)}")
    if local_size is not None:
        block = [int(x) for x in local_size] + [1] * (3 - len(local_size))
        if len(block) != 3 or any(b < 1 for b in block):
            raise ValueError(f"local size must be up to 3 sizes >= 1, got {tuple(local_size)}")
        if block[0] * block[1] * block[2] > max_threads or any(b > m for b, m in zip(block, max_block_dims)):
            raise ValueError(f"local size {tuple(block)} exceeds the GPU's block limits ({max_threads} threads, "
                             f"{tuple(max_block_dims)} per dimension)")
    else:
        budget = max(1, min(max_threads, DEFAULT_BLOCK_THREADS))
        block = []
        for size, limit in zip(g, max_block_dims):
            b = min(_pow2_at_least(max(size, 1)), budget, limit)
            block.append(b)
            budget = max(1, budget // b)
    grid = [max(1, min(-(-size // b), limit)) for size, b, limit in zip(g, block, max_grid_dims)]
    return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])


class KernelArgs:
    """The parameter block of one launch: int variables (64-bit), then buffer addresses, and the ``void**``
    array of pointers to them that ``cuLaunchKernel`` and kernel graph nodes take."""

    def __init__(self, ptrs: Sequence[int], vals: Sequence[int]):
        self.nvals = len(vals)
        self.values = (ctypes.c_uint64 * (len(vals) + len(ptrs)))()
        base = ctypes.addressof(self.values)
        self.pointers = (ctypes.c_void_p * len(self.values))(*[base + 8 * i for i in range(len(self.values))])
        self.set(ptrs, vals)

    @property
    def address(self) -> int:
        """The ``void**`` to pass as ``kernelParams``."""
        return ctypes.addressof(self.pointers)

    def set(self, ptrs: Sequence[int], vals: Sequence[int]) -> None:
        """Store new values (same counts as at creation)."""
        for i, v in enumerate(vals):
            self.values[i] = int(v) & 0xFFFFFFFFFFFFFFFF
        for i, p in enumerate(ptrs):
            self.values[self.nvals + i] = p

    def set_buffer(self, index: int, ptr: int) -> None:
        """Make buffer parameter ``index`` the device address ``ptr``."""
        self.values[self.nvals + index] = ptr


class CUDAProgram:
    """A kernel loaded from a module: ``CUDAProgram(device, name, binary)(*bufs, global_size=...)``.

    ``binary`` is what :class:`~ember_cuda.compiler.CUDACompiler` returns: a
    :class:`~ember.device.batch_compiler.KernelBinary` naming the kernel's symbol in a module that may hold
    the other kernels of its batch; kernels of one module share one ``cuModuleLoadData``.

    A launch only queues the kernel on the device's stream. With ``wait`` it also waits and returns the
    kernel's GPU time in seconds, measured with CUDA events (what ``DEBUG>=2`` prints).
    """

    def __init__(self, device: Any, name: str, binary: bytes):
        self.device, self.name, self.binary = device, name, binary
        self.driver = device.driver
        try:
            kb = KernelBinary.unpack(binary)
        except ValueError as e:
            raise ValueError(f"kernel {name}: {e}") from None
        self.symbol = kb.kernel_symbol(name)
        device.activate()
        module = device.load_module(kb.program)
        self.function = check(self.driver.cuModuleGetFunction(module, self.symbol.encode()),
                              f"cuModuleGetFunction({self.symbol})")
        attr = self.driver.CUfunction_attribute
        #: the most threads a block of this kernel may have (fewer than the GPU's limit when it uses many registers)
        self.max_threads = int(check(self.driver.cuFuncGetAttribute(
            attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, self.function), "cuFuncGetAttribute"))
        #: static shared memory the kernel declares (the launch adds no dynamic shared memory)
        self.shared_bytes = int(check(self.driver.cuFuncGetAttribute(
            attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.function), "cuFuncGetAttribute"))
        self._args: KernelArgs | None = None
        self._bound: tuple[Any, ...] | None = None

    def launch_dims(self, global_size: Sequence[int], local_size: Sequence[int] | None) -> tuple[
            tuple[int, int, int], tuple[int, int, int]]:
        """The ``(grid, block)`` this kernel launches with on its GPU."""
        r = self.device.renderer
        return launch_dims(global_size, local_size, self.max_threads, r.local_max, r.max_grid_dims)

    def __call__(self, *bufs: Any, global_size: Sequence[int] = (1, 1, 1), local_size: Sequence[int] | None = None,
                 vals: Sequence[int] = (), wait: bool = False) -> float | None:
        if 0 in tuple(global_size):  # an empty grid: nothing to run (the driver rejects it)
            return 0.0 if wait else None
        key = (*bufs, *vals)
        if key != self._bound or self._args is None:
            self._args = KernelArgs([b.ptr for b in bufs], vals)
            self._bound = key
        grid, block = self.launch_dims(global_size, local_size)
        device, driver = self.device, self.driver
        device.activate()
        if wait:
            check(driver.cuEventRecord(device.timing_events[0], device.stream), "cuEventRecord")
        check(driver.cuLaunchKernel(self.function, *grid, *block, 0, device.stream, self._args.address, 0),
              f"cuLaunchKernel({self.name}, grid={grid}, block={block})")
        if not wait:
            return None
        return device.elapsed_since(device.timing_events[0])

    def __repr__(self) -> str:
        return f"<CUDAProgram {self.name} on {self.device.device}>"
