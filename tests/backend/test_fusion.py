"""Fusion: how many kernels a computation runs, counted with GlobalCounters.

Inputs are realized before the counters are reset, so only the computation under test is counted.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import GlobalCounters, Tensor
from ember.ir.lazy import base_of, buffers

RNG = np.random.default_rng(5)


def randf(*shape: int) -> np.ndarray:
    return RNG.uniform(-2, 2, size=shape).astype(np.float32)


def count_kernels(*outs: Tensor) -> int:
    """Realize ``outs`` (whose inputs are already realized) and return the number of kernels that ran."""
    GlobalCounters.reset()
    Tensor.realize_all(*outs)
    return GlobalCounters.kernel_count


def realized(a: np.ndarray, device: str) -> Tensor:
    return Tensor(a, device=device).realize()


def test_elementwise_chain_is_one_kernel(device, check):
    a = randf(4, 5)
    x = realized(a, device)
    out = ((x + 1.0) * 2.0 - 0.5).relu().exp()
    assert count_kernels(out) == 1
    check(out, np.exp(np.maximum((a + 1) * 2 - 0.5, 0)), rtol=2e-5)


def test_elementwise_chain_on_views_is_one_kernel(device, check):
    a = randf(4, 5)
    x = realized(a, device)
    out = (x.T.flip(0) * 3.0 + x.T).pad(((1, 0), (0, 1))).sqrt().neg() + 1.0
    assert count_kernels(out) == 1
    with np.errstate(invalid="ignore"):
        check(out, -np.sqrt(np.pad(a.T[::-1] * 3 + a.T, ((1, 0), (0, 1)))) + 1)


def test_multiply_add_sum_is_one_kernel(device, check):
    a, b, c = randf(3, 6), randf(3, 6), randf(3, 6)
    x, y, z = realized(a, device), realized(b, device), realized(c, device)
    out = (x * y + z).sum(1)
    assert count_kernels(out) == 1
    check(out, (a * b + c).sum(1), rtol=1e-5, atol=1e-5)


def test_matmul_is_one_kernel(device, check):
    a, b = randf(3, 4), randf(4, 5)
    x, y = realized(a, device), realized(b, device)
    out = x @ y
    assert count_kernels(out) == 1
    check(out, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_of_transposed_inputs_is_one_kernel(device):
    x, y = realized(randf(4, 3), device), realized(randf(5, 4), device)
    assert count_kernels(x.T @ y.T) == 1


def test_softmax_at_most_three_kernels(device, check):
    a = randf(3, 7)
    x = realized(a, device)
    e = (x - x.max(1, keepdim=True)).exp()
    out = e / e.sum(1, keepdim=True)
    assert count_kernels(out) <= 3
    ea = np.exp(a - a.max(1, keepdims=True))
    check(out, ea / ea.sum(1, keepdims=True), rtol=2e-5, atol=1e-6)


def test_realized_tensor_runs_nothing_again(device):
    x = realized(randf(2, 3), device)
    out = (x * 2.0).realize()
    assert count_kernels(out) == 0
    out.numpy()
    assert count_kernels(x) == 0


def test_schedule_matches_kernel_count(device):
    x, y = realized(randf(3, 4), device), realized(randf(3, 4), device)
    out = ((x + y) * 2.0).sum(0)
    n = len(out.schedule())
    assert n == 1
    assert count_kernels(out) == n


def test_shared_input_two_outputs(device, check):
    a = randf(2, 5)
    x = realized(a, device)
    p, q = x + 1.0, x * 3.0
    assert count_kernels(p, q) <= 2
    check(p, a + 1)
    check(q, a * 3)


def test_reduce_then_elementwise_at_most_two(device, check):
    a = randf(4, 6)
    x = realized(a, device)
    out = x.sum(1) * 2.0 + 1.0
    assert count_kernels(out) <= 2
    check(out, a.sum(1) * 2 + 1, rtol=1e-5, atol=1e-5)


def test_same_computation_twice_compiles_once(device):
    a = randf(3, 9)
    x = realized(a, device)
    (x * 7.0 - 1.0).exp2().realize()
    GlobalCounters.reset()
    (realized(randf(3, 9), device) * 7.0 - 1.0).exp2().realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.kernels_compiled == 0


@pytest.mark.parametrize("n_ops", [1, 8, 20])
def test_long_chain_stays_one_kernel(device, check, n_ops):
    a = randf(5)
    x = realized(a, device)
    out, ref = x, a.copy()
    for i in range(n_ops):
        out, ref = out * 0.5 + float(i), ref * np.float32(0.5) + np.float32(i)
    assert count_kernels(out) == 1
    check(out, ref, rtol=1e-5, atol=1e-5)


def test_costly_elementwise_expanded_into_a_reduction_is_computed_once(device, check):
    # a softmax-style gradient (exp) read by a weight gradient: fused, every exp would be redone once per
    # column of the product (64 x 512 copies); it gets a kernel of its own, the product reads it
    a, b = randf(64, 8), randf(64, 512)
    x, h = realized(a, device), realized(b, device)
    g = (x - 1.0).exp()
    out = g.T @ h
    assert count_kernels(out) == 2
    check(out, np.exp(a - 1).T @ b, rtol=1e-4, atol=1e-3)


def test_costly_elementwise_expanded_a_little_stays_fused(device, check):
    # a log of row sums read by a handful of columns: recomputing it costs less than a kernel launch
    a = randf(16, 4)
    x = realized(a, device)
    s = x.abs().sum(1, keepdim=True).realize()
    out = x - s.log()
    assert count_kernels(out) == 1
    check(out, a - np.log(np.abs(a).sum(1, keepdims=True)), rtol=1e-5, atol=1e-5)


def test_costly_elementwise_padded_stays_fused(device, check):
    # a pad adds zeros around the values, it does not compute them again: no kernel of its own
    a = randf(8, 8)
    x = realized(a, device)
    out = x.exp().pad(((0, 120), (0, 248))) * 2.0
    assert count_kernels(out) == 1
    check(out, np.pad(np.exp(a), ((0, 120), (0, 248))) * 2, rtol=1e-5)


def _kernels_reading(items: list, t: Tensor) -> int:
    """How many of the scheduled kernels read the realized tensor ``t``'s buffer."""
    buf = buffers[base_of(t.lazydata)]
    return sum(any(b is buf for b in si.bufs[1:]) for si in items)


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (256, 2, 16, 16)])
def test_value_read_by_several_reductions_is_stored_once(device, check, shape):
    # a BatchNorm backward: a max-pool/relu-style gradient of four buffers read by two sums and the input
    # gradient; fused, each of the three kernels would load all four buffers and recompute it. The second shape
    # is long enough for the sums to be split in partial sums (fusion rule 6), which read it through a view
    a, b, c = randf(*shape), randf(*shape), randf(*shape)
    d = randf(1, shape[1], 1, 1)
    x, gy, m, w = (realized(v, device) for v in (a, b, c, d))
    g = (x > 0).where(gy * m, 0.0) * w
    axes = (0, 2, 3)
    s1, s2 = g.sum(axes), (g * x).sum(axes)
    dx = g - s1.reshape(1, -1, 1, 1) * x
    items = s1.schedule(s2, dx)
    assert _kernels_reading(items, gy) == 1 and _kernels_reading(items, m) == 1
    ref_g = np.where(a > 0, b * c, 0) * d
    ref_s1 = ref_g.sum(axes, dtype=np.float64).astype(np.float32)
    check(s1, ref_s1, rtol=1e-4, atol=1e-3)
    check(s2, (ref_g * a).sum(axes, dtype=np.float64).astype(np.float32), rtol=1e-4, atol=1e-3)
    check(dx, ref_g - ref_s1.reshape(1, -1, 1, 1) * a, rtol=1e-4, atol=1e-2)


def test_value_read_by_a_reduction_stays_fused_when_its_inputs_are_small(device, check):
    # a LayerNorm backward's normalized row: x and per-row and per-column statistics (four buffers, but together
    # hardly more than x itself), read by a row sum and by the output: recomputing it costs a pass over x, storing
    # it a write and a read back: no kernel of its own
    a, mu, r, v = randf(8, 32), randf(8, 1), randf(8, 1), randf(1, 32)
    x, mean, rstd, w = (realized(t, device) for t in (a, mu, r, v))
    xhat = (x - mean) * rstd * w
    s, out = (xhat * x).sum(1, keepdim=True), xhat * 2.0
    assert count_kernels(s, out) == 2
    ref = (a - mu) * r * v
    check(s, (ref * a).sum(1, keepdims=True), rtol=1e-4, atol=1e-4)
    check(out, ref * 2, rtol=1e-5, atol=1e-5)
