"""Graphs the random-graph fuzzer (``bench/fuzz.py``) found failing, kept as plain tests.

Each is the fuzzer's shrunk reproducer, checked on the device under test against the PYTHON reference.
"""
from __future__ import annotations

import numpy as np

from ember import Tensor, dtypes


def _grads(device: str) -> list[np.ndarray]:
    # found on CL, gradients (seed 156): two reductions over different shapes fused into one backward kernel
    # (a mean over one broadcast view, a min over another) made the tiling heuristic index the second with
    # the first's axes, and lowering raised StopIteration
    x = Tensor(np.array([1.0, 0.0]), dtype=dtypes.float64, device=device, requires_grad=True)
    h = Tensor(np.array([-0.416, 1.9]), dtype=dtypes.float16, device=device, requires_grad=True)
    b = Tensor(np.array([1.75, 2.25, -2.0, 3.75, -2.25]).reshape(1, 1, 1, 5, 1), dtype=dtypes.bfloat16,
               device=device, requires_grad=True)
    v6 = x.reshape(2, 1, 1, 1).unsqueeze(2).expand(2, 1, 5, 1, 1)
    outs = [x - h, (b < 1).where(v6.permute(1, 3, 0, 2, 4), b), x.unsqueeze(0).expand(3, 2).min(1),
            v6.mean(4, keepdim=True)]
    rng = np.random.default_rng([156, 999])
    loss = sum((o * Tensor(rng.standard_normal(o.shape), dtype=o.dtype, device=device)).float().sum() for o in outs)
    return [g.numpy().astype(np.float64) for g in loss.gradient(x, h, b)]


def test_fused_reductions_over_different_shapes(device: str = "") -> None:
    from ember import Device

    ours = _grads(device or Device.DEFAULT)
    ref = _grads("PYTHON")
    for got, want in zip(ours, ref):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_comparison_of_a_relu_with_nan(device: str = "") -> None:
    # found by the rule property tests (tests/unit/test_symbolic_rules.py): the bounds of max(x, 0) were taken
    # as [0, inf], so ``relu(x) > -1`` folded to True, also for a nan x
    from ember import Device

    for d in (device or Device.DEFAULT, "PYTHON"):
        x = Tensor([np.nan, -2.0, 3.0], device=d)
        assert (x.relu() > -1).numpy().tolist() == [False, True, True]
        assert (x.maximum(0) >= -1).numpy().tolist() == [False, True, True]


def test_unsigned_floor_division_of_a_sum_that_wraps(device: str = "") -> None:
    # found by the rule property tests: ``(x * 4 + 1) // 4`` was rewritten to ``x + 1 // 4`` for uint32, which
    # is wrong once ``x * 4`` wraps around (an unsigned sum that wrapped still looks non-negative)
    from ember import Device

    for d in (device or Device.DEFAULT, "PYTHON"):
        x = Tensor([2 ** 30 + 5, 7], dtype=dtypes.uint32, device=d)
        want = (np.array([2 ** 30 + 5, 7], np.uint32) * np.uint32(4) + np.uint32(1)) // np.uint32(4)
        assert ((x * 4 + 1) // 4).numpy().tolist() == want.tolist()
        assert ((x * 4 + 1) % 4).numpy().tolist() == [1, 1]


def test_integer_division_of_a_negative_constant_by_a_computed_divisor(device: str = "") -> None:
    # found on CPU (seed 405627 of 10,000): x / d with d possibly -1 renders x/-1 as -x, and x = -1 gave the C
    # text ``--1ll``: "lvalue required as decrement operand", on gcc, and the same text in the OpenCL renderer
    from ember import Device

    device = device or Device.DEFAULT
    divisor = np.array([3, 17, -13, 4, -1, 0], dtype=np.int64)
    for value in (-1, -7, 5):
        x = Tensor.full((6,), value, dtype=dtypes.int64, device=device)
        got = (x // ((Tensor(divisor, device=device) & 7) + 1)).numpy()
        np.testing.assert_array_equal(got, value // ((divisor & 7) + 1))
        d = np.array([-1, 2, -1], dtype=np.int32)
        got = (Tensor.full((3,), value, dtype=dtypes.int32, device=device) // Tensor(d, device=device)).numpy()
        np.testing.assert_array_equal(got, value // d)
