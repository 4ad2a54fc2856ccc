"""Movement ops (reshape, permute, expand, pad, shrink, flip and the indexing built on them) against numpy.

Every op is applied to contiguous and non-contiguous inputs (see the ``view`` kinds in conftest.py), and to
0-d and size-0 tensors.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor, dtypes

A234 = np.arange(24, dtype=np.int32).reshape(2, 3, 4) * 3 - 20


def np_pad(a: np.ndarray, pads: list[tuple[int, int]], value: float = 0) -> np.ndarray:
    """numpy pad that also accepts negative amounts (which crop), like ``Tensor.pad``."""
    crop = tuple(slice(max(-lo, 0), s - max(-hi, 0)) for (lo, hi), s in zip(pads, a.shape))
    return np.pad(a[crop], [(max(lo, 0), max(hi, 0)) for lo, hi in pads], constant_values=value)


# name: (ember op, numpy op), both applied to a (2, 3, 4) array
MOVES = {
    "reshape": (lambda t: t.reshape(4, 6), lambda a: a.reshape(4, 6)),
    "reshape_tuple": (lambda t: t.reshape((6, 2, 2)), lambda a: a.reshape(6, 2, 2)),
    "reshape_infer": (lambda t: t.reshape(3, -1), lambda a: a.reshape(3, -1)),
    "reshape_flat": (lambda t: t.reshape(-1), lambda a: a.reshape(-1)),
    "reshape_ones": (lambda t: t.reshape(1, 2, 1, 12, 1), lambda a: a.reshape(1, 2, 1, 12, 1)),
    "view": (lambda t: t.view(2, 12), lambda a: a.reshape(2, 12)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    "permute_negative": (lambda t: t.permute((-1, -3, -2)), lambda a: a.transpose(2, 0, 1)),
    "expand": (lambda t: t.reshape(2, 1, 3, 4).expand(2, 5, 3, 4), lambda a: np.broadcast_to(a[:, None], (2, 5, 3, 4))),
    "expand_new_dims": (lambda t: t.expand(3, 2, 3, 4), lambda a: np.broadcast_to(a, (3, 2, 3, 4))),
    "expand_minus_one": (lambda t: t[:, :1].expand(-1, 4, -1), lambda a: np.broadcast_to(a[:, :1], (2, 4, 4))),
    "pad": (lambda t: t.pad(((1, 0), (0, 2), (1, 1))), lambda a: np_pad(a, [(1, 0), (0, 2), (1, 1)])),
    "pad_value": (lambda t: t.pad(((0, 1), (2, 0), (0, 0)), value=7), lambda a: np_pad(a, [(0, 1), (2, 0), (0, 0)], 7)),
    "pad_negative": (lambda t: t.pad(((-1, 0), (0, -1), (1, -2))), lambda a: np_pad(a, [(-1, 0), (0, -1), (1, -2)])),
    "pad_negative_value": (lambda t: t.pad(((0, 0), (-2, 1), (2, -3)), value=-5),
                           lambda a: np_pad(a, [(0, 0), (-2, 1), (2, -3)], -5)),
    "pad_flat": (lambda t: t.pad((1, 2)), lambda a: np_pad(a, [(0, 0), (0, 0), (1, 2)])),
    "pad_flat_two_dims": (lambda t: t.pad((0, 1, 2, 0)), lambda a: np_pad(a, [(0, 0), (2, 0), (0, 1)])),
    "pad_none": (lambda t: t.pad((None, (1, 1), None)), lambda a: np_pad(a, [(0, 0), (1, 1), (0, 0)])),
    "shrink": (lambda t: t.shrink(((0, 1), (1, 3), (2, 4))), lambda a: a[0:1, 1:3, 2:4]),
    "shrink_none": (lambda t: t.shrink((None, (2, 3), None)), lambda a: a[:, 2:3]),
    "shrink_to_empty": (lambda t: t.shrink(((1, 1), None, None)), lambda a: a[1:1]),
    "flip": (lambda t: t.flip(0, 2), lambda a: a[::-1, :, ::-1]),
    "flip_negative": (lambda t: t.flip(-2), lambda a: a[:, ::-1]),
    "flip_all": (lambda t: t.flip((0, 1, 2)), lambda a: a[::-1, ::-1, ::-1]),
    "transpose": (lambda t: t.transpose(0, 2), lambda a: a.transpose(2, 1, 0)),
    "transpose_default": (lambda t: t.transpose(), lambda a: a.transpose(1, 0, 2)),
    "T": (lambda t: t.T, lambda a: a.T),
    "flatten": (lambda t: t.flatten(), lambda a: a.reshape(-1)),
    "flatten_from_1": (lambda t: t.flatten(1), lambda a: a.reshape(2, 12)),
    "flatten_range": (lambda t: t.flatten(0, 1), lambda a: a.reshape(6, 4)),
    "unsqueeze": (lambda t: t.unsqueeze(1), lambda a: a[:, None]),
    "unsqueeze_end": (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    "squeeze": (lambda t: t[:, 1:2].squeeze(1), lambda a: a[:, 1]),
    "squeeze_all": (lambda t: t[:1, :, 2:3].squeeze(), lambda a: a[0, :, 2]),
    "squeeze_noop": (lambda t: t.squeeze(0), lambda a: a),
    "slice_basic": (lambda t: t[1:, ::2], lambda a: a[1:, ::2]),
    "slice_reverse": (lambda t: t[::-1], lambda a: a[::-1]),
    "slice_newaxis_int": (lambda t: t[..., None, 2], lambda a: a[..., None, 2]),
    "slice_negative_step": (lambda t: t[:, ::-2, 3:0:-2], lambda a: a[:, ::-2, 3:0:-2]),
    "slice_step3": (lambda t: t[:, :, ::3], lambda a: a[:, :, ::3]),
    "slice_ints": (lambda t: t[1, 2], lambda a: a[1, 2]),
    "slice_all_ints": (lambda t: t[1, -1, -4], lambda a: a[1, -1, -4]),
    "slice_negative_bounds": (lambda t: t[-1:, -2:, :-1], lambda a: a[-1:, -2:, :-1]),
    "slice_out_of_range": (lambda t: t[:, 1:100, -100:2], lambda a: a[:, 1:100, -100:2]),
    "slice_empty": (lambda t: t[:, 2:1], lambda a: a[:, 2:1]),
    "slice_ellipsis_middle": (lambda t: t[0, ..., 1:3], lambda a: a[0, ..., 1:3]),
    "slice_none_front": (lambda t: t[None, :, None], lambda a: a[None, :, None]),
    "slice_ellipsis_only": (lambda t: t[...], lambda a: a[...]),
    "slice_numpy_int": (lambda t: t[np.int64(1)], lambda a: a[1]),
    "chain": (lambda t: t.permute(1, 2, 0)[::-1, 1:].reshape(3, 6).pad(((0, 1), (1, 0))).flip(1)[:, ::2],
              lambda a: np_pad(a.transpose(1, 2, 0)[::-1, 1:].reshape(3, 6), [(0, 1), (1, 0)])[:, ::-1][:, ::2]),
}


# The moves that build distinct ShapeTrackers run on every layout; the rest are argument-handling variants of them
# and run on a contiguous and a permuted input.
CORE_MOVES = ("reshape", "reshape_infer", "permute", "expand", "pad", "pad_value", "pad_negative", "shrink", "flip",
              "slice_basic", "slice_negative_step", "slice_newaxis_int", "chain")


@pytest.mark.parametrize("name", CORE_MOVES)
def test_movement_views(name, make, check):
    ours, theirs = MOVES[name]
    t, e = make(A234)
    check(ours(t), theirs(e))


@pytest.mark.views("contiguous", "permuted")
@pytest.mark.parametrize("name", [n for n in MOVES if n not in CORE_MOVES])
def test_movement_variants(name, make, check):
    ours, theirs = MOVES[name]
    t, e = make(A234)
    check(ours(t), theirs(e))


@pytest.mark.parametrize("name", ["reshape", "permute", "pad_negative", "flip", "slice_negative_step"])
def test_movement_float_and_bool(device, check, name):
    ours, theirs = MOVES[name]
    f = (A234 / 7).astype(np.float32)
    check(ours(Tensor(f, device=device)), theirs(f))
    b = A234 % 3 == 0
    check(ours(Tensor(b, device=device)), theirs(b))


def test_movement_then_elementwise_same_buffer(make, check):
    # two different views of one buffer feeding one kernel
    t, e = make(np.arange(16, dtype=np.float32).reshape(4, 4))
    check(t + t.T, e + e.T)
    check(t[::-1] * t[:, ::-1], e[::-1] * e[:, ::-1])
    check(t.pad(((1, 0), (0, 1)))[:4, 1:] - t, np_pad(e, [(1, 0), (0, 1)])[:4, 1:] - e)


def test_zero_dim(device, check):
    a = np.array(5.5, np.float32)
    t = Tensor(a, device=device)
    check(t.reshape(1, 1), a.reshape(1, 1))
    check(t.reshape(()), a)
    check(t.reshape(-1), a.reshape(-1))
    check(t.unsqueeze(0), a[None])
    check(t.unsqueeze(-1), a[None])
    check(t[None], a[None])
    check(t[None, None], a[None, None])
    check(t[...], a)
    check(t.expand(2, 3), np.broadcast_to(a, (2, 3)))
    check(t.flatten(), a.reshape(1))
    check(t.permute(), a)
    check(t.flip(), a)
    check(t.squeeze(), a)
    check(Tensor(np.array([3.0], np.float32), device=device).reshape(()), np.array(3.0, np.float32))
    check(Tensor(np.ones((1, 1), np.float32), device=device).squeeze(), np.array(1.0, np.float32))
    check(t.reshape(1).pad(((2, 1),), value=1.0), np.array([1, 1, 5.5, 1], np.float32))


@pytest.mark.parametrize("name, ours, theirs", [
    ("reshape", lambda t: t.reshape(3, 0), lambda a: a.reshape(3, 0)),
    ("reshape_infer", lambda t: t.reshape(3, -1), lambda a: a.reshape(3, -1)),
    ("reshape_flat", lambda t: t.reshape(-1), lambda a: a.reshape(-1)),
    ("reshape_ones", lambda t: t.reshape(3, 0, 1), lambda a: a.reshape(3, 0, 1)),
    ("permute", lambda t: t.permute(1, 0), lambda a: a.T),
    ("expand", lambda t: t.reshape(0, 3, 1).expand(0, 3, 4), lambda a: np.broadcast_to(a[..., None], (0, 3, 4))),
    ("pad", lambda t: t.pad(((1, 2), (0, 1))), lambda a: np.pad(a, ((1, 2), (0, 1)))),
    ("pad_value", lambda t: t.pad(((2, 0), (0, 0)), value=3.0), lambda a: np.pad(a, ((2, 0), (0, 0)),
                                                                                    constant_values=3.0)),
    ("shrink", lambda t: t.shrink((None, (1, 2))), lambda a: a[:, 1:2]),
    ("flip", lambda t: t.flip(0, 1), lambda a: a[::-1, ::-1]),
    ("slice", lambda t: t[:, ::-2], lambda a: a[:, ::-2]),
    ("newaxis", lambda t: t[None, ..., None], lambda a: a[None, ..., None]),
    ("newaxis_no_ellipsis", lambda t: t[None, :, :, None], lambda a: a[None, :, :, None]),
    ("flatten", lambda t: t.flatten(), lambda a: a.reshape(-1)),
    ("unsqueeze", lambda t: t.unsqueeze(1), lambda a: a[:, None]),
])
def test_size_zero(device, check, name, ours, theirs):
    a = np.zeros((0, 3), np.float32)
    check(ours(Tensor(a, device=device)), theirs(a))


def test_reshape_of_permuted_needs_real_copy(device, check):
    # a reshape that cannot be expressed as a view of the permuted strides
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a, device=device).T.reshape(2, 6)
    check(t, a.T.reshape(2, 6))
    check(t.reshape(12)[::5], a.T.reshape(12)[::5])


def test_views_of_realized_views(device, check):
    a = np.arange(20, dtype=np.int32).reshape(4, 5)
    t = Tensor(a, device=device)[1:, ::2].realize()
    check(t, a[1:, ::2])
    check(t.T.flip(0), a[1:, ::2].T[::-1])
    check((t + 0)[::-1].realize().reshape(-1), (a[1:, ::2])[::-1].reshape(-1))


def test_movement_is_lazy_and_keeps_dtype(device):
    for dt in (dtypes.int8, dtypes.uint16, dtypes.float16, dtypes.float64, dtypes.bool):
        t = Tensor.zeros(2, 3, dtype=dt, device=device)
        for moved in (t.reshape(3, 2), t.T, t.pad(((1, 1), (0, 0))), t.flip(0), t[1:], t.expand(4, 2, 3)):
            assert moved.dtype == dt and moved.device == device


def test_pad_every_dtype(device, check):
    for npdt in (np.int8, np.uint8, np.int64, np.float16, np.float64, np.bool_):
        a = (np.arange(6) % 4).astype(npdt).reshape(2, 3)
        check(Tensor(a, device=device).pad(((1, 0), (0, 1))), np.pad(a, ((1, 0), (0, 1))))


def test_pad_value_keeps_dtype(device, check):
    # like torch: the value is cast to the tensor's dtype, never the other way round
    b = np.array([True, False])
    check(Tensor(b, device=device).pad(((1, 1),), value=-5), np.array([True, True, False, True]))
    i = np.array([1, 2], np.int32)
    check(Tensor(i, device=device).pad(((1, 1),), value=2.5), np.array([2, 1, 2, 2], np.int32))


def test_pad_value_same_kind(device, check):
    i = np.array([1, 2], np.int32)
    check(Tensor(i, device=device).pad(((1, 2),), value=-3), np.array([-3, 1, 2, -3, -3], np.int32))
    f = np.array([1.5], np.float16)
    check(Tensor(f, device=device).pad(((0, 1),), value=2.5), np.array([1.5, 2.5], np.float16))
    b = np.array([False])
    check(Tensor(b, device=device).pad(((1, 0),), value=True), np.array([True, False]))
