"""How a kernel indexes its buffers along each of its axes: the one access analysis of codegen.

The heuristic, tensor-core matching (:mod:`ember.codegen.matmul`) and the opt checks ask the same questions of a
kernel AST before it is lowered with its opts: how are its axes numbered (:func:`kernel_shape`), how far does
each load move per step of each axis (a *stride map*, ``{axis: stride}``; ``-1`` for an axis used only through
``//`` or ``%``, which has no fixed stride), and which axes does a value not depend on at all. A view of a
buffer answers directly from its strides; anything else (a view of a computed value) is answered by lowering
the value once with one variable per axis (:func:`lower_values`) and reading the variables' coefficients out of
each load's index expression (:func:`index_strides`).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from ember.codegen.lowerer import LoweringContext, _lower, ast_shape
from ember.dtype import dtypes
from ember.ir.symbolic import simplify, split_terms, term_coeff
from ember.ir.uop import GroupOp, Ops, UOp

#: a stride map: axis -> how far the flat index moves per step of it (-1: only through / or %, no fixed stride)
Strides = dict[int, int]


@dataclass(frozen=True)
class KernelShape:
    """How a kernel's axes are numbered (see :mod:`ember.codegen.opts`).

    ``full_shape`` lists the output axes, then (when the reduction's input does not have the output's rank with
    1 on the reduced axes) the reduced axes appended. ``reduce_src`` maps each reduce axis to the axis of the
    reduction's input it splits; ``out_to_src`` maps output axes to the reduction input's axes they index (empty
    when a reshape after the reduction mixes them).
    """

    full_shape: tuple[int, ...]
    reduce_axes: tuple[int, ...]
    reduce_src: dict[int, int]
    out_to_src: dict[int, int]


def kernel_shape(ast: UOp) -> KernelShape:
    """The axes of ``ast``'s iteration space (see :class:`KernelShape`)."""
    out = tuple(ast.src[0].arg.shape)
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE_AXIS]
    if not reduces:
        return KernelShape(out, (), {}, {i: i for i in range(len(out))})
    memo: dict[UOp, tuple[int, ...]] = {}
    src = ast_shape(reduces[0].src[0], memo)
    red = tuple(a for a in sorted(set(reduces[0].arg[1])) if src[a] != 1)
    if len(out) == len(src) and all(out[a] == 1 for a in red) and \
            all(o == s for i, (o, s) in enumerate(zip(out, src)) if i not in red):
        return KernelShape(src, red, {a: a for a in red}, {i: i for i in range(len(out)) if i not in red})
    full = out + tuple(src[a] for a in red)
    reduce_src = {len(out) + j: a for j, a in enumerate(red)}
    out_dims = [i for i, d in enumerate(out) if d != 1]
    src_dims = [i for i, d in enumerate(src) if d != 1 and i not in red]
    same = [out[i] for i in out_dims] == [src[i] for i in src_dims]
    return KernelShape(full, tuple(reduce_src), reduce_src, dict(zip(out_dims, src_dims)) if same else {})


def full_shape(ast: UOp) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the kernel's full shape, its reduce axes): see :class:`KernelShape`."""
    ks = kernel_shape(ast)
    return ks.full_shape, ks.reduce_axes


def axis_vars(sizes: Sequence[int], prefix: str, upper: int | None = None) -> tuple[UOp, ...]:
    """One int variable per axis, ``{prefix}{i}`` in ``[0, size - 1]`` (``[0, upper]`` when ``upper`` is given)."""
    return tuple(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"{prefix}{i}", 0, max(d - 1, 0) if upper is None else upper))
                 for i, d in enumerate(sizes))


def lower_values(values: Sequence[UOp], vars_: Sequence[UOp]) -> list[UOp]:
    """``values`` (AST nodes of one shape) lowered with ``vars_`` as their indices, ungated: their loads' index
    expressions are then sums of ``coefficient * variable`` terms (and ``//``, ``%`` where a view needs them)."""
    ctx = LoweringContext(dtypes.int32)
    true = UOp.const(dtypes.bool, True)
    return [_lower(ctx, v, tuple(vars_), true) for v in values]


def index_strides(index: UOp, vars_: Sequence[UOp]) -> Strides:
    """The stride of each variable of ``vars_`` in ``index``: its coefficient where it appears as a plain term,
    -1 where it appears only inside a ``//`` or ``%`` (no fixed stride)."""
    vars_ = tuple(vars_)
    strides: Strides = {}
    for t in split_terms(index):
        var, c = term_coeff(t)
        if var is not None and var in vars_:
            strides[vars_.index(var)] = c
        elif var is not None:
            for sub in var.toposort():
                if sub in vars_:
                    strides.setdefault(vars_.index(sub), -1)
    return strides


def view_strides(view: UOp, rank: int) -> Strides:
    """How far the flat index of ``view`` (over the kernel's full shape) moves per step of each dim."""
    st = view.arg
    if len(st.views) == 1 and len(st.views[0].strides) == rank:
        return {d: int(s) for d, s in enumerate(st.views[0].strides)}
    vars_ = axis_vars(st.shape, "d")
    idx, _ = st.to_index(list(vars_), dtypes.int32)
    return index_strides(simplify(idx), vars_)


class _NestedView(Exception):
    """A view of a computed value inside a reduction: its loads' strides need the index expressions."""


def weighted_reduce_loads(ast: UOp) -> tuple[list[tuple[Strides, int]], int]:
    """The stride maps of the loads inside the kernel's reductions (over the full shape) with what each load
    costs, and an estimate of the operations one output costs per reduction step (loads, index math, gates,
    ALU): what a tile copy adds to the innermost loop's body. Loads no reduction loop moves (a bias, a row's
    max) are left out: they are read once per output.

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
    out: list[tuple[Strides, int]] = []
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
                strides = view_strides(n, rank)
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
        out, ops = _indexed_loads(reduces, first)
        out = [({to_full[d]: c for d, c in st.items() if d in to_full}, cost) for st, cost in out]
    walk = None  # type: ignore[assignment]  # a recursive closure holds itself: unbound, it goes with refcounts
    moving = [(s, c) for s, c in out if any(s.get(a, 0) != 0 for a in reduce_axes)]
    return moving, max(1, ops)


@functools.lru_cache(maxsize=256)
def tile_step_ops(ast: UOp, axes: tuple[int, ...]) -> dict[frozenset[int], int]:
    """The operations of one reduction step (counted as :func:`weighted_reduce_loads` counts an indexed body),
    grouped by which of the kernel's ``axes`` their value moves along. A register tile over those axes computes a
    value once per position along the axes it moves along, and shares it along the others: a weight gradient's
    input recomputed through a fused layer norm is the same for every output row, a forward projection's is the
    same across a row of output features.

    The reductions' bodies are indexed with one variable per axis; a value moves along an axis when that axis's
    variable is among its sources. Empty for a kernel without a reduction, or with an axis not indexed like the
    reduction's input."""
    ks = kernel_shape(ast)
    to_src = {f: s for f, s in ks.reduce_src.items()} | {o: s for o, s in ks.out_to_src.items()}
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE_AXIS]
    if not reduces or not ks.reduce_axes or any(a not in to_src for a in axes):
        return {}
    memo: dict[UOp, tuple[int, ...]] = {}
    first = ast_shape(reduces[0].src[0], memo)
    reduces = [r for r in reduces if ast_shape(r.src[0], memo) == first]
    vars_ = axis_vars(first, "a")
    wanted = {vars_[to_src[a]]: a for a in axes}
    moves: dict[UOp, frozenset[int]] = {}
    out: dict[frozenset[int], int] = {}
    for body in lower_values([red.src[0] for red in reduces], vars_):
        for n in body.toposort():
            if n in moves:
                continue
            moves[n] = frozenset({wanted[n]} if n in wanted else ()).union(*(moves.get(x, frozenset()) for x in n.src))
            if n.op is Ops.LOAD:
                cost = 2 + 3 * (len(n.src) > 2)
            elif n.op in GroupOp.ALU and not (isinstance(n.dtype, type(dtypes.int32)) and n.dtype.kind in "iub"):
                cost = 1
            else:
                continue
            out[moves[n]] = out.get(moves[n], 0) + cost
    return out


def _indexed_loads(reduces: list[UOp], shape: tuple[int, ...]) -> tuple[list[tuple[Strides, int]], int]:
    """The reductions' bodies indexed with one variable per axis of their input (of ``shape``): each load's stride
    map and cost, and the operations of one step."""
    vars_ = axis_vars(shape, "a")
    out: list[tuple[Strides, int]] = []
    ops = 0
    for body in lower_values([red.src[0] for red in reduces], vars_):
        for n in body.toposort():
            if n.op is Ops.LOAD:
                cost = 2 + 3 * (len(n.src) > 2)
                out.append((index_strides(n.src[1], vars_), cost))
                ops += cost
            elif n.op in GroupOp.ALU and not (isinstance(n.dtype, type(dtypes.int32)) and n.dtype.kind in "iub"):
                ops += 1
    return out, ops


def reduce_loads(ast: UOp) -> tuple[list[Strides], int]:
    """The stride maps of the loads inside the kernel's reductions and the per-step cost of one output
    (see :func:`weighted_reduce_loads`)."""
    loads, ops = weighted_reduce_loads(ast)
    return [s for s, _ in loads], ops


def elementwise_loads(ast: UOp) -> tuple[list[Strides], int]:
    """The stride maps (per output axis) of the loads of an elementwise kernel's first stored value, and an
    estimate of the operations per output (loads, ALU, index math included). The value is indexed with one
    variable per output axis, so a view of a computed value (a transposed relu) counts as its loads' strides."""
    vars_ = axis_vars(ast.src[0].arg.shape, "o")
    [body] = lower_values([ast.src[0].src[1]], vars_)
    loads: list[Strides] = []
    ops = 0
    for n in body.toposort():
        if n.op is Ops.LOAD:
            loads.append(index_strides(n.src[1], vars_))
            ops += 2
        elif n.op in GroupOp.ALU or n.op is Ops.CAST:  # integer work too: a random number's hash is all of it
            ops += 1
    return loads, max(1, ops)


def broadcast_axes(ast: UOp) -> list[int]:
    """The output axes of a reduction kernel that its stored values do not depend on (an output gradient that
    is a constant, broadcast over output channels): every output along such an axis is the same value.

    The values are lowered once with one variable per output axis; an axis whose variable appears nowhere in
    them (no index, no gate) is one. Kernels whose reduction input is not indexed like the output are left
    alone (an empty list)."""
    ks = kernel_shape(ast)
    out_shape = ast.src[0].arg.shape
    if not ks.reduce_axes or len(ks.full_shape) != len(out_shape):
        return []
    # only an axis no load of the reductions moves along can be one: most kernels stop here, unlowered
    loads, _ = reduce_loads(ast)
    if not any(d > 1 and i not in ks.reduce_axes and all(s.get(i, 0) == 0 for s in loads)
               for i, d in enumerate(out_shape)):
        return []
    vars_ = tuple(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"o{i}", 0, d - 1)) if d > 1 and i not in ks.reduce_axes
                  else UOp.const(dtypes.int32, 0) for i, d in enumerate(out_shape))
    used = {n for body in lower_values([store.src[1] for store in ast.src], vars_) for n in body.toposort()
            if n.op is Ops.DEFINE_VAR}
    return [i for i, v in enumerate(vars_) if v.op is Ops.DEFINE_VAR and v not in used]


def axes_loaded(x: UOp, rank: int) -> set[int]:
    """The axes (of a value of ``rank`` axes) that move some load of ``x``."""
    vars_ = axis_vars([0] * rank, "a", upper=1 << 20)
    [body] = lower_values([x], vars_)
    return {vars_.index(sub) for n in body.toposort() if n.op is Ops.LOAD for sub in n.src[1].toposort()
            if sub in vars_}
