"""The rendered MSL computes what ember's PYTHON device computes, when compiled for the host CPU.

Every op of every dtype, every cast pair and bitcast, multi-dimensional grids, int variables and gated
loads: the same linear program runs on the PYTHON device (the oracle) and as MSL compiled with
``shim/host/metal_stdlib`` (see metal_host_run), on inputs full of edge cases. Results must match bit for
bit, transcendental functions within 2 ulp. This checks the renderer's arithmetic; it does not run Metal.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from ember_metal.renderer import MetalRenderer, tensor_cores, wmma_helper, wmma_name
from metal_host_run import HostKernels, run_on_python
from metal_msl_check import check_msl
from metal_programs import every_program, threadgroup_sum_program

from ember.dtype import f32_to_bf16, to_np_dtype
from ember.renderer import DType, Ops, PtrDType, UOp, dtypes

N = 64
RNG = np.random.default_rng(11)
TRANSCENDENTAL = {Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW}
EPS = {dtypes.float16: 2 ** -10, dtypes.bfloat16: 2 ** -7, dtypes.float32: 2 ** -23}


def storage(dt: DType) -> np.dtype:
    return np.dtype(np.uint16) if dt == dtypes.bfloat16 else np.dtype(to_np_dtype(dt))


def sample(dt: DType) -> np.ndarray:
    """N stored values of ``dt``: extremes, zeros, nan and inf among random ones."""
    if dt == dtypes.bool:
        return RNG.integers(0, 2, N).astype(np.bool_)
    if dt.kind in "iu":
        info = np.iinfo(to_np_dtype(dt))
        edges = [info.min, info.max, 0, 1, 2, 3, 7, 8, 31, 32, 63, 64] + ([-1, -2, -7, -8] if dt.kind == "i" else [])
        rand = RNG.integers(info.min, info.max, N, dtype=to_np_dtype(dt), endpoint=True)
        small = RNG.integers(-9 if dt.kind == "i" else 0, 10, N).astype(to_np_dtype(dt))
        mixed = np.concatenate([np.array(edges, dtype=to_np_dtype(dt)), rand[:N // 2], small])[:N]
        return RNG.permutation(mixed)
    edges = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, 1e-3, 65504.0, 100.25, -7.75, 3e9, -3e9]
    vals = np.concatenate([edges, RNG.uniform(-20, 20, N) * RNG.choice([1e-3, 1.0, 1e2], N)])[:N]
    vals = RNG.permutation(vals)
    with np.errstate(over="ignore"):  # 3e9 and 65504 are float16's edge cases on purpose
        return f32_to_bf16(vals.astype(np.float32)) if dt == dtypes.bfloat16 else vals.astype(to_np_dtype(dt))


def values(a: np.ndarray, dt: DType) -> np.ndarray:
    return (a.astype(np.uint32) << 16).view(np.float32) if dt == dtypes.bfloat16 else a


def launch(uops: list[UOp]) -> tuple[list[DType], set[int], tuple[int, int, int], tuple[int, ...]]:
    """The buffer dtypes, the stored buffer indices, the grid and the variable values of a program."""
    globals_ = sorted((u for u in uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg[0])
    dts = [u.dtype.base for u in globals_ if isinstance(u.dtype, PtrDType)]
    stored = {u.src[0].arg[0] for u in uops if u.op is Ops.STORE}
    sizes = [u.src[1].arg for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"][::-1]
    grid = tuple(sizes + [1] * (3 - len(sizes)))
    vals = tuple(13 for u in uops if u.op is Ops.DEFINE_VAR)
    return dts, stored, grid, vals  # type: ignore[return-value]


@pytest.fixture(scope="module")
def host(host_clang: str) -> tuple[HostKernels, dict[str, list[UOp]]]:
    programs = dict(every_program())
    renderer = MetalRenderer()
    return HostKernels({name: renderer.render(name, uops) for name, uops in programs.items()}), programs


def compare(kernels: HostKernels, name: str, uops: list[UOp]) -> int:
    """Run program ``name`` on the host and on PYTHON; AssertionError on a difference. Returns the outputs checked."""
    dts, stored, grid, vals = launch(uops)
    arrays = [np.zeros(N, storage(dt)) if i in stored else sample(dt) for i, dt in enumerate(dts)]
    want = run_on_python(uops, [a.copy() for a in arrays], grid, vals)
    got = [a.copy() for a in arrays]
    kernels.run(name, got, grid, vals=vals)
    ops = {u.src[0].arg[0]: u.src[2].op for u in uops if u.op is Ops.STORE}
    for i in sorted(stored):
        dt, what = dts[i], f"{name}: output {i} ({ops[i].name} -> {dts[i].name})"
        g, w = values(got[i], dt), values(want[i], dt)
        if dt.kind == "f" and ops[i] in TRANSCENDENTAL:
            tol = 2 * EPS[dt]
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * 1e-3,
                                       equal_nan=True, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)
            if dt.kind == "f":
                zero = w == 0
                assert (np.signbit(g[zero]) == np.signbit(w[zero])).all(), f"{what}: signed zeros differ"
    return len(stored)


def test_every_program_matches_the_python_device(host: tuple[HostKernels, dict[str, list[UOp]]]) -> None:
    kernels, programs = host
    assert sum(compare(kernels, name, uops) for name, uops in programs.items()) > 300


class PlainFloatToInt(MetalRenderer):
    """A planted bug: float -> int casts without ember's range check (nan and out-of-range values must give 0)."""

    def _render_float_to_int(self, x: str, dt: DType) -> str:
        return f"(({self.render_dtype(dt)}){x})"


def test_the_comparison_catches_a_planted_cast_bug(host_clang: str) -> None:
    programs = dict(every_program())
    name = "cast_from_float"
    kernels = HostKernels({name: PlainFloatToInt().render(name, programs[name])})
    with pytest.raises(AssertionError, match=r"cast_from_float: output \d+ \(CAST -> "):
        compare(kernels, name, programs[name])


GROUP_DTYPES = (dtypes.float32, dtypes.int32, dtypes.float16, dtypes.bfloat16)


@functools.cache
def group_kernels(host_clang: str) -> HostKernels:
    """The work-group sum of every dtype in GROUP_DTYPES and the tile kernel of every tensor core, built once."""
    sources = {f"group_sum_{dt.name}": MetalRenderer().render(f"group_sum_{dt.name}", threadgroup_sum_program(dt))
               for dt in GROUP_DTYPES}
    sources.update({f"tile_{tc.dtype_in.name}_{tc.dtype_out.name}": tile_kernel(tc) for tc in tensor_cores()})
    return HostKernels(sources)


@pytest.mark.parametrize("dt", GROUP_DTYPES, ids=lambda d: d.name)
def test_threadgroup_memory_and_barrier_kernel_runs(host_clang: str, dt: DType) -> None:
    """The work-group sum (threadgroup array, barrier, thread 0 adds its group's 16 values) run with real
    threads per threadgroup gives each group's sum, accumulated in order in the dtype as ember does."""
    inp = sample(dt)
    out = np.zeros(4, storage(dt))
    group_kernels(host_clang).run(f"group_sum_{dt.name}", [out, inp], grid=(64, 1, 1), local=(16, 1, 1))
    want = np.zeros(4, storage(dt))
    with np.errstate(all="ignore"):  # the edge cases overflow and add inf to -inf on purpose
        expected_group_sums(inp, want, dt)
    np.testing.assert_array_equal(values(out, dt), values(want, dt))


def expected_group_sums(inp: np.ndarray, want: np.ndarray, dt: DType) -> None:
    """Each group's 16 values added in order in ``dt`` (bfloat16: float32 rounded after every add)."""
    for g in range(4):
        acc = np.array(0, to_np_dtype(dt) if dt != dtypes.bfloat16 else np.float32)
        for v in values(inp[16 * g:16 * g + 16], dt):
            acc = (acc + v).astype(acc.dtype)
            if dt == dtypes.bfloat16:
                acc = values(f32_to_bf16(np.array([acc], np.float32)), dt)[0]
        want[g] = f32_to_bf16(np.array([acc], np.float32))[0] if dt == dtypes.bfloat16 else acc


def tile_kernel(tc) -> str:
    """One 8x8x8 tile through the tensor-core helper: thread t of the SIMD group passes its elements of A, B
    and C (row-major tiles in buffers 1-3) in the declared layout and stores its elements of D."""
    names = {dtypes.float16: "half", dtypes.float32: "float"}
    ti, to = names[tc.dtype_in], names[tc.dtype_out]
    return f"""#include <metal_stdlib>
using namespace metal;
{wmma_helper(tc)}
kernel void tile_{tc.dtype_in.name}_{tc.dtype_out.name}(device {to}* data0 [[buffer(0)]],
    const device {ti}* data1 [[buffer(1)]], const device {ti}* data2 [[buffer(2)]],
    const device {to}* data3 [[buffer(3)]], ushort lane [[thread_index_in_simdgroup]]) {{
  threadgroup {ti} scratch_a[64];
  threadgroup {ti} scratch_b[64];
  threadgroup {to} scratch_c[64];
  const uint at = (lane / 4) * 8 + 2 * (lane % 4);
  {to}2 d = {wmma_name(tc)}({ti}2(data1[at], data1[at + 1]), {ti}2(data2[at], data2[at + 1]),
                            {to}2(data3[at], data3[at + 1]), scratch_a, scratch_b, scratch_c, lane);
  data0[at] = d.x;
  data0[at + 1] = d.y;
}}
"""


@pytest.mark.parametrize("tc", tensor_cores(), ids=lambda tc: tc.name)
def test_tensor_core_helper_computes_the_tile(host_clang: str, tc) -> None:
    """With 32 threads each holding its elements in the declared layout, the helper returns D = A @ B + C
    (the host keeps a whole copy of each simdgroup_matrix per lane: this checks the layout and the staging)."""
    check_msl([tile_kernel(tc)])  # the same text passes the MSL type check
    a, b = (RNG.integers(-4, 5, (8, 8)).astype(to_np_dtype(tc.dtype_in)) for _ in range(2))
    c = RNG.integers(-4, 5, (8, 8)).astype(to_np_dtype(tc.dtype_out))
    d = np.zeros((8, 8), to_np_dtype(tc.dtype_out))
    group_kernels(host_clang).run(f"tile_{tc.dtype_in.name}_{tc.dtype_out.name}", [d, a, b, c], grid=(32, 1, 1),
                             local=(32, 1, 1))
    want = a.astype(np.float64) @ b.astype(np.float64) + c  # small integers: exact in every dtype
    np.testing.assert_array_equal(d.astype(np.float64), want)


def test_index_type_is_64_bits_only_where_32_could_wrap(host_clang: str) -> None:
    """A kernel reading the far end of a view of 3.5e9 elements indexes with ``long`` (and gets the right values
    on the host), a small one with ``int``."""
    from ember import Tensor
    from ember.codegen import get_program

    def tail(rows: int):
        x = Tensor(np.arange(7, dtype=np.float32), device="PYTHON").realize()
        t = x.reshape(1, 7).expand(rows, 7).reshape(rows * 7)[-3:].contiguous()
        return get_program([si.ast for si in t.schedule() if si.ast.op is not Ops.COPY][-1], MetalRenderer(), "tail")

    big, small = tail(5 * 10 ** 8), tail(1000)
    assert "const long gidx0 = (long)gid.x;" in big.src and "int alu" not in big.src
    assert "const int gidx0 = (int)gid.x;" in small.src and "long alu" not in small.src
    check_msl([big.src])
    out = np.zeros(3, np.float32)
    HostKernels({"tail": big.src}).run("tail", [out, np.arange(7, dtype=np.float32)], big.global_size)
    np.testing.assert_array_equal(out, [4, 5, 6])
