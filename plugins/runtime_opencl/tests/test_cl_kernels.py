"""Rendered OpenCL kernels: linear programs checked against the PYTHON device, and tensor programs against numpy.

The PYTHON device interprets the same linear program, so every op and cast here must give its
answer: bit for bit where the semantics are exact, within a few ulp for transcendental functions.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.device import Device
from ember.dtype import DType, f32_to_bf16, to_np_dtype
from ember.ir.uop import Ops, UOp

pytestmark = pytest.mark.usefixtures("cl_available")

INTS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64)
FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
ALL = (dtypes.bool, *INTS, *FLOATS)
N = 64
RNG = np.random.default_rng(7)


# --------------------------------------------------------------------------------------------
# a linear-program harness
# --------------------------------------------------------------------------------------------

def storage_np(dt: DType) -> np.dtype:
    """The numpy dtype of a buffer of ``dt`` (bfloat16 as its 16-bit patterns)."""
    return np.dtype(np.uint16) if dt == dtypes.bfloat16 else np.dtype(to_np_dtype(dt))


def sample(dt: DType, n: int = N) -> np.ndarray:
    """``n`` values of ``dt``: every edge case (extremes, zero, nan, inf) and random ones, shuffled, as stored."""
    if dt == dtypes.bool:
        return RNG.integers(0, 2, n).astype(np.bool_)
    if dt.kind in "iu":
        info = np.iinfo(to_np_dtype(dt))
        edges = [info.min, info.max, 0, 1, info.max - 1, info.min + 1, 2, 3, 7, 8, 15, 16, 31, 32, 63, 64]
        if dt.kind == "i":
            edges += [-1, -2, -3, -7, -8]
        rand = RNG.integers(info.min, info.max, n, dtype=to_np_dtype(dt), endpoint=True)
        small = RNG.integers(-9 if dt.kind == "i" else 0, 10, n).astype(to_np_dtype(dt))
        mixed = RNG.permutation(np.concatenate([rand, small]))
        return RNG.permutation(np.concatenate([np.array(edges, dtype=to_np_dtype(dt)), mixed[:n - len(edges)]]))
    edges = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, 1e-3, 65504.0, 100.25, -7.75]
    rand = RNG.uniform(-20, 20, n) * RNG.choice([1e-3, 1.0, 1e2], n)
    vals = RNG.permutation(np.concatenate([np.array(edges), rand[:n - len(edges)]]))
    if dt == dtypes.bfloat16:
        return f32_to_bf16(vals.astype(np.float32))
    return vals.astype(to_np_dtype(dt))


def elementwise_program(op: Ops, out_dt: DType, in_dts: tuple[DType, ...], n: int = N) -> list[UOp]:
    """``data0[i] = op(data1[i], data2[i], ...)`` for i in [0, n), as a linear program."""
    return multi_program([(op, out_dt)], in_dts, n)


def multi_program(outputs: list[tuple[Ops, DType]], in_dts: tuple[DType, ...], n: int = N) -> list[UOp]:
    """One kernel computing every ``op(inputs...)`` of ``outputs``: output k goes to buffer k, inputs follow.

    An op taking fewer operands than there are inputs uses the first ones. Checking many ops in one
    kernel keeps the number of OpenCL builds (the slow part of these tests) small.
    """
    idx = dtypes.int32
    outs = [UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (k, n)) for k, (_, dt) in enumerate(outputs)]
    ins = [UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (len(outputs) + i, n)) for i, dt in enumerate(in_dts)]
    start, end = UOp.const(idx, 0), UOp.const(idx, n)
    rng = UOp(Ops.RANGE, idx, (start, end), (0, "global"))
    loads = [UOp(Ops.LOAD, dt, (g, rng)) for g, dt in zip(ins, in_dts)]
    body: list[UOp] = []
    for out, (op, dt) in zip(outs, outputs):
        arity = 3 if op is Ops.WHERE else 1 if op in UNARY else 2
        value = UOp(op, dt, tuple(loads[:arity]))
        body += [value, UOp(Ops.STORE, None, (out, rng, value))]
    return [*outs, *ins, start, end, rng, *loads, *body, UOp(Ops.ENDRANGE, None, (rng,)), UOp(Ops.SINK, None, ())]


def run_program(device: str, uops: list[UOp], out_dts: list[DType], inputs: list[np.ndarray], n: int = N,
                global_size: tuple[int, ...] | None = None) -> list[np.ndarray]:
    """Render, compile and run ``uops`` on ``device``; return each output buffer as stored."""
    dev = Device[device]
    src = dev.renderer.render("k", uops)
    prg = dev.runtime("k", dev.compiler.compile_cached(src))
    outs = [dev.allocator.alloc(n * dt.itemsize) for dt in out_dts]
    bufs = list(outs)
    for a in inputs:
        buf = dev.allocator.alloc(a.nbytes)
        dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(a)).cast("B"))
        bufs.append(buf)
    prg(*bufs, global_size=global_size or (n, 1, 1), wait=True)
    results = []
    for buf, dt in zip(outs, out_dts):
        result = np.empty(n, storage_np(dt))
        dev.allocator.copyout(memoryview(result).cast("B"), buf)
        results.append(result)
    return results


def as_values(a: np.ndarray, dt: DType) -> np.ndarray:
    """Stored values as numbers (bfloat16 patterns widened to float32)."""
    if dt == dtypes.bfloat16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def assert_same(got: np.ndarray, want: np.ndarray, dt: DType, ulps: float = 0.0, what: str = "") -> None:
    """Equal bit for bit (any nan matches any nan), or within ``ulps`` of the dtype's precision for floats."""
    g, w = as_values(got, dt), as_values(want, dt)
    if dt.kind != "f":
        np.testing.assert_array_equal(g, w, err_msg=what)
        return
    if ulps == 0:
        np.testing.assert_array_equal(g, w, err_msg=what)  # assert_array_equal treats nan == nan
        same_zero_sign = np.signbit(g[g == 0]) == np.signbit(w[g == 0])
        assert same_zero_sign.all(), f"{what}: signed zeros differ"
        return
    eps = {dtypes.float16: 2 ** -10, dtypes.bfloat16: 2 ** -7, dtypes.float32: 2 ** -23, dtypes.float64: 2 ** -52}[dt]
    np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=ulps * eps, atol=ulps * eps * 1e-30,
                               equal_nan=True, err_msg=what)


def check_against_python(outputs: list[tuple[Ops, DType]], in_dts: tuple[DType, ...], inputs: list[np.ndarray],
                         ulps: float = 0.0) -> None:
    """Run the ops of ``outputs`` on CL and on PYTHON and compare every output."""
    uops = multi_program(outputs, in_dts)
    out_dts = [dt for _, dt in outputs]
    got, want = run_program("CL", uops, out_dts, inputs), run_program("PYTHON", uops, out_dts, inputs)
    for (op, dt), g, w in zip(outputs, got, want):
        assert_same(g, w, dt, ulps, f"{op.name} -> {dt.name} on {', '.join(d.name for d in in_dts)}")


def cl_supports(*dts: DType) -> bool:
    return all(dt in Device["CL"].renderer.supported_dtypes for dt in dts)


def skip_unsupported(*dts: DType) -> None:
    if not cl_supports(*dts):
        pytest.skip(f"this OpenCL device lacks one of {', '.join(dt.name for dt in dts)}")


# --------------------------------------------------------------------------------------------
# every op and cast against the PYTHON device
# --------------------------------------------------------------------------------------------

UNARY = (Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP, Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.CAST,
         Ops.BITCAST)
EXACT_BINARY = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.IDIV, Ops.MOD, Ops.FDIV)
EXACT_UNARY_FLOAT = (Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP)
TRANSCENDENTAL = (Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN)
BITWISE = (Ops.AND, Ops.OR, Ops.XOR)
COMPARE = (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)


@pytest.mark.parametrize("dt", [*INTS, *FLOATS], ids=lambda d: d.name)
def test_arithmetic(dt):
    skip_unsupported(dt)
    ops = [(op, dt) for op in EXACT_BINARY] + [(op, dtypes.bool) for op in COMPARE]
    if dt.kind in "iu":
        ops += [(op, dt) for op in BITWISE]
    check_against_python(ops, (dt, dt), [sample(dt), sample(dt)])


def test_bool_ops():
    ops = [(op, dtypes.bool) for op in (*BITWISE, *COMPARE, Ops.NEG)]
    check_against_python(ops, (dtypes.bool, dtypes.bool), [sample(dtypes.bool), sample(dtypes.bool)])


@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_shifts_and_neg(dt):
    low = -3 if dt.kind == "i" else 0
    amounts = RNG.integers(low, dt.bitsize + 4, N).astype(storage_np(dt))
    check_against_python([(Ops.SHL, dt), (Ops.SHR, dt), (Ops.NEG, dt)], (dt, dt), [sample(dt), amounts])


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_exact_unary_float_ops(dt):
    skip_unsupported(dt)
    check_against_python([(op, dt) for op in EXACT_UNARY_FLOAT], (dt,), [sample(dt)])


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_transcendental_ops(dt):
    skip_unsupported(dt)
    x = np.nan_to_num(as_values(sample(dt), dt).astype(np.float64), nan=1.0)
    x = np.where(np.isfinite(x), np.clip(x, -100, 100), x)  # sin of huge arguments is ill-conditioned
    base = np.abs(x)
    to_dt = (lambda v: f32_to_bf16(v.astype(np.float32))) if dt == dtypes.bfloat16 else (lambda v: v.astype(
        to_np_dtype(dt)))
    # OpenCL allows a few ulp of error here (float32 exp: 3 ulp, pow: 16 ulp); 16-bit results rounded
    # from slightly different floats may differ by one of their ulp
    ulps = {dtypes.float16: 1.01, dtypes.bfloat16: 1.01}.get(dt, 16.0)
    check_against_python([(op, dt) for op in TRANSCENDENTAL], (dt,), [to_dt(x)], ulps)
    check_against_python([(Ops.POW, dt)], (dt, dt), [to_dt(base), to_dt(x / 10)], ulps)


def test_where():
    dts = (dtypes.bool, dtypes.float32, dtypes.float32)
    check_against_python([(Ops.WHERE, dtypes.float32)], dts,
                         [sample(dtypes.bool), sample(dtypes.float32), sample(dtypes.float32)])


@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_casts(src):
    skip_unsupported(src)
    check_against_python([(Ops.CAST, dst) for dst in ALL if cl_supports(dst) and dst != src], (src,), [sample(src)])


@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_bitcasts(src):
    skip_unsupported(src)
    targets = [dst for dst in ALL if dst.itemsize == src.itemsize and dst != src and cl_supports(dst)]
    values = sample(src).copy()
    if src.kind == "f":  # nan payloads need not survive: bitcast only non-nan patterns
        values[np.isnan(as_values(values, src))] = 0
    if src.itemsize == 1:  # a bool holds only 0 or 1
        values = (values.view(np.uint8) & 1).view(storage_np(src))
    uops = multi_program([(Ops.BITCAST, dst) for dst in targets], (src,))
    got, want = run_program("CL", uops, targets, [values]), run_program("PYTHON", uops, targets, [values])
    for dst, g, w in zip(targets, got, want):
        if dst.kind == "f":  # a pattern that is a nan: both are nan, the payload may differ
            both_nan = np.isnan(as_values(g, dst)) & np.isnan(as_values(w, dst))
            g, w = g[~both_nan], w[~both_nan]
        np.testing.assert_array_equal(g, w, err_msg=f"BITCAST {src.name} -> {dst.name}")


# --------------------------------------------------------------------------------------------
# the rendered source
# --------------------------------------------------------------------------------------------

def test_global_ranges_become_global_ids_innermost_first():
    from ember_opencl.renderer import CLRenderer

    idx = dtypes.int32
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(), (), (0, 24))
    ranges = [UOp(Ops.RANGE, idx, (UOp.const(idx, 0), UOp.const(idx, s)), (i, "global"))
              for i, s in enumerate((2, 3, 4))]
    index = (ranges[0] * UOp.const(idx, 12)) + (ranges[1] * UOp.const(idx, 4)) + ranges[2]
    value = ranges[0] * UOp.const(idx, 100) + ranges[1] * UOp.const(idx, 10) + ranges[2]
    body = _topo([index, value])
    consts = [u for u in body if u.op is Ops.CONST] + [c for r in ranges for c in r.src]
    uops = [out, *dict.fromkeys(consts), *ranges]
    body = [u for u in body if u.op is not Ops.CONST]
    uops += body + [UOp(Ops.STORE, None, (out, index, value))]
    uops += [UOp(Ops.ENDRANGE, None, (r,)) for r in reversed(ranges)] + [UOp(Ops.SINK, None, ())]
    src = CLRenderer().render("grid", uops)
    assert "gidx0 = (int)get_global_id(2)" in src and "gidx2 = (int)get_global_id(0)" in src
    assert "for (" not in src and src.count("{") == src.count("}")
    (got,) = run_program("CL", uops, [dtypes.int32], [], n=24, global_size=(4, 3, 2))
    want = np.array([i * 100 + j * 10 + k for i in range(2) for j in range(3) for k in range(4)], np.int32)
    np.testing.assert_array_equal(got, want)


def _topo(roots: list[UOp]) -> list[UOp]:
    seen: dict[UOp, None] = {}

    def visit(u: UOp) -> None:
        if u in seen:
            return
        for s in u.src:
            visit(s)
        seen[u] = None

    for r in roots:
        visit(r)
    return [u for u in seen if u.op is not Ops.RANGE]


def test_unused_buffers_keep_their_parameter_position():
    idx = dtypes.int32
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), (0, N))
    b2 = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), (2, N))  # buffer 1 is never read
    start, end = UOp.const(idx, 0), UOp.const(idx, N)
    rng = UOp(Ops.RANGE, idx, (start, end), (0, "global"))
    load = UOp(Ops.LOAD, dtypes.float32, (b2, rng))
    uops = [b2, out, start, end, rng, load, UOp(Ops.STORE, None, (out, rng, load)), UOp(Ops.ENDRANGE, None, (rng,)),
            UOp(Ops.SINK, None, ())]
    a = sample(dtypes.float32)
    (got,) = run_program("CL", uops, [dtypes.float32], [np.zeros(N, np.float32), a])
    np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_store_of_a_constant_and_copy_alone(dt):
    """Kernels that only store (or only load and store) a 16-bit float still get their helper functions."""
    skip_unsupported(dt)
    idx = dtypes.int32
    out, copy_out = UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (0, N)), UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (1, N))
    inp = UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (2, N))
    start, end, value = UOp.const(idx, 0), UOp.const(idx, N), UOp.const(dt, 1.5)
    rng = UOp(Ops.RANGE, idx, (start, end), (0, "global"))
    load = UOp(Ops.LOAD, dt, (inp, rng))
    uops = [out, copy_out, inp, start, end, value, rng, UOp(Ops.STORE, None, (out, rng, value)), load,
            UOp(Ops.STORE, None, (copy_out, rng, load)), UOp(Ops.ENDRANGE, None, (rng,)), UOp(Ops.SINK, None, ())]
    a = sample(dt)
    got, want = run_program("CL", uops, [dt, dt], [a]), run_program("PYTHON", uops, [dt, dt], [a])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_source_is_opencl_c():
    from ember_opencl.renderer import CLRenderer

    uops = elementwise_program(Ops.BITCAST, dtypes.int32, (dtypes.float32,))
    src = CLRenderer().render("k", uops)
    assert src.startswith("__kernel void k(__global int* restrict data0, __global float* restrict data1)")
    assert "as_int(" in src and "__builtin_memcpy" not in src and "_Bool" not in src
    bools = CLRenderer().render("k", elementwise_program(Ops.CMPLT, dtypes.bool, (dtypes.int32, dtypes.int32)))
    assert "__global uchar* restrict data0" in bools and "bool alu" in bools


def test_without_fp64_no_double_appears_and_float64_is_unsupported():
    from ember_opencl.renderer import CLRenderer

    r = CLRenderer(fp64=False)
    assert dtypes.float64 not in r.supported_dtypes and dtypes.float32 in r.supported_dtypes
    for dst in INTS:
        src = r.render("k", elementwise_program(Ops.CAST, dst, (dtypes.float32,)))
        assert "double" not in src, src
    # and the source builds
    Device["CL"].compiler.compile(r.render("k", elementwise_program(Ops.CAST, dtypes.int64, (dtypes.float32,))))


def test_native_half_source():
    from ember_opencl.renderer import CLRenderer

    src = CLRenderer(fp16=True).render("k", elementwise_program(Ops.EXP, dtypes.float16, (dtypes.float16,)))
    assert src.startswith("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    assert "__global half* restrict data0" in src and "half alu0 = exp(val0);" in src
    emulated = CLRenderer(fp16=False).render("k", elementwise_program(Ops.EXP, dtypes.float16, (dtypes.float16,)))
    assert "cl_khr_fp16" not in emulated and "__global ushort* restrict data0" in emulated
    assert "ember_f16_round(exp(val0))" in emulated


def test_capabilities_come_from_the_device():
    from ember_opencl.renderer import CLRenderer

    r = CLRenderer(fp16=True, fp64=True, global_max=(10, 20, 30), local_max=(4, 5, 6), shared_max=1234, device="CL:3")
    assert (r.global_max, r.local_max, r.shared_max, r.device) == ((10, 20, 30), (4, 5, 6), 1234, "CL:3")
    assert dtypes.float64 in r.supported_dtypes and dtypes.float16 in r.supported_dtypes


# --------------------------------------------------------------------------------------------
# tensor programs against numpy
# --------------------------------------------------------------------------------------------

def test_elementwise_chain():
    a, b = RNG.random(1000, dtype=np.float32), RNG.random(1000, dtype=np.float32)
    ta, tb = Tensor(a, device="CL"), Tensor(b, device="CL")
    got = ((ta * 2 + tb).relu().exp() * tb - ta).numpy()
    np.testing.assert_allclose(got, np.exp(np.maximum(a * 2 + b, 0)) * b - a, rtol=1e-6, atol=1e-6)


def test_reductions_and_matmul():
    a = RNG.standard_normal((17, 33)).astype(np.float32)
    b = RNG.standard_normal((33, 9)).astype(np.float32)
    ta, tb = Tensor(a, device="CL"), Tensor(b, device="CL")
    np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ta.max(axis=0).numpy(), a.max(axis=0))
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_more_than_three_output_dims():
    a = RNG.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    t = Tensor(a, device="CL")
    np.testing.assert_array_equal((t.permute(4, 2, 0, 3, 1) * 3).numpy(), a.transpose(4, 2, 0, 3, 1) * 3)


def test_size_zero_and_scalar():
    empty = Tensor(np.zeros((0, 4), np.float32), device="CL")
    assert (empty + 1).numpy().shape == (0, 4)
    assert empty.sum().item() == 0.0
    assert (Tensor(3.5, device="CL") * 2).item() == 7.0


def test_mixed_device_program():
    if Device.probe("CPU") is not None:
        pytest.skip(f"needs the CPU device too: {Device.probe('CPU')}")
    a = RNG.standard_normal((8, 16)).astype(np.float32)
    on_cl = (Tensor(a, device="CL") * 2).exp()
    on_cpu = on_cl.to("CPU") + 1
    assert on_cpu.device == "CPU"
    back = (on_cpu.to("CL") * on_cl).sum(axis=0)
    assert back.device == "CL"
    np.testing.assert_allclose(back.numpy(), ((np.exp(a * 2) + 1) * np.exp(a * 2)).sum(axis=0), rtol=1e-5)


def test_float16_and_bfloat16_arithmetic():
    a = np.array([1.5, -2.25, 1000.0, 3.14159, 65504.0], np.float16)
    t = Tensor(a, device="CL")
    with np.errstate(over="ignore"):  # 65504 * 3 overflows to inf in half precision, on both sides
        want = a * np.float16(3) + np.float16(1)
    np.testing.assert_array_equal((t * 3 + 1).numpy(), want)
    values = np.array([1.5, -2.0, 0.25, 3.0], np.float32)
    tb = Tensor(values, device="CL", dtype="bfloat16")
    np.testing.assert_array_equal((tb + tb).numpy().astype(np.float32), values * 2)


def test_index_type_is_64_bits_only_where_32_could_wrap():
    """A kernel reading the far end of a view of 3.5e9 elements indexes with ``long``, a small one with ``int``;
    the long one gets the right values (in 32 bits its offset wraps and the loads land before the buffer)."""
    from ember_opencl.renderer import CLRenderer

    from ember.codegen import get_program

    def tail(rows: int) -> Tensor:
        x = Tensor(np.arange(7, dtype=np.float32), device="CL")
        return x.reshape(1, 7).expand(rows, 7).reshape(rows * 7)[-3:].contiguous()

    def src(t: Tensor) -> str:
        return get_program([si.ast for si in t.schedule() if si.ast.op is not Ops.COPY][-1], CLRenderer()).src

    big = src(tail(5 * 10 ** 8))
    assert "const long gidx0 = (long)get_global_id(0);" in big and "int alu" not in big
    small = src(tail(1000))
    assert "const int gidx0 = (int)get_global_id(0);" in small and "long alu" not in small
    np.testing.assert_array_equal(tail(5 * 10 ** 8).numpy(), [4, 5, 6])
