"""Tensor construction and elementwise ops against numpy, on every usable backend device.

Expected dtypes follow torch's promotion rules; values come from numpy on the same inputs.
"""
from __future__ import annotations

import operator

import numpy as np
import pytest
from backend_utils import other_device

from ember import Tensor, dtypes
from ember.dtype import to_np_dtype

RNG = np.random.default_rng(1234)

ALL_NP_DTYPES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                 np.float16, np.float32, np.float64)

# Shapes pairs that broadcast: same shape, 0-d, size-0, and numpy-style broadcasting in both directions.
BROADCAST_SHAPES = [((3, 4), (3, 4)), ((), ()), ((), (2, 3)), ((0, 3), (0, 3)), ((0, 1), (1, 5)), ((3, 1), (1, 4)),
                    ((4,), (2, 3, 4)), ((2, 1, 3), (4, 1))]


def randf(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


# --------------------------------------------------------------------------------------------
# construction
# --------------------------------------------------------------------------------------------

# Python ints become the default int (int32, as in tinygrad; torch would give int64), or int64 past its range
@pytest.mark.parametrize("value, dtype", [(3, dtypes.int32), (-2.5, dtypes.float32), (True, dtypes.bool),
                                          (0, dtypes.int32), (1e30, dtypes.float32), (2**40, dtypes.int64)])
def test_python_scalar(device, check, value, dtype):
    t = Tensor(value, device=device)
    assert t.shape == () and t.dtype == dtype and t.device == device
    check(t, np.array(value, dtype=np.float32 if isinstance(value, float) else None), dtype=dtype)
    assert t.item() == pytest.approx(value)
    assert type(t.item()) is type(value)


@pytest.mark.parametrize("data, dtype", [
    ([[1, 2, 3], [4, 5, 6]], dtypes.int32),
    ([[1, 2**31], [3, -4]], dtypes.int64),
    ([[1.0, 2], [3, 4.5]], dtypes.float32),
    ([True, False, True], dtypes.bool),
    ([1, 2.5, True], dtypes.float32),
    ([[[1], [2]], [[3], [4]]], dtypes.int32),
    ((1, 2, 3), dtypes.int32),
    ([], dtypes.float32),
    ([[], []], dtypes.float32),
])
def test_nested_lists(device, check, data, dtype):
    t = Tensor(data, device=device)
    expected = np.array(data, dtype=np.float32 if dtype == dtypes.float32 else None)
    check(t, expected, dtype=dtype)
    assert t.tolist() == expected.tolist()


def test_list_with_explicit_dtype(device, check):
    check(Tensor([1, 2, 3], device=device, dtype=dtypes.float64), np.array([1, 2, 3], np.float64))
    check(Tensor([1.9, -1.9], device=device, dtype="int32"), np.array([1, -1], np.int32))
    check(Tensor([[0, 2], [3, 0]], device=device, dtype=dtypes.bool), np.array([[False, True], [True, False]]))


@pytest.mark.parametrize("npdt", ALL_NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_array_every_dtype(device, check, npdt):
    info = np.iinfo(npdt) if np.dtype(npdt).kind in "iu" else None
    if npdt is np.bool_:
        a = np.array([[True, False, True], [False, False, True]])
    elif info is not None:  # include both extremes: the values must survive bit for bit
        a = np.array([[info.min, info.max, 0], [1, 7, info.max - 1]], dtype=npdt)
    else:
        a = np.array([[-1.5, 0.0, 65504.0 if npdt is np.float16 else 1e30], [np.inf, -np.inf, 0.1]], dtype=npdt)
    t = Tensor(a, device=device)
    check(t, a, exact=True)
    check(Tensor(a[::-1, 1:], device=device), a[::-1, 1:], exact=True)  # a non-contiguous numpy array


@pytest.mark.parametrize("npdt", ALL_NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_0d_and_empty(device, check, npdt):
    check(Tensor(np.array(1, dtype=npdt), device=device), np.array(1, dtype=npdt), exact=True)
    check(Tensor(np.zeros((2, 0, 3), dtype=npdt), device=device), np.zeros((2, 0, 3), dtype=npdt), exact=True)


def test_numpy_scalar(device, check):
    check(Tensor(np.float64(2.5), device=device), np.array(2.5, np.float64))
    check(Tensor(np.int16(-7), device=device), np.array(-7, np.int16))


def test_bfloat16(device, check):
    values = [1.5, -2.0, 0.25, 3.0, -0.0078125, 256.0]  # exactly representable in bfloat16
    t = Tensor(values, device=device, dtype="bfloat16")
    assert t.dtype == dtypes.bfloat16
    check(t, np.array(values, np.float32), dtype=dtypes.bfloat16, exact=True)
    # rounding to bfloat16 keeps 8 significant bits
    rounded = Tensor(np.array([1.0 + 2 ** -10, 3.14159], np.float32), device=device, dtype="bfloat16")
    check(rounded, np.array([1.0, 3.140625], np.float32), dtype=dtypes.bfloat16, exact=True)
    # arithmetic in bfloat16 stays bfloat16
    check(t + t, np.array(values, np.float32) * 2, dtype=dtypes.bfloat16, exact=True)


def test_bytes(device, check):
    t = Tensor(b"\x00\x01\x7f\xff", device=device)
    check(t, np.array([0, 1, 127, 255], np.uint8))
    check(Tensor(b"", device=device), np.zeros((0,), np.uint8))


@pytest.mark.parametrize("shape", [(2, 3), (), (0, 4), (5,)])
def test_zeros_ones_full(device, check, shape):
    check(Tensor.zeros(*shape, device=device), np.zeros(shape, np.float32))
    check(Tensor.ones(shape, device=device), np.ones(shape, np.float32))
    check(Tensor.full(shape, 7, device=device), np.full(shape, 7, np.int32))
    check(Tensor.full(shape, 2.5, device=device), np.full(shape, 2.5, np.float32))
    check(Tensor.full(shape, True, device=device), np.full(shape, True))
    check(Tensor.zeros(*shape, device=device, dtype=dtypes.int8), np.zeros(shape, np.int8))
    check(Tensor.ones(*shape, device=device, dtype="float16"), np.ones(shape, np.float16))


def test_like_constructors(device, check):
    base = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    check(base.zeros_like(), np.zeros((2, 3), np.int32))
    check(base.ones_like(), np.ones((2, 3), np.int32))
    check(base.full_like(9), np.full((2, 3), 9, np.int32))
    check(base.ones_like(dtype=dtypes.float32), np.ones((2, 3), np.float32))
    assert base.zeros_like().device == device


@pytest.mark.parametrize("args, kwargs, expected", [
    ((5,), {}, np.arange(5, dtype=np.int32)),  # the default int, as in tinygrad
    ((2, 9, 3), {}, np.arange(2, 9, 3, dtype=np.int32)),
    ((5, 0, -2), {}, np.arange(5, 0, -2, dtype=np.int32)),
    ((0.5, 2.0, 0.5), {}, np.arange(0.5, 2.0, 0.5, dtype=np.float32)),
    ((4,), {"dtype": dtypes.float32}, np.arange(4, dtype=np.float32)),
    ((3, 3), {}, np.arange(3, 3, dtype=np.int32)),
    ((0,), {}, np.arange(0, dtype=np.int32)),
])
def test_arange(device, check, args, kwargs, expected):
    check(Tensor.arange(*args, device=device, **kwargs), expected)


def test_empty(device):
    t = Tensor.empty(3, 4, device=device)
    assert t.shape == (3, 4) and t.dtype == dtypes.float32 and t.device == device
    assert t.numpy().shape == (3, 4)
    e = Tensor.empty(0, 2, dtype=dtypes.int16, device=device)
    assert e.shape == (0, 2) and e.dtype == dtypes.int16 and e.numpy().shape == (0, 2)


def test_rand_randn(device):
    r = Tensor.rand(64, 32, device=device)
    assert r.shape == (64, 32) and r.dtype == dtypes.float32 and r.device == device
    v = r.numpy()
    assert v.min() >= 0.0 and v.max() < 1.0 and 0.4 < v.mean() < 0.6
    n = Tensor.randn(64, 32, device=device).numpy()
    assert n.dtype == np.float32 and abs(n.mean()) < 0.2 and 0.8 < n.std() < 1.2
    assert Tensor.rand(3, dtype=dtypes.float16, device=device).dtype == dtypes.float16
    assert Tensor.rand(0, 3, device=device).numpy().shape == (0, 3)
    assert Tensor.randn(device=device).shape == ()


def test_manual_seed_reproducible(device):
    Tensor.manual_seed(42)
    a, b = Tensor.rand(4, 5, device=device).numpy(), Tensor.randn(3, device=device).numpy()
    c = Tensor.rand(4, 5, device=device).numpy()
    Tensor.manual_seed(42)
    np.testing.assert_array_equal(Tensor.rand(4, 5, device=device).numpy(), a)
    np.testing.assert_array_equal(Tensor.randn(3, device=device).numpy(), b)
    assert not np.array_equal(a, c), "consecutive draws must differ"
    Tensor.manual_seed(43)
    assert not np.array_equal(Tensor.rand(4, 5, device=device).numpy(), a)


def test_manual_seed_same_across_devices(device):
    other = other_device(device)
    Tensor.manual_seed(7)
    a = Tensor.rand(3, 3, device=device).numpy()
    Tensor.manual_seed(7)
    np.testing.assert_array_equal(Tensor.rand(3, 3, device=other).numpy(), a)


@pytest.mark.parametrize("n, m", [(3, None), (1, None), (2, 4), (4, 2), (0, None)])
def test_eye(device, check, n, m):
    check(Tensor.eye(n, m, device=device), np.eye(n, m, dtype=np.float32))


def test_eye_dtype(device, check):
    check(Tensor.eye(3, device=device, dtype=dtypes.int32), np.eye(3, dtype=np.int32))


def test_device_argument(device):
    t = Tensor([1, 2], device=device)
    assert t.device == device
    assert (t + 1).device == device
    assert Tensor.zeros(2, device=device.lower()).device == device


def test_to_round_trip(device, check):
    other = other_device(device)
    a = randf(3, 4)
    t = Tensor(a, device=device)
    moved = t.to(other)
    assert moved.device == other
    check(moved, a)
    # compute on the other device, then come back
    back = (moved * 2 + 1).to(device)
    assert back.device == device
    check(back, a * 2 + 1)
    assert t.to(device) is t
    # a lazy (unrealized) non-contiguous view moves too
    check(Tensor(a, device=device).T[::-1].to(other), a.T[::-1])
    check(Tensor(np.arange(4, dtype=np.int16), device=device).to(other).to(device), np.arange(4, dtype=np.int16))
    check(Tensor.full((2, 2), 3.0, device=device).to(other), np.full((2, 2), 3.0, np.float32))


def test_mixing_devices_is_an_error(device):
    other = other_device(device)
    with pytest.raises(RuntimeError, match="same device"):
        Tensor([1.0], device=device) + Tensor([1.0], device=other)


# --------------------------------------------------------------------------------------------
# elementwise
# --------------------------------------------------------------------------------------------

BINARY = {
    "add": (operator.add, np.add),
    "sub": (operator.sub, np.subtract),
    "mul": (operator.mul, np.multiply),
    "div": (operator.truediv, np.divide),
    "maximum": (lambda x, y: x.maximum(y), np.maximum),
    "minimum": (lambda x, y: x.minimum(y), np.minimum),
}

COMPARE = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq, "ne": operator.ne,
}


def nonzero(a: np.ndarray) -> np.ndarray:
    """``a`` with values moved away from zero so it is a safe divisor."""
    return np.where(np.abs(a) < 0.25, np.float32(0.5), a).astype(a.dtype)


# Layouts change only how inputs are indexed, not the ALU op: a representative op per kind of lowering runs on
# every layout (add: plain ALU, div: float division, minimum: compare + where); all ops run in the broadcast tests.
@pytest.mark.parametrize("name", ["add", "div", "minimum"])
def test_binary_views(name, make, check):
    ours, theirs = BINARY[name]
    x, xe = make(randf(3, 4))
    y, ye = make(nonzero(randf(3, 4)), pad_value=1.5)
    check(ours(x, y), theirs(xe, ye))


@pytest.mark.parametrize("shape", [(), (0, 3), (2, 0)], ids=str)
def test_elementwise_0d_and_empty_views(shape, make, check):
    x, xe = make(randf(*shape))
    y, ye = make(nonzero(randf(*shape)), pad_value=1.5)
    check(x * y - x / y, xe * ye - xe / ye)
    check((x < y).where(x.exp(), -y), np.where(xe < ye, np.exp(xe), -ye), **TRANSCENDENTAL_TOL)


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
def test_binary_broadcast(device, check, name, shapes):
    ours, theirs = BINARY[name]
    a, b = randf(*shapes[0]), nonzero(randf(*shapes[1]))
    check(ours(Tensor(a, device=device), Tensor(b, device=device)), theirs(a, b))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_scalar_and_reflected(device, check, name):
    ours, theirs = BINARY[name]
    a = nonzero(randf(2, 3))
    t = Tensor(a, device=device)
    check(ours(t, 3.0), theirs(a, np.float32(3.0)))
    check(ours(2.5, t), theirs(np.float32(2.5), a))
    check(ours(t, 2), theirs(a, np.float32(2)))
    check(ours(-1, t), theirs(np.float32(-1), a))


def test_int_arithmetic(device, check):
    a = np.array([[7, -7, 3], [0, 12, -5]], np.int32)
    b = np.array([[2, 3, -4], [5, -1, 6]], np.int32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    check(x + y, a + b)
    check(x - y, a - b)
    check(x * y, a * b)
    check(x * 3 - 1, a * 3 - 1)
    check(10 - x, 10 - a)
    check(x.maximum(y), np.maximum(a, b))
    check(x.minimum(y), np.minimum(a, b))
    check(-x, -a)


@pytest.mark.parametrize("name", ["lt", "le", "ne"])
def test_compare_views(name, make, check):
    fn = COMPARE[name]
    base = np.round(randf(3, 4))  # small integers, so ties are frequent
    x, xe = make(base)
    y, ye = make(np.round(randf(3, 4)))
    check(fn(x, y), fn(xe, ye))


@pytest.mark.parametrize("name", COMPARE)
def test_compare_scalars_and_broadcast(device, check, name):
    fn = COMPARE[name]
    a = np.array([[-1.0, 0.0, 1.0, 2.0]], np.float32)
    b = np.array([[0.0], [1.0]], np.float32)
    t = Tensor(a, device=device)
    check(fn(t, Tensor(b, device=device)), fn(a, b))
    check(fn(t, 1.0), fn(a, np.float32(1.0)))
    check(fn(1, t), fn(np.float32(1), a))  # reflected: Python swaps the comparison
    ints = np.array([3, -2, 0, 3], np.int32)
    check(fn(Tensor(ints, device=device), 3), fn(ints, 3))
    check(fn(Tensor(np.zeros((0, 2), np.float32), device=device), 0.0), np.zeros((0, 2), bool))
    check(fn(Tensor(2.0, device=device), Tensor(2.0, device=device)), np.array(fn(2.0, 2.0)))


def test_compare_nan(device, check):
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([1.0, np.nan, np.nan], np.float32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    for fn in COMPARE.values():
        check(fn(x, y), fn(a, b))


def test_where(make, check):
    cond, ce = make(randf(3, 4) > 0)
    x, xe = make(randf(3, 4))
    y, ye = make(randf(3, 4))
    check(cond.where(x, y), np.where(ce, xe, ye))
    check(cond.where(x, 0.5), np.where(ce, xe, np.float32(0.5)))
    check(cond.where(-1.0, y), np.where(ce, np.float32(-1.0), ye))


def test_where_broadcast_and_dtypes(device, check):
    c = np.array([[True], [False]])
    a = np.arange(3, dtype=np.int32)
    t = Tensor(c, device=device)
    check(t.where(Tensor(a, device=device), 7), np.where(c, a, 7).astype(np.int32))
    check(t.where(Tensor(a, device=device), 0.5), np.where(c, a, 0.5).astype(np.float32))
    check(t.where(2, 3), np.where(c, 2, 3).astype(np.int32))
    # a non-bool condition counts as true where nonzero
    f = np.array([0.0, 2.0, -1.0], np.float32)
    check(Tensor(f, device=device).where(1, 0), np.array([0, 1, 1], np.int32))
    check(Tensor(True, device=device).where(Tensor(np.zeros((0, 3), np.float32), device=device), 1.0),
          np.zeros((0, 3), np.float32))
    check(Tensor(False, device=device).where(1.0, 2.0), np.array(2.0, np.float32))


def test_where_two_python_scalars(device, check):
    # the result dtype follows the higher category of the two scalars (float over int over bool), like torch
    c = np.array([True, False])
    t = Tensor(c, device=device)
    check(t.where(1.5, 0), np.array([1.5, 0.0], np.float32))
    check(t.where(0, 1.5), np.array([0.0, 1.5], np.float32))


CASTS = [
    (np.float32, dtypes.int32, [-2.7, -0.5, 0.0, 0.9, 3.99, 100.5]),
    (np.float32, dtypes.bool, [-2.0, 0.0, 0.5, np.nan, -0.0, 1.0]),
    (np.float32, dtypes.float16, [1.0, -2.5, 65504.0, 1e-3, 0.0, 3.14159]),
    (np.float32, dtypes.float64, [1.0, -2.5, 1e30, 1e-30, 0.0, 3.14159]),
    (np.float32, dtypes.uint8, [0.0, 1.5, 200.9, 255.0, 7.0, 3.0]),
    (np.int32, dtypes.float32, [-3, 0, 7, 1 << 20, -(1 << 20), 5]),
    (np.int32, dtypes.int8, [127, 128, -129, 255, -1, 0]),
    (np.int64, dtypes.int32, [1 << 33, -1, 5, (1 << 31) - 1, 0, -7]),
    (np.int32, dtypes.bool, [0, 1, -1, 2, 0, 9]),
    (np.bool_, dtypes.float32, [True, False, True, True, False, False]),
    (np.bool_, dtypes.int64, [True, False, True, True, False, False]),
    (np.uint8, dtypes.int16, [0, 255, 128, 1, 7, 200]),
    (np.int8, dtypes.uint8, [-1, -128, 127, 0, 5, -5]),
    (np.float16, dtypes.float32, [1.0, -2.5, 65504.0, 1e-3, 0.0, 3.14159]),
    (np.float64, dtypes.float32, [1.0, -2.5, 1e30, 1e-30, 0.0, 0.1]),
]


@pytest.mark.parametrize("src, dst, values", CASTS, ids=[f"{np.dtype(s).name}-{d.name}" for s, d, _ in CASTS])
def test_cast(device, check, src, dst, values):
    a = np.array(values).astype(src).reshape(2, 3)
    expected = a.astype(np.float32).astype(bool) if dst == dtypes.bool else a.astype(to_np_dtype(dst))
    check(Tensor(a, device=device).cast(dst), expected, dtype=dst, exact=True)


def test_cast_views(make, check):
    x, xe = make(randf(3, 4, lo=-50, hi=50))
    check(x.cast(dtypes.int32), xe.astype(np.int32))
    check(x.cast("float64").cast(dtypes.float16), xe.astype(np.float64).astype(np.float16))


def test_cast_shortcuts(device, check):
    a = np.array([1.5, -2.5], np.float32)
    t = Tensor(a, device=device)
    check(t.int(), a.astype(np.int32))
    check(t.long(), a.astype(np.int64))
    check(t.half(), a.astype(np.float16))
    check(t.double(), a.astype(np.float64))
    check(t.bool(), a.astype(bool))
    check(t.int().float(), a.astype(np.int32).astype(np.float32))
    assert t.cast(dtypes.float32) is t


UNARY = {
    # name: (ember op, numpy op, input range, rtol/atol override)
    "neg": (lambda x: -x, np.negative, (-3, 3)),
    "abs": (lambda x: x.abs(), np.abs, (-3, 3)),
    "relu": (lambda x: x.relu(), lambda a: np.maximum(a, 0), (-3, 3)),
    "exp": (lambda x: x.exp(), np.exp, (-5, 5)),
    "log": (lambda x: x.log(), np.log, (0.01, 10)),
    "sqrt": (lambda x: x.sqrt(), np.sqrt, (0, 10)),
    "sin": (lambda x: x.sin(), np.sin, (-7, 7)),
    "cos": (lambda x: x.cos(), np.cos, (-7, 7)),
    "square": (lambda x: x.square(), np.square, (-3, 3)),
}
# exp/log/sin/cos come from the device's libm (or numpy on PYTHON); a few ulp of float32 differ from numpy's,
# and cos near its zeros is computed as sin(pi/2 - x) so its absolute error is ~1 ulp of the argument.
TRANSCENDENTAL_TOL = {"rtol": 2e-5, "atol": 2e-6}


@pytest.mark.parametrize("name", ["exp", "abs", "cos", "relu"])
def test_unary_views(name, make, check):
    ours, theirs, (lo, hi) = UNARY[name]
    x, xe = make(randf(3, 4, lo=lo, hi=hi))
    check(ours(x), theirs(xe), **TRANSCENDENTAL_TOL)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (7,)], ids=str)
def test_unary_shapes(device, check, name, shape):
    ours, theirs, (lo, hi) = UNARY[name]
    a = randf(*shape, lo=lo, hi=hi)
    check(ours(Tensor(a, device=device)), theirs(a), **TRANSCENDENTAL_TOL)


def test_unary_special_values(device, check):
    a = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
    t = Tensor(a, device=device)
    with np.errstate(all="ignore"):
        check(t.exp(), np.exp(a))
        check(t.log(), np.log(a))
        check(t.sqrt(), np.sqrt(a))
        check(t.relu(), np.maximum(a, 0))
        check(t.abs(), np.abs(a))
        check(-t, -a)
        check(Tensor([-1.0], device=device).sqrt(), np.array([np.nan], np.float32))
        check(Tensor([-1.0, 0.0], device=device).log(), np.array([np.nan, -np.inf], np.float32))


def test_unary_on_ints_gives_float(device, check):
    a = np.array([1, 2, 4], np.int32)
    t = Tensor(a, device=device)
    check(t.exp(), np.exp(a.astype(np.float32)), **TRANSCENDENTAL_TOL)
    check(t.sqrt(), np.sqrt(a.astype(np.float32)))
    check(t.log(), np.log(a.astype(np.float32)), **TRANSCENDENTAL_TOL)
    check(t.abs(), a)
    check(Tensor(np.array([-3, 3], np.int64), device=device).abs(), np.array([3, 3], np.int64))
    check(Tensor(np.array([-3, 4], np.int8), device=device).relu(), np.array([0, 4], np.int8))


def test_max_min_nan_propagate(device, check):
    a = np.array([np.nan, 1.0, 2.0, np.nan], np.float32)
    b = np.array([0.0, np.nan, 1.0, np.nan], np.float32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    check(x.maximum(y), np.maximum(a, b))
    check(x.minimum(y), np.minimum(a, b))
    check(x.maximum(1.5), np.maximum(a, np.float32(1.5)))
    check(x.minimum(1.5), np.minimum(a, np.float32(1.5)))


def test_pow(make, check):
    base, be = make(randf(3, 4, lo=0.1, hi=3))
    ex, ee = make(randf(3, 4, lo=-2, hi=2))
    tol = {"rtol": 3e-5, "atol": 1e-6}  # powf differs from numpy by a few ulp
    check(base ** ex, be ** ee, **tol)
    check(base ** 2, be ** np.float32(2), **tol)
    check(base ** 0.5, be ** np.float32(0.5), **tol)
    check(2 ** ex, np.float32(2) ** ee, **tol)
    check(base.pow(ex), be ** ee, **tol)


def test_pow_edge_cases(device, check):
    a = np.array([-2.0, -1.5, 0.0, 0.0, 4.0, 1.0], np.float32)
    b = np.array([2.0, 3.0, 0.0, 2.0, -0.5, np.nan], np.float32)
    check(Tensor(a, device=device) ** Tensor(b, device=device), np.power(a, b))
    check(Tensor(np.zeros((0, 2), np.float32), device=device) ** 2, np.zeros((0, 2), np.float32))
    check(Tensor(3.0, device=device) ** 2, np.array(9.0, np.float32))


@pytest.mark.parametrize("expr, expected_dtype", [
    (lambda d: Tensor([1, 2], device=d, dtype=dtypes.int32) + 1.5, dtypes.float32),
    (lambda d: Tensor([1, 2], device=d, dtype=dtypes.int64) * 0.5, dtypes.float32),
    (lambda d: Tensor([1, 2], device=d, dtype=dtypes.int32) + Tensor([3, 4], device=d, dtype=dtypes.int64),
     dtypes.int64),
    (lambda d: Tensor([1, 2], device=d, dtype=dtypes.uint8) + Tensor([-3, 4], device=d, dtype=dtypes.int8),
     dtypes.int16),
    (lambda d: Tensor([True, False], device=d) + Tensor([True, True], device=d), dtypes.bool),
    (lambda d: Tensor([True, False], device=d) * Tensor([True, True], device=d), dtypes.bool),
    (lambda d: Tensor([7, 2], device=d, dtype=dtypes.int32) / Tensor([2, 4], device=d, dtype=dtypes.int32),
     dtypes.float32),
    (lambda d: Tensor([7, 2], device=d) / 2, dtypes.float32),
    (lambda d: Tensor([1, 2], device=d, dtype=dtypes.int32) + 5, dtypes.int32),
    (lambda d: Tensor([1, 2], device=d, dtype=dtypes.uint8) * 3, dtypes.uint8),
    (lambda d: Tensor([True, False], device=d) + 2, dtypes.int32),
    (lambda d: Tensor([True, False], device=d) + 2.5, dtypes.float32),
    (lambda d: Tensor([1.0, 2.0], device=d, dtype=dtypes.float16) + 2.5, dtypes.float16),
    (lambda d: Tensor([1.0, 2.0], device=d, dtype=dtypes.float16) + Tensor([1.0, 2.0], device=d), dtypes.float32),
    (lambda d: Tensor([1, 2], device=d) + Tensor([1.0, 2.0], device=d, dtype=dtypes.float16), dtypes.float16),
    (lambda d: Tensor([1.0], device=d, dtype=dtypes.float64) * Tensor([2.0], device=d), dtypes.float64),
    (lambda d: Tensor([3], device=d, dtype=dtypes.uint8) - Tensor([5], device=d, dtype=dtypes.uint16),
     dtypes.uint16),
])
def test_promotion(device, expr, expected_dtype):
    out = expr(device)
    assert out.dtype == expected_dtype
    got = out.numpy()
    assert got.dtype == np.dtype(to_np_dtype(expected_dtype))


def test_promotion_values(device, check):
    u = np.array([200, 3, 0], np.uint8)
    i = np.array([-100, 4, -1], np.int8)
    check(Tensor(u, device=device) + Tensor(i, device=device), u.astype(np.int16) + i.astype(np.int16))
    check(Tensor(u, device=device) + 100, (u + np.uint8(100)).astype(np.uint8))  # wraps in uint8, like torch
    check(Tensor(np.array([7, -7], np.int32), device=device) / 2, np.array([3.5, -3.5], np.float32))
    check(Tensor(np.array([1, 5], np.int32), device=device) + 0.5, np.array([1.5, 5.5], np.float32))
    b = np.array([True, False, False])
    c = np.array([True, True, False])
    check(Tensor(b, device=device) + Tensor(c, device=device), b | c)
    check(Tensor(b, device=device) * Tensor(c, device=device), b & c)


def test_bool_ops(device, check):
    b = np.array([True, False, True, False])
    c = np.array([True, True, False, False])
    x, y = Tensor(b, device=device), Tensor(c, device=device)
    check(~x, ~b)
    check(x.logical_not(), ~b)
    check(x == y, b == c)
    check(x != y, b != c)
    check(x.maximum(y), b | c)
    check(x.minimum(y), b & c)
    with pytest.raises(RuntimeError):
        x - y
    with pytest.raises(RuntimeError):
        x.neg()


def test_chained_elementwise_against_numpy(make, check):
    x, xe = make(randf(3, 4))
    y, ye = make(randf(3, 4, lo=0.5, hi=2))
    out = ((x * y + 1).relu() / (y + x.abs() + 1)).maximum(x - y)
    expected = np.maximum(np.maximum(xe * ye + 1, 0) / (ye + np.abs(xe) + 1), xe - ye)
    check(out, expected)
