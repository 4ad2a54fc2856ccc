"""A lookup written as a one-hot selection against the ramp ``[0, K)`` (``Embedding``, ``gather``, tensor
indexing) is lowered to one load per output: no loop over ``K`` and no read of the ramp's buffer.

Each test checks the mechanism in the lowered program (its ranges and loads) and the values against numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Device, Tensor, dtypes, nn
from ember.codegen import get_program
from ember.dtype import to_np_dtype
from ember.engine.realize import run_schedule
from ember.ir.uop import Ops

RNG = np.random.default_rng(3)


def _program(out: Tensor):
    """The lowered program of ``out``'s last kernel (the ones before it run first)."""
    sched = out.schedule()
    run_schedule(sched[:-1])
    return get_program(sched[-1].ast, Device[Device.DEFAULT].renderer)


def _reduce_loops(spec) -> list:
    return [u for u in spec.uops if u.op is Ops.RANGE and u.arg[1] == "reduce"]


def _ramp_loads(spec) -> list:
    return [u for u in spec.uops if u.op is Ops.LOAD and len(u.src[0].arg) > 2 and u.src[0].arg[2] == "ramp"]


def test_embedding_is_one_load_per_output():
    emb = nn.Embedding(1000, 16)
    table = emb.weight.numpy()
    ids = RNG.integers(0, 1000, (2, 5)).astype(np.int32)
    out = emb(Tensor(ids))
    spec = _program(out)
    assert _reduce_loops(spec) == []  # the 1000-long sum is gone
    assert _ramp_loads(spec) == []
    # every load reads the indices or the table (an upcast tile has several of each)
    assert len({u.src[0].arg[0] for u in spec.uops if u.op is Ops.LOAD}) == 2
    np.testing.assert_array_equal(out.numpy(), table[ids])


def test_embedding_gradient_still_sums_hits():
    emb = nn.Embedding(6, 3)
    ids = Tensor(np.array([[1, 4, 1]], dtype=np.int32))
    emb(ids).sum().backward()
    want = np.zeros((6, 3), np.float32)
    want[1], want[4] = 2, 1
    np.testing.assert_array_equal(emb.weight.grad.numpy(), want)


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64, dtypes.uint8])
def test_gather_collapses(dt):
    x = RNG.standard_normal((7, 4)).astype(np.float32)
    idx = RNG.integers(0, 7, (3, 4))
    out = Tensor(x).gather(0, Tensor(idx.astype(to_np_dtype(dt))))
    spec = _program(out)
    assert _reduce_loops(spec) == [] and _ramp_loads(spec) == []
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, idx, 0))


def test_no_match_is_zero():
    """An index outside [0, K) matches nothing: the sum is 0, and nothing is read out of bounds."""
    table = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    e = Tensor(np.array([-1, 2, 4, 1 << 30], dtype=np.int32))
    ramp = table._positions(4).reshape(4, 1)
    hot = e.reshape(4, 1, 1) == ramp
    out = hot.where(table, 0).sum(-2)
    spec = _program(out)
    assert _reduce_loops(spec) == []
    np.testing.assert_array_equal(out.numpy(), [[0, 0, 0], [6, 7, 8], [0, 0, 0], [0, 0, 0]])


def test_non_exact_ramp_cast_keeps_the_loop():
    """A ramp cast to a dtype that cannot hold all of [0, K) (int8, K = 300) is not a lookup: it stays a sum."""
    vals = Tensor(np.ones(300, dtype=np.float32))
    e = Tensor(np.array([5], dtype=np.int8))
    hot = e.reshape(1, 1) == vals._positions(300).cast(dtypes.int8).reshape(1, 300)
    out = hot.where(vals.reshape(1, 300), 0).sum(-1)
    assert _reduce_loops(_program(out))
    # positions 5, 261 (wraps to 5): two hits, as the one-hot sum says
    assert out.numpy().tolist() == [2.0]


def test_other_sums_are_untouched():
    """A masked sum whose condition is not an equality with the ramp (here ``<``) keeps its loop."""
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    t = Tensor(x)
    out = (t._positions(8).reshape(1, 8) < 3).where(t, 0).sum(-1)
    assert _reduce_loops(_program(out))
    np.testing.assert_allclose(out.numpy(), x[:, :3].sum(-1), rtol=1e-6)
