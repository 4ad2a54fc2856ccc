"""Lower a kernel AST to an index-level UOp DAG.

The scheduler's AST says *what* a kernel computes in terms of shapes: loads of buffers
through views, elementwise ops, reductions, one store per output. Lowering picks the loops
(one RANGE per output dimension, one per reduced dimension) and pushes index expressions
down from the store to every load through the views, with validity gates for padded
regions. The result is still a DAG; :mod:`ember.codegen.linearize` orders it.

Optimizations reshape the iteration space before lowering (see :mod:`ember.codegen.opts`).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ember.dtype import DType, PtrDType, dtypes
from ember.helpers import prod
from ember.ir.shapetracker import ShapeTracker
from ember.ir.symbolic import is_simplified, known_simplified, mark_simplified, simplify, sint_max, smul, split_terms
from ember.ir.uop import GroupOp, Ops, UOp, toposort

if TYPE_CHECKING:
    from ember.codegen.opts import KernelPlan
    from ember.renderer import Renderer


def ast_shape(u: UOp, memo: dict[UOp, tuple[int, ...]]) -> tuple[int, ...]:
    """The logical shape of a node in a kernel AST."""
    if u in memo:
        return memo[u]
    if u.op is Ops.VIEW:
        out = u.arg.shape
    elif u.op is Ops.LOAD:
        out = (u.src[0].arg[1],)
    elif u.op is Ops.CONST:
        out = ()
    elif u.op is Ops.REDUCE_AXIS:
        s = ast_shape(u.src[0], memo)
        out = tuple(1 if i in u.arg[1] else d for i, d in enumerate(s))
    elif u.op is Ops.STORE:
        out = u.arg.shape
    else:
        out = ast_shape(u.src[0], memo)
    memo[u] = out
    return out


def reduce_identity(op: Ops, dt: DType) -> object:
    """The starting value of an accumulator for ``op``."""
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    return dtypes.min(dt)


@dataclass
class LoweringContext:
    idx_dtype: DType
    range_count: int = 0
    memo: dict[tuple, UOp] = field(default_factory=dict)
    shapes: dict[UOp, tuple[int, ...]] = field(default_factory=dict)
    reduce_ranges: dict[tuple[UOp, int], tuple[UOp | None, UOp]] = field(default_factory=dict)
    plan: KernelPlan | None = None
    view_index: dict[tuple, tuple[UOp, UOp]] = field(default_factory=dict)
    #: a GROUP's work-item id (its launch dimension 0) and this work-item's output's first slot in the
    #: local memory of its work-group (see _group_combine)
    group_id: UOp | None = None
    group_row: UOp | None = None
    local_count: int = 0
    combine_ranges: dict[UOp, UOp] = field(default_factory=dict)
    #: a TC opt: the lane (launch dimension 0), each tile's first output row (M) and column (N), the WMMA
    #: args per element of D, and the loop over K tiles
    tc_lane: UOp | None = None
    tc_origin: dict[int, UOp] = field(default_factory=dict)
    tc_args: list[tuple] = field(default_factory=list)
    tc_element: int = 0
    tc_range: UOp | None = None
    tc_layout: Callable[..., tuple[Any, Any]] | None = None
    #: per VIEW node of the AST, what _view_facts says
    views: dict[UOp, tuple[tuple[bool, ...], tuple[int, ...], bool]] = field(default_factory=dict)

    def new_range(self, size: int | UOp, kind: str) -> UOp:
        """A loop over ``[0, size)``; a symbolic size (over the kernel's variables) is read at run time."""
        r = UOp(Ops.RANGE, self.idx_dtype, (UOp.const(self.idx_dtype, 0), as_index(size, self.idx_dtype)),
                (self.range_count, kind))
        self.range_count += 1
        return r


@functools.lru_cache(maxsize=4096)
def _unused_dims(st: ShapeTracker) -> tuple[bool, ...]:
    """For each dim of ``st``, whether its index neither moves the address nor is masked."""
    last = st.views[-1]
    return tuple(stride == 0 and (last.mask is None or last.mask[d] == (0, last.shape[d]))
                 for d, stride in enumerate(last.strides))


def _ignore_unused(st: ShapeTracker, idxs: tuple[UOp, ...], idx_dtype: DType,
                   unused: tuple[bool, ...] | None = None) -> tuple[UOp, ...]:
    """``idxs`` with 0 for the dims ``st`` does not use (the copies of an upcast tile that differ only
    there share one lowering). ``unused``: ``_unused_dims(st)`` when the caller has it."""
    if unused is None:
        unused = _unused_dims(st)
    if not any(unused):
        return idxs
    zero = UOp.const(idx_dtype, 0)
    return tuple(zero if skip else i for skip, i in zip(unused, idxs))


def as_index(x: int | UOp, idx_dtype: DType) -> UOp:
    """A size as an index expression: a constant, or a symbolic size (over DEFINE_VARs) cast to the index type."""
    return x.cast(idx_dtype) if isinstance(x, UOp) else UOp.const(idx_dtype, x)


def _symbolic_grid(out_shape: tuple[int | UOp, ...], sizes: tuple[int | UOp, ...],
                   grid: bool) -> tuple[tuple[int | UOp, ...], dict[int, UOp]]:
    """(loop sizes, the symbolic size of each output axis whose loop runs to its maximum). A loop-based target
    loops to a symbolic size as it is; a launch grid's size is fixed when the kernel is compiled, so on a grid
    target a symbolic output axis is launched for the variable's maximum and the work-items past its value
    store nothing (their gate, like a padded axis's)."""
    if not grid:
        return sizes, {}
    limits = {i: d for i, d in enumerate(out_shape) if isinstance(d, UOp)}
    return tuple(sint_max(d) if i in limits else d for i, d in enumerate(sizes)), limits


def _add_const(x: UOp, c: int) -> UOp:
    """``x + c`` for a simplified sum ``x``, in the form simplify gives (constant term last, merged), recorded as
    simplified when ``x`` is (its terms are; a sum whose bounds pinned one value would have folded already)."""
    if x.op is Ops.ADD and x.src[1].op is Ops.CONST:
        x, c = x.src[0], c + x.src[1].arg
    elif x.op is Ops.CONST:
        return UOp.const(x.value_dtype, x.arg + c)
    if not c:
        return x
    out = UOp(Ops.ADD, x.dtype, (x, UOp.const(x.value_dtype, c)))
    return mark_simplified(out) if is_simplified(x) else out


def view_index(ctx: LoweringContext, st: ShapeTracker, idxs: tuple[UOp, ...]) -> tuple[UOp, UOp]:
    """``st.to_index(idxs)``, sharing work between indices that differ by constants.

    A single unmasked view is affine in the indices, so an upcast copy's index is the first copy's
    index plus a constant: simplifying that is much cheaper than simplifying the whole index again.
    """
    key = (st, idxs)
    if key in ctx.view_index:
        return ctx.view_index[key]
    if len(st.views) == 1 and st.views[0].mask is None and all(isinstance(x, int) for x in st.views[0].strides):
        bases, offset = [], 0
        for i, stride in zip(idxs, st.views[0].strides):
            terms = split_terms(i)
            const = sum(t.arg for t in terms if t.op is Ops.CONST)
            if const and stride:
                offset += const * stride
                rest = [t for t in terms if t.op is not Ops.CONST]
                i = rest[0] if len(rest) == 1 else simplify(i - const)
            bases.append(i)
        if offset:
            base_idx, valid = view_index(ctx, st, tuple(bases))
            out = (_add_const(base_idx, offset), valid)
            ctx.view_index[key] = out
            return out
    out = st.to_index(list(idxs), ctx.idx_dtype)
    ctx.view_index[key] = out
    return out


def _reduce_indices(ctx: LoweringContext, red: UOp, ax: int, size: int, ranges: list[UOp]) -> list[UOp]:
    """The loops of reduced axis ``ax`` of ``red`` (appended to ``ranges``, outermost first) and the index of
    each unrolled copy: ``t * (size / threads) + r * unroll + c``. A grouped axis splits between the group's
    work-items ``w`` of ``n``: ``r * (n * unroll) + w * unroll + c`` (GROUP: neighbouring work-items read
    neighbouring runs) or ``w * (size / n) + r * unroll + c`` (GROUPTOP: a contiguous block each)."""
    unroll, threads = ctx.plan.src_split(ax, size) if ctx.plan is not None else (1, 1)
    group = ctx.plan.src_group(ax, size) if ctx.plan is not None else None
    n = group[0] if group is not None else 1
    key = (red, ax)
    if key not in ctx.reduce_ranges:
        # copies of one reduction (upcast tiles) share loops, so they can share one loop nest
        outer = ctx.new_range(threads, "thread") if threads > 1 else None
        steps = size if isinstance(size, UOp) else size // threads // n // unroll
        ctx.reduce_ranges[key] = (outer, ctx.new_range(steps, "reduce"))
    outer, inner = ctx.reduce_ranges[key]
    if isinstance(size, UOp):  # a symbolic reduce axis is never split (the opts refuse it)
        ranges.append(inner)
        return [inner]
    if outer is not None:
        ranges.append(outer)
    ranges.append(inner)
    if group is not None:
        assert ctx.group_id is not None
        w = ctx.group_id
        base = w * (size // n) + inner * unroll if group[1] else inner * (n * unroll) + w * unroll
        return [simplify(base + c) for c in range(unroll)]
    base = inner * unroll if unroll > 1 else inner
    if outer is not None:
        base = outer * (size // threads) + base
    return [simplify(base + c) if c or outer is not None or unroll > 1 else inner for c in range(unroll)]


def _group_combine(ctx: LoweringContext, red: UOp, partial: UOp) -> UOp:
    """Combine the partial results of a grouped reduction: each work-item writes its own to local memory,
    and after a barrier every work-item reduces its output's row of partials (so no work-item skips the
    barrier, and the value is there for whatever the kernel computes from it; one work-item stores)."""
    assert ctx.plan is not None and ctx.plan.group is not None and ctx.group_id is not None
    assert ctx.group_row is not None and isinstance(red.dtype, DType)
    n = ctx.plan.group[1]
    slots = prod(ctx.plan.local.values()) * n
    buf = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(), (), (ctx.local_count, slots))
    ctx.local_count += 1
    store = UOp(Ops.STORE, None, (buf, simplify(ctx.group_row + ctx.group_id), partial))
    barrier = UOp(Ops.BARRIER, None, (store,))
    if red not in ctx.combine_ranges:  # copies of one reduction share the combining loop
        ctx.combine_ranges[red] = ctx.new_range(n, "reduce")
    r = ctx.combine_ranges[red]
    load = UOp(Ops.LOAD, red.dtype, (buf, simplify(ctx.group_row + r), barrier))
    return UOp(Ops.REDUCE, red.dtype, (load, r), red.arg[0])


def _lower_tc(ctx: LoweringContext, idxs: tuple[UOp, ...], gate: UOp) -> UOp:
    """One element of this lane's tile of a matmul on tensor cores: per K tile, the lane's elements of A and
    B are loaded where the layout puts them and the instruction's D summed (see :mod:`ember.codegen.tc`)."""
    assert ctx.plan is not None and ctx.plan.tc is not None and ctx.tc_lane is not None
    tc, mm = ctx.plan.tc
    args = ctx.tc_args[ctx.tc_element]
    if ctx.tc_range is None:
        ctx.tc_range = ctx.new_range(ctx.plan.full_shape[mm.k] // tc.dims[2], "reduce")
    k0 = ctx.tc_range * tc.dims[2]
    lane = ctx.tc_lane
    zero = UOp.const(ctx.idx_dtype, 0)
    vals: list[UOp] = []
    for operand, expr, count in (("A", mm.a, tc.elements_per_thread[0]), ("B", mm.b, tc.elements_per_thread[1])):
        for i in range(count):
            assert ctx.tc_layout is not None
            row, col = ctx.tc_layout(tc, operand, lane, i)
            at = list(idxs)
            if operand == "A":
                at[mm.m], at[mm.k], at[mm.n] = ctx.tc_origin[mm.m] + row, k0 + col, zero
            else:
                at[mm.m], at[mm.k], at[mm.n] = zero, k0 + row, ctx.tc_origin[mm.n] + col
            vals.append(_lower(ctx, expr, tuple(simplify(x) for x in at), gate))
    wmma = UOp(Ops.WMMA, tc.dtype_out, (*vals, lane), args)
    return UOp(Ops.REDUCE, tc.dtype_out, (wmma, ctx.tc_range), Ops.ADD)


def _view_facts(ctx: LoweringContext, u: UOp) -> tuple[tuple[bool, ...], tuple[int, ...], bool]:
    """What lowering a VIEW node needs to know about it whatever the indices: the dims it leaves unused, its
    source's shape, and whether it is a reshape that only adds or drops size-1 dims."""
    st: ShapeTracker = u.arg
    src_shape = ast_shape(u.src[0], ctx.shapes)
    reshape_only = st.contiguous and [d for d in st.shape if d != 1] == [d for d in src_shape if d != 1]
    return _unused_dims(st), src_shape, reshape_only


def _lower(ctx: LoweringContext, u: UOp, idxs: tuple[UOp, ...], gate: UOp) -> UOp:
    if u.op is Ops.VIEW:
        view = ctx.views.get(u)
        if view is None:
            view = ctx.views[u] = _view_facts(ctx, u)
        idxs = _ignore_unused(u.arg, idxs, ctx.idx_dtype, view[0])
    key = (u, idxs, gate)
    out = ctx.memo.get(key)
    if out is not None:
        return out
    if u.op in GroupOp.Elementwise:  # the most common node first (the branches are exclusive)
        return _lower_elementwise(ctx, u, idxs, gate)
    elif u.op is Ops.CONST:
        out = u
    elif u.op is Ops.VIEW:
        st: ShapeTracker = u.arg
        idx, valid = view_index(ctx, st, idxs)
        _, src_shape, reshape_only = ctx.views[u]
        # unflatten the flat index into the source's logical shape
        sub: tuple[UOp, ...]
        if len(src_shape) == 1:
            sub = (idx,)
        elif reshape_only:
            # a reshape that only adds or drops size-1 dims: the indices carry over unchanged
            moving = iter(i for i, d in zip(idxs, st.shape) if d != 1)
            sub = tuple(next(moving) if d != 1 else UOp.const(ctx.idx_dtype, 0) for d in src_shape)
        else:
            parts: list[UOp] = []
            acc: int | UOp = 1
            for s in reversed(src_shape):
                parts.append(simplify((idx // as_index(acc, ctx.idx_dtype)) % as_index(s, ctx.idx_dtype)) if s != 1
                             else UOp.const(ctx.idx_dtype, 0))
                acc = smul(acc, s)
            sub = tuple(reversed(parts))
        # (an unmasked view, the common case, leaves the gate as it is: gates are simplified already)
        inner_gate = gate if valid.op is Ops.CONST and valid.arg is True else simplify(gate.logical_and(valid))
        if inner_gate.op is Ops.CONST and not inner_gate.arg:
            out = UOp.const(u.value_dtype, 0)
        else:
            val = _lower(ctx, u.src[0], sub, inner_gate)
            out = val if (valid.op is Ops.CONST and valid.arg) else valid.where(val, UOp.const(val.value_dtype, 0))
    elif u.op is Ops.LOAD and len(u.src[0].arg) > 2 and u.src[0].arg[2] == "ramp":
        # element i of a ramp holds i: no memory read, and an index a reduction can match (_collapse_one_hot)
        idx = idxs[0].cast(u.src[0].pointer_dtype.base)
        out = idx if gate.op is Ops.CONST and gate.arg else gate.where(idx, UOp.const(idx.value_dtype, 0))
    elif u.op is Ops.LOAD:
        buf = u.src[0]
        srcs = (buf, idxs[0]) if (gate.op is Ops.CONST and gate.arg) else (buf, idxs[0], gate)
        out = UOp(Ops.LOAD, buf.pointer_dtype.base, srcs)
    elif u.op is Ops.REDUCE_AXIS and ctx.plan is not None and ctx.plan.tc is not None and \
            u is ctx.plan.tc[1].reduce:
        out = _lower_tc(ctx, idxs, gate)
    elif u.op is Ops.REDUCE_AXIS and (hit := _collapse_one_hot(ctx, u, idxs, gate)) is not None:
        out = hit
    elif u.op is Ops.REDUCE_AXIS:
        op, axes = u.arg
        src_shape = ast_shape(u.src[0], ctx.shapes)
        ranges: list[UOp] = []
        # per reduced axis, the index of each unrolled copy
        choices: list[list[tuple[int, UOp]]] = []
        grouped = ctx.plan is not None and any(src_shape[ax] != 1 and ctx.plan.src_group(ax, src_shape[ax])
                                               for ax in axes)
        for ax in axes:
            if src_shape[ax] == 1:
                choices.append([(ax, UOp.const(ctx.idx_dtype, 0))])
                continue
            choices.append([(ax, i) for i in _reduce_indices(ctx, u, ax, src_shape[ax], ranges)])
        vals = []
        for combo in itertools.product(*choices):
            new_idxs = list(idxs)
            for ax, i in combo:
                new_idxs[ax] = i
            vals.append(_lower(ctx, u.src[0], tuple(new_idxs), gate))
        if any(s == 0 for s in src_shape):
            out = UOp.const(u.value_dtype, reduce_identity(op, u.value_dtype))
        elif not ranges:
            out = functools.reduce(lambda a, b: UOp(op, a.dtype, (a, b)), vals)
        else:
            # each unrolled copy has its own accumulator (independent chains the compiler can vectorize), all in
            # one loop (linearize groups reductions over the same loops); they are combined after it
            out = functools.reduce(lambda a, b: UOp(op, a.dtype, (a, b)),
                                   [UOp(Ops.REDUCE, u.dtype, (v, *ranges), op) for v in vals])
        if grouped and not any(s == 0 for s in src_shape):
            out = _group_combine(ctx, u, out)
    else:
        raise NotImplementedError(f"cannot lower {u.op} in a kernel AST")
    known_simplified(out)  # (the kernel's final simplification then skips what no rule can change)
    ctx.memo[key] = out
    return out


def _strip_exact_casts(x: UOp, p: UOp) -> UOp:
    """``x`` without the integer casts that keep every value of ``p`` (``[p.vmin, p.vmax]``) as it is."""
    while x.op is Ops.CAST and x.value_dtype.kind in "iu" and x.src[0].value_dtype.kind in "iu" and \
            dtypes.min(x.value_dtype) <= p.vmin and p.vmax <= dtypes.max(x.value_dtype):
        x = x.src[0]
    return x


def _substitute(x: UOp, old: UOp, new: UOp) -> UOp:
    """``x`` with every use of the node ``old`` replaced by ``new``."""
    done: dict[UOp, UOp] = {old: new}
    for n in toposort([x], stop=lambda n: n is old):
        if n in done:
            continue
        src = tuple(done.get(s, s) for s in n.src)
        done[n] = n if src == n.src else UOp(n.op, n.dtype, src, n.arg)
    return done[x]


def _collapse_one_hot(ctx: LoweringContext, red: UOp, idxs: tuple[UOp, ...], gate: UOp) -> UOp | None:
    """A sum over one axis ``k`` of ``where(e == k, x(k), 0)`` (a lookup written as a one-hot selection, as
    ``gather``, tensor indexing and ``Embedding`` build it against a ramp) as ``x(e)`` where ``0 <= e < K``,
    else 0: at most one ``k`` matches, so the sum is that term, exactly, and the loop over ``K`` goes away (a
    BERT embedding's 30522-long reduction per output becomes one load). ``e`` must not depend on ``k``, and
    the ``k`` it is compared with must be exact (integer casts that keep ``[0, K)``). Returns None when ``red``
    is not of that form, or when the opts split the axis across threads."""
    op, axes = red.arg
    src_shape = ast_shape(red.src[0], ctx.shapes)
    live = [ax for ax in axes if src_shape[ax] != 1]
    if op is not Ops.ADD or len(live) != 1 or not isinstance(size := src_shape[live[0]], int) or size < 1:
        return None
    body = red.src[0]
    cast_to = body.value_dtype if body.op is Ops.CAST else None
    where = body.src[0] if body.op is Ops.CAST else body
    # (a GROUP of the axis is left with nothing to share: every work-item of the group computes the lookup and
    # the first stores it, as for any grouped output)
    if where.op is not Ops.WHERE or ctx.plan is not None and ctx.plan.src_split(live[0], size)[1] > 1:
        return None
    # the body at a stand-in index over [0, K): matched on its lowered form, then replaced
    k = UOp(Ops.DEFINE_VAR, ctx.idx_dtype, (), (f"onehot{ctx.range_count}", 0, size - 1))
    new_idxs = list(idxs)
    new_idxs[live[0]] = k
    lowered = _lower(ctx, where, tuple(new_idxs), gate)
    if lowered.op is not Ops.WHERE or not (lowered.src[2].op is Ops.CONST and lowered.src[2].arg == 0):
        return None
    cond, x = lowered.src[0], lowered.src[1]
    if cond.op is not Ops.CMPEQ:
        return None
    for e, other in ((cond.src[0], cond.src[1]), (cond.src[1], cond.src[0])):
        if _strip_exact_casts(other, k) is k and k not in e.toposort():
            break
    else:
        return None
    edt = e.value_dtype
    ok = UOp.const(dtypes.bool, True)
    if edt.kind == "i":
        ok = UOp.const(edt, -1).lt(e)
    if size <= dtypes.max(edt):
        ok = ok.logical_and(e.lt(size))
    at = ok.where(e.cast(ctx.idx_dtype), UOp.const(ctx.idx_dtype, 0))  # in bounds even where nothing matches
    out = simplify(ok.where(_substitute(x, k, at), UOp.const(x.value_dtype, 0)))
    if k in out.toposort():
        return None
    return out.cast(cast_to if cast_to is not None else red.value_dtype)


def _lower_elementwise(ctx: LoweringContext, u: UOp, idxs: tuple[UOp, ...], gate: UOp) -> UOp:
    """:func:`_lower` of the elementwise node ``u``: its elementwise sources (at the same indices) walked with a
    stack, not recursion, so a chain of any length lowers; each source in its order, as recursion would."""
    memo = ctx.memo
    # (node, iterator over its sources, its sources lowered so far)
    stack: list[tuple[UOp, Any, list[UOp]]] = [(u, iter(u.src), [])]
    while stack:
        n, it, done = stack[-1]
        for s in it:
            if s.op in GroupOp.Elementwise:
                hit = memo.get((s, idxs, gate))
                if hit is None:
                    stack.append((s, iter(s.src), []))
                    break
                done.append(hit)
            else:
                done.append(_lower(ctx, s, idxs, gate))
        else:
            stack.pop()
            out = UOp(n.op, n.dtype, tuple(done), n.arg)
            known_simplified(out)  # (the kernel's final simplification then skips what no rule can change)
            memo[(n, idxs, gate)] = out
            if stack:
                stack[-1][2].append(out)
    return out


def _global_indices(ctx: LoweringContext, out_shape: tuple[int | UOp, ...], max_dims: int | None) -> tuple[UOp, ...]:
    """One global RANGE per output dim; targets with few launch dims get leading dims merged (their sizes are
    ints there: a grid target's symbolic sizes were replaced by their maxima)."""
    dims = [i for i, d in enumerate(out_shape) if d != 1]
    if max_dims is None or len(dims) <= max_dims:
        return tuple(ctx.new_range(d, "global") if d != 1 else UOp.const(ctx.idx_dtype, 0) for d in out_shape)
    merged = dims[: len(dims) - max_dims + 1]
    sizes = [d if isinstance(d, int) else sint_max(d) for d in out_shape]
    flat = ctx.new_range(prod(sizes[i] for i in merged), "global")
    idxs: dict[int, UOp] = {}
    acc = 1
    for i in reversed(merged):
        idxs[i] = simplify((flat // acc) % sizes[i])
        acc *= sizes[i]
    for i in dims[len(merged):]:
        idxs[i] = ctx.new_range(out_shape[i], "global")
    return tuple(idxs.get(i, UOp.const(ctx.idx_dtype, 0)) for i in range(len(out_shape)))


#: the largest index a kernel may compute in 32 bits; one whose index math may reach further indexes with 64
INDEX32_MAX = 2 ** 31 - 2


def _magnitude(x: int | UOp) -> int:
    """The largest ``|x|`` over its variables' ranges (a size, stride or offset of a view)."""
    if isinstance(x, int):
        return abs(x)
    lo, hi = x.vmin, x.vmax
    return max(abs(lo), abs(hi)) if isinstance(lo, int) and isinstance(hi, int) else 2 ** 63


@functools.lru_cache(maxsize=4096)
def _view_reach(st: ShapeTracker, extents: tuple[int, ...] | None) -> int:
    """The largest magnitude an index expression of ``st`` can take: each view's flat index (offset plus
    stride times index, summed in any order), its loop bounds and mask limits, and the divisors that unflatten
    it into the view below. ``extents`` overrides the last view's shape as the loops' sizes (a padded loop runs
    past the shape)."""
    reach = 0
    for k, v in enumerate(reversed(st.views)):
        dims = extents if k == 0 and extents is not None else tuple(_magnitude(d) for d in v.shape)
        flat = _magnitude(v.offset) + sum(_magnitude(s) * max(n - 1, 0) for s, n in zip(v.strides, dims))
        reach = max(reach, flat, *dims)
        if k > 0:  # this view's indices are unflattened from the flat index of the view above it
            reach = max(reach, prod(dims[1:]))
    return reach


#: the AST nodes whose sizes bound a kernel's index math
_REACH_OPS = frozenset({Ops.DEFINE_GLOBAL, Ops.VIEW, Ops.STORE, Ops.REDUCE_AXIS})


def index_reach(ast: UOp, plan: KernelPlan | None = None, shapes: dict[UOp, tuple[int, ...]] | None = None) -> int:
    """An upper bound on the magnitude of every index value lowering ``ast`` (with ``plan``) computes: loop
    counters and bounds, buffer offsets, view arithmetic, gates. Past :data:`INDEX32_MAX` the kernel indexes
    with 64-bit integers. ``shapes``: :func:`ast_shape`'s memo, filled on the way."""
    shapes = {} if shapes is None else shapes
    out_shape = ast.src[0].arg.shape
    padded = plan.padded if plan is not None else {}
    loops = tuple(max(_magnitude(d), padded.get(i, 0)) for i, d in enumerate(out_shape))
    # the global loops, merged into one on a target with few launch dimensions
    reach = prod(max(n, 1) for n in loops)
    for u in ast.toposort():
        op = u.op
        if op not in _REACH_OPS:
            continue
        if op is Ops.DEFINE_GLOBAL:
            reach = max(reach, u.arg[1])
        elif op is not Ops.REDUCE_AXIS:
            st: ShapeTracker = u.arg
            # a view with the output's rank is indexed by the output loops (a padded one runs past its shape)
            extents = None
            if padded and len(st.shape) == len(out_shape):
                extents = tuple(max(_magnitude(d), padded.get(i, 0)) for i, d in enumerate(st.shape))
            reach = max(reach, _view_reach(st, extents))
            if op is Ops.VIEW and len(src := ast_shape(u.src[0], shapes)) > 1:
                reach = max(reach, prod(_magnitude(d) for d in src[1:]))  # unflattening into the source's shape
        else:
            reach = max([reach] + [_magnitude(d) for d in ast_shape(u.src[0], shapes)])
    return reach


def lower_ast(ast: UOp, max_global_dims: int | None = None, plan: KernelPlan | None = None,
              renderer: Renderer | None = None) -> UOp:
    """Turn a kernel AST (SINK of STOREs) into a SINK of index-level STOREs over RANGE loops.

    ``max_global_dims`` limits how many global loops there are (a GPU launch grid has 3).
    ``plan`` (from :func:`ember.codegen.opts.apply_opts`) reshapes the loops: an upcast output dim computes
    several neighbouring outputs per iteration (unrolled, sharing loads and index math, so the compiler keeps
    them in registers and vectorizes), an unrolled reduce dim several elements per step, a padded dim runs
    past its end with its stores and loads gated off, a threaded reduce dim gets an outer "thread" loop, a
    grouped reduce dim is shared by a group's work-items through local memory (see :func:`_group_combine`).
    """
    assert ast.op is Ops.SINK, f"kernel AST must be a SINK, got {ast.op}"
    out_shape = ast.src[0].arg.shape
    shapes: dict[UOp, tuple[int, ...]] = {}
    idx_dtype = dtypes.int64 if index_reach(ast, plan, shapes) > INDEX32_MAX else dtypes.int32
    ctx = LoweringContext(idx_dtype, shapes=shapes, plan=plan)
    upcast = plan.upcast if plan is not None else {}
    padded = plan.padded if plan is not None else {}
    sizes, limits = _symbolic_grid(out_shape, tuple(padded.get(i, d) for i, d in enumerate(out_shape)),
                                   max_global_dims is not None)
    loop_shape = tuple(d // upcast[i] if upcast.get(i, 1) != 1 else d for i, d in enumerate(sizes))
    group = plan.group if plan is not None else None
    tc = plan.tc if plan is not None else None
    if tc is not None:
        # a tile of outputs per tensor-core instruction
        loop_shape = tuple(d // tc[0].dims[0] if i == tc[1].m else d // tc[0].dims[1] if i == tc[1].n else d
                           for i, d in enumerate(loop_shape))
    # a group's (or a tensor core's) work-items take launch dimension 0: the output loops get one dimension less
    out_dims = max_global_dims - 1 if (group is not None or tc is not None) and max_global_dims is not None \
        else max_global_dims
    base = _global_indices(ctx, loop_shape, out_dims)
    is_first = UOp.const(dtypes.bool, True)
    if group is not None and plan is not None:
        # the last global loop opened is the innermost: launch dimension 0
        ctx.group_id = ctx.new_range(group[1], "global")
        # this output's row of partials in its work-group's local memory: its position along the LOCAL axes
        pos: UOp = UOp.const(idx_dtype, 0)
        for axis, n in plan.local.items():
            pos = pos * n + base[axis] % n
        ctx.group_row = simplify(pos * group[1])
        is_first = UOp(Ops.CMPEQ, dtypes.bool, (ctx.group_id, UOp.const(idx_dtype, 0)))
    # each dim's candidate indices once; a tile copy picks one per dim
    choices = [[simplify(b * upcast[i] + c) for c in range(upcast[i])] if upcast.get(i, 1) > 1 else [b]
               for i, b in enumerate(base)]
    copies: list[tuple[UOp, ...]] = [tuple(g) for g in itertools.product(*choices)]
    if tc is not None:
        from ember.codegen.tc import wmma_arg

        if renderer is None:
            raise ValueError("a TC plan is lowered with its renderer (which says where the elements live)")

        core, mm = tc
        lane = ctx.tc_lane = ctx.new_range(core.threads, "global")  # the last opened: launch dimension 0
        ctx.tc_origin = {mm.m: simplify(base[mm.m] * core.dims[0]), mm.n: simplify(base[mm.n] * core.dims[1])}
        ctx.tc_args = [wmma_arg(renderer, core, i) for i in range(core.elements_per_thread[2])]
        ctx.tc_layout = renderer.tensor_core_layout
        copies = []
        for i in range(core.elements_per_thread[2]):
            row, col = renderer.tensor_core_layout(core, "C", lane, i)
            g = list(base)
            g[mm.m], g[mm.n] = simplify(ctx.tc_origin[mm.m] + row), simplify(ctx.tc_origin[mm.n] + col)
            copies.append(tuple(g))
    stores = []
    for copy, gidx in enumerate(copies):
        ctx.tc_element = copy
        # past the end of a padded dim nothing is loaded or stored
        gate = UOp.const(dtypes.bool, True)
        for ax in padded:
            gate = gate.logical_and(gidx[ax].lt(out_shape[ax]))
        for ax, limit in limits.items():
            gate = gate.logical_and(gidx[ax].lt(limit.cast(idx_dtype)))
        gate = simplify(gate)
        for store in ast.src:
            assert store.op is Ops.STORE and store.arg.shape == out_shape, "every output of a kernel has the same shape"
            buf, value = store.src
            val = _lower(ctx, value, gidx, gate)
            idx, valid = view_index(ctx, store.arg, gidx)
            # a group's work-items all hold the result; the first stores it
            if not (valid.op is Ops.CONST and valid.arg is True and gate.op is Ops.CONST and gate.arg is True
                    and is_first.op is Ops.CONST and is_first.arg is True):
                valid = simplify(valid.logical_and(gate).logical_and(is_first))
            srcs = (buf, idx, val) if (valid.op is Ops.CONST and valid.arg) else (buf, idx, val, valid)
            stores.append(UOp(Ops.STORE, None, srcs))
    sink = simplify(UOp(Ops.SINK, None, tuple(stores)))
    return _merge_barriers(sink) if group is not None else sink


def _merge_barriers(sink: UOp) -> UOp:
    """One barrier for the partials of every grouped reduction copy (an upcast tile's), instead of one each;
    left as they are when one reduction's partial needs another's combined result (the barriers then order
    the two)."""
    nodes = sink.toposort()
    barriers = [n for n in nodes if n.op is Ops.BARRIER]
    if len(barriers) < 2:
        return sink
    stores = tuple(s for b in barriers for s in b.src)
    if any(n.op is Ops.BARRIER for s in stores for n in s.toposort()):
        return sink
    merged = UOp(Ops.BARRIER, None, stores)
    new: dict[UOp, UOp] = {b: merged for b in barriers}
    for n in nodes:
        if n not in new:
            src = tuple(new.get(s, s) for s in n.src)
            new[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
    return new[sink]


def global_dims(ast: UOp) -> tuple[int, ...]:
    """The output shape of a kernel AST."""
    return ast.src[0].arg.shape


__all__ = ["lower_ast", "global_dims", "ast_shape", "PtrDType"]
