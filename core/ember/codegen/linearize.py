"""Order an index-level UOp DAG into the linear program renderers consume.

Global loops open first and close last. Each REDUCE becomes an accumulator, a loop and an
update; anything a reduction's body needs that does not depend on the reduction's own loops
is emitted before the loop (loop-invariant hoisting), so loads and index math are not
recomputed per iteration.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ember.codegen.lowerer import reduce_identity
from ember.dtype import DType
from ember.ir.uop import Ops, UOp, toposort


def _range_sets(nodes: list[UOp]) -> dict[UOp, frozenset[UOp]]:
    """For each node, the loops its value depends on (a REDUCE hides its own loops)."""
    out: dict[UOp, frozenset[UOp]] = {}
    empty: frozenset[UOp] = frozenset()
    for n in nodes:
        if n.op is Ops.RANGE:
            out[n] = frozenset({n})
            continue
        # most nodes depend on the same loops as a source: share its set rather than building an equal one
        s = empty
        for x in n.src:
            o = out[x]
            if o is not s and o:
                s = o if not s else s | o
        if n.op is Ops.REDUCE:
            s = s - frozenset(n.src[1:])
        out[n] = s
    return out


def _range_bounds(nodes: list[UOp]) -> list[UOp]:
    """The computed loop bounds (symbolic sizes: expressions over DEFINE_VARs such as ``n + 1``) and what they
    are computed from, sources first: they come before every loop, so each loop reads its bound by name."""
    bounds = [b for n in nodes if n.op is Ops.RANGE for b in n.src if b.op not in (Ops.CONST, Ops.DEFINE_VAR)]
    return [n for n in toposort(bounds) if n.op not in (Ops.CONST, Ops.DEFINE_VAR)] if bounds else []


def linearize(sink: UOp) -> list[UOp]:
    """The linear program for a lowered kernel (see docs/contracts.md for its guarantees)."""
    nodes = toposort([sink])
    rsets = _range_sets(nodes)
    after_reduce: set[UOp] = set()
    for n in nodes:
        if n.op is Ops.REDUCE or any(x in after_reduce for x in n.src):
            after_reduce.add(n)
    program: list[UOp] = []
    program.extend(n for n in nodes if n.op is Ops.DEFINE_GLOBAL)
    # variables in launch order (``vals``): sorted by name, as the engine passes them
    program.extend(sorted((n for n in nodes if n.op is Ops.DEFINE_VAR), key=lambda v: v.arg[0]))
    for n in nodes:
        if n.op is Ops.REDUCE:
            nodes.append(UOp.const(n.dtype, reduce_identity(n.arg, n.dtype)))
    for n in dict.fromkeys(nodes):
        if n.op is Ops.CONST:
            program.append(n)
    program.extend(_range_bounds(nodes))
    global_ranges = sorted((n for n in nodes if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda r: r.arg[0])
    program.extend(global_ranges)

    reduces_by_ranges: dict[tuple[UOp, ...], list[UOp]] = {}
    for n in nodes:
        if n.op is Ops.REDUCE:
            reduces_by_ranges.setdefault(n.src[1:], []).append(n)
    sub: dict[UOp, UOp] = {n: n for n in program}
    scopes: list[set[UOp]] = [set(program)]
    # in how many open scopes each node is (visible while it is in one): scopes only grow until they close
    live: dict[UOp, int] = dict.fromkeys(scopes[0], 1)
    open_ranges: set[UOp] = set(global_ranges)
    acc_count = 0

    def visible(n: UOp) -> bool:
        return live.get(n, 0) > 0

    def add_to_scope(n: UOp) -> None:
        scope = scopes[-1]
        if n not in scope:
            scope.add(n)
            live[n] = live.get(n, 0) + 1

    def open_loops(loops: Sequence[UOp]) -> None:
        """Emit ``loops`` as a new scope: their variables are in scope and stand for themselves."""
        program.extend(loops)
        scopes.append(set())
        for r in loops:
            add_to_scope(r)
        sub.update((r, r) for r in loops)
        open_ranges.update(loops)

    def emit(n: UOp) -> UOp:
        nonlocal acc_count
        if live.get(n, 0) > 0 and n in sub:
            return sub[n]
        if n.op is Ops.REDUCE:
            ranges = n.src[1:]
            # reductions over the same loops (upcast copies) share one loop
            group = [m for m in reduces_by_ranges[ranges] if not (m in sub and visible(m))
                     and (rsets[m.src[0]] - frozenset(ranges)) <= open_ranges]
            if n not in group:
                group.append(n)
            for m in toposort([red.src[0] for red in group]):
                if m.op is not Ops.RANGE and rsets[m] <= open_ranges and not (m in sub and visible(m)):
                    emit(m)
            accs = []
            for red in group:
                dt = red.dtype
                assert isinstance(dt, DType)
                acc = UOp(Ops.DEFINE_ACC, dt, (UOp.const(dt, reduce_identity(red.arg, dt)),), acc_count)
                acc_count += 1
                program.append(acc)
                accs.append(acc)
            open_loops(ranges)
            for red, acc in zip(group, accs):
                v = emit(red.src[0])
                upd = UOp(red.arg, acc.dtype, (acc, v))
                program.append(upd)
                program.append(UOp(Ops.ASSIGN, acc.dtype, (acc, upd)))
            for r in reversed(ranges):
                program.append(UOp(Ops.ENDRANGE, None, (r,)))
            open_ranges.difference_update(ranges)
            for m in scopes.pop():
                live[m] -= 1
            for red, acc in zip(group, accs):
                sub[red] = acc
                add_to_scope(red)
            return sub[n]
        return emit_value(n)

    def source_order(n: UOp) -> list[int]:
        # operands holding a reduction first: what is computed after a loop from its result (a fused epilogue's
        # loads) then follows the loop instead of staying live across it, and stays in one regular group with
        # its copies (a register tile's epilogue the compiler can vectorize); otherwise the sources' own order
        srcs = n.src
        if len(srcs) > 1 and any(x in after_reduce for x in srcs) and not all(x in after_reduce for x in srcs):
            return [i for i, _ in sorted(enumerate(srcs), key=lambda p: p[1] not in after_reduce)]
        return list(range(len(srcs)))

    def emit_value(root: UOp) -> UOp:
        """``emit`` of a node that is no REDUCE: its sources first (each in :func:`source_order`), walked with a
        stack rather than recursion, so a chain of any length is linearized (only a REDUCE recurses)."""
        # [node, its source order, the position in it, its sources emitted so far (by index)]
        stack: list[list[Any]] = [[root, source_order(root), 0, {}]]
        while stack:
            frame = stack[-1]
            n, order, done = frame[0], frame[1], frame[3]
            descended = False
            while frame[2] < len(order):
                i = order[frame[2]]
                s = n.src[i]
                if live.get(s, 0) > 0 and s in sub:  # (a visible source is emit's first answer)
                    done[i] = sub[s]
                elif s.op is Ops.REDUCE:
                    done[i] = emit(s)
                else:
                    stack.append([s, source_order(s), 0, {}])
                    descended = True
                    break
                frame[2] += 1
            if descended:
                continue
            stack.pop()
            srcs = n.src
            new_src = tuple(done[i] for i in range(len(srcs)))
            new = n if new_src == srcs else UOp(n.op, n.dtype, new_src, n.arg)  # UOps compare by identity
            program.append(new)
            sub[n] = new
            add_to_scope(n)
            if stack:
                parent = stack[-1]
                parent[3][parent[1][parent[2]]] = new
                parent[2] += 1
        return new

    def emit_looped(store: UOp, loops: list[UOp]) -> None:
        """A store inside "loop" RANGEs (a rolled epilogue, see ember.codegen.epilogue): what it needs that does
        not depend on them is emitted before the loops (in the order the store reads it), then the loops."""
        stack = [store]
        hoist: list[UOp] = []
        seen: set[UOp] = set()
        while stack:
            n = stack.pop()
            if n in seen or (n in sub and visible(n)) or n.op is Ops.RANGE:
                continue
            seen.add(n)
            if rsets[n] <= open_ranges:
                hoist.append(n)
            else:
                stack.extend(n.src[i] for i in reversed(source_order(n)))
        for n in hoist:
            emit(n)
        open_loops(loops)
        emit(store)
        for r in reversed(loops):
            program.append(UOp(Ops.ENDRANGE, None, (r,)))
        open_ranges.difference_update(loops)
        for m in scopes.pop():
            live[m] -= 1

    for store in sink.src:
        loops = sorted((r for r in rsets[store] if r.arg[1] == "loop"), key=lambda r: r.arg[0])
        if loops:
            emit_looped(store, loops)
        else:
            emit(store)
    emit_looped = None  # type: ignore[assignment]
    # a recursive closure holds itself, and with it the kernel's tables: unbound now, they go with the reference
    # counts (left to the cyclic collector, each collection of a cold start walked every kernel's again)
    emit = None  # type: ignore[assignment]
    for r in reversed(global_ranges):
        program.append(UOp(Ops.ENDRANGE, None, (r,)))
    program.append(UOp(Ops.SINK, None, ()))
    return program
