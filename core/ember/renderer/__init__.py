"""Renderers turn a linear UOp program into source code for one kind of device.

A device plugin gives its :class:`Renderer` the capabilities codegen needs (vector widths,
local memory, thread limits, supported dtypes). Core asks the renderer, never a device name.
"""
from __future__ import annotations

from ember.dtype import DType, dtypes
from ember.graph.uop import UOp


class Renderer:
    """Capabilities of a target plus ``render(name, uops) -> source``."""

    device: str = ""
    #: dtypes this target can load, store and compute with
    supported_dtypes: frozenset[DType] = frozenset(dtypes.fields().values())
    supports_float16: bool = True
    #: True when the target launches a grid of threads (GPU-style); False for loop-based targets
    has_local: bool = False
    has_shared: bool = False
    global_max: tuple[int, ...] | None = None
    local_max: tuple[int, ...] | None = None
    shared_max: int = 0
    #: how many host threads a loop-based target may split its outermost loop across
    parallel_threads: int = 1
    #: minimum estimated work (loop iterations) before a kernel is worth running in parallel
    parallel_min_work: int = 1 << 15
    #: float32 lanes per vector register and vector registers per core: register tiles are sized from
    #: them (see :func:`ember.codegen.opts.heuristic_opts`)
    vector_floats: int = 4
    vector_registers: int = 16

    def render(self, name: str, uops: list[UOp]) -> str:
        """Render the linear program ``uops`` as the source of a kernel called ``name``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement render()")
