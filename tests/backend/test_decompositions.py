"""Tensor.qr and Tensor.svd (tinygrad's names and signs) against numpy's factorizations."""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor

SHAPES = [(4, 4), (6, 3), (3, 5), (2, 5, 4), (1, 1)]


@pytest.mark.parametrize("shape", SHAPES)
def test_qr_factors(device: str, shape):
    a = np.random.default_rng(len(shape) * 10 + shape[-1]).standard_normal(shape).astype(np.float32)
    q, r = (t.numpy() for t in Tensor(a, device=device).qr())
    m = shape[-2]
    assert q.shape == shape[:-2] + (m, m) and r.shape == shape
    np.testing.assert_allclose(q @ r, a, atol=2e-6)
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(m), q.shape), atol=2e-6)
    np.testing.assert_allclose(np.tril(r, -1), 0, atol=1e-6)  # zero below the diagonal, up to rounding
    # |R|'s diagonal is numpy's (the signs are a convention)
    want = np.abs(np.diagonal(np.linalg.qr(a.astype(np.float64), mode="complete")[1], axis1=-2, axis2=-1))
    np.testing.assert_allclose(np.abs(np.diagonal(r, axis1=-2, axis2=-1)), want, rtol=1e-5, atol=1e-6)


def test_qr_signs_are_tinygrads(device: str):
    a = Tensor([[2., -1., 0.5], [1., 3., -2.], [0., 1., 4.], [1., 1., 1.]], device=device)
    q, r = a.qr()
    # tinygrad 0.14 gives these (every column reflected, the last one of a square part too)
    np.testing.assert_allclose(np.round(r.numpy(), 5), [[-2.44949, -0.8165, 0.0], [0.0, -3.3665, 0.44557],
                                                        [0.0, 0.0, -4.58819], [0.0, 0.0, 0.0]], atol=1e-5)
    np.testing.assert_allclose(q.numpy()[:, 0], [-0.8165, -0.40825, 0.0, -0.40825], atol=1e-5)
    np.testing.assert_allclose(q.numpy()[:, 3], [-0.29073, -0.27752, -0.31717, 0.85899], atol=1e-5)
    np.testing.assert_allclose(a.svd()[1].numpy(), [4.63612, 3.51768, 2.31998], atol=1e-5)  # tinygrad 0.14's S


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_svd_factors(device: str, shape, full: bool):
    a = np.random.default_rng(shape[-1]).standard_normal(shape).astype(np.float32)
    u, s, vh = (t.numpy() for t in Tensor(a, device=device).svd(full_matrices=full))
    nu, ns, nvh = np.linalg.svd(a, full_matrices=full)
    assert (u.shape, s.shape, vh.shape) == (nu.shape, ns.shape, nvh.shape)
    np.testing.assert_allclose(s, ns, rtol=1e-5, atol=2e-6)
    k = min(shape[-2:])
    np.testing.assert_allclose((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, atol=5e-6)
    np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u, np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] +
                                                                           (u.shape[-1],) * 2), atol=5e-6)


def test_rank_deficient_and_zero_matrices(device: str):
    a = np.outer([1.0, 2.0, 3.0], [1.0, -1.0, 0.5]).astype(np.float32)  # rank 1
    s = Tensor(a, device=device).svd()[1].numpy()
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), atol=1e-5)
    q, r = Tensor(np.zeros((3, 2), np.float32), device=device).qr()
    np.testing.assert_array_equal(r.numpy(), np.zeros((3, 2)))
    np.testing.assert_array_equal(q.numpy(), np.eye(3))


def test_bad_inputs_are_named(device: str):
    with pytest.raises(RuntimeError, match="two or more dimensions"):
        Tensor([1.0, 2.0], device=device).qr()
    with pytest.raises(RuntimeError, match="floating point"):
        Tensor([[1, 2], [3, 4]], device=device).svd()
