"""A fused epilogue as a loop in the IR (:mod:`ember.codegen.epilogue`): the stores after a register tile, one per
lane, become one store inside "loop" RANGEs reading the accumulators from a DEFINE_REG array. Run by the PYTHON
device (the reference), bit for bit equal to the unrolled program, and refused where reordering the stores could
change what they write."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from ember import Tensor
from ember.builtin_devices.python import PythonProgram, PythonRenderer, encode_program
from ember.codegen import get_program
from ember.codegen.epilogue import roll_epilogues
from ember.codegen.linearize import linearize
from ember.codegen.opts import Opt
from ember.codegen.vectorize import VECTOR_FLOAT_OPS
from ember.dtype import PtrDType, dtypes, to_np_dtype
from ember.engine.realize import CompiledRunner, run_schedule
from ember.ir.uop import Ops, UOp

RNG = np.random.default_rng(11)


def _renderer(loop_min: int) -> PythonRenderer:
    r = copy.copy(PythonRenderer())
    r.vector_alu = VECTOR_FLOAT_OPS
    r.epilogue_loop_min = loop_min
    return r


def _run(out: Tensor, opts: list[Opt], loop_min: int) -> tuple[np.ndarray, tuple[UOp, ...]]:
    """``out``'s last kernel lowered with ``opts`` (epilogues rolled from ``loop_min`` stores; 0: never) and run on
    the PYTHON device: what it wrote and its uops."""
    sched = out.schedule()
    run_schedule(sched[:-1])
    si = sched[-1]
    spec = get_program(si.ast, _renderer(loop_min), opts=opts)
    for b in si.bufs:
        b.allocate()
    CompiledRunner("PYTHON", spec)(list(si.bufs), wait=True)
    buf = si.bufs[0]
    return np.frombuffer(buf.as_bytes(), to_np_dtype(buf.dtype)).copy().reshape(out.shape), spec.uops


def _global_stores(uops) -> list[UOp]:
    return [u for u in uops if u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_GLOBAL]


def _t(a: np.ndarray) -> Tensor:
    return Tensor(a, device="PYTHON").realize()


TILE = [Opt("UPCAST", 1, 16), Opt("UPCAST", 0, 4)]  # 4 rows of two 8-lane accumulator vectors: 64 lanes


def test_relu_mask_after_a_tile_is_one_loop_over_the_accumulators() -> None:
    """A relu's backward mask (a compare and a select: no vector ops) after a matmul tile: one store in two loops
    (rows outside, the contiguous columns inside), its lanes read from a DEFINE_REG of the 8 accumulator vectors."""
    a, b, m = RNG.standard_normal((8, 24)), RNG.standard_normal((24, 32)), RNG.standard_normal((8, 32))
    a, b, m = (x.astype(np.float32) for x in (a, b, m))
    out = (_t(m) > 0).where(_t(a) @ _t(b), 0.0)
    got, uops = _run(out, TILE, 64)
    regs = [u for u in uops if u.op is Ops.DEFINE_REG]
    assert len(regs) == 1 and regs[0].arg[1] == 64 and [s.dtype.count for s in regs[0].src] == [8] * 8
    loops = [u for u in uops if u.op is Ops.RANGE and u.arg[1] == "loop"]
    assert [u.src[1].arg for u in loops] == [4, 16]
    assert len(_global_stores(uops)) == 1
    want, unrolled = _run(out, TILE, 0)
    assert len(_global_stores(unrolled)) == 64 and not any(u.op is Ops.DEFINE_REG for u in unrolled)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np.where(m > 0, a @ b, 0), rtol=1e-5, atol=1e-5)


def test_below_the_threshold_the_epilogue_stays_unrolled() -> None:
    a, b, m = (RNG.standard_normal(s).astype(np.float32) for s in ((8, 24), (24, 32), (8, 32)))
    _, uops = _run((_t(m) > 0).where(_t(a) @ _t(b), 0.0), TILE, 65)
    assert len(_global_stores(uops)) == 64 and not any(u.op is Ops.DEFINE_REG for u in uops)


def test_in_place_update_across_the_tile_vectors() -> None:
    """An SGD step on a weight gradient written back into the weights: the tile's vectors run across the output
    (each lane its own row), each lane loads the weight it stores; exact against the unrolled program."""
    x, g, w = (RNG.standard_normal(s).astype(np.float32) for s in ((12, 32), (12, 16), (32, 16)))
    tw = _t(w)
    lr = _t(np.array([0.25], np.float32))
    out = tw.assign(tw - lr * (_t(x).T @ _t(g)))
    opts = [Opt("UPCAST", 0, 16), Opt("UPCAST", 1, 4)]
    got, uops = _run(out, opts, 64)
    assert any(u.op is Ops.DEFINE_REG for u in uops) and len(_global_stores(uops)) == 1
    # the inner loop walks the weights with unit stride: their index moves by one with it
    inner = [u for u in uops if u.op is Ops.RANGE and u.arg[1] == "loop"][-1]
    assert inner.src[1].arg == 4
    # what every lane shares (the array, the learning rate) comes before the loops, the lanes' own work inside
    first_loop = next(i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[1] == "loop")
    reg_at = next(i for i, u in enumerate(uops) if u.op is Ops.DEFINE_REG)
    lr_at = next(i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL
                 and u.src[1].op is Ops.CONST)
    assert reg_at < first_loop and lr_at < first_loop
    assert all(i > first_loop for i, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_REG)
    tw2 = _t(w)
    want, _ = _run(tw2.assign(tw2 - lr * (_t(x).T @ _t(g))), opts, 0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, w - np.float32(0.25) * (x.T @ g), rtol=1e-5, atol=1e-5)


# --- the pass itself, on hand-built kernels ------------------------------------------------------------------------

def _kernel(offsets: list[int], read_other: bool = False) -> UOp:
    """Stores ``data0[gidx * 64 + offsets[i]] = lane i of 4 vectors * data1[same]`` (``read_other``: every lane
    also reads ``data0`` at element 63 of its row, another lane's output)."""
    f, i = dtypes.float32, dtypes.int32
    d0, d1 = (UOp(Ops.DEFINE_GLOBAL, PtrDType(f), (), (k, 256)) for k in (0, 1))
    d2 = UOp(Ops.DEFINE_GLOBAL, PtrDType(f), (), (2, 16))
    base = UOp(Ops.RANGE, i, (UOp.const(i, 0), UOp.const(i, 4)), (0, "global")) * 64
    vecs = [UOp(Ops.LOAD, f.vec(4), (d2, UOp.const(i, 4 * k))) for k in range(4)]
    stores = []
    for n, off in enumerate(offsets):
        val = UOp(Ops.GEP, f, (vecs[n // 4],), n % 4) * UOp(Ops.LOAD, f, (d1, base + off))
        if read_other:
            val = val + UOp(Ops.LOAD, f, (d0, base + 63))
        stores.append(UOp(Ops.STORE, None, (d0, base + off, val)))
    return UOp(Ops.SINK, None, tuple(stores))


TILE_OFFSETS = [r * 16 + c for r in range(4) for c in range(4)]  # a 4 x 4 tile in rows of 16


def _python_run(sink: UOp, *bufs: np.ndarray) -> None:
    PythonProgram("k", encode_program("k", linearize(sink)).encode())(*bufs)


def test_rolled_kernel_runs_like_the_unrolled_one_on_the_python_device() -> None:
    sink = _kernel(TILE_OFFSETS)
    rolled = roll_epilogues(sink, 16)
    assert len(rolled.src) == 1 and sum(u.op is Ops.DEFINE_REG for u in rolled.toposort()) == 1
    d1, d2 = RNG.standard_normal(256).astype(np.float32), RNG.standard_normal(16).astype(np.float32)
    want, got = np.zeros(256, np.float32), np.zeros(256, np.float32)
    _python_run(sink, want, d1, d2)
    _python_run(rolled, got, d1, d2)
    np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(got) == 4 * 16


def test_offsets_that_are_no_affine_walk_stay_unrolled() -> None:
    offsets = list(TILE_OFFSETS)
    offsets[5] += 100  # one lane somewhere else
    sink = _kernel(offsets)
    assert roll_epilogues(sink, 16) is sink


def test_a_store_group_that_reads_its_output_elsewhere_stays_unrolled() -> None:
    sink = _kernel(TILE_OFFSETS, read_other=True)
    assert roll_epilogues(sink, 16) is sink


def test_python_device_checks_define_reg() -> None:
    f = dtypes.float32
    v = UOp.const(f.vec(4), 1.0)
    bad = UOp(Ops.DEFINE_REG, PtrDType(f), (v,), (0, 5))  # says 5 elements, holds 4
    d0 = UOp(Ops.DEFINE_GLOBAL, PtrDType(f), (), (0, 1))
    store = UOp(Ops.STORE, None, (d0, UOp.const(dtypes.int32, 0), UOp(Ops.LOAD, f, (bad, UOp.const(dtypes.int32, 0)))))
    with pytest.raises(ValueError, match="DEFINE_REG"):
        PythonProgram("k", encode_program("k", linearize(UOp(Ops.SINK, None, (store,)))).encode())
    good = UOp(Ops.DEFINE_REG, PtrDType(f), (v,), (0, 4))
    past = UOp(Ops.STORE, None, (d0, UOp.const(dtypes.int32, 0), UOp(Ops.LOAD, f, (good, UOp.const(dtypes.int32, 4)))))
    prog = PythonProgram("k", encode_program("k", linearize(UOp(Ops.SINK, None, (past,)))).encode())
    with pytest.raises(IndexError, match="DEFINE_REG"):
        prog(np.zeros(1, np.float32))
