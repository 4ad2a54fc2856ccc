"""Matmuls on RDNA3 WMMA (the TC opt) without an AMD GPU.

Each TC kernel is rendered for gfx1100, compiled by clang into a code object whose disassembly must hold the
``v_wmma_f32_16x16x16_*`` instruction, and run twice against numpy: on the PYTHON oracle (which executes the
instruction lane by lane where this renderer's layout puts A, B and D) and as the AMD kernel text built for the
CPU by PoCL (:func:`ember_amd.renderer.host_opencl_source`, what the mock GPU runs), where the instruction is the
host version that trades the wave's operands through local memory. Neither checks the GPU's instruction itself:
that the layout is the hardware's rests on AMD's documentation (see ``_WMMA_LAYOUT`` in the renderer).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from amd_test_tools import llvm_tool_output, require_clang
from ember_amd import elf
from ember_amd.compiler import AMDCompiler
from ember_amd.renderer import AMDRenderer, host_opencl_source

from ember import Device, Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.opts import Opt, OptError, apply_opts
from ember.dtype import DType
from ember.engine.realize import CompiledRunner, run_schedule
from ember.renderer import Renderer
from ember.schedule import ScheduleItem

LAYOUTS = ["a@b", "a@b.T", "a.T@b", "a.T@b.T", "batched", "float_out"]
DTYPES = [dtypes.float16, dtypes.bfloat16]
M, K, N = 32, 32, 48  # 2 x 2 x 3 tiles of 16


class OracleWithAMDLayout(Renderer):
    """The PYTHON renderer with gfx1100's tensor cores and lane layout (the oracle runs the kernel)."""

    def __init__(self, amd: AMDRenderer):
        self.amd, self.base = amd, Device["PYTHON"].renderer
        self.tensor_cores, self.has_local = amd.tensor_cores, True
        self.local_max, self.global_max = amd.local_max, (1 << 20,) * 3

    def tensor_core_layout(self, tc, operand, lane, element):  # noqa: ANN001, ANN201
        return self.amd.tensor_core_layout(tc, operand, lane, element)

    def render(self, name, uops):  # noqa: ANN001, ANN201
        return self.base.render(name, uops)


def _rounded(x: np.ndarray, dt: DType) -> np.ndarray:
    """``x`` rounded to ``dt`` as ember rounds it, back in float32."""
    return Tensor(x, device="PYTHON").cast(dt).cast(dtypes.float32).numpy()


def _case(layout: str, dt: DType) -> tuple[ScheduleItem, np.ndarray, int, DType]:
    """The matmul kernel of ``layout`` (its inputs realized), numpy's result on the rounded inputs, the reduce
    axis the TC opt names, and the output dtype."""
    rng = np.random.default_rng(LAYOUTS.index(layout))
    batch = (2,) if layout == "batched" else ()
    a = rng.uniform(-1, 1, (*batch, M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (*batch, K, N)).astype(np.float32)
    ref = _rounded(a, dt) @ _rounded(b, dt)

    def tensor(x: np.ndarray, transposed: bool) -> Tensor:
        """``x`` of ``dt``, stored transposed when asked (then viewed back as ``x``)."""
        stored = np.ascontiguousarray(x.swapaxes(-1, -2)) if transposed else x
        t = Tensor(stored, device="PYTHON").cast(dt).realize()
        return t.transpose(-1, -2) if transposed else t

    ta, tb = tensor(a, layout.startswith("a.T")), tensor(b, layout.endswith("b.T"))
    out = ta.cast(dtypes.float32) @ tb.cast(dtypes.float32) if layout == "float_out" else ta @ tb
    sched = out.schedule()
    run_schedule(sched[:-1])
    return sched[-1], ref, len(ref.shape), out.dtype


def _read(raw: bytes, dt: DType) -> np.ndarray:
    """A buffer of ``dt`` (float32, float16 or bfloat16) as float32 values."""
    if dt == dtypes.float32:
        return np.frombuffer(raw, np.float32)
    bits = np.frombuffer(raw, np.uint16)
    return bits.view(np.float16).astype(np.float32) if dt == dtypes.float16 else \
        (bits.astype(np.uint32) << 16).view(np.float32)


def _tolerance(out_dt: DType) -> dict[str, float]:
    # float accumulation of exact products: only the final rounding to a 16-bit output is coarse
    return {"rtol": 1e-5, "atol": 1e-5} if out_dt == dtypes.float32 else \
        {"rtol": 1e-2, "atol": 1e-2} if out_dt == dtypes.bfloat16 else {"rtol": 2e-3, "atol": 2e-3}


# --- declarations and layout -------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gfx1100", "gfx1101", "gfx1151"])
def test_rdna3_declares_wmma(arch: str):
    cores = AMDRenderer(arch).tensor_cores
    assert [(tc.dims, tc.dtype_in, tc.dtype_out, tc.threads) for tc in cores] == \
        [((16, 16, 16), dt, dtypes.float32, 32) for dt in DTYPES]


@pytest.mark.parametrize("arch,wave", [("gfx942", None), ("gfx90a", None), ("gfx1030", None), ("gfx1201", None),
                                       ("gfx1100", 64)])
def test_other_targets_declare_none_and_tc_raises(arch: str, wave: int | None):
    """CDNA's MFMA (wave64), RDNA2 (none), RDNA4 (another layout) and RDNA3 in wave64 declare no WMMA shapes."""
    renderer = AMDRenderer(arch, wave_size=wave)
    assert renderer.tensor_cores == ()
    si, _, k, _ = _case("a@b", dtypes.float16)
    with pytest.raises(OptError, match=f"TC on axis {k} .*AMDRenderer has no tensor cores"):
        apply_opts(si.ast, renderer, [Opt("TC", k, 0)])


def test_layout_holds_a_and_b_twice_and_d_once():
    """Lanes 0-15 hold every row of A and column of B once, lanes 16-31 the same again (the ISA guide requires
    the copy); D's 256 elements are spread over the 32 lanes once."""
    amd = AMDRenderer("gfx1100")
    for tc in amd.tensor_cores:
        every = [(r, c) for r in range(16) for c in range(16)]
        for operand in "AB":
            low = [amd.tensor_core_layout(tc, operand, lane, i) for lane in range(16) for i in range(16)]
            high = [amd.tensor_core_layout(tc, operand, lane + 16, i) for lane in range(16) for i in range(16)]
            assert sorted(low) == every and high == low, operand
        d = [amd.tensor_core_layout(tc, "C", lane, i) for lane in range(32) for i in range(8)]
        assert sorted(d) == every
        # the documented places: D element i of lane l is row 2i + l // 16, column l % 16
        assert amd.tensor_core_layout(tc, "C", 17, 3) == (7, 1) and amd.tensor_core_layout(tc, "A", 21, 4) == (5, 4)
        assert amd.tensor_core_layout(tc, "B", 21, 4) == (4, 5)


def test_bad_layout_questions_raise():
    amd = AMDRenderer("gfx1100")
    with pytest.raises(ValueError, match="operand must be 'A', 'B' or 'C'"):
        amd.tensor_core_layout(amd.tensor_cores[0], "D", 0, 0)
    cuda_like = type(amd.tensor_cores[0])((16, 8, 16), dtypes.float16, dtypes.float32, 32, (8, 4, 4))
    with pytest.raises(ValueError, match="is not a tensor core of <AMDRenderer gfx1100"):
        amd.tensor_core_layout(cuda_like, "A", 0, 0)


# --- rendered, compiled, run -------------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tc_kernel_compiles_to_wmma_and_the_oracle_matches(layout: str, dt: DType, tmp_path):
    amd = AMDRenderer("gfx1100")
    index = DTYPES.index(dt)
    tc = amd.tensor_cores[index]
    si, ref, k, out_dt = _case(layout, dt)
    opts = [Opt("TC", k, index)]
    spec = get_program(si.ast, amd, opts=opts)
    assert spec.local_size == (32, 1, 1) and spec.src.count(f"= EMBER_WMMA_{'F16' if index == 0 else 'BF16'}(") == 1
    assert tc.intrinsic in spec.src and f"void {spec.name}(" in spec.src
    # the oracle: the instruction run lane by lane where the layout puts the elements
    oracle = get_program(si.ast, OracleWithAMDLayout(amd), opts=opts)
    for buf in si.bufs:
        buf.allocate()
    CompiledRunner("PYTHON", oracle)(list(si.bufs), wait=True)
    np.testing.assert_allclose(_read(si.bufs[0].as_bytes(), out_dt).reshape(ref.shape), ref, **_tolerance(out_dt))
    # clang builds it for gfx1100 into the WMMA instruction
    require_clang("gfx1100")
    path = tmp_path / "tc.hsaco"
    lib = AMDCompiler("gfx1100").compile(spec.src)
    assert spec.name in elf.read_code_object(lib).kernels
    path.write_bytes(lib)
    asm = llvm_tool_output("llvm-objdump", "-d", "--mcpu=gfx1100", str(path))
    if "s_endpgm" not in asm:
        pytest.skip("llvm-objdump printed no gfx1100 code")
    name = "bf16" if dt == dtypes.bfloat16 else "f16"
    assert len(re.findall(rf"v_wmma_f32_16x16x16_{name}\b", asm)) >= 1, asm[-2000:]
    assert "scratch_" not in asm  # the operands stay in registers


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["a@b", "a.T@b.T", "batched", "float_out"])
def test_tc_kernel_text_on_the_cpu_matches_numpy(cl_cpu_context, layout: str, dt: DType):
    """The same kernel text with the host version of the instruction (what the mock GPU runs) on PoCL."""
    import pyopencl as cl

    amd = AMDRenderer("gfx1100")
    index = DTYPES.index(dt)
    si, ref, k, out_dt = _case(layout, dt)
    spec = get_program(si.ast, amd, opts=[Opt("TC", k, index)])
    src = host_opencl_source(spec.src)
    assert "__builtin_amdgcn" not in src and "ember_wmma_host(" in src
    queue = cl.CommandQueue(cl_cpu_context)
    mf = cl.mem_flags
    bufs = []
    for i, buf in enumerate(si.bufs):
        buf.allocate()
        if i in spec.outs:
            bufs.append(cl.Buffer(cl_cpu_context, mf.READ_WRITE, buf.nbytes))
        else:
            bufs.append(cl.Buffer(cl_cpu_context, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                  hostbuf=np.frombuffer(buf.as_bytes(), np.uint8)))
    prog = cl.Program(cl_cpu_context, src).build()
    # the work-group is the wave: the host instruction trades its operands within it
    cl.Kernel(prog, spec.name)(queue, tuple(spec.global_size), tuple(spec.local_size), *bufs)
    out = np.empty(si.bufs[0].nbytes, np.uint8)
    cl.enqueue_copy(queue, out, bufs[0])
    queue.finish()
    np.testing.assert_allclose(_read(out.tobytes(), out_dt).reshape(ref.shape), ref, **_tolerance(out_dt))


@pytest.mark.parametrize("layout,dt", [("a@b", dtypes.float16), ("batched", dtypes.bfloat16)],
                         ids=["a@b-half", "batched-bfloat16"])
def test_tc_kernel_runs_on_the_mock_gpu(cl_cpu_context, layout: str, dt: DType):
    """The gfx1100 code object dispatched through the mock KFD's queues (which run its kernel text on PoCL)."""
    from ember_amd.device import AMDDevice
    from ember_amd.mock_kfd import MockKFD

    require_clang("gfx1100")
    index = DTYPES.index(dt)
    si, ref, k, out_dt = _case(layout, dt)
    spec = get_program(si.ast, AMDRenderer("gfx1100"), opts=[Opt("TC", k, index)])
    dev = AMDDevice("AMD", osif=MockKFD("gfx1100"))
    try:
        prg = dev._program(spec.name, AMDCompiler("gfx1100").compile(spec.src))
        bufs = []
        for buf in si.bufs:
            buf.allocate()
            bufs.append(dev.allocator.alloc(buf.nbytes))
            dev.allocator.copyin(bufs[-1], memoryview(buf.as_bytes()))
        prg(*bufs, global_size=spec.global_size, local_size=spec.local_size, wait=True)
        out = np.empty(si.bufs[0].nbytes, np.uint8)
        dev.allocator.copyout(memoryview(out), bufs[0])
        assert dev.os.dispatches == 1 and dev.os.errors == []
    finally:
        dev.finalize()
    np.testing.assert_allclose(_read(out.tobytes(), out_dt).reshape(ref.shape), ref, **_tolerance(out_dt))


# --- the heuristic's choice --------------------------------------------------------------------

def test_heuristic_chooses_wmma_and_the_kernels_compile():
    """For 16-bit matmuls whose sizes are multiples of 16 the work-group heuristic picks the WMMA tile of their
    dtype; the kernels build for gfx1100 in one clang call and the oracle, given the same opts, matches numpy.
    A tile that does not fit (M = 24) or a target without WMMA (gfx942) gets the other opts."""
    from ember_amd.corpus_check import check_corpus

    from ember.codegen.heuristic import heuristic_opts

    amd = AMDRenderer("gfx1100")
    cases = [(layout, dt) for layout in ("a@b", "a.T@b", "batched") for dt in DTYPES]
    chosen = []
    for layout, dt in cases:
        si, ref, k, out_dt = _case(layout, dt)
        opts = heuristic_opts(si.ast, amd)
        assert opts == [Opt("TC", k, DTYPES.index(dt))], (layout, dt, opts)
        assert not any(o.op == "TC" for o in heuristic_opts(si.ast, AMDRenderer("gfx942")))
        chosen.append((si, ref, out_dt, opts))
    rng = np.random.default_rng(1)
    a, b = (Tensor(rng.uniform(-1, 1, s).astype(np.float32), device="PYTHON").cast(dtypes.float16).realize()
            for s in ((24, 32), (32, 48)))
    short = (a @ b).schedule()[-1].ast
    assert not any(o.op == "TC" for o in heuristic_opts(short, amd))
    with pytest.raises(OptError, match=r"M \(axis 0, 24\) is not a multiple of 16"):
        apply_opts(short, amd, [Opt("TC", 2, 0)])  # a matmul, but its M does not fit the tile
    require_clang("gfx1100")
    [result] = check_corpus([si.ast for si, *_ in chosen], ["gfx1100"])
    assert result.kernels == len(chosen) and result.programs == 1
    for si, ref, out_dt, opts in chosen:
        oracle = get_program(si.ast, OracleWithAMDLayout(amd), opts=opts)
        for buf in si.bufs:
            buf.allocate()
        CompiledRunner("PYTHON", oracle)(list(si.bufs), wait=True)
        np.testing.assert_allclose(_read(si.bufs[0].as_bytes(), out_dt).reshape(ref.shape), ref, **_tolerance(out_dt))
