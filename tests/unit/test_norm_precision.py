"""Normalization statistics over long axes of data with a large mean, against float64 numpy (and torch).

A float32 sum of 65536 values near 1000 rounds at the scale of its running total (~6.5e7, ulps of 4-8), so a
mean taken as one plain sum is off by ~3e-4 and a normalized output with unit spread by as much. The statistics
are taken about a sample of the data and summed in two levels (``Tensor._centered_mean``, ``_blocked_sum``);
the outputs then agree with float64 to about the float32 spacing of the inputs, as torch's do.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from ember import Tensor, dtypes, nn

OFFSET = 1000.0
#: one float32 spacing at the inputs' magnitude (6.1e-5): the mean subtracted from x is rounded to half of it; a
#: mean summed plainly misses by 1.5-30 spacings (the float64 error of each case before the two-level sums)
TOL = float(np.spacing(np.float32(OFFSET)))
#: against torch, whose own output is off from float64 too: ~0.8 spacing for batch_norm, up to ~1.8 for
#: layer_norm (it sums in float32)
TORCH_TOL = 3 * TOL


def _torch():
    return pytest.importorskip("torch", reason="torch is the second oracle of this check; not installed")


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) + OFFSET).astype(np.float32)


def _normalized(x: np.ndarray, axes: tuple[int, ...], eps: float = 1e-5) -> np.ndarray:
    """The float64 reference: (x - mean) / sqrt(biased var + eps) over ``axes``."""
    x64 = x.astype(np.float64)
    return (x64 - x64.mean(axes, keepdims=True)) / np.sqrt(x64.var(axes, keepdims=True) + eps)


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)))


@pytest.fixture
def training():
    with Tensor.train():
        yield


@pytest.mark.parametrize("shape", [(16, 32, 64, 64), (256, 16, 8, 8)])
def test_batchnorm2d_training_large_mean(training: None, shape: tuple[int, ...]) -> None:
    """16384-65536 values per channel near 1000: output and running statistics as float64 gives them."""
    x = _data(*shape)
    layer = nn.BatchNorm2d(shape[1])
    out = layer(Tensor(x)).numpy()
    assert _err(out, _normalized(x, (0, 2, 3))) < TOL
    x64 = x.astype(np.float64)
    n = x.size // x.shape[1]
    mean, var = x64.mean((0, 2, 3)), x64.var((0, 2, 3))
    # 0.9 * 0 + 0.1 * mean rounds to float32 at ~100: one spacing there (7.6e-6), two allowed
    assert _err(layer.running_mean.numpy(), 0.1 * mean) < 2 * float(np.spacing(np.float32(0.1 * OFFSET)))
    np.testing.assert_allclose(layer.running_var.numpy(), 0.9 + 0.1 * var * n / (n - 1), rtol=1e-6)


def test_batchnorm2d_training_large_mean_torch(training: None) -> None:
    torch = _torch()
    x = _data(16, 32, 64, 64, seed=1)
    layer, tlayer = nn.BatchNorm2d(32), torch.nn.BatchNorm2d(32).train()
    out, tout = layer(Tensor(x)).numpy(), tlayer(torch.from_numpy(x)).detach().numpy()
    assert _err(out, tout.astype(np.float64)) < TORCH_TOL
    np.testing.assert_allclose(layer.running_mean.numpy(), tlayer.running_mean.numpy(), rtol=2e-7)
    np.testing.assert_allclose(layer.running_var.numpy(), tlayer.running_var.numpy(), rtol=1e-6)


def test_layernorm_long_axis_large_mean() -> None:
    x = _data(16, 65536)
    out = nn.LayerNorm(65536, elementwise_affine=False)(Tensor(x)).numpy()
    assert _err(out, _normalized(x, (1,))) < TOL


def test_layernorm_long_axis_large_mean_torch() -> None:
    torch = _torch()
    x = _data(16, 65536, seed=2)
    out = nn.LayerNorm(65536, elementwise_affine=False)(Tensor(x)).numpy()
    tout = torch.nn.functional.layer_norm(torch.from_numpy(x), (65536,)).numpy()
    assert _err(out, tout.astype(np.float64)) < TORCH_TOL


def test_groupnorm_and_instancenorm_large_mean() -> None:
    x = _data(2, 8, 128, 128, seed=3)  # a group of 4 channels: 65536 values; an instance: 16384
    groups = _normalized(x.reshape(2, 2, -1), (2,)).reshape(x.shape)
    assert _err(nn.GroupNorm(2, 8, affine=False)(Tensor(x)).numpy(), groups) < TOL
    assert _err(nn.InstanceNorm(8, affine=False)(Tensor(x)).numpy(), _normalized(x, (2, 3))) < TOL


def test_var_std_long_axis_large_mean() -> None:
    """var/std/var_mean over 65536 values near 1000 (and over every axis) within float32 rounding of float64.

    var and std were already two-pass (the mean's error only enters them squared); this guards that."""
    x = _data(4, 65536, seed=4)
    x64 = x.astype(np.float64)
    t = Tensor(x)
    np.testing.assert_allclose(t.var(1).numpy(), x64.var(1, ddof=1), rtol=1e-6)
    np.testing.assert_allclose(t.std(1, correction=0).numpy(), x64.std(1), rtol=1e-6)
    np.testing.assert_allclose(t.var().numpy(), x64.var(ddof=1), rtol=1e-6)
    var, mean = t.var_mean(1, keepdim=True)
    assert var.shape == mean.shape == (4, 1)
    # the mean of var_mean rounds once at ~1000: within half a spacing of float64's
    assert _err(mean.numpy(), x64.mean(1, keepdims=True)) <= TOL / 2


def test_var_of_many_equal_deviations() -> None:
    """Half zeros, half 0.3: 16384 equal squared deviations, which one accumulator adds up with a drift."""
    x = np.zeros((16384, 4), np.float32)
    x[::2] = 0.3
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(Tensor(x).var(0).numpy(), x64.var(0, ddof=1), rtol=5e-7)
    np.testing.assert_allclose(Tensor(x.T.copy()).var(1).numpy(), x64.var(0, ddof=1), rtol=5e-7)


def test_var_float16_long_axis() -> None:
    """A float16 variance sums and divides in float32: 65536 squares near 1 add up past float16's 65504."""
    x = (np.random.default_rng(5).standard_normal((4, 65536)) + 10).astype(np.float16)
    var, mean = Tensor(x).var_mean(1)
    assert var.dtype == mean.dtype == dtypes.float16
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(var.numpy().astype(np.float64), x64.var(1, ddof=1), rtol=2e-3)
    np.testing.assert_allclose(mean.numpy().astype(np.float64), x64.mean(1), rtol=1e-3)


@pytest.mark.parametrize("values", [[np.inf, 1.0, 2.0], [1.0, np.inf, 2.0], [np.nan, 1.0, 2.0], [-np.inf, 3.0, 5.0]])
def test_var_mean_non_finite_first_element(values: list[float]) -> None:
    """The sample the mean is taken about may be inf or nan: the results are numpy's (inf mean, nan var)."""
    x = np.array(values, np.float32)
    var, mean = Tensor(x).var_mean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "invalid value" for inf - inf
        np.testing.assert_equal(mean.numpy(), np.float32(x.astype(np.float64).mean()))
        np.testing.assert_equal(var.numpy(), np.float32(x.astype(np.float64).var(ddof=1)))
