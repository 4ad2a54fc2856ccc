"""Advanced indexing, ``__setitem__``, gather/scatter and masks against torch, on every usable backend device.

Forward values, shapes and dtypes must equal torch's; gradients flow through the one-hot compositions
and must equal torch's too; invalid calls raise torch's exception types.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import BWD, FWD, assert_like, tg_index

from ember import Device, GlobalCounters, Tensor, dtypes

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(77)


def per_device(table: list[tuple[Any, ...]], cpu: set[str]) -> list[Any]:
    """Every case on PYTHON; on CPU only the cases named in ``cpu``.

    The PYTHON device interprets kernels, while every new kernel on CPU costs a C compile: the CPU runs a
    representative subset so that the file stays fast, and the kernels it skips differ only in shapes.
    """
    params = []
    for case in table:
        for dev in ("CPU", "PYTHON"):
            if dev == "CPU" and case[0] not in cpu:
                continue
            skip = pytest.mark.skipif(dev not in Device.available(), reason=f"device {dev} is not usable here")
            params.append(pytest.param(dev, *case, id=f"{dev}-{case[0]}", marks=skip))
    return params


def randf(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def to_torch_index(idx: Any) -> Any:
    """The same index for torch: numpy arrays and ember tensors become torch tensors."""
    if isinstance(idx, tuple):
        return tuple(to_torch_index(i) for i in idx)
    if isinstance(idx, np.ndarray):
        return torch.from_numpy(idx)
    if isinstance(idx, Tensor):
        return torch.from_numpy(idx.numpy())
    return idx


def to_device_index(idx: Any, device: str) -> Any:
    """Numpy arrays in ``idx`` become ember tensors on ``device`` (lists stay lists)."""
    if isinstance(idx, tuple):
        return tuple(to_device_index(i, device) for i in idx)
    if isinstance(idx, np.ndarray):
        return Tensor(idx, device=device)
    return idx


# an index only moves values, so results are compared exactly unless a test says otherwise
same = partial(assert_like, exact=True)


def raises_in_both(calls: list[tuple[Callable[[Any, Callable], Any], type[Exception]]], theirs: Any,
                   make_theirs: Callable[[Any], Any], ours: Any, make_ours: Callable[[Any], Any]) -> None:
    """Each ``call(x, make)`` raises its exception type on torch's ``theirs`` and on ember's ``ours`` alike
    (``make`` builds a tensor of that library from data)."""
    for call, exc in calls:
        with pytest.raises(exc):
            call(theirs, make_theirs)
        with pytest.raises(exc):
            call(ours, make_ours)


# --------------------------------------------------------------------------------------------
# reading: t[idx]
# --------------------------------------------------------------------------------------------

I01 = np.array([0, 1])
GETITEM_CASES = [
    ("list", ([0, 2],)),
    ("int_then_list", (0, slice(None), [1, 2])),
    ("list_slice_int", ([0, 1], slice(None), 0)),
    ("slice_list_int", (slice(None), [1, 2], 0)),
    ("int_list_adjacent", (0, [1, 2])),
    ("separated_lists", ([0], slice(None), [1])),
    ("separated_by_none", (None, [0, 1], None, [1, 2])),
    ("ellipsis_list", (Ellipsis, [1, 2])),
    ("broadcast_2d", ([[0, 1]], [[1], [2]])),
    ("2d_index_middle", (slice(None), [[1, 2]], slice(1, 3))),
    ("stepped_slice_and_lists", (slice(None, None, 2), [1, 0], slice(None, None, 3))),
    ("negative_list", (np.array([1, -1]),)),
    ("empty_list", ([],)),
    ("bool_true", (True,)),
    ("bool_false", (False,)),
    ("bool_list", ([True, False, True, False, True],)),
    ("mask_then_int", (np.array([True, False, True, False, True]), 1)),
    ("mask_middle", (slice(None), np.ones(6, bool), [0])),
    ("full_mask", (np.arange(5 * 6 * 7).reshape(5, 6, 7) % 3 == 0,)),
    ("none_after_ellipsis", (Ellipsis, None, [1])),
    ("list_ellipsis_list", ([1], Ellipsis, [2])),
    ("scalar_tensor", (np.array(2),)),
    ("scalar_tensor_last", (1, slice(None), np.array(2))),
    ("int32_tensor", (np.array([[1, 0], [4, 4]], np.int32),)),
]


@pytest.mark.parametrize("device, name, idx", per_device(GETITEM_CASES, {
    "int_then_list", "separated_by_none", "broadcast_2d", "stepped_slice_and_lists", "bool_list", "mask_middle",
    "full_mask", "scalar_tensor_last"}))
def test_getitem_matches_torch(device, name, idx):
    a = np.arange(5 * 6 * 7, dtype=np.float32).reshape(5, 6, 7) - 100
    x = Tensor(a, device=device)
    same(x[to_device_index(idx, device)], torch.from_numpy(a)[to_torch_index(idx)])


@pytest.mark.parametrize("device, name, idx", per_device(GETITEM_CASES[:6], {"list"}))
def test_getitem_advanced_method_directly(device, name, idx):
    a = randf(5, 6, 7)
    same(Tensor(a, device=device)._getitem_advanced(to_device_index(idx, device)),
         torch.from_numpy(a)[to_torch_index(idx)])


def test_getitem_non_contiguous_inputs(make):
    a, idx = randf(4, 3), (np.array([2, 0, -1]), np.array([[1], [0]]))
    x, expected = make(a)
    same(x[to_device_index(idx, x.device)], torch.from_numpy(expected)[to_torch_index(idx)], exact=False)


@pytest.mark.parametrize("device, name, dtype", per_device(
    [("int32", np.int32), ("bool", np.bool_), ("float16", np.float16), ("uint8", np.uint8), ("int64", np.int64)],
    {"bool", "float16"}))
def test_getitem_keeps_dtype(device, name, dtype):
    a = (RNG.integers(0, 3, (4, 5))).astype(dtype)
    idx = (np.array([3, 0, 0]), slice(1, 4))
    same(Tensor(a, device=device)[to_device_index(idx, device)], torch.from_numpy(a)[to_torch_index(idx)])


def test_getitem_tensor_negative_indices_wrap(device):
    a = randf(5, 3)
    i = np.array([[-1, 0], [-5, 4]])
    same(Tensor(a, device=device)[Tensor(i, device=device)], torch.from_numpy(a)[torch.from_numpy(i)])
    same(Tensor(a, device=device)[Tensor(i, device=device), Tensor(i % 3, device=device)],
         torch.from_numpy(a)[torch.from_numpy(i), torch.from_numpy(i % 3)])


def test_getitem_zero_dim_and_empty(device):
    a = randf(3)
    same(Tensor(a, device=device)[Tensor(1, device=device)], torch.from_numpy(a)[torch.tensor(1)])
    e = np.zeros((0, 3), np.float32)
    same(Tensor(e, device=device)[[]], torch.from_numpy(e)[[]])
    same(Tensor(randf(2, 0), device=device)[[1, 0]], torch.zeros(2, 0)[[1, 0]])


def test_getitem_is_one_kernel(device):
    x = Tensor(randf(6, 5), device=device).realize()
    i = Tensor(np.array([4, 1, 1]), device=device).realize()
    out = x[i, 1:]
    GlobalCounters.reset()
    out.realize()
    assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize("idx, exc", [
    (([5],), IndexError),
    (([-6],), IndexError),
    ((0, 0, [7]), IndexError),
    (([0, 1], [0, 1, 2]), IndexError),
    (([0], [0], [0], [0]), IndexError),
    ((np.array([True, False]),), IndexError),
    ((np.array([1.0]), "tensor"), IndexError),
    ((1.5,), IndexError),
    (({1: 2},), IndexError),
    ((Ellipsis, Ellipsis, [0]), IndexError),
], ids=["too_big", "too_negative", "last_dim", "no_broadcast", "too_many", "mask_shape", "float_tensor", "float",
        "dict", "two_ellipses"])
def test_getitem_errors_like_torch(device, idx, exc):
    a = np.zeros((5, 6, 7), np.float32)
    if len(idx) == 2 and idx[1] == "tensor":  # a float index *tensor* (float lists: see test_errors.py)
        ours: Any = (Tensor(idx[0], device=device),)
        theirs: Any = (torch.from_numpy(idx[0]),)
    else:
        ours, theirs = to_device_index(idx, device), to_torch_index(idx)
    with pytest.raises(exc):
        torch.from_numpy(a)[theirs]
    with pytest.raises(exc):
        Tensor(a, device=device)[ours]


def test_getitem_tensor_index_out_of_range_raises_at_the_read(device):
    # index tensors are checked at the next read (ember.frontend.checks), not when the op is built
    out = Tensor([1.0, 2.0, 3.0], device=device)[Tensor([0, 3], device=device)]
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        out.numpy()


@pytest.mark.parametrize("device, name, idx", per_device([
    ("dup_rows", (np.array([0, 2, 2, -1]),)),
    ("cols_2d", (slice(None), np.array([[1, 1], [0, 2]]))),
    ("separated", (np.array([1, 0]), slice(None, None, 2), np.array([1, 1]))),
    ("mask", (np.array([[True, False, True], [False, True, True], [True, True, False], [False, False, True]]),)),
], {"dup_rows", "separated"}))
def test_getitem_backward(device, name, idx):
    a = randf(4, 3, 2)
    w = randf(*torch.from_numpy(a)[to_torch_index(idx)].shape)
    x = Tensor(a, device=device, requires_grad=True)
    (x[to_device_index(idx, device)] * Tensor(w, device=device)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    (tx[to_torch_index(idx)] * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **BWD)


# --------------------------------------------------------------------------------------------
# writing: t[idx] = value
# --------------------------------------------------------------------------------------------

SETITEM_CASES = [
    ("int_scalar", (0,), 1.5),
    ("slices_tensor", (slice(1, 3), slice(None, None, 2)), np.full((2, 3, 6), 7, np.float32)),
    ("int_slice_broadcast", (slice(None), 2, slice(1, 5, 3)), np.arange(2, dtype=np.float32)),
    ("none_ellipsis", (None, 1, Ellipsis, -1), 3.0),
    ("list_scalar", ([0, 2],), 5.0),
    ("lists_separated", ([0, 2], slice(None), [1, 1]), np.arange(5, dtype=np.float32)),
    ("list_adjacent", (slice(None), [1, 3], 2), np.arange(8, dtype=np.float32).reshape(4, 2)),
    ("mask_scalar", "mask", 0.0),
    ("leading_mask_row", "mask2", np.arange(6, dtype=np.float32)),
    ("mask_values", "mask_count", None),
    ("duplicates_last_wins", (slice(None), [0, 0, 0], slice(1, 3)), np.arange(24, dtype=np.float32).reshape(4, 3, 2)),
    ("broadcast_indices", (1, [[0], [2]], [1, 2, 3]), np.arange(6, dtype=np.float32).reshape(2, 3)),
    ("ellipsis_tensor", (Ellipsis, np.array([1, 3])), -1.0),
    ("leading_ones_value", (0,), np.ones((1, 1, 5, 6), np.float32)),
    ("negative_tensor_index", (np.array([-1, 1]),), 9.0),
]


@pytest.mark.parametrize("device, name, idx, value", per_device(SETITEM_CASES, {
    "slices_tensor", "lists_separated", "mask_scalar", "duplicates_last_wins", "ellipsis_tensor"}))
def test_setitem_matches_torch(device, name, idx, value):
    a = randf(4, 5, 6)
    if idx == "mask":
        idx = (a > 0,)
    elif idx == "mask2":
        idx = (a[:, :, 0] > 0,)
    elif idx == "mask_count":
        idx = (a > 0,)
        value = np.arange(int((a > 0).sum()), dtype=np.float32)
    x, tx = Tensor(a, device=device), torch.from_numpy(a.copy())
    tx[to_torch_index(idx)] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    x[to_device_index(idx, device)] = Tensor(value, device=device) if isinstance(value, np.ndarray) else value
    same(x, tx)


def test_setitem_negative_step_matches_numpy(device, check):
    a = randf(4, 7)
    x = Tensor(a, device=device)
    x[::-1, 5:0:-2] = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3), device=device)
    expected = a.copy()
    expected[::-1, 5:0:-2] = np.arange(12, dtype=np.float32).reshape(4, 3)
    check(x, expected)


@pytest.mark.parametrize("device, name, dtype", per_device(
    [("int32", np.int32), ("bool", np.bool_), ("float16", np.float16)], {"bool"}))
def test_setitem_casts_value_to_dtype(device, name, dtype):
    a = RNG.integers(0, 2, (3, 4)).astype(dtype)
    x, tx = Tensor(a, device=device), torch.from_numpy(a.copy())
    for idx, v in (((1, slice(None)), 1), (([0, 2], 1), 0), ((slice(None), [3]), True)):
        x[idx] = v
        tx[idx] = v
    same(x, tx)


def test_setitem_on_views_and_empty_selections(device):
    a = randf(3, 4)
    x = Tensor(a, device=device).permute(1, 0)
    tx = torch.from_numpy(a.copy()).permute(1, 0)
    x[1:3, [0, 2]] = 0.5
    tx[1:3, [0, 2]] = 0.5
    same(x, tx)
    y, ty = Tensor(a, device=device), torch.from_numpy(a.copy())
    y[2:2] = 1.0
    ty[2:2] = 1.0
    y[[]] = 4.0
    ty[[]] = 4.0
    same(y, ty)


def test_setitem_value_shape_mismatch_raises(device):
    for idx, shape in (((0,), (2,)), ((slice(None), [0, 1]), (3,)), (([0, 1],), (3, 4))):
        with pytest.raises(RuntimeError):
            torch.zeros(3, 4)[idx] = torch.ones(shape)
        with pytest.raises(RuntimeError):
            Tensor.zeros(3, 4, device=device)[idx] = Tensor.ones(*shape, device=device)


def test_setitem_leaf_requiring_grad_raises(device):
    with pytest.raises(RuntimeError):
        torch.zeros(3, requires_grad=True)[0] = 1.0
    with pytest.raises(RuntimeError):
        Tensor([0.0, 0.0, 0.0], device=device, requires_grad=True)[0] = 1.0


def test_setitem_backward(device):
    a, v = randf(4, 3), randf(2, 3)
    w = randf(4, 3)
    xa, va = Tensor(a, device=device, requires_grad=True), Tensor(v, device=device, requires_grad=True)
    x = xa * 2.0
    x[[3, 1]] = va
    x[0, 1:] = 0.0
    (x * Tensor(w, device=device)).sum().backward()
    ta, tv = torch.tensor(a, requires_grad=True), torch.tensor(v, requires_grad=True)
    tx = ta * 2.0
    tx[[3, 1]] = tv
    tx[0, 1:] = 0.0
    (tx * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.numpy(), tx.detach().numpy(), **FWD)
    np.testing.assert_allclose(xa.grad.numpy(), ta.grad.numpy(), **BWD)
    np.testing.assert_allclose(va.grad.numpy(), tv.grad.numpy(), **BWD)


def test_setitem_keeps_old_value_for_earlier_graphs(device):
    x = Tensor([1.0, 2.0, 3.0], device=device)
    doubled = x * 2
    x[1] = 10.0
    np.testing.assert_array_equal(doubled.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(x.numpy(), [1.0, 10.0, 3.0])


# --------------------------------------------------------------------------------------------
# gather, index_select
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device, name, shape, dim, index_shape", per_device([
    ("rows", (4, 5), 0, (3, 5)), ("wider", (4, 5), 1, (4, 7)), ("smaller", (4, 5), -1, (2, 3)),
    ("3d", (3, 4, 5), 1, (2, 6, 5)), ("1d", (6,), 0, (9,)), ("empty", (3, 4), 0, (0, 4)),
], {"smaller", "3d", "empty"}))
def test_gather_matches_torch(device, name, shape, dim, index_shape):
    a = randf(*shape)
    idx = RNG.integers(0, shape[dim], index_shape)
    same(Tensor(a, device=device).gather(dim, Tensor(idx, device=device)),
         torch.from_numpy(a).gather(dim, torch.from_numpy(idx)))


def test_gather_non_contiguous_input(make):
    a = randf(3, 4)
    x, expected = make(a)
    idx = RNG.integers(0, 4, (3, 2))
    same(x.gather(1, Tensor(idx, device=x.device)), torch.from_numpy(expected).gather(1, torch.from_numpy(idx)),
         exact=False)


@pytest.mark.parametrize("device, name, dtype", per_device(
    [("int32", np.int32), ("bool", np.bool_), ("int8", np.int8), ("float16", np.float16)], {"bool", "int8"}))
def test_gather_keeps_dtype(device, name, dtype):
    a = RNG.integers(-3, 3, (3, 4)).astype(dtype)
    idx = RNG.integers(0, 3, (2, 4))
    same(Tensor(a, device=device).gather(0, Tensor(idx, device=device)),
         torch.from_numpy(a).gather(0, torch.from_numpy(idx)))


def test_gather_backward_is_scatter_add(device):
    a, idx = randf(3, 4), np.array([[0, 0, 3], [1, 1, 1], [2, 0, 2]])
    w = randf(3, 3)
    x = Tensor(a, device=device, requires_grad=True)
    (x.gather(1, Tensor(idx, device=device)) * Tensor(w, device=device)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    (tx.gather(1, torch.from_numpy(idx)) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **BWD)


def test_gather_is_one_kernel(device):
    x = Tensor(randf(8, 6), device=device).realize()
    idx = Tensor(RNG.integers(0, 6, (8, 3)), device=device).realize()
    out = x.gather(1, idx)
    GlobalCounters.reset()
    out.realize()
    assert GlobalCounters.kernel_count == 1


def test_gather_errors_like_torch(device):
    a = np.zeros((3, 4), np.float32)
    x, tx = Tensor(a, device=device), torch.from_numpy(a)
    for idx, exc in ((np.array([0]), RuntimeError), (np.array([[0, 1, 2, 0, 0]]), RuntimeError),
                     (np.array([[0.0]], np.float32), RuntimeError)):
        with pytest.raises(exc):
            tx.gather(0, torch.from_numpy(idx))
        with pytest.raises(exc):
            x.gather(0, Tensor(idx, device=device))
    with pytest.raises(IndexError):
        tx.gather(2, torch.tensor([[0]]))
    with pytest.raises(IndexError):
        x.gather(2, Tensor([[0]], device=device))


def test_index_select(device):
    a = randf(4, 5)
    idx = np.array([4, 0, 0])
    same(Tensor(a, device=device).index_select(1, Tensor(idx, device=device)),
         torch.from_numpy(a).index_select(1, torch.from_numpy(idx)))
    with pytest.raises(IndexError):
        torch.from_numpy(a).index_select(0, torch.tensor([[0]]))
    with pytest.raises(IndexError):
        Tensor(a, device=device).index_select(0, Tensor([[0]], device=device))


# --------------------------------------------------------------------------------------------
# scatter, scatter_reduce
# --------------------------------------------------------------------------------------------

BASE = randf(3, 4)
IDX = np.array([[0, 1, 2, 0], [2, 0, 0, 1]])
SRC = randf(2, 4)


@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
def test_scatter_matches_torch(device, reduce):
    kw = {"reduce": reduce} if reduce else {}
    want = torch.from_numpy(BASE).scatter(0, torch.from_numpy(IDX), torch.from_numpy(SRC), **kw)
    x, idx, src = Tensor(BASE, device=device), Tensor(IDX, device=device), Tensor(SRC, device=device)
    if reduce:  # a tensor src with reduce is tinygrad's TypeError; scatter_reduce is the same combination
        with pytest.raises(TypeError, match="scatter_reduce"):
            x.scatter(0, idx, src, reduce)
        same(x.scatter_reduce(0, idx, src, {"add": "sum", "multiply": "prod"}[reduce]), want, exact=False)
    else:
        same(x.scatter(0, idx, src), want, exact=False)
    want = torch.from_numpy(BASE).scatter(1, torch.from_numpy(IDX[:, :3]), 2.5, **kw)
    same(Tensor(BASE, device=device).scatter(1, Tensor(IDX[:, :3], device=device), 2.5, reduce), want, exact=False)


def test_scatter_repeated_index_last_wins(device):
    got = Tensor.zeros(3, device=device).scatter(0, Tensor([1, 1, 1], device=device), Tensor([1., 2., 3.],
                                                                                            device=device))
    same(got, torch.zeros(3).scatter(0, torch.tensor([1, 1, 1]), torch.tensor([1., 2., 3.])))


SCATTER_REDUCE_CASES = [(f"{r}-{'self' if inc else 'noself'}", r, inc) for r in ("sum", "prod", "mean", "amax", "amin")
                        for inc in (True, False)]


@pytest.mark.parametrize("device, name, reduce, include_self", per_device(SCATTER_REDUCE_CASES, {
    "sum-self", "mean-noself", "amax-self", "prod-noself"}))
def test_scatter_reduce_matches_torch(device, name, reduce, include_self):
    want = torch.from_numpy(BASE).scatter_reduce(0, torch.from_numpy(IDX), torch.from_numpy(SRC), reduce,
                                                 include_self=include_self)
    got = Tensor(BASE, device=device).scatter_reduce(0, Tensor(IDX, device=device), Tensor(SRC, device=device),
                                                     reduce, include_self=include_self)
    same(got, want, exact=False)
    bi, si = (BASE * 10).astype(np.int32), (SRC * 10).astype(np.int32)
    want = torch.from_numpy(bi).scatter_reduce(1, torch.from_numpy(IDX), torch.from_numpy(si), reduce,
                                               include_self=include_self)
    got = Tensor(bi, device=device).scatter_reduce(1, Tensor(IDX, device=device), Tensor(si, device=device), reduce,
                                                   include_self=include_self)
    same(got, want)


@pytest.mark.parametrize("device, reduce", per_device([("sum",), ("mean",), ("amax",), ("amin",)], {"mean", "amax"}))
def test_scatter_reduce_backward(device, reduce):
    w = randf(3, 4)
    x, s = Tensor(BASE, device=device, requires_grad=True), Tensor(SRC, device=device, requires_grad=True)
    (x.scatter_reduce(0, Tensor(IDX, device=device), s, reduce) * Tensor(w, device=device)).sum().backward()
    tx, ts = torch.tensor(BASE, requires_grad=True), torch.tensor(SRC, requires_grad=True)
    (tx.scatter_reduce(0, torch.from_numpy(IDX), ts, reduce) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **BWD)
    np.testing.assert_allclose(s.grad.numpy(), ts.grad.numpy(), **BWD)


def test_scatter_add_backward(device):
    w = randf(3, 4)
    x, s = Tensor(BASE, device=device, requires_grad=True), Tensor(SRC, device=device, requires_grad=True)
    (x.scatter_add(0, Tensor(IDX, device=device), s) * Tensor(w, device=device)).sum().backward()
    tx, ts = torch.tensor(BASE, requires_grad=True), torch.tensor(SRC, requires_grad=True)
    (tx.scatter_add(0, torch.from_numpy(IDX), ts) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **BWD)
    np.testing.assert_allclose(s.grad.numpy(), ts.grad.numpy(), **BWD)


def test_scatter_errors_like_torch(device):
    x, tx = Tensor(BASE, device=device), torch.from_numpy(BASE)
    calls = [
        (lambda t, T: t.scatter(0, T([[0]]), T([[1]])), RuntimeError),  # src dtype differs
        (lambda t, T: t.scatter(0, T([[0, 1]]), T([[1.0]])), RuntimeError),  # src smaller than index
        (lambda t, T: t.scatter(0, T([[0, 1]]), 1.0, reduce="foo"), RuntimeError),
        (lambda t, T: t.scatter_reduce(0, T([[0, 1]]), t, reduce="foo"), RuntimeError),
        (lambda t, T: t.scatter(0, T([0, 1]), 1.0), RuntimeError),  # index dims differ
    ]
    raises_in_both(calls, tx, torch.tensor, x, lambda v: Tensor(v, device=device))


# --------------------------------------------------------------------------------------------
# masks and nonzero
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device, name, mask_shape", per_device(
    [("same", (3, 4)), ("row", (4,)), ("bigger", (2, 3, 4)), ("scalar", ())], {"row", "bigger"}))
def test_masked_fill_matches_torch(device, name, mask_shape):
    a = randf(3, 4)
    m = RNG.random(mask_shape) > 0.5
    want = torch.from_numpy(a).masked_fill(torch.from_numpy(np.asarray(m)), -2.0)
    same(Tensor(a, device=device).masked_fill(Tensor(m, device=device), -2.0), want)
    ai = (a * 10).astype(np.int32)
    want = torch.from_numpy(ai).masked_fill(torch.from_numpy(np.asarray(m)), 2.7)
    same(Tensor(ai, device=device).masked_fill(Tensor(m, device=device), 2.7), want)


def test_masked_fill_backward(device):
    a, m, w = randf(3, 4), RNG.random((3, 4)) > 0.5, randf(3, 4)
    x, v = Tensor(a, device=device, requires_grad=True), Tensor(np.float32(1.5), device=device, requires_grad=True)
    (x.masked_fill(Tensor(m, device=device), v) * Tensor(w, device=device)).sum().backward()
    tx, tv = torch.tensor(a, requires_grad=True), torch.tensor(1.5, requires_grad=True)
    (tx.masked_fill(torch.from_numpy(m), tv) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **BWD)
    np.testing.assert_allclose(v.grad.numpy(), tv.grad.numpy(), **BWD)


def test_masked_fill_errors_like_torch(device):
    x, tx = Tensor(randf(3, 4), device=device), torch.zeros(3, 4)
    cases = [
        (lambda t, T: t.masked_fill(T(np.ones(4, np.int64)), 1), RuntimeError),
        (lambda t, T: t.masked_fill(T(np.ones(4, bool)), T(np.ones(1, np.float32))), RuntimeError),
        (lambda t, T: t.masked_fill(T(np.ones(5, bool)), 1), RuntimeError),
    ]
    raises_in_both(cases, tx, torch.from_numpy, x, lambda v: Tensor(v, device=device))


@pytest.mark.parametrize("device, name, mask_shape", per_device(
    [("same", (3, 4)), ("row", (4,)), ("bigger", (2, 3, 4))], {"bigger"}))
def test_masked_select_matches_torch(device, name, mask_shape):
    a, m = randf(3, 4), RNG.random(mask_shape) > 0.4
    same(Tensor(a, device=device).masked_select(Tensor(m, device=device)),
         torch.from_numpy(a).masked_select(torch.from_numpy(m)))


def test_masked_select_backward_and_errors(device):
    a, m = randf(3, 4), RNG.random((3, 4)) > 0.4
    w = randf(int(m.sum()))
    x = Tensor(a, device=device, requires_grad=True)
    (x.masked_select(Tensor(m, device=device)) * Tensor(w, device=device)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    (tx.masked_select(torch.from_numpy(m)) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **BWD)
    with pytest.raises(RuntimeError):
        tx.masked_select(torch.ones(3, 4))
    with pytest.raises(RuntimeError):
        x.masked_select(Tensor.ones(3, 4, device=device))
    with pytest.raises(RuntimeError):
        tx.masked_select(torch.ones(2, dtype=torch.bool))
    with pytest.raises(RuntimeError):
        x.masked_select(Tensor.ones(2, dtype=dtypes.bool, device=device))


@pytest.mark.parametrize("shape", [(3, 4), (5,), (), (2, 0)])
def test_nonzero_matches_torch(device, shape):
    a = np.asarray(RNG.random(shape) > 0.5).astype(np.float32)
    # positions come back in the default int, int32 as in tinygrad (torch: int64)
    same(Tensor(a, device=device).nonzero(), tg_index(torch.from_numpy(a).nonzero()))
    for got, want in zip(Tensor(a, device=device).nonzero(as_tuple=True), torch.from_numpy(a).nonzero(as_tuple=True)):
        same(got, tg_index(want))
