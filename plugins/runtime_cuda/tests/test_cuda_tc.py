"""Matmuls on CUDA tensor cores (the TC opt): ``mma.sync`` fragments where the PTX ISA puts them, kernels that
NVRTC compiles for each architecture, and results the PYTHON oracle (running the instruction lane by lane with
this renderer's layout) checks against numpy. No GPU needed."""
from __future__ import annotations

import numpy as np
import pytest
from ember_cuda.compiler import nvrtc_compile
from ember_cuda.renderer import CUDARenderer

from ember import Device, Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.opts import Opt
from ember.dtype import DType
from ember.engine.realize import CompiledRunner, run_schedule
from ember.renderer import Renderer
from ember.schedule import ScheduleItem

pytestmark = pytest.mark.usefixtures("nvrtc_available")

CORES = [(arch, i) for arch in ("sm_75", "sm_80", "sm_90") for i in range(len(CUDARenderer(arch).tensor_cores))]


class OracleWithCUDALayout(Renderer):
    """The PYTHON renderer with a CUDA GPU's tensor cores and fragment layout (the oracle runs the kernel)."""

    def __init__(self, cuda: CUDARenderer):
        self.cuda, self.base = cuda, Device["PYTHON"].renderer
        self.tensor_cores, self.has_local = cuda.tensor_cores, True
        self.local_max, self.global_max = cuda.local_max, (1 << 20,) * 3

    def tensor_core_layout(self, tc, operand, lane, element):  # noqa: ANN001, ANN201
        return self.cuda.tensor_core_layout(tc, operand, lane, element)

    def render(self, name, uops):  # noqa: ANN001, ANN201
        return self.base.render(name, uops)


def test_fragments_cover_each_matrix_once():
    for tc in {t for arch in ("sm_75", "sm_80") for t in CUDARenderer(arch).tensor_cores}:
        m, n, k = tc.dims
        for operand, (rows, cols), count in zip("ABC", ((m, k), (k, n), (m, n)), tc.elements_per_thread):
            places = [CUDARenderer().tensor_core_layout(tc, operand, lane, i)
                      for lane in range(tc.threads) for i in range(count)]
            assert sorted(places) == [(r, c) for r in range(rows) for c in range(cols)], (tc.name, operand)


@pytest.mark.parametrize("arch,index", CORES)
def test_tc_matmul_compiles_and_matches(arch: str, index: int):
    cuda = CUDARenderer(arch)
    tc = cuda.tensor_cores[index]
    m, n, k = tc.dims
    rng = np.random.default_rng(index)
    a = rng.uniform(-1, 1, (2 * m, 2 * k)).astype(np.float32)
    b = rng.uniform(-1, 1, (2 * k, 3 * n)).astype(np.float32)
    ta = Tensor(a, device="PYTHON").cast(tc.dtype_in).realize()
    tb = Tensor(b, device="PYTHON").cast(tc.dtype_in).realize()
    sched = (ta @ tb).schedule()
    run_schedule(sched[:-1])
    si = sched[-1]
    spec = get_program(si.ast, cuda, opts=[Opt("TC", 2, index)])
    assert tc.intrinsic in spec.src and spec.local_size == (32, 1, 1)
    assert nvrtc_compile(spec.src, arch)
    oracle = get_program(si.ast, OracleWithCUDALayout(cuda), opts=[Opt("TC", 2, index)])
    for buf in si.bufs:
        buf.allocate()
    CompiledRunner("PYTHON", oracle)(list(si.bufs), wait=True)
    raw = np.frombuffer(si.bufs[0].as_bytes(), np.uint16)  # the product is of the input dtype (16 bits)
    got = raw.view(np.float16).astype(np.float32) if tc.dtype_in == dtypes.float16 else \
        (raw.astype(np.uint32) << 16).view(np.float32)
    # the inputs as the tensor core sees them (rounded to its dtype), multiplied exactly
    ai, bi = (Tensor(x, device="PYTHON").cast(tc.dtype_in).cast(dtypes.float32).numpy() for x in (a, b))
    np.testing.assert_allclose(got.reshape(2 * m, 3 * n), ai @ bi, rtol=1e-2, atol=1e-2)


# --- the heuristic's choice: TC where a tensor core fits, compiled in one NVRTC program per architecture ---------

def heuristic_cases() -> list[tuple[ScheduleItem, np.ndarray, DType]]:
    """Matmul kernels of 16-bit inputs (their inputs computed on PYTHON): (schedule item, numpy's result on the
    rounded inputs, input dtype). M, N and K are multiples of every mma tile."""
    rng = np.random.default_rng(5)
    out = []
    for dt, layout in ((dtypes.float16, "a@b"), (dtypes.float16, "a@b.T"), (dtypes.float16, "batched"),
                       (dtypes.bfloat16, "a@b")):
        batch = (2,) if layout == "batched" else ()
        a = rng.uniform(-1, 1, (*batch, 32, 32)).astype(np.float32)
        b = rng.uniform(-1, 1, (*batch, 32, 48)).astype(np.float32)
        ai, bi = (Tensor(x, device="PYTHON").cast(dt).cast(dtypes.float32).numpy() for x in (a, b))
        if layout == "a@b.T":
            tb = Tensor(np.ascontiguousarray(b.swapaxes(-1, -2)), device="PYTHON").cast(dt).realize().T
        else:
            tb = Tensor(b, device="PYTHON").cast(dt).realize()
        sched = (Tensor(a, device="PYTHON").cast(dt).realize() @ tb).schedule()
        run_schedule(sched[:-1])
        out.append((sched[-1], ai @ bi, dt))
    return out


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_heuristic_chooses_tc_and_the_kernels_compile(arch: str):
    from ember_cuda.corpus_check import check_corpus, render_corpus

    from ember.codegen.heuristic import heuristic_opts

    cuda = CUDARenderer(arch)
    cases = heuristic_cases()
    chosen = []
    for si, ref, dt in cases:
        opts = heuristic_opts(si.ast, cuda)
        declared = any(tc.dtype_in == dt for tc in cuda.tensor_cores)  # sm_75 has no bfloat16 mma
        assert any(o.op == "TC" for o in opts) == declared, (dt, opts)
        if declared:
            chosen.append((si, ref, dt, opts))
    asts = [si.ast for si, _, _ in cases]
    srcs = render_corpus(asts, arch)
    assert sum("mma.sync" in s for s in srcs) == len(chosen)
    [result] = check_corpus(asts, [arch])  # all in one NVRTC program (and one ptxas run where there is ptxas)
    assert result.kernels == len(asts) and result.programs == 1
    # the same opts on the PYTHON oracle with this architecture's fragment layout: numpy's product
    for si, ref, dt, opts in chosen:
        oracle = get_program(si.ast, OracleWithCUDALayout(cuda), opts=opts)
        assert oracle.local_size == (32, 1, 1)
        for buf in si.bufs:
            buf.allocate()
        CompiledRunner("PYTHON", oracle)(list(si.bufs), wait=True)
        raw = np.frombuffer(si.bufs[0].as_bytes(), np.uint16)
        got = raw.view(np.float16).astype(np.float32) if dt == dtypes.float16 else \
            (raw.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-2, atol=1e-2)
