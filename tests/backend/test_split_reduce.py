"""Fusion rules 6 and 7 of the scheduler: a reduction far longer than its output is wide is split in two kernels
(partial results over blocks of its outermost reduce axis, then their combination), and a float sum longer than
ACCUMULATE_MAX per output becomes a tree of kernels that each add at most that many values into one result. The
results must equal numpy's; short reductions and full reductions up to ACCUMULATE_MAX stay one kernel. Reductions
of constants fold to their value, with no reduction left.

Inputs are random multiples of 1/8 (small sums of them are exact in float32, whatever the order), so sums
are compared exactly.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.codegen.lowerer import ast_shape
from ember.frontend.util import ArgumentError
from ember.helpers import prod
from ember.ir.uop import Ops
from ember.schedule import ACCUMULATE_MAX, SPLIT_REDUCE_MAX, SPLIT_REDUCE_RATIO

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
    big = q(64, 1024)
    assert big.size == ACCUMULATE_MAX
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


def reductions(out: Tensor) -> list[tuple[int, int]]:
    """(elements per output, outputs) of every reduction in ``out``'s kernels."""
    found = []
    for ast in kernels(out):
        for n in ast.toposort():
            if n.op is Ops.REDUCE_AXIS:
                memo: dict = {}
                shape = ast_shape(n.src[0], memo)
                found.append((prod(shape[a] for a in n.arg[1]), prod(ast_shape(n, memo))))
    return found


@pytest.mark.parametrize("shape, axis", [((131, 1009), None), ((65537, 2), 0), ((3, 70001), 1), ((263, 3, 257), (0, 2)),
                                         ((1 << 17,), 0)])
def test_long_sum_is_a_tree_of_short_ones(device, shape, axis):
    """Prime lengths (blocks plus a remainder), lengths with a divisor, several outputs and one: every kernel adds
    at most ACCUMULATE_MAX values into each result, the top of the tree at most SPLIT_REDUCE_MAX, and the sum
    equals numpy's exactly."""
    x = q(*shape)
    out = Tensor(x, device=device).sum(axis)
    found = reductions(out)
    assert len(found) >= 2 and all(n <= ACCUMULATE_MAX for n, _ in found)
    top = [prod(ast_shape(r.src[0], {})[a] for a in r.arg[1]) for r in kernels(out)[-1].toposort()
           if r.op is Ops.REDUCE_AXIS]
    assert min(top) <= SPLIT_REDUCE_MAX
    np.testing.assert_array_equal(out.numpy(), x.sum(axis))


def test_long_max_is_not_a_tree():
    """A max is exact whatever its length: it stays one kernel (split across the cores)."""
    x = q(1 << 17)
    out = Tensor(x, device="CPU").max()
    assert len(kernels(out)) == 1
    assert out.item() == x.max()


def test_sums_past_float32_integers_are_exact():
    """A float32 accumulator stops growing at 2**24; the tree's partial sums never get there: sums of ones over
    1e8 elements of realized inputs broadcast against each other are exact."""
    ones = np.ones((10 ** 4, 1), np.float32)
    assert (Tensor(ones, device="CPU") * Tensor(ones.T, device="CPU")).sum().item() == 1e8
    assert (Tensor(ones, device="CPU") * Tensor(ones.T, device="CPU")).mean().item() == 1.0
    half = Tensor(np.full((1, 1000), 0.5, np.float32), device="CPU").expand(10 ** 5, 1000)
    assert half.sum().item() == 5e7 and half.mean().item() == 0.5
    np.testing.assert_array_equal(half.sum(0).numpy(), np.full(1000, 5e4, np.float32))


def test_long_sum_of_realized_values_is_accurate():
    """1e8 values (1000 random ones broadcast) and a realized buffer of a prime length: within 2e-7 of the float64
    sum (one float32 chain over 1e8 values was 4e-6 off)."""
    rng = np.random.default_rng(7)
    x = rng.random(1000, dtype=np.float32)
    t = Tensor(x, device="CPU").reshape(1000, 1).expand(1000, 10 ** 5)
    exact = float(np.sum(x, dtype=np.float64)) * 10 ** 5
    assert abs(t.sum().item() - exact) <= 2e-7 * exact
    assert abs(t.mean().item() - exact / 1e8) <= 2e-7 * exact / 1e8
    y = rng.random(1_000_003, dtype=np.float32)
    exact = float(np.sum(y, dtype=np.float64))
    assert abs(Tensor(y, device="CPU").sum().item() - exact) <= 2e-7 * exact


@pytest.mark.skipif(os.environ.get("EMBER_SLOW_TESTS") != "1", reason="set EMBER_SLOW_TESTS=1 to run (800 MB)")
def test_sum_of_2e8_random_values_is_accurate():
    """The goal: a float32 sum of 2e8 uniform values within 2e-7 of the float64 sum (numpy: about 2e-8)."""
    x = np.random.default_rng(0).random(200_000_000, dtype=np.float32)
    exact = float(np.sum(x, dtype=np.float64))
    assert abs(Tensor(x, device="CPU").sum().item() - exact) <= 2e-7 * exact


def test_reductions_of_constants_fold(device):
    """Sums, means, maxes and products of constants and of their broadcasts: the exact value rounded to the dtype,
    with no reduction left in any kernel, at any size (the element counts are never indexed)."""
    cases = [
        (Tensor.ones(10 ** 4, 10 ** 4, device=device).sum(), np.float32(1e8)),
        (Tensor.full((10 ** 8,), 0.5, device=device).mean(), np.float32(0.5)),
        (Tensor.ones(2 ** 31 + 5, device=device).sum(), np.float32(2 ** 31 + 5)),
        (Tensor.ones(2 ** 31, 2 ** 31, device=device).sum(), np.float32(2.0 ** 62)),
        (Tensor.ones(2 ** 31, 2 ** 31, device=device).mean(), np.float32(1.0)),
        (Tensor.full((3, 2 ** 61 + 1), 0.5, device=device).sum(1), np.full(3, np.float32(2.0 ** 60))),
        # float32(0.1) times 1e8 in float64, rounded once to float32
        (Tensor.full((3, 10 ** 8), 0.1, device=device).sum(1), np.full(3, np.float32(float(np.float32(0.1)) * 1e8))),
        (Tensor.full((2 ** 33, 2), -2.5, device=device).max(0), np.full(2, -2.5, np.float32)),
        (Tensor.full((2 ** 33,), 3, dtype=dtypes.int32, device=device).sum(), np.int32((3 * 2 ** 33) % 2 ** 32)),
        (Tensor.full((10 ** 6,), 2, dtype=dtypes.int32, device=device).sum(), np.int32(2 * 10 ** 6)),
        (Tensor.full((40,), 2.0, device=device).prod(), np.float32(2.0 ** 40)),
        (Tensor.full((200,), 2.0, device=device).prod(), np.float32(np.inf)),
        (Tensor.full((3 * 10 ** 4,), 1, dtype=dtypes.float16, device=device).sum(), np.float16(3e4)),
        (Tensor.full((10 ** 8,), 1, dtype=dtypes.bfloat16, device=device).mean(), np.float32(1.0)),
    ]
    for out, want in cases:
        assert not reductions(out), out.shape
        got = out.numpy()
        np.testing.assert_array_equal(got.astype(np.float64), np.asarray(want, dtype=np.float64))


def test_constants_past_2_63_elements_are_refused_not_folded(device):
    """A shape of more than 2**63 - 1 elements is refused where it is made, naming the shape, before any fold."""
    with pytest.raises(ArgumentError, match=r"shape \(1099511627776, 1099511627776\) has \d+ elements"):
        Tensor.ones(2 ** 40, 2 ** 40, device=device)


# (value, length): every block of the tree's first level (a float32 chain of up to ACCUMULATE_MAX adds) sums to a
# value that fits float32's 24 bits, so only the levels above could round; their float32 sums did (1.0 over
# 2**31 + 5 gave 2147483008). Odd and prime lengths are cut into blocks plus a remainder at each level; the two
# small ones end in partials of 24 significant bits, whose float32 sums rounded already at 1e5 elements.
BROADCAST_SUMS = [
    (1 + 2 ** -11, 256 * 4095 + 13),
    (3 - 2 ** -7, 130819),
    (1.0, 2 ** 24 + 1),
    (0.5, 10 ** 9 + 7),
    (3.0, 2 ** 31 + 11),
    (1.0, 2 ** 31 + 5),
]


@pytest.mark.parametrize("value, n", BROADCAST_SUMS)
def test_broadcast_sums_are_rounded_once(device, value, n):
    """A realized value broadcast to ``n`` elements, summed: the float32 of the exact value * n (the tree's partial
    results are kept in float64 where the device has it)."""
    assert Tensor([value], device=device).expand(n).sum().item() == float(np.float32(value * n))


def test_broadcast_sums_with_several_outputs_and_axes(device):
    """Two values broadcast over two reduce axes of prime lengths (46349 * 46351 = 2**31 + 838851 elements per
    output, cut on one axis, then the other): each output is its value times that count, rounded once."""
    values = np.array([0.75, 3.0], np.float32)
    out = Tensor(values, device=device).reshape(2, 1, 1).expand(2, 46349, 46351).sum((1, 2))
    np.testing.assert_array_equal(out.numpy(), (values.astype(np.float64) * (46349 * 46351)).astype(np.float32))


def f32_times(value: float, n: int) -> float:
    """The float32 ``value`` times ``n``, in float64, rounded once to float32."""
    return float(np.float32(np.float64(np.float32(value)) * n))


@pytest.mark.parametrize("value, shape", [(1 - 2 ** -13, (1048583,)), (1 + 2 ** -11, (65537, 32771)),
                                          (0.1, (10 ** 8,)), (-3.25, (2 ** 31 + 7,))])
def test_sums_of_broadcasts_fold_and_round_once(device, value, shape):
    """A realized value broadcast over every reduced axis is read once and multiplied by the count in float64:
    no reduction is left, and the sum is the exact product rounded once (a float32 chain of 1048583 adds of
    1 - 2**-13 was 64 off; 65537 * 32771 adds of 1 + 2**-11 were 3.7e-4 off)."""
    x = Tensor([value], device=device).reshape(*(1,) * len(shape)).expand(*shape)
    out = x.sum()
    assert not reductions(out)
    assert out.item() == f32_times(value, prod(shape))
    assert x.mean().item() == float(np.float32(value))


def test_partial_broadcasts_fold_over_the_broadcast_axes_only(device):
    """Reduced over the axis a value is broadcast along: each output is its own value times the count; the other
    axes are kept, in order, keepdim or not."""
    x = RNG.standard_normal(5).astype(np.float32)
    t = Tensor(x, device=device)
    n = 2 ** 24 + 3
    want = (x.astype(np.float64) * n).astype(np.float32)
    rows = t.reshape(5, 1).expand(5, n)
    assert not reductions(rows.sum(1))
    np.testing.assert_array_equal(rows.sum(1).numpy(), want)
    np.testing.assert_array_equal(rows.sum(1, keepdim=True).numpy(), want[:, None])
    cols = t.reshape(1, 5, 1).expand(n, 5, 3).sum((0, 2))
    np.testing.assert_array_equal(cols.numpy(), (x.astype(np.float64) * n * 3).astype(np.float32))
    np.testing.assert_array_equal(rows.max(1).numpy(), x)
    np.testing.assert_array_equal((-rows).min(1).numpy(), -x)
    assert not reductions(rows.max(1))
    # the max is a view of its input: what follows it fuses, one kernel as with the reduction it replaces
    assert len(kernels(rows.max(1) + 1)) == 1
    np.testing.assert_array_equal((rows.max(1) + 1).numpy(), x + 1)
    np.testing.assert_array_equal(rows.mean(1).numpy(), x)
    np.testing.assert_array_equal(rows.mean(1, keepdim=True).numpy(), x[:, None])


def test_elementwise_ops_over_broadcasts_fold(device):
    """An elementwise function of broadcasts and constants is constant too: its sum is its value times the count."""
    n = 1048583
    out = (Tensor([1 - 2 ** -13], device=device).expand(n) * 2 + 1).sum()
    assert not reductions(out)
    assert out.item() == f32_times(np.float32(1 - 2 ** -13) * 2 + 1, n)
    assert Tensor([3.0], device=device).expand(2 ** 24 + 3).mean().item() == 3.0
    assert (Tensor([3.0], device=device).expand(2 ** 24 + 3) * 0.5 + 1).mean().item() == 2.5


def test_integer_sums_and_means_of_broadcasts(device):
    """An integer sum of a broadcast is value times count in its dtype, wrapping as the sum would; its mean is
    the value as a float."""
    x = Tensor([3, -7], dtype=dtypes.int32, device=device).reshape(2, 1).expand(2, 2 ** 33 + 1)
    want = (np.array([3, -7], np.int64) * (2 ** 33 + 1) + 2 ** 31) % 2 ** 32 - 2 ** 31
    np.testing.assert_array_equal(x.sum(1).numpy(), want.astype(np.int32))
    out = x.mean(1)
    assert out.dtype == dtypes.default_float
    np.testing.assert_array_equal(out.numpy(), np.array([3.0, -7.0], np.float32))


def test_reductions_that_vary_along_the_reduced_axes_do_not_fold(device):
    """A matmul reduces the product of two views broadcast along different axes; a padded broadcast has zeros
    along the reduced axis; a broadcast summed over its broadcast axis and another one varies along the other:
    each keeps its reduction and equals numpy's."""
    a, b = q(4, 3), q(3, 5)
    mm = Tensor(a, device=device) @ Tensor(b, device=device)
    assert reductions(mm)
    np.testing.assert_array_equal(mm.numpy(), a @ b)
    x = q(3)
    padded = Tensor(x, device=device).reshape(3, 1).expand(3, 4).pad(((0, 0), (2, 1)))
    assert reductions(padded.sum(1))
    np.testing.assert_array_equal(padded.sum(1).numpy(), x * 4)
    both = Tensor(x, device=device).reshape(3, 1).expand(3, 8)
    assert reductions(both.sum())
    assert both.sum().item() == float((x * 8).sum())
    assert both.mean().item() == float(np.float32(x.sum() * 8) / np.float32(24))


def test_gradient_through_a_folded_mean(device):
    """The mean of a broadcast is its value read once; each source element still gets the gradient of all of
    its copies."""
    w = Tensor(np.array([1.5, -2.0, 0.25], np.float32), device=device, requires_grad=True)
    (w.reshape(3, 1).expand(3, 7) * 2).mean(1).sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), np.full(3, 2.0, np.float32))
