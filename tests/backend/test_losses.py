"""Loss functions against torch.nn.functional: values, shapes, dtypes, gradients and errors."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from backend_utils import FWD, compare_with_torch, raises_like

from ember import Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(3)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def labels(n_cls: int, *shape: int, ignore: int | None = None) -> np.ndarray:
    y = rng.integers(0, n_cls, size=shape).astype(np.int64)
    if ignore is not None and y.size:
        y.reshape(-1)[:: 3] = ignore  # every third label is ignored
    return y


# the upstream gradient of a comparison is drawn like the other inputs of this module
compare = partial(compare_with_torch, upstream=randn)


# --------------------------------------------------------------------------------------------------
# cross entropy with class indices
# --------------------------------------------------------------------------------------------------
CE_CASES = [
    {},
    {"reduction": "sum"},
    {"reduction": "none", "label_smoothing": 0.2},
    {"ignore_index": 1},
    {"weight": True, "label_smoothing": 0.3},
    {"weight": True, "ignore_index": 2, "reduction": "mean"},
]


@pytest.mark.parametrize("kw", CE_CASES, ids=str)
def test_cross_entropy_indices(device, kw):
    kw = dict(kw)
    weight = np.abs(randn(4)) + 0.1 if kw.pop("weight", False) else None
    y = labels(4, 6, ignore=kw.get("ignore_index"))
    compare(device, lambda x, y, w: x.cross_entropy(y, weight=w, **kw),
            lambda x, y, w: F.cross_entropy(x, y, weight=w, **kw), [randn(6, 4), y, weight], const=(2,))


def test_cross_entropy_shapes_and_views(device):
    # (N, C, d) logits, 1-D logits with a 0-d target, permuted logits
    compare(device, lambda x, y: x.cross_entropy(y, label_smoothing=0.1),
            lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1), [randn(2, 3, 4), labels(3, 2, 4)])
    compare(device, lambda x, y: x.cross_entropy(y), lambda x, y: F.cross_entropy(x, y),
            [randn(5), np.array(3, np.int64)])
    compare(device, lambda x, y: x.cross_entropy(y, reduction="none"),
            lambda x, y: F.cross_entropy(x, y, reduction="none"), [randn(3, 5), labels(5, 3)],
            ["permuted", "contiguous"])


def test_cross_entropy_probabilities(device):
    p = np.abs(randn(4, 3)) + 0.05
    p /= p.sum(1, keepdims=True)
    compare(device, lambda x, y: x.cross_entropy(y), lambda x, y: F.cross_entropy(x, y), [randn(4, 3), p])
    compare(device, lambda x, y, w: x.cross_entropy(y, label_smoothing=0.2, reduction="sum", weight=w),
            lambda x, y, w: F.cross_entropy(x, y, label_smoothing=0.2, reduction="sum", weight=w),
            [randn(4, 3), p, np.abs(randn(3))], const=(2,))


def test_cross_entropy_all_ignored_is_nan(device):
    x = Tensor(randn(2, 3), device=device)
    y = Tensor(np.full(2, -100, np.int64), device=device)
    assert np.isnan(x.cross_entropy(y).item())
    assert np.isnan(F.cross_entropy(torch.tensor(x.numpy()), torch.full((2,), -100)).item())


# --------------------------------------------------------------------------------------------------
# nll_loss and sparse_categorical_crossentropy
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"ignore_index": 0, "weight": True},
                                {"reduction": "none", "weight": True}], ids=str)
def test_nll_loss(device, kw):
    kw = dict(kw)
    weight = np.abs(randn(4)) + 0.1 if kw.pop("weight", False) else None
    logp = np.log(np.abs(randn(5, 4, 2)) + 0.1).astype(np.float32)
    y = labels(4, 5, 2, ignore=kw.get("ignore_index"))
    tkw = dict(kw)
    tkw.setdefault("ignore_index", -100)
    compare(device, lambda x, y, w: x.nll_loss(y, weight=w, **kw), lambda x, y, w: F.nll_loss(x, y, weight=w, **tkw),
            [logp, y, weight], const=(2,))


@pytest.mark.parametrize("kw", [{}, {"ignore_index": 2, "label_smoothing": 0.1}, {"reduction": "sum"},
                                {"reduction": "none", "label_smoothing": 0.4}], ids=str)
def test_sparse_categorical_crossentropy(device, kw):
    # classes on the last axis; torch wants them on dim 1
    y = labels(4, 2, 3, ignore=kw.get("ignore_index"))
    tkw = {"ignore_index": -1, **kw}
    compare(device, lambda x, y: x.sparse_categorical_crossentropy(y, **kw),
            lambda x, y: F.cross_entropy(x.permute(0, 2, 1), y, **tkw), [randn(2, 3, 4), y])


def test_sparse_categorical_crossentropy_ignores_minus_one_by_default(device):
    x, y = randn(4, 3), np.array([0, -1, 2, 1], np.int64)
    compare(device, lambda x, y: x.sparse_categorical_crossentropy(y),
            lambda x, y: F.cross_entropy(x, y, ignore_index=-1), [x, y])


# --------------------------------------------------------------------------------------------------
# binary cross entropy
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(device, reduction):
    p = (0.05 + 0.9 * rng.random((3, 4))).astype(np.float32)
    y = rng.random((3, 4)).astype(np.float32)
    compare(device, lambda p, y: p.binary_crossentropy(y, reduction=reduction),
            lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction), [p, y])
    x = (randn(3, 4) * 4).astype(np.float32)
    compare(device, lambda x, y: x.binary_crossentropy_logits(y, reduction=reduction),
            lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), [x, y])


def test_binary_crossentropy_edges_and_pos_weight(device):
    # probabilities of exactly 0 and 1: torch clamps the logs at -100
    p, y = np.array([0.0, 1.0, 0.5, 1.0], np.float32), np.array([1.0, 0.0, 1.0, 1.0], np.float32)
    out = Tensor(p, device=device).binary_crossentropy(Tensor(y, device=device), reduction="none")
    np.testing.assert_allclose(out.numpy(), F.binary_cross_entropy(torch.tensor(p), torch.tensor(y),
                                                                   reduction="none").numpy(), **FWD)
    x, t = np.array([[-80.0, 80.0, 0.5]], np.float32), (rng.random((2, 3)) > 0.5).astype(np.float32)
    compare(device, lambda x, t, w: x.binary_crossentropy_logits(t, pos_weight=w),
            lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, pos_weight=w),
            [np.repeat(x, 2, 0), t, np.abs(randn(3))], ["permuted", "contiguous", "contiguous"], const=(2,))


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------
def test_loss_errors():
    x, y = np.zeros((2, 3), np.float32), np.zeros(2, np.int64)
    tx, ty = torch.tensor(x), torch.tensor(y)
    raises_like(lambda: Tensor(x).cross_entropy(Tensor(y), reduction="avg"),
                lambda: F.cross_entropy(tx, ty, reduction="avg"))
    raises_like(lambda: Tensor(x).cross_entropy(Tensor(np.zeros(4, np.int64))),
                lambda: F.cross_entropy(tx, torch.zeros(4, dtype=torch.long)))
    raises_like(lambda: Tensor(x).cross_entropy(Tensor(y), label_smoothing=1.5),
                lambda: F.cross_entropy(tx, ty, label_smoothing=1.5))
    raises_like(lambda: Tensor(x).cross_entropy(Tensor(np.zeros((2, 4), np.float32))),
                lambda: F.cross_entropy(tx, torch.zeros(2, 4)))
    raises_like(lambda: Tensor(x).nll_loss(Tensor(np.zeros(4, np.int64))),
                lambda: F.nll_loss(tx, torch.zeros(4, dtype=torch.long)))
    raises_like(lambda: Tensor(x).nll_loss(Tensor(y), weight=Tensor(np.ones(4, np.float32))),
                lambda: F.nll_loss(tx, ty, weight=torch.ones(4)))
    raises_like(lambda: Tensor(x).binary_crossentropy(Tensor(np.zeros((2, 4), np.float32))),
                lambda: F.binary_cross_entropy(tx, torch.zeros(2, 4)))
    raises_like(lambda: Tensor(x).binary_crossentropy_logits(Tensor(np.zeros((2, 4), np.float32))),
                lambda: F.binary_cross_entropy_with_logits(tx, torch.zeros(2, 4)))
    raises_like(lambda: Tensor(x).binary_crossentropy(Tensor(x), reduction="bad"),
                lambda: F.binary_cross_entropy(tx, tx, reduction="bad"))
