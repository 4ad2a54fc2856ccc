"""The PYTHON device: hand-built linear programs checked against numpy and the scalar ALU semantics."""
from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest

from ember.builtin_devices.python import (
    FORMAT,
    PythonAllocator,
    PythonCompiler,
    PythonDevice,
    PythonProgram,
    PythonRenderer,
    decode_program,
    encode_program,
)
from ember.device.compiler import CompileError
from ember.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16, to_np_dtype, truncate
from ember.ir.uop import Ops, UOp, exec_alu

i32 = dtypes.int32
f32 = dtypes.float32


class Prog:
    """Builds a linear program in the order the nodes are created."""

    def __init__(self) -> None:
        self.uops: list[UOp] = []
        self._seen: set[int] = set()

    def add(self, op: Ops, dtype: object = None, src: tuple[UOp, ...] = (), arg: object = None) -> UOp:
        u = UOp(op, dtype, src, arg)
        if id(u) not in self._seen:
            self._seen.add(id(u))
            self.uops.append(u)
        return u

    def buf(self, i: int, dt: DType, size: int) -> UOp:
        return self.add(Ops.DEFINE_GLOBAL, dt.ptr(), (), (i, size))

    def const(self, v: object, dt: DType = i32) -> UOp:
        return self.add(Ops.CONST, dt, (), v)

    def range(self, rid: int, end: int | UOp, kind: str = "global", start: int = 0) -> UOp:
        end_u = end if isinstance(end, UOp) else self.const(end)
        return self.add(Ops.RANGE, i32, (self.const(start), end_u), (rid, kind))

    def end(self, r: UOp) -> UOp:
        return self.add(Ops.ENDRANGE, None, (r,))

    def alu(self, op: Ops, *srcs: UOp, dtype: DType | None = None) -> UOp:
        if dtype is None:
            dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else srcs[-1].dtype
        return self.add(op, dtype, srcs)

    def load(self, buf: UOp, idx: UOp, gate: UOp | None = None) -> UOp:
        return self.add(Ops.LOAD, buf.dtype.base, (buf, idx) if gate is None else (buf, idx, gate))

    def store(self, buf: UOp, idx: UOp, val: UOp, gate: UOp | None = None) -> UOp:
        return self.add(Ops.STORE, None, (buf, idx, val) if gate is None else (buf, idx, val, gate))

    def acc(self, init: UOp, aid: int) -> UOp:
        return self.add(Ops.DEFINE_ACC, init.dtype, (init,), aid)

    def assign(self, acc: UOp, val: UOp) -> UOp:
        return self.add(Ops.ASSIGN, acc.dtype, (acc, val))

    def sink(self) -> list[UOp]:
        self.add(Ops.SINK)
        return self.uops


def run(uops: list[UOp], *arrays: np.ndarray, vals: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Render, compile and run on a PYTHON device; the arrays are copied in and the results copied out."""
    dev = PythonDevice("PYTHON")
    src = dev.renderer.render("k", uops)
    prg = dev.runtime("k", dev.compiler.compile_cached(src))
    bufs = []
    for a in arrays:
        b = dev.allocator.alloc(a.nbytes)
        dev.allocator.copyin(b, memoryview(np.ascontiguousarray(a)).cast("B"))
        bufs.append(b)
    prg(*bufs, vals=vals)
    outs = []
    for a, b in zip(arrays, bufs):
        out = np.empty_like(a)
        dev.allocator.copyout(memoryview(out).cast("B"), b)
        outs.append(out)
    return outs


def elementwise(op: Ops, dt: DType, a: np.ndarray, b: np.ndarray | None = None, out_dt: DType | None = None,
                in_dt: DType | None = None) -> np.ndarray:
    """out[i] = op(a[i], b[i]) over a 1-D global range."""
    in_dt = in_dt or dt
    out_dt = out_dt or (dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt)
    n = len(a)
    p = Prog()
    out = p.buf(0, out_dt, n)
    ga = p.buf(1, in_dt, n)
    gb = p.buf(2, in_dt, n) if b is not None else None
    r = p.range(0, n)
    x = p.load(ga, r)
    if op in (Ops.CAST, Ops.BITCAST):
        v = p.add(op, out_dt, (x,))
    else:
        v = p.alu(op, x, *(() if gb is None else (p.load(gb, r),)), dtype=out_dt)
    p.store(out, r, v)
    p.end(r)
    arrays = [np.zeros(n, to_np_dtype(out_dt)), a] + ([] if b is None else [b])
    return run(p.sink(), *arrays)[0]


# ---------------------------------------------------------------------------------------------


def test_elementwise_add_2d_grid():
    a = np.arange(15, dtype=np.float32).reshape(3, 5) * 0.5
    b = np.linspace(-3, 3, 15, dtype=np.float32).reshape(3, 5)
    p = Prog()
    out, ga, gb = p.buf(0, f32, 15), p.buf(1, f32, 15), p.buf(2, f32, 15)
    r0, r1 = p.range(0, 3), p.range(1, 5)
    idx = p.alu(Ops.ADD, p.alu(Ops.MUL, r0, p.const(5)), r1)
    p.store(out, idx, p.alu(Ops.ADD, p.load(ga, idx), p.load(gb, idx)))
    p.end(r1)
    p.end(r0)
    res = run(p.sink(), np.zeros(15, np.float32), a.ravel(), b.ravel())[0]
    np.testing.assert_array_equal(res.reshape(3, 5), a + b)


def test_transposed_store_broadcasts_over_grid():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    p = Prog()
    out, ga = p.buf(0, i32, 12), p.buf(1, i32, 12)
    r0, r1 = p.range(0, 3), p.range(1, 4)
    src_idx = p.alu(Ops.ADD, p.alu(Ops.MUL, r0, p.const(4)), r1)
    dst_idx = p.alu(Ops.ADD, p.alu(Ops.MUL, r1, p.const(3)), r0)
    p.store(out, dst_idx, p.load(ga, src_idx))
    p.end(r1)
    p.end(r0)
    res = run(p.sink(), np.zeros(12, np.int32), a.ravel())[0]
    np.testing.assert_array_equal(res.reshape(4, 3), a.T)


def _reduce_program(n: int, m: int, op: Ops, init: float) -> list[UOp]:
    p = Prog()
    out, ga = p.buf(0, f32, n), p.buf(1, f32, n * m)
    r0 = p.range(0, n)
    acc = p.acc(p.const(init, f32), 0)
    r1 = p.range(1, m, "reduce")
    x = p.load(ga, p.alu(Ops.ADD, p.alu(Ops.MUL, r0, p.const(m)), r1))
    p.assign(acc, p.alu(op, acc, x))
    p.end(r1)
    p.store(out, r0, acc)
    p.end(r0)
    return p.sink()


def test_reduce_sum_over_axis():
    a = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    res = run(_reduce_program(4, 6, Ops.ADD, 0.0), np.zeros(4, np.float32), a.ravel())[0]
    # the loop adds in order, in float32
    expected = np.zeros(4, np.float32)
    for k in range(6):
        expected = expected + a[:, k]
    np.testing.assert_array_equal(res, expected)


def test_reduce_max_propagates_nan():
    a = np.array([[1, 5, 2], [np.nan, 1, 2], [3, np.nan, 1], [-np.inf, -np.inf, -np.inf]], np.float32)
    res = run(_reduce_program(4, 3, Ops.MAX, -math.inf), np.zeros(4, np.float32), a.ravel())[0]
    np.testing.assert_array_equal(res, np.array([5, np.nan, np.nan, -np.inf], np.float32))


def test_reads_of_assign_see_the_accumulator():
    # users may reference the ASSIGN node instead of the DEFINE_ACC: both name the same variable
    p = Prog()
    out, ga = p.buf(0, f32, 1), p.buf(1, f32, 5)
    acc = p.acc(p.const(1.0, f32), 0)
    r = p.range(0, 5, "reduce")
    last = p.assign(acc, p.alu(Ops.MUL, acc, p.load(ga, r)))
    p.end(r)
    p.store(out, p.const(0), last)
    a = np.array([1, 2, 3, 4, 5], np.float32)
    assert run(p.sink(), np.zeros(1, np.float32), a)[0][0] == 120.0


def test_gated_load_padding_never_reads_out_of_bounds():
    n, pad = 5, 2
    a = np.arange(1, n + 1, dtype=np.float32)
    p = Prog()
    out, ga = p.buf(0, f32, n + 2 * pad), p.buf(1, f32, n)
    r = p.range(0, n + 2 * pad)
    src = p.alu(Ops.SUB, r, p.const(pad))
    valid = p.alu(Ops.AND, p.alu(Ops.CMPLT, p.const(pad - 1), r), p.alu(Ops.CMPLT, r, p.const(n + pad)))
    p.store(out, r, p.load(ga, src, valid))
    p.end(r)
    res = run(p.sink(), np.full(n + 2 * pad, 9, np.float32), a)[0]
    np.testing.assert_array_equal(res, np.pad(a, pad))


def test_gated_load_from_empty_buffer():
    p = Prog()
    out, ga = p.buf(0, f32, 3), p.buf(1, f32, 0)
    r = p.range(0, 3)
    p.store(out, r, p.load(ga, r, p.const(False, dtypes.bool)))
    p.end(r)
    res = run(p.sink(), np.full(3, 7, np.float32), np.zeros(0, np.float32))[0]
    np.testing.assert_array_equal(res, np.zeros(3, np.float32))


@pytest.mark.parametrize("offset", [-1, 1])
def test_ungated_out_of_bounds_load_raises(offset: int):
    p = Prog()
    out, ga = p.buf(0, f32, 4), p.buf(1, f32, 4)
    r = p.range(0, 4)
    p.store(out, r, p.load(ga, p.alu(Ops.ADD, r, p.const(offset))))
    p.end(r)
    with pytest.raises(IndexError, match="outside buffer"):
        run(p.sink(), np.zeros(4, np.float32), np.zeros(4, np.float32))


def test_out_of_bounds_store_raises():
    p = Prog()
    out = p.buf(0, f32, 4)
    r = p.range(0, 5)
    p.store(out, r, p.const(1.0, f32))
    p.end(r)
    with pytest.raises(IndexError, match="STORE"):
        run(p.sink(), np.zeros(4, np.float32))


def test_gated_store_writes_only_where_gate_is_true():
    n = 7
    p = Prog()
    out = p.buf(0, i32, n)
    r = p.range(0, n)
    even = p.alu(Ops.CMPEQ, p.alu(Ops.MOD, r, p.const(2)), p.const(0))
    p.store(out, r, p.alu(Ops.MUL, r, p.const(10)), even)
    # a gated store whose index would be out of bounds where the gate is false
    p.store(out, p.alu(Ops.ADD, r, p.const(n)), p.const(-5), p.const(False, dtypes.bool))
    p.end(r)
    res = run(p.sink(), np.full(n, -1, np.int32))[0]
    np.testing.assert_array_equal(res, np.where(np.arange(n) % 2 == 0, np.arange(n) * 10, -1))


def test_int32_overflow_wraps():
    a = np.array([2**31 - 1, -(2**31), 65536, 123456789, -7], np.int32)
    b = np.array([1, -1, 65536, 987654321, 3], np.int32)
    np.testing.assert_array_equal(elementwise(Ops.ADD, i32, a, b), (a.astype(np.int64) + b).astype(np.int32))
    np.testing.assert_array_equal(elementwise(Ops.SUB, i32, a, b), (a.astype(np.int64) - b).astype(np.int32))
    np.testing.assert_array_equal(elementwise(Ops.MUL, i32, a, b), (a.astype(np.int64) * b).astype(np.int32))
    np.testing.assert_array_equal(elementwise(Ops.NEG, i32, a), (-a.astype(np.int64)).astype(np.int32))


def test_uint8_wraps():
    a = np.array([250, 3, 0, 128], np.uint8)
    b = np.array([10, 5, 1, 128], np.uint8)
    np.testing.assert_array_equal(elementwise(Ops.ADD, dtypes.uint8, a, b), np.array([4, 8, 1, 0], np.uint8))
    np.testing.assert_array_equal(elementwise(Ops.SUB, dtypes.uint8, a, b), np.array([240, 254, 255, 0], np.uint8))


def test_idiv_mod_c_semantics():
    a = np.array([7, -7, 7, -7, 0, 5, -(2**31), -(2**31), 2**31 - 1, 1], np.int32)
    b = np.array([2, 2, -2, -2, 3, 0, -1, 1, -1, 0], np.int32)
    q = elementwise(Ops.IDIV, i32, a, b)
    r = elementwise(Ops.MOD, i32, a, b)
    np.testing.assert_array_equal(q, [3, -3, -3, 3, 0, 0, -(2**31), -(2**31), -(2**31) + 1, 0])
    np.testing.assert_array_equal(r, [1, -1, 1, -1, 0, 0, 0, 0, 0, 0])
    for x, y, qq, rr in zip(a, b, q, r):
        assert exec_alu(Ops.IDIV, i32, (int(x), int(y))) == qq
        assert exec_alu(Ops.MOD, i32, (int(x), int(y))) == rr


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64,
                                dtypes.uint64])
@pytest.mark.parametrize("op", [Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR,
                                Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ])
def test_int_binary_ops_match_scalar_semantics(dt: DType, op: Ops):
    rng = np.random.default_rng(zlib.crc32(f"{dt.name} {op.name}".encode()))
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    edge = [lo, hi, 0, 1, -1 if lo < 0 else 2, 3]
    vals = edge + [int(v) for v in rng.integers(lo, hi, 20, dtype=np.int64 if dt != dtypes.uint64 else np.uint64,
                                                endpoint=True)]
    pairs = list(itertools.product(vals[:6], vals[:6])) + list(zip(vals, reversed(vals)))
    a = np.array([x for x, _ in pairs], to_np_dtype(dt))
    b = np.array([y for _, y in pairs], to_np_dtype(dt))
    res = elementwise(op, dt, a, b)
    out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
    expected = [exec_alu(op, out_dt, (int(x), int(y))) for x, y in zip(a, b)]
    np.testing.assert_array_equal(res, np.array(expected, to_np_dtype(out_dt)))


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64])
@pytest.mark.parametrize("op", [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.SQRT, Ops.NEG, Ops.CMPLT, Ops.CMPNE,
                                Ops.TRUNC])
def test_float_ops_match_scalar_semantics(dt: DType, op: Ops):
    # these ops are correctly rounded, so the device and the scalar folding must agree exactly
    rng = np.random.default_rng(zlib.crc32(f"{dt.name} {op.name}".encode()))
    special = [0.0, -0.0, 1.0, -1.5, math.inf, -math.inf, math.nan, 3.0, 1e-3, 65504.0]
    randoms = np.concatenate([rng.standard_normal(30) * 50, rng.standard_normal(10) * 1e-4])
    vals = special + [float(v) for v in randoms]
    unary = op in (Ops.SQRT, Ops.NEG, Ops.TRUNC)
    if unary:
        pairs = [(x, 0.0) for x in vals]
    else:
        pairs = list(itertools.product(special, special)) + list(zip(vals, vals[::-1]))
    with np.errstate(over="ignore"):
        xs = [truncate(dt, x) for x, _ in pairs]
        ys = [truncate(dt, y) for _, y in pairs]

    def to_buf(v: list[float]) -> np.ndarray:
        return f32_to_bf16(np.array(v, np.float32)) if dt == dtypes.bfloat16 else np.array(v, to_np_dtype(dt))

    res = elementwise(op, dt, to_buf(xs), None if unary else to_buf(ys))
    if dt == dtypes.bfloat16 and op not in (Ops.CMPLT, Ops.CMPNE):
        res = bf16_to_f32(res)
    out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dt
    with np.errstate(over="ignore"):
        expected = [exec_alu(op, out_dt, (x,) if unary else (x, y)) for x, y in zip(xs, ys)]
    np.testing.assert_array_equal(res.astype(np.float64) if out_dt != dtypes.bool else res, np.array(expected))


def test_shifts():
    a = np.array([1, -8, -8, 3, 1, -1], np.int32)
    b = np.array([4, 1, 31, 0, 32, -1], np.int32)
    np.testing.assert_array_equal(elementwise(Ops.SHL, i32, a, b), [16, -16, 0, 3, 0, 0])
    np.testing.assert_array_equal(elementwise(Ops.SHR, i32, a, b), [0, -4, -1, 3, 0, -1])
    u = np.array([0x80000000, 0xFFFFFFFF, 1], np.uint32)
    s = np.array([31, 4, 40], np.uint32)
    np.testing.assert_array_equal(elementwise(Ops.SHR, dtypes.uint32, u, s), [1, 0x0FFFFFFF, 0])
    np.testing.assert_array_equal(elementwise(Ops.SHL, dtypes.uint32, u, s), [0, 0xFFFFFFF0, 0])


def test_max_and_comparisons_with_nan_and_signed_zero():
    a = np.array([1, np.nan, 2, np.nan, 0.0, -0.0, -np.inf], np.float32)
    b = np.array([2, 1, np.nan, np.nan, -0.0, 0.0, 5], np.float32)
    m = elementwise(Ops.MAX, f32, a, b)
    np.testing.assert_array_equal(m, [2, np.nan, np.nan, np.nan, 0, 0, 5])
    # on a tie the second operand wins: MAX(0.0, -0.0) is -0.0 and MAX(-0.0, 0.0) is 0.0
    assert np.signbit(m[4]) and not np.signbit(m[5])
    np.testing.assert_array_equal(elementwise(Ops.CMPLT, f32, a, b), a < b)
    np.testing.assert_array_equal(elementwise(Ops.CMPNE, f32, a, b), a != b)
    np.testing.assert_array_equal(elementwise(Ops.CMPEQ, f32, a, b), a == b)


def test_float_unary_ops_match_numpy():
    a = np.array([0.0, -0.0, 1.0, 2.5, -3.0, np.inf, -np.inf, np.nan, 1e-40, 88.0, 100.0], np.float32)
    with np.errstate(all="ignore"):
        cases = {Ops.EXP: np.exp(a), Ops.LOG: np.log(a), Ops.EXP2: np.exp2(a), Ops.LOG2: np.log2(a),
                 Ops.SQRT: np.sqrt(a), Ops.SIN: np.sin(a), Ops.RECIP: np.float32(1) / a, Ops.NEG: -a,
                 Ops.TRUNC: np.trunc(a)}
    for op, expected in cases.items():
        np.testing.assert_array_equal(elementwise(op, f32, a), expected, err_msg=op.name)


def test_float_binary_ops_match_numpy():
    a = np.array([1.0, -7.5, 0.0, np.inf, 2.0, -0.0, 7.0], np.float32)
    b = np.array([3.0, 2.0, 0.0, 2.0, 0.5, 1.0, -2.0], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(elementwise(Ops.FDIV, f32, a, b), a / b)
        np.testing.assert_array_equal(elementwise(Ops.POW, f32, a, b), np.power(a, b))
        np.testing.assert_array_equal(elementwise(Ops.MOD, f32, a, b), np.fmod(a, b))
        np.testing.assert_array_equal(elementwise(Ops.IDIV, f32, a, b), np.trunc(a / b))


def test_where_and_bool_ops():
    n = 6
    p = Prog()
    out, ga = p.buf(0, f32, n), p.buf(1, f32, n)
    r = p.range(0, n)
    x = p.load(ga, r)
    pos = p.alu(Ops.CMPLT, p.const(0.0, f32), x)
    small = p.alu(Ops.CMPLT, x, p.const(2.0, f32))
    both = p.alu(Ops.AND, pos, small)
    either = p.alu(Ops.XOR, pos, small)
    v = p.alu(Ops.WHERE, both, x, p.alu(Ops.WHERE, either, p.const(-1.0, f32), p.const(-2.0, f32)))
    p.store(out, r, v)
    p.end(r)
    a = np.array([-1, 0.5, 1.5, 3, 0, np.nan], np.float32)
    res = run(p.sink(), np.zeros(n, np.float32), a)[0]
    pos_, small_ = 0 < a, a < 2
    np.testing.assert_array_equal(res, np.where(pos_ & small_, a, np.where(pos_ ^ small_, -1, -2)))


def test_neg_of_bool_is_logical_not():
    a = np.array([True, False])
    np.testing.assert_array_equal(elementwise(Ops.NEG, dtypes.bool, a), [False, True])
    np.testing.assert_array_equal(elementwise(Ops.ADD, dtypes.bool, a, a[::-1].copy()), [True, True])
    np.testing.assert_array_equal(elementwise(Ops.MUL, dtypes.bool, a, a[::-1].copy()), [False, False])


def test_cast_float_to_int_truncates_and_zeroes_out_of_range():
    a = np.array([1.7, -1.7, -0.5, 0.99, np.nan, np.inf, -np.inf, 3e9, -3e9, 2147483520.0, -2147483648.0], np.float32)
    res = elementwise(Ops.CAST, f32, a, out_dt=i32)
    np.testing.assert_array_equal(res, [1, -1, 0, 0, 0, 0, 0, 0, 0, 2147483520, -2147483648])
    u = np.array([-1.0, -0.9, 255.9, 256.0, 3.5, np.nan], np.float32)
    np.testing.assert_array_equal(elementwise(Ops.CAST, f32, u, out_dt=dtypes.uint8), [0, 0, 255, 0, 3, 0])
    big = np.array([2.0**63, -(2.0**63), 1.5e19, 2.0**64, -1.0], np.float64)
    np.testing.assert_array_equal(elementwise(Ops.CAST, dtypes.float64, big, out_dt=dtypes.int64),
                                  [0, -(2**63), 0, 0, -1])
    np.testing.assert_array_equal(elementwise(Ops.CAST, dtypes.float64, big, out_dt=dtypes.uint64),
                                  np.array([2**63, 0, 15000000000000000000, 0, 0], np.uint64))


def test_casts_to_and_from_bool_and_between_ints():
    a = np.array([0.0, -0.0, np.nan, 0.1, -3.0], np.float32)
    np.testing.assert_array_equal(elementwise(Ops.CAST, f32, a, out_dt=dtypes.bool), [False, False, True, True, True])
    ints = np.array([0, 256, -1, 7], np.int32)
    np.testing.assert_array_equal(elementwise(Ops.CAST, i32, ints, out_dt=dtypes.bool), [False, True, True, True])
    np.testing.assert_array_equal(elementwise(Ops.CAST, i32, ints, out_dt=dtypes.uint8), [0, 0, 255, 7])
    bools = np.array([True, False])
    np.testing.assert_array_equal(elementwise(Ops.CAST, dtypes.bool, bools, out_dt=f32), [1.0, 0.0])
    np.testing.assert_array_equal(elementwise(Ops.CAST, dtypes.bool, bools, out_dt=i32), [1, 0])
    np.testing.assert_array_equal(elementwise(Ops.CAST, i32, np.array([16777217, -5], np.int32), out_dt=f32),
                                  np.array([16777216.0, -5.0], np.float32))


def test_bitcast():
    a = np.array([1.0, -2.5, np.inf, -0.0], np.float32)
    np.testing.assert_array_equal(elementwise(Ops.BITCAST, f32, a, out_dt=i32), a.view(np.int32))
    ints = a.view(np.int32).copy()
    np.testing.assert_array_equal(elementwise(Ops.BITCAST, i32, ints, out_dt=f32).view(np.int32), ints)
    bits = np.array([0x3F80, 0xFFC1, 0x8000, 0x7F80], np.uint16)
    # uint16 -> bfloat16 -> (stored) keeps every bit, NaN payloads included
    np.testing.assert_array_equal(elementwise(Ops.BITCAST, dtypes.uint16, bits, out_dt=dtypes.bfloat16), bits)
    np.testing.assert_array_equal(elementwise(Ops.BITCAST, dtypes.bfloat16, bits, out_dt=dtypes.int16),
                                  bits.view(np.int16))


def test_bfloat16_load_compute_store():
    rng = np.random.default_rng(1)
    a32 = rng.standard_normal(64).astype(np.float32) * 10
    b32 = rng.standard_normal(64).astype(np.float32)
    a, b = f32_to_bf16(a32), f32_to_bf16(b32)
    bf = dtypes.bfloat16
    res = elementwise(Ops.MUL, bf, a, b)
    expected = f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b))
    np.testing.assert_array_equal(res, expected)
    res = elementwise(Ops.ADD, bf, a, b)
    np.testing.assert_array_equal(res, f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b)))


def test_bfloat16_casts_round_to_nearest_even():
    one = 1.0
    x = np.array([one + 2**-8, one + 3 * 2**-8, one + 2**-8 + 2**-20, -(one + 2**-8), 3.4e38, np.nan, -0.0],
                 np.float32)
    res = elementwise(Ops.CAST, f32, x, out_dt=dtypes.bfloat16)
    np.testing.assert_array_equal(res, f32_to_bf16(x))
    back = elementwise(Ops.CAST, dtypes.bfloat16, res, out_dt=f32)
    np.testing.assert_array_equal(back, bf16_to_f32(res))
    # float64 -> bfloat16 rounds once: 1 + 2**-8 + 2**-40 is just above the tie, so it rounds up
    d = np.array([1 + 2**-8 + 2**-40, 1 + 2**-8, 2.0**200], np.float64)
    res64 = elementwise(Ops.CAST, dtypes.float64, d, out_dt=dtypes.bfloat16)
    np.testing.assert_array_equal(bf16_to_f32(res64), np.array([1 + 2**-7, 1.0, np.inf], np.float32))
    ints = np.array([257, 259, -65535], np.int32)
    res_i = elementwise(Ops.CAST, i32, ints, out_dt=dtypes.bfloat16)
    np.testing.assert_array_equal(bf16_to_f32(res_i), np.array([256, 260, -65536], np.float32))


def test_bfloat16_buffer_with_float32_values():
    # a LOAD of float32 from a bfloat16 buffer widens; a STORE of float32 into it rounds to nearest even
    bf = dtypes.bfloat16
    p = Prog()
    out, ga = p.buf(0, bf, 3), p.buf(1, bf, 3)
    r = p.range(0, 3)
    x = p.add(Ops.LOAD, f32, (ga, r))
    p.store(out, r, p.alu(Ops.ADD, x, p.const(2**-8, f32)))
    p.end(r)
    a = f32_to_bf16(np.array([1.0, 1.0 + 2**-7, -2.0], np.float32))
    res = run(p.sink(), np.zeros(3, np.uint16), a)[0]
    np.testing.assert_array_equal(res, f32_to_bf16(bf16_to_f32(a) + np.float32(2**-8)))
    np.testing.assert_array_equal(bf16_to_f32(res), [1.0, 1.0 + 2**-6, -2.0])


def test_float16_rounds_every_op():
    rng = np.random.default_rng(2)
    a = (rng.standard_normal(64) * 100).astype(np.float16)
    b = rng.standard_normal(64).astype(np.float16)
    h = dtypes.float16
    np.testing.assert_array_equal(elementwise(Ops.MUL, h, a, b), a * b)
    np.testing.assert_array_equal(elementwise(Ops.ADD, h, a, b), a + b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(elementwise(Ops.FDIV, h, a, b), a / b)
    x = np.array([65504.0, 65520.0, 1 + 2**-11, 1e-8, -3.14159], np.float32)
    res = elementwise(Ops.CAST, f32, x, out_dt=h)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(res, x.astype(np.float16))
    np.testing.assert_array_equal(elementwise(Ops.CAST, h, res, out_dt=f32), res.astype(np.float32))


def test_float16_accumulator_rounds_each_step():
    a = np.full(3000, 1.0, np.float16)
    p = Prog()
    h = dtypes.float16
    out, ga = p.buf(0, h, 1), p.buf(1, h, 3000)
    acc = p.acc(p.const(0.0, h), 0)
    r = p.range(0, 3000, "reduce")
    p.assign(acc, p.alu(Ops.ADD, acc, p.load(ga, r)))
    p.end(r)
    p.store(out, p.const(0), acc)
    # in float16, 2048 + 1 rounds back to 2048
    assert run(p.sink(), np.zeros(1, np.float16), a)[0][0] == 2048.0


def test_define_var():
    p = Prog()
    out, ga = p.buf(0, i32, 8), p.buf(1, i32, 8)
    n = p.add(Ops.DEFINE_VAR, i32, (), ("n", 0, 8))
    k = p.add(Ops.DEFINE_VAR, i32, (), ("k", -100, 100))
    r = p.range(0, n)
    p.store(out, r, p.alu(Ops.ADD, p.load(ga, r), k))
    p.end(r)
    uops = p.sink()
    a = np.arange(8, dtype=np.int32)
    res = run(uops, np.zeros(8, np.int32), a, vals=(5, -10))[0]
    np.testing.assert_array_equal(res, [-10, -9, -8, -7, -6, 0, 0, 0])
    with pytest.raises(ValueError, match="expected 2 vals"):
        run(uops, np.zeros(8, np.int32), a, vals=(5,))
    with pytest.raises(ValueError, match="outside"):
        run(uops, np.zeros(8, np.int32), a, vals=(9, 0))


def test_define_var_bounds_a_sequential_loop():
    p = Prog()
    out, ga = p.buf(0, i32, 1), p.buf(1, i32, 10)
    n = p.add(Ops.DEFINE_VAR, i32, (), ("n", 0, 10))
    acc = p.acc(p.const(0), 0)
    r = p.range(0, n, "reduce")
    p.assign(acc, p.alu(Ops.ADD, acc, p.load(ga, r)))
    p.end(r)
    p.store(out, p.const(0), acc)
    uops = p.sink()
    a = np.arange(10, dtype=np.int32)
    assert run(uops, np.zeros(1, np.int32), a, vals=(4,))[0][0] == 6
    assert run(uops, np.zeros(1, np.int32), a, vals=(0,))[0][0] == 0


def test_size_zero_global_range_runs_nothing():
    p = Prog()
    out = p.buf(0, f32, 2)
    r = p.range(0, 0)
    p.store(out, p.const(0), p.const(5.0, f32))  # does not depend on r, so only the range size stops it
    p.end(r)
    res = run(p.sink(), np.full(2, 1.0, np.float32))[0]
    np.testing.assert_array_equal(res, [1.0, 1.0])


def test_size_zero_inner_global_range_runs_nothing():
    p = Prog()
    out = p.buf(0, f32, 4)
    r0, r1 = p.range(0, 4), p.range(1, 0)
    p.store(out, r0, p.const(5.0, f32))
    p.end(r1)
    p.end(r0)
    res = run(p.sink(), np.full(4, 1.0, np.float32))[0]
    np.testing.assert_array_equal(res, np.ones(4, np.float32))


def test_size_zero_reduce_keeps_the_initial_value():
    res = run(_reduce_program(3, 0, Ops.ADD, 0.5), np.zeros(3, np.float32), np.zeros(0, np.float32))[0]
    np.testing.assert_array_equal(res, [0.5, 0.5, 0.5])


def test_nested_sequential_loops_reset_accumulator():
    # out[i, j] = sum_k a[i, j, k] with the accumulator declared inside the j loop; tot[i] = sum_j max_k a[i, j, k]
    n, m, kk = 3, 4, 5
    a = np.random.default_rng(3).integers(-50, 50, (n, m, kk)).astype(np.int32)
    p = Prog()
    out, tot, ga = p.buf(0, i32, n * m), p.buf(1, i32, n), p.buf(2, i32, n * m * kk)
    i = p.range(0, n)
    total = p.acc(p.const(0), 1)
    j = p.range(1, m, "loop")
    acc = p.acc(p.const(0), 0)
    mx = p.acc(p.const(-(2**31)), 2)
    k = p.range(2, kk, "reduce")
    idx = p.alu(Ops.ADD, p.alu(Ops.MUL, p.alu(Ops.ADD, p.alu(Ops.MUL, i, p.const(m)), j), p.const(kk)), k)
    x = p.load(ga, idx)
    p.assign(acc, p.alu(Ops.ADD, acc, x))
    p.assign(mx, p.alu(Ops.MAX, mx, x))
    p.end(k)
    p.store(out, p.alu(Ops.ADD, p.alu(Ops.MUL, i, p.const(m)), j), acc)
    p.assign(total, p.alu(Ops.ADD, total, mx))
    p.end(j)
    p.store(tot, i, total)
    p.end(i)
    res, res_tot, _ = run(p.sink(), np.zeros(n * m, np.int32), np.zeros(n, np.int32), a.ravel())
    np.testing.assert_array_equal(res.reshape(n, m), a.sum(axis=2))
    np.testing.assert_array_equal(res_tot, a.max(axis=2).sum(axis=1))


def test_loop_variable_inside_sequential_loop_with_nonzero_start():
    p = Prog()
    out = p.buf(0, i32, 1)
    acc = p.acc(p.const(0), 0)
    r = p.range(0, 7, "loop", start=3)
    p.assign(acc, p.alu(Ops.ADD, acc, r))
    p.end(r)
    p.store(out, p.const(0), acc)
    assert run(p.sink(), np.zeros(1, np.int32))[0][0] == 3 + 4 + 5 + 6


def test_special_is_a_grid_axis_and_barrier_is_accepted():
    p = Prog()
    out = p.buf(0, i32, 6)
    g = p.add(Ops.SPECIAL, i32, (), ("gidx0", 2))
    lid = p.add(Ops.SPECIAL, i32, (), ("lidx0", 3))
    p.add(Ops.BARRIER)
    idx = p.alu(Ops.ADD, p.alu(Ops.MUL, g, p.const(3)), lid)
    p.store(out, idx, p.alu(Ops.MUL, idx, idx))
    res = run(p.sink(), np.zeros(6, np.int32))[0]
    np.testing.assert_array_equal(res, np.arange(6) ** 2)


def test_round_trip_of_special_float_constants():
    f64 = dtypes.float64
    # (0.0 is left out: UOp hash-consing treats 0.0 and -0.0 as the same constant)
    consts = [math.inf, -math.inf, math.nan, -0.0, 1e-310, 0.1, 3.4028234663852886e38]
    p = Prog()
    out32, out64 = p.buf(0, f32, len(consts)), p.buf(1, f64, len(consts))
    for k, v in enumerate(consts):
        p.store(out32, p.const(k), p.const(float(np.float32(v)), f32))
        p.store(out64, p.const(k), p.const(v, f64))
    uops = p.sink()
    src = PythonRenderer().render("consts", uops)
    assert FORMAT in src and "Infinity" not in src and "NaN" not in src
    prg = PythonProgram("consts", PythonCompiler().compile(src))
    r32, r64 = np.zeros(len(consts), np.float32), np.zeros(len(consts), np.float64)
    prg(r32, r64)
    np.testing.assert_array_equal(r64, np.array(consts))
    np.testing.assert_array_equal(np.signbit(r64), np.signbit(np.array(consts)))
    np.testing.assert_array_equal(r32.view(np.uint32)[[0, 1, 3]],
                                  np.array([math.inf, -math.inf, -0.0], np.float32).view(np.uint32))
    assert math.isnan(r32[2])


def test_encode_decode_args_exactly():
    uops = [UOp(Ops.CONST, dtypes.uint64, (), 2**64 - 1), UOp(Ops.CONST, dtypes.bool, (), True),
            UOp(Ops.CONST, dtypes.int32, (), 1), UOp(Ops.DEFINE_VAR, i32, (), ("n", -3, 9)),
            UOp(Ops.CONST, dtypes.float64, (), -0.0)]
    uops.append(UOp(Ops.RANGE, i32, (uops[2], uops[2]), (7, "reduce")))
    uops.append(UOp(Ops.DEFINE_GLOBAL, dtypes.bfloat16.ptr(), (), (0, 12)))
    name, decoded = decode_program(encode_program("k", uops))
    assert name == "k"
    for u, (op, dt, srcs, arg) in zip(uops, decoded):
        assert (op, dt, srcs) == (u.op, u.dtype, tuple(uops.index(s) for s in u.src))
        assert type(arg) is type(u.arg) and repr(arg) == repr(u.arg)


def test_malformed_programs_are_rejected():
    with pytest.raises(ValueError, match="format"):
        PythonProgram("k", b'{"format": "other", "name": "k", "uops": []}')
    with pytest.raises(ValueError, match="not supported"):
        PythonProgram("k", encode_program("k", [UOp(Ops.DEFINE_LOCAL, f32.ptr(), (), 0)]).encode())
    r = UOp(Ops.RANGE, i32, (UOp(Ops.CONST, i32, (), 0), UOp(Ops.CONST, i32, (), 2)), (0, "reduce"))
    with pytest.raises(ValueError, match="without ENDRANGE"):
        PythonProgram("k", encode_program("k", [*r.src, r]).encode())
    with pytest.raises(ValueError, match="before"):
        encode_program("k", [r])
    bad_bitcast = UOp(Ops.BITCAST, dtypes.int16, (UOp(Ops.CONST, f32, (), 1.0),))
    with pytest.raises(CompileError, match="BITCAST between sizes"):
        PythonCompiler().compile(encode_program("k", [bad_bitcast.src[0], bad_bitcast]))
    with pytest.raises(CompileError, match="not defined"):
        PythonCompiler().compile(encode_program("k", [UOp(Ops.CONST, f32, (), 1.0),
                                                      UOp(Ops.XOR, f32, (UOp(Ops.CONST, f32, (), 1.0),) * 2)]))


def test_allocator_views_and_copies():
    alloc = PythonAllocator()
    buf = alloc.alloc(16)
    alloc.copyin(buf, memoryview(np.arange(4, dtype=np.float32)).cast("B"))
    view = alloc.as_buffer(buf)
    assert np.frombuffer(view, np.float32).tolist() == [0, 1, 2, 3]
    sub = alloc.offset(buf, 8, 8)
    alloc.copyin(sub, memoryview(np.array([7, 9], np.float32)).cast("B"))
    assert np.frombuffer(view, np.float32).tolist() == [0, 1, 7, 9]  # zero-copy: the first view sees the write
    out = np.zeros(2, np.float32)
    alloc.copyout(memoryview(out).cast("B"), sub)
    assert out.tolist() == [7, 9]
    with pytest.raises(ValueError):
        alloc.offset(buf, 12, 8)
    alloc.free(buf, 16)


def test_program_on_offset_buffers():
    dev = PythonDevice("PYTHON")
    base = dev.allocator.alloc(32)
    dev.allocator.copyin(base, memoryview(np.arange(8, dtype=np.float32)).cast("B"))
    p = Prog()
    out, ga = p.buf(0, f32, 4), p.buf(1, f32, 4)
    r = p.range(0, 4)
    p.store(out, r, p.alu(Ops.MUL, p.load(ga, r), p.const(2.0, f32)))
    p.end(r)
    prg = dev.runtime("k", dev.compiler.compile(dev.renderer.render("k", p.sink())))
    elapsed = prg(dev.allocator.offset(base, 16, 16), dev.allocator.offset(base, 0, 16), wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    assert np.frombuffer(dev.allocator.as_buffer(base), np.float32).tolist() == [0, 1, 2, 3, 0, 2, 4, 6]


def test_device_wiring():
    dev = PythonDevice("PYTHON")
    assert dev.device == "PYTHON"
    assert isinstance(dev.renderer, PythonRenderer) and isinstance(dev.compiler, PythonCompiler)
    assert isinstance(dev.allocator, PythonAllocator)
    assert dev.runtime is PythonProgram and dev.graph is None
    assert dev.renderer.device == "PYTHON" and not dev.renderer.has_local
    assert dev.compiler.cachekey is None
    dev.synchronize()
