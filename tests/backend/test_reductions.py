"""Reductions, softmax and cumulative scans against torch: values, shapes, dtypes, gradients and errors.

Every op runs on several shapes (0-d, size-0, 1-d, 3-d), axes (None, int, negative, tuple) and keepdim,
on contiguous and non-contiguous inputs, on every backend device.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import assert_like, builtin_error, check_grad, laid_out, rand, same_error, tg_acc, tg_index

from ember import GlobalCounters, Tensor, dtypes

torch = pytest.importorskip("torch")

NP2T = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64, np.dtype(np.float16): torch.float16,
        np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.int16): torch.int16,
        np.dtype(np.int8): torch.int8, np.dtype(np.uint8): torch.uint8, np.dtype(np.bool_): torch.bool}


def both(ours: Callable[[], Any], theirs: Callable[[], Any]) -> tuple[Any, Any] | None:
    """Run torch; when it raises, ember must raise the same type (returns None), else both results."""
    try:
        ref = theirs()
    except Exception as e:  # noqa: BLE001
        with pytest.raises(builtin_error(e)):
            ours()
        return None
    return ours(), ref


LAYOUTS = ("contiguous", "permuted", "flipped", "shrunk")


def tdims(t: Any, axis: Any) -> Any:
    """torch's dim argument for an ember axis argument (None: every dim)."""
    return tuple(range(t.ndim)) if axis is None else axis


def torch_prod(t: Any, axis: Any, keepdim: bool) -> Any:
    """torch.prod over several dims (torch only takes one)."""
    dims = sorted({d % max(t.ndim, 1) for d in ((axis,) if isinstance(axis, int) else tdims(t, axis))}, reverse=True)
    if t.ndim == 0:
        return t.prod()
    out = t
    for d in dims:
        out = out.prod(d, keepdim=True)
    return out if keepdim else out.reshape([s for i, s in enumerate(t.shape) if i not in dims])


# name: (ember op, torch op, differentiable)
REDUCE_OPS: dict[str, tuple[Callable, Callable, bool]] = {
    "sum": (lambda t, ax, kd: t.sum(ax, keepdim=kd), lambda t, ax, kd: t.sum(dim=tdims(t, ax), keepdim=kd), True),
    "mean": (lambda t, ax, kd: t.mean(ax, keepdim=kd), lambda t, ax, kd: t.mean(dim=tdims(t, ax), keepdim=kd), True),
    "prod": (lambda t, ax, kd: t.prod(ax, keepdim=kd), torch_prod, True),
    "max": (lambda t, ax, kd: t.max(ax, keepdim=kd),
            lambda t, ax, kd: t.amax() if ax is None and not kd else t.amax(dim=tdims(t, ax), keepdim=kd), True),
    "min": (lambda t, ax, kd: t.min(ax, keepdim=kd),
            lambda t, ax, kd: t.amin() if ax is None and not kd else t.amin(dim=tdims(t, ax), keepdim=kd), True),
    "var": (lambda t, ax, kd: t.var(ax, keepdim=kd), lambda t, ax, kd: t.var(dim=tdims(t, ax), keepdim=kd), True),
    "std": (lambda t, ax, kd: t.std(ax, keepdim=kd), lambda t, ax, kd: t.std(dim=tdims(t, ax), keepdim=kd), True),
    "logsumexp": (lambda t, ax, kd: t.logsumexp(ax, keepdim=kd),
                  lambda t, ax, kd: t.logsumexp(dim=tdims(t, ax), keepdim=kd), True),
    "any": (lambda t, ax, kd: (t > 0.5).any(ax, keepdim=kd),
            lambda t, ax, kd: (t > 0.5).any(dim=tdims(t, ax), keepdim=kd), False),
    "all": (lambda t, ax, kd: (t > -1.0).all(ax, keepdim=kd),
            lambda t, ax, kd: (t > -1.0).all(dim=tdims(t, ax), keepdim=kd), False),
    "argmax": (lambda t, ax, kd: t.argmax(ax, keepdim=kd), lambda t, ax, kd: tg_index(t.argmax(ax, keepdim=kd)), False),
    "argmin": (lambda t, ax, kd: t.argmin(ax, keepdim=kd), lambda t, ax, kd: tg_index(t.argmin(ax, keepdim=kd)), False),
}

# (shape, axis, keepdim, check the gradient too)
REDUCE_CASES = [
    ((2, 3, 4), 1, True, True),
    ((2, 3, 4), (0, -1), False, True),
    ((2, 3, 4), None, False, False),
    ((), None, False, True),
    ((), 0, True, True),
    ((3, 0), 1, False, True),
    ((3, 0), 0, True, True),
    ((3, 0), None, False, True),
]


# --- reductions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", REDUCE_OPS)
@pytest.mark.parametrize("shape, axis, keepdim, grad", REDUCE_CASES, ids=lambda v: str(v).replace(" ", ""))
def test_reduce(device, name, shape, axis, keepdim, grad):
    ours, theirs, differentiable = REDUCE_OPS[name]
    if name.startswith("arg") and isinstance(axis, tuple):
        pytest.skip("argmax/argmin take one axis")
    a = rand(*shape, low=0.5) if name == "prod" else rand(*shape)
    res = both(lambda: ours(Tensor(a, device=device), axis, keepdim), lambda: theirs(torch.tensor(a), axis, keepdim))
    if res is None:
        return
    assert_like(*res)
    if differentiable and grad:
        check_grad(device, lambda t: ours(t, axis, keepdim), lambda t: theirs(t, axis, keepdim), a)


# name: (ember op, torch op, differentiable), each applied along axis 1 of a 3-d tensor
AXIS1_OPS: dict[str, tuple[Callable, Callable, bool]] = {
    "sum": (lambda t: t.sum(1), lambda t: t.sum(1), True),
    "max": (lambda t: t.max(1), lambda t: t.amax(1), True),
    "var": (lambda t: t.var(1), lambda t: t.var(1), True),
    "argmax": (lambda t: t.argmax(1), lambda t: tg_index(t.argmax(1)), False),
    "softmax": (lambda t: t.softmax(1), lambda t: t.softmax(1), True),
    "cumsum": (lambda t: t.cumsum(1), lambda t: t.cumsum(1), True),
}


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_non_contiguous_inputs(device, layout):
    a = rand(3, 4, 5, seed=1, low=0.5)
    base, view_e, view_t = laid_out(a, layout)
    for ours, theirs, differentiable in AXIS1_OPS.values():
        if differentiable:
            check_grad(device, lambda t, f=ours: f(view_e(t)), lambda t, f=theirs: f(view_t(t)), base)
        else:
            assert_like(ours(view_e(Tensor(base, device=device))), theirs(view_t(torch.tensor(base))))


def test_reduce_expanded_and_broadcast_input(device):
    a = rand(3, 1, 4)
    check_grad(device, lambda t: t.expand(3, 5, 4).sum(1), lambda t: t.expand(3, 5, 4).sum(1), a)
    check_grad(device, lambda t: t.expand(3, 5, 4).max(1), lambda t: t.expand(3, 5, 4).amax(1), a)
    check_grad(device, lambda t: t.expand(3, 5, 4).var((0, 1)), lambda t: t.expand(3, 5, 4).var((0, 1)), a)
    b = rand(4, seed=2)
    check_grad(device, lambda t, u: (t * u).logsumexp(-1), lambda t, u: (t * u).logsumexp(-1), a, b)


@pytest.mark.parametrize("correction, axis", [(0, None), (2, 1)])
def test_var_std_correction(device, correction, axis):
    a = rand(3, 4)
    if True:
        dims = (0, 1) if axis is None else axis
        check_grad(device, lambda t, ax=axis: t.var(ax, correction=correction),
                   lambda t, ax=dims: t.var(ax, correction=correction), a)
        check_grad(device, lambda t, ax=axis: t.std(ax, keepdim=True, correction=correction),
                   lambda t, ax=dims: t.std(ax, keepdim=True, correction=correction), a)


def test_var_correction_at_least_count(device):
    # no degrees of freedom left: inf (or nan for 0/0), like torch
    a = rand(3, 4)
    x, t = Tensor(a, device=device), torch.tensor(a)
    for axis, correction in ((1, 4), (1, 5), (None, 12), (0, 7)):
        dims = (0, 1) if axis is None else axis
        assert_like(x.var(axis, correction=correction), t.var(dims, correction=correction))
    assert_like(Tensor(np.ones((3, 4), np.float32), device=device).var(1, correction=5),
                torch.ones(3, 4).var(1, correction=5))


def test_var_mean_std_mean(device):
    a = rand(4, 5)
    x, t = Tensor(a, device=device), torch.tensor(a)
    for ours, theirs in ((x.var_mean(1), torch.var_mean(t, 1)), (x.std_mean(0, keepdim=True, correction=0),
                                                                   torch.std_mean(t, 0, keepdim=True, correction=0)),
                         (x.var_mean(), torch.var_mean(t))):
        assert isinstance(ours, tuple) and len(ours) == 2
        assert_like(ours[0], theirs[0])
        assert_like(ours[1], theirs[1])


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_prod_gradient_with_zeros(device, axis):
    for zeros in ([], [(0, 1)], [(0, 1), (1, 2)], [(0, 1), (0, 3)], [(0, 0), (0, 1), (0, 2), (0, 3)]):
        a = rand(3, 4, low=0.5)
        for ij in zeros:
            a[ij] = 0.0
        check_grad(device, lambda t: t.prod(axis), lambda t: torch_prod(t, axis, False), a)


def test_max_min_gradient_ties(device):
    # ember splits the gradient evenly between tied maxima, like torch.amax (full and per-axis alike)
    a = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0], [5.0, 4.0, 5.0, 5.0]], np.float32)
    for axis in ((0, 1), 1):
        dims = tdims(a, axis)
        check_grad(device, lambda t, ax=axis: t.max(ax), lambda t, ax=dims: t.amax(ax), a)
        check_grad(device, lambda t, ax=axis: t.min(ax, keepdim=True), lambda t, ax=dims: t.amin(ax, keepdim=True), -a)
    # torch.max() without a dim also splits evenly
    check_grad(device, lambda t: t.max(), lambda t: t.max(), a)


def test_max_min_gradient_matches_torch_max_dim_without_ties(device):
    # torch.max(dim) routes the gradient to the returned index; with a unique maximum that is the same thing
    a = rand(4, 6, seed=3)
    check_grad(device, lambda t: t.max(0), lambda t: t.max(0).values, a)
    check_grad(device, lambda t: t.min(-1, keepdim=True), lambda t: t.min(-1, keepdim=True).values, a)


def test_max_min_nan_propagates(device):
    a = np.array([[1.0, np.nan, 3.0], [0.5, 0.2, -1.0]], np.float32)
    x, t = Tensor(a, device=device), torch.tensor(a)
    for axis in (None, 0, 1):
        assert_like(x.max(axis), t.amax(tdims(t, axis)))
        assert_like(x.min(axis), t.amin(tdims(t, axis)))


def test_argmax_argmin_ties_and_nan(device):
    a = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0], [np.nan, 4.0, np.nan, -7.0], [0.0, -7.0, 0.0, -7.0]],
                 np.float32)
    x, t = Tensor(a, device=device), torch.tensor(a)
    assert_like(x.argmax(), tg_index(t.argmax()))
    assert_like(x.argmin(0, keepdim=True), tg_index(t.argmin(0, keepdim=True)))
    assert_like(x.argmax(-1), tg_index(t.argmax(-1)))
    ints = np.array([[3, 1, 3], [-2, -2, 7]], np.int32)
    assert_like(Tensor(ints, device=device).argmin(0), tg_index(torch.tensor(ints).argmin(0)))
    u8 = np.array([0, 255, 7, 255], np.uint8)
    assert_like(Tensor(u8, device=device).argmin(), tg_index(torch.tensor(u8).argmin()))


def test_any_all(device):
    a = np.array([[0.0, 0.0, 1.5], [0.0, 0.0, 0.0], [np.nan, 2.0, -1.0]], np.float32)
    x, t = Tensor(a, device=device), torch.tensor(a)
    for axis, kd in ((None, False), (0, True), ((0, 1), True)):
        assert_like(x.any(axis, keepdim=kd), t.any(tdims(t, axis), keepdim=kd))
        assert_like(x.all(axis, keepdim=kd), t.all(tdims(t, axis), keepdim=kd))
    for arr in (np.array([3, 0, 255], np.uint8), np.array([True, False]), np.zeros((0, 2), np.int32), np.int64(0)):
        x, t = Tensor(arr, device=device), torch.tensor(arr)
        assert_like(x.any(), t.any())
        assert_like(x.all(), t.all())
    assert_like(Tensor(np.zeros((0, 2)), device=device).any(0), torch.zeros(0, 2, dtype=torch.float64).any(0))


DTYPE_ARRAYS = {
    "bool": np.array([[True, False, True], [True, True, False]]),
    "uint8": np.array([[3, 0, 255], [1, 2, 3]], np.uint8),
    "int32": np.array([[-3, 10, 7], [100000, 2, -3]], np.int32),
    "float16": np.array([[0.5, -1.5, 2.25], [1.0, 3.0, -0.125]], np.float16),
    "float64": np.array([[0.5, -1.5, 2.25], [1.0, 3.0, -0.125]], np.float64),
}

# torch's results in tinygrad's dtypes: sums of bool and narrow ints in int32 (uint32), indices int32, and the
# mean of integers a float (torch refuses it)
DTYPE_OPS = {
    "sum": (lambda t: t.sum(), lambda t: tg_acc(t.sum(), t.dtype)),
    "prod": (lambda t: t.prod(0), lambda t: tg_acc(t.prod(0), t.dtype)),
    "max": (lambda t: t.max(1), lambda t: t.amax(1)),
    "mean": (lambda t: t.mean(0), lambda t: t.float().mean(0) if t.dtype in (torch.bool, torch.uint8, torch.int32)
             else t.mean(0)),
    "var": (lambda t: t.var(1), lambda t: t.var(1)),
    "any": (lambda t: t.any(1), lambda t: t.any(1)),
    "argmin": (lambda t: t.argmin(), lambda t: tg_index(t.argmin())),
    "logsumexp": (lambda t: t.logsumexp(1), lambda t: t.logsumexp(1)),
    "cumsum": (lambda t: t.cumsum(1), lambda t: tg_acc(t.cumsum(1), t.dtype)),
    "softmax": (lambda t: t.softmax(1), lambda t: t.softmax(1)),
}


@pytest.mark.parametrize("dt", DTYPE_ARRAYS)
def test_output_dtypes(device, dt):
    a = DTYPE_ARRAYS[dt]
    for name, (ours, theirs) in DTYPE_OPS.items():
        if dt == "float16" and name in ("var", "logsumexp", "softmax"):
            continue  # torch's CPU half kernels for these accumulate differently; dtype checked below
        if dt == "bool" and name in ("argmax", "argmin"):
            continue  # torch refuses bool; ember ranks False < True as tinygrad does (test_tinygrad_residue.py)
        res = both(lambda f=ours: f(Tensor(a, device=device)), lambda f=theirs: f(torch.tensor(a)))
        if res is not None:
            assert_like(*res, atol=1e-2 if dt == "float16" else 1e-6)
    if dt == "float16":
        x = Tensor(a, device=device)
        assert x.var(1).dtype == x.logsumexp(1).dtype == x.softmax().dtype == x.cumprod(0).dtype == dtypes.float16


def test_sum_prod_dtype_argument(device):
    a = DTYPE_ARRAYS["int32"]
    x, t = Tensor(a, device=device), torch.tensor(a)
    assert_like(x.sum(dtype=dtypes.float64), t.sum(dtype=torch.float64))
    assert_like(x.sum(0, dtype="int32"), t.sum(0, dtype=torch.int32))
    assert_like(x.prod(1, dtype=dtypes.float32), t.prod(1, dtype=torch.float32))
    h = Tensor(np.full(4096, 1.0, np.float16), device=device)
    assert h.sum().item() == 4096.0  # accumulates in float32: a float16 accumulator would stop at 2048


@pytest.mark.parametrize("call", [
    "max_empty", "min_empty_dim", "argmax_empty", "argmax_empty_dim", "sum_dim_out_of_range", "max_dim_out_of_range",
    "var_int", "sum_repeated_dim", "cumsum_dim_out_of_range",
    "softmax_int", "softmax_dim_out_of_range", "logsumexp_dim_out_of_range", "cummax_dim_out_of_range",
])
def test_errors(device, call):
    f = np.zeros((3, 0), np.float32)
    g = rand(2, 3)
    calls = {
        "max_empty": (f, lambda t: t.max(), lambda t: t.amax()),
        "min_empty_dim": (f, lambda t: t.min(1), lambda t: t.amin(1)),
        "argmax_empty": (f, lambda t: t.argmax(), lambda t: t.argmax()),
        "argmax_empty_dim": (f, lambda t: t.argmax(1), lambda t: t.argmax(1)),
        "sum_dim_out_of_range": (g, lambda t: t.sum(2), lambda t: t.sum(2)),
        "max_dim_out_of_range": (g, lambda t: t.max(-3), lambda t: t.amax(-3)),
        "var_int": (np.arange(3), lambda t: t.var(), lambda t: t.var()),
        "argmax_bool": (g > 0, lambda t: t.argmax(), lambda t: t.argmax()),
        "argmin_bool": (g > 0, lambda t: t.argmin(0), lambda t: t.argmin(0)),
        "sum_repeated_dim": (g, lambda t: t.sum((0, 0)), lambda t: t.sum((0, 0))),
        "cumsum_dim_out_of_range": (g, lambda t: t.cumsum(2), lambda t: t.cumsum(2)),
        "softmax_int": (np.arange(3), lambda t: t.softmax(), lambda t: t.softmax(-1)),
        "softmax_dim_out_of_range": (g, lambda t: t.softmax(3), lambda t: t.softmax(3)),
        "logsumexp_dim_out_of_range": (g, lambda t: t.logsumexp(2), lambda t: t.logsumexp(2)),
        "cummax_dim_out_of_range": (g, lambda t: t.cummax(-3), lambda t: t.cummax(-3)),
    }
    a, ours, theirs = calls[call]
    same_error(lambda: ours(Tensor(a, device=device)), lambda: theirs(torch.tensor(a)))


def test_logsumexp_stable_and_infinite(device):
    a = np.array([[1000.0, 1000.5, -1000.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0], [-1e4, -1e4, -1e4]],
                 np.float32)
    x, t = Tensor(a, device=device), torch.tensor(a)
    assert_like(x.logsumexp(1), t.logsumexp(1))
    assert_like(x.logsumexp(0, keepdim=True), t.logsumexp(0, keepdim=True))
    assert_like(Tensor(np.arange(4), device=device).logsumexp(0), torch.arange(4).logsumexp(0))
    finite = a[[0, 3]]
    check_grad(device, lambda t: t.logsumexp(1), lambda t: t.logsumexp(1), finite)


# --- softmax ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, axis", [((2, 5), -1), ((3, 4, 5), 0), ((), -1), ((3, 0), -1), ((3, 0), 0)],
                         ids=lambda v: str(v).replace(" ", ""))
def test_softmax(device, name, shape, axis):
    a = rand(*shape) * 3
    check_grad(device, lambda t: getattr(t, name)(axis), lambda t: getattr(t, name)(axis), a)


def test_softmax_stable_and_dtype(device):
    a = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], np.float32)
    check_grad(device, lambda t: t.softmax(), lambda t: t.softmax(-1), a)
    check_grad(device, lambda t: t.log_softmax(), lambda t: t.log_softmax(-1), a)
    x, t = Tensor(a, device=device), torch.tensor(a)
    assert_like(x.log_softmax(1, dtype="float64"), t.log_softmax(1, dtype=torch.float64))
    i = np.array([[1, 2, 3]])
    assert_like(Tensor(i, device=device).softmax(dtype=dtypes.float32), torch.tensor(i).softmax(-1, torch.float32))


def test_softmax_is_three_kernels(device):
    x = Tensor(rand(16, 10), device=device).realize()
    GlobalCounters.reset()
    x.softmax().realize()
    assert GlobalCounters.kernel_count <= 3
    GlobalCounters.reset()
    x.log_softmax(0).realize()
    assert GlobalCounters.kernel_count <= 3


def test_sum_is_one_kernel(device):
    x = Tensor(rand(8, 9), device=device).realize()
    GlobalCounters.reset()
    x.sum().realize()
    assert GlobalCounters.kernel_count == 1
    GlobalCounters.reset()
    x.sum(0).realize()
    assert GlobalCounters.kernel_count == 1


# --- cumulative scans ------------------------------------------------------------------------------
SCAN_OPS: dict[str, tuple[Callable, Callable]] = {
    "cumsum": (lambda t, d: t.cumsum(d), lambda t, d: t.cumsum(d)),
    "cumprod": (lambda t, d: t.cumprod(d), lambda t, d: t.cumprod(d)),
    "cummax": (lambda t, d: t.cummax(d)[0], lambda t, d: t.cummax(d)[0]),
    "cummin": (lambda t, d: t.cummin(d)[0], lambda t, d: t.cummin(d)[0]),
    "logcumsumexp": (lambda t, d: t.logcumsumexp(d), lambda t, d: t.logcumsumexp(d)),
}


@pytest.mark.parametrize("name", SCAN_OPS)
@pytest.mark.parametrize("shape, axis", [((7,), 0), ((2, 3, 4), -1), ((), 0), ((0, 3), 0), ((3, 0), 0), ((1, 1), 1)],
                         ids=lambda v: str(v).replace(" ", ""))
def test_scan(device, name, shape, axis):
    ours, theirs = SCAN_OPS[name]
    a = rand(*shape, seed=5, low=0.5) if name == "cumprod" else rand(*shape, seed=5)
    check_grad(device, lambda t: ours(t, axis), lambda t: theirs(t, axis), a)
    if name in ("cummax", "cummin"):
        assert_like(getattr(Tensor(a, device=device), name)(axis)[1], tg_index(getattr(torch.tensor(a), name)(axis)[1]))


def test_scan_default_axis_is_zero(device):
    a = rand(3, 4)
    x, t = Tensor(a, device=device), torch.tensor(a)
    assert_like(x.cumsum(), t.cumsum(0))
    assert_like(x.cummax()[1], tg_index(t.cummax(0)[1]))
    assert_like(x.logcumsumexp(), t.logcumsumexp(0))


def test_cumprod_gradient_with_zeros(device):
    for zeros in ([2], [0], [1, 4], [5], [0, 3, 5]):
        a = rand(6, seed=7, low=0.5)
        a[zeros] = 0.0
        check_grad(device, lambda t: t.cumprod(0), lambda t: t.cumprod(0), a)
    b = rand(3, 4, seed=8, low=0.5)
    b[1, 2] = b[2, 0] = 0.0
    check_grad(device, lambda t: t.cumprod(1), lambda t: t.cumprod(1), b)


def test_cummax_cummin_ties_and_nan(device):
    a = np.array([[1.0, 1.0, 0.0, 1.0, 3.0, 3.0, -2.0], [1.0, np.nan, 3.0, np.nan, 5.0, -1.0, 9.0],
                  [0.0, -0.0, 0.0, -5.0, -5.0, 7.0, 7.0]], np.float32)
    x, t = Tensor(a, device=device), torch.tensor(a)
    for name in ("cummax", "cummin"):
        (v, i), (tv, ti) = getattr(x, name)(1), getattr(t, name)(1)
        assert_like(v, tv)
        assert_like(i, tg_index(ti))
    ints = np.array([3, 1, 3, 5, 5, -2], np.int32)
    for name in ("cummax", "cummin"):
        for arr in (ints, ints > 2):
            (v, i), (tv, ti) = getattr(Tensor(arr, device=device), name)(0), getattr(torch.tensor(arr), name)(0)
            assert_like(v, tv)
            assert_like(i, tg_index(ti))
    # gradient of the values with a unique running maximum equals torch's (which routes it to the index)
    check_grad(device, lambda t: t.cummax(0)[0], lambda t: t.cummax(0)[0], rand(9, seed=9))


def test_cumsum_is_one_kernel(device):
    x = Tensor(rand(4, 300), device=device).realize()
    GlobalCounters.reset()
    x.cumsum(1).realize()
    assert GlobalCounters.kernel_count == 1


def test_long_scans_are_split(device):
    # 1e5 elements: two levels of ~316-element blocks (O(n^1.5) work) in at most 4 kernels
    if device == "PYTHON":
        pytest.skip("the PYTHON interpreter is too slow for 1e5-element scans")
    n = 100_000
    a = np.random.default_rng(10).standard_normal(n).astype(np.float32)
    x = Tensor(a, device=device).realize()
    GlobalCounters.reset()
    out = x.cumsum().realize()
    assert GlobalCounters.kernel_count <= 4
    np.testing.assert_allclose(out.numpy(), np.cumsum(a.astype(np.float64)), atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("name", ["cumsum", "cummax", "logcumsumexp"])
def test_scans_above_split_threshold(device, name):
    ours, theirs = SCAN_OPS[name]
    a = rand(2, 700, seed=11)  # above SCAN_SPLIT = 512: the two-level path
    check_grad(device, lambda t: ours(t, 1), lambda t: theirs(t, 1), a, fwd={"atol": 1e-4, "rtol": 1e-3},
               bwd={"atol": 1e-3, "rtol": 1e-3})
    if name == "cummax":
        a[0, 100:] = a[0, 99]  # a long tie: indices must follow the latest equal element
        a[1, 650] = np.nan
        assert_like(Tensor(a, device=device).cummax(1)[1], tg_index(torch.tensor(a).cummax(1)[1]))


def test_logcumsumexp_wide_range_and_infinities(device):
    a = np.array([-1000.0, 0.0, -5.0, 1000.0, -np.inf, 3.0], np.float32)
    assert_like(Tensor(a, device=device).logcumsumexp(0), torch.tensor(a).logcumsumexp(0))
    b = np.array([-np.inf, -np.inf, 2.0, np.inf, 1.0], np.float32)
    assert_like(Tensor(b, device=device).logcumsumexp(0), torch.tensor(b).logcumsumexp(0))
    check_grad(device, lambda t: t.logcumsumexp(0), lambda t: t.logcumsumexp(0), a[:4])


def test_cumsum_int_and_bool(device):
    for arr in (np.array([[1, 2], [3, 4]], np.int32), np.array([True, True, False, True]),
                np.array([200, 100, 50], np.uint8), np.int64(7)):
        x, t = Tensor(arr, device=device), torch.tensor(arr)
        assert_like(x.cumsum(0), tg_acc(t.cumsum(0), t.dtype))
        assert_like(x.cumprod(0), tg_acc(t.cumprod(0), t.dtype))


def test_cummax_zero_dim(device):
    v, i = Tensor(np.float32(2.5), device=device).cummax(0)
    tv, ti = torch.tensor(np.float32(2.5)).cummax(0)
    assert_like(v, tv)
    assert_like(i, tg_index(ti))
    assert math.isclose(Tensor(np.float32(2.5), device=device).logcumsumexp(0).item(), 2.5)
