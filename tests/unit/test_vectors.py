"""Vectors in the IR: ``dtype.vec(n)``, and the aligned vector loads and stores codegen makes of an upcast tile
(:mod:`ember.codegen.vectorize`), run by the PYTHON device (the reference) and equal to numpy and to the scalar
program."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from ember import Tensor
from ember.builtin_devices.python import PythonRenderer, encode_program
from ember.codegen import get_program
from ember.codegen.opts import Opt
from ember.dtype import dtypes, from_np_dtype, to_np_dtype
from ember.engine.realize import CompiledRunner, run_schedule
from ember.ir.uop import Ops, UOp

RNG = np.random.default_rng(3)


def test_vec_dtype_names_lanes_and_round_trips() -> None:
    f4 = dtypes.float32.vec(4)
    assert (f4.count, f4.itemsize, f4.name, f4.kind) == (4, 16, "float4", "f")
    assert f4.scalar() == dtypes.float32 and f4.scalar() is not f4
    assert dtypes.float32.vec(1) is dtypes.float32 and dtypes.float32.scalar() is dtypes.float32
    assert f4 == dtypes.float.vec(4) and hash(f4) == hash(dtypes.float.vec(4)) and f4 != dtypes.float32
    assert f4 != dtypes.int32.vec(4) and dtypes.half.vec(2) != dtypes.half.vec(4)
    assert repr(f4) == "dtypes.float.vec(4)"
    assert pickle.loads(pickle.dumps(f4)) == f4
    assert (dtypes.int8.vec(4).min, dtypes.int8.vec(4).max) == (-128, 127)  # a lane's range


@pytest.mark.parametrize("bad", [0, -2, 2.0, True])
def test_vec_needs_a_positive_int_count(bad) -> None:
    with pytest.raises(ValueError, match="lane count"):
        dtypes.float32.vec(bad)


def test_no_vector_of_vectors() -> None:
    with pytest.raises(ValueError, match="only a scalar dtype"):
        dtypes.float32.vec(4).vec(2)


def _memory_ops(uops) -> list[UOp]:
    return [u for u in uops if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL]


def _lanes(u: UOp) -> int:
    return (u.dtype if u.op is Ops.LOAD else u.src[2].dtype).count


def _run(si, opts: list[Opt], renderer) -> tuple[np.ndarray, tuple[UOp, ...]]:
    """``si``'s kernel lowered for ``renderer`` with ``opts``, run on the PYTHON device: (what it wrote, uops)."""
    spec = get_program(si.ast, renderer, opts=opts)
    for b in si.bufs:
        b.allocate()
    CompiledRunner("PYTHON", spec)(list(si.bufs), wait=True)
    out = si.bufs[0]
    return np.frombuffer(out.as_bytes(), to_np_dtype(out.dtype)).copy(), spec.uops


def _last(out: Tensor):
    sched = out.schedule()
    run_schedule(sched[:-1])
    return sched[-1]


def _scalar(renderer):
    r = copy.copy(renderer)
    r.vector_widths = {}
    return r


@pytest.mark.parametrize("dt", [np.float32, np.int32, np.float16, np.int8])
def test_upcast_contiguous_axis_loads_and_stores_vectors(dt) -> None:
    a = (RNG.uniform(-50, 50, (8, 32))).astype(dt)
    b = (RNG.uniform(-50, 50, (8, 32))).astype(dt)
    ta = Tensor(a, device="PYTHON")
    si = _last(ta * Tensor(b, device="PYTHON") + ta)
    got, uops = _run(si, [Opt("UPCAST", 1, 4)], PythonRenderer())
    mem = _memory_ops(uops)
    # one 4-lane load per input buffer and one 4-lane store: nothing left scalar
    assert sorted((u.op.name, _lanes(u)) for u in mem) == [("LOAD", 4), ("LOAD", 4), ("STORE", 4)]
    assert any(u.op is Ops.GEP for u in uops) and any(u.op is Ops.VECTORIZE for u in uops)
    want, scalar_uops = _run(si, [Opt("UPCAST", 1, 4)], _scalar(PythonRenderer()))
    assert all(_lanes(u) == 1 for u in _memory_ops(scalar_uops))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.reshape(8, 32), (a * b + a).astype(dt))


def test_copy_stores_the_loaded_vector() -> None:
    a = RNG.standard_normal((4, 32)).astype(np.float32)
    si = _last(Tensor(a, device="PYTHON")[:, 8:24].contiguous())
    got, uops = _run(si, [Opt("UPCAST", 1, 8)], PythonRenderer())
    assert not any(u.op is Ops.VECTORIZE for u in uops)  # the loaded vector is stored as it is
    assert [(_lanes(u)) for u in _memory_ops(uops)] == [8, 8]
    np.testing.assert_array_equal(got.reshape(4, 16), a[:, 8:24])


def test_strided_axis_stays_scalar() -> None:
    a = RNG.standard_normal((16, 16)).astype(np.float32)
    si = _last(Tensor(a, device="PYTHON").T + 1)
    got, uops = _run(si, [Opt("UPCAST", 1, 4)], PythonRenderer())
    loads = [u for u in _memory_ops(uops) if u.op is Ops.LOAD]
    assert loads and all(_lanes(u) == 1 for u in loads)  # the transposed input moves 16 elements per lane
    assert [_lanes(u) for u in _memory_ops(uops) if u.op is Ops.STORE] == [4]  # the output is contiguous
    np.testing.assert_array_equal(got.reshape(16, 16), a.T + 1)


def test_unaligned_offset_stays_scalar() -> None:
    a = RNG.standard_normal((8, 33)).astype(np.float32)
    si = _last(Tensor(a, device="PYTHON")[:, 1:] * 2)
    got, uops = _run(si, [Opt("UPCAST", 1, 4)], PythonRenderer())
    # rows of 33 starting at element 1: no run of the input is a multiple of 4 away from the buffer's start
    assert all(_lanes(u) == 1 for u in _memory_ops(uops) if u.op is Ops.LOAD)
    np.testing.assert_array_equal(got.reshape(8, 32), a[:, 1:] * 2)


def test_padded_lanes_with_their_own_gates_stay_scalar() -> None:
    a = RNG.standard_normal((6, 30)).astype(np.float32)
    si = _last(Tensor(a, device="PYTHON") * 3)
    got, uops = _run(si, [Opt("PADTO", 1, 32), Opt("UPCAST", 1, 4)], PythonRenderer())
    # columns 4g and 4g+1 (g < 8) are always below 30: one ungated 2-lane vector; 4g+2 and 4g+3 each have their
    # own gate (g < 7) and stay scalar, so nothing past the row is read or written
    mem = _memory_ops(uops)
    assert sorted((u.op.name, _lanes(u), len(u.src)) for u in mem) == [
        ("LOAD", 1, 3), ("LOAD", 1, 3), ("LOAD", 2, 2), ("STORE", 1, 4), ("STORE", 1, 4), ("STORE", 2, 3)]
    np.testing.assert_array_equal(got.reshape(6, 30), a * 3)


def test_renderer_without_vectors_gets_the_scalar_program() -> None:
    a = RNG.standard_normal((8, 32)).astype(np.float32)
    si = _last(Tensor(a, device="PYTHON") + 1)
    plain = _scalar(PythonRenderer())
    assert plain.vector_widths == {}
    _, uops = _run(si, [Opt("UPCAST", 1, 4)], plain)
    assert not any(u.op in (Ops.GEP, Ops.VECTORIZE) for u in uops)


def test_python_device_refuses_a_misaligned_vector_access() -> None:
    f4 = dtypes.float32.vec(4)
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), (0, 8))
    load = UOp(Ops.LOAD, f4, (buf, UOp.const(dtypes.int32, 2)))
    store = UOp(Ops.STORE, None, (buf, UOp.const(dtypes.int32, 4), load))
    uops = [buf, *load.src[1:], store.src[1], load, store, UOp(Ops.SINK, None, ())]
    from ember.builtin_devices.python import PythonProgram

    prog = PythonProgram("bad", encode_program("bad", uops).encode())
    data = np.arange(8, dtype=np.float32)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        prog(data)


def test_python_device_checks_vector_types() -> None:
    from ember.builtin_devices.python import PythonProgram

    a, b = UOp.const(dtypes.float32, 1.0), UOp.const(dtypes.int32, 2)
    bad = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (a, b))
    with pytest.raises(ValueError, match="VECTORIZE"):
        PythonProgram("bad", encode_program("bad", [a, b, bad, UOp(Ops.SINK, None, ())]).encode())
    vec = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (a, a))
    gep = UOp(Ops.GEP, dtypes.float32, (vec,), 2)
    with pytest.raises(ValueError, match="GEP"):
        PythonProgram("bad", encode_program("bad", [a, vec, gep, UOp(Ops.SINK, None, ())]).encode())


# --- the corpus on every vector-capable renderer --------------------------------------------------------------


def _renderer(name: str):
    if name == "cl":
        return pytest.importorskip("ember_opencl.renderer").CLRenderer(fp16=True, fp64=True)
    if name == "cuda":
        return pytest.importorskip("ember_cuda.renderer").CUDARenderer("sm_80")
    if name == "metal":
        return pytest.importorskip("ember_metal.renderer").MetalRenderer()
    return pytest.importorskip("ember_amd.renderer").AMDRenderer("gfx1100")


@pytest.fixture(scope="module")
def corpus() -> list[UOp]:
    from ember.testing.kernels import representative_asts

    return representative_asts()


#: vector (loads, stores) each renderer gets on the representative corpus, at least (80 kernels: CL 50/18,
#: CUDA 50/14, Metal 40/10, AMD 50/14 when this was written)
VECTOR_FLOOR = {"cl": (40, 12), "cuda": (40, 10), "metal": (30, 8), "amd": (40, 10)}


@pytest.mark.parametrize("name", ["cl", "cuda", "metal", "amd"])
def test_corpus_uses_aligned_vector_access(name: str, corpus: list[UOp]) -> None:
    """Every kernel of the corpus renders; where an upcast axis is contiguous and aligned its loads and stores
    are vectors (counted), each at an index that is provably a multiple of its width, moving exactly the
    elements the scalar program moves."""
    from ember.codegen.vectorize import _multiple_of, _split_index

    renderer = _renderer(name)
    scalar = _scalar(renderer)
    vector_loads = vector_stores = 0
    for i, ast in enumerate(corpus):
        if name == "metal" and any(u.dtype in (dtypes.float64, dtypes.float64.ptr()) for u in ast.toposort()):
            continue  # Metal has no float64
        moved = _memory_ops(get_program(ast, renderer, f"k{i}").uops)
        if all(_lanes(u) == 1 for u in moved):
            continue
        plain = _memory_ops(get_program(ast, scalar, f"k{i}").uops)
        assert sum(map(_lanes, moved)) == len(plain), f"kernel {i} moves other elements than its scalar program"
        for u in moved:
            if (n := _lanes(u)) > 1:
                base, off = _split_index(u.src[1])
                assert off % n == 0 and _multiple_of(base, n), f"kernel {i}: unaligned vector access {u}"
                assert n in renderer.vector_widths[u.src[0].dtype.base]
                vector_loads += u.op is Ops.LOAD
                vector_stores += u.op is Ops.STORE
    print(f"{name}: {vector_loads} vector loads, {vector_stores} vector stores in {len(corpus)} kernels")
    assert vector_loads >= VECTOR_FLOOR[name][0] and vector_stores >= VECTOR_FLOOR[name][1]


def _vector_alu(renderer):
    r = copy.copy(renderer)
    r.vector_alu = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV})
    return r


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_upcast_matmul_tile_is_vector_arithmetic_and_accumulators(dt) -> None:
    a = RNG.standard_normal((8, 16)).astype(dt)
    b = RNG.standard_normal((16, 8)).astype(dt)
    si = _last(Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON"))
    opts = [Opt("UPCAST", 1, 4), Opt("UPCAST", 0, 2)]
    got, uops = _run(si, opts, _vector_alu(PythonRenderer()))
    accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
    # 2 x 4 accumulators: two 4-lane vectors, each updated by one vector multiply and one vector add
    assert [u.dtype.count for u in accs] == [4, 4]
    assert sum(u.op is Ops.MUL and u.dtype.count == 4 for u in uops) == 2
    assert not any(u.op is Ops.ADD and u.dtype == from_np_dtype(dt) for u in uops)  # no scalar float add left
    assert [_lanes(u) for u in _memory_ops(uops) if u.op is Ops.STORE] == [4, 4]  # the accumulators stored whole
    want, scalar_uops = _run(si, opts, _scalar(PythonRenderer()))
    assert not any(u.dtype is not None and getattr(u.dtype, "count", 1) != 1 for u in scalar_uops)
    np.testing.assert_array_equal(got, want)


def test_vector_alu_broadcasts_shared_operands_and_keeps_other_ops_scalar() -> None:
    a = RNG.standard_normal((4, 32)).astype(np.float32)
    ta = Tensor(a, device="PYTHON")
    si = _last((ta * 3.0 - ta / 7.0).maximum(0.5))
    got, uops = _run(si, [Opt("UPCAST", 1, 8)], _vector_alu(PythonRenderer()))
    ops = {u.op for u in uops if u.dtype == dtypes.float32.vec(8)}
    assert {Ops.MUL, Ops.SUB, Ops.FDIV} <= ops or {Ops.MUL, Ops.SUB} <= ops
    assert Ops.MAX not in ops  # not a lane-wise operator in every dialect: its lanes stay scalar
    want, _ = _run(si, [Opt("UPCAST", 1, 8)], _scalar(PythonRenderer()))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.reshape(4, 32), np.maximum(a * np.float32(3) - a / np.float32(7), 0.5))


def test_vector_alu_off_leaves_arithmetic_scalar() -> None:
    a = RNG.standard_normal((4, 32)).astype(np.float32)
    si = _last(Tensor(a, device="PYTHON") * 2.0)
    _, uops = _run(si, [Opt("UPCAST", 1, 4)], PythonRenderer())
    assert PythonRenderer.vector_alu == frozenset()
    assert all(u.dtype.count == 1 for u in uops if u.op is Ops.MUL)
