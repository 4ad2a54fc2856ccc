"""Identical graphs are one object, so a realized result is reused by every later graph that computes the same
thing: only while its buffer still holds that value, and never for a constant."""
from __future__ import annotations

import numpy as np

from ember import Tensor
from ember.ir.uop import Ops


def test_a_realized_constant_is_not_read_by_its_twin(device: str):
    """Two tensors made alike are one graph node: realizing one of them and assigning into it leaves the other's
    value alone (the optimizer's moment buffers ``m`` and ``v`` of one parameter start as the same zeros)."""
    m, v = Tensor.zeros(13, device=device), Tensor.zeros(13, device=device)
    assert m.lazydata is v.lazydata
    m.realize()
    x = Tensor(np.arange(13, dtype=np.float32), device=device).realize()
    si = (x + 0.0).schedule()
    assert len(si) == 1 and len(si[0].bufs) == 2, "x + 0.0 reads x and writes its result: no buffer of zeros"
    m.assign(Tensor.ones(13, device=device)).realize()
    np.testing.assert_array_equal(m.numpy(), np.ones(13))
    np.testing.assert_array_equal(v.numpy(), np.zeros(13))
    np.testing.assert_array_equal((x + 0.0).numpy(), np.arange(13))


def test_a_twin_of_a_tensor_assigned_into_reads_its_buffer(device: str):
    """tinygrad's model: a realized graph node stands for its buffer, so a twin (the same graph, built before)
    reads what an assign put there (tinygrad 0.14 gives [7, 7, 7] for ``twin``); graphs reading the old
    contents are computed afresh from the new ones."""
    x = Tensor(np.arange(6, dtype=np.float32), device=device).realize()
    y, twin = x * 2, x * 2
    assert y.lazydata is twin.lazydata
    y.realize()
    y.assign(Tensor.full((6,), 7.0, device=device)).realize()
    np.testing.assert_array_equal(y.numpy(), np.full(6, 7.0))
    np.testing.assert_array_equal(twin.numpy(), np.full(6, 7.0))


def test_a_result_still_held_is_reused(device: str):
    x = Tensor(np.arange(6, dtype=np.float32), device=device).realize()
    y, twin = (x * 3).exp2(), (x * 3).exp2()
    y.realize()
    (si,) = (twin + 1).schedule()
    assert not any(u.op is Ops.EXP2 for u in si.ast.toposort()), "the realized exp2 is read, not computed again"
    np.testing.assert_allclose((twin + 1).numpy(), np.exp2(np.arange(6) * 3.0) + 1)
