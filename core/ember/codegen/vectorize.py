"""Vector loads and stores: the lanes of an upcast tile that touch neighbouring elements, moved together.

Lowering gives each copy of an upcast (or unrolled) axis its own LOAD and STORE, at indices that differ by
constants: ``base + 0, base + 1, ...``. Where the axis is contiguous in a buffer (stride 1), every element of a
run of ``n`` is touched, and ``base`` is provably a multiple of ``n``, the run is one aligned vector access:
a LOAD of ``dtype.vec(n)`` whose lanes the scalar users read through GEP, or a STORE of a VECTORIZE of the
``n`` values. A renderer says which widths it has for which dtypes (:attr:`ember.renderer.Renderer.vector_widths`);
one that declares none gets the scalar program unchanged.

Only what is certain is grouped: every lane of a run must be present (a vector never reads an element the
scalar program did not, so it stays within the buffer), loads must be ungated, stores share one gate, and the
index's alignment must follow from its terms (each variable term's coefficient a multiple of ``n``, the
constant too).

For a renderer that also declares :attr:`ember.renderer.Renderer.vector_alu`, n scalar copies of one float ALU op
over the lanes of vector values become one vector op, and n accumulators of one reduction one accumulator vector
(:func:`vectorize_alu`); a fused epilogue stored lane by lane can then be rolled into a loop over an array of the
accumulators (:mod:`ember.codegen.epilogue`, for renderers declaring ``epilogue_loop_min``).
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import cast

from ember.codegen.epilogue import roll_epilogues
from ember.dtype import DType, PtrDType, dtypes
from ember.ir.symbolic import split_terms, term_coeff
from ember.ir.uop import Ops, UOp, toposort


def _split_index(idx: UOp) -> tuple[UOp | None, int]:
    """``idx`` as (variable part, constant offset): the form lowering gives the copies of an upcast tile, which
    share the variable part (one node) and differ in the constant."""
    if idx.op is Ops.CONST:
        return None, idx.arg
    if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST:
        return idx.src[0], idx.src[1].arg
    return idx, 0


def _multiple_of(x: UOp | None, n: int) -> bool:
    """Whether every value of the index expression ``x`` is a multiple of ``n`` (from its terms' coefficients)."""
    if x is None:
        return True
    for t in split_terms(x):
        var, coeff = term_coeff(t)
        if coeff % n:
            return False
        if var is not None and var.dtype is not None and getattr(var.dtype, "kind", "f") not in "iu":
            return False
    return True


def _runs(offsets: set[int], base: UOp | None, widths: tuple[int, ...]) -> list[tuple[int, int]]:
    """(first offset, width) of each aligned run of ``offsets`` to access as one vector: the widest first, each
    offset in at most one run."""
    runs: list[tuple[int, int]] = []
    left = set(offsets)
    for n in sorted(widths, reverse=True):
        if n < 2 or not _multiple_of(base, n):
            continue
        for c in sorted(left):
            if c % n == 0 and all(c + k in left for k in range(n)):
                runs.append((c, n))
                left.difference_update(range(c, c + n))
    return runs


def _element(u: UOp) -> DType | None:
    """The element dtype of the global buffer ``u`` reads or writes, None for anything else."""
    buf = u.src[0]
    if buf.op is not Ops.DEFINE_GLOBAL or not isinstance(buf.dtype, PtrDType):
        return None
    return buf.dtype.base


def vectorize_memory(sink: UOp, widths: Mapping[DType, tuple[int, ...]],
                     alu_ops: AbstractSet[Ops] = frozenset(), epilogue_min: int = 0) -> UOp:
    """``sink`` (a lowered kernel, see :func:`ember.codegen.lowerer.lower_ast`) with each aligned run of
    neighbouring global loads and stores (see the module docstring) made one vector access of a width in
    ``widths[element dtype]``; with ``alu_ops``, the lanes' float arithmetic and reductions computed on vectors
    too (see :func:`vectorize_alu`); with ``epilogue_min``, a fused epilogue of that many scalar stores or more
    rolled into a loop (see :func:`ember.codegen.epilogue.roll_epilogues`)."""
    if widths:
        sink, scalar_of = _vectorize_loads(sink, widths)
        if alu_ops:
            # with vector arithmetic, the vector accesses kept are those it reads or writes (or a copy's): a load
            # whose lanes only scalar ops read, or a store of lanes computed one by one, stays scalar, as the
            # target's own loop vectorizer regroups scalar work best
            sink = _scalar_loads(vectorize_alu(sink, alu_ops), scalar_of)
    if epilogue_min:
        # a tile stored as its own vectors stays so; lanes stored one by one (or through shuffles) may be a loop
        if widths:
            sink = _vectorize_stores(sink, widths, gathers=False, shuffles=False)
        sink = roll_epilogues(sink, epilogue_min)
    return _vectorize_stores(sink, widths, gathers=not alu_ops) if widths else sink


def _scalar_loads(sink: UOp, scalar_of: dict[UOp, UOp]) -> UOp:
    """``sink`` with each vector load that only GEPs read given back as the scalar loads it replaced
    (``scalar_of``: each lane's GEP -> its load)."""
    nodes = toposort([sink])
    vector_use: set[UOp] = set()
    for n in nodes:
        if n.op is not Ops.GEP:
            vector_use.update(s for s in n.src if s.op is Ops.LOAD and s.dtype.count > 1)
    if not any(n in scalar_of and n.src[0] not in vector_use for n in nodes):
        return sink
    done: dict[UOp, UOp] = {}
    for n in nodes:
        if n in scalar_of and n.src[0] not in vector_use:
            done[n] = scalar_of[n]
            continue
        src = tuple(done.get(s, s) for s in n.src)
        done[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
    return done[sink]


def _vectorize_loads(sink: UOp, widths: Mapping[DType, tuple[int, ...]]) -> tuple[UOp, dict[UOp, UOp]]:
    """``sink`` with each aligned run of neighbouring ungated global loads made one vector load whose lanes its
    users read through GEP, and each such GEP's scalar load."""
    nodes = toposort([sink])
    # loads: (buffer, variable part) -> offset -> load
    load_groups: dict[tuple[UOp, UOp | None], dict[int, UOp]] = {}
    for n in nodes:
        if n.op is Ops.LOAD and len(n.src) == 2 and (dt := _element(n)) is not None and n.dtype == dt \
                and widths.get(dt):
            base, off = _split_index(n.src[1])
            load_groups.setdefault((n.src[0], base), {})[off] = n
    replace: dict[UOp, UOp] = {}
    for (buf, base), by_off in load_groups.items():
        dt = buf.pointer_dtype.base
        for first, n in _runs(set(by_off), base, widths[dt]):
            vload = UOp(Ops.LOAD, dt.vec(n), (buf, by_off[first].src[1]))
            for k in range(n):
                replace[by_off[first + k]] = UOp(Ops.GEP, dt, (vload,), k)
    if not replace:
        return sink, {}
    done: dict[UOp, UOp] = {}
    for n in nodes:
        if n in replace:
            done[n] = replace[n]
            continue
        src = tuple(done.get(s, s) for s in n.src)
        done[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
    return done[sink], {gep: load for load, gep in replace.items()}


def _vectorize_stores(sink: UOp, widths: Mapping[DType, tuple[int, ...]], gathers: bool = True,
                      shuffles: bool = True) -> UOp:
    """``sink`` with each aligned run of neighbouring global stores sharing one gate made one vector store;
    without ``gathers``, only runs whose values are lanes of vectors (a tile stored across its vectors: a shuffle);
    without ``shuffles`` either, only runs whose values are one vector's lanes in order (a copy)."""
    stores = list(sink.src)
    # stores: (buffer, variable part, gate) -> offset -> position in the sink
    store_groups: dict[tuple[UOp, UOp | None, UOp | None], dict[int, int]] = {}
    for i, s in enumerate(stores):
        if s.op is Ops.STORE and (dt := _element(s)) is not None and s.src[2].dtype == dt and widths.get(dt):
            base, off = _split_index(s.src[1])
            group = store_groups.setdefault((s.src[0], base, s.src[3] if len(s.src) > 3 else None), {})
            if off not in group:  # (two stores of one element are left as they are, in their order)
                group[off] = i
    drop: set[int] = set()
    for (buf, base, gate), positions in store_groups.items():
        dt = buf.pointer_dtype.base
        for first, n in _runs(set(positions), base, widths[dt]):
            at = [positions[first + k] for k in range(n)]
            vals = tuple(stores[i].src[2] for i in at)
            value = _vectorized(vals, dt.vec(n))
            if not gathers and value.op is Ops.VECTORIZE and not all(v.op is Ops.GEP for v in vals):
                continue
            if not shuffles and value.op is Ops.VECTORIZE:
                continue
            srcs = (buf, stores[at[0]].src[1], value) + ((gate,) if gate is not None else ())
            stores[min(at)] = UOp(Ops.STORE, None, srcs)
            drop.update(i for i in at if i != min(at))
    if not drop:
        return sink
    return UOp(Ops.SINK, sink.dtype, tuple(s for i, s in enumerate(stores) if i not in drop), sink.arg)


#: the float ops a vector may compute, each lane exactly as the scalar op would (C's vector extension and
#: OpenCL's vector operators are lane-wise IEEE arithmetic; MAX keeps ember's nan rule, see
#: :meth:`ember.renderer.cstyle.CStyleRenderer.render_vector_max`)
VECTOR_FLOAT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX})
_FLOATS = (dtypes.float32, dtypes.float64)


def vectorize_alu(sink: UOp, ops: AbstractSet[Ops]) -> UOp:
    """``sink`` (its loads vectorized) with the lanes' arithmetic done on vectors: ``n`` float ops of one kind
    (in ``ops``), one per lane of a vector, whose other sources are lane ``k`` of another such vector or one node
    shared by all (broadcast), become one vector op; ``n`` REDUCEs of an op in ``ops`` over the same loops become
    one vector REDUCE (an accumulator vector). Each lane computes what its scalar op did, in the same order, so
    results are bit for bit those of the scalar program. Users outside a group read its lanes through GEP."""
    nodes = toposort([sink])
    users: dict[UOp, list[UOp]] = {}
    for n in nodes:
        for s in dict.fromkeys(n.src):
            users.setdefault(s, []).append(n)
    # a pack: n scalar nodes, lane k the k-th; a load pack's vector is the load, a group's is built below
    lane: dict[UOp, tuple[int, int]] = {}
    packs: list[tuple[UOp, ...]] = []
    pack_vector: dict[int, UOp] = {}
    # each group's sources as its signature named them when it was made
    sources: dict[int, tuple[tuple[str, object], ...]] = {}
    for n in nodes:
        if n.op is Ops.LOAD and isinstance(n.dtype, DType) and n.dtype.count > 1:
            gs = {u.arg: u for u in users.get(n, []) if u.op is Ops.GEP}
            if len(gs) == n.dtype.count:
                pack_vector[len(packs)] = n
                lane.update((gs[k], (len(packs), k)) for k in range(n.dtype.count))
                packs.append(tuple(gs[k] for k in range(n.dtype.count)))

    def sig(u: UOp, k: int, n: int) -> tuple:
        # a source is lane k of a pack of n lanes (named by the pack) or the same node in every lane (a broadcast;
        # a lane of a vector of another width is one too: an outer product's other factor)
        return (u.op, u.dtype, u.arg, tuple(("L", lane[s][0]) if s in lane and lane[s][1] == k
                                            and len(packs[lane[s][0]]) == n else ("S", s) for s in u.src))

    def groupable(u: UOp) -> bool:
        if u in lane or u.dtype not in _FLOATS:
            return False
        if u.op is not Ops.REDUCE:
            return u.op in ops
        # an accumulator vector is updated by its reduction's op (a product's by MUL); a reduction split over cores
        # (a "thread" loop) keeps scalars, which every OpenMP-style combiner handles
        return u.arg in ops and not any(r.op is Ops.RANGE and r.arg[1] == "thread" for r in u.src[1:])

    # the widest packs first: an op reading lanes of two vectors (an outer product) joins the wider one's group
    work = [(-len(p), i) for i, p in enumerate(packs)]
    heapq.heapify(work)
    while work:
        members = packs[heapq.heappop(work)[1]]
        n = len(members)
        for u0 in users.get(members[0], []):
            if not groupable(u0):
                continue
            want = sig(u0, 0, n)
            group = [u0]
            for k in range(1, n):
                found = [u for u in users.get(members[k], []) if groupable(u) and sig(u, k, n) == want]
                if len(found) != 1 or found[0] in group:
                    break
                group.append(found[0])
            if len(group) != n:
                continue
            if u0.op is Ops.REDUCE and _combined(group, users):
                # an unrolled reduction: its accumulators are one result's partial sums, combined after the loop;
                # left as scalars (a single accumulator vector would be one dependency chain; the scalar
                # accumulators are what a target's own loop vectorizer splits into several)
                continue
            lane.update((u, (len(packs), k)) for k, u in enumerate(group))
            sources[len(packs)] = want[3]
            heapq.heappush(work, (-n, len(packs)))
            packs.append(tuple(group))
    if len(packs) == len(pack_vector):
        return sink

    done: dict[UOp, UOp] = {}

    def vector(p: int) -> UOp:
        if p in pack_vector:
            return pack_vector[p]
        u0, n = packs[p][0], len(packs[p])
        srcs = []
        for (kind, q), s in zip(sources[p], u0.src):
            if kind == "L":
                srcs.append(vector(q))  # type: ignore[arg-type]  # noqa: F821 (deleted after use)
            elif u0.op is Ops.REDUCE and s.op is Ops.RANGE:
                srcs.append(done.get(s, s))
            else:
                srcs.append(_broadcast(done.get(s, s), n))
        pack_vector[p] = UOp(u0.op, cast(DType, u0.dtype).vec(n), tuple(srcs), u0.arg)
        return pack_vector[p]

    for n in nodes:
        if n in lane and n.op is not Ops.GEP:
            p, k = lane[n]
            done[n] = UOp(Ops.GEP, n.dtype, (vector(p),), k)
            continue
        src = tuple(done.get(s, s) for s in n.src)
        done[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
    del vector  # a recursive closure refers to itself: left alone it is garbage only the cyclic collector frees
    return done[sink]


def _combined(group: list[UOp], users: dict[UOp, list[UOp]]) -> bool:
    """Whether some node reads two members of ``group`` (the members are parts of one value)."""
    members = set(group)
    return any(sum(s in members for s in u.src) > 1 for m in group for u in users.get(m, []))


def _broadcast(s: UOp, n: int) -> UOp:
    """The vector of ``n`` copies of the scalar ``s``."""
    return UOp(Ops.VECTORIZE, cast(DType, s.dtype).vec(n), (s,) * n)


def _vectorized(vals: tuple[UOp, ...], dt: DType) -> UOp:
    """The vector of ``vals``: the vector they were read from when they are its lanes in order (a copy), else a
    VECTORIZE."""
    first = vals[0]
    if first.op is Ops.GEP and first.src[0].dtype == dt and \
            all(v.op is Ops.GEP and v.src[0] is first.src[0] and v.arg == k for k, v in enumerate(vals)):
        return first.src[0]
    return UOp(Ops.VECTORIZE, dt, vals)


__all__ = ["VECTOR_FLOAT_OPS", "vectorize_alu", "vectorize_memory"]
