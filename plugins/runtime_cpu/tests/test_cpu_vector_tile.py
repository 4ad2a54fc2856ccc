"""Register tiles as the IR's vectors on the CPU: an upcast matmul, column sum or convolution tile arrives as
vector loads, vector multiply-adds into accumulator vectors and vector stores (ember.codegen.vectorize), and the
C dialect writes them with GCC/clang vector types; nothing is recovered from scalars.

Each case renders one kernel with chosen opts twice, with vectors and without (the scalar program), runs both, and
checks the source took the path it should, the result matches numpy, and the vector tile's result equals the
scalar tile's bit for bit (the same products summed in the same order; the same operations on each element after
the loop)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.opts import Opt
from ember.codegen.vectorize import VECTOR_FLOAT_OPS
from ember.dtype import to_np_dtype
from ember.engine.realize import CompiledRunner, run_schedule
from ember_cpu.compiler import find_cc
from ember_cpu.renderer import CPURenderer

pytestmark = [pytest.mark.skipif(find_cc() is None, reason="no C compiler found"),
              pytest.mark.usefixtures("private_cache_dir")]

RNG = np.random.default_rng(5)



class Lanes(CPURenderer):
    """A CPU renderer with 16-float vectors (or none: the scalar program), whatever the test machine has."""

    def __init__(self, vectors: bool):
        super().__init__()
        self.vector_floats, self.vector_registers = 16, 32
        self.vector_widths = {dt: tuple(n for n in (4, 8, 16) if 16 <= n * dt.itemsize <= 64)
                              for dt in (dtypes.float32, dtypes.float64)} if vectors else {}
        self.vector_alu = VECTOR_FLOAT_OPS if vectors else frozenset()


def vector_accs(src: str) -> list[str]:
    """The accumulator vectors a kernel declares (``ember_float16 acc0 = ...``), by name."""
    return re.findall(r"ember_[a-z]+\d+ (acc\d+) = ", src)


def scalar_float_accs(src: str) -> list[str]:
    return re.findall(r"(?:float|double) (acc\d+) = ", src)


def randf(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.uniform(-1, 1, size=shape).astype(dtype)


def tensors(*arrays: np.ndarray) -> list[Tensor]:
    return [Tensor(a, device="CPU").realize() for a in arrays]


def run_both(out: Tensor, opts: list[Opt] | None) -> tuple[str, np.ndarray, np.ndarray]:
    """``out``'s last kernel rendered with ``opts``, with vectors and without: the vector program's source and what
    each wrote."""
    sched = out.schedule()
    run_schedule(sched[:-1])
    si = sched[-1]
    results, srcs = [], []
    for vector in (True, False):
        spec = get_program(si.ast, Lanes(vector), opts=opts)
        for b in si.bufs:
            b.allocate()
        CompiledRunner("CPU", spec)(list(si.bufs), wait=True)
        buf = si.bufs[0]
        results.append(np.frombuffer(buf.as_bytes(), to_np_dtype(buf.dtype)).copy().reshape(out.shape))
        srcs.append(spec.src)
    assert "ember_float" not in srcs[1] and "ember_double" not in srcs[1]
    return srcs[0], results[0], results[1]


@pytest.mark.parametrize("m,k,n,opts", [
    (64, 37, 64, [Opt("UPCAST", 1, 32), Opt("UPCAST", 0, 8)]),   # two 16-lane vectors per row, odd K
    (32, 48, 64, [Opt("UPCAST", 1, 16), Opt("UPCAST", 0, 4)]),   # one vector per row
    (16, 9, 40, [Opt("UPCAST", 1, 8), Opt("UPCAST", 0, 4)]),     # rows of 8: half-width vectors
    (24, 5, 48, [Opt("UPCAST", 1, 48), Opt("UPCAST", 0, 3)]),    # three vectors, three columns
])
def test_matmul_tile_is_vector_code_and_exact(m, k, n, opts):
    a_np, b_np = randf(m, k), randf(k, n)
    a, b = tensors(a_np, b_np)
    src, vec, scalar = run_both(a @ b, opts)
    rows = next(o.arg for o in opts if o.axis == 0)
    cols = next(o.arg for o in opts if o.axis == 1)
    # one accumulator vector per (row, vector of columns), none left scalar; stored whole
    assert len(vector_accs(src)) == rows * cols // min(cols, 16) and not scalar_float_accs(src), src
    assert "__builtin_memcpy(data0 +" in src, src
    np.testing.assert_allclose(vec, a_np @ b_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vec, scalar)


def test_tile_with_lanes_along_the_first_operand():
    """``a.T @ b.T``: the neighbouring loads are ``a``'s, the first operand of each product."""
    a_np, b_np = randf(40, 64), randf(32, 40)  # a: (k, n), b: (m, k)
    a, b = tensors(a_np, b_np)
    src, vec, scalar = run_both(a.T @ b.T, [Opt("UPCAST", 0, 32), Opt("UPCAST", 1, 8)])
    assert len(vector_accs(src)) == 16 and not scalar_float_accs(src), src
    np.testing.assert_allclose(vec, a_np.T @ b_np.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vec, scalar)


def test_fused_bias_and_relu_after_the_tile():
    """The bias and relu after the loop: vector adds and vector maxes (ember's relu: a nan kept) on the
    accumulator vectors, stored as vectors; the same operations on each element as the scalar program's."""
    a_np, b_np, bias_np = randf(64, 33), randf(33, 64), randf(64)
    a, b, bias = tensors(a_np, b_np, bias_np)
    src, vec, scalar = run_both((a @ b + bias).relu(), [Opt("UPCAST", 1, 32), Opt("UPCAST", 0, 8)])
    assert len(vector_accs(src)) == 16 and "m_ = a_ <= b_;" in src, src
    assert "__builtin_memcpy(data0 +" in src and "data0[" not in src, src
    np.testing.assert_allclose(vec, np.maximum(a_np @ b_np + bias_np, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vec, scalar)


def test_sgd_step_after_the_tile():
    """An SGD step on a weight gradient (``w - lr * x.T @ g``): each element reads its weight and the one
    learning rate."""
    x_np, g_np, w_np = randf(40, 64), randf(40, 32), randf(64, 32)
    x, g, w = tensors(x_np, g_np, w_np)
    lr = Tensor(np.array([0.125], np.float32), device="CPU").realize()
    src, vec, scalar = run_both(w - lr * (x.T @ g), [Opt("UPCAST", 0, 32), Opt("UPCAST", 1, 8)])
    assert vector_accs(src) and not scalar_float_accs(src), src
    # the tile's vectors run across the output: the update is one loop (the weights' contiguous axis inside)
    assert len(epilogue_loops(src)) == 2 and src.count("data0[") == 1, src
    np.testing.assert_allclose(vec, w_np - np.float32(0.125) * (x_np.T @ g_np), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vec, scalar)


def epilogue_loops(src: str) -> list[str]:
    """The loops of a rolled epilogue (``for (int ridxN = ...``) after the array they read (``reg0``)."""
    return re.findall(r"for \(int (ridx\d+) = 0; ridx\d+ < \d+;", src[src.index("reg0["):]) if "reg0[" in src else []


def test_relu_mask_after_the_tile_is_one_loop():
    """A relu's backward mask after the tile (a compare and a select on each lane: no vector ops) is one loop over
    the accumulators (ember.codegen.epilogue): the rows outside, the contiguous columns inside (omp simd), one
    store statement instead of 256; each element the same operations as the unrolled program's."""
    a_np, b_np, m_np = randf(64, 33), randf(33, 64), randf(64, 64)
    a, b, m = tensors(a_np, b_np, m_np)
    src, vec, scalar = run_both((m > 0).where(a @ b, 0.0), [Opt("UPCAST", 1, 32), Opt("UPCAST", 0, 8)])
    assert len(vector_accs(src)) == 16 and len(epilogue_loops(src)) == 2, src
    assert src.count("data0[") == 1 and "#pragma omp simd\n" in src[src.index("reg0["):], src
    np.testing.assert_allclose(vec, np.where(m_np > 0, a_np @ b_np, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vec, scalar)


def test_sgd_update_in_place_matches_numpy():
    """The same step written back into ``w`` (the optimizer's kernel: each element loads the weight it then
    stores), run once with the CPU device's own renderer."""
    x_np, g_np, w_np = randf(256, 512), randf(256, 128), randf(512, 128)
    x, g, w = tensors(x_np, g_np, w_np)
    w.assign(w - 0.125 * (x.T @ g)).realize()
    np.testing.assert_allclose(w.numpy(), w_np - np.float32(0.125) * (x_np.T @ g_np), rtol=1e-4, atol=1e-4)


def test_float64_tile_has_eight_lane_vectors():
    a_np, b_np = randf(32, 21, dtype=np.float64), randf(21, 32, dtype=np.float64)
    a, b = tensors(a_np, b_np)
    assert a.dtype == dtypes.float64
    src, vec, scalar = run_both(a @ b, [Opt("UPCAST", 1, 16), Opt("UPCAST", 0, 4)])
    assert len(vector_accs(src)) == 8 and "typedef double ember_double8" in src, src
    np.testing.assert_allclose(vec, a_np @ b_np, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(vec, scalar)


def in_order_sums(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a @ b`` in float32 summed in order over k, each step one fused multiply-add (one rounding: the float64
    product is exact) or a multiply and an add (two roundings)."""
    fused = np.zeros((a.shape[0], b.shape[1]), np.float32)
    split = fused.copy()
    for k in range(a.shape[1]):
        p = a[:, k, None].astype(np.float64) * b[None, k, :].astype(np.float64)
        fused = (p + fused).astype(np.float32)
        split = p.astype(np.float32) + split
    return fused, split


def test_tile_of_a_relu_operand():
    """``g.T @ relu(h)`` (the last layer's weight gradient, the relu recomputed in the loop): ``h``'s vectors go
    through the relu's compare-and-select (a nan kept, -0.0 made 0.0, as the scalar relu does), and each output is
    the sum in order, every step contracted into a fused multiply-add or none (gcc's scalar tile of this kernel
    contracts only some of its accumulators: it may differ from it in the last bit)."""
    g_np, h_np = randf(48, 10), randf(48, 64)
    h_np[0, :3] = [np.nan, -0.0, np.inf]
    g, h = tensors(g_np, h_np)
    src, vec, scalar = run_both(g.T @ h.relu(), [Opt("UPCAST", 1, 32), Opt("UPCAST", 0, 2)])
    assert len(vector_accs(src)) == 4 and "m_ = a_ <= b_;" in src, src
    relu = np.where((h_np > 0) | np.isnan(h_np), h_np, np.float32(0))
    fused, split = in_order_sums(np.ascontiguousarray(g_np.T), relu)
    assert np.array_equal(vec, fused, equal_nan=True) or np.array_equal(vec, split, equal_nan=True)
    np.testing.assert_allclose(vec, scalar, rtol=1e-5, atol=1e-6)


def test_column_sum_tile_is_vector_code_and_exact():
    """A column sum (a bias gradient) with a 64-wide tile: each accumulator adds one element per row, four
    16-lane vectors per step, in the same order as the scalar tile."""
    x_np = randf(96, 128)
    (x,) = tensors(x_np)
    src, vec, scalar = run_both(x.sum(0), [Opt("UPCAST", 1, 64)])
    assert len(vector_accs(src)) == 4 and not scalar_float_accs(src), src
    np.testing.assert_allclose(vec, x_np.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vec, scalar)


def test_unrolled_row_sum_is_left_to_the_simd_reduction():
    """An unrolled sum along a contiguous row (accumulator k adds elements k, k + 8, ...) is no column sum:
    it stays the ``omp simd`` reduction it was."""
    x_np = randf(16, 512)
    (x,) = tensors(x_np)
    src, vec, _ = run_both(x.sum(1), [Opt("UNROLL", 1, 8)])
    assert not vector_accs(src) and "#pragma omp simd reduction" in src, src
    np.testing.assert_allclose(vec, x_np.sum(1), rtol=1e-5, atol=1e-5)


def _conv_windows(x: np.ndarray, k: int) -> np.ndarray:
    """``(b, c, h - k + 1, w - k + 1, k, k)`` sliding windows of ``x`` (a copy)."""
    b, c, h, w = x.shape
    out = np.empty((b, c, h - k + 1, w - k + 1, k, k), x.dtype)
    for i in range(k):
        for j in range(k):
            out[..., i, j] = x[:, :, i:i + h - k + 1, j:j + w - k + 1]
    return out


@pytest.mark.parametrize("cin,cout", [(32, 16), (64, 32)])
def test_convolution_tile_over_a_reduce_nest(cin, cout):
    """A convolution reduces over kernel rows, kernel columns and channels: three nested loops with the register
    tile's multiply-adds in the innermost. Its vector accumulators open before the outermost loop and its step
    is the innermost loop's body. Left scalar, a tile row spanning all output channels (64 -> 32, as in a
    conv net's input gradient) read the weight as one contiguous run per channel step, and gcc vectorized the
    channel loop with permutes and spills instead of the tile: 0.9 GFLOPS against 125."""
    x_np, w_np = randf(8, cin, 18, 18), randf(cout, cin, 3, 3)
    x, w = tensors(x_np, w_np)
    out = x.conv2d(w)
    want = np.einsum("bchwij,ocij->bohw", _conv_windows(x_np, 3), w_np)
    src, vec, scalar = run_both(out, None)  # the heuristic's tile
    # the kernel writes (batch, rows, columns, channels): the tensor is a view of it in the usual order
    want = want.transpose(0, 2, 3, 1).reshape(out.shape)
    accs = vector_accs(src)
    assert accs, src
    body = src[src.index("void "):]
    assert body.index(f" {accs[0]} = ") < body.index("for (int ridx"), src  # opened outside the whole nest
    assert body.count(f"{accs[0]} = alu") == 1, src  # one update, in the innermost loop
    np.testing.assert_allclose(vec, want, rtol=1e-4, atol=1e-4)
    # not bit for bit: gcc left some of the scalar tile's products uncontracted (multiply, then add)
    np.testing.assert_allclose(vec, scalar, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["sums_along_k", "rows_narrower_than_a_vector", "work_inside_the_loop"])
def test_other_tiles(case):
    """Tiles whose lanes are no neighbouring elements, or narrower than 16 bytes, stay scalar; a relu of each
    product inside the loop is vector code like the products themselves. All exact."""
    x_np, w_np = randf(32, 48), randf(48, 48)
    x, w = tensors(x_np, w_np)
    if case == "sums_along_k":  # x @ w.T: both loads run along the reduction
        out, want, opts = x @ w.T, x_np @ w_np.T, [Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 4)]
    elif case == "rows_narrower_than_a_vector":  # 2 floats: narrower than the narrowest vector
        out, want, opts = x @ w, x_np @ w_np, [Opt("UPCAST", 1, 2), Opt("UPCAST", 0, 8)]
    else:  # a relu of each product inside the loop
        out = (x.reshape(32, 48, 1) * w.reshape(1, 48, 48)).relu().sum(1)
        want = np.maximum(x_np[:, :, None] * w_np[None], 0).sum(1)
        opts = [Opt("UPCAST", 2, 16), Opt("UPCAST", 0, 4)]
    src, vec, scalar = run_both(out, opts)
    assert bool(vector_accs(src)) == (case == "work_inside_the_loop"), src
    np.testing.assert_allclose(vec, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(vec, scalar)
