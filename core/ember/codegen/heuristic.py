"""Pick a kernel's optimizations from its AST and the target's capabilities, without timing anything.

Everything here reads the kernel AST (never a lowering of it: the kernel is lowered once, with the opts
chosen; what it needs to know about the kernel's accesses comes from :mod:`ember.codegen.access`) and the
:class:`~ember.renderer.Renderer`'s capabilities and policy, never a device name.

Loop targets (CPU-style): register tiles sized from the register file (``vector_floats`` lanes per register,
``vector_registers`` registers): enough independent accumulators to cover the latency of the multiply-adds,
few enough that they stay in registers. A full reduction is split across the cores (THREAD) and unrolled
so a max or min has independent chains; so is a max along a contiguous axis (``row_max_unroll``). A column
sum, and a column max on a renderer with ``vector_max_tiles``, get a row wider than the register file. An
elementwise kernel that reads an input across the axis it stores along (a transposing copy) gets a square tile.
The sizes and thresholds are the renderer's codegen policy (:class:`~ember.renderer.Renderer`). Work-group
targets: smaller tiles, LOCAL sizes from the renderer's ``local_max``, a matmul on a tensor core where the
renderer declares one whose dtypes and tile fit (``TC=0``: never), and GROUP/GROUPTOP (a reduction shared by a
work-group through local memory) for reductions with too few outputs to fill the device, or that read across
rows; a reduction along a contiguous axis is unrolled so each work-item keeps independent chains.
"""
from __future__ import annotations

from ember.codegen.access import (
    broadcast_axes,
    elementwise_loads,
    full_shape,
    reduce_loads,
    tile_step_ops,
    view_strides,
    weighted_reduce_loads,
)
from ember.codegen.matmul import match_matmul
from ember.codegen.opts import MAX_UPCAST, KernelPlan, Opt, OptError, apply_opts, launch_dim, local_size
from ember.dtype import dtypes
from ember.helpers import ContextVar, prod
from ember.ir.uop import Ops, UOp
from ember.renderer import Renderer

#: ``TC=0`` keeps matmuls off tensor cores (the heuristic and BEAM): tinygrad's knob of the same name
USE_TC = ContextVar("TC", 1)


def _largest_factor(size: int, limit: int, smallest: int = 2) -> int:
    """The largest divisor of ``size`` in [smallest, limit], or 1."""
    for amt in range(min(limit, size), smallest - 1, -1):
        if size % amt == 0:
            return amt
    return 1


def _whole_vectors(width: int, lanes: int) -> bool:
    """Whether a row of ``width`` floats is whole vectors of one size: a multiple of the register's ``lanes``,
    or a power of two below it. gcc builds a row of another width (28 = 16 + 8 + 4) from scalar inserts and
    stack spills; a 3x3 convolution's 28-wide tile ran 3x slower than an 8-wide one with twice the rows."""
    return width % lanes == 0 or (width & (width - 1)) == 0


def _register_tile(ast: UOp, renderer: Renderer, lanes: int, acc_regs: int, skip: frozenset[int] = frozenset()
                   ) -> list[Opt]:
    """UPCASTs of output axes (but those in ``skip``) for a reduction: a tile of outputs per loop iteration
    sharing its loads."""
    shape, reduce_axes = full_shape(ast)
    out_shape = ast.src[0].arg.shape
    weighted, body_ops = weighted_reduce_loads(ast)
    loads = [s for s, _ in weighted]
    dims = [i for i, d in enumerate(out_shape) if d != 1 and i not in reduce_axes and i not in skip]
    strides = {d: {s.get(d, 0) for s in loads} for d in dims}
    max_tile = max(1, renderer.max_tile_ops // body_ops)
    if prod(shape) < renderer.small_kernel_work:
        max_tile = min(max_tile, renderer.small_kernel_tile)
    opts: list[Opt] = []
    # 1) the innermost dim some input reads contiguously: two vector registers of outputs per row of the tile,
    #    which the compiler turns into vector multiply-adds (matmul: a row of B times a broadcast element of A)
    for d in sorted(strides, reverse=True):
        if 1 in strides[d]:
            cap = min(2 * lanes, max_tile, out_shape[d])
            if any(e != d and 0 in strides[e] and out_shape[e] > 1 and _shared_step(ast, d, e) for e in strides):
                # the costly work is the same for every row: it is paid per row vector, not per output
                cap = min(2 * lanes, out_shape[d])
            elif any(e != d and 0 in strides[e] and out_shape[e] > 1 for e in strides):
                # a costly body (a fused softmax gradient recomputed per step) leaves room for few outputs: keep
                # room for two rows, which share the body's work; one 32-wide row ran 4x slower than 16 x 2
                cap = min(cap, max(4, max_tile // 2))
            amt = max([a for a in range(4, cap + 1, 4) if out_shape[d] % a == 0 and _whole_vectors(a, lanes)],
                      default=1)
            if amt > 1:
                opts.append(Opt("UPCAST", d, amt))
            break
    if opts:
        # 2) rows of the tile: another dim that some input does not depend on (its loads are reused across the row)
        vecs_per_row = -(-opts[0].arg // lanes)
        # the dim along which the costliest loads (gated, through several views) stay the same: they are shared
        # by the whole row (a convolution: the padded input is shared across output channels)
        rows = [d for d in sorted(strides, reverse=True) if d != opts[0].axis and 0 in strides[d]]
        limit = min(acc_regs // vecs_per_row, max_tile // opts[0].arg)
        if rows:
            # between dims that share equally, the one with room for the most rows (a weight gradient laid out
            # (out channels, kh, kw, in channels): 8 output channels, not the 3 of a kernel row)
            d = max(rows, key=lambda d: (sum(c for s, c in weighted if s.get(d, 0) == 0),
                                         _largest_factor(out_shape[d], limit)))
            amt = _largest_factor(out_shape[d], limit)
            v, width = opts[0].axis, opts[0].arg
            if step := _shared_step(ast, v, d):
                # most of a step's work is shared along one of the tile's axes (an input recomputed through a fused
                # layer norm: the same for every output row of a weight gradient, for every output feature of a
                # projection): the tile computes each value once per position along the axes it moves along, so
                # it has room for more rows than a per-output count gives
                def cost(r: int) -> int:
                    return sum(c * (width if v in k else 1) * (r if d in k else 1) for k, c in step.items())
                most = acc_regs // vecs_per_row
                if prod(shape) < renderer.small_kernel_work:
                    most = min(most, renderer.small_kernel_tile // width)
                amt = max([r for r in range(1, most + 1) if out_shape[d] % r == 0 and cost(r) <= renderer.max_tile_ops],
                          default=1)
            if amt > 1:
                opts.append(Opt("UPCAST", d, amt))
        if len(opts) == 1:
            # no loads to share across rows (a column sum or max): spend the registers on a wider row, so each
            # reduction step reads a longer contiguous run
            d = opts[0].axis
            limit = acc_regs // 2 * lanes
            if {n.arg[0] for n in ast.toposort() if n.op is Ops.REDUCE_AXIS} == {Ops.ADD} and \
                    prod(shape) >= renderer.wide_sum_min_work:
                # a large column sum streams memory: a row of 256 (past the register file; gcc keeps the sums in
                # vectors it spills) took 0.7x the CPU time of 128 on a 4096^2 column mean (512: 0.55x, but a
                # 1.3 s first compile against 0.4 s); every core still gets two tiles. A max's row stays within
                # the registers unless the renderer vectorizes it
                limit = max(limit, min(MAX_UPCAST // 4, out_shape[d] // (2 * max(1, renderer.parallel_threads))))
            elif len(reduce_axes) == 1 and _plain_float_max(ast) and renderer.vector_max_tiles:
                # a column max of a buffer that the renderer keeps in an array and vectorizes (on one core, 4096^2:
                # a 128-wide row 3.4 ms, 512 2.35 ms, 1024 2.2 ms): every core still gets two tiles. Over several
                # axes its accumulators live outside the outer loop, where the renderer leaves them scalar
                limit = max(limit, min(MAX_UPCAST // 2, out_shape[d] // (2 * max(1, renderer.parallel_threads))))
            wide = max([a for a in range(4, min(limit, max_tile, out_shape[d]) + 1, 4)
                        if out_shape[d] % a == 0 and _whole_vectors(a, lanes)], default=1)
            if wide > opts[0].arg:
                opts[0] = Opt("UPCAST", d, wide)
        return opts
    # 3) nothing contiguous along the outputs (x @ w.T: both inputs run along the reduce axis, which the renderer
    #    vectorizes as a reduction, one vector accumulator per output): a square-ish tile of outputs shares the loads
    budget = min(acc_regs * 2 // 3, max_tile)
    per_axis = renderer.small_shared_tile if prod(shape) < renderer.small_kernel_work else 4
    for d in sorted(strides, reverse=True):
        if len(opts) < 2 and 0 in strides[d]:
            limit = budget // prod(o.arg for o in opts) if opts else max(2, int(budget ** 0.5))
            amt = _largest_factor(out_shape[d], min(limit, per_axis, out_shape[d] // 2))
            if amt > 1:
                opts.append(Opt("UPCAST", d, amt))
    return opts


def _shared_step(ast: UOp, v: int, r: int) -> dict[frozenset[int], int] | None:
    """A reduction step's operations grouped by which of the tile axes ``v`` (the vector row) and ``r`` (the rows)
    they move along (see :func:`ember.codegen.access.tile_step_ops`), where most of them do not move along one of
    the two (so a tile pays them per row, or per row vector, not per output); else None."""
    step = tile_step_ops(ast, (v, r))
    total = sum(step.values())
    if total and 2 * max(sum(c for k, c in step.items() if a not in k) for a in (v, r)) > total:
        return step
    return None


def _plain_float_max(ast: UOp) -> bool:
    """Whether the kernel's one reduction is a float max straight of an unmasked load (nothing computed on
    the loaded values): what a renderer's ``vector_max_tiles`` covers."""
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1 or reduces[0].arg[0] is not Ops.MAX or reduces[0].dtype not in (dtypes.float32,
                                                                                         dtypes.float64):
        return False
    src = reduces[0].src[0]
    return src.op is Ops.VIEW and src.src[0].op is Ops.LOAD and all(v.mask is None for v in src.arg.views)


def _full_reduction(ast: UOp, renderer: Renderer) -> list[Opt]:
    """A reduction to one value: split across the cores, and unrolled so each core keeps independent chains."""
    shape, reduce_axes = full_shape(ast)
    if not reduce_axes or prod(shape) < renderer.thread_min_work:
        return []
    ops = {n.arg[0] for n in ast.toposort() if n.op is Ops.REDUCE_AXIS}
    axis = max(reduce_axes, key=lambda a: shape[a])
    opts: list[Opt] = []
    if renderer.parallel_threads > 1 and len(ops) == 1 and ops <= {Ops.ADD, Ops.MAX, Ops.MUL}:
        n = _largest_factor(shape[axis], renderer.parallel_threads)
        if n > 1:
            opts.append(Opt("THREAD", axis, n))
    left = shape[axis] // (opts[0].arg if opts else 1)
    if not ops <= {Ops.ADD, Ops.MAX}:  # float sums and maxes are vectorized by the renderer; others need
        # independent accumulators
        u = _largest_factor(left, 8, 4)
        if u > 1:
            opts.append(Opt("UNROLL", axis, u))
    return opts


def tensor_core_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """``[TC]`` on the first of the renderer's tensor cores that computes the kernel's matmul, or ``[]``.

    A tensor core fits when the matmul's dtypes are its own (see :mod:`ember.codegen.tc`) and M, N and K are
    multiples of its tile; TC is applied alone (no LOCAL or UPCAST around it, no padding to a multiple).
    ``TC=0`` turns it off."""
    if not USE_TC or not renderer.tensor_cores:
        return []
    for i, tc in enumerate(renderer.tensor_cores):
        mm = match_matmul(ast, tc)
        if isinstance(mm, str):
            continue
        opt = Opt("TC", mm.k, i)
        try:
            apply_opts(ast, renderer, [opt])  # the tile fits M, N and K, and the launch limits
        except OptError:
            continue
        return [opt]
    return []


def _workgroup_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """Work-group targets: a matmul on tensor cores where the renderer declares one that fits; otherwise a
    small register tile for reductions, then LOCAL sizes within ``local_max``."""
    if tc := tensor_core_opts(ast, renderer):
        return tc
    shape, reduce_axes = full_shape(ast)
    out_shape = ast.src[0].arg.shape
    opts: list[Opt] = []
    if reduce_axes and prod(d for i, d in enumerate(out_shape) if i not in reduce_axes) >= 64:
        opts = _register_tile(ast, renderer, 4, 16)
        opts = [Opt(o.op, o.axis, _largest_factor(out_shape[o.axis], 4)) for o in opts]
        opts = [o for o in opts if o.arg > 1]
    if renderer.local_max is None:
        return opts
    upcast = {o.axis: o.arg for o in opts}
    # LOCALs are applied before the UPCASTs: an axis must keep its launch dimension through both
    before, after = KernelPlan(shape, reduce_axes), KernelPlan(shape, reduce_axes, upcast=dict(upcast))
    budget = min(256, prod(renderer.local_max))
    dims = sorted((i for i, d in enumerate(out_shape) if i not in reduce_axes and d // upcast.get(i, 1) > 1),
                  reverse=True)
    locals_: list[Opt] = []
    for d in dims:
        dim = launch_dim(after, d, renderer)
        if dim is None or dim != launch_dim(before, d, renderer) or budget < 2:
            continue
        want = 16 if not locals_ else budget
        n = _largest_factor(out_shape[d] // upcast.get(d, 1), min(want, budget, renderer.local_max[dim]))
        if n > 1:
            locals_.append(Opt("LOCAL", d, n))
            budget //= n
    # whatever the shape, never hand the lowerer a list it refuses: drop the group, the LOCALs, then everything
    tries = [locals_ + opts, opts]
    tries = [t + g for t in tries for g in _group_opts(ast, renderer, t)] + tries
    for candidate in tries:
        try:
            local_size(apply_opts(ast, renderer, candidate), renderer)
            return candidate
        except OptError:
            continue
    return []


def _group_opts(ast: UOp, renderer: Renderer, base: list[Opt]) -> list[list[Opt]]:
    """What to add to ``base`` for a work-group target's reduction, best first (each may still be refused).

    Few outputs (a full sum, a column sum of a tall matrix): the longest reduce axis is shared by a group of
    work-items, interleaved (GROUP) when the loads run along it so neighbours read neighbours, else in blocks
    (GROUPTOP), and unrolled. A reduction across rows with more outputs gets a small GROUPTOP. Otherwise a
    reduction along a contiguous axis is unrolled, for independent chains (a max has no vectorizing combiner
    on these targets)."""
    shape, reduce_axes = full_shape(ast)
    if not reduce_axes:
        return []
    outputs = prod(d for i, d in enumerate(shape) if i not in reduce_axes)
    axis = max(reduce_axes, key=lambda a: shape[a])
    size = shape[axis]
    contiguous = any(s.get(axis) == 1 for s in reduce_loads(ast)[0])
    unroll = [] if any(o.op == "UNROLL" for o in base) else [Opt("UNROLL", axis, 4)]
    out: list[list[Opt]] = []
    items = prod(o.arg for o in base if o.op == "LOCAL")
    most = renderer.workgroup_max_items
    room = min(most // items, (renderer.local_max or (most,))[0])
    if renderer.has_shared and renderer.shared_max > 0 and size >= renderer.group_min_reduce and room >= 2:
        if outputs < renderer.group_max_outputs:
            n = _largest_factor(size, min(64, room))
            op = "GROUP" if contiguous else "GROUPTOP"
            if n > 1:
                grouped = [Opt(op, axis, n)]
                if size // n % 4 == 0 and size // n >= 16:
                    out.append(grouped + unroll)
                out.append(grouped)
        elif not contiguous and outputs <= renderer.group_across_outputs:
            n = _largest_factor(size, min(16, room))
            if n > 1:
                out.append([Opt("GROUPTOP", axis, n)])
    if contiguous and size % 4 == 0 and size >= 16 and unroll:
        out.append(unroll)
    return out


def _transpose_tile(ast: UOp, renderer: Renderer) -> list[Opt]:
    """An elementwise kernel that reads some input across the axis it writes along (a transposing copy): a tile of
    both axes, so each loaded row and each stored row is a run of neighbours. Eight along the loaded rows (half a
    cache line) is what counts: a 1024^2 transposing copy on one core took 3.1 ms untiled, 1.0 ms as 4 x 8, 0.45
    ms as 8 x 4 (gcc: 0.11 s), 0.52 ms as 8 x 8 (0.16 s), 0.48 ms as 16 x 16 (0.41 s). Two along the stored rows
    are as fast as four (a relu of a transposed view on two cores, 8 x 2 against 8 x 4: 784 x 256 77 and 76 us,
    512^2 105 and 109 us, 1024^2 347 and 348 us; untiled 115, 200 and 1650 us) and build in 20-30% less gcc
    time (the two transposing copies of an MLP's first step: 90 ms against 120)."""
    out_shape = ast.src[0].arg.shape
    if prod(out_shape) < renderer.transpose_min_size or not all(isinstance(d, int) for d in out_shape):
        return []
    stored = view_strides(ast.src[0], len(out_shape))
    along = [d for d, s in stored.items() if s == 1 and out_shape[d] > 1]
    if len(along) != 1:
        return []
    s_axis = along[0]
    loads, body_ops = elementwise_loads(ast)
    # an input read contiguously along another axis, moving along the stored axis too (not a broadcast row)
    across = sorted({d for st in loads for d, s in st.items()
                     if s == 1 and d != s_axis and out_shape[d] > 1 and st.get(s_axis, 0) not in (0, 1)})
    if not across:
        return []
    l_axis = across[-1]
    rows, cols = renderer.transpose_tile
    while cols > 2 and rows * cols * body_ops > renderer.max_tile_ops:
        cols //= 2
    amts = (_largest_factor(out_shape[l_axis], rows, 4), _largest_factor(out_shape[s_axis], cols))
    if any(a == 1 for a in amts) or amts[0] * amts[1] * body_ops > renderer.max_tile_ops:
        return []
    return [Opt("UPCAST", l_axis, amts[0]), Opt("UPCAST", s_axis, amts[1])]


def heuristic_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """Pick optimizations for ``ast`` on ``renderer`` (no timing; BEAM can do better)."""
    if not any(n.op is Ops.REDUCE_AXIS for n in ast.toposort()) and not renderer.has_local:
        return _transpose_tile(ast, renderer)
    if renderer.has_local:
        return _workgroup_opts(ast, renderer)
    out_shape = ast.src[0].arg.shape
    if prod(out_shape) == 1:
        return _full_reduction(ast, renderer)
    # three quarters of the registers hold accumulators; the rest carry the loads
    acc_regs = max(2, renderer.vector_registers * 3 // 4)
    same = broadcast_axes(ast)
    shape, reduce_axes = full_shape(ast)
    tiny = prod(shape) < renderer.tiny_kernel_work
    opts = [] if tiny else _register_tile(ast, renderer, renderer.vector_floats, acc_regs, frozenset(same))
    # outputs that differ only along an axis the value does not depend on are computed once per tile: a whole
    # such axis in the tile divides the kernel's work by its size
    for axis in same:
        tile = prod(o.arg for o in opts)
        if tile * out_shape[axis] > MAX_UPCAST and opts and opts[0].op == "UPCAST":
            # a narrower row leaves room for the whole axis: one vector row computed once for all of it beats a
            # wide row computed again per part of it (a weight gradient from a constant output gradient, laid
            # out (out, kh, kw, in): a 64-wide row of input channels took 4x the CPU time of 16 x all 64 outputs)
            room = MAX_UPCAST // (out_shape[axis] * (tile // opts[0].arg))
            row = max([a for a in range(4, room + 1, 4) if out_shape[opts[0].axis] % a == 0
                       and _whole_vectors(a, renderer.vector_floats)], default=0)
            if row:
                opts[0] = Opt("UPCAST", opts[0].axis, row)
                tile = prod(o.arg for o in opts)
        if tile * out_shape[axis] <= MAX_UPCAST:
            opts.append(Opt("UPCAST", axis, out_shape[axis]))
    if not opts and not tiny:
        # a row reduction with nothing to share between outputs (max/sum along the contiguous axis): unroll
        # the reduction so non-sum reductions get independent chains (a float sum's one vector chain keeps up
        # with memory; a max's does not)
        ops = {n.arg[0] for n in ast.toposort() if n.op is Ops.REDUCE_AXIS}
        if len(reduce_axes) == 1 and not ops <= {Ops.ADD, Ops.MAX}:
            u = _largest_factor(shape[reduce_axes[0]], 8, 4)
            if u > 1:
                opts.append(Opt("UNROLL", reduce_axes[0], u))
        elif len(reduce_axes) == 1 and ops == {Ops.MAX}:
            size = shape[reduce_axes[0]]
            if size % renderer.row_max_unroll == 0 and size >= 16 * renderer.row_max_unroll:
                opts.append(Opt("UNROLL", reduce_axes[0], renderer.row_max_unroll))
    return opts
