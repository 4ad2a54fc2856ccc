"""Fusion rule 6 of the scheduler: a reduction far longer than its output is wide is split in two kernels
(partial results over blocks of its outermost reduce axis, then their combination). The results must equal
numpy's; short reductions and full reductions stay one kernel.

Inputs are random multiples of 1/8 (small sums of them are exact in float32, whatever the order), so sums
are compared exactly.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor
from ember.ir.uop import Ops
from ember.schedule import SPLIT_REDUCE_MAX, SPLIT_REDUCE_RATIO

RNG = np.random.default_rng(5)


def q(*shape: int) -> np.ndarray:
    """Random float32 multiples of 1/8 in [-1, 1]."""
    return (RNG.integers(-8, 9, size=shape) / 8).astype(np.float32)


def kernels(out: Tensor) -> list:
    """The kernel ASTs of ``out``'s schedule (copies left out)."""
    return [si.ast for si in out.schedule() if si.ast.op is not Ops.COPY]


@pytest.mark.parametrize("op", ["sum", "max"])
def test_long_reduction_is_split_and_matches_numpy(device, op):
    """(16, 2048, 4) reduced over its first two axes: 32768 elements per output, two kernels."""
    x = q(16, 2048, 4)
    assert x.size // 4 >= SPLIT_REDUCE_RATIO
    out = getattr(Tensor(x, device=device), op)((0, 1))
    assert len(kernels(out)) == 2
    np.testing.assert_array_equal(out.numpy(), getattr(x, op)((0, 1)))


def test_split_keeps_axes_and_order_of_the_output(device):
    """Reduced axes in the middle and at the end, kept as size 1 (keepdim), over a transposed input whose
    product with another input is what is reduced: every output lands where numpy puts it."""
    x, y = q(3, 256, 2, 128), q(128, 2, 256, 3)
    tx, ty = Tensor(x, device=device), Tensor(y, device=device)
    out = (tx * ty.permute(3, 2, 1, 0)).sum((1, 3), keepdim=True)
    assert x.size // 6 >= SPLIT_REDUCE_RATIO
    asts = kernels(out)
    assert len(asts) == 2
    # the partial results are a kernel of their own, with the block index as an output axis, read back by one
    # more reduction over the blocks
    partial_shape = asts[0].src[0].arg.shape
    assert partial_shape[0] == min(256, SPLIT_REDUCE_MAX) and np.prod(partial_shape) == partial_shape[0] * 6
    np.testing.assert_array_equal(out.numpy(), (x * y.transpose(3, 2, 1, 0)).sum((1, 3), keepdims=True))


def test_split_reduction_in_a_gradient(device):
    """A weight's gradient summed over a long batch axis (split by the scheduler) equals numpy's."""
    x, w, u = q(32768, 3), q(3), q(32768)
    tw = Tensor(w, device=device, requires_grad=True)
    ((Tensor(x, device=device) * tw).sum(1) * Tensor(u, device=device)).sum().backward()
    assert tw.grad is not None
    assert len(kernels(tw.grad)) == 2
    np.testing.assert_array_equal(tw.grad.numpy(), (x * u[:, None]).sum(0))


def test_short_and_full_reductions_stay_one_kernel():
    """A reduction below the ratio, and one to a single value (split across the cores by THREAD instead), are
    one kernel each."""
    x = q(4096, 16)
    assert len(kernels(Tensor(x, device="CPU").sum(0))) == 1
    np.testing.assert_array_equal(Tensor(x, device="CPU").sum(0).numpy(), x.sum(0))
    big = q(64, 2048)
    assert len(kernels(Tensor(big, device="CPU").sum())) == 1


def test_reduce_axis_without_small_divisor_is_left_whole():
    """An outermost reduce axis of a prime size above SPLIT_REDUCE_MAX is not split; the next one is."""
    x = q(257, 128, 2)
    out = Tensor(x, device="CPU").sum((0, 1))
    asts = kernels(out)
    assert len(asts) == 2 and asts[0].src[0].arg.shape[0] == 128
    np.testing.assert_array_equal(out.numpy(), x.sum((0, 1)))


def test_split_reductions_feeding_each_other(device):
    """A softmax along a long axis: its sum reads exp(x - max), a split reduction over another split reduction
    broadcast back; the rows still sum to one and equal numpy's."""
    x = RNG.standard_normal((2, 32768)).astype(np.float32)
    out = Tensor(x, device=device).softmax(1)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-9)
