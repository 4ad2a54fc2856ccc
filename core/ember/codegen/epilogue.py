"""A fused epilogue as a loop: the stores after a register tile's reduction, one per lane, rolled into loops.

After the reduction of a register tile, a kernel computes each output from its accumulator (a bias added, a relu
mask, an SGD update) and stores it. Where those ops are not vector ops of the target (a relu's mask is a compare
and a select), or the tile's vectors run across the output (a transposed weight gradient), every lane is its own
scalar store: the same few ops hundreds of times, which a C compiler spends longer on than on the tile itself.

:func:`roll_epilogues` finds a group of such stores whose value trees are the same but for

* which accumulator lane they read (a GEP of a vector, or a scalar REDUCE), and
* the constant offsets of their loads' and their store's indices,

and where each of these moves affinely with the lane's place in the tile. The group becomes one STORE inside
new "loop" RANGEs: the accumulators go into a private array (DEFINE_REG, filled once after the reduction), the
loop body reads its lane from the array at an index affine in the loop variables, and every load and the store
index their buffer at ``base + (affine in the loop variables)``. Each lane computes the same ops on the same
values as before, so results are bit for bit those of the unrolled program.

The stores of a group may then run in another order: a group is rolled only when its lanes store distinct
elements and nothing in the kernel reads a buffer the group writes except each lane's own element (an in-place
update).
"""
from __future__ import annotations

from typing import Any

from ember.dtype import DType, PtrDType
from ember.ir.uop import Ops, UOp, toposort

#: the parameter kinds of a store's template: an accumulator lane, or the constant offset of an index
_SLOT, _OFF = 0, 1


def _split_index(idx: UOp) -> tuple[UOp | None, int]:
    """``idx`` as (variable part, constant offset): the copies of an upcast tile share the variable part."""
    if idx.op is Ops.CONST:
        return None, idx.arg
    if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST:
        return idx.src[0], idx.src[1].arg
    return idx, 0


#: the most nodes one store's template walks: an epilogue is a few ops per lane (a longer tree is left as it is)
_MAX_TEMPLATE = 256


class _TooLarge(Exception):
    """A store whose tree is longer than an epilogue's."""


class _Template:
    """One store's tree as a structural key, with what may differ between the lanes of a tile pulled out as
    parameters: ``params[k]`` is ``(_SLOT, (vector, lane))`` or ``(_OFF, offset)``."""

    def __init__(self, store: UOp):
        self.params: list[tuple[int, Any]] = []
        self.nodes: list[UOp] = []  # the node each parameter was taken from
        self.loads: list[tuple[UOp, UOp | None, int]] = []  # (buffer, base, offset) of each load with an offset
        self._seen: dict[UOp, int] = {}
        self.ops = 0
        base, off = _split_index(store.src[1])
        self.store = (store.src[0], base, off)
        self._param(_OFF, off, store)
        gate = self.walk(store.src[3]) if len(store.src) > 3 else None
        self.key = ("store", store.src[0], base, gate, self.walk(store.src[2]))

    def _param(self, kind: int, value: Any, node: UOp) -> None:
        self.params.append((kind, value))
        self.nodes.append(node)

    def walk(self, u: UOp) -> tuple:
        if u in self._seen:  # a node used twice is one value: the key says so (the lanes must share alike)
            return ("ref", self._seen[u])
        self._seen[u] = len(self._seen)
        if len(self._seen) > _MAX_TEMPLATE:
            raise _TooLarge
        if u.op is Ops.GEP and isinstance(u.src[0].dtype, DType) and u.src[0].dtype.count > 1:
            self._param(_SLOT, (u.src[0], u.arg), u)
            return ("slot", u.dtype)
        if u.op is Ops.REDUCE:
            self._param(_SLOT, (u, 0), u)
            return ("slot", u.dtype)
        if u.op is Ops.LOAD and len(u.src) == 2 and u.src[0].op is Ops.DEFINE_GLOBAL:
            base, off = _split_index(u.src[1])
            self._param(_OFF, off, u)
            self.loads.append((u.src[0], base, off))
            return ("load", u.dtype, u.src[0], base)
        if u.op is Ops.CONST:
            return ("const", u.dtype, u.arg)
        if not u.src:
            return ("id", u)
        self.ops += 1
        return (u.op, u.dtype, u.arg, tuple(self.walk(s) for s in u.src))

    def worth_a_loop(self) -> bool:
        """Whether the store reads an accumulator lane of a vector, or computes from a scalar accumulator (a scalar
        accumulator stored as it is is one statement: the loop would only copy it through the array)."""
        return any(kind == _SLOT and n.op is Ops.GEP for (kind, _), n in zip(self.params, self.nodes)) or \
            (self.ops > 0 and any(kind == _SLOT for kind, _ in self.params))


def _digits(seqs: list[list[int]], n: int) -> list[tuple[int, int]] | None:
    """A mixed radix for ``0 .. n-1`` in which every sequence of ``seqs`` (one value per position) is affine:
    ``(extent, step)`` per digit, innermost first (position ``i`` has digit ``i // step % extent``), or None."""
    digits: list[tuple[int, int]] = []
    step = 1
    while step < n:
        left = n // step
        # how far every sequence moves by the same step per position (the widest digit that fits divides ``left``)
        moves = [s[step] - s[0] for s in seqs]
        run = 2
        while run < left and all(s[step * run] - s[0] == run * m for s, m in zip(seqs, moves)):
            run += 1
        found = next((e for e in range(run, 1, -1) if left % e == 0), None)
        if found is None:
            return None
        digits.append((found, step))
        step *= found
    for s in seqs:
        strides = [s[st] - s[0] for _, st in digits]
        if any(s[i] != s[0] + sum(i // st % e * k for (e, st), k in zip(digits, strides)) for i in range(n)):
            return None
    return digits


def _rollable_group(members: list[_Template], written: dict[UOp, set[UOp]]) -> bool:
    """Whether the stores of ``members`` may run in any order: distinct elements, and every load of a buffer
    some store of the kernel writes is a member's load of its own element."""
    if len({t.store[2] for t in members}) != len(members):
        return False
    for t in members:
        for buf, base, off in t.loads:
            if buf in written and (buf, base, off) != t.store:
                return False
    return True


def roll_epilogues(sink: UOp, min_stores: int) -> UOp:
    """``sink`` (lowered, vectorized) with each group of at least ``min_stores`` scalar stores that compute the same
    ops from different accumulator lanes (see the module docstring) made one store inside loops over the lanes."""
    if min_stores <= 0:
        return sink
    stores = list(sink.src)
    if len(stores) < min_stores:
        return sink
    groups: dict[tuple, list[tuple[int, _Template]]] = {}
    for i, s in enumerate(stores):
        if s.op is not Ops.STORE or s.src[0].op is not Ops.DEFINE_GLOBAL or not isinstance(s.src[2].dtype, DType) \
                or s.src[2].dtype.count != 1:
            continue
        try:
            t = _Template(s)
        except _TooLarge:
            continue
        if t.worth_a_loop():
            groups.setdefault(t.key, []).append((i, t))
    groups = {k: g for k, g in groups.items() if len(g) >= min_stores}
    if not groups:
        return sink
    nodes = toposort([sink])
    order_of = {n: i for i, n in enumerate(nodes)}
    # every load of a buffer some store writes (each must be a member's load of its own element)
    written: dict[UOp, set[UOp]] = {s.src[0]: set() for s in stores if s.op is Ops.STORE}
    for n in nodes:
        if n.op is Ops.LOAD and n.src[0] in written:
            written[n.src[0]].add(n)
    next_range = 1 + max((n.arg[0] for n in nodes if n.op is Ops.RANGE), default=-1)
    next_reg = sum(n.op is Ops.DEFINE_REG for n in nodes)
    drop: set[int] = set()
    for group in groups.values():
        rolled = _roll([t for _, t in group], stores, written, order_of, next_range, next_reg)
        if rolled is None:
            continue
        store, used = rolled
        next_range += used
        next_reg += 1
        at = [i for i, _ in group]
        stores[at[0]] = store
        drop.update(at[1:])
    if not drop:
        return sink
    return UOp(Ops.SINK, sink.dtype, tuple(s for i, s in enumerate(stores) if i not in drop), sink.arg)


def _roll(members: list[_Template], stores: list[UOp], written: dict[UOp, set[UOp]], order_of: dict[UOp, int],
          first_range: int, reg_id: int) -> tuple[UOp, int] | None:
    """The one store (inside new loops) that does what the stores of ``members`` did, and how many RANGE ids it
    took; None when the group is not an affine walk over the lanes or may not be reordered."""
    if not _rollable_group(members, written):
        return None
    # the buffer is written by these stores only (another store of an element would be ordered against them)
    buf = members[0].store[0]
    if sum(1 for t in members) != sum(1 for s in stores if s.op is Ops.STORE and s.src[0] is buf):
        return None
    # loads of written buffers must be the members' own (checked per template above); any other is a reader
    own = {n for t in members for n, (kind, _) in zip(t.nodes, t.params) if kind == _OFF and n.op is Ops.LOAD}
    if any(n not in own for loads in written.values() for n in loads if any(n.src[0] is t.store[0] for t in members)):
        return None
    nparams = len(members[0].params)
    varying = [k for k in range(nparams) if any(t.params[k] != members[0].params[k] for t in members)]
    slots = [k for k in varying if members[0].params[k][0] == _SLOT]
    if not slots:
        return None
    # the array: the vectors (or scalar accumulators) the lanes read, each whole, one scalar dtype
    vectors = list(dict.fromkeys(t.params[k][1][0] for t in members for k in slots))
    if len({v.dtype.scalar() for v in vectors}) != 1:
        return None
    elem = vectors[0].dtype.scalar()
    best: tuple[dict[UOp, int], list[_Template], list[tuple[int, int]]] | None = None
    # in order of first use, in the kernel's order, or with the vectors that continue a vector's walk of the
    # stored buffer next to it (a tile whose vectors run across the output): the one with the fewest loops
    candidates = [vectors, sorted(vectors, key=order_of.__getitem__)]
    stored_at = {t.params[slots[0]][1]: t.params[0][1] for t in members}
    n = vectors[0].dtype.count
    if n > 1 and (vectors[0], 0) in stored_at and (vectors[0], 1) in stored_at:
        span = abs(stored_at[(vectors[0], 1)] - stored_at[(vectors[0], 0)]) * n
        if span and all((v, 0) in stored_at for v in vectors):
            candidates.append(sorted(vectors, key=lambda v: (stored_at[(v, 0)] % span, stored_at[(v, 0)])))
    for vorder in candidates:
        where = {}
        size = 0
        for v in vorder:
            where[v] = size
            size += v.dtype.count
        # the lanes in the array's order (each vector's lanes together)
        order = sorted(members, key=lambda t: [*(_position(t, k, where) for k in slots), t.store[2]])
        digits = _digits([[_position(t, k, where) for t in order] for k in varying], len(order))
        if digits is not None and (best is None or len(digits) < len(best[2])):
            best = (where, order, digits)
    if best is None:
        return None
    where, order, digits = best
    seqs = [[_position(t, k, where) for t in order] for k in varying]
    strides = {k: [s[st] - s[0] for _, st in digits] for k, s in zip(varying, seqs)}
    # the innermost loop walks the stored buffer by the smallest step (one element: what the compiler vectorizes)
    store_steps = strides[0] if 0 in strides else [0] * len(digits)
    nest = sorted(range(len(digits)), key=lambda d: (store_steps[d] == 0, abs(store_steps[d])), reverse=True)
    idx_dt = members[0].store[1].dtype if members[0].store[1] is not None else None
    first = order[0]
    if idx_dt is None:
        idx_dt = first.nodes[0].src[1].dtype
    assert isinstance(idx_dt, DType)
    ranges: dict[int, UOp] = {}
    for j, d in enumerate(nest):
        ranges[d] = UOp(Ops.RANGE, idx_dt, (UOp.const(idx_dt, 0), UOp.const(idx_dt, digits[d][0])),
                        (first_range + j, "loop"))
    reg = UOp(Ops.DEFINE_REG, PtrDType(elem), tuple(where), (reg_id, size))

    def affine(start: UOp | None, c0: int, steps: list[int]) -> UOp:
        out = start
        for d in nest:
            if steps[d]:
                term = ranges[d] if steps[d] == 1 else ranges[d] * steps[d]
                out = term if out is None else out + term
        if out is None:
            return UOp.const(idx_dt, c0)
        return out + c0 if c0 else out

    replace: dict[int, UOp] = {}
    for k in varying:
        kind, value = first.params[k]
        node = first.nodes[k]
        if kind == _SLOT:
            replace[k] = UOp(Ops.LOAD, node.dtype, (reg, affine(None, _position(first, k, where), strides[k])))
        elif node.op is Ops.LOAD:
            base, off = _split_index(node.src[1])
            replace[k] = UOp(Ops.LOAD, node.dtype, (node.src[0], affine(base, off, strides[k])))
        else:  # the store's own index
            base, off = _split_index(node.src[1])
            replace[k] = affine(base, off, strides[k])
    return _rebuild(first, replace), len(nest)


def _position(t: _Template, k: int, where: dict[UOp, int]) -> int:
    """Parameter ``k`` of ``t`` as a number: an accumulator lane's place in the array, or an index offset."""
    kind, value = t.params[k]
    return where[value[0]] + value[1] if kind == _SLOT else value


def _rebuild(t: _Template, replace: dict[int, UOp]) -> UOp:
    """The store of template ``t`` with parameter ``k``'s node replaced by ``replace[k]`` (the store's own index
    is parameter 0), walking the tree in the template's order."""
    store = t.nodes[0]
    by_node = {t.nodes[k]: v for k, v in replace.items() if k != 0}
    done: dict[UOp, UOp] = {}

    def build(u: UOp) -> UOp:
        if u in done:
            return done[u]
        if u in by_node:
            out = by_node[u]
        elif u.op in (Ops.REDUCE, Ops.GEP) or not u.src:
            out = u
        else:
            src = tuple(build(s) for s in u.src)  # noqa: F821 (deleted after use, below)
            out = u if all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg)
        done[u] = out
        return out

    idx = replace.get(0, store.src[1])
    srcs = (store.src[0], idx, build(store.src[2])) + ((build(store.src[3]),) if len(store.src) > 3 else ())
    del build  # a recursive closure refers to itself: left alone it is garbage only the cyclic collector frees
    return UOp(Ops.STORE, store.dtype, srcs, store.arg)


__all__ = ["roll_epilogues"]
