"""Every elementwise op on every dtype, against torch: values, output dtypes and exception types.

Results for one dtype are computed in a single kernel: each result is bitcast to an unsigned
integer of its size, widened to uint64 and placed in its own row, so one compile checks dozens
of ops bit-exactly (the C compiler is the slow part of the CPU device).

Where torch has no kernel for an op on uint16/uint32/uint64 ember still computes a result; those
cases are not compared. Everywhere else, an op torch rejects must raise the same exception type.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import FROM_TORCH, TORCH_DTYPES, dtype_name, packed_numpy

from ember import Tensor, dtypes
from ember.dtype import DType, to_np_dtype

torch = pytest.importorskip("torch")

DTYPES = tuple(dtypes.fields().values())
UNSIGNED_WIDE = (dtypes.uint16, dtypes.uint32, dtypes.uint64)


def to_torch(a: np.ndarray, dt: DType) -> Any:
    return torch.from_numpy(np.array(a)).to(TORCH_DTYPES[dt])


def from_torch(t: Any) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def tolerance(dt: DType) -> dict[str, float]:
    if dt == dtypes.bfloat16:
        return {"rtol": 1.6e-2, "atol": 1e-5}  # two bfloat16 roundings
    if dt == dtypes.float16:
        return {"rtol": 2e-3, "atol": 1e-6}
    if dt == dtypes.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    return {"rtol": 1e-12, "atol": 1e-300}


def values(dt: DType) -> np.ndarray:
    """12 values of ``dt`` with both extremes of integer types and the float specials."""
    if dt == dtypes.bool:
        return np.array([True, False, True, True, False, False, True, False, True, False, False, True])
    if dt.kind in "iu":
        info = np.iinfo(to_np_dtype(dt))
        base = [info.min, info.max, 0, 1, 2, 3, 5, 7, 100, info.max - 1, 9, 4]
        if dt.kind == "i":
            base[6:9] = [-1, -3, -100]
        return np.array(base, dtype=object).astype(to_np_dtype(dt))
    return np.array([-2.5, -1.0, -0.0, 0.0, 0.5, 1.0, 1.5, 2.5, 3.0, 100.0, math.inf, math.nan], np.float64)


def divisors(dt: DType) -> np.ndarray:
    """Values to combine with :func:`values`: no zero for integers (torch raises on integer division by 0)."""
    if dt == dtypes.bool:
        return np.array([True, True, False, True, False, True, True, False, False, True, True, False])
    if dt.kind in "iu":
        base = [3, 7, 2, 1, 5, 3, 2, 9, 3, 4, 2, 6]
        if dt.kind == "i":
            base[1::3] = [-3, -1, -7, -2]
        return np.array(base).astype(to_np_dtype(dt))
    return np.array([1.5, -2.0, 3.0, -0.0, 0.0, 2.0, -1.0, 0.5, math.inf, -3.0, 2.0, 1.0], np.float64)


def make_pair(dt: DType, device: str) -> tuple[Tensor, Tensor, Any, Any]:
    a, b = values(dt), divisors(dt)
    npdt = np.float32 if dt == dtypes.bfloat16 else to_np_dtype(dt)
    return (Tensor(a.astype(npdt), device=device, dtype=dt), Tensor(b.astype(npdt), device=device, dtype=dt),
            to_torch(a, dt), to_torch(b, dt))


# (name, fn) with fn applied to (x, y) for both libraries; ember and torch share the operator spelling
F = torch.nn.functional
UNARY: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = [
    ("neg", lambda x: -x, lambda x: -x),
    ("abs", lambda x: x.abs(), torch.abs),
    ("sign", lambda x: x.sign(), torch.sign),
    ("floor", lambda x: x.floor(), torch.floor),
    ("ceil", lambda x: x.ceil(), torch.ceil),
    ("round", lambda x: x.round(), torch.round),
    ("trunc", lambda x: x.trunc(), torch.trunc),
    ("square", lambda x: x.square(), torch.square),
    ("reciprocal", lambda x: x.reciprocal(), torch.reciprocal),
    ("sqrt", lambda x: x.sqrt(), torch.sqrt),
    ("rsqrt", lambda x: x.rsqrt(), torch.rsqrt),
    ("exp", lambda x: x.exp(), torch.exp),
    ("exp2", lambda x: x.exp2(), torch.exp2),
    ("log", lambda x: x.log(), torch.log),
    ("log2", lambda x: x.log2(), torch.log2),
    ("log10", lambda x: x.log10(), torch.log10),
    ("log1p", lambda x: x.log1p(), torch.log1p),
    ("expm1", lambda x: x.expm1(), torch.expm1),
    ("sin", lambda x: x.sin(), torch.sin),
    ("cos", lambda x: x.cos(), torch.cos),
    ("tan", lambda x: x.tan(), torch.tan),
    ("asin", lambda x: x.asin(), torch.asin),
    ("acos", lambda x: x.acos(), torch.acos),
    ("atan", lambda x: x.atan(), torch.atan),
    ("sinh", lambda x: x.sinh(), torch.sinh),
    ("cosh", lambda x: x.cosh(), torch.cosh),
    ("tanh", lambda x: x.tanh(), torch.tanh),
    ("asinh", lambda x: x.asinh(), torch.asinh),
    ("acosh", lambda x: x.acosh(), torch.acosh),
    ("atanh", lambda x: x.atanh(), torch.atanh),
    ("erf", lambda x: x.erf(), torch.erf),
    ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid),
    ("relu", lambda x: x.relu(), torch.relu),
    ("relu6", lambda x: x.relu6(), F.relu6),
    ("hardtanh", lambda x: x.hardtanh(), F.hardtanh),
    ("leaky_relu", lambda x: x.leaky_relu(), F.leaky_relu),
    ("elu", lambda x: x.elu(), F.elu),
    ("selu", lambda x: x.selu(), F.selu),
    ("celu", lambda x: x.celu(), F.celu),
    ("gelu", lambda x: x.gelu(approximate="none"), F.gelu),
    ("gelu_tanh", lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh")),
    ("silu", lambda x: x.silu(), F.silu),
    ("mish", lambda x: x.mish(), F.mish),
    ("softplus", lambda x: x.softplus(), F.softplus),
    ("softsign", lambda x: x.softsign(), F.softsign),
    ("logsigmoid", lambda x: x.logsigmoid(), F.logsigmoid),
    ("hardsigmoid", lambda x: x.hardsigmoid(), F.hardsigmoid),
    ("hardswish", lambda x: x.hardswish(), F.hardswish),
    ("isnan", lambda x: x.isnan(), torch.isnan),
    ("isinf", lambda x: x.isinf(), torch.isinf),
    ("isfinite", lambda x: x.isfinite(), torch.isfinite),
    ("logical_not", lambda x: x.logical_not(), torch.logical_not),
    ("bitwise_not", lambda x: x.bitwise_not(), torch.bitwise_not),
    ("invert", lambda x: ~x, lambda x: ~x),
    ("clamp_int", lambda x: x.clamp(1, 5), lambda x: x.clamp(1, 5)),
    ("clamp_float", lambda x: x.clamp(0.5, 2.5), lambda x: x.clamp(0.5, 2.5)),
    ("clamp_min", lambda x: x.clip(2), lambda x: x.clip(2)),
    ("pow_2", lambda x: x ** 2, lambda x: x ** 2),
    ("pow_3", lambda x: x ** 3, lambda x: x ** 3),
    ("pow_half", lambda x: x ** 0.5, lambda x: x ** 0.5),
    ("pow_float", lambda x: x ** 1.7, lambda x: x ** 1.7),
    ("pow_neg_int", lambda x: x ** -1, lambda x: x ** -1),
    ("rpow", lambda x: 2 ** x, lambda x: 2 ** x),
    ("floordiv_2", lambda x: x // 2, lambda x: x // 2),
    ("floordiv_neg", lambda x: x // -3, lambda x: x // -3),
    ("mod_2", lambda x: x % 2, lambda x: x % 2),
    ("mod_neg", lambda x: x % -3, lambda x: x % -3),
    ("div_2", lambda x: x / 2, lambda x: x / 2),
    ("add_1", lambda x: x + 1, lambda x: x + 1),
    ("add_float", lambda x: x + 1.5, lambda x: x + 1.5),
    ("rsub_1", lambda x: 1 - x, lambda x: 1 - x),
    ("mul_3", lambda x: x * 3, lambda x: x * 3),
    ("and_1", lambda x: x & 1, lambda x: x & 1),
    ("or_true", lambda x: x | True, lambda x: x | True),
    ("xor_5", lambda x: x ^ 5, lambda x: x ^ 5),
    ("shl_1", lambda x: x << 1, lambda x: x << 1),
    ("shr_1", lambda x: x >> 1, lambda x: x >> 1),
    ("rshl", lambda x: 1 << x.clip(0, 6), lambda x: 1 << x.clip(0, 6)),
    ("eq_2", lambda x: x == 2, lambda x: x == 2),
    ("lt_float", lambda x: x < 2.5, lambda x: x < 2.5),
    ("ge_1", lambda x: x >= 1, lambda x: x >= 1),
    ("where_0", lambda x: (x > 1).where(x, 0), lambda x: torch.where(x > 1, x, 0)),
    ("where_float", lambda x: (x > 1).where(x, 0.5), lambda x: torch.where(x > 1, x, 0.5)),
    ("trunc_div", lambda x: x.div(3, rounding_mode="trunc"), lambda x: x.div(3, rounding_mode="trunc")),
    ("floor_div", lambda x: x.div(-3, rounding_mode="floor"), lambda x: x.div(-3, rounding_mode="floor")),
]

BINARY: list[tuple[str, Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = [
    ("add", lambda x, y: x + y, torch.add),
    ("sub", lambda x, y: x - y, torch.sub),
    ("mul", lambda x, y: x * y, torch.mul),
    ("div", lambda x, y: x / y, torch.div),
    ("floordiv", lambda x, y: x // y, torch.floor_divide),
    ("mod", lambda x, y: x % y, torch.remainder),
    ("trunc_div", lambda x, y: x.div(y, rounding_mode="trunc"), lambda x, y: x.div(y, rounding_mode="trunc")),
    ("pow", lambda x, y: x ** y, torch.pow),
    ("maximum", lambda x, y: x.maximum(y), torch.maximum),
    ("minimum", lambda x, y: x.minimum(y), torch.minimum),
    ("lt", lambda x, y: x < y, torch.lt),
    ("le", lambda x, y: x <= y, torch.le),
    ("gt", lambda x, y: x > y, torch.gt),
    ("ge", lambda x, y: x >= y, torch.ge),
    ("eq", lambda x, y: x == y, torch.eq),
    ("ne", lambda x, y: x != y, torch.ne),
    ("and", lambda x, y: x & y, torch.bitwise_and),
    ("or", lambda x, y: x | y, torch.bitwise_or),
    ("xor", lambda x, y: x ^ y, torch.bitwise_xor),
    ("lshift", lambda x, y: x << (y & 3), lambda x, y: x << (y & 3)),
    ("rshift", lambda x, y: x >> (y & 7), lambda x, y: x >> (y & 7)),
    ("logical_and", lambda x, y: x.logical_and(y), torch.logical_and),
    ("logical_or", lambda x, y: x.logical_or(y), torch.logical_or),
    ("logical_xor", lambda x, y: x.logical_xor(y), torch.logical_xor),
    ("where", lambda x, y: (x > y).where(x, y), lambda x, y: torch.where(x > y, x, y)),
    ("clamp_t", lambda x, y: x.clamp(y, None), lambda x, y: x.clamp(y, None)),
    ("lerp", lambda x, y: x.lerp(y, 0.25), lambda x, y: torch.lerp(x, y, 0.25)),
    ("lerp_t", lambda x, y: x.lerp(y, y), lambda x, y: torch.lerp(x, y, y)),
]


#: float math on integer inputs converts to float32 first; its values are checked for these integer dtypes,
#: for the other ones only the result dtype (and the exception type where torch raises)
FLOAT_MATH = {"reciprocal", "sqrt", "rsqrt", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sin", "cos",
              "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "sigmoid",
              "softsign", "pow_half", "pow_float", "div_2", "add_float", "clamp_float", "where_float"}
VALUE_CHECKED = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int64, *(d for d in DTYPES if d.kind == "f"))

#: ops tested on their own for these dtype kinds (integer ``**`` integer tensor: test_elementwise.py)
SEPARATE = {"pow": "iu"}

#: inputs where ember's result differs from torch's on purpose
DEVIATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": lambda a: a.astype(np.float64) == math.inf,  # torch's exact gelu gives nan at +inf, ember +inf
}


def compare(name: str, dt: DType, got: Tensor, got_np: np.ndarray, want: Any) -> None:
    if dt == dtypes.bool and want.dtype == torch.int64 and got.dtype == dtypes.default_int:
        want = want.int()  # a bool tensor with a Python int gives the default int, int32 as in tinygrad
    want_dt = FROM_TORCH[want.dtype]
    assert got.dtype == want_dt, f"{name} on {dtype_name(dt)}: dtype {got.dtype} != torch's {want_dt}"
    assert got.shape == tuple(want.shape), f"{name} on {dtype_name(dt)}: shape {got.shape} != {tuple(want.shape)}"
    w = from_torch(want)
    if want_dt.kind in "biu":
        np.testing.assert_array_equal(got_np, w, err_msg=f"{name} on {dtype_name(dt)}")
    else:
        np.testing.assert_allclose(got_np.astype(np.float64), w.astype(np.float64), equal_nan=True,
                                   err_msg=f"{name} on {dtype_name(dt)}", **tolerance(want_dt))


def run_matrix(cases: list[tuple[str, Callable[..., Any], Callable[..., Any]]], dt: DType, device: str,
               binary: bool) -> None:
    x, y, tx, ty = make_pair(dt, device)
    pending: list[tuple[str, Tensor, Any]] = []
    problems: list[str] = []
    for name, ours, theirs in cases:
        if name in SEPARATE and dt.kind in SEPARATE[name]:
            continue
        args, targs = ((x, y), (tx, ty)) if binary else ((x,), (tx,))
        try:
            want = theirs(*targs)
        except Exception as e:  # torch rejects this op on this dtype
            if dt in UNSIGNED_WIDE and isinstance(e, NotImplementedError):
                continue  # torch has no kernel; ember defines a result, not compared here
            try:
                ours(*args)
            except type(e):
                continue
            except Exception as mine:
                problems.append(f"{name}: torch raised {type(e).__name__}, ember {type(mine).__name__}: {mine}")
                continue
            problems.append(f"{name}: torch raised {type(e).__name__} ({e}), ember did not")
            continue
        try:
            out = ours(*args)
        except Exception as mine:
            problems.append(f"{name}: torch gave {want.dtype}, ember raised {type(mine).__name__}: {mine}")
            continue
        if name in FLOAT_MATH and dt not in VALUE_CHECKED and out.dtype == FROM_TORCH[want.dtype]:
            continue  # the same float32 computation as for the integer dtypes whose values are checked
        pending.append((name, out, want))
    results = packed_numpy([t for _, t, _ in pending])
    for (name, t, want), got in zip(pending, results):
        if name in DEVIATIONS and not binary:
            skip = DEVIATIONS[name](values(dt))
            got, want = np.where(skip, 0, got), torch.where(torch.from_numpy(skip), 0, want).to(want.dtype)
        try:
            compare(name, dt, t, got, want)
        except AssertionError as e:
            problems.append(str(e).strip())
    assert not problems, f"{len(problems)} mismatches on {dtype_name(dt)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("dt", DTYPES, ids=dtype_name)
def test_unary_ops_every_dtype(device, dt):
    with np.errstate(all="ignore"):
        run_matrix(UNARY, dt, device, binary=False)


@pytest.mark.parametrize("dt", DTYPES, ids=dtype_name)
def test_binary_ops_every_dtype(device, dt):
    with np.errstate(all="ignore"):
        run_matrix(BINARY, dt, device, binary=True)


@pytest.mark.parametrize("dt", DTYPES, ids=dtype_name)
def test_promotion_with_every_dtype(device, dt):
    """``a op b`` for ``a`` of ``dt`` and ``b`` of every dtype: result dtype and values like torch."""
    x, _, tx, _ = make_pair(dt, device)
    pending = []
    for other in DTYPES:
        _, y, _, ty = make_pair(other, device)
        for name, ours, theirs in (("add", lambda a, b: a + b, torch.add), ("mul", lambda a, b: a * b, torch.mul),
                                   ("lt", lambda a, b: a < b, torch.lt), ("div", lambda a, b: a / b, torch.div)):
            try:
                want = theirs(tx, ty)
            except (NotImplementedError, RuntimeError):
                continue
            pending.append((f"{name} with {dtype_name(other)}", ours(x, y), want))
    for (name, t, want), got in zip(pending, packed_numpy([t for _, t, _ in pending])):
        compare(name, dt, t, got, want)


@pytest.mark.parametrize("dt", [d for d in DTYPES if d.kind in "iu"], ids=dtype_name)
def test_integer_wraparound(device, dt):
    info = np.iinfo(to_np_dtype(dt))
    a = np.array([info.max, info.min, info.max, info.min], dtype=to_np_dtype(dt))
    x = Tensor(a, device=device)
    outs = [x + 1, x - 1, x * 2, x * x, -x, x.abs(), x << 1, x // -1, x % -1]
    got = packed_numpy(outs)
    t = torch.from_numpy(a) if dt not in UNSIGNED_WIDE else None
    expect = [a + np.array(1, a.dtype), a - np.array(1, a.dtype), a * np.array(2, a.dtype), a * a]
    with np.errstate(all="ignore"):
        for g, e in zip(got[:4], expect):
            np.testing.assert_array_equal(g, e)
    if t is not None:
        torch_outs = [-t, t.abs(), t << 1, t // -1, t % -1] if dt.kind == "i" else [-t, t.abs(), t << 1]
        for g, e in zip(got[4:], torch_outs):
            np.testing.assert_array_equal(g, e.numpy())
    if dt == dtypes.int8:
        np.testing.assert_array_equal(got[0], np.array([-128, -127, -128, -127], np.int8))  # 127 + 1 == -128


@pytest.mark.parametrize("dt", [d for d in DTYPES if d.kind in "iu"], ids=dtype_name)
def test_integer_division_by_zero(device, dt):
    """torch raises on CPU; ember raises too: at once for a Python 0, at the next read for zero elements."""
    a = np.array([7, 0, 5, 1], dtype=to_np_dtype(dt))
    x = Tensor(a, device=device)
    for fn in (lambda v: v // 0, lambda v: v % 0, lambda v: v.div(0, rounding_mode="trunc"), lambda v: v.idiv(0)):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(x)
    if dt not in UNSIGNED_WIDE:
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            torch.from_numpy(a) // 0
    z = Tensor(np.zeros(4, to_np_dtype(dt)), device=device)
    for fn in (lambda: x // z, lambda: x % z, lambda: x.idiv(z), lambda: 5 // z):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn().numpy()
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((x / z).numpy(), a.astype(np.float32) / np.float32(0))


# --- casts and bitcasts ------------------------------------------------------------------------------

def cast_values(src: DType, dst: DType) -> np.ndarray:
    """Values of ``src`` whose conversion to ``dst`` C and torch define the same way."""
    if src == dtypes.bool:
        return np.array([True, False, True, False])
    if src.kind in "iu":
        info = np.iinfo(to_np_dtype(src))
        vals = [0, 1, 7, 100, info.max, info.min]
        if src.kind == "i":
            vals += [-1, -100]
        if dst.kind == "f" and src.itemsize == 8:
            vals = [v for v in vals if abs(v) < 2 ** 53]  # exactly representable, no rounding-mode question
        return np.array(vals, dtype=object).astype(to_np_dtype(src))
    vals = [0.0, -0.0, 1.0, 2.5, -2.5, 100.75, 0.3, -0.3, 65504.0, 1e-5]
    if dst.kind == "f" or dst.kind == "b":
        vals += [math.inf, -math.inf, math.nan, 1e30, -1e30, 1e-40]
    if dst.kind == "u":
        vals = [v for v in vals if v >= 0]  # negative floats to unsigned integers are undefined in C
    if dst.kind in "iu":
        vals = [v for v in vals if abs(v) < 2.0 ** (dst.bitsize - 1 - (dst.kind == "i"))]
    return np.array(vals, np.float64)


@pytest.mark.parametrize("src", DTYPES, ids=dtype_name)
def test_cast_every_pair(device, src):
    pending = []
    for dst in DTYPES:
        vals = cast_values(src, dst)
        with np.errstate(over="ignore"):  # 1e30 becomes inf in float16, as in torch
            x = Tensor(vals.astype(np.float32 if src == dtypes.bfloat16 else to_np_dtype(src)), device=device,
                       dtype=src)
        want = to_torch(vals, src).to(TORCH_DTYPES[dst])
        pending.append((dst, x.cast(dst), want))
    for (dst, t, want), got in zip(pending, packed_numpy([t for _, t, _ in pending])):
        assert t.dtype == dst
        w = from_torch(want)
        if dst.kind == "f":  # zeros and infinities keep their sign (a nan's sign bit is not specified)
            np.testing.assert_array_equal(np.signbit(got) & ~np.isnan(got), np.signbit(w) & ~np.isnan(w),
                                          err_msg=f"{dtype_name(src)} -> {dtype_name(dst)}")
        np.testing.assert_array_equal(got, w, err_msg=f"{dtype_name(src)} -> {dtype_name(dst)}")


@pytest.mark.parametrize("src", [d for d in DTYPES if d != dtypes.bool], ids=dtype_name)
def test_bitcast_every_pair(device, src):
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=8 * src.itemsize, dtype=np.uint8)
    if src.kind == "f":  # keep the source values finite and non-nan so torch's and numpy's copies keep every bit
        raw = np.frombuffer(np.linspace(-3, 3, 8).astype(np.float32 if src == dtypes.bfloat16 else
                                                         to_np_dtype(src)).tobytes(), np.uint8)
        if src == dtypes.bfloat16:
            raw = np.frombuffer((np.frombuffer(raw.tobytes(), np.uint32) >> 16).astype(np.uint16).tobytes(), np.uint8)
    src_t = torch.frombuffer(bytearray(raw.tobytes()), dtype=TORCH_DTYPES[src])
    x = Tensor(from_torch(src_t), device=device, dtype=src)
    pending = []
    for dst in DTYPES:
        if dst.itemsize != src.itemsize or dst == dtypes.bool:
            continue
        pending.append((dst, x.bitcast(dst), src_t.view(TORCH_DTYPES[dst])))
    for (dst, t, want), got in zip(pending, packed_numpy([t for _, t, _ in pending])):
        assert t.dtype == dst
        got_bits = got.view(np.uint32) >> 16 if dst == dtypes.bfloat16 else got
        want_bits = want.view(torch.int16).numpy().view(np.uint16) if dst == dtypes.bfloat16 else want.numpy()
        np.testing.assert_array_equal(np.asarray(got_bits).astype(np.uint64) if dst == dtypes.bfloat16 else got_bits,
                                      want_bits.astype(np.uint64) if dst == dtypes.bfloat16 else want_bits,
                                      err_msg=f"{dtype_name(src)} -> {dtype_name(dst)}")


def test_bitcast_size_mismatch_raises(device):
    with pytest.raises(RuntimeError):
        Tensor([1.0], device=device).bitcast(dtypes.float16)


@pytest.mark.parametrize("name, method, dt", [
    ("float", "float", dtypes.float32), ("half", "half", dtypes.float16), ("double", "double", dtypes.float64),
    ("bfloat16", "bfloat16", dtypes.bfloat16), ("int", "int", dtypes.int32), ("long", "long", dtypes.int64),
    ("short", "short", dtypes.int16), ("char", "char", dtypes.int8), ("byte", "byte", dtypes.uint8),
    ("bool", "bool", dtypes.bool)])
def test_cast_shortcuts(device, name, method, dt):
    a = np.array([1.5, 2.0, 0.0, 3.0], np.float32)  # negative floats to unsigned types are undefined in C
    t = getattr(Tensor(a, device=device), method)()
    want = getattr(torch.from_numpy(a), name)()
    assert t.dtype == dt == FROM_TORCH[want.dtype]
    np.testing.assert_array_equal(t.numpy(), from_torch(want))
