"""Elementwise arithmetic, comparisons, bitwise ops and math functions against torch.

Values, gradients, output shapes and dtypes are compared with torch on broadcasting shapes
(0-d and size-0 included) and non-contiguous layouts; integer semantics (floor division,
remainder sign, wrap-around, ``**``), rounding, and the exception types of invalid calls too.
Many results are checked with one kernel: each gets a row of a uint64 tensor (bitcast, widened).
"""
from __future__ import annotations

import math
import operator
import zlib
from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import dtype_name, packed_numpy, tg_index, torch_dtype_name

from ember import Tensor, dtypes
from ember.dtype import to_np_dtype

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(77)


@pytest.fixture(autouse=True)
def _seed_per_test(request: pytest.FixtureRequest) -> None:
    """Inputs depend only on the test, not on which tests ran before it in this worker."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def randf(*shape: int, lo: float = -3.0, hi: float = 3.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def away_from_zero(a: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) < 0.3, np.float32(0.75), a).astype(a.dtype)


BROADCAST = [((3, 4), (3, 4)), ((), ()), ((), (2, 3)), ((0, 3), (0, 3)), ((0, 1), (1, 5)), ((3, 1), (1, 4)),
             ((4,), (2, 3, 4)), ((2, 1, 3), (4, 1))]

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
    "maximum": lambda a, b: a.maximum(b) if isinstance(a, Tensor) else torch.maximum(a, b),
    "minimum": lambda a, b: a.minimum(b) if isinstance(a, Tensor) else torch.minimum(a, b),
    "where": lambda a, b: (a > b).where(a, b) if isinstance(a, Tensor) else torch.where(a > b, a, b),
}


def operands(name: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    a, b = randf(*sa), away_from_zero(randf(*sb))
    if name == "pow":
        a = np.asarray(np.abs(a) + np.float32(0.1), np.float32)
    return a, b


@pytest.mark.parametrize("name", BINARY)
def test_binary_forward_backward(device, name):
    """Every broadcasting pair of shapes: values, shape and dtype, and both gradients, against torch."""
    fn = BINARY[name]
    cases, outs, grads = [], [], []
    for sa, sb in BROADCAST:
        a, b = operands(name, sa, sb)
        x, y = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
        out = fn(x, y)
        ta, tb = torch.from_numpy(a).requires_grad_(True), torch.from_numpy(b).requires_grad_(True)
        want = fn(ta, tb)
        assert out.shape == tuple(want.shape) and out.dtype == dtypes.float32
        w = RNG.normal(size=want.shape).astype(np.float32)
        (out * Tensor(w, device=device)).sum().backward()
        if name == "floordiv":  # torch has no derivative for floor_divide; a step function's is 0
            ga, gb = np.zeros(sa, np.float32), np.zeros(sb, np.float32)
        else:
            (want * torch.from_numpy(w)).sum().backward()
            ga, gb = ta.grad.numpy(), tb.grad.numpy()
        cases.append((sa, sb, want.detach().numpy(), ga, gb))
        outs.append(out)
        grads += [x.grad, y.grad]
    values = packed_numpy(outs + grads)
    for i, (sa, sb, want, ga, gb) in enumerate(cases):
        msg = f"{name} {sa} {sb}"
        np.testing.assert_allclose(values[i], want, rtol=1e-5, atol=1e-6, err_msg=msg)
        np.testing.assert_allclose(values[len(cases) + 2 * i], ga, rtol=1e-3, atol=1e-4, err_msg=msg + " grad a")
        np.testing.assert_allclose(values[len(cases) + 2 * i + 1], gb, rtol=1e-3, atol=1e-4, err_msg=msg + " grad b")


@pytest.mark.views("permuted", "flipped", "padded", "expanded")
def test_binary_views(make):
    x, xe = make(randf(3, 4))
    y, ye = make(away_from_zero(randf(3, 4)), pad_value=1.5)
    names = list(BINARY)
    outs = [BINARY[n](x.abs() + 0.1 if n == "pow" else x, y) for n in names]
    tx, ty = torch.from_numpy(xe), torch.from_numpy(ye)
    for n, got in zip(names, packed_numpy(outs)):
        want = BINARY[n](tx.abs() + 0.1 if n == "pow" else tx, ty).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=n)


def test_scalar_operands_and_reflected(device):
    a = away_from_zero(randf(2, 3))
    t, ta = Tensor(a, device=device), torch.from_numpy(a)
    exprs = [lambda v: v + 2, lambda v: 2 + v, lambda v: v - 2.5, lambda v: 2.5 - v, lambda v: v * 3, lambda v: 3 * v,
             lambda v: v / 4, lambda v: 4 / v, lambda v: v // 0.7, lambda v: 7 // v, lambda v: v % 0.7,
             lambda v: 7 % v, lambda v: v ** 2, lambda v: 2 ** v, lambda v: v.abs() ** 1.5, lambda v: 1.5 ** v]
    outs = [e(t) for e in exprs]
    for i, (e, got) in enumerate(zip(exprs, packed_numpy(outs))):
        want = e(ta)
        assert outs[i].dtype == dtypes.float32 and outs[i].shape == tuple(want.shape)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"expression {i}")


UNARY: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], tuple[float, float]]] = {
    "neg": (lambda x: -x, lambda x: -x, (-3, 3)),
    "abs": (lambda x: x.abs(), torch.abs, (-3, 3)),
    "sign": (lambda x: x.sign(), torch.sign, (-3, 3)),
    "floor": (lambda x: x.floor(), torch.floor, (-3, 3)),
    "ceil": (lambda x: x.ceil(), torch.ceil, (-3, 3)),
    "round": (lambda x: x.round(), torch.round, (-3, 3)),
    "trunc": (lambda x: x.trunc(), torch.trunc, (-3, 3)),
    "square": (lambda x: x.square(), torch.square, (-3, 3)),
    "reciprocal": (lambda x: x.reciprocal(), torch.reciprocal, (0.2, 3)),
    "sqrt": (lambda x: x.sqrt(), torch.sqrt, (0.1, 5)),
    "rsqrt": (lambda x: x.rsqrt(), torch.rsqrt, (0.1, 5)),
    "exp": (lambda x: x.exp(), torch.exp, (-5, 5)),
    "exp2": (lambda x: x.exp2(), torch.exp2, (-5, 5)),
    "expm1": (lambda x: x.expm1(), torch.expm1, (-5, 5)),
    "log": (lambda x: x.log(), torch.log, (0.1, 10)),
    "log2": (lambda x: x.log2(), torch.log2, (0.1, 10)),
    "log10": (lambda x: x.log10(), torch.log10, (0.1, 10)),
    "log1p": (lambda x: x.log1p(), torch.log1p, (-0.9, 10)),
    "sin": (lambda x: x.sin(), torch.sin, (-7, 7)),
    "cos": (lambda x: x.cos(), torch.cos, (-7, 7)),
    "tan": (lambda x: x.tan(), torch.tan, (-1.4, 1.4)),
    "asin": (lambda x: x.asin(), torch.asin, (-0.95, 0.95)),
    "acos": (lambda x: x.acos(), torch.acos, (-0.95, 0.95)),
    "atan": (lambda x: x.atan(), torch.atan, (-5, 5)),
    "sinh": (lambda x: x.sinh(), torch.sinh, (-5, 5)),
    "cosh": (lambda x: x.cosh(), torch.cosh, (-5, 5)),
    "tanh": (lambda x: x.tanh(), torch.tanh, (-5, 5)),
    "asinh": (lambda x: x.asinh(), torch.asinh, (-5, 5)),
    "acosh": (lambda x: x.acosh(), torch.acosh, (1.1, 5)),
    "atanh": (lambda x: x.atanh(), torch.atanh, (-0.95, 0.95)),
    "erf": (lambda x: x.erf(), torch.erf, (-3, 3)),
    "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid, (-5, 5)),
}


def test_unary_forward_backward(device):
    """Every math function on float32: values and gradient against torch (one kernel for each)."""
    cases, outs, grads = [], [], []
    for name, (ours, theirs, (lo, hi)) in UNARY.items():
        a = randf(2, 3, 4, lo=lo, hi=hi)
        x = Tensor(a, device=device, requires_grad=True)
        out = ours(x)
        assert out.dtype == dtypes.float32 and out.shape == a.shape, name
        w = RNG.normal(size=a.shape).astype(np.float32)
        (out * Tensor(w, device=device)).sum().backward()
        ta = torch.from_numpy(a).requires_grad_(True)
        want = theirs(ta)
        (want * torch.from_numpy(w)).sum().backward()
        cases.append((name, want.detach().numpy(), ta.grad.numpy()))
        outs.append(out)
        grads.append(x.grad)
    values = packed_numpy(outs + grads)
    for i, (name, want, grad) in enumerate(cases):
        np.testing.assert_allclose(values[i], want, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(values[len(cases) + i], grad, rtol=1e-3, atol=1e-4, err_msg=name + " grad")


@pytest.mark.views("permuted", "flipped", "shrunk", "expanded")
def test_unary_views(make):
    x, xe = make(randf(3, 4, lo=0.2, hi=0.9))
    names = ["sqrt", "log1p", "cos", "tan", "asin", "erf", "round", "floor"]
    outs = [UNARY[n][0](x) for n in names]
    for n, got in zip(names, packed_numpy(outs)):
        np.testing.assert_allclose(got, UNARY[n][1](torch.from_numpy(xe)).numpy(), rtol=1e-5, atol=1e-6, err_msg=n)


def test_unary_shapes(device):
    outs, wants = [], []
    for shape in [(), (0,), (2, 0, 3), (1, 1)]:
        a = randf(*shape, lo=0.1, hi=0.9)
        t, ta = Tensor(a, device=device), torch.from_numpy(a)
        for name in ("exp", "cos", "atanh", "round"):
            out, want = UNARY[name][0](t), UNARY[name][1](ta)
            assert out.shape == tuple(want.shape) == shape
            outs.append(out)
            wants.append(want.numpy())
    for got, want in zip(packed_numpy(outs), wants):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# --- integer semantics --------------------------------------------------------------------------------

def test_floor_division_and_remainder_signs(device):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1, -1], np.int32)
    b = np.array([3, 3, -3, -3, 3, -3, 5, -5, 5], np.int32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    fdiv, mod, trunc, idiv = packed_numpy([x // y, x % y, x.div(y, rounding_mode="trunc"), x.idiv(y)])
    np.testing.assert_array_equal(fdiv, [int(p) // int(q) for p, q in zip(a, b)])  # Python's floor division
    np.testing.assert_array_equal(mod, [int(p) % int(q) for p, q in zip(a, b)])  # sign of the divisor
    np.testing.assert_array_equal(trunc, [math.trunc(int(p) / int(q)) for p, q in zip(a, b)])
    np.testing.assert_array_equal(idiv, trunc)  # tinygrad's idiv truncates toward zero
    assert (x // y).dtype == dtypes.int32 and (x % 2).dtype == dtypes.int32 and (x / y).dtype == dtypes.float32
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    np.testing.assert_array_equal(fdiv, (ta // tb).numpy())
    np.testing.assert_array_equal(mod, (ta % tb).numpy())


def test_float_floor_division_and_remainder(device):
    inf = math.inf
    a = np.array([5.0, -5.0, 5.0, -5.0, 0.0, -0.0, 7.5, -7.5, inf, 3.0, -4.0, 1.0], np.float32)
    b = np.array([inf, inf, -inf, -inf, inf, 2.0, 2.0, 2.0, 2.0, 0.0, 2.0, -0.0], np.float32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    fdiv, mod = packed_numpy([x // y, x % y])
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for got, want in ((fdiv, (ta // tb).numpy()), (mod, (ta % tb).numpy())):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got) & ~np.isnan(got), np.signbit(want) & ~np.isnan(want))


def test_int8_wraps_and_min_over_minus_one(device):
    x = Tensor(np.array([127, -128, 100], np.int8), device=device)
    add, mul, fdiv, mod, neg = packed_numpy([x + 1, x * 2, x // -1, x % -1, -x])
    np.testing.assert_array_equal(add, [-128, -127, 101])
    np.testing.assert_array_equal(mul, [-2, 0, -56])
    np.testing.assert_array_equal(fdiv, [-127, -128, -100])
    np.testing.assert_array_equal(mod, [0, 0, 0])
    np.testing.assert_array_equal(neg, [-127, -128, -100])


# --- pow ----------------------------------------------------------------------------------------------

def test_pow_float_semantics(device):
    a = np.array([-2.0, -2.0, -8.0, 0.0, -0.0, -0.0, 2.0, math.nan, 1.0, -1.0, math.inf], np.float32)
    b = np.array([3.0, 2.0, 1 / 3, 0.0, -1.0, 3.0, -2.0, 0.0, math.nan, math.inf, -0.5], np.float32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    shortcuts = [0.5, -0.5, 2, 3, -1, -2, 0, 1, 1.5]
    outs = [x ** y] + [x ** s for s in shortcuts]
    wants = [ta ** tb] + [ta ** s for s in shortcuts]
    for i, (got, want) in enumerate(zip(packed_numpy(outs), wants)):
        w = want.numpy()
        np.testing.assert_array_equal(got, w, err_msg=f"case {i}")
        np.testing.assert_array_equal(np.signbit(got) & ~np.isnan(got), np.signbit(w) & ~np.isnan(w),
                                      err_msg=f"case {i}")


def test_pow_float_gradient_edges(device):
    a = np.array([0.0, 2.0, -2.0, 0.0, 3.0], np.float32)
    b = np.array([0.0, 0.0, 2.0, 2.0, -1.0], np.float32)
    x, y = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    (x ** y).sum().backward()
    ta, tb = torch.from_numpy(a).requires_grad_(True), torch.from_numpy(b).requires_grad_(True)
    (ta ** tb).sum().backward()
    gx, gy = packed_numpy([x.grad, y.grad])
    np.testing.assert_allclose(gx, ta.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gy, tb.grad.numpy(), rtol=1e-6, equal_nan=True)


def test_pow_integers(device):
    a = np.array([2, -3, 0, 1, -1, 5, 7], np.int64)
    x, ta = Tensor(a, device=device), torch.from_numpy(a)
    small = Tensor(np.array([3, -2, 5], np.int8), device=device)
    outs = [x ** 2, x ** 3, x ** 0, 2 ** x.clip(0, 20), x ** 2.0, small ** 7, (x > 0) ** 2, x ** True]
    wants = [ta ** 2, ta ** 3, ta ** 0, 2 ** ta.clip(0, 20), ta ** 2.0, torch.tensor([3, -2, 5], dtype=torch.int8) ** 7,
             tg_index((ta > 0) ** 2), ta ** True]  # bool ** Python int: the default int (int32), as in tinygrad
    for i, (out, got, want) in enumerate(zip(outs, packed_numpy(outs), wants)):
        assert dtype_name(out.dtype) == torch_dtype_name(want), f"case {i}: {out.dtype} vs {want.dtype}"
        np.testing.assert_array_equal(got, want.numpy(), err_msg=f"case {i}")
    with pytest.raises(RuntimeError, match="negative integer powers"):
        x ** -1
    with pytest.raises(RuntimeError, match="negative integer powers"):
        ta ** -1



@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64],
                         ids=lambda d: dtype_name(d))
def test_pow_integer_tensor_exponent(device, dt):
    """int ** int tensor: exact and wrapping like torch; negative exponents give 0 except for bases 1 and -1."""
    npdt = to_np_dtype(dt)
    base = np.array([3, 2, 0, 1, 5, 7, 2, 1, 3], npdt) if dt.kind == "u" else \
        np.array([3, -2, 0, 1, -1, -1, 2, 1, 3], npdt)
    exp = np.array([4, 3, 0, 9, 7, 6, 1, 5, 11], npdt) if dt.kind == "u" else np.array([4, 3, 0, -9, -7, -6, -1, 5, 11],
                                                                                       npdt)
    x, e = Tensor(base, device=device), Tensor(exp, device=device)
    want = torch.from_numpy(base) ** torch.from_numpy(exp)
    out = x ** e
    assert out.dtype == dt
    np.testing.assert_array_equal(out.numpy(), want.numpy())


def test_pow_int32_large_constant_exponent(device):
    x = Tensor(np.array([3, -1, 2], np.int32), device=device)
    want = torch.tensor([3, -1, 2], dtype=torch.int32) ** 100
    np.testing.assert_array_equal((x ** 100).numpy(), want.numpy())


# --- clamp, where, lerp, minimum/maximum -----------------------------------------------------------------

def test_clamp_forms_and_gradients(device):
    a = np.array([1.0, 5.0, 3.0, 0.0, 2.0, 4.0, math.nan], np.float32)
    lo = np.array([2.0, 2.0, 3.0, 1.0, 2.0, 2.0, 0.0], np.float32)
    hi = np.array([4.0, 4.0, 3.0, 0.5, 4.0, 4.0, 1.0], np.float32)
    forms = [(lambda v, l, h: v.clamp(l, h), True, True), (lambda v, l, h: v.clamp(l, None), True, False),
             (lambda v, l, h: v.clamp(None, h), False, True), (lambda v, l, h: v.clip(2, 4), False, False),
             (lambda v, l, h: v.clamp(2.5), False, False), (lambda v, l, h: v.clamp(max=3), False, False)]
    outs, grads, wants = [], [], []
    for fn, use_lo, use_hi in forms:
        x = Tensor(a, device=device, requires_grad=True)
        tl = Tensor(lo, device=device, requires_grad=True)
        th = Tensor(hi, device=device, requires_grad=True)
        out = fn(x, tl, th)
        out.sum().backward()
        outs.append(out)
        grads += [x.grad] + ([tl.grad] if use_lo else []) + ([th.grad] if use_hi else [])
        ta = torch.from_numpy(a).requires_grad_(True)
        tlo, thi = torch.from_numpy(lo).requires_grad_(True), torch.from_numpy(hi).requires_grad_(True)
        want = fn(ta, tlo, thi)
        want.sum().backward()
        wants.append((want.detach().numpy(), [ta.grad] + ([tlo.grad] if use_lo else []) +
                      ([thi.grad] if use_hi else [])))
    values = packed_numpy(outs + grads)
    vals, gvals = values[: len(outs)], iter(values[len(outs):])
    for i, (got, (want, wgrads)) in enumerate(zip(vals, wants)):
        np.testing.assert_array_equal(got, want, err_msg=f"form {i}")
        for wg in wgrads:
            np.testing.assert_array_equal(next(gvals), wg.numpy(), err_msg=f"form {i} grad")


def test_clamp_promotion_and_errors(device):
    x = Tensor(np.array([1, 5, 3], np.int32), device=device)
    assert x.clamp(2, 4).dtype == dtypes.int32 and x.clamp(1.5).dtype == dtypes.float32
    np.testing.assert_array_equal(x.clamp(1.5, 4.5).numpy(), np.array([1.5, 4.5, 3.0], np.float32))
    with pytest.raises(RuntimeError):
        torch.tensor([1.0]).clamp()
    with pytest.raises(RuntimeError):
        Tensor([1.0], device=device).clamp()


def test_where_dtypes_and_gradient(device):
    c = np.array([True, False, True])
    t = Tensor(c, device=device)
    tc = torch.from_numpy(c)
    cases = [(t.where(1.5, 0), torch.where(tc, 1.5, 0)), (t.where(0, 1.5), torch.where(tc, 0, 1.5)),
             (t.where(2, 3), tg_index(torch.where(tc, 2, 3))),  # Python ints: the default int, int32
             (t.where(True, False), torch.where(tc, True, False)),
             (t.where(Tensor(np.array([1, 2, 3], np.int8), device=device), 0.5),
              torch.where(tc, torch.tensor([1, 2, 3], dtype=torch.int8), 0.5))]
    for i, ((out, want), got) in enumerate(zip(cases, packed_numpy([o for o, _ in cases]))):
        assert dtype_name(out.dtype) == torch_dtype_name(want), f"case {i}"
        np.testing.assert_array_equal(got, want.numpy())
    a, b = randf(3), randf(3)
    x, y = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    t.where(x, y).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), c.astype(np.float32))
    np.testing.assert_array_equal(y.grad.numpy(), (~c).astype(np.float32))


def test_lerp(device):
    s, e, w = randf(2, 3), randf(2, 3), RNG.uniform(-0.5, 1.5, (3,)).astype(np.float32)
    outs, grads, wants = [], [], []
    for weight in (0.25, 0.75, "tensor"):
        x, y = Tensor(s, device=device, requires_grad=True), Tensor(e, device=device, requires_grad=True)
        tw = Tensor(w, device=device, requires_grad=True) if weight == "tensor" else weight
        out = x.lerp(y, tw)
        out.sum().backward()
        outs.append(out)
        grads += [x.grad, y.grad] + ([tw.grad] if weight == "tensor" else [])
        ts, te = torch.from_numpy(s).requires_grad_(True), torch.from_numpy(e).requires_grad_(True)
        ttw = torch.from_numpy(w).requires_grad_(True) if weight == "tensor" else weight
        want = torch.lerp(ts, te, ttw)
        want.sum().backward()
        wants.append((want.detach().numpy(), [ts.grad, te.grad] + ([ttw.grad] if weight == "tensor" else [])))
    values = packed_numpy(outs + grads)
    gvals = iter(values[len(outs):])
    for got, (want, wgrads) in zip(values, wants):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        for wg in wgrads:
            np.testing.assert_allclose(next(gvals), wg.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError):
        torch.lerp(torch.ones(2), torch.ones(2, dtype=torch.float64), 0.5)
    with pytest.raises(RuntimeError):
        Tensor.ones(2, device=device).lerp(Tensor.ones(2, device=device, dtype=dtypes.float64), 0.5)
    with pytest.raises(NotImplementedError):
        Tensor([1, 2], device=device).lerp(Tensor([3, 4], device=device), 0.5)


def test_maximum_minimum_ties_nan_and_zero_signs(device):
    a = np.array([1.0, 2.0, 2.0, math.nan, 1.0, 0.0, -0.0], np.float32)
    b = np.array([1.0, 1.0, 3.0, 1.0, math.nan, -0.0, 0.0], np.float32)
    x, y = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    mx, mn = x.maximum(y), x.minimum(y)
    (mx + mn * 2).sum().backward()
    ta, tb = torch.from_numpy(a).requires_grad_(True), torch.from_numpy(b).requires_grad_(True)
    tmx, tmn = torch.maximum(ta, tb), torch.minimum(ta, tb)
    (tmx + tmn * 2).sum().backward()
    got_mx, got_mn, gx, gy = packed_numpy([mx, mn, x.grad, y.grad])
    np.testing.assert_array_equal(got_mx, tmx.detach().numpy())
    np.testing.assert_array_equal(got_mn, tmn.detach().numpy())
    np.testing.assert_array_equal(gx[:3], ta.grad.numpy()[:3])  # ties split the gradient evenly
    np.testing.assert_array_equal(gy[:3], tb.grad.numpy()[:3])


# --- comparisons, logic, predicates ------------------------------------------------------------------

def test_comparisons_and_logic(device):
    a = np.array([1.0, math.nan, -0.0, 2.0, math.inf, 0.5], np.float32)
    b = np.array([1.0, 1.0, 0.0, math.nan, math.inf, 0.0], np.float32)
    x, y, ta, tb = Tensor(a, device=device), Tensor(b, device=device), torch.from_numpy(a), torch.from_numpy(b)
    fns = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
           lambda p, q: p.logical_and(q), lambda p, q: p.logical_or(q), lambda p, q: p.logical_xor(q),
           lambda p, q: p.logical_not(), lambda p, q: p.isnan(), lambda p, q: p.isinf(), lambda p, q: p.isfinite(),
           lambda p, q: p.lt(q), lambda p, q: p.ge(q), lambda p, q: p.eq(q), lambda p, q: p.ne(q)]
    outs = [f(x, y) for f in fns]
    for i, (f, out, got) in enumerate(zip(fns, outs, packed_numpy(outs))):
        assert out.dtype == dtypes.bool
        np.testing.assert_array_equal(got, f(ta, tb).numpy(), err_msg=f"case {i}")
    pos, neg, neither = packed_numpy([x.isinf(detect_negative=False), (-x).isinf(detect_positive=False),
                                      x.isinf(False, False)])
    np.testing.assert_array_equal(pos, np.isposinf(a))
    np.testing.assert_array_equal(neg, np.isneginf(-a))
    assert not neither.any()
    i = Tensor(np.array([3, 0, -2], np.int32), device=device)
    nan, inf, fin, lnot = packed_numpy([i.isnan(), i.isinf(), i.isfinite(), i.logical_not()])
    assert not nan.any() and not inf.any() and fin.all()
    np.testing.assert_array_equal(lnot, [False, True, False])


# --- bitwise -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64], ids=dtype_name)
def test_bitwise(device, dt):
    npdt = to_np_dtype(dt)
    a = np.array([5, 12, 0, 127, 3, 100], npdt)
    b = np.array([3, 10, 7, 1, 2, 4], npdt)
    if dt.kind == "i":
        a[2], b[4] = -8, -2
    x, y, ta, tb = Tensor(a, device=device), Tensor(b, device=device), torch.from_numpy(a), torch.from_numpy(b)
    fns = [operator.and_, operator.or_, operator.xor, lambda p, q: ~p, lambda p, q: p.bitwise_not(),
           lambda p, q: p << (q & 3), lambda p, q: p >> (q & 3), lambda p, q: p & 6, lambda p, q: 6 | p,
           lambda p, q: p ^ True, lambda p, q: 1 << (q & 3), lambda p, q: p.bitwise_and(q)]
    outs = [f(x, y) for f in fns]
    for i, (f, out, got) in enumerate(zip(fns, outs, packed_numpy(outs))):
        want = f(ta, tb)
        assert dtype_name(out.dtype) == torch_dtype_name(want), f"case {i}"
        np.testing.assert_array_equal(got, want.numpy(), err_msg=f"case {i}")


def test_bool_bitwise(device):
    a, b = np.array([True, False, True, False]), np.array([True, True, False, False])
    x, y, ta, tb = Tensor(a, device=device), Tensor(b, device=device), torch.from_numpy(a), torch.from_numpy(b)
    fns = [operator.and_, operator.or_, operator.xor, lambda p, q: ~p, lambda p, q: p.bitwise_not(),
           lambda p, q: p << 1, lambda p, q: p + q, lambda p, q: p * q, lambda p, q: p.maximum(q),
           # a negated bool combined again: its value range must stay {False, True} (was folded to False)
           lambda p, q: p & ~q, lambda p, q: ~p | q, lambda p, q: (~p) ^ (~q), lambda p, q: p & p.logical_not()]
    outs = [f(x, y) for f in fns]
    for i, (f, out, got) in enumerate(zip(fns, outs, packed_numpy(outs))):
        want = tg_index(f(ta, tb))  # only bool << Python int gives an int: the default int, int32 as in tinygrad
        assert dtype_name(out.dtype) == torch_dtype_name(want), f"case {i}"
        np.testing.assert_array_equal(got, want.numpy(), err_msg=f"case {i}")


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64], ids=dtype_name)
def test_shift_by_width_or_more(device, dt):
    """Shifting by the bit width or more (or by a negative amount) gives 0, or -1 for a negative value >>."""
    npdt = to_np_dtype(dt)
    a = np.array([1, -8, 5, 3], npdt)
    s = np.array([dt.bitsize + 1, dt.bitsize, 70, -1], npdt)
    x, sh = Tensor(a, device=device), Tensor(s, device=device)
    left, right = (x << sh).numpy(), (x >> sh).numpy()
    ta, ts = torch.from_numpy(a), torch.from_numpy(s)
    np.testing.assert_array_equal(left, (ta << ts).numpy())
    np.testing.assert_array_equal(right, (ta >> ts).numpy())


# --- rounding, sign, abs ---------------------------------------------------------------------------------

def test_rounding(device):
    a = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.4, 8388609.0, -8388609.5, 1e30, math.inf,
                  -math.inf, math.nan, -0.0, 2.7, -2.7, 3.0], np.float32)
    x, ta = Tensor(a, device=device), torch.from_numpy(a)
    fns = [lambda v: v.round(), lambda v: v.floor(), lambda v: v.ceil(), lambda v: v.trunc(), lambda v: v.sign(),
           lambda v: v.abs(), lambda v: v.round(decimals=1)]
    outs = [f(x) for f in fns]
    for i, (f, got) in enumerate(zip(fns, packed_numpy(outs))):
        want = f(ta).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True, err_msg=f"case {i}")
        np.testing.assert_array_equal(np.signbit(got) & ~np.isnan(got), np.signbit(want) & ~np.isnan(want),
                                      err_msg=f"sign of case {i}")
    with np.errstate(over="ignore"):  # 8388609 is beyond float16's range: inf
        h = Tensor(a[:9], device=device, dtype=dtypes.float16)
    np.testing.assert_array_equal(h.round().numpy(), torch.from_numpy(a[:9]).half().round().numpy())
    i = Tensor(np.array([-3, 0, 4], np.int32), device=device)
    assert i.round() is i and i.floor().dtype == dtypes.int32
    np.testing.assert_array_equal(i.sign().numpy(), [-1, 0, 1])


def test_abs_and_sign_gradients(device):
    x = Tensor([0.0, -2.0, 3.0, -0.0], device=device, requires_grad=True)
    (x.abs() + x.sign() + x.round() + x.floor()).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, -1.0, 1.0, 0.0])


# --- errors ----------------------------------------------------------------------------------------------

ERRORS = [
    ("neg bool", lambda m: -m.tensor([True, False])),
    ("bool - bool", lambda m: m.tensor([True]) - m.tensor([False])),
    ("int - bool", lambda m: m.tensor([1, 2]) - True),
    ("bool - int", lambda m: m.tensor([True]) - 1),
    ("float & int", lambda m: m.tensor([1.5]) & 1),
    ("int & float", lambda m: m.tensor([1]) & 1.5),
    ("float << 1", lambda m: m.tensor([1.5]) << 1),
    ("~float", lambda m: ~m.tensor([1.5])),
    ("bitwise_not float", lambda m: m.tensor([1.5]).bitwise_not()),
    ("bool << bool", lambda m: m.tensor([True]) << m.tensor([True])),
    ("bool // bool", lambda m: m.tensor([True]) // m.tensor([True])),
    ("bool % bool", lambda m: m.tensor([True]) % m.tensor([True])),
    ("bool ** bool", lambda m: m.tensor([True]) ** m.tensor([True])),
    ("abs bool", lambda m: m.tensor([True]).abs()),
    ("floor bool", lambda m: m.tensor([True]).floor()),
    ("int ** -1", lambda m: m.tensor([2]) ** -1),
    ("int // 0", lambda m: m.tensor([2]) // 0),
    ("int % 0", lambda m: m.tensor([2]) % 0),
    ("shape mismatch", lambda m: m.tensor([1.0, 2.0]) + m.tensor([1.0, 2.0, 3.0])),
    ("shape mismatch 2d", lambda m: m.tensor([[1.0, 2.0]]) * m.tensor([[1.0], [2.0], [3.0]]).T),
    ("bad rounding mode", lambda m: m.tensor([1.0]).div(m.tensor([2.0]), rounding_mode="up")),
    ("relu bool", lambda m: m.tensor([True]).relu()),
]


class _Ember:
    """``tensor(...)`` building ember tensors on one device, so ERRORS can run on both libraries."""

    def __init__(self, device: str):
        self.device = device

    def tensor(self, data: Any) -> Tensor:
        return Tensor(data, device=self.device)


@pytest.mark.parametrize("name, call", ERRORS, ids=[n for n, _ in ERRORS])
def test_invalid_calls_raise_like_torch(device, name, call):
    try:
        call(torch)
    except Exception as e:
        expected = type(e)
    else:
        pytest.fail(f"torch accepted {name}")
    with pytest.raises(expected):
        call(_Ember(device)).realize()


# --- in-place operators ----------------------------------------------------------------------------------

def test_inplace_operators(device):
    a = np.array([7, -7, 12, 5], np.int32)
    ops = [operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
           operator.ilshift, operator.irshift]
    outs, wants = [], []
    for op in ops:
        t = Tensor(a, device=device)
        alias = t
        t = op(t, 2)
        assert t is alias  # updated in place
        outs.append(t)
        wants.append(op(torch.from_numpy(a.copy()), 2).numpy())
    for got, want in zip(packed_numpy(outs), wants):
        np.testing.assert_array_equal(got, want)


# --- regressions: bugs found in code this family builds on, now fixed ---------------------------------

def test_schedule_then_numpy(device):
    x = Tensor(np.arange(-6, 6, dtype=np.int8), device=device)
    y = (x + 3).cast(dtypes.int64)
    assert len(y.schedule()) == 1
    np.testing.assert_array_equal(y.numpy(), np.arange(-3, 9))


def test_comparison_after_integer_wraparound(device):
    x = Tensor(np.array([127, 0], np.int8), device=device)
    np.testing.assert_array_equal(((x + 1) < -127).numpy(), [True, False])


def test_long_integer_product(device):
    x = Tensor(np.array([3, 1], np.int32), device=device)
    y = x
    for _ in range(40):
        y = y * x
    want = torch.tensor([3, 1], dtype=torch.int32) ** 41
    np.testing.assert_array_equal(y.numpy(), want.numpy())


def test_deep_elementwise_chain(device):
    x = Tensor(np.linspace(-1, 1, 16, dtype=np.float32), device=device)
    y, want = x, np.linspace(-1, 1, 16, dtype=np.float32)
    for _ in range(100):
        y = (y * 0.5 + 0.25).sin()
        want = np.sin(want * np.float32(0.5) + np.float32(0.25))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


def test_very_deep_elementwise_chain(device):
    x = Tensor(np.linspace(-1, 1, 16, dtype=np.float32), device=device)
    y, want = x, np.linspace(-1, 1, 16, dtype=np.float32)
    for _ in range(400):
        y = (y * 0.5 + 0.25).sin()
        want = np.sin(want * np.float32(0.5) + np.float32(0.25))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)
