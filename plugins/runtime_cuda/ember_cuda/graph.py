"""Replay a captured list of kernel launches on one GPU as a CUDA graph.

The graph is built node by node (``cuGraphAddKernelNode``, each node depending on the one before,
so kernels run in capture order) and instantiated once. A replay is one ``cuGraphLaunch``. New
input buffers or int variables are patched into the instantiated graph
(``cuGraphExecKernelNodeSetParams``), without rebuilding it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ember_cuda.driver import check
from ember_cuda.runtime import CUDAProgram, KernelArgs


class CUDAGraph:
    """A batch of kernel calls replayed in order by ``graph()``.

    ``calls`` holds ``(program, bufs, vals, global_size)`` or ``(program, bufs, vals, global_size,
    local_size)`` tuples; every program is a :class:`~ember_cuda.runtime.CUDAProgram` of the same GPU.
    The graph keeps the programs, buffers and parameter blocks alive; :meth:`update_buffer` and
    :meth:`update_vals` change one call's arguments.
    """

    def __init__(self, calls: Sequence[Sequence[Any]]):
        self.programs: list[CUDAProgram] = []
        self.bufs: list[list[Any]] = []
        self.vals: list[tuple[int, ...]] = []
        self.args: list[KernelArgs] = []
        self.nodes: list[Any] = []  # CUgraphNode per call, None for an empty grid (no node)
        self.params: list[Any] = []  # CUDA_KERNEL_NODE_PARAMS per call, None for an empty grid
        for i, call in enumerate(calls):
            if not 4 <= len(call) <= 5:
                raise ValueError(f"CUDAGraph call {i}: expected (program, bufs, vals, global_size[, local_size]), "
                                 f"got {len(call)} items")
            prg, bufs, vals, global_size = call[:4]
            if not isinstance(prg, CUDAProgram):
                raise TypeError(f"CUDAGraph call {i}: expected a CUDAProgram, got {type(prg).__name__}")
            if self.programs and prg.device is not self.programs[0].device:
                raise ValueError(f"CUDAGraph call {i} runs on {prg.device.device}, the graph on "
                                 f"{self.programs[0].device.device}")
            self.programs.append(prg)
            self.bufs.append(list(bufs))
            self.vals.append(tuple(vals))
            self.args.append(KernelArgs([b.ptr for b in bufs], vals))
            self.params.append(None if 0 in tuple(global_size) else
                               self._node_params(prg, global_size, call[4] if len(call) == 5 else None, self.args[-1]))
        self.device: Any = self.programs[0].device if self.programs else None
        self.graph = self.exec = None
        if any(p is not None for p in self.params):
            self._instantiate()

    @staticmethod
    def _node_params(prg: CUDAProgram, global_size: Sequence[int], local_size: Sequence[int] | None,
                     args: KernelArgs) -> Any:
        grid, block = prg.launch_dims(global_size, local_size)
        p = prg.driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = prg.function
        p.gridDimX, p.gridDimY, p.gridDimZ = grid
        p.blockDimX, p.blockDimY, p.blockDimZ = block
        p.sharedMemBytes = 0
        p.kernelParams = args.address
        p.extra = 0
        return p

    def _instantiate(self) -> None:
        device = self.device
        driver = device.driver
        device.activate()
        self.graph = check(driver.cuGraphCreate(0), "cuGraphCreate")
        previous: list[Any] = []
        for p in self.params:
            if p is None:
                self.nodes.append(None)
                continue
            node = check(driver.cuGraphAddKernelNode(self.graph, previous, len(previous), p), "cuGraphAddKernelNode")
            self.nodes.append(node)
            previous = [node]
        self.exec = check(driver.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")

    def __call__(self, wait: bool = False) -> float | None:
        """Launch the graph on the device's stream; with ``wait``, wait and return the GPU time in seconds."""
        if self.exec is None:
            return 0.0 if wait else None
        device, driver = self.device, self.device.driver
        device.activate()
        if wait:
            check(driver.cuEventRecord(device.timing_events[0], device.stream), "cuEventRecord")
        check(driver.cuGraphLaunch(self.exec, device.stream), "cuGraphLaunch")
        return device.elapsed_since(device.timing_events[0]) if wait else None

    def _patch(self, call_index: int) -> None:
        """Hand call ``call_index``'s parameter block to the instantiated graph again."""
        if self.nodes and self.nodes[call_index] is not None:
            driver = self.device.driver
            self.device.activate()
            check(driver.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[call_index], self.params[call_index]),
                  "cuGraphExecKernelNodeSetParams")

    def update_buffer(self, call_index: int, buf_index: int, opaque: Any) -> None:
        """Make argument ``buf_index`` of call ``call_index`` the buffer ``opaque``."""
        bufs = self.bufs[call_index]
        if not 0 <= buf_index < len(bufs):
            raise IndexError(f"call {call_index} has {len(bufs)} buffers, no buffer {buf_index}")
        bufs[buf_index] = opaque
        self.args[call_index].set_buffer(buf_index, opaque.ptr)
        self._patch(call_index)

    def update_vals(self, call_index: int, vals: Sequence[int]) -> None:
        """Replace the int variables of call ``call_index`` (same count as at capture)."""
        count = len(self.vals[call_index])
        if len(vals) != count:
            raise ValueError(f"call {call_index} takes {count} int variables, got {len(vals)}")
        self.vals[call_index] = tuple(vals)
        self.args[call_index].set([b.ptr for b in self.bufs[call_index]], vals)
        self._patch(call_index)

    def __len__(self) -> int:
        return len(self.programs)

    def __del__(self) -> None:
        try:
            if getattr(self, "exec", None) is not None:
                self.device.driver.cuGraphExecDestroy(self.exec)
            if getattr(self, "graph", None) is not None:
                self.device.driver.cuGraphDestroy(self.graph)
        except Exception:  # noqa: BLE001 - the driver may already be shut down at interpreter exit
            pass
