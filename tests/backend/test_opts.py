"""Kernel optimizations: every opt alone and in combinations gives the NOOPT result (and numpy's), on every
device of the backend suite; invalid opts raise an error naming the opt, the axis and why.

Opts are applied through ``get_program(ast, renderer, opts=...)``; the kernel runs on the real buffers of the
schedule's last item, its inputs computed first. On CL (``DEV=CL``, slow builds) a small subset runs.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from ember import Device, Tensor
from ember.codegen import get_program
from ember.codegen.opts import Opt, OptError, apply_opts, kernel_shape
from ember.dtype import to_np_dtype
from ember.engine.realize import CompiledRunner, run_schedule
from ember.helpers import prod
from ember.renderer import Renderer

RNG = np.random.default_rng(7)


def randf(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, size=shape).astype(np.float32)


def last_kernel(out: Tensor):
    """Run everything ``out`` needs but its last kernel; that kernel's ScheduleItem."""
    sched = out.schedule()
    run_schedule(sched[:-1])
    return sched[-1]


def run_opts(si, device: str, opts: list[Opt], renderer: Renderer | None = None) -> np.ndarray:
    """Run ``si``'s kernel lowered with ``opts`` on its buffers; what it wrote."""
    spec = get_program(si.ast, renderer or Device[device].renderer, opts=opts)
    for b in si.bufs:
        b.allocate()
    CompiledRunner(device, spec)(list(si.bufs), wait=True)
    out = si.bufs[0]
    return np.frombuffer(out.as_bytes(), to_np_dtype(out.dtype)).copy()


def candidate_opts(si, renderer: Renderer) -> list[Opt]:
    """One opt of each kind that fits each axis of the kernel (the ones this codegen lowers)."""
    ks = kernel_shape(si.ast)
    full = ks.full_shape
    out: list[Opt] = []
    for axis, size in enumerate(full):
        if size == 1:
            continue
        small = next((f for f in (4, 3, 2) if size % f == 0), None)
        if axis in ks.reduce_axes:
            if small:
                out.append(Opt("UNROLL", axis, small))
            if all(d == 1 for i, d in enumerate(full) if i not in ks.reduce_axes) and renderer.parallel_threads > 1 \
                    and not renderer.has_local and size % 2 == 0:
                out.append(Opt("THREAD", axis, 2))
        else:
            if small:
                out.append(Opt("UPCAST", axis, small))
            if size % 8 and size > 4:
                out.append(Opt("PADTO", axis, 8))
            if renderer.has_local and small:
                out.append(Opt("LOCAL", axis, small))
    return out


def combos(cands: list[Opt], si, renderer: Renderer) -> list[list[Opt]]:
    """Each candidate alone, then all of them together (those that still fit, in a valid order)."""
    order = {"THREAD": 0, "PADTO": 1, "LOCAL": 2, "UPCAST": 3, "UNROLL": 4}
    together: list[Opt] = []
    for o in sorted(cands, key=lambda o: order[o.op]):
        try:
            apply_opts(si.ast, renderer, [*together, o])
            together.append(o)
        except OptError:
            pass
    singles = []
    for o in cands:
        try:
            apply_opts(si.ast, renderer, [o])
            singles.append([o])
        except OptError as e:
            # only LOCAL on an axis merged with others into one launch dimension is expected to be refused
            assert o.op == "LOCAL" and "shares its launch dimension" in str(e), e
    return singles + ([together] if len(together) > 1 else [])


class ThreadedPython(Renderer):
    """The PYTHON device's renderer, claiming several cores and work-groups: THREAD and LOCAL lowerings are
    then checked by the oracle interpreter too (it runs the loops as written and ignores launch sizes)."""

    def __init__(self, base: Renderer, has_local: bool):
        self.base = base
        self.parallel_threads = 1 if has_local else 4
        self.has_local = has_local
        self.local_max = (64, 64, 64) if has_local else None
        self.global_max = (1 << 20,) * 3 if has_local else None

    def render(self, name, uops):  # noqa: ANN001, ANN201
        return self.base.render(name, uops)


def cases(device: str) -> list[tuple[str, Tensor, np.ndarray]]:
    a, b, c = randf(24, 20), randf(24, 20), randf(20, 12)
    x, w = randf(2, 3, 6, 6), randf(4, 3, 3, 3)
    t = {k: Tensor(v, device=device).realize() for k, v in dict(a=a, b=b, c=c, x=x, w=w).items()}
    ct = Tensor(np.ascontiguousarray(c.T), device=device).realize()  # (12, 20)
    at = Tensor(np.ascontiguousarray(a.T), device=device).realize()  # (20, 24)
    out = [("elementwise", (t["a"] * t["b"]).exp() + 1, np.exp(a * b) + 1),
           ("sum axis 0", t["a"].sum(0), a.sum(0)), ("sum axis 1", t["a"].sum(1), a.sum(1)),
           ("max axis 0", t["a"].max(0), a.max(0)), ("max axis 1", t["a"].max(1), a.max(1)),
           ("full sum", t["a"].sum(), a.sum()), ("full max", t["a"].max(), a.max()),
           ("a@b", t["a"] @ t["c"], a @ c), ("a@b.T", t["a"] @ ct.T, a @ c),
           ("a.T@b", at.T @ t["c"], a @ c), ("a.T@b.T", at.T @ ct.T, a @ c)]
    try:
        import torch

        ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
        out.append(("conv2d", t["x"].conv2d(t["w"], padding=1), ref))
    except ImportError:
        pass
    return out


CASE_NAMES = ["elementwise", "sum axis 0", "sum axis 1", "max axis 0", "max axis 1", "full sum", "full max", "a@b",
              "a@b.T", "a.T@b", "a.T@b.T", "conv2d"]
#: kernels a slow-building device checks
SMALL_SET = ("elementwise", "sum axis 1", "a@b")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_opt_matches_noopt(device: str, name: str):
    if device == "CL" and name not in SMALL_SET:
        pytest.skip("CL builds are slow: a small set of kernels runs there")
    found = [c for c in cases(device) if c[0] == name]
    if not found:
        pytest.skip(f"{name}: its reference needs torch")
    _, out, ref = found[0]
    si = last_kernel(out)
    renderers = [Device[device].renderer]
    if device == "PYTHON":
        renderers += [ThreadedPython(Device[device].renderer, False), ThreadedPython(Device[device].renderer, True)]
    plain = run_opts(si, device, [])
    np.testing.assert_allclose(plain.reshape(np.shape(ref)), ref, rtol=1e-4, atol=1e-4)
    tried = 0
    for renderer in renderers:
        for opts in combos(candidate_opts(si, renderer), si, renderer):
            got = run_opts(si, device, opts, renderer)
            np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5, err_msg=f"{name} with {opts}")
            tried += 1
    assert tried >= 1


def test_upcast_and_local_launch_sizes():
    """LOCAL sets the work-group size of the launch dimension its axis maps to (innermost first)."""
    a, b = Tensor(randf(24, 20), device="PYTHON").realize(), Tensor(randf(20, 16), device="PYTHON").realize()
    si = (a @ b).schedule()[-1]
    grid = ThreadedPython(Device["PYTHON"].renderer, True)
    spec = get_program(si.ast, grid, opts=[Opt("LOCAL", 1, 8), Opt("LOCAL", 0, 4), Opt("UPCAST", 1, 2)])
    assert spec.local_size == (8, 4, 1)
    assert spec.global_size == (8, 24, 1)  # the upcast axis runs 16 / 2 loops


@pytest.mark.parametrize("opt,why", [
    (Opt("UPCAST", 1, 4), "applies to output axes"),    # axis 1 is reduced
    (Opt("UNROLL", 0, 2), "applies to reduce axes"),
    (Opt("UPCAST", 0, 5), "does not divide"),
    (Opt("UPCAST", 7, 2), "the kernel has 2 axes"),
    (Opt("LOCAL", 0, 2), "has no work-groups"),
    (Opt("GROUP", 1, 4), "has no local memory"),
    (Opt("TC", 1, 0), "has no tensor cores"),
    (Opt("THREAD", 1, 2), "needs a full reduction"),
    (Opt("SPLIT", 0, 2), "unknown optimization"),
    (Opt("UPCAST", 0, -1), "non-negative"),
])
def test_invalid_opts_raise(opt: Opt, why: str):
    a = Tensor(randf(24, 20), device="CPU").realize()
    si = a.sum(1).schedule()[-1]
    with pytest.raises(OptError, match=why) as e:
        get_program(si.ast, Device["CPU"].renderer, opts=[opt])
    if opt.op != "SPLIT":
        assert opt.op in str(e.value) and f"axis {opt.axis}" in str(e.value)


def test_opt_order_is_checked():
    a = Tensor(randf(24, 20), device="CPU").realize()
    si = (a + 1).schedule()[-1]
    with pytest.raises(OptError, match="PADTO must come before"):
        apply_opts(si.ast, Device["CPU"].renderer, [Opt("UPCAST", 1, 4), Opt("PADTO", 1, 8)])
    with pytest.raises(OptError, match="does not divide what is left"):
        apply_opts(si.ast, Device["CPU"].renderer, [Opt("UPCAST", 1, 4), Opt("UPCAST", 1, 4)])
    # splits of one axis multiply: 20 = 4 * 5
    plan = apply_opts(si.ast, Device["CPU"].renderer, [Opt("UPCAST", 1, 4), Opt("UPCAST", 1, 5)])
    assert plan.upcast == {1: 20}


@pytest.mark.parametrize("opts", [[], [Opt("THREAD", 0, 2)], [Opt("THREAD", 0, 2), Opt("UNROLL", 0, 4)]])
def test_vectorized_and_threaded_max_keep_nan(opts: list[Opt]):
    """A max split into vector lanes and across cores still returns nan when any element is nan."""
    x = randf(4096)
    x[1234] = np.nan
    t = Tensor(x, device="CPU").realize()
    si = last_kernel(t.max())
    assert np.isnan(run_opts(si, "CPU", opts)[0])
    rows = Tensor(x.reshape(64, 64), device="CPU").realize()
    got = rows.max(1).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x.reshape(64, 64).max(1)))


@pytest.mark.parametrize("unroll", [2, 4, 8])
def test_unrolled_row_max_vectorizes_and_keeps_nan(unroll: int):
    """A max along the contiguous axis unrolled k ways is vectorized with its k accumulators (one vector chain
    each); the heuristic picks such an unroll, and every row matches numpy exactly: a nan in any copy's lanes,
    in the last element, +-inf, all -inf."""
    from ember.codegen.heuristic import heuristic_opts

    x = randf(64, 256)
    x[1, 0] = x[2, 255] = x[3, 129] = x[4, 7] = np.nan
    x[5, 3], x[6, 200] = np.inf, -np.inf
    x[7] = -np.inf
    x[8, :128] = np.nan
    si = last_kernel(Tensor(x, device="CPU").realize().max(1))
    renderer = Device["CPU"].renderer
    opts = [Opt("UNROLL", 1, unroll)]
    src = get_program(si.ast, renderer, opts=opts).src
    assert src.count("reduction(ember_max_float:") == unroll, src
    np.testing.assert_array_equal(run_opts(si, "CPU", opts), x.max(1))
    heuristic = heuristic_opts(si.ast, renderer)
    assert [o.op for o in heuristic] == ["UNROLL"], heuristic
    np.testing.assert_array_equal(run_opts(si, "CPU", heuristic), x.max(1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_column_max_tile_is_a_vectorized_array_and_keeps_nan(dtype: type):
    """A column max's register tile is accumulator vectors updated by vector maxes (gcc vectorizes no tile of
    scalar max accumulators), the heuristic widens it past the register file, and every column matches numpy
    exactly: nan first, last or alone in a column, +-inf, a column of -inf, a nan in every row of a column."""
    from ember.codegen.heuristic import heuristic_opts

    x = RNG.uniform(-1, 1, size=(96, 256)).astype(dtype)
    x[0, 3] = x[95, 17] = x[40, 255] = x[7, 0] = np.nan
    x[:, 9] = np.nan
    x[5, 30], x[6, 31] = np.inf, -np.inf
    x[:, 32] = -np.inf
    si = last_kernel(Tensor(x, device="CPU").realize().max(0))
    renderer = Device["CPU"].renderer
    opts = heuristic_opts(si.ast, renderer)
    assert len(opts) == 1 and opts[0].op == "UPCAST" and opts[0].arg >= 64, opts
    for o in (opts, [Opt("UPCAST", 1, 16)], [Opt("UPCAST", 1, 256)]):
        src = get_program(si.ast, renderer, opts=o).src
        assert re.search(r"ember_(float|double)\d+ acc\d+ = ", src) and "m_ = (a_ > b_) | (a_ != a_)" in src, src
        np.testing.assert_array_equal(run_opts(si, "CPU", o), x.max(0))
    # a narrower tile: the same results
    np.testing.assert_array_equal(run_opts(si, "CPU", [Opt("UPCAST", 1, 8)]), x.max(0))
    # over two axes the accumulators stay scalar: the heuristic keeps such a tile within the registers
    y = RNG.uniform(-1, 1, size=(4, 8, 1024)).astype(dtype)
    both = last_kernel(Tensor(y, device="CPU").realize().max((0, 1)))
    wide = [o for o in heuristic_opts(both.ast, renderer) if o.op == "UPCAST" and o.arg > 128]
    assert not wide or "mtile" in get_program(both.ast, renderer).src, wide
    np.testing.assert_array_equal(run_opts(both, "CPU", heuristic_opts(both.ast, renderer)), y.max((0, 1)))
    t = Tensor(x, device="CPU").realize()
    fused = last_kernel((t * 2).max(0))
    assert "mtile" not in get_program(fused.ast, renderer, opts=[Opt("UPCAST", 1, 64)]).src
    np.testing.assert_array_equal(run_opts(fused, "CPU", [Opt("UPCAST", 1, 64)]), (x * 2).max(0))


def test_broadcast_axes_are_computed_once():
    """An output axis the stored value does not depend on (a reduction of a tensor expanded along it) is found,
    and the heuristic puts all of it in the register tile: the result still matches numpy."""
    from ember.codegen.access import broadcast_axes
    from ember.codegen.heuristic import heuristic_opts

    x = randf(6, 16)
    t = Tensor(x, device="CPU").realize()
    out = t.reshape(1, 6, 16).expand(8, 6, 16).sum(2)      # (8, 6): the same row 8 times
    si = last_kernel(out)
    assert broadcast_axes(si.ast) == [0]
    opts = heuristic_opts(si.ast, Device["CPU"].renderer)
    assert Opt("UPCAST", 0, 8) in opts
    got = run_opts(si, "CPU", opts).reshape(8, 6)
    np.testing.assert_allclose(got, np.broadcast_to(x.sum(1), (8, 6)), rtol=1e-5, atol=1e-6)
    # a plain matmul depends on every output axis
    assert broadcast_axes(last_kernel(Tensor(randf(8, 5)) @ Tensor(randf(5, 4))).ast) == []


def test_register_tile_rows_are_whole_vectors():
    """The heuristic's contiguous tile row is a multiple of the vector width or a power of two below it (a row
    of 28 floats is built from scalar inserts by gcc); a 3x3 convolution over 56 columns gets 8."""
    from ember.codegen.heuristic import _whole_vectors, heuristic_opts

    assert _whole_vectors(8, 16) and _whole_vectors(32, 16) and _whole_vectors(4, 8)
    assert not _whole_vectors(28, 16) and not _whole_vectors(12, 8)
    torch = pytest.importorskip("torch")
    x, w = randf(1, 8, 56, 56), randf(16, 8, 3, 3)
    t = Tensor(x, device="CPU").realize().conv2d(Tensor(w, device="CPU").realize(), padding=1)
    si = last_kernel(t)
    renderer = Device["CPU"].renderer
    opts = heuristic_opts(si.ast, renderer)
    row = [o for o in opts if o.axis == 4]
    assert row and _whole_vectors(row[0].arg, renderer.vector_floats), opts
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
    np.testing.assert_allclose(run_opts(si, "CPU", opts).reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


def test_weight_gradient_tile_rows_are_output_channels():
    """A large convolution's weight gradient, laid out (groups, out, kh, kw, in) from a channels-last copy of the
    input: its tile row runs along the input channels, and its rows go to the output channels (the loads the
    dims share cost the same, and 8 rows fit where a kernel row has 3)."""
    from ember.codegen.heuristic import heuristic_opts

    torch = pytest.importorskip("torch")
    x, w, up = randf(2, 16, 62, 62), randf(16, 16, 3, 3), randf(2, 16, 62, 62)
    tx = Tensor(x, device="CPU", requires_grad=True).realize()
    tw = Tensor(w, device="CPU", requires_grad=True).realize()
    (tx.conv2d(tw, padding=1) * Tensor(up, device="CPU")).sum().backward()
    assert tw.grad is not None
    si = last_kernel(tw.grad)
    renderer = Device["CPU"].renderer
    opts = heuristic_opts(si.ast, renderer)
    assert {o.axis for o in opts if o.op == "UPCAST"} == {1, 4}, opts
    assert all(o.arg >= 4 for o in opts), opts
    px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    (torch.nn.functional.conv2d(px, pw, padding=1) * torch.tensor(up)).sum().backward()
    assert pw.grad is not None
    ref = pw.grad.numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(run_opts(si, "CPU", opts).reshape(ref.shape), ref, rtol=1e-4, atol=1e-3)


def test_broadcast_axis_narrows_the_tile_row():
    """With a constant output gradient (``out.sum()``) the weight gradient is the same for every output channel:
    the tile takes the whole output-channel axis, narrowing its row of 64 input channels to fit."""
    from ember.codegen.access import broadcast_axes
    from ember.codegen.heuristic import heuristic_opts
    from ember.codegen.opts import MAX_UPCAST

    torch = pytest.importorskip("torch")
    x, w = randf(2, 64, 30, 30), randf(64, 64, 3, 3)
    tx = Tensor(x, device="CPU", requires_grad=True).realize()
    tw = Tensor(w, device="CPU", requires_grad=True).realize()
    tx.conv2d(tw, padding=1).sum().backward()
    assert tw.grad is not None
    si = last_kernel(tw.grad)
    assert broadcast_axes(si.ast) == [1]
    opts = heuristic_opts(si.ast, Device["CPU"].renderer)
    assert Opt("UPCAST", 1, 64) in opts and prod(o.arg for o in opts) <= MAX_UPCAST, opts
    pw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.conv2d(torch.tensor(x), pw, padding=1).sum().backward()
    assert pw.grad is not None
    ref = pw.grad.numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(run_opts(si, "CPU", opts).reshape(ref.shape), ref, rtol=1e-4, atol=1e-2)


def test_inner_reduce_loop_of_a_multi_axis_reduction_vectorizes():
    """A sum over several axes whose innermost runs with unit stride gets ``omp simd`` on that loop (its
    accumulators live outside the outer reduce loops); a short inner loop does not."""
    renderer = Device["CPU"].renderer
    x = randf(4, 8, 160)  # enough work for vector code (CPURenderer.simd_min_work)
    si = last_kernel(Tensor(x, device="CPU").realize().sum((0, 2)))
    src = get_program(si.ast, renderer, opts=[]).src
    assert "#pragma omp simd reduction(+:" in src
    np.testing.assert_allclose(run_opts(si, "CPU", []), x.sum((0, 2)), rtol=1e-5, atol=1e-4)  # sums may cancel to ~0
    short = last_kernel(Tensor(randf(4, 6, 3), device="CPU").realize().sum((0, 2)))
    assert "omp simd" not in get_program(short.ast, renderer, opts=[]).src


def test_large_column_sum_gets_a_wide_row():
    """A column sum of 2048^2 (past wide_sum_min_work) may take a row wider than the register file; whatever the
    heuristic picks, and the widest such row, match numpy."""
    from ember.codegen.heuristic import heuristic_opts
    from ember.codegen.opts import MAX_UPCAST

    x = randf(2048, 2048)
    renderer = Device["CPU"].renderer
    assert x.size >= renderer.wide_sum_min_work
    si = last_kernel(Tensor(x, device="CPU").realize().sum(0))
    opts = heuristic_opts(si.ast, renderer)
    assert len(opts) == 1 and opts[0].op == "UPCAST" and opts[0].arg <= MAX_UPCAST // 4, opts
    if renderer.parallel_threads <= 4:
        assert opts[0].arg == 256, opts
    for o in (opts, [Opt("UPCAST", opts[0].axis, MAX_UPCAST // 4)]):
        np.testing.assert_allclose(run_opts(si, "CPU", o), x.sum(0), rtol=1e-4, atol=1e-3)


def test_float_times_one_is_folded_exactly():
    """``x * 1.0`` is dropped from float kernels (a gradient's ones times a value) and gives x for nan, inf and
    -0.0 too."""
    from ember.dtype import dtypes
    from ember.ir.symbolic import simplify
    from ember.ir.uop import Ops, UOp

    v = UOp(Ops.DEFINE_VAR, dtypes.float32, (), ("v", 0, 1))
    for expr in (v * UOp.const(dtypes.float32, 1.0), UOp.const(dtypes.float32, 1.0) * v):
        assert simplify(expr) is v
    x = np.array([np.nan, -0.0, np.inf, -np.inf, 2.5], dtype=np.float32)
    got = (Tensor(x, device="CPU") * 1.0).numpy()
    np.testing.assert_array_equal(got, x)
    assert np.signbit(got[1])


def test_transposing_copy_gets_a_tile():
    """An elementwise kernel reading its input across the axis it stores along (a transposing copy, and a
    transposed view of a computed relu) gets a register tile of both axes on a loop target, so loads and stores
    both run along rows; one that reads as it stores gets none. Each matches numpy."""
    from ember.codegen.heuristic import heuristic_opts

    renderer = Device["CPU"].renderer
    x, w = randf(128, 256), randf(256, 192)
    assert x.size >= renderer.transpose_min_size
    tx, tw = Tensor(x, device="CPU").realize(), Tensor(w, device="CPU").realize()
    # the output's axis 0 runs along the input's rows, axis 1 is stored contiguously
    tile = [Opt("UPCAST", 0, renderer.transpose_tile[0]), Opt("UPCAST", 1, renderer.transpose_tile[1])]
    si = last_kernel(tx.T.contiguous())
    opts = heuristic_opts(si.ast, renderer)
    assert opts == tile, opts
    np.testing.assert_array_equal(run_opts(si, "CPU", opts).reshape(256, 128), x.T)
    si = last_kernel(((tx @ tw) + 1).relu().T.contiguous())
    opts = heuristic_opts(si.ast, renderer)
    assert opts == tile, opts
    np.testing.assert_allclose(run_opts(si, "CPU", opts).reshape(192, 128), np.maximum(x @ w + 1, 0).T, rtol=1e-5,
                               atol=1e-5)
    assert heuristic_opts(last_kernel((tx * 2).contiguous()).ast, renderer) == []
    assert heuristic_opts(last_kernel(tx[:, :1].expand(128, 256).contiguous()).ast, renderer) == []


def test_transposing_copy_of_a_costly_value_stays_untiled():
    """A random tensor's kernel reads its bits across the axis it stores along, and computes their hash (integer
    work) per element: tiled, gcc would build dozens of copies of that hash (1.3 s for 256 x 784), so the kernel
    keeps its plain loops."""
    from ember.codegen.access import elementwise_loads
    from ember.codegen.heuristic import heuristic_opts

    si = last_kernel(Tensor.randn(256, 784, device="CPU"))
    assert elementwise_loads(si.ast)[1] > 100
    assert heuristic_opts(si.ast, Device["CPU"].renderer) == []


def test_tile_step_ops_groups_a_steps_work_by_the_axes_it_moves_along():
    from ember.codegen.access import tile_step_ops

    # a weight gradient with a norm recomputed in the step: (4, 8, 32, 16), reduced over (0, 1); the norm's
    # loads and arithmetic move along the input features (3) only, the output gradient along the outputs (2)
    h, g = (Tensor(randf(4, 8, n), device="CPU").realize() for n in (16, 32))
    w, b = (Tensor(randf(16), device="CPU").realize() for _ in range(2))
    mean, sd = Tensor(randf(4, 8, 1), device="CPU").realize(), Tensor(randf(4, 8, 1) + 2, device="CPU").realize()
    norm = (h - mean) * (1 / sd) * w + b
    si = last_kernel((g.reshape(4, 8, 32, 1) * norm.reshape(4, 8, 1, 16)).sum((0, 1)))
    step = tile_step_ops(si.ast, (2, 3))
    # loads h, w, b (2 each) and sub, mul, mul, add along 3; mean and sd (2 each) and 1 / sd along neither; g along
    # 2; the product along both
    assert step == {frozenset({3}): 10, frozenset(): 5, frozenset({2}): 2, frozenset({2, 3}): 1}, step
    # a plain matmul: each operand along its own axis, only the product along both
    si = last_kernel((g.reshape(4, 8, 32, 1) * h.reshape(4, 8, 1, 16)).sum((0, 1)))
    assert tile_step_ops(si.ast, (2, 3)) == {frozenset({3}): 2, frozenset({2}): 2, frozenset({2, 3}): 1}
