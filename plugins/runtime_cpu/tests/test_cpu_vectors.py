"""The C dialect renders the IR's vectors (GCC/clang vector extension types, memcpy loads and stores): a CPU
renderer given vector widths runs the same kernels to the same bits as the scalar program it renders by default.

The CPU device declares float32/float64 widths and vector arithmetic itself (see CPURenderer.vector_widths); these
cases also give it integer widths, and run vector loads/stores alone ("memory") and with vector arithmetic."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opts import Opt
from ember.codegen.vectorize import VECTOR_FLOAT_OPS
from ember.dtype import dtypes, to_np_dtype
from ember.engine.realize import CompiledRunner, run_schedule
from ember.ir.uop import Ops
from ember_cpu.renderer import CPURenderer

RNG = np.random.default_rng(11)


def _vector_renderer(alu: bool = False) -> CPURenderer:
    r = CPURenderer()
    kinds = (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.int8, dtypes.uint8)
    r.vector_widths = {dt: tuple(n for n in (2, 4, 8) if n * dt.itemsize <= 32) for dt in kinds}
    r.vector_alu = VECTOR_FLOAT_OPS if alu else frozenset()
    return r


def _run(out: Tensor, renderer: CPURenderer, opts: list[Opt] | None) -> tuple[np.ndarray, str, tuple]:
    sched = out.schedule()
    run_schedule(sched[:-1])
    si = sched[-1]
    spec = get_program(si.ast, renderer, opts=opts)
    for b in si.bufs:
        b.allocate()
    CompiledRunner("CPU", spec)(list(si.bufs), wait=True)
    buf = si.bufs[0]
    return np.frombuffer(buf.as_bytes(), to_np_dtype(buf.dtype)).copy(), spec.src, spec.uops


def _cases():
    a32 = RNG.standard_normal((48, 64)).astype(np.float32)
    b32 = RNG.standard_normal((64, 40)).astype(np.float32)
    i8 = RNG.integers(-100, 100, (16, 64)).astype(np.int8)
    f64 = RNG.standard_normal((8, 32))
    return {
        "matmul heuristic": (lambda: Tensor(a32) @ Tensor(b32), None),
        "matmul upcast": (lambda: Tensor(a32) @ Tensor(b32), [Opt("UPCAST", 1, 8), Opt("UPCAST", 0, 2)]),
        "elementwise int8": (lambda: Tensor(i8) * 3 + Tensor(i8), [Opt("UPCAST", 1, 8)]),
        "row sum unrolled": (lambda: Tensor(a32).sum(1), [Opt("UNROLL", 1, 8)]),
        "float64 relu": (lambda: (Tensor(f64) - 0.5).relu(), [Opt("UPCAST", 1, 4)]),
    }


@pytest.mark.parametrize("alu", [False, True], ids=["memory", "alu"])
@pytest.mark.parametrize("name", list(_cases()))
def test_vector_kernels_compute_what_scalar_ones_do(name: str, alu: bool) -> None:
    build, opts = _cases()[name]
    vector = _vector_renderer(alu)
    scalar = copy.copy(vector)
    scalar.vector_widths, scalar.vector_alu = {}, frozenset()
    got, src, uops = _run(build(), vector, opts)
    want, plain_src, _ = _run(build(), scalar, opts)
    # with vector arithmetic, loads whose lanes only scalar ops read (integer math, an unrolled sum's separate
    # accumulators) stay scalar loads: the compiler's loop vectorizer regroups them
    scalar_work = alu and name in ("elementwise int8", "row sum unrolled")
    assert any(u.op is Ops.LOAD and u.dtype.count > 1 for u in uops) is not scalar_work
    assert ("__builtin_memcpy(&v_" in src) is not scalar_work and "__builtin_memcpy(&v_" not in plain_src
    np.testing.assert_array_equal(got, want)


def test_matmul_tile_accumulates_in_vectors() -> None:
    """With vector arithmetic the upcast matmul's register tile is vector multiply-adds into accumulator vectors
    in the C itself: nothing for the renderer to recover."""
    build, opts = _cases()["matmul upcast"]
    got, src, uops = _run(build(), _vector_renderer(alu=True), opts)
    accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert len(accs) == 2 and all(u.dtype == dtypes.float32.vec(8) for u in accs)
    assert "ember_float8 acc0 = ((ember_float8){0.0f" in src
    scalar = CPURenderer()
    scalar.vector_widths, scalar.vector_alu = {}, frozenset()
    want, _, _ = _run(build(), scalar, opts)
    np.testing.assert_array_equal(got, want)


def test_cpu_device_declares_float_vectors_of_whole_registers() -> None:
    r = CPURenderer()
    assert set(r.vector_widths) == {dtypes.float32, dtypes.float64} and r.vector_alu == VECTOR_FLOAT_OPS
    for dt, widths in r.vector_widths.items():
        assert widths and all(16 <= n * dt.itemsize <= r.vector_floats * 4 for n in widths)
