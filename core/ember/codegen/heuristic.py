"""Pick a kernel's optimizations from its AST and the target's capabilities, without timing anything.

Everything here reads the kernel AST (never a lowering of it: the kernel is lowered once, with the opts
chosen) and the :class:`~ember.renderer.Renderer`'s capabilities, never a device name.

Loop targets (CPU-style): register tiles sized from the register file (``vector_floats`` lanes per register,
``vector_registers`` registers): enough independent accumulators to cover the latency of the multiply-adds,
few enough that they stay in registers. A full reduction is split across the cores (THREAD) and unrolled
so a max or min has independent chains; so is a max along a contiguous axis (ROW_MAX_UNROLL). A column sum,
and a column max on a renderer with ``vector_max_tiles``, get a row wider than the register file. An elementwise
kernel that reads an input across the axis it stores along (a transposing copy) gets a square tile. Work-group
targets: smaller tiles, LOCAL sizes from the
renderer's ``local_max``, a matmul on a tensor core where the renderer declares one whose dtypes and tile fit
(``TC=0``: never), and GROUP/GROUPTOP (a reduction shared by a work-group through local memory) for
reductions with too few outputs to fill the device, or that read across rows; a reduction along a contiguous
axis is unrolled so each work-item keeps independent chains.
"""
from __future__ import annotations

from ember.codegen.lowerer import ast_shape
from ember.codegen.opts import MAX_UPCAST, Opt, full_shape, kernel_shape
from ember.helpers import ContextVar, prod
from ember.ir.symbolic import simplify, split_terms, term_coeff
from ember.ir.uop import GroupOp, Ops, UOp
from ember.renderer import Renderer

#: most operations in the unrolled body of a tiled reduction loop (bounds the C source and its compile time:
#: a float32 matmul, 5 per output, gets a 256-output tile; a padded convolution a smaller one)
MAX_TILE_OPS = 1536
#: a reduction kernel with fewer steps than this (its full shape's size) gets at most SMALL_KERNEL_TILE outputs per
#: tile: it runs for tens of microseconds whatever its tile, while a wide tile's unrolled body costs the C compiler
#: 100-200 ms more (an MLP's 10 x 512 x 256 weight gradient: 160 outputs 18 us and 220 ms of gcc, 64 outputs
#: 29 us and 110 ms; its 256 x 512 x 10 input gradient: 66 us either way, 180 -> 110 ms)
SMALL_KERNEL_WORK = 1 << 22
SMALL_KERNEL_TILE = 64
#: a reduction kernel with fewer steps than this gets no register tile or unrolling: it runs for about a microsecond
#: either way, and a tile costs the C compiler ~10 ms (an MLP's 256 x 10 softmax gradient sum: 1 us, 41 -> 32 ms of
#: gcc). An axis its value does not depend on is still computed once (that divides the work)
TINY_KERNEL_WORK = 1 << 13
#: the most outputs per axis in the square-ish tile of a small product along the reduce axis (``x @ w.T``), where
#: nothing runs contiguously along the outputs: an MLP's 256 x 10 x 512 logits ran in 31 us with 2 x 2 outputs
#: against 45 us with 2 x 4, whose eight vectorized partial sums cost gcc 15 ms more
SMALL_SHARED_TILE = 2
#: a full reduction smaller than this runs on one core
THREAD_MIN_WORK = 1 << 17
#: work-group targets: a reduction with fewer outputs than this leaves the device idle unless its work-items
#: share each reduction (GROUP); one reading across rows (a column sum) is grouped up to GROUP_ACROSS_OUTPUTS
GROUP_MAX_OUTPUTS = 1024
GROUP_ACROSS_OUTPUTS = 16384
#: the shortest reduce axis worth grouping, and the most work-items one work-group gets from the heuristic
GROUP_MIN_REDUCE = 256
WORKGROUP_MAX_ITEMS = 256
#: a column sum over at least this many elements gets a row wider than the register file
WIDE_SUM_MIN_WORK = 1 << 22
#: ``TC=0`` keeps matmuls off tensor cores (the heuristic and BEAM): tinygrad's knob of the same name
USE_TC = ContextVar("TC", 1)
#: a max along a contiguous axis is unrolled this much: the renderer turns each copy's accumulator into a vector
#: chain of its own (one chain is bound by its compare-and-blend latency). A 4096^2 row max on one core (AVX-512,
#: CPU time): 2.73 ms with one chain, 2.00 ms with 2, 2.08 ms with 4 or 8 (numpy: 2.5 ms)
ROW_MAX_UNROLL = 2
#: an elementwise kernel (loop targets) with at least this many outputs that reads an input across the axis it
#: stores along gets a register tile of TRANSPOSE_TILE (along the input's rows, along the stored rows) outputs
#: (see :func:`_transpose_tile`)
TRANSPOSE_MIN_SIZE = 1 << 14
TRANSPOSE_TILE = (8, 2)


def _view_strides(view: UOp, rank: int) -> dict[int, int]:
    """How far the flat index of ``view`` (over the kernel's full shape) moves per step of each dim."""
    st = view.arg
    if len(st.views) == 1 and len(st.views[0].strides) == rank:
        return {d: int(s) for d, s in enumerate(st.views[0].strides)}
    from ember.dtype import dtypes

    vars_ = [UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"d{i}", 0, max(d - 1, 0))) for i, d in enumerate(st.shape)]
    idx, _ = st.to_index(vars_, dtypes.int32)
    coeffs: dict[int, int] = {}
    for t in split_terms(simplify(idx)):
        var, c = term_coeff(t)
        if var is not None and var in vars_:
            coeffs[vars_.index(var)] = c
        elif var is not None:  # a dim used through / or %: call it non-contiguous
            for i, v in enumerate(vars_):
                if any(n is v for n in var.toposort()):
                    coeffs.setdefault(i, -1)
    return coeffs


def reduce_loads(ast: UOp) -> tuple[list[dict[int, int]], int]:
    """The stride maps of the loads inside the kernel's reductions and the per-step cost of one output
    (see :func:`weighted_reduce_loads`)."""
    loads, ops = weighted_reduce_loads(ast)
    return [s for s, _ in loads], ops


def weighted_reduce_loads(ast: UOp) -> tuple[list[tuple[dict[int, int], int]], int]:
    """The stride maps of the loads inside the kernel's reductions (over the full shape) with what each load
    costs, and an estimate of the operations one output costs per reduction step (loads, index math, gates,
    ALU): what a tile copy adds to the innermost loop's body.

    The views are read directly; only when a view reshapes a computed value (a view of an expression, as in
    a convolution's input gradient) is the reduction's body indexed symbolically to find its loads' strides."""
    ks = kernel_shape(ast)
    reduce_axes = ks.reduce_axes
    # the reduction input's axes -> the kernel's axes
    to_full = {s: f for f, s in ks.reduce_src.items()} | {s: o for o, s in ks.out_to_src.items()}
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE_AXIS]
    if not reduces or not reduce_axes:
        return [], 1
    # the kernel's axes are those of its first reduction's input; a second reduction over another shape
    # (fused beside it, e.g. a mean over one view and a min over another) has no such mapping: left out
    memo: dict[UOp, tuple[int, ...]] = {}
    first = ast_shape(reduces[0].src[0], memo)
    reduces = [r for r in reduces if ast_shape(r.src[0], memo) == first]
    rank = len(first)
    out: list[tuple[dict[int, int], int]] = []
    ops = 0
    seen: set[UOp] = set()

    def walk(n: UOp) -> None:
        nonlocal ops
        if n in seen:
            return
        seen.add(n)
        if n.op is Ops.VIEW:
            if n.src[0].op is not Ops.LOAD and n.src[0].op is not Ops.CONST:
                raise _NestedView
            if n.src[0].op is Ops.LOAD:
                strides = _view_strides(n, rank)
                masked = any(v.mask is not None for v in n.arg.views)
                # a stack of views costs index math only where its index keeps a / or % (sliding windows over a
                # buffer of their own simplify to plain strides)
                indexed = len(n.arg.views) > 1 and any(c == -1 for c in strides.values())
                cost = 2 + 3 * masked + indexed * 2
                out.append(({to_full[d]: c for d, c in strides.items() if d in to_full}, cost))
                ops += cost
            return
        if n.op in GroupOp.ALU or n.op is Ops.CAST:
            ops += 1
        for s in n.src:
            walk(s)

    try:
        for red in reduces:
            walk(red.src[0])
    except _NestedView:
        out, ops = _indexed_loads(reduces, rank)
        out = [({to_full[d]: c for d, c in st.items() if d in to_full}, cost) for st, cost in out]
    walk = None  # type: ignore[assignment]  # a recursive closure holds itself: unbound, it goes with refcounts
    # loads that no reduction loop moves (a bias, a row's max) are read once per output: they say nothing
    # about how a tile would share work
    moving = [(s, c) for s, c in out if any(s.get(a, 0) != 0 for a in reduce_axes)]
    return moving, max(1, ops)


class _NestedView(Exception):
    """A view of a computed value inside a reduction: its loads' strides need the index expressions."""


def _load_strides(index: UOp, vars_: tuple[UOp, ...]) -> dict[int, int]:
    """The stride of each loop variable in a load's ``index``: its coefficient where it appears as a plain term,
    -1 where it appears only inside a ``//`` or ``%`` (no fixed stride)."""
    strides: dict[int, int] = {}
    for t in split_terms(index):
        var, c = term_coeff(t)
        if var is not None and var in vars_:
            strides[vars_.index(var)] = c
        elif var is not None:
            for sub in var.toposort():
                if sub in vars_:
                    strides.setdefault(vars_.index(sub), -1)
    return strides

def _indexed_loads(reduces: list[UOp], rank: int) -> tuple[list[tuple[dict[int, int], int]], int]:
    """Index the reductions' bodies with one variable per axis of their input, and read each load's strides
    (per axis) from its index expression; an axis used through / or % counts as non-contiguous (-1)."""
    from ember.codegen.lowerer import LoweringContext, _lower
    from ember.dtype import dtypes

    red_shape = ast_shape(reduces[0].src[0], {})
    ctx = LoweringContext(dtypes.int32)
    vars_ = tuple(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"a{i}", 0, max(d - 1, 0))) for i, d in enumerate(red_shape))
    true = UOp.const(dtypes.bool, True)
    out: list[tuple[dict[int, int], int]] = []
    ops = 0
    for red in reduces:
        body = _lower(ctx, red.src[0], vars_, true)
        for n in body.toposort():
            if n.op is Ops.LOAD:
                cost = 2 + 3 * (len(n.src) > 2)
                out.append((_load_strides(n.src[1], vars_), cost))
                ops += cost
            elif n.op in GroupOp.ALU and not (isinstance(n.dtype, type(dtypes.int32)) and n.dtype.kind in "iub"):
                ops += 1
    del rank
    return out, ops


def broadcast_axes(ast: UOp) -> list[int]:
    """The output axes of a reduction kernel that its stored values do not depend on (an output gradient that
    is a constant, broadcast over output channels): every output along such an axis is the same value.

    The values are lowered once with one variable per output axis; an axis whose variable appears nowhere in
    them (no index, no gate) is one. Kernels whose reduction input is not indexed like the output are left
    alone (an empty list)."""
    from ember.codegen.lowerer import LoweringContext, _lower
    from ember.dtype import dtypes

    ks = kernel_shape(ast)
    out_shape = ast.src[0].arg.shape
    if not ks.reduce_axes or len(ks.full_shape) != len(out_shape):
        return []
    # only an axis no load of the reductions moves along can be one: most kernels stop here, unlowered
    loads, _ = reduce_loads(ast)
    if not any(d > 1 and i not in ks.reduce_axes and all(s.get(i, 0) == 0 for s in loads)
               for i, d in enumerate(out_shape)):
        return []
    ctx = LoweringContext(dtypes.int32)
    vars_ = tuple(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"o{i}", 0, d - 1)) if d > 1 and i not in ks.reduce_axes
                  else UOp.const(dtypes.int32, 0) for i, d in enumerate(out_shape))
    true = UOp.const(dtypes.bool, True)
    used: set[UOp] = set()
    for store in ast.src:
        used.update(n for n in _lower(ctx, store.src[1], vars_, true).toposort() if n.op is Ops.DEFINE_VAR)
    return [i for i, v in enumerate(vars_) if v.op is Ops.DEFINE_VAR and v not in used]


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
    max_tile = max(1, MAX_TILE_OPS // body_ops)
    if prod(shape) < SMALL_KERNEL_WORK:
        max_tile = min(max_tile, SMALL_KERNEL_TILE)
    opts: list[Opt] = []
    # 1) the innermost dim some input reads contiguously: two vector registers of outputs per row of the tile,
    #    which the compiler turns into vector multiply-adds (matmul: a row of B times a broadcast element of A)
    for d in sorted(strides, reverse=True):
        if 1 in strides[d]:
            cap = min(2 * lanes, max_tile, out_shape[d])
            if any(e != d and 0 in strides[e] and out_shape[e] > 1 for e in strides):
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
            if amt > 1:
                opts.append(Opt("UPCAST", d, amt))
        if len(opts) == 1:
            # no loads to share across rows (a column sum or max): spend the registers on a wider row, so each
            # reduction step reads a longer contiguous run
            d = opts[0].axis
            limit = acc_regs // 2 * lanes
            if {n.arg[0] for n in ast.toposort() if n.op is Ops.REDUCE_AXIS} == {Ops.ADD} and \
                    prod(shape) >= WIDE_SUM_MIN_WORK:
                # a large column sum streams memory: a row of 256 (past the register file; gcc keeps the sums in
                # vectors it spills) took 0.7x the CPU time of 128 on a 4096^2 column mean (512: 0.55x, but a
                # 1.3 s first compile against 0.4 s); every core still gets two tiles. A max's row stays within
                # the registers unless the renderer vectorizes it
                limit = max(limit, min(MAX_UPCAST // 4, out_shape[d] // (2 * max(1, renderer.parallel_threads))))
            elif len(reduce_axes) == 1 and _plain_float_max(ast) and getattr(renderer, "vector_max_tiles", False):
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
    per_axis = SMALL_SHARED_TILE if prod(shape) < SMALL_KERNEL_WORK else 4
    for d in sorted(strides, reverse=True):
        if len(opts) < 2 and 0 in strides[d]:
            limit = budget // prod(o.arg for o in opts) if opts else max(2, int(budget ** 0.5))
            amt = _largest_factor(out_shape[d], min(limit, per_axis, out_shape[d] // 2))
            if amt > 1:
                opts.append(Opt("UPCAST", d, amt))
    return opts


def _plain_float_max(ast: UOp) -> bool:
    """Whether the kernel's one reduction is a float max straight of an unmasked load (nothing computed on
    the loaded values): what a renderer's ``vector_max_tiles`` covers."""
    from ember.dtype import dtypes

    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1 or reduces[0].arg[0] is not Ops.MAX or reduces[0].dtype not in (dtypes.float32,
                                                                                         dtypes.float64):
        return False
    src = reduces[0].src[0]
    return src.op is Ops.VIEW and src.src[0].op is Ops.LOAD and all(v.mask is None for v in src.arg.views)


def _full_reduction(ast: UOp, renderer: Renderer) -> list[Opt]:
    """A reduction to one value: split across the cores, and unrolled so each core keeps independent chains."""
    shape, reduce_axes = full_shape(ast)
    if not reduce_axes or prod(shape) < THREAD_MIN_WORK:
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
    from ember.codegen.opts import OptError, apply_opts
    from ember.codegen.tc import match_matmul

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
    from ember.codegen.opts import KernelPlan, OptError, apply_opts, launch_dim, local_size

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
    room = min(WORKGROUP_MAX_ITEMS // items, (renderer.local_max or (WORKGROUP_MAX_ITEMS,))[0])
    if renderer.has_shared and renderer.shared_max > 0 and size >= GROUP_MIN_REDUCE and room >= 2:
        if outputs < GROUP_MAX_OUTPUTS:
            n = _largest_factor(size, min(64, room))
            op = "GROUP" if contiguous else "GROUPTOP"
            if n > 1:
                grouped = [Opt(op, axis, n)]
                if size // n % 4 == 0 and size // n >= 16:
                    out.append(grouped + unroll)
                out.append(grouped)
        elif not contiguous and outputs <= GROUP_ACROSS_OUTPUTS:
            n = _largest_factor(size, min(16, room))
            if n > 1:
                out.append([Opt("GROUPTOP", axis, n)])
    if contiguous and size % 4 == 0 and size >= 16 and unroll:
        out.append(unroll)
    return out


def _elementwise_loads(ast: UOp) -> tuple[list[dict[int, int]], int]:
    """The stride maps (per output axis; -1: used through / or %) of the loads of an elementwise kernel's first
    stored value, and an estimate of the operations per output (loads, ALU, index math included). The value is
    indexed with one variable per output axis, so a view of a computed value (a transposed relu) counts as its
    loads' strides."""
    from ember.codegen.lowerer import LoweringContext, _lower
    from ember.dtype import dtypes

    out_shape = ast.src[0].arg.shape
    ctx = LoweringContext(dtypes.int32)
    vars_ = tuple(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"o{i}", 0, max(d - 1, 0))) for i, d in enumerate(out_shape))
    body = _lower(ctx, ast.src[0].src[1], vars_, UOp.const(dtypes.bool, True))
    loads: list[dict[int, int]] = []
    ops = 0
    for n in body.toposort():
        if n.op is Ops.LOAD:
            loads.append(_load_strides(n.src[1], vars_))
            ops += 2
        elif n.op in GroupOp.ALU or n.op is Ops.CAST:  # integer work too: a random number's hash is all of it
            ops += 1
    return loads, max(1, ops)


def _transpose_tile(ast: UOp) -> list[Opt]:
    """An elementwise kernel that reads some input across the axis it writes along (a transposing copy): a tile of
    both axes, so each loaded row and each stored row is a run of neighbours. Eight along the loaded rows (half a
    cache line) is what counts: a 1024^2 transposing copy on one core took 3.1 ms untiled, 1.0 ms as 4 x 8, 0.45
    ms as 8 x 4 (gcc: 0.11 s), 0.52 ms as 8 x 8 (0.16 s), 0.48 ms as 16 x 16 (0.41 s). Two along the stored rows
    are as fast as four (a relu of a transposed view on two cores, 8 x 2 against 8 x 4: 784 x 256 77 and 76 us,
    512^2 105 and 109 us, 1024^2 347 and 348 us; untiled 115, 200 and 1650 us) and build in 20-30% less gcc
    time (the two transposing copies of an MLP's first step: 90 ms against 120)."""
    out_shape = ast.src[0].arg.shape
    if prod(out_shape) < TRANSPOSE_MIN_SIZE or not all(isinstance(d, int) for d in out_shape):
        return []
    stored = _view_strides(ast.src[0], len(out_shape))
    along = [d for d, s in stored.items() if s == 1 and out_shape[d] > 1]
    if len(along) != 1:
        return []
    s_axis = along[0]
    loads, body_ops = _elementwise_loads(ast)
    # an input read contiguously along another axis, moving along the stored axis too (not a broadcast row)
    across = sorted({d for st in loads for d, s in st.items()
                     if s == 1 and d != s_axis and out_shape[d] > 1 and st.get(s_axis, 0) not in (0, 1)})
    if not across:
        return []
    l_axis = across[-1]
    rows, cols = TRANSPOSE_TILE
    while cols > 2 and rows * cols * body_ops > MAX_TILE_OPS:
        cols //= 2
    amts = (_largest_factor(out_shape[l_axis], rows, 4), _largest_factor(out_shape[s_axis], cols))
    if any(a == 1 for a in amts) or amts[0] * amts[1] * body_ops > MAX_TILE_OPS:
        return []
    return [Opt("UPCAST", l_axis, amts[0]), Opt("UPCAST", s_axis, amts[1])]


def heuristic_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """Pick optimizations for ``ast`` on ``renderer`` (no timing; BEAM can do better)."""
    if not any(n.op is Ops.REDUCE_AXIS for n in ast.toposort()) and not renderer.has_local:
        return _transpose_tile(ast)
    if renderer.has_local:
        return _workgroup_opts(ast, renderer)
    out_shape = ast.src[0].arg.shape
    if prod(out_shape) == 1:
        return _full_reduction(ast, renderer)
    # three quarters of the registers hold accumulators; the rest carry the loads
    acc_regs = max(2, renderer.vector_registers * 3 // 4)
    same = broadcast_axes(ast)
    shape, reduce_axes = full_shape(ast)
    tiny = prod(shape) < TINY_KERNEL_WORK
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
            if size % ROW_MAX_UNROLL == 0 and size >= 16 * ROW_MAX_UNROLL:
                opts.append(Opt("UNROLL", reduce_axes[0], ROW_MAX_UNROLL))
    return opts
