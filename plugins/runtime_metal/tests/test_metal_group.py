"""Grouped reductions (GROUP/GROUPTOP) in MSL: ``threadgroup`` arrays and ``threadgroup_barrier``, type-checked
with clang (no Apple compiler needed)."""
from __future__ import annotations

import numpy as np
import pytest
from ember_metal.renderer import MetalRenderer
from metal_msl_check import check_msl

from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.opts import Opt
from ember.ir.uop import Ops


def last_ast(t: Tensor):
    return [si.ast for si in t.schedule() if si.ast.op is not Ops.COPY][-1]


def data(shape: tuple[int, ...], dt=dtypes.float32) -> Tensor:
    return Tensor(np.ones(shape, np.float32), device="PYTHON").realize().cast(dt).realize()


def test_grouped_kernels_type_check(clang: str) -> None:
    renderer = MetalRenderer()
    cases = [(data((4096,)).sum(), [Opt("GROUP", 0, 64), Opt("UNROLL", 0, 4)]),
             (data((4096,), dtypes.bfloat16).max(), [Opt("GROUPTOP", 0, 32)]),
             (data((4096,), dtypes.float16).sum(), [Opt("GROUP", 0, 128)]),
             (data((512, 64)).sum(0), [Opt("LOCAL", 1, 16), Opt("GROUPTOP", 0, 16), Opt("UPCAST", 1, 4)]),
             (data((2, 3, 4, 64)).sum(3), [Opt("GROUP", 3, 16)])]
    sources = []
    for i, (t, opts) in enumerate(cases):
        spec = get_program(last_ast(t), renderer, opts=opts, name=f"grouped_{i}")
        assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in spec.src
        assert spec.src.count("threadgroup ") >= 1 + (opts[-1].op == "UPCAST")
        sources.append(spec.src)
    assert check_msl(sources) == 1


def test_metal_refuses_a_group_over_its_threadgroup_memory() -> None:
    from ember.codegen.opts import OptError

    small = MetalRenderer(shared_max=1024)
    with pytest.raises(OptError, match="bytes of local memory, more than the device's 1024"):
        get_program(last_ast(data((512, 64)).sum(0)), small, opts=[Opt("LOCAL", 1, 16), Opt("GROUPTOP", 0, 32)])
