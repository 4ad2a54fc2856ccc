"""Grouped reductions (GROUP/GROUPTOP) in CUDA C: rendered with ``__shared__`` memory and ``__syncthreads()``,
compiled by NVRTC, and launched so every thread of a block reaches the barrier (no GPU needed)."""
from __future__ import annotations

import numpy as np
import pytest
from ember_cuda.compiler import nvrtc_compile
from ember_cuda.renderer import CUDARenderer
from ember_cuda.runtime import launch_dims

from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.heuristic import heuristic_opts
from ember.codegen.opts import Opt
from ember.ir.uop import Ops

pytestmark = pytest.mark.usefixtures("nvrtc_available")


def last_ast(t: Tensor):
    return [si.ast for si in t.schedule() if si.ast.op is not Ops.COPY][-1]


def data(shape: tuple[int, ...], dt=dtypes.float32) -> Tensor:
    return Tensor(np.ones(shape, np.float32), device="PYTHON").realize().cast(dt).realize()


@pytest.mark.parametrize("make,opts", [
    (lambda: data((4096,)).sum(), [Opt("GROUP", 0, 64), Opt("UNROLL", 0, 4)]),
    (lambda: data((4096,), dtypes.bfloat16).max(), [Opt("GROUPTOP", 0, 32)]),
    (lambda: data((4096,), dtypes.float16).sum(), [Opt("GROUP", 0, 128)]),
    (lambda: data((512, 64)).sum(0), [Opt("LOCAL", 1, 16), Opt("GROUPTOP", 0, 16), Opt("UPCAST", 1, 4)]),
    (lambda: data((64, 512)).max(1), [Opt("LOCAL", 0, 4), Opt("GROUP", 1, 32), Opt("UNROLL", 1, 2)]),
    (lambda: data((2, 3, 4, 64)).sum(3), [Opt("GROUP", 3, 16)]),  # three output axes share two dimensions
])
def test_grouped_kernels_compile(make, opts: list[Opt]):
    renderer = CUDARenderer("sm_80")
    spec = get_program(last_ast(make()), renderer, opts=opts)
    assert "__shared__" in spec.src and "__syncthreads();" in spec.src
    # the shared arrays are declared at the top of the kernel body, before any loop
    body = spec.src[spec.src.index("{", spec.src.index("__global__")):]
    assert body.index("__shared__") < body.index("for (")
    assert nvrtc_compile(spec.src, "sm_80")
    # a block is the work-group and the grid covers the launch exactly: every thread of a block runs the same
    # grid-stride trips, so each reaches every barrier
    assert spec.local_size is not None
    grid, block = launch_dims(spec.global_size, spec.local_size, renderer.max_threads_per_block,
                              renderer.local_max, renderer.max_grid_dims)
    assert block == spec.local_size
    assert all(g * b == n for g, b, n in zip(grid, block, spec.global_size))


def test_heuristic_groups_a_full_sum():
    renderer = CUDARenderer("sm_90")
    ast = last_ast(data((1 << 16,)).sum())
    opts = heuristic_opts(ast, renderer)
    assert any(o.op == "GROUP" for o in opts), opts
    assert nvrtc_compile(get_program(ast, renderer, opts=opts).src, "sm_90")
