"""Every op family once, against the PYTHON device and numpy: elementwise (integer semantics
included), reductions along each axis, movement, matmul, convolution and pooling, indexing and
gather/scatter, scans and sorting."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.dtype import DType
from ember.testing.checks import assert_same, name, need, same_as_reference, same_as_reference_many, sample, tolerance

RNG = np.random.default_rng(20261123)
INT_DTYPES = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
              dtypes.uint64)


@pytest.mark.parametrize("dt", INT_DTYPES, ids=name)
def test_integer_semantics(device: str, dt: DType) -> None:
    """Wrapping arithmetic, floor division and modulo with signs, shifts and bitwise ops, exactly."""
    need(device, dt)
    a, b = sample(RNG, dt, (64,), wide=True), sample(RNG, dt, (64,), wide=True)
    b = np.where(b == 0, 3, b).astype(b.dtype)
    same_as_reference_many(device, {
        "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y, "idiv": lambda x, y: x // y,
        "mod": lambda x, y: x % y, "and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y,
        "max": lambda x, y: x.maximum(y), "lt": lambda x, y: x < y, "shl": lambda x, y: x << 3,
        "shr": lambda x, y: x >> 2,
        # a wrapped sum compared in the same kernel: C compilers fold x + y < x when overflow is undefined
        # (expressions no other output shares, so the wrapped value is never read back from memory)
        "wrap_cmp": lambda x, y: (x * 2 + y) < y, "wrap_mul_cmp": lambda x, y: (x * 3 - 1) > x - 1,
        "neg_cmp": lambda x, y: (-(x - y)) < y, "cumsum_cmp": lambda x, y: x.cumsum(0) < x}, a, b,
        dtypes_=(dt, dt), exact=True)


@pytest.mark.parametrize("dt", (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64), ids=name)
def test_float_elementwise_with_specials(device: str, dt: DType) -> None:
    """Float ops on NaN, infinities, signed zeros and denormals give the reference's values bit for bit
    where the op is exact (add, mul, max, where, comparisons, abs, neg)."""
    need(device, dt)
    specials = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 1e-40, 6e-8, 3.0, 65504.0, -7.25])
    a, b = np.meshgrid(specials, specials)
    same_as_reference_many(device, {
        "add": lambda x, y: x + y, "mul": lambda x, y: x * y, "max": lambda x, y: x.maximum(y),
        "where": lambda x, y: (x < y).where(x, y), "eq": lambda x, y: x == y, "ne": lambda x, y: x != y,
        "abs": lambda x, y: x.abs() - y.neg(), "isnan": lambda x, y: x.isnan() | y.isinf()},
        a.ravel(), b.ravel(), dtypes_=(dt, dt), exact=True)


@pytest.mark.parametrize("op", ["exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "erf", "exp2", "log2",
                                "pow", "atan", "rsqrt", "floor", "ceil", "round", "trunc"])
def test_transcendental_vs_numpy(device: str, op: str) -> None:
    """float32 math matches numpy (computed in float64) within a few ulp, across a wide argument range."""
    x = np.concatenate([RNG.uniform(-20, 20, 200), RNG.uniform(-1, 1, 50), [0.5, 1.5, 2.5, -0.5, -2.5, 0.0]])
    pos = np.abs(x) + 1e-3
    cases: dict[str, tuple[np.ndarray, Callable[[np.ndarray], Any] | None]] = {
        "exp": (x, np.exp), "log": (pos, np.log), "sqrt": (pos, np.sqrt), "sin": (x, np.sin),
        "cos": (x, np.cos), "tanh": (x, np.tanh), "sigmoid": (x, lambda v: 1 / (1 + np.exp(-v))),
        "erf": (x, None), "exp2": (x, np.exp2), "log2": (pos, np.log2), "pow": (pos, lambda v: v ** 1.7),
        "atan": (x, np.arctan), "rsqrt": (pos, lambda v: 1 / np.sqrt(v)), "floor": (x, np.floor),
        "ceil": (x, np.ceil), "round": (x, np.round), "trunc": (x, np.trunc)}
    data, np_fn = cases[op]
    data = data.astype(np.float32)
    fn = (lambda t: t.pow(1.7)) if op == "pow" else (lambda t: getattr(t, op)())
    got = same_as_reference(device, fn, data, rtol=4e-6, atol=1e-6)
    if np_fn is not None:
        np.testing.assert_allclose(got, np_fn(data.astype(np.float64)), rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.int32, dtypes.float16, dtypes.uint8, dtypes.bool), ids=name)
def test_reductions_along_each_axis(device: str, dt: DType) -> None:
    """sum/max/min/prod (and mean for floats) over every axis, all axes and pairs, with and without keepdim."""
    need(device, dt)
    x = sample(RNG, dt, (3, 5, 7))
    if dt.kind in "iu":
        x = (x % 4).astype(x.dtype)  # prod of up to 105 small values fits after wrap-free ranges are not needed
    ops = ["sum", "max", "min"] + (["mean"] if dt.kind == "f" else []) + (["prod"] if dt.kind != "b" else [])
    fns: dict[str, Callable[..., Tensor]] = {
        f"{op}(axis={axis}, keepdim={keep})": (lambda t, op=op, axis=axis, keep=keep:
                                               getattr(t, op)(axis, keepdim=keep))
        for axis in (0, 1, 2, -1, None, (0, 2), (1, 2)) for keep in (False, True) for op in ops}
    if dt == dtypes.bool:
        fns.update({"any(1)": lambda t: t.any(1), "all(2)": lambda t: t.all(2)})
    same_as_reference_many(device, fns, x, dtypes_=(dt,), **tolerance(dt))


def test_argmax_argmin_ties(device: str) -> None:
    """argmax/argmin pick the first of equal values, along each axis."""
    x = RNG.integers(0, 3, (4, 6, 5)).astype(np.float32)
    axes = (0, 1, 2, None)
    got = same_as_reference_many(device, {**{f"argmax({a})": (lambda t, a=a: t.argmax(a)) for a in axes},
                                          **{f"argmin({a})": (lambda t, a=a: t.argmin(a)) for a in axes}}, x)
    for a in axes:
        np.testing.assert_array_equal(got[f"argmax({a})"], np.argmax(x, a))
        np.testing.assert_array_equal(got[f"argmin({a})"], np.argmin(x, a))


def test_movement(device: str) -> None:
    """reshape, permute, expand, pad, shrink, flip, strided slices, cat, stack, repeat, roll, transpose."""
    x = sample(RNG, dtypes.float32, (4, 6))
    y = sample(RNG, dtypes.float32, (4, 6))
    cases = {"permute": lambda t, u: t.permute(1, 0) * 2, "flip": lambda t, u: t.flip((0, 1)) + 1,
             "pad": lambda t, u: t.pad(((1, 2), (3, 0))) - 1, "shrink": lambda t, u: t.shrink(((1, 3), (2, 5))) * 3,
             "expand": lambda t, u: t.reshape(2, 1, 12).expand(2, 3, 12) + 0,
             "slices": lambda t, u: t[::-1, 1::2] + u[:, ::2].flip(0),
             "cat": lambda t, u: t.cat(u, dim=1) * 1, "stack": lambda t, u: Tensor.stack(t, u, dim=1) + 0,
             "repeat": lambda t, u: t.repeat(2, 3) * 1, "roll": lambda t, u: t.roll(2, 1) + 0,
             "transpose": lambda t, u: t.T @ u, "pad_shrink": lambda t, u: t.pad(((2, 2), (2, 2)))[1:-3, 3:-1] + u}
    same_as_reference_many(device, cases, x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32),
                         ids=name)
def test_matmul(device: str, dt: DType) -> None:
    """Matmul with prime sizes, a vector operand and a batch, against the reference and numpy."""
    need(device, dt)
    for sa, sb in (((17, 31), (31, 13)), ((31,), (31, 5)), ((3, 7, 11), (11, 2)), ((1, 1), (1, 1))):
        a, b = sample(RNG, dt, sa), sample(RNG, dt, sb)
        got = same_as_reference(device, lambda t, u: t @ u, a, b, dtypes_=(dt, dt), **tolerance(dt))
        if dt in (dtypes.float32, dtypes.float64, dtypes.int32):
            want = np.matmul(a, b)
            assert_same(got, want.astype(got.dtype), what=f"{sa} @ {sb} vs numpy", rtol=1e-4, atol=1e-4)


def test_conv_and_pool(device: str) -> None:
    """conv2d (stride, padding, dilation, groups), conv_transpose2d, max and average pooling."""
    x = sample(RNG, dtypes.float32, (2, 4, 11, 9))
    w = sample(RNG, dtypes.float32, (6, 2, 3, 3))
    cases = {"conv": lambda t, k: t.conv2d(k, stride=2, padding=1, groups=2),
             "conv_dilated": lambda t, k: t.conv2d(k, dilation=2, groups=2),
             "conv_t": lambda t, k: t.conv_transpose2d(k.reshape(4, 3, 3, 3), stride=2),
             "max_pool": lambda t, k: t.max_pool2d(3, stride=2), "avg_pool": lambda t, k: t.avg_pool2d(2)}
    same_as_reference_many(device, cases, x, w, rtol=1e-5, atol=1e-5)
    # a 1x1 convolution is a matmul over channels: an independent numpy check
    k = sample(RNG, dtypes.float32, (5, 4, 1, 1))
    got = Tensor(x, device=device, dtype=dtypes.float32).conv2d(Tensor(k, dtype=dtypes.float32, device=device)).numpy()
    np.testing.assert_allclose(got, np.einsum("oc,bchw->bohw", k[:, :, 0, 0], x), rtol=1e-4, atol=1e-4)


def test_indexing_and_gather(device: str) -> None:
    """Tensor indexing, gather, index_select, scatter, masked_fill, one_hot and where."""
    x = sample(RNG, dtypes.float32, (5, 7))
    idx = RNG.integers(0, 5, (3, 7))
    cases = {"gather": lambda t, i: t.gather(0, i), "index": lambda t, i: t[i[0]],
             "index_2d": lambda t, i: t[i[0], i[1]], "index_select": lambda t, i: t.index_select(0, i[1]),
             "scatter": lambda t, i: t.scatter(0, i, 1.5), "scatter_add": lambda t, i: t.scatter_add(0, i, t[:3]),
             "masked_fill": lambda t, i: t.masked_fill(t > 0, -1.0), "one_hot": lambda t, i: i.one_hot(5) * 1}
    same_as_reference_many(device, cases, x, idx, dtypes_=(None, dtypes.int32))
    got = Tensor(x, device=device).gather(0, Tensor(idx, dtype=dtypes.int32, device=device)).numpy()
    np.testing.assert_array_equal(got, np.take_along_axis(x, idx, 0))


def test_scans(device: str) -> None:
    """cumsum/cumprod/cummax along each axis, logcumsumexp, and an integer cumsum that wraps."""
    x = sample(RNG, dtypes.float32, (4, 9))
    for axis in (0, 1):
        got = same_as_reference(device, lambda t, axis=axis: t.cumsum(axis), x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, np.cumsum(x.astype(np.float32), axis), rtol=1e-5, atol=1e-5)
        same_as_reference(device, lambda t, axis=axis: t.cumprod(axis), x * 0.5 + 1, rtol=1e-5, atol=1e-5)
        same_as_reference(device, lambda t, axis=axis: t.cummax(axis)[0], x)
        same_as_reference(device, lambda t, axis=axis: t.logcumsumexp(axis), x, rtol=1e-5, atol=1e-5)
    big = np.full(300, 100, np.int64)
    same_as_reference(device, lambda t: t.cumsum(0), big, dtypes_=(dtypes.int8,), exact=True)


@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.int32), ids=name)
def test_sort_argsort_topk(device: str, dt: DType) -> None:
    """sort (both directions) and topk values match numpy; argsort indices select the sorted values."""
    x = sample(RNG, dt, (3, 37))
    got = same_as_reference(device, lambda t: t.sort(1)[0], x, dtypes_=(dt,), exact=True)
    np.testing.assert_array_equal(got, np.sort(x.astype(got.dtype), 1))
    same_as_reference(device, lambda t: t.sort(0, descending=True)[0], x, dtypes_=(dt,), exact=True)
    same_as_reference(device, lambda t: t.topk(5, 1)[0], x, dtypes_=(dt,), exact=True)
    order = Tensor(x, dtype=dt, device=device).argsort(1).numpy()
    np.testing.assert_array_equal(np.take_along_axis(x.astype(got.dtype), order, 1), np.sort(x.astype(got.dtype), 1))
