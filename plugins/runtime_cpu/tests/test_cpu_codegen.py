"""The C the CPU renderer writes for speed: register tiles, ``omp simd`` loops, the vectorizable exp.

Each speed-up is checked twice: the source has the shape that makes the host compiler vectorize,
and the results stay exact (matmul tiles against numpy, exp within 1 ulp of float64 exp).
"""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.heuristic import heuristic_opts
from ember.codegen.opts import Opt
from ember_cpu.compiler import BASE_FLAGS, find_cc
from ember_cpu.renderer import CPURenderer

pytestmark = [pytest.mark.skipif(find_cc() is None, reason="no C compiler found"),
              pytest.mark.usefixtures("private_cache_dir")]

RNG = np.random.default_rng(11)



class RegisterFile(CPURenderer):
    """A CPU renderer with a chosen register file, so tile choices do not depend on the test machine."""

    def __init__(self, lanes: int, registers: int, vectors: bool = True):
        super().__init__()
        self.vector_floats, self.vector_registers = lanes, registers
        self.vector_widths = {dt: tuple(n for n in (2, 4, 8, 16) if 16 <= n * dt.itemsize <= lanes * 4)
                              for dt in (dtypes.float32, dtypes.float64)} if vectors else {}
        if not vectors:
            self.vector_alu = frozenset()


def kernel_ast(t: Tensor):
    """The AST of the last kernel computing ``t`` (its inputs realized)."""
    return [si for si in t.schedule() if getattr(si, "ast", None) is not None][-1].ast


def randf(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, size=shape).astype(np.float32)


def realized(*arrays: np.ndarray) -> list[Tensor]:
    return [Tensor(a, device="CPU").realize() for a in arrays]


def run_with_opts(t: Tensor, opts: list[Opt]) -> np.ndarray:
    """``t``'s last kernel (its inputs realized) built with ``opts`` and run on the CPU; what it wrote."""
    from ember.dtype import to_np_dtype
    from ember.engine.realize import CompiledRunner

    si = [si for si in t.schedule() if getattr(si, "ast", None) is not None][-1]
    spec = get_program(si.ast, CPURenderer(), opts=opts)
    for b in si.bufs:
        b.allocate()
    CompiledRunner("CPU", spec)(list(si.bufs), wait=True)
    return np.frombuffer(si.bufs[0].as_bytes(), to_np_dtype(si.bufs[0].dtype)).copy()


@pytest.mark.parametrize("lanes,registers,tile", [(16, 32, [Opt("UPCAST", 1, 32), Opt("UPCAST", 0, 8)]),
                                                  (8, 16, [Opt("UPCAST", 1, 16), Opt("UPCAST", 0, 4)]),
                                                  (4, 16, [Opt("UPCAST", 1, 8), Opt("UPCAST", 0, 4)])])
def test_matmul_tile_fits_the_register_file(lanes, registers, tile):
    a, b = realized(randf(256, 256), randf(256, 128))  # large enough for a full tile (small_kernel_work)
    assert heuristic_opts(kernel_ast(a @ b), RegisterFile(lanes, registers)) == tile


def test_a_small_matmul_gets_a_small_tile():
    """A 64 x 48 x 64 product runs for microseconds whatever its tile: it gets at most small_kernel_tile
    accumulators (a 256-output tile costs the C compiler several times as long), and still matches numpy."""
    a_np, b_np = randf(64, 48), randf(48, 64)
    a, b = realized(a_np, b_np)
    opts = heuristic_opts(kernel_ast(a @ b), RegisterFile(16, 32))
    assert opts and np.prod([o.amount for o in opts]) <= CPURenderer.small_kernel_tile
    np.testing.assert_allclose((a @ b).numpy(), a_np @ b_np, rtol=1e-5, atol=1e-5)


def test_tile_rows_are_whole_half_registers_where_the_size_allows():
    """The MLP's first-layer weight gradient (784 = 49 * 16 contiguous outputs): rows of 16 (two 8-float halves
    of a 16-lane register), not 28 (3.5 halves: 3x slower); the result still matches numpy."""
    g_np, x_np = randf(64, 32), randf(64, 784)
    g, x = realized(g_np, x_np)
    opts = heuristic_opts(kernel_ast(g.T @ x), RegisterFile(16, 32))
    assert opts[0] == Opt("UPCAST", 1, 16)
    np.testing.assert_allclose((g.T @ x).numpy(), g_np.T @ x_np, rtol=1e-5, atol=1e-5)


def test_transposed_matmul_tile_is_a_block_of_vector_sums(monkeypatch):
    """``x @ w.T`` reads both inputs along the reduce axis: a square block of outputs (one vector sum each) shares
    the loads, 4 x 4 in a large kernel, small_shared_tile per axis in a small one (where a bigger block costs the
    compiler more than it saves); both match numpy."""
    x_np, w_np = randf(64, 48), randf(64, 48)
    x, w = realized(x_np, w_np)
    ast = kernel_ast(x @ w.T)
    small = heuristic_opts(ast, RegisterFile(16, 32))
    assert sorted(o.amount for o in small) == [CPURenderer.small_shared_tile] * 2
    as_if_large = RegisterFile(16, 32)
    as_if_large.small_kernel_work = 0
    large = heuristic_opts(ast, as_if_large)
    assert sorted(o.amount for o in large) == [4, 4]
    want = x_np @ w_np.T
    for opts in (small, large):
        np.testing.assert_allclose(run_with_opts(x @ w.T, opts).reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_a_tiny_reduction_gets_no_tile():
    """A reduction of fewer than tiny_kernel_work steps (an MLP's 256 x 10 softmax sums) runs for a microsecond
    whatever its tile: it gets none (a tile costs the C compiler more than the kernel ever runs), but an axis its
    value does not depend on is still computed once."""
    x_np = randf(256, 10)
    x = realized(x_np)[0]
    assert 256 * 10 < CPURenderer.tiny_kernel_work
    assert heuristic_opts(kernel_ast(x.sum(0)), RegisterFile(16, 32)) == []
    assert heuristic_opts(kernel_ast(x.exp().max(1)), RegisterFile(16, 32)) == []
    np.testing.assert_allclose(x.sum(0).numpy(), x_np.sum(0), rtol=1e-5, atol=1e-5)
    # a big enough column sum still gets a row of outputs per step
    big = realized(randf(1024, 64))[0]
    assert heuristic_opts(kernel_ast(big.sum(0)), RegisterFile(16, 32)) != []


def test_loads_outside_the_reduction_do_not_pick_the_tile():
    # the row max of a softmax is read once per row: it must not make rows look like a contiguous output axis
    x, m = realized(randf(64, 48), randf(64, 1))
    assert heuristic_opts(kernel_ast((x - m).exp().sum(1)), RegisterFile(16, 32)) == []


def test_big_bodies_get_smaller_tiles():
    a, b = realized(randf(64, 48), randf(48, 64))
    plain = heuristic_opts(kernel_ast(a @ b), RegisterFile(16, 32))
    body = (a.reshape(64, 48, 1) * b.reshape(1, 48, 64)).exp().sin().sqrt().log().cos().sum(1)
    heavy = heuristic_opts(kernel_ast(body), RegisterFile(16, 32))
    assert np.prod([o.amount for o in heavy]) < np.prod([o.amount for o in plain])


@pytest.mark.parametrize("m,k,n", [(64, 48, 64), (100, 30, 100), (12, 7, 40), (33, 17, 20), (8, 3, 96)])
def test_tiled_matmul_matches_numpy(m, k, n):
    a, b, bias = randf(m, k), randf(k, n), randf(n)
    ta, tb, tbias = realized(a, b, bias)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((ta @ Tensor(np.ascontiguousarray(b.T), device="CPU").T).numpy(), a @ b,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(((ta @ tb) + tbias).relu().numpy(), np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)


def test_batched_tiled_matmul_matches_numpy():
    a, b = randf(3, 40, 24), randf(3, 24, 48)
    ta, tb = realized(a, b)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_kernel_is_register_tiled():
    a, b = realized(randf(256, 256), randf(256, 128))
    renderer = RegisterFile(16, 32)
    src = get_program(kernel_ast(a @ b), renderer).src
    # one output per element of the 32 x 8 tile, summed in 16-lane accumulator vectors (the IR's): no scalar
    # accumulator
    assert len(re.findall(r"ember_float16 acc\d+ = ", src)) == 32 * 8 // 16
    assert "float acc" not in src
    assert re.search(r"for \(int ridx\d+ = 0; ridx\d+ < 256; ridx\d+\+\+\)", src)
    # written as scalar C: one accumulator per output
    scalar = get_program(kernel_ast(a @ b), RegisterFile(16, 32, vectors=False)).src
    assert scalar.count("float acc") == 32 * 8


def test_elementwise_loop_is_simd_and_exp_vectorizes():
    x, y = realized(randf(4096), randf(4096))
    renderer = CPURenderer()
    src = get_program(kernel_ast((x * 2 + y).relu().exp() * y - x), renderer).src
    assert "#pragma omp parallel for simd" in src or "#pragma omp simd" in src
    # no call of the C library's scalar expf (the preamble declares it; ldexpf in a helper is another function)
    assert src.startswith(renderer.preamble)
    body = src[len(renderer.preamble):]
    assert "ember_expf(" in body and not re.search(r"\bexpf\(", body)


def test_a_tiny_kernel_is_not_forced_into_vector_code():
    """Below ``simd_min_work`` elements (a bias of 10, a 256 x 10 softmax) no loop gets ``omp simd``: the kernel runs
    in about a microsecond either way and its vector and remainder loops would cost the compiler several ms. Counted
    in elements, not loop steps: an unrolled reduction's copies count."""
    renderer = CPURenderer()
    for n, simd in ((10, False), (renderer.simd_min_work - 1, False), (renderer.simd_min_work, True)):
        x, y = realized(randf(n), randf(n))
        src = get_program(kernel_ast((x * 2 + y).exp()), renderer).src
        assert ("omp simd" in src or "parallel for simd" in src) is simd, (n, src)
    rows = realized(randf(256, 10))[0]
    assert "omp simd" not in get_program(kernel_ast(rows.max(1)), renderer).src
    (wide,) = realized(randf(8, 512))
    unrolled = get_program(kernel_ast(wide.sum(1)), renderer, opts=[Opt("UNROLL", 1, 8)]).src
    assert "#pragma omp simd reduction" in unrolled, "8 rows x 64 steps x 8 accumulators is 4096 elements"


def test_strided_inner_loop_is_not_forced_simd():
    x = realized(randf(64, 64))[0]
    src = get_program(kernel_ast(x.T + 1), CPURenderer()).src
    assert "simd" not in src.split("void ", 1)[1]


def is_gcc() -> bool:
    cc = find_cc()
    if cc is None:
        return False
    out = subprocess.run([*cc, "--version"], capture_output=True, text=True, check=False).stdout
    return "Free Software Foundation" in out and "clang" not in out


@pytest.mark.skipif(not is_gcc(), reason="reads gcc's vectorizer report")
def test_gcc_vectorizes_the_fused_chain(tmp_path):
    """A relu in front of exp must not keep the loop scalar (-fno-trapping-math in BASE_FLAGS makes that possible)."""
    x, y = realized(randf(4096), randf(4096))
    src = get_program(kernel_ast((x * 2 + y).relu().exp() * y - x), CPURenderer()).src
    path = tmp_path / "k.c"
    path.write_text(src)
    cc = find_cc()
    assert cc is not None
    flags = [f for f in BASE_FLAGS if f != "-shared"]
    out = subprocess.run([*cc, *flags, "-fopenmp", "-fopt-info-vec-optimized", "-c", str(path), "-o",
                          str(tmp_path / "k.o")], capture_output=True, text=True, check=True)
    assert "loop vectorized" in out.stderr, out.stderr


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """float32 steps between ``got`` and ``want`` (both finite or equal specials)."""
    def ordered(a: np.ndarray) -> np.ndarray:
        i = a.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(got) - ordered(want))


@pytest.mark.parametrize("op", ["exp", "exp2"])
def test_exp_is_within_one_ulp_on_a_sweep(op):
    # every 997th float32 from -inf to +inf (overflow, denormal results, underflow to 0) and the specials
    bits = np.arange(0, 2 ** 32, 997, dtype=np.uint64).astype(np.uint32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72283, 88.72284, 128.0, -149.5, -150.0, -103.97,
                         -104.0, 1e-45, -1e-45, np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    x = np.concatenate([bits.view(np.float32), specials])
    got = getattr(Tensor(x, device="CPU"), op)().numpy()
    with np.errstate(all="ignore"):
        want = (np.exp(x.astype(np.float64)) if op == "exp" else np.exp2(x.astype(np.float64))).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    inf = np.isinf(want) | np.isinf(got)
    np.testing.assert_array_equal(got[inf], want[inf])
    finite = ~nan & ~inf
    worst = int(np.argmax(ulp_distance(got[finite], want[finite])))
    assert ulp_distance(got[finite], want[finite]).max() <= 1, (x[finite][worst], got[finite][worst])


def test_thread_loop_inside_another_reduce_loop_reduces_the_outer_accumulator():
    """THREAD on the inner axis of a full sum: the accumulator opened before the outer loop is updated by every
    core, so the parallel loop needs its reduction clause (without it the cores race and the sum is wrong)."""
    from ember.codegen.opts import Opt

    a = randf(24, 20)
    (t,) = realized(a)
    src = get_program(kernel_ast(t.sum()), CPURenderer(), opts=[Opt("THREAD", 1, 2)]).src
    parallel = [ln for ln in src.splitlines() if "omp parallel for" in ln]
    assert len(parallel) == 1 and "reduction(+:acc0)" in parallel[0], src


def test_tile_with_lanes_along_the_output_rows_accumulates_in_vectors_of_them():
    """``a.T @ b.T``: the tile's neighbouring loads run along a's rows (output axis 0), so its accumulator vectors
    hold output rows; the output is stored one element at a time (its rows are not contiguous). Matches numpy."""
    a_np, b_np = randf(128, 256), randf(128, 128)  # a: (k, n), b: (m, k)
    a, b = realized(a_np, b_np)
    out = a.T @ b.T
    src = get_program(kernel_ast(out), RegisterFile(16, 32), opts=[Opt("UPCAST", 0, 32), Opt("UPCAST", 1, 8)]).src
    assert len(re.findall(r"ember_float16 acc\d+ = ", src)) == 16 and "float acc" not in src
    np.testing.assert_allclose(out.numpy(), a_np.T @ b_np.T, rtol=1e-5, atol=1e-4)


def test_tile_order_leaves_sums_along_k_alone():
    """A tile whose loads all run along the reduction (``x @ w.T``, summed in vector lanes) has no order that puts
    neighbouring loads in neighbouring accumulators: it is left as it is."""
    x, w = realized(randf(64, 48), randf(64, 48))
    ast = kernel_ast(x @ w.T)
    src = get_program(ast, RegisterFile(16, 32), opts=[Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 4)]).src
    assert "tile0" not in src


def _far_tail(rows: int) -> Tensor:
    """The last 3 of ``rows`` repeats of 0..6: a view of a 7-element buffer, its offset ``7 * rows - 3``."""
    x = Tensor(np.arange(7, dtype=np.float32), device="CPU").realize()
    return x.reshape(1, 7).expand(rows, 7).reshape(rows * 7)[-3:].contiguous()


def test_index_type_is_64_bits_only_where_32_could_wrap():
    big = get_program(kernel_ast(_far_tail(5 * 10 ** 8)), CPURenderer()).src
    assert "for (long long gidx0 = 0ll; gidx0 < 3ll; gidx0++)" in big
    assert re.search(r"long long alu\d+ = \(gidx0 \+ \d+ll\);", big) and not re.search(r"\bint (alu|gidx)", big)
    small = get_program(kernel_ast(_far_tail(1000)), CPURenderer()).src
    assert "for (int gidx0 = 0; gidx0 < 3; gidx0++)" in small and "long long alu" not in small
    assert np.array_equal(_far_tail(5 * 10 ** 8).numpy(), [4, 5, 6])


def test_register_tiled_matmul_with_64_bit_indices():
    """A matmul of the last 64 rows of a view of 2**32 elements: vector tiles over long long indices."""
    a, b = randf(64, 64), randf(64, 32)
    x, w = realized(a, b)
    rows = x.reshape(1, 64, 64).expand(2 ** 20, 64, 64).reshape(2 ** 26, 64)[-64:]
    src = get_program(kernel_ast(rows @ w), CPURenderer()).src
    assert "vector_size" in src and "for (long long ridx1 = 0ll; ridx1 < 64ll; ridx1++)" in src
    np.testing.assert_allclose((rows @ w).numpy(), a @ b, rtol=1e-5, atol=1e-5)


#: the CPU's codegen and frontend policy, as the plugin declares it (ember.renderer.Renderer documents each field)
CPU_POLICY = {"max_tile_ops": 1536, "small_kernel_work": 1 << 22, "small_kernel_tile": 64, "tiny_kernel_work": 1 << 13,
              "small_shared_tile": 2, "thread_min_work": 1 << 17, "wide_sum_min_work": 1 << 22, "row_max_unroll": 2,
              "transpose_min_size": 1 << 14, "transpose_tile": (8, 2), "matmul_copy_min_macs": 1 << 21,
              "matmul_copy_min_dim": 64, "matmul_copy_min_k_across": 1024, "matmul_copy_min_outputs_across": 1 << 17,
              "conv_pad_copy_min": 1 << 16, "conv_channels_last": True, "vector_max_tiles": True}


def test_the_cpu_plugin_declares_its_policy():
    """Every tuned value is the CPU plugin's own declaration (not a default it happens to inherit)."""
    for name, value in CPU_POLICY.items():
        assert name in vars(CPURenderer), f"CPURenderer inherits {name} instead of declaring it"
        assert getattr(CPURenderer, name) == value, name


def test_the_heuristic_follows_the_renderers_policy():
    """The heuristic reads the tile limits from the renderer it is given: the 256 x 16 column sum that is too small
    for a tile on the CPU gets one from a renderer whose tiny-kernel threshold is lower."""
    x = realized(randf(256, 16))[0]
    ast = kernel_ast(x.sum(0))
    assert heuristic_opts(ast, RegisterFile(16, 32)) == []
    eager = RegisterFile(16, 32)
    eager.tiny_kernel_work = 0
    assert heuristic_opts(ast, eager) != []


def test_matmul_layout_copies_follow_the_policy(monkeypatch):
    """``a @ b.T`` (both operands contiguous along k) of 256 x 512 x 256 gets one operand copied first on the CPU
    (two kernels); on a device whose policy says no copy pays, it is one kernel."""
    from ember.device import Device

    a, b = realized(randf(256, 512), randf(256, 512))
    assert len([si for si in (a @ b.T).schedule() if si.ast.op.name == "SINK"]) == 2
    monkeypatch.setattr(Device["CPU"].renderer, "matmul_copy_min_macs", None)
    assert len([si for si in (a @ b.T).schedule() if si.ast.op.name == "SINK"]) == 1


def layer_norm_weight_gradient(batch: int = 16, tokens: int = 64, features: int = 64, outputs: int = 256):
    """A linear layer's weight gradient whose input is recomputed through a layer norm inside the kernel (as the
    scheduler fuses a pre-norm block's backward): ``g^T @ ((h - mean) / sd * w + b)``, reduced over batch and
    tokens. Returns the tensor and the numpy inputs."""
    h, g = randf(batch, tokens, features), randf(batch, tokens, outputs)
    w, b, mean = randf(features), randf(features), randf(batch, tokens, 1)
    sd = np.abs(randf(batch, tokens, 1)) + 1
    th, tg, tw, tb, tm, ts = realized(h, g, w, b, mean, sd)
    ln = (th - tm) * (1 / ts) * tw + tb
    out = (tg.reshape(batch, tokens, outputs, 1) * ln.reshape(batch, tokens, 1, features)).sum((0, 1))
    return out, (h, g, w, b, mean, sd)


def test_a_weight_gradient_with_a_fused_norm_gets_rows():
    # the norm is the same for every output row: the tile pays it once per row vector, so it has room for a
    # full register file of rows (a count per output left 2 rows: 37 against 80 GFLOPS on 1024 x 64 x 256)
    out, _ = layer_norm_weight_gradient()
    opts = heuristic_opts(kernel_ast(out), RegisterFile(16, 32))
    upcast = {o.axis: o.amount for o in opts if o.op == "UPCAST"}
    assert upcast == {3: 32, 2: 8}, opts
    # a plain weight gradient (nothing recomputed in the step) keeps its tile
    g, h = realized(randf(16, 64, 256), randf(16, 64, 64))
    plain = (g.reshape(16, 64, 256, 1) * h.reshape(16, 64, 1, 64)).sum((0, 1))
    assert heuristic_opts(kernel_ast(plain), RegisterFile(16, 32)) == [Opt("UPCAST", 3, 32), Opt("UPCAST", 2, 8)]


def test_a_projection_with_a_fused_concatenated_input_gets_rows():
    # the input gradient through a concatenation (q, k, v): each row's gated value is shared across the row's
    # output features, so the tile is not held to the narrow rows of a body costed per output
    a, b, c, w = realized(randf(16, 64, 64), randf(16, 64, 64), randf(16, 64, 64), randf(192, 64))
    cat = a.cat(b, c, dim=2)
    out = (cat.reshape(16, 64, 192, 1) * w.reshape(1, 1, 192, 64)).sum(2)
    opts = heuristic_opts(kernel_ast(out), RegisterFile(16, 32))
    rows = [o.amount for o in opts if o.op == "UPCAST" and o.axis == 1]
    assert rows and rows[0] >= 8, opts


def test_weight_gradient_with_a_fused_norm_is_exact():
    # its tiles keep the reduction's order: bit for bit what the untiled kernel computes, and numpy within float32
    out, (h, g, w, b, mean, sd) = layer_norm_weight_gradient(4, 32, 64, 64)
    tiled = run_with_opts(out, heuristic_opts(kernel_ast(out), CPURenderer()))
    plain = run_with_opts(out, [])
    np.testing.assert_array_equal(tiled, plain)
    ln = (h - mean) * (1 / sd) * w + b
    want = np.einsum("bto,bti->oi", g.astype(np.float64), ln.astype(np.float64))
    np.testing.assert_allclose(tiled.reshape(64, 64), want, rtol=1e-4, atol=1e-4)


def test_a_fused_tile_reducing_across_rows_keeps_the_loop_to_the_tile():
    # gcc's cheap cost model vectorized the reduction over rows itself, gathering strided elements with permutes
    # of whole rows (35 ms against 0.5 ms): such kernels are marked so that only the tile is vectorized; kernels
    # whose reduction reads along it (x @ w.T with a relu) and plain matmuls are as before
    out, _ = layer_norm_weight_gradient()
    src = get_program(kernel_ast(out), RegisterFile(16, 32)).src
    assert re.search(r"^EMBER_STRIDED_TILE void r_", src, re.MULTILINE), src[:2000]
    a, b, w = realized(randf(64, 48), randf(48, 64), randf(64, 48))
    for t in (a @ b, (a.reshape(64, 1, 48) * w.reshape(1, 64, 48)).relu().sum(2)):
        assert "EMBER_STRIDED_TILE" not in get_program(kernel_ast(t), RegisterFile(16, 32)).src


@pytest.mark.skipif(not is_gcc(), reason="reads gcc's vectorizer report")
def test_gcc_leaves_a_strided_fused_tiles_reduction_loop_alone(tmp_path):
    out, _ = layer_norm_weight_gradient()
    src = get_program(kernel_ast(out), RegisterFile(16, 32)).src
    path = tmp_path / "k.c"
    path.write_text(src)
    cc = find_cc()
    assert cc is not None
    flags = [f for f in BASE_FLAGS if f != "-shared"]
    res = subprocess.run([*cc, *flags, "-fopenmp", "-fopt-info-vec-optimized", "-c", str(path), "-o",
                          str(tmp_path / "k.o")], capture_output=True, text=True, check=True)
    assert "loop vectorized" not in res.stderr, res.stderr
    assert "basic block part vectorized" in res.stderr, res.stderr
