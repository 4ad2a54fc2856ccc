"""Tensor methods that tinygrad has, checked against torch: values, shapes, dtypes, gradients and errors.

isclose/allclose, is_floating_point, const_like, fmod, copysign, logaddexp, softmin, normalize, diag,
diagonal, sort/argsort/topk, unfold, rearrange, to_, sequential, max_unpool2d and random_bits. Several
results of one shape are stacked into one tensor where natural, so each check compiles few kernels.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import pytest
from backend_utils import tg_index

from ember import Device, Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

T2E = {torch.float32: dtypes.float32, torch.float64: dtypes.float64, torch.float16: dtypes.float16,
       torch.bfloat16: dtypes.bfloat16, torch.int64: dtypes.int64, torch.int32: dtypes.int32,
       torch.int16: dtypes.int16, torch.int8: dtypes.int8, torch.uint8: dtypes.uint8, torch.bool: dtypes.bool}

rng = np.random.default_rng(11)


def q(*shape: int) -> np.ndarray:
    """Random float32 multiples of 1/8 in [-2, 2] (exact in every float type used here)."""
    return (rng.integers(-16, 17, size=shape) / 8).astype(np.float32)


def unique(*shape: int) -> np.ndarray:
    """Distinct float32 values in random order (no ties, so every op has one right answer)."""
    n = int(np.prod(shape))
    return (rng.permutation(n) / 4 - n / 8).astype(np.float32).reshape(shape)


def check(got: Tensor, want: Any, exact: bool = False, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """``got`` has the shape, dtype and values of the torch tensor ``want`` (nan equals nan)."""
    assert got.shape == tuple(want.shape), f"shape {got.shape} != {tuple(want.shape)}"
    assert got.dtype == T2E[want.dtype], f"dtype {got.dtype} != {want.dtype}"
    w = want.detach().float().numpy() if want.dtype == torch.bfloat16 else want.detach().numpy()
    g = got.numpy()
    if exact or w.dtype.kind in "biu":
        np.testing.assert_array_equal(g, w)
    else:
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


def check_grad(device: str, ours: Callable[..., Tensor], theirs: Callable[..., Any], arrays: Sequence[np.ndarray],
               rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Forward values and the gradient of ``sum(out * w)`` for every input, against torch."""
    e_in = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    e_out, t_out = ours(*e_in), theirs(*t_in)
    check(e_out, t_out, rtol=rtol, atol=atol)
    w = q(*t_out.shape)
    (e_out * Tensor(w, device=device)).sum().backward()
    (t_out * torch.tensor(w)).sum().backward()
    for e, t in zip(e_in, t_in):
        assert e.grad is not None, "no gradient reached an input"
        check(e.grad, t.grad, rtol=rtol, atol=atol)


def stacked(results: Sequence[Tensor]) -> np.ndarray:
    """Several results of one shape read back through one stacked tensor (one kernel for elementwise ones)."""
    return Tensor.stack(*results).numpy()


# --------------------------------------------------------------------------------------------------
# isclose / allclose / is_floating_point / const_like
# --------------------------------------------------------------------------------------------------
def test_isclose_floats(device):
    a = np.array([1.0, 1e-7, 1e-9, math.nan, math.inf, -math.inf, math.inf, 1.0, 100.0, 0.0], np.float32)
    b = np.array([1.0 + 1e-6, 0.0, 0.0, math.nan, math.inf, math.inf, 1e30, 1.1, 100.5, -0.0], np.float32)
    ea, eb = Tensor(a, device=device), Tensor(b, device=device)
    ta, tb = torch.tensor(a), torch.tensor(b)
    cases = [({}, {}), ({"equal_nan": True}, {"equal_nan": True}), ({"rtol": 0.01}, {"rtol": 0.01}),
             ({"atol": 0.2, "rtol": 0.0}, {"atol": 0.2, "rtol": 0.0}), ({"rtol": 0, "atol": 0}, {"rtol": 0, "atol": 0})]
    got = stacked([ea.isclose(eb, **kw) for kw, _ in cases])
    want = np.stack([torch.isclose(ta, tb, **kw).numpy() for _, kw in cases])
    np.testing.assert_array_equal(got, want)
    assert ea.isclose(eb).dtype == dtypes.bool and ea.isclose(eb).shape == (10,)


def test_isclose_broadcast_scalar_and_ints(device):
    a = q(3, 1)
    b = q(1, 4)
    check(Tensor(a, device=device).isclose(Tensor(b, device=device), atol=0.3),
          torch.isclose(torch.tensor(a), torch.tensor(b), atol=0.3))
    # a Python number as ``other`` (tinygrad allows it; torch's answer for the same value as a tensor)
    check(Tensor(a, device=device).isclose(0.5, atol=0.125),
          torch.isclose(torch.tensor(a), torch.full_like(torch.tensor(a), 0.5), atol=0.125))
    ia, ib = np.array([100, -5, 7, 0], np.int32), np.array([101, -5, 9, 0], np.int32)
    check(Tensor(ia, device=device).isclose(Tensor(ib, device=device), rtol=0.01, atol=0),
          torch.isclose(torch.tensor(ia), torch.tensor(ib), rtol=0.01, atol=0))
    ba, bb = np.array([True, False, True]), np.array([True, True, False])
    check(Tensor(ba, device=device).isclose(Tensor(bb, device=device)),
          torch.isclose(torch.tensor(ba), torch.tensor(bb)))


def test_allclose(device):
    a = q(2, 3)
    for b, kw in [(a + 1e-7, {}), (a + 0.01, {}), (a + 0.01, {"atol": 0.02})]:
        got = Tensor(a, device=device).allclose(Tensor(b, device=device), **kw)
        assert isinstance(got, Tensor) and got.shape == () and got.dtype == dtypes.bool
        assert bool(got) == torch.allclose(torch.tensor(a), torch.tensor(b), **kw)
    nan = np.array([1.0, math.nan], np.float32)
    assert not bool(Tensor(nan, device=device).allclose(Tensor(nan, device=device)))
    assert bool(Tensor(nan, device=device).allclose(Tensor(nan, device=device), equal_nan=True))
    empty = Tensor(np.zeros((0, 3), np.float32), device=device)
    assert bool(empty.allclose(empty))


def test_isclose_errors(device):
    a = Tensor([1.0, 2.0], device=device)
    for kw in ({"rtol": -1.0}, {"atol": -1e-3}):
        with pytest.raises(RuntimeError):
            torch.isclose(torch.tensor([1.0]), torch.tensor([1.0]), **kw)
        with pytest.raises(RuntimeError, match="must be greater than or equal to zero"):
            a.isclose(a, **kw)
    with pytest.raises(RuntimeError):
        torch.isclose(torch.tensor([1.0]), torch.tensor([1]))
    with pytest.raises(RuntimeError, match="did not match"):
        a.isclose(Tensor([1, 2], device=device))
    with pytest.raises(RuntimeError):
        a.isclose(Tensor([1.0, 2.0, 3.0], device=device))


def test_is_floating_point_and_const_like(device):
    for dt, tdt in [(dtypes.float32, torch.float32), (dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16),
                    (dtypes.float64, torch.float64), (dtypes.int32, torch.int32), (dtypes.uint8, torch.uint8),
                    (dtypes.bool, torch.bool)]:
        want = torch.zeros(2, dtype=tdt).is_floating_point()
        assert Tensor.zeros(2, dtype=dt, device=device).is_floating_point() is want
    x = Tensor(q(2, 3), device=device)
    c = x.const_like(3)
    assert (c.shape, c.dtype, c.device) == ((2, 3), dtypes.float32, device)
    i = x.const_like(7, dtype=dtypes.int32)
    z = Tensor(5.0, device=device).const_like(2.5)
    np.testing.assert_array_equal(c.numpy(), np.full((2, 3), 3, np.float32))
    np.testing.assert_array_equal(i.numpy(), np.full((2, 3), 7, np.int32))
    assert z.shape == () and z.item() == 2.5
    assert Tensor(np.zeros((0, 2), np.float32), device=device).const_like(1).shape == (0, 2)


# --------------------------------------------------------------------------------------------------
# fmod / copysign / logaddexp / softmin
# --------------------------------------------------------------------------------------------------
def test_fmod_values(device):
    a = np.array([5.0, -5.0, 5.5, -5.5, math.inf, 3.0, -0.0, 0.0, 7.0, -7.0, math.nan, 1.0, -4.0, 1e6 + 1], np.float32)
    b = np.array([3.0, 3.0, -2.0, -2.0, 2.0, math.inf, 2.0, -3.0, 0.0, 0.5, 1.0, -math.inf, 2.0, 7.0], np.float32)
    got = Tensor(a, device=device).fmod(Tensor(b, device=device))
    want = torch.fmod(torch.tensor(a), torch.tensor(b))
    check(got, want, exact=True)
    np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want.numpy()))  # -0.0 stays -0.0
    check(Tensor(a, device=device).fmod(1.5), torch.fmod(torch.tensor(a), 1.5), exact=True)
    ia, ib = np.array([7, -7, 7, -7, 0, 9], np.int32), np.array([3, 3, -3, -3, 5, 9], np.int32)
    check(Tensor(ia, device=device).fmod(Tensor(ib, device=device)), torch.fmod(torch.tensor(ia), torch.tensor(ib)))
    check(Tensor(ia, device=device).fmod(4), torch.fmod(torch.tensor(ia), 4))
    check(Tensor(ia, device=device).fmod(2.5), torch.fmod(torch.tensor(ia), 2.5))  # int and float promote
    h = np.array([5.5, -3.25, 100.0], np.float16)
    check(Tensor(h, device=device).fmod(Tensor(np.array([2, 2, 7], np.float16), device=device)),
          torch.fmod(torch.tensor(h), torch.tensor(np.array([2, 2, 7], np.float16))), exact=True)


def test_fmod_grad_and_errors(device):
    a = unique(3, 4) * 3 + 0.1
    b = np.array([1.5, -2.0, 2.5, -0.75], np.float32)
    check_grad(device, lambda x, y: x.fmod(y), lambda x, y: torch.fmod(x, y), [a, b])
    with pytest.raises(RuntimeError):
        torch.fmod(torch.tensor([5]), 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        Tensor([5], device=device).fmod(0)
    with pytest.raises(NotImplementedError):
        torch.fmod(torch.tensor([True]), torch.tensor([True]))
    with pytest.raises(NotImplementedError):
        Tensor([True], device=device).fmod(Tensor([True], device=device))


def test_copysign(device):
    a = np.array([1.0, -2.0, 3.0, -0.0, 0.0, math.inf, math.nan, 4.0], np.float32)
    b = np.array([-1.0, 2.0, -0.0, 1.0, -5.0, -1.0, -1.0, np.float32("-nan")], np.float32)
    got = Tensor(a, device=device).copysign(Tensor(b, device=device))
    want = torch.copysign(torch.tensor(a), torch.tensor(b))
    check(got, want, exact=True)
    np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want.numpy()))
    ia, ib = np.array([1, -2, 3], np.int32), np.array([-1, 0, -3], np.int64)
    check(Tensor(ia, device=device).copysign(Tensor(ib, device=device)),
          torch.copysign(torch.tensor(ia), torch.tensor(ib)))
    check(Tensor(ia, device=device).copysign(-1.0), torch.copysign(torch.tensor(ia), -1.0))
    h = np.array([1.5, -2.0], np.float16)
    check(Tensor(h, device=device).copysign(Tensor(np.array([-1.0, -0.0], np.float32), device=device)),
          torch.copysign(torch.tensor(h), torch.tensor([-1.0, -0.0])), exact=True)
    grad_a = np.array([[1.5, -2.0, 0.0, 3.0]], np.float32)
    grad_b = np.array([[-1.0], [2.0]], np.float32)
    check_grad(device, lambda x, y: x.copysign(y), lambda x, y: torch.copysign(x, y), [grad_a, grad_b])


def test_logaddexp(device):
    a = np.array([0.0, 1.0, -math.inf, math.inf, 100.0, -100.0, 88.0, math.nan, -math.inf], np.float32)
    b = np.array([0.0, 2.0, -math.inf, 1.0, 100.0, 3.0, 89.0, 1.0, 2.0], np.float32)
    check(Tensor(a, device=device).logaddexp(Tensor(b, device=device)),
          torch.logaddexp(torch.tensor(a), torch.tensor(b)))
    check(Tensor(a, device=device).logaddexp(1.0), torch.logaddexp(torch.tensor(a), torch.tensor(1.0)))
    h = np.array([1.0, 2.0, -3.0], np.float16)
    check(Tensor(h, device=device).logaddexp(Tensor(h, device=device)),
          torch.logaddexp(torch.tensor(h), torch.tensor(h)), rtol=1e-3, atol=1e-3)
    check_grad(device, lambda x, y: x.logaddexp(y), lambda x, y: torch.logaddexp(x, y), [q(2, 3), q(3)])
    with pytest.raises(NotImplementedError):
        torch.logaddexp(torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(NotImplementedError):
        Tensor([1], device=device).logaddexp(Tensor([2], device=device))


def test_softmin(device):
    x = q(2, 3, 4)
    for axis in (-1, 0, 1):
        check_grad(device, lambda t, a=axis: t.softmin(a), lambda t, a=axis: F.softmin(t, dim=a), [x])
    i = np.array([[1, 2, 3], [3, 2, 1]], np.int32)
    check(Tensor(i, device=device).softmin(1, dtype=dtypes.float64), F.softmin(torch.tensor(i), 1, dtype=torch.float64))
    with pytest.raises(NotImplementedError):
        F.softmin(torch.tensor(i), 1)
    with pytest.raises(NotImplementedError):
        Tensor(i, device=device).softmin(1)
    with pytest.raises(RuntimeError):
        F.softmin(torch.tensor([True, False]), 0, dtype=torch.float32)
    with pytest.raises(RuntimeError):
        Tensor([True, False], device=device).softmin(0, dtype=dtypes.float32)


# --------------------------------------------------------------------------------------------------
# normalize
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, math.inf, -math.inf, 0.0])
def test_normalize(device, p):
    x = q(3, 4)
    x[1] = 0  # an all-zero row: divided by eps, with a finite gradient
    check_grad(device, lambda t: t.normalize(p=p), lambda t: F.normalize(t, p=p, dim=1), [x], rtol=1e-4, atol=1e-5)


def test_normalize_dims_and_errors(device):
    x = unique(2, 3, 4)
    check_grad(device, lambda t: t.normalize(dim=-1, eps=0.5), lambda t: F.normalize(t, dim=-1, eps=0.5), [x],
               rtol=1e-4, atol=1e-5)
    check_grad(device, lambda t: t.normalize(dim=(0, 2)), lambda t: F.normalize(t, dim=(0, 2)), [x], rtol=1e-4,
               atol=1e-5)
    check(Tensor(np.float32(-3.0), device=device).normalize(dim=0), F.normalize(torch.tensor(-3.0), dim=0))
    check(Tensor(np.zeros((2, 0), np.float32), device=device).normalize(), F.normalize(torch.zeros(2, 0)))
    h = np.array([[3.0, 4.0]], np.float16)
    check(Tensor(h, device=device).normalize(), F.normalize(torch.tensor(h)), rtol=1e-3, atol=1e-3)
    with pytest.raises(RuntimeError):
        F.normalize(torch.tensor([[1, 2]]))
    with pytest.raises(RuntimeError, match="floating point"):
        Tensor([[1, 2]], device=device).normalize()
    with pytest.raises(IndexError):
        F.normalize(torch.tensor([1.0, 2.0]))
    with pytest.raises(IndexError):
        Tensor([1.0, 2.0], device=device).normalize()


# --------------------------------------------------------------------------------------------------
# diag / diagonal
# --------------------------------------------------------------------------------------------------
def test_diag(device):
    v = q(4)
    for k in (0, 2, -1):
        check_grad(device, lambda t, k=k: t.diag(k), lambda t, k=k: torch.diag(t, k), [v])
    m = q(3, 5)
    for k in (0, 3, -2, 6):
        check_grad(device, lambda t, k=k: t.diag(k), lambda t, k=k: torch.diag(t, k), [m])
    iv = np.array([1, -2, 3], np.int64)
    check(Tensor(iv, device=device).diag(), torch.diag(torch.tensor(iv)))
    check(Tensor(np.zeros(0, np.float32), device=device).diag(), torch.diag(torch.zeros(0)))
    for bad in (np.zeros((2, 2, 2), np.float32), np.float32(1.0)):
        with pytest.raises(RuntimeError):
            torch.diag(torch.tensor(bad))
        with pytest.raises(RuntimeError, match="1D or 2D"):
            Tensor(bad, device=device).diag()


def test_diagonal(device):
    x = q(2, 3, 4)
    for offset, d1, d2 in [(0, 0, 1), (1, 2, 0), (-1, -1, 1), (2, 1, 2), (-5, 0, 2), (3, 1, 0)]:
        check_grad(device, lambda t, a=(offset, d1, d2): t.diagonal(*a),
                   lambda t, a=(offset, d1, d2): torch.diagonal(t, *a), [x])
    with pytest.raises(RuntimeError):
        torch.zeros(3, 4).diagonal(0, 1, 1)
    with pytest.raises(RuntimeError, match="cannot be identical"):
        Tensor.zeros(3, 4, device=device).diagonal(0, 1, -1)
    with pytest.raises(IndexError):
        torch.zeros(3).diagonal()
    with pytest.raises(IndexError):
        Tensor.zeros(3, device=device).diagonal()


# --------------------------------------------------------------------------------------------------
# sort / argsort / topk
# --------------------------------------------------------------------------------------------------
SPECIAL = np.array([3.0, math.nan, -1.0, math.inf, -math.inf, 3.0, math.nan, -0.0, 0.0, -1.0], np.float32)


def check_sort(device: str, x: np.ndarray, dim: int, descending: bool, dtype: Any = None) -> None:
    t = torch.tensor(x) if dtype is None else torch.tensor(x).to(dtype)
    e = Tensor(t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy(), device=device, dtype=T2E[t.dtype])
    vals, idx = e.sort(dim, descending)
    want = torch.sort(t, dim=dim, descending=descending, stable=True)
    check(vals, want.values, exact=True)
    check(idx, tg_index(want.indices))
    if t.dtype.is_floating_point and t.numel():
        np.testing.assert_array_equal(np.signbit(vals.numpy()), np.signbit(want.values.float().numpy()))


@pytest.mark.parametrize("descending", [False, True])
def test_sort_special_floats(device, descending):
    """nan last (first when descending), infinities in place, -0.0 == 0.0 kept in order, ties stable."""
    check_sort(device, SPECIAL, -1, descending)
    rows = np.stack([SPECIAL, SPECIAL[::-1].copy(), np.roll(SPECIAL, 3)])
    check_sort(device, rows, 1, descending)
    check_sort(device, rows.T.copy(), 0, descending)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.float16,
                                   torch.bfloat16, torch.float64])
def test_sort_dtypes(device, dtype):
    x = rng.integers(0, 4, size=(3, 7)).astype(np.float32)  # many ties
    if dtype == torch.bool:
        x = (x > 1).astype(np.float32)
    check_sort(device, x, -1, False, dtype)
    check_sort(device, x, 0, True, dtype)


def test_sort_edge_shapes(device):
    check_sort(device, np.zeros((2, 0), np.float32), -1, False)
    check_sort(device, np.zeros((0, 3), np.float32), -1, True)
    check_sort(device, np.zeros((0, 3), np.float32), 0, False)
    check_sort(device, np.array([5.0], np.float32), 0, False)
    vals, idx = Tensor(np.float32(2.5), device=device).sort()
    want = torch.sort(torch.tensor(2.5))
    check(vals, want.values)
    check(idx, tg_index(want.indices))
    with pytest.raises(IndexError):
        torch.zeros(2, 3).sort(dim=2)
    with pytest.raises(IndexError):
        Tensor.zeros(2, 3, device=device).sort(dim=2)


def test_sort_grad(device):
    x = unique(3, 5)
    for dim, desc in ((0, True), (-1, False)):
        check_grad(device, lambda t, a=(dim, desc): t.sort(*a)[0], lambda t, a=(dim, desc): torch.sort(t, *a)[0], [x])


def test_argsort(device):
    x = np.stack([SPECIAL, np.roll(SPECIAL, 4)])
    for dim, desc in ((-1, False), (-1, True), (0, False)):
        got = Tensor(x, device=device).argsort(dim, desc)
        check(got, tg_index(torch.argsort(torch.tensor(x), dim=dim, descending=desc, stable=True)))
    ties = np.array([2, 1, 2, 1, 2, 0], np.int32)  # equal keys keep their order in both directions
    check(Tensor(ties, device=device).argsort(), tg_index(torch.argsort(torch.tensor(ties), stable=True)))
    check(Tensor(ties, device=device).argsort(descending=True),
          tg_index(torch.argsort(torch.tensor(ties), descending=True, stable=True)))


def test_topk_values_and_ties(device):
    x = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 1.0, -0.0, 0.0], np.float32)
    for k, largest in ((3, True), (3, False), (5, False), (0, True), (8, True)):
        vals, idx = Tensor(x, device=device).topk(k, largest=largest)
        want = torch.topk(torch.tensor(x), k, largest=largest)
        check(vals, want.values, exact=True)
        # ties: the earlier element comes first (torch leaves their order unspecified)
        stable = torch.sort(torch.tensor(x), descending=largest, stable=True).indices[:k]
        check(idx, tg_index(stable))
    nan = np.array([[1.0, math.nan, 5.0, -math.inf], [math.nan, 2.0, math.nan, 0.0]], np.float32)
    for largest in (True, False):
        vals, idx = Tensor(nan, device=device).topk(2, dim=1, largest=largest)
        want = torch.topk(torch.tensor(nan), 2, dim=1, largest=largest)
        check(vals, want.values, exact=True)
        check(idx, tg_index(want.indices))
    ints = rng.integers(-50, 50, size=(4, 6)).astype(np.int64)
    vals, idx = Tensor(ints, device=device).topk(3, dim=0, sorted_=False)
    check(vals, torch.topk(torch.tensor(ints), 3, dim=0).values)
    np.testing.assert_array_equal(np.take_along_axis(ints, idx.numpy(), 0), vals.numpy())


def test_topk_grad_and_errors(device):
    x = unique(4, 6)
    check_grad(device, lambda t: t.topk(2, dim=0)[0], lambda t: torch.topk(t, 2, dim=0)[0], [x])
    check_grad(device, lambda t: t.topk(3, largest=False)[0], lambda t: torch.topk(t, 3, largest=False)[0], [x])
    vals, idx = Tensor(np.float32(4.0), device=device).topk(1)
    want = torch.topk(torch.tensor(4.0), 1)
    check(vals, want.values)
    check(idx, tg_index(want.indices))
    for k in (7, -1):
        with pytest.raises(RuntimeError):
            torch.topk(torch.tensor(x), k)
        with pytest.raises(RuntimeError, match="out of range"):
            Tensor(x, device=device).topk(k)
    with pytest.raises(RuntimeError):
        torch.topk(torch.tensor([True, False]), 1)
    with pytest.raises(RuntimeError, match="bool"):
        Tensor([True, False], device=device).topk(1)


# --------------------------------------------------------------------------------------------------
# unfold / rearrange
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dim,size,step", [((8,), 0, 2, 2), ((3, 3, 3), -1, 2, 3), ((5, 4), 0, 3, 1),
                                                 ((4, 6), 1, 6, 1), ((2, 7, 3), 1, 3, 2), ((5, 4), 1, 0, 2),
                                                 ((0,), 0, 0, 1)], ids=str)
def test_unfold(device, shape, dim, size, step):
    check_grad(device, lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step), [q(*shape)])


def test_unfold_scalar_and_errors(device):
    for size in (0, 1):
        check(Tensor(np.float32(5.0), device=device).unfold(0, size, 1), torch.tensor(5.0).unfold(0, size, 1))
    x = q(2, 3)
    for args in ((1, 4, 1), (1, 2, 0), (1, -1, 1)):
        with pytest.raises(RuntimeError):
            torch.tensor(x).unfold(*args)
        with pytest.raises(RuntimeError):
            Tensor(x, device=device).unfold(*args)
    with pytest.raises(IndexError):
        torch.tensor(x).unfold(2, 1, 1)
    with pytest.raises(IndexError):
        Tensor(x, device=device).unfold(2, 1, 1)


REARRANGE = [
    ("b c h w -> b (c h w)", {}, lambda a: a.reshape(2, -1)),
    ("b c h w -> b h w c", {}, lambda a: a.transpose(0, 2, 3, 1)),
    ("b c h w -> (b h) w c", {}, lambda a: a.transpose(0, 2, 3, 1).reshape(8, 5, 3)),
    ("b c (h1 h2) w -> b c h1 h2 w 1", {"h1": 2}, lambda a: a.reshape(2, 3, 2, 2, 5, 1)),
    ("b c (h1 h2) w -> h2 (b c) w h1", {"h2": 4, "h1": 1}, lambda a: a.reshape(6, 1, 4, 5).transpose(2, 0, 3, 1)),
    ("... h w -> ... (w h)", {}, lambda a: a.swapaxes(-1, -2).reshape(2, 3, 20)),
    ("b ... w -> (...) b w", {}, lambda a: a.transpose(1, 2, 0, 3).reshape(12, 2, 5)),
    ("b c h w ... -> (...) b c h w", {}, lambda a: a.reshape(1, 2, 3, 4, 5)),
    ("b c h w -> b c () h w", {}, lambda a: a.reshape(2, 3, 1, 4, 5)),
    ("b c h w -> w h c b", {}, lambda a: a.transpose(3, 2, 1, 0)),
]


def test_rearrange(device):
    a = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    t = Tensor(a, device=device)
    outs = [t.rearrange(f, **kw) for f, kw, _ in REARRANGE]
    for out, (f, _, ref) in zip(outs, REARRANGE):
        want = ref(a)
        assert out.shape == want.shape, f
    flat = Tensor.cat(*(o.reshape(-1) for o in outs)).numpy()  # one read back for every pattern
    np.testing.assert_array_equal(flat, np.concatenate([ref(a).reshape(-1) for _, _, ref in REARRANGE]))
    squeezed = Tensor(np.arange(6, dtype=np.int32).reshape(2, 1, 3), device=device).rearrange("a 1 b -> b a")
    np.testing.assert_array_equal(squeezed.numpy(), np.arange(6).reshape(2, 3).T)
    x = Tensor(q(2, 6), device=device, requires_grad=True)
    w = q(3, 2, 2)
    (x.rearrange("a (b c) -> b a c", c=2) * Tensor(w, device=device)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), w.transpose(1, 0, 2).reshape(2, 6))


@pytest.mark.parametrize("formula,sizes", [("a b -> a", {}), ("a b c d -> a b c d", {"x": 2}),
                                           ("a b c (d e) -> a b c d e", {}), ("a a c d -> a c d", {}),
                                           ("a b -> b a -> a", {}), ("(a b c d -> a b c d", {}),
                                           ("a b c d e -> a b c d e", {}), ("a b c (d e) -> a b c d e", {"d": 3}),
                                           ("a b c d -> a b c d", {"a": 3}), ("(a ...) c d -> a c d", {}),
                                           ("a b c 2 -> a b c", {}), ("... a ... -> a", {}),
                                           ("a b c _d -> a b c _d", {})])
def test_rearrange_errors(device, formula, sizes):
    with pytest.raises(RuntimeError, match="rearrange"):
        Tensor.zeros(2, 3, 4, 5, device=device).rearrange(formula, **sizes)


# --------------------------------------------------------------------------------------------------
# to_ / sequential
# --------------------------------------------------------------------------------------------------
def other_device(device: str) -> str:
    others = [d for d in Device.available() if d != device]
    if not others:
        pytest.skip(f"no second usable device besides {device}")
    return "CPU" if "CPU" in others else others[0]


def test_to_(device):
    other = other_device(device)
    leaf = Tensor(q(2, 3), device=device, requires_grad=True)
    (leaf * 2).sum().backward()
    assert leaf.to_(device) is leaf and leaf.device == device  # same device: nothing changes
    before = leaf.numpy()
    assert leaf.to_(other) is leaf
    assert leaf.device == other and leaf.grad is not None and leaf.grad.device == other
    np.testing.assert_array_equal(leaf.numpy(), before)
    np.testing.assert_array_equal(leaf.grad.numpy(), np.full((2, 3), 2, np.float32))
    leaf.grad = None
    (leaf * leaf).sum().backward()  # still a leaf: its own gradient, on its new device
    assert leaf.grad is not None and leaf.grad.device == other
    np.testing.assert_allclose(leaf.grad.numpy(), 2 * before)
    # a computed tensor keeps its history: gradients flow back to the original device
    src = Tensor(q(3), device=device, requires_grad=True)
    mid = src * 3
    mid.to_(other)
    assert mid.device == other
    (mid * Tensor([1.0, 2.0, 3.0], device=other)).sum().backward()
    assert src.grad is not None and src.grad.device == device
    np.testing.assert_array_equal(src.grad.numpy(), np.array([3.0, 6.0, 9.0], np.float32))


def test_sequential(device):
    x = Tensor(q(2, 3), device=device, requires_grad=True)
    w = Tensor(q(3, 4), device=device, requires_grad=True)
    out = x.sequential([lambda t: t @ w, Tensor.relu, lambda t: t * 2])
    tx, tw = torch.tensor(x.numpy(), requires_grad=True), torch.tensor(w.numpy(), requires_grad=True)
    want = torch.relu(tx @ tw) * 2
    check(out, want)
    out.sum().backward()
    want.sum().backward()
    check(x.grad, tx.grad)
    check(w.grad, tw.grad)
    assert x.sequential([]) is x


# --------------------------------------------------------------------------------------------------
# max_unpool2d
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,kernel,stride,padding,output_size", [
    ((2, 3, 4, 4), 2, None, 0, None),
    ((1, 2, 5, 5), 3, 2, 1, None),
    ((2, 5, 5), 2, 1, 0, None),            # overlapping windows: one position can be picked twice
    ((1, 1, 5, 5), 2, 2, 0, (5, 5)),
    ((1, 1, 4, 6), (2, 3), (2, 3), 0, (1, 1, 5, 7)),
], ids=str)
def test_max_unpool2d(device, shape, kernel, stride, padding, output_size):
    pooled, indices = F.max_pool2d(torch.tensor(unique(*shape)), kernel, stride, padding, return_indices=True)
    idx = Tensor(indices.numpy(), device=device)
    check_grad(device, lambda t: t.max_unpool2d(idx, kernel, stride, 1, padding, output_size),
               lambda t: F.max_unpool2d(t, indices, kernel, stride, padding, output_size), [pooled.numpy()])


def test_max_unpool2d_roundtrip_and_errors(device):
    x = Tensor(np.arange(1, 17, dtype=np.int32).reshape(1, 1, 4, 4), device=device)
    out, idx = x.max_pool2d(return_indices=True)
    assert idx.dtype == dtypes.int32  # tinygrad's index dtype (torch: int64)
    np.testing.assert_array_equal(Tensor.max_unpool2d(out, idx).numpy(),
                                  F.max_unpool2d(torch.tensor(out.numpy()).float(), torch.tensor(idx.numpy()).long(),
                                                 2).int().numpy())
    o, i = F.max_pool2d(torch.tensor(q(1, 1, 4, 4)), 2, return_indices=True)
    eo, ei = Tensor(o.numpy(), device=device), Tensor(i.numpy(), device=device)
    cases = [(lambda: F.max_unpool2d(o, i[..., :1], 2), lambda: eo.max_unpool2d(ei[..., :1], 2), RuntimeError),
             (lambda: F.max_unpool2d(o, i.float(), 2), lambda: eo.max_unpool2d(ei.float(), 2), RuntimeError),
             (lambda: F.max_unpool2d(o[0, 0], i[0, 0], 2), lambda: eo[0, 0].max_unpool2d(ei[0, 0], 2), RuntimeError),
             (lambda: F.max_unpool2d(o, i, 2, output_size=(6, 6)), lambda: eo.max_unpool2d(ei, 2, output_size=(6, 6)),
              ValueError),
             (lambda: F.max_unpool2d(o, i, 2, output_size=(4, 4, 4)),
              lambda: eo.max_unpool2d(ei, 2, output_size=(4, 4, 4)), ValueError)]
    for theirs, ours, exc in cases:
        with pytest.raises(exc):
            theirs()
        with pytest.raises(exc):
            ours()


# --------------------------------------------------------------------------------------------------
# random_bits
# --------------------------------------------------------------------------------------------------
M32 = 0xFFFFFFFF
ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def threefry_ref(k0: int, k1: int, c0: int, c1: int) -> tuple[int, int]:
    """Threefry-2x32 with 20 rounds in plain Python (Salmon et al., Random123)."""
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    x0, x1 = (c0 + ks[0]) & M32, (c1 + ks[1]) & M32
    for r in range(20):
        x0 = (x0 + x1) & M32
        rot = ROTATIONS[r % 8]
        x1 = (((x1 << rot) | (x1 >> (32 - rot))) & M32) ^ x0
        if r % 4 == 3:
            s = r // 4 + 1
            x0, x1 = (x0 + ks[s % 3]) & M32, (x1 + ks[(s + 1) % 3] + s) & M32
    return x0, x1


def random_bits_ref(key: tuple[int, int], counter: tuple[int, int], num: int) -> np.ndarray:
    k0, k1 = threefry_ref(key[0], key[1], counter[0], counter[1])
    half = -(-num // 2)
    words = [threefry_ref(k0, k1, j, j + half) for j in range(half)]
    return np.array([w[0] for w in words] + [w[1] for w in words], np.uint32)[:num]


def test_threefry_reference_known_answers():
    # the Random123 known-answer vectors for threefry2x32_20
    assert threefry_ref(0, 0, 0, 0) == (0x6B200159, 0x99BA4EFE)
    assert threefry_ref(M32, M32, M32, M32) == (0x1CB996FC, 0xBB002BE7)
    assert threefry_ref(0x13198A2E, 0x03707344, 0x243F6A88, 0x85A308D3) == (0xC4923A9C, 0x483DF7A0)


def test_random_bits(device):
    cases = [((0x13198A2E, 0x03707344), (0xFFFFFFFE, 7), 7), ((0, 0), (0, 0), 8), ((M32, 1), (5, M32), 1),
             ((42, 0), (3, 0), 33)]
    outs = []
    for key, counter, num in cases:
        out = Tensor.random_bits(Tensor(np.array(key, np.uint32), device=device),
                                 Tensor(np.array(counter, np.uint32), device=device), num)
        assert out.shape == (num,) and out.dtype == dtypes.uint32 and out.device == device
        outs.append(out)
    got = Tensor.cat(*outs).numpy()
    np.testing.assert_array_equal(got, np.concatenate([random_bits_ref(*c) for c in cases]))
    empty = Tensor.random_bits(Tensor([1, 2], device=device, dtype=dtypes.uint32),
                               Tensor([0, 0], device=device, dtype=dtypes.uint32), 0)
    assert empty.shape == (0,) and empty.dtype == dtypes.uint32
    with pytest.raises(ValueError):
        Tensor.random_bits(Tensor([1, 2, 3], device=device, dtype=dtypes.uint32),
                           Tensor([0, 0], device=device, dtype=dtypes.uint32), 4)
    with pytest.raises(ValueError):
        Tensor.random_bits(Tensor([1, 2], device=device, dtype=dtypes.uint32),
                           Tensor([0, 0], device=device, dtype=dtypes.uint32), -1)

