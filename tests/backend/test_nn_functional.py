"""Normalization, dropout, one_hot and attention against torch.nn.functional: values, shapes, dtypes,
gradients and errors."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from backend_utils import FWD, compare_with_torch, raises_like, tg_index

from ember import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(5)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# the upstream gradient of a comparison is drawn like the other inputs of this module
compare = partial(compare_with_torch, upstream=randn)


# --------------------------------------------------------------------------------------------------
# normalization
# --------------------------------------------------------------------------------------------------
def test_layernorm(device):
    compare(device, lambda x: x.layernorm(), lambda x: F.layer_norm(x, (5,)), [randn(2, 3, 5)])
    compare(device, lambda x: x.layernorm((-2, -1), eps=1e-3), lambda x: F.layer_norm(x, (3, 5), eps=1e-3),
            [randn(2, 3, 5)], ["permuted"])
    compare(device, lambda x: x.layernorm(), lambda x: F.layer_norm(x, (4,)), [randn(4)])


def test_batchnorm(device):
    x, mean, var, w, b = randn(2, 3, 4, 2), randn(3), np.abs(randn(3)) + 0.1, randn(3), randn(3)
    invstd = ((var + 1e-5) ** -0.5).astype(np.float32)
    # gradients also reach the statistics
    ch = (1, 3, 1, 1)
    compare(device, lambda x, w, b, m, s: x.batchnorm(w, b, m, s),
            lambda x, w, b, m, s: (x - m.reshape(ch)) * w.reshape(ch) * s.reshape(ch) + b.reshape(ch),
            [x, w, b, mean, invstd], ["flipped", "contiguous", "contiguous", "contiguous", "contiguous"])
    compare(device, lambda x, w, b: x.batchnorm(w, b, Tensor(mean, device=device), Tensor(invstd, device=device)),
            lambda x, w, b: F.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, eps=1e-5), [x, w, b])
    compare(device, lambda x: x.batchnorm(None, None, Tensor(mean, device=device), Tensor(invstd, device=device)),
            lambda x: F.batch_norm(x, torch.tensor(mean), torch.tensor(var), eps=1e-5), [randn(4, 3)])
    # the statistics can lie along any axis
    stats = Tensor(randn(2), device=device), Tensor(invstd[:2], device=device)
    out = Tensor(x, device=device).batchnorm(None, None, *stats, axis=-1)
    assert out.shape == x.shape


def test_group_norm_and_rms_norm(device):
    compare(device, lambda x, w, b: x.group_norm(2, w, b), lambda x, w, b: F.group_norm(x, 2, w, b),
            [randn(2, 4, 3, 2), randn(4), randn(4)])
    compare(device, lambda x: x.group_norm(3, eps=1e-3), lambda x: F.group_norm(x, 3, eps=1e-3), [randn(1, 6, 5)])
    compare(device, lambda x: x.rms_norm(), lambda x: F.rms_norm(x, (4,), eps=1e-6), [randn(3, 4)], ["permuted"])
    compare(device, lambda x: x.rms_norm((-2, -1), eps=1e-4), lambda x: F.rms_norm(x, (3, 4), eps=1e-4),
            [randn(2, 3, 4)])
    x = np.zeros((2, 6, 3), np.float32)
    raises_like(lambda: Tensor(x).group_norm(4), lambda: F.group_norm(torch.tensor(x), 4))


# --------------------------------------------------------------------------------------------------
# dropout
# --------------------------------------------------------------------------------------------------
def test_dropout(device):
    x = Tensor(np.ones((40, 50), np.float32), device=device, requires_grad=True)
    assert x.dropout(0.5) is x  # not training
    with Tensor.train():
        assert x.dropout(0.0) is x
        np.testing.assert_array_equal(x.dropout(1.0).numpy(), np.zeros((40, 50), np.float32))
        Tensor.manual_seed(3)
        y = x.dropout(0.25)
        vals = y.numpy()
        assert y.shape == x.shape and y.dtype == x.dtype
        assert set(np.unique(vals)) <= {0.0, np.float32(1 / 0.75)}
        assert 0.18 < (vals == 0).mean() < 0.32
        y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), vals)  # gradient flows only where kept, with the same scale


def test_dropout_invalid_p():
    raises_like(lambda: Tensor([1.0]).dropout(1.5), lambda: F.dropout(torch.tensor([1.0]), 1.5))
    raises_like(lambda: Tensor([1.0]).dropout(-0.1), lambda: F.dropout(torch.tensor([1.0]), -0.1))


# --------------------------------------------------------------------------------------------------
# one_hot
# --------------------------------------------------------------------------------------------------
def test_one_hot(device):
    y = rng.integers(0, 5, size=(2, 3)).astype(np.int64)
    # the result is the default int, int32 as in tinygrad (torch: int64)
    compare(device, lambda t: t.one_hot(6), lambda t: tg_index(F.one_hot(t, 6)), [y])
    compare(device, lambda t: t.one_hot(), lambda t: tg_index(F.one_hot(t)), [y], ["permuted"])
    compare(device, lambda t: t.one_hot(3), lambda t: tg_index(F.one_hot(t, 3)), [np.array(2, np.int64)])
    compare(device, lambda t: t.one_hot(4), lambda t: tg_index(F.one_hot(t, 4)), [np.zeros((0,), np.int64)])


def test_one_hot_errors():
    raises_like(lambda: Tensor(np.zeros(3, np.float32)).one_hot(3), lambda: F.one_hot(torch.zeros(3), 3))
    raises_like(lambda: Tensor(np.zeros(0, np.int64)).one_hot(), lambda: F.one_hot(torch.zeros(0, dtype=torch.long)))


# --------------------------------------------------------------------------------------------------
# scaled dot product attention
# --------------------------------------------------------------------------------------------------
def test_sdpa(device):
    q, k, v = randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5)
    sdpa = F.scaled_dot_product_attention
    compare(device, lambda q, k, v: q.scaled_dot_product_attention(k, v), lambda q, k, v: sdpa(q, k, v), [q, k, v])
    compare(device, lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
            lambda q, k, v: sdpa(q, k, v, is_causal=True), [q, k, v], ["permuted", "flipped", "contiguous"])
    mask = rng.random((4, 6)) > 0.4
    mask[:, 0] = True
    compare(device, lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(mask, device=device)),
            lambda q, k, v: sdpa(q, k, v, attn_mask=torch.tensor(mask)), [q, k, v])
    fmask = randn(1, 3, 4, 6)
    compare(device, lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m, scale=0.3),
            lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, scale=0.3), [q, k, v, fmask])


def test_sdpa_gqa_and_3d(device):
    q, k, v = randn(1, 4, 3, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 3)
    compare(device, lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), [q, k, v])
    q3, k3, v3 = randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 2)
    compare(device, lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q3, k3, v3])


def test_sdpa_causal_with_mask_is_an_error():
    q = np.zeros((2, 3, 4), np.float32)
    m = np.ones((3, 3), bool)
    raises_like(lambda: Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(q), attn_mask=Tensor(m),
                                                               is_causal=True),
                lambda: F.scaled_dot_product_attention(torch.tensor(q), torch.tensor(q), torch.tensor(q),
                                                       attn_mask=torch.tensor(m), is_causal=True))


def test_sdpa_dropout_only_in_training(device):
    q = Tensor(randn(1, 3, 4), device=device)
    a = q.scaled_dot_product_attention(q, q, dropout_p=0.5).numpy()
    b = q.scaled_dot_product_attention(q, q).numpy()
    np.testing.assert_allclose(a, b, **FWD)
    assert q.scaled_dot_product_attention(q, q).dtype == dtypes.float32
