"""Graphs of any depth: long chains realize and differentiate without the interpreter's recursion limit, and the
scheduler cuts them into kernels of bounded size (fusion rule 8 in :mod:`ember.schedule`).

Each test runs under a low recursion limit, so a pass that recurses once per node fails here at a few hundred
nodes instead of at some depth in a user's program. ``EMBER_DEEP_FULL=1`` runs the full sizes (100,000 chained
ops, 10,000 summed tensors, 3,000 concatenated), which take tens of seconds.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from ember import Tensor
from ember.ir.uop import Ops, UOp, toposort
from ember.schedule import MAX_FUSED_DEPTH, MAX_KERNEL_INPUTS

FULL = os.environ.get("EMBER_DEEP_FULL", "") == "1"
#: enough for the call stack of the engine itself (pytest and ember's own frames), far less than any chain here
LOW_LIMIT = 400


@pytest.fixture(autouse=True)
def low_recursion_limit() -> Iterator[None]:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(LOW_LIMIT)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _depth(ast: UOp) -> int:
    """The longest chain of operations (views and loads aside) in a kernel AST."""
    depth: dict[UOp, int] = {}
    for n in toposort([ast]):
        d = max((depth[s] for s in n.src), default=0)
        depth[n] = d + (n.op not in (Ops.VIEW, Ops.LOAD, Ops.DEFINE_GLOBAL, Ops.CONST, Ops.STORE, Ops.SINK))
    return depth[ast]


def _check_kernels(t: Tensor) -> int:
    """Schedule ``t``: every kernel within the bounds; returns how many kernels."""
    items = [si for si in t.schedule() if si.ast.op is Ops.SINK]
    for si in items:
        reads = sum(1 for u in toposort([si.ast]) if u.op is Ops.DEFINE_GLOBAL) - 1
        assert reads <= MAX_KERNEL_INPUTS, f"a kernel reads {reads} buffers"
        assert _depth(si.ast) <= MAX_FUSED_DEPTH + 2, f"a kernel computes a chain of {_depth(si.ast)} ops"
    return len(items)


def test_chained_adds():
    n = 100_000 if FULL else 2_000
    x = Tensor([1.0, -2.0])
    for _ in range(n):
        x = x + 1
    assert _check_kernels(x) >= n // MAX_FUSED_DEPTH
    np.testing.assert_allclose(x.numpy(), [1.0 + n, -2.0 + n])


def test_chained_multiplies_backward():
    n = 100_000 if FULL else 1_500
    w = Tensor([1.0, 2.0], requires_grad=True)
    x = w
    for _ in range(n):
        x = x * 1.00001
    x.sum().backward()
    assert w.grad is not None
    want = np.float32(1.00001) ** n  # (float32 products, as each kernel computes them; rounding drifts a little)
    np.testing.assert_allclose(x.numpy(), np.array([1.0, 2.0]) * want, rtol=1e-3)
    np.testing.assert_allclose(w.grad.numpy(), [want, want], rtol=1e-3)


def test_python_sum_of_realized_tensors():
    n = 10_000 if FULL else 400
    ts = [Tensor([float(i), 1.0]).realize() for i in range(n)]
    total = sum(ts)
    assert isinstance(total, Tensor)
    assert _check_kernels(total) >= n // MAX_KERNEL_INPUTS
    np.testing.assert_allclose(total.numpy(), [n * (n - 1) / 2, n])


def test_cat_of_many_realized_tensors():
    n = 3_000 if FULL else 300
    ts = [Tensor([float(i), -float(i)]).realize() for i in range(n)]
    out = Tensor.cat(*ts)
    assert _check_kernels(out) >= n // MAX_KERNEL_INPUTS
    want = np.stack([np.arange(n), -np.arange(n)], axis=1).reshape(-1)
    np.testing.assert_array_equal(out.numpy(), want)


def test_deep_gradient_through_a_shared_input():
    """A chain that reads one input at every step (a DAG, not a tree): the gradient sums every step's share."""
    n = 20_000 if FULL else 600
    a = Tensor([0.5, 1.5], requires_grad=True)
    x = a
    for _ in range(n):
        x = x * 0.5 + a
    x.sum().backward()
    assert a.grad is not None
    # x = a * (1 + 0.5 + ... + 0.5**n): d x / d a = 2 - 0.5**n
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 2.0], rtol=1e-5)
    np.testing.assert_allclose(x.numpy(), np.array([0.5, 1.5]) * 2.0, rtol=1e-5)
