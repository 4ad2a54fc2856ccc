"""Matmuls on Metal's ``simdgroup_matrix`` (the TC opt): kernels that type-check as MSL, and results the PYTHON
oracle (running the instruction lane by lane with this renderer's layout) checks against numpy."""
from __future__ import annotations

import numpy as np
import pytest
from ember_metal.renderer import MetalRenderer, wmma_name
from metal_msl_check import check_msl

from ember import Device, Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.opts import Opt, OptError
from ember.engine.realize import CompiledRunner, run_schedule
from ember.renderer import Renderer


class OracleWithMetalLayout(Renderer):
    """The PYTHON renderer with an Apple GPU's tensor cores and layout (the oracle runs the kernel)."""

    def __init__(self, metal: MetalRenderer):
        self.metal, self.base = metal, Device["PYTHON"].renderer
        self.tensor_cores, self.has_local = metal.tensor_cores, True
        self.local_max, self.global_max = metal.local_max, (1 << 20,) * 3

    def tensor_core_layout(self, tc, operand, lane, element):  # noqa: ANN001, ANN201
        return self.metal.tensor_core_layout(tc, operand, lane, element)

    def render(self, name, uops):  # noqa: ANN001, ANN201
        return self.base.render(name, uops)


def matmul_item(dt, rng: np.random.Generator):
    a = rng.uniform(-1, 1, (16, 24)).astype(np.float32)
    b = rng.uniform(-1, 1, (24, 32)).astype(np.float32)
    ta, tb = (Tensor(x, device="PYTHON").cast(dt).realize() for x in (a, b))
    sched = (ta @ tb).schedule()
    run_schedule(sched[:-1])
    ref = [Tensor(x, device="PYTHON").cast(dt).cast(dtypes.float32).numpy() for x in (a, b)]
    return sched[-1], ref[0] @ ref[1]


def test_tc_matmuls_type_check_and_match(clang: str) -> None:
    metal = MetalRenderer(bfloat_tensor_cores=True)
    sources = []
    rng = np.random.default_rng(3)
    for index, tc in enumerate(metal.tensor_cores):
        si, ref = matmul_item(tc.dtype_in, rng)
        if tc.dtype_in == tc.dtype_out == dtypes.float16:
            # ember sums half products in float: this tile (which accumulates in half) does not apply
            with pytest.raises(OptError, match="the sum is of dtypes.float"):
                get_program(si.ast, metal, opts=[Opt("TC", 2, index)])
            continue
        spec = get_program(si.ast, metal, opts=[Opt("TC", 2, index)], name=f"tc_{index}")
        assert f"{wmma_name(tc)}(" in spec.src and spec.local_size == (32, 1, 1)
        sources.append(spec.src)
        oracle = get_program(si.ast, OracleWithMetalLayout(metal), opts=[Opt("TC", 2, index)])
        for buf in si.bufs:
            buf.allocate()
        CompiledRunner("PYTHON", oracle)(list(si.bufs), wait=True)
        if tc.dtype_in == dtypes.float32:
            got = np.frombuffer(si.bufs[0].as_bytes(), np.float32)
        elif tc.dtype_in == dtypes.float16:
            got = np.frombuffer(si.bufs[0].as_bytes(), np.float16).astype(np.float32)
        else:
            got = (np.frombuffer(si.bufs[0].as_bytes(), np.uint16).astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-2, atol=1e-2)
    assert len(sources) == 3 and check_msl(sources) == 1


def test_heuristic_chooses_simdgroup_matrices_and_they_type_check(clang: str) -> None:
    """The work-group heuristic puts float32 and float16 matmuls whose sizes are multiples of 8 on the tile of
    their dtype (bfloat16 only where the renderer declares it); the kernels type-check in one clang run and the
    oracle, given the same opts, matches numpy."""
    from ember.codegen.heuristic import heuristic_opts

    rng = np.random.default_rng(4)
    sources = []
    for metal in (MetalRenderer(), MetalRenderer(bfloat_tensor_cores=True)):
        for dt in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
            si, ref = matmul_item(dt, rng)
            opts = heuristic_opts(si.ast, metal)
            # ember sums 16-bit products in float: only tiles with a float accumulator apply
            fits = [Opt("TC", 2, i) for i, tc in enumerate(metal.tensor_cores)
                    if tc.dtype_in == dt and tc.dtype_out == dtypes.float32]
            if not fits:
                assert all(o.op != "TC" for o in opts), opts
                continue
            assert opts == fits[:1]
            spec = get_program(si.ast, metal, opts=opts, name=f"tc_{len(sources)}")
            assert spec.local_size == (32, 1, 1)
            sources.append(spec.src)
            oracle = get_program(si.ast, OracleWithMetalLayout(metal), opts=opts)
            for buf in si.bufs:
                buf.allocate()
            CompiledRunner("PYTHON", oracle)(list(si.bufs), wait=True)
            raw = si.bufs[0].as_bytes()
            got = np.frombuffer(raw, np.float32) if dt == dtypes.float32 else \
                np.frombuffer(raw, np.float16).astype(np.float32) if dt == dtypes.float16 else \
                (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-2, atol=1e-2)
    assert len(sources) == 5 and check_msl(sources) == 1  # bfloat16 only with bfloat_tensor_cores
