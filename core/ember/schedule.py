"""The scheduler: cut the lazy tensor graph into kernels.

Fusion rules (each is tested):

1. Elementwise ops and movement ops fuse freely: views are pushed down to the loads, so a
   chain of elementwise ops on any views of any inputs is one kernel.
2. An elementwise subgraph feeding a reduction fuses into the reduction's kernel, and
   elementwise ops after a reduction fuse into it too while the shape only changes by reshape.
3. A subgraph that contains a reduction is materialized when it is used more than once, or
   through a view that is not a plain reshape (an expand, permute, pad ...): fusing it there
   would redo the reduction per element.
4. Outputs, CONTIGUOUS and COPY are always materialized.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.dtype import PtrDType
from ember.graph.lazy import base_of, buffer_view, buffers, device_of, new_buffer, realized, shape_of
from ember.graph.shapetracker import ShapeTracker
from ember.graph.uop import Ops, UOp, toposort
from ember.helpers import prod


@dataclass(frozen=True)
class ScheduleItem:
    """One kernel (or copy): ``ast`` says what to compute, ``bufs`` which buffers (outputs first)."""

    ast: UOp
    bufs: tuple[Any, ...]


def _substitute_realized(roots: list[UOp]) -> dict[UOp, UOp]:
    """Map every node to itself or, where it was realized before, to its buffer view."""
    memo: dict[UOp, UOp] = {}
    for n in toposort(roots, stop=lambda u: u.op is Ops.BUFFER):
        if n in realized:
            memo[n] = realized[n]
            continue
        new_src = tuple(memo[s] for s in n.src)
        memo[n] = n if all(a is b for a, b in zip(new_src, n.src)) else UOp(n.op, n.dtype, new_src, n.arg)
    return memo


def _is_reshape_only(st: ShapeTracker, src_shape: tuple[int, ...]) -> bool:
    return st.contiguous and prod(src_shape) == st.size


def _targets(roots: list[UOp]) -> list[UOp]:
    """Decide which nodes become kernels, in dependency order."""
    nodes = toposort(roots, stop=lambda u: u.op is Ops.BUFFER)
    consumers: dict[UOp, list[UOp]] = {n: [] for n in nodes}
    for n in nodes:
        for s in n.src:
            consumers[s].append(n)
    targets: set[UOp] = set()
    for r in roots:
        b = base_of(r)
        if b.op is Ops.BUFFER:
            continue
        targets.add(r if b.op in (Ops.CONST, Ops.DEVICE) else b)
    for n in nodes:
        if n.op in (Ops.COPY, Ops.CONTIGUOUS):
            targets.add(n)
        if n.op is Ops.COPY:
            src = n.src[0]
            sb = base_of(src)
            whole = sb.op is Ops.BUFFER and (src.op is Ops.BUFFER or (src.arg.contiguous and src.arg.size == sb.arg[2]))
            if not whole:
                # a copy moves a contiguous buffer: materialize its source first
                targets.add(src if src.op is Ops.VIEW else sb)
    has_reduce: dict[UOp, bool] = {}
    for n in nodes:
        inner = any(has_reduce[s] for s in n.src if s not in targets and s.op is not Ops.BUFFER)
        hr = n.op is Ops.REDUCE_AXIS or inner
        if hr and n not in targets:
            cons = consumers[n]
            expands = any(c.op is Ops.VIEW and not _is_reshape_only(c.arg, shape_of(n)) for c in cons)
            if len(cons) > 1 or expands:
                targets.add(n)
        has_reduce[n] = hr and n not in targets
    return [n for n in nodes if n in targets]


def _build_ast(target: UOp, target_bufs: dict[UOp, UOp]) -> tuple[UOp, list[UOp]]:
    """The kernel AST for ``target`` and the BUFFER nodes it reads (output first)."""
    params: list[UOp] = [target_bufs[target]]
    globals_: dict[UOp, UOp] = {}
    memo: dict[UOp, UOp] = {}

    def define_global(buf: UOp) -> UOp:
        if buf not in globals_:
            globals_[buf] = UOp(Ops.DEFINE_GLOBAL, PtrDType(buf.dtype), (), (len(params), buf.arg[2]))  # type: ignore[arg-type]
            params.append(buf)
        return globals_[buf]

    def is_input(n: UOp) -> bool:
        return (n is not target and n in target_bufs) or n.op in (Ops.BUFFER, Ops.CONST)

    # iterative (deep graphs must not hit the recursion limit), sources before users
    for n in toposort([target], stop=is_input):
        if n is not target and n in target_bufs:
            buf = target_bufs[n]
            g = define_global(buf)
            out = UOp(Ops.VIEW, n.dtype, (UOp(Ops.LOAD, n.dtype, (g,)),),
                      ShapeTracker.from_shape((buf.arg[2],)).reshape(shape_of(n)))
        elif n.op is Ops.BUFFER:
            out = UOp(Ops.LOAD, n.dtype, (define_global(n),))
        elif n.op is Ops.VIEW:
            inner = memo[n.src[0]]
            if inner.op is Ops.VIEW:
                out = UOp(Ops.VIEW, n.dtype, (inner.src[0],), inner.arg + n.arg)
            else:
                out = UOp(Ops.VIEW, n.dtype, (inner,), n.arg)
        elif n.op is Ops.CONST:
            out = UOp(Ops.CONST, n.dtype, (), n.arg)
        elif n.op in (Ops.CONTIGUOUS, Ops.DETACH):
            out = memo[n.src[0]]
        elif n.op is Ops.COPY:
            raise AssertionError("a COPY inside a kernel must have been materialized")
        else:
            out = UOp(n.op, n.dtype, tuple(memo[s] for s in n.src), n.arg)
        memo[n] = out

    value = memo[target]
    out_shape = shape_of(target)
    out_g = UOp(Ops.DEFINE_GLOBAL, PtrDType(target.dtype), (), (0, prod(out_shape)))  # type: ignore[arg-type]
    store = UOp(Ops.STORE, None, (out_g, value), ShapeTracker.from_shape(out_shape))
    return UOp(Ops.SINK, None, (store,)), params


def create_schedule(roots: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Schedule everything needed to realize ``roots``.

    Returns the items in run order and a map from each original root (and each node that got
    its own buffer) to its realized replacement (a VIEW of a BUFFER). Nothing is recorded as
    realized here: after running the items, the caller passes the map to :func:`mark_realized`.
    """
    sub = _substitute_realized(roots)
    new_roots = [sub[r] for r in roots]
    targets = _targets(new_roots)
    target_bufs: dict[UOp, UOp] = {}
    schedule: list[ScheduleItem] = []
    for t in targets:
        size = prod(shape_of(t))
        if t.op is Ops.COPY:
            src = t.src[0]
            sb = base_of(src)
            src_buf = target_bufs.get(src) or target_bufs.get(sb) or sb
            out = new_buffer(device_of(t), size, t.dtype)  # type: ignore[arg-type]
            target_bufs[t] = out
            if size:
                schedule.append(ScheduleItem(UOp(Ops.COPY, t.dtype, (), size), (buffers[out], buffers[src_buf])))
            continue
        out = new_buffer(device_of(t), size, t.dtype)  # type: ignore[arg-type]
        target_bufs[t] = out
        if size == 0:
            continue
        ast, params = _build_ast(t, target_bufs)
        schedule.append(ScheduleItem(ast, tuple(buffers[p] for p in params)))
    becomes: dict[UOp, UOp] = {}
    for t, buf in target_bufs.items():
        becomes[t] = buffer_view(buf, shape_of(t))
    for orig, new in zip(roots, new_roots):
        becomes[orig] = _replacement(new, target_bufs)
    return schedule, becomes


def mark_realized(becomes: dict[UOp, UOp]) -> None:
    """Remember that these nodes now live in buffers (call only after their schedule ran)."""
    for node, view in becomes.items():
        if node.op is not Ops.BUFFER and not (node.op is Ops.VIEW and node.src[0].op is Ops.BUFFER):
            realized[node] = view


def _replacement(root: UOp, target_bufs: dict[UOp, UOp]) -> UOp:
    if root in target_bufs:
        return buffer_view(target_bufs[root], shape_of(root))
    b = base_of(root)
    if b.op is Ops.BUFFER:
        return root
    bv = buffer_view(target_bufs[b], shape_of(b))
    return UOp(Ops.VIEW, root.dtype, (bv.src[0],), bv.arg + root.arg)
