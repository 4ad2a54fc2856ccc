"""The scheduler: cut the lazy tensor graph into kernels.

Fusion rules (each is tested):

1. Elementwise ops and movement ops fuse freely: views are pushed down to the loads, so a
   chain of elementwise ops on any views of any inputs is one kernel.
2. An elementwise subgraph feeding a reduction fuses into the reduction's kernel, and
   elementwise ops after a reduction fuse into it too while the shape only changes by reshape.
3. A subgraph that contains a reduction is materialized when it is used more than once, or
   through a view that is not a plain reshape (an expand, permute, pad ...): fusing it there
   would redo the reduction per element.
4. An elementwise subgraph with a transcendental op (exp, log, sin, sqrt, pow) is materialized when a
   view expands it so that fused, it would be recomputed RECOMPUTE_MIN times or more beyond its own
   size (a softmax gradient read by the next layer's weight gradient: an exp per multiply-add).
5. Outputs, CONTIGUOUS, COPY and ASSIGN are always materialized.
6. A reduction far longer than its output is wide (a weight gradient summed over a batch) is split in two:
   partial results over blocks of its outermost reduce axis, stored, then combined. Each block's inputs are
   small enough to stay in the caches while every output of the block is computed from them; in one kernel
   every output tile streams the whole input from memory again.
7. A float sum longer than ACCUMULATE_MAX per output is cut the same way, again and again, until no kernel adds up
   more than ACCUMULATE_MAX values into one result: a tree of partial sums, whose top adds at most
   SPLIT_REDUCE_MAX partials (a float32 accumulator stops growing at 2**24, and its rounding error grows with
   the length of its chain). A reduction of a constant folds to its value (value times count for a sum,
   computed in float64 then rounded), with no kernel; so does a sum or max of a value that does not change along
   the reduced axes (a broadcast of realized data): the value read once, times the count for a sum.
8. A kernel is bounded: a chain of more than MAX_FUSED_DEPTH operations, or a kernel reading more than
   MAX_KERNEL_INPUTS buffers, is cut by storing intermediate results (a chain of 100,000 adds, a sum or
   concatenation of thousands of tensors), so no kernel is a function its compiler takes minutes over.
9. An elementwise value that reads SHARED_MIN_INPUTS buffers or more, holding SHARED_MIN_FOOTPRINT times its
   size or more, and would be computed, fused, in two or more places, at least one of them a reduction (a
   max-pool and relu gradient read by every sum of a BatchNorm backward and by its input gradient), is stored
   once: each place then loads one buffer instead of all of them and redoes none of the arithmetic. A split
   reduction (rule 6) reads such a value through its view.

``ASSIGN(target, value)`` writes ``value`` into the existing buffer behind ``target`` (a view of a
BUFFER) instead of a new one. Its kernel runs after every kernel of the same schedule that reads
the buffer's old value, and a value that reads the buffer at other positions than the ones it
writes is computed into a temporary first, so an update never sees itself half-done.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ember.device.registry import Device
from ember.dtype import DType, PtrDType, dtypes, truncate
from ember.helpers import prod
from ember.ir import lazy
from ember.ir.lazy import base_of, buffer_view, buffers, constant_along, device_of, new_buffer, realized, shape_of
from ember.ir.multi import lower
from ember.ir.shapetracker import ShapeTracker, strides_for_shape
from ember.ir.symbolic import sint_max, sprod
from ember.ir.uop import GroupOp, Ops, UOp, toposort


@dataclass(frozen=True)
class ScheduleItem:
    """One kernel (or copy): ``ast`` says what to compute, ``bufs`` which buffers (outputs first),
    ``var_vals`` the values of the symbolic variables the kernel takes (by name)."""

    ast: UOp
    bufs: tuple[Any, ...]
    var_vals: tuple[tuple[str, int], ...] = ()


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


#: ops costly enough that an elementwise subgraph holding one is computed once, not once per expanded copy
COSTLY_OPS = frozenset({Ops.EXP, Ops.EXP2, Ops.LOG, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW})
#: how many redundant evaluations of a costly subgraph an expand of it may cause before the subgraph gets a
#: kernel of its own: that kernel costs a launch (a few microseconds), an exp a few nanoseconds a copy. A
#: log-softmax's log of 256 row sums read by 10 classes stays fused; a 256 x 10 softmax gradient read by a
#: 10 x 512 weight gradient (1.3 M copies: 860 us fused, 40 us apart) does not
RECOMPUTE_MIN = 1 << 14


def _expands(view: UOp, src_shape: tuple[int, ...]) -> bool:
    """Whether ``view`` repeats the elements of its source (of ``src_shape``) RECOMPUTE_MIN times or more: it
    broadcasts (a stride 0 along a dim longer than 1; a pad alone adds zeros, not copies) and is that much larger."""
    size, src_size = view.arg.size, sprod(src_shape)
    if not isinstance(size, int) or not isinstance(src_size, int):  # symbolic: no count to compare
        return False
    broadcasts = any(isinstance(st, int) and st == 0 and isinstance(n, int) and n > 1
                     for v in view.arg.views for n, st in zip(v.shape, v.strides))
    return broadcasts and size - src_size >= RECOMPUTE_MIN


#: a reduction whose input is at least this many times larger than its output (of more than one element: a full
#: reduction is split across the cores by the codegen's THREAD) is split in two kernels (fusion rule 6)
SPLIT_REDUCE_RATIO = 32768
#: the most blocks a split reduction's outermost reduce axis is cut into (partial results per output)
SPLIT_REDUCE_MAX = 256


def _split_reductions(roots: list[UOp], shared: set[UOp] | None = None) -> list[UOp]:
    """``roots`` with every long reduction split in two (fusion rule 6; see :func:`_split_reduce`). The values
    inside a split reduction's input that fusion rule 9 stores are seen through the split's view, not rebuilt
    under it (which would make a second copy of the value, computed again wherever the first is read); they are
    added to ``shared``, to be stored."""
    memo: dict[UOp, UOp] = {}
    order = toposort(roots, stop=lambda u: u.op is Ops.BUFFER)
    consumers: dict[UOp, list[UOp]] = {}
    for n in order:
        for s in n.src:
            consumers.setdefault(s, []).append(n)
    reads: dict[UOp, frozenset[UOp]] = {}
    for n in order:
        new_src = tuple(memo[s] for s in n.src)
        new = n if all(a is b for a, b in zip(new_src, n.src)) else UOp(n.op, n.dtype, new_src, n.arg)
        if new.op is Ops.REDUCE_AXIS:
            def keep(n: UOp = n) -> frozenset[UOp]:
                kept = frozenset(memo[u] for u in _shared_inside(n, consumers, reads))
                if shared is not None:
                    shared.update(kept)
                return kept
            new = _fold_const_reduce(new) or _fold_broadcast_reduce(new) or _split_reduce(new, keep=keep) or new
        elif new.op is Ops.VIEW and new.src[0].op is Ops.VIEW and new.src[0].src[0].op is not Ops.CONST:
            new = UOp(Ops.VIEW, new.dtype, new.src[0].src, new.src[0].arg + new.arg)  # a max folded to a view
        memo[n] = new
    # a computed root folded to a view of a buffer it reads (a max of a broadcast) still gets a buffer of its own
    return [UOp(Ops.CONTIGUOUS, memo[r].dtype, (memo[r],))
            if base_of(memo[r]).op is Ops.BUFFER and base_of(r).op is not Ops.BUFFER else memo[r] for r in roots]


def _shared_inside(r: UOp, consumers: dict[UOp, list[UOp]], reads: dict[UOp, frozenset[UOp]]) -> list[UOp]:
    """The elementwise values in the REDUCE_AXIS ``r``'s fused input that are also read outside it and read
    enough to be worth storing (fusion rule 9 stores them once). ``reads`` memoizes :func:`_leaf_reads`."""
    inside = toposort([r.src[0]], stop=lambda u: u.op not in GroupOp.Elementwise and u.op is not Ops.DETACH)
    within = set(inside)
    return [u for u in inside if u.op in GroupOp.Elementwise
            and any(c is not r and c not in within for c in consumers.get(u, ()))
            and _worth_storing(u, _leaf_reads(u, consumers, reads))]


def _leaf_reads(u: UOp, consumers: dict[UOp, list[UOp]], memo: dict[UOp, frozenset[UOp]]) -> frozenset[UOp]:
    """What the elementwise value ``u`` is computed from, through its views: BUFFER nodes, computed values that
    are not elementwise (reductions, copies ...) and the elementwise values read more than once that are stored
    for reading enough (:func:`_worth_storing`); constants are not counted."""
    passes = GroupOp.Elementwise | {Ops.VIEW, Ops.DETACH}

    def read_as(s: UOp) -> frozenset[UOp]:
        stored = s.op in GroupOp.Elementwise and len(consumers.get(s, ())) > 1 and _worth_storing(s, memo[s])
        return frozenset((s,)) if stored else memo[s]

    for n in toposort([u], stop=lambda x: x in memo or x.op not in passes):
        if n in memo:
            continue
        if n.op in (Ops.CONST, Ops.DEVICE):
            memo[n] = frozenset()
        elif n.op in passes:
            memo[n] = frozenset().union(*(read_as(s) for s in n.src))
        else:
            memo[n] = frozenset((n,))
    return memo[u]


def _split_reduce(r: UOp, tree_only: bool = False, acc: DType | None = None,
                  keep: Any = None) -> UOp | None:
    """The REDUCE_AXIS ``r`` as two: one over blocks of one of its reduce axes (the block index an axis of its
    output, first, so its kernel computes all outputs of one block before the next), stored, and one over the
    blocks. None when ``r`` is short enough to stay whole. A float sum still longer than ACCUMULATE_MAX per
    output after one cut is cut again (fusion rule 7), so every kernel's sums stay short; ``tree_only``: only
    that cut (a part of a split reduction is not split again for the caches: its blocks would be read in
    runs of a block's length, strided by the next level's). A tree keeps its partial results and the sums over
    them in :func:`_tree_dtype` (float64 for a narrower float where the device has it: a float32 sum of partials
    past 2**24 rounds at every add, so ones summed 2**31 + 5 times came to 2147483008); ``acc``: that dtype,
    given to a part of a tree, whose result is then in it (else the result is cast back to ``r.dtype``). ``keep``:
    a function giving the values of the input to read through the split's view rather than rebuild under it."""
    op, axes = r.arg
    shape, out = shape_of(r.src[0]), shape_of(r)
    if not all(isinstance(d, int) for d in shape + out):
        return None
    if _needs_tree(r, prod(shape) // max(prod(out), 1)):
        choice = _tree_block(shape, axes)
        wide = acc or _tree_dtype(r)
    elif not tree_only and prod(out) > 1 and prod(shape) >= SPLIT_REDUCE_RATIO * prod(out):
        choice, wide = _cache_block(shape, axes), r.value_dtype
    else:
        return None
    if choice is None:
        return None
    a, k = choice
    n = shape[a]
    whole = n // k * k  # the blocks cover the axis up to here; the rest (fewer than k elements) is reduced apart
    split = shape[:a] + (k, whole // k) + shape[a + 1:]
    front = (a, *range(a), *range(a + 1, len(split)))
    cut = tuple((0, whole) if i == a else (0, d) for i, d in enumerate(shape))
    kept = keep() if keep is not None else frozenset()
    moved = _moved(r.src[0], lambda st: (st.shrink(cut) if whole != n else st).reshape(split).permute(front), kept)
    if moved is None:
        return None
    inner = UOp(Ops.REDUCE_AXIS, r.dtype, (moved,), (op, tuple(i + 1 for i in axes)))
    partial = UOp(Ops.CONTIGUOUS, wide, (_split_reduce(inner, True, wide) or inner.cast(wide),))
    # the partial results, (k, *out), seen with the block index in place of the reduced axis a: one more reduction
    pshape = (k, *out)
    back = ShapeTracker.from_shape(pshape).permute((*range(1, a + 1), 0, *range(a + 1, len(pshape))))
    view = UOp(Ops.VIEW, wide, (partial,), back.reshape(out[:a] + (k,) + out[a + 1:]))
    top = UOp(Ops.REDUCE_AXIS, wide, (view,), (op, (a,)))
    if whole != n:
        rest_cut = tuple((whole, n) if i == a else (0, d) for i, d in enumerate(shape))
        rest_src = _moved(r.src[0], lambda st: st.shrink(rest_cut), kept)
        if rest_src is None:
            return None
        rest = UOp(Ops.REDUCE_AXIS, r.dtype, (rest_src,), (op, axes))
        top = UOp(op, wide, (top, _split_reduce(rest, True, wide) or rest.cast(wide)))
    return top if acc is not None else top.cast(r.value_dtype)


def _tree_dtype(r: UOp) -> DType:
    """The dtype a tree of the float sum ``r`` keeps its partial results in: float64 where ``r`` is narrower and
    its device has float64, else ``r.dtype``. Only the levels above the first add in it: the first, which reads
    the input, still adds up to ACCUMULATE_MAX values in ``r.dtype`` (float64 there would halve the speed of the
    kernel that reads the data)."""
    if r.value_dtype.itemsize >= dtypes.float64.itemsize:
        return r.value_dtype
    device = device_of(r)
    if device not in _F64_DEVICES:
        dev = Device[device]
        # the device's answer where it has one (its renderer may wait on a compiler probe)
        supported = getattr(dev, "supported_dtypes", None) or dev.renderer.supported_dtypes
        _F64_DEVICES[device] = dtypes.float64 in supported
    return dtypes.float64 if _F64_DEVICES[device] else r.value_dtype


_F64_DEVICES: dict[str, bool] = {}


#: a float sum over more than this many elements per output is summed in a tree of kernels (fusion rule 7)
ACCUMULATE_MAX = 1 << 16
#: the fewest blocks a tree level cuts an axis into when the axis has a divisor to allow it
TREE_MIN_BLOCKS = 16


def _needs_tree(r: UOp, length: int) -> bool:
    """Whether the REDUCE_AXIS ``r`` (``length`` elements per output) is a float sum too long for one chain."""
    return r.arg[0] is Ops.ADD and getattr(r.dtype, "kind", "") == "f" and length > ACCUMULATE_MAX


def _cache_block(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int] | None:
    """Fusion rule 6's cut (axis, blocks): the outermost reduce axis with a divisor in [2, SPLIT_REDUCE_MAX], and
    its largest such divisor."""
    for a in sorted(axes):
        k = _largest_divisor(shape[a], SPLIT_REDUCE_MAX, 2)
        if k > 1:
            return a, k
    return None


def _tree_block(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int] | None:
    """Fusion rule 7's cut (axis, blocks): the outermost reduce axis with a divisor in [TREE_MIN_BLOCKS,
    SPLIT_REDUCE_MAX] (the blocks then cover it exactly), else the longest reduce axis, in SPLIT_REDUCE_MAX
    blocks plus a remainder when it is longer than that, whole (one block per element) when it is not."""
    live = [a for a in sorted(axes) if shape[a] > 1]
    if not live:
        return None
    for a in live:
        k = _largest_divisor(shape[a], SPLIT_REDUCE_MAX, TREE_MIN_BLOCKS)
        if k > 1:
            return a, k
    a = max(live, key=lambda i: shape[i])
    return a, min(shape[a], SPLIT_REDUCE_MAX)


def _largest_divisor(n: int, limit: int, smallest: int) -> int:
    """The largest divisor of ``n`` in [smallest, limit], or 1."""
    return next((k for k in range(min(limit, n), smallest - 1, -1) if n % k == 0), 1)


def _fold_const_reduce(r: UOp) -> UOp | None:
    """The REDUCE_AXIS ``r`` of a constant (through views without padding) as the constant it gives: a sum is the
    value times the count (in float64, then rounded to the dtype; integers wrap as their sum would), a max the
    value, a product the value to the count. None for anything else or an empty reduction."""
    src = r.src[0]
    while src.op is Ops.VIEW and all(v.mask is None for v in src.arg.views):
        src = src.src[0]
    shape, out = shape_of(r.src[0]), shape_of(r)
    if src.op is not Ops.CONST or not all(isinstance(d, int) for d in shape + out) or prod(shape) == 0:
        return None
    count = prod(shape) // prod(out)
    op, dt, v = r.arg[0], r.value_dtype, src.arg
    if op is Ops.MAX:
        value = v
    elif dt.kind == "f":
        try:
            value = float(v) * count if op is Ops.ADD else float(v) ** count
        except OverflowError:  # a power past float64's range: inf with the sign an odd count keeps
            value = -math.inf if v < 0 and count % 2 else math.inf
    elif op is Ops.ADD:
        value = int(v) * count
    elif op is Ops.MUL:
        value = pow(int(v), count, 1 << dt.bitsize)
    else:
        return None
    const = UOp(Ops.CONST, dt, src.src, truncate(dt, value))
    return UOp(Ops.VIEW, dt, (const,), ShapeTracker.from_shape(()).reshape((1,) * len(out)).expand(out))


def _fold_broadcast_reduce(r: UOp) -> UOp | None:
    """The REDUCE_AXIS ``r`` of a value that does not change along its reduced axes (see :func:`constant_along`),
    as that value read once (the source shrunk to 1 on those axes): times the count for a sum, a float one in
    :func:`_tree_dtype` and cast back, so it rounds once (a float32 chain of adds rounds at every add); the value
    itself for a max. An integer sum times the count wraps as the sum would. None for anything
    else (products, a count of 1, an empty or symbolic shape)."""
    op, axes = r.arg
    shape, out, dt = shape_of(r.src[0]), shape_of(r), r.value_dtype
    if not all(isinstance(d, int) for d in shape + out) or prod(shape) == 0:
        return None
    count = prod(shape[a] for a in axes)
    if count == 1 or not (op is Ops.MAX or (op is Ops.ADD and dt.kind in "fiu")):
        return None
    if not constant_along(r.src[0], axes):
        return None
    one = _moved(r.src[0], lambda st: st.shrink(tuple((0, 1) if i in axes else (0, d) for i, d in enumerate(shape))))
    if one is None or op is Ops.MAX:
        return one
    wide = _tree_dtype(r) if dt.kind == "f" else dt
    times = UOp(Ops.CONST, wide, (UOp(Ops.DEVICE, None, (), device_of(r)),), truncate(wide, count))
    times = UOp(Ops.VIEW, wide, (times,), ShapeTracker.from_shape(()).reshape((1,) * len(out)).expand(out))
    return UOp(Ops.MUL, wide, (one.cast(wide), times)).cast(dt)


def _moved(value: UOp, move: Any, keep: frozenset[UOp] = frozenset()) -> UOp | None:
    """``value`` seen through the movement ``move`` (ShapeTracker -> ShapeTracker), pushed through its
    elementwise ops onto the views and nodes they read: a kernel then indexes its buffers through views (a view
    of a computed value is indexed through / and %). The nodes in ``keep`` are viewed, not pushed through. None
    when a node it reads has another shape."""
    shape = shape_of(value)
    memo: dict[UOp, UOp] = {}
    def stop(u: UOp) -> bool:
        return u in keep or (u.op not in GroupOp.Elementwise and u.op is not Ops.DETACH)

    for n in toposort([value], stop=stop):
        if shape_of(n) != shape:
            return None
        if n.op is Ops.VIEW:
            memo[n] = UOp(Ops.VIEW, n.dtype, n.src, move(n.arg))
        elif n not in keep and (n.op in GroupOp.Elementwise or n.op is Ops.DETACH):
            memo[n] = UOp(n.op, n.dtype, tuple(memo[s] for s in n.src), n.arg)
        else:
            memo[n] = UOp(Ops.VIEW, n.dtype, (n,), move(ShapeTracker.from_shape(shape)))
    return memo[value]


def _is_reshape_only(st: ShapeTracker, src_shape: tuple[int, ...]) -> bool:
    return st.contiguous and sprod(src_shape) == st.size  # (symbolic sizes: equal expressions are one node)


def copy_range(st: ShapeTracker) -> int | None:
    """Where the view ``st`` of a buffer starts, when it reads a contiguous range of it in order (what a COPY
    can move without a kernel); None otherwise."""
    if not all(v.contiguous for v in st.views[:-1]):  # (plain reshapes: flat positions are memory positions)
        return None
    v = st.views[-1]
    if v.mask is not None or not isinstance(v.offset, int) or not all(isinstance(s, int) for s in v.shape):
        return None
    want = tuple(0 if s == 1 else st for s, st in zip(v.shape, strides_for_shape(v.shape)))
    return v.offset if v.strides == want else None


def _copy_offset(src: UOp, base: UOp) -> int | None:
    """Where the COPY source ``src`` (a view of ``base``, or ``base`` itself) starts in ``base``'s buffer, when it
    is a contiguous range of it; None otherwise."""
    if src.op is not Ops.VIEW:
        return 0
    return copy_range(assign_view(base) + src.arg if base.op is Ops.ASSIGN else src.arg)


def _targets(roots: list[UOp], shared: set[UOp] | None = None) -> list[UOp]:
    """Decide which nodes become kernels, in dependency order; ``shared``: values fusion rule 9 stores, found
    when reductions were split (:func:`_split_reductions`)."""
    nodes = toposort(roots, stop=lambda u: u.op is Ops.BUFFER)
    consumers: dict[UOp, list[UOp]] = {n: [] for n in nodes}
    for n in nodes:
        for s in n.src:
            consumers[s].append(n)
    targets: set[UOp] = {n for n in shared or () if n in consumers}
    for r in roots:
        b = base_of(r)
        if b.op is Ops.BUFFER:
            continue
        targets.add(r if b.op in (Ops.CONST, Ops.DEVICE) else b)
    for n in nodes:
        if n.op in (Ops.COPY, Ops.CONTIGUOUS, Ops.ASSIGN, Ops.ALLREDUCE):
            targets.add(n)
        if n.op is Ops.ALLREDUCE:  # a collective combines whole stored partials (ember.ir.multi makes them so)
            targets.update(b for b in map(base_of, n.src[:-1]) if b.op is not Ops.BUFFER)
        for src in n.src[:-1] if n.op is Ops.COPY else ():  # (a gathering copy has several sources)
            sb = base_of(src)
            # a copy moves a contiguous range of a buffer: materialize any other source first (a range of a node
            # that is stored anyway is read where it is stored)
            ranged = _copy_offset(src, sb) is not None
            if not ranged or sb.op not in (Ops.BUFFER, Ops.COPY, Ops.CONTIGUOUS, Ops.ASSIGN):
                targets.add(src if src.op is Ops.VIEW else sb)
            elif sb.op is not Ops.BUFFER:
                targets.add(sb)
    has_reduce: dict[UOp, bool] = {}
    costly: dict[UOp, bool] = {}  # a costly op in the node's fused subgraph
    for n in nodes:
        fused = [s for s in n.src if s not in targets and s.op is not Ops.BUFFER]
        hr = n.op is Ops.REDUCE_AXIS or any(has_reduce[s] for s in fused)
        cost = n.op in COSTLY_OPS or any(costly[s] for s in fused)
        if hr and n not in targets:
            cons = consumers[n]
            expands = any(c.op is Ops.VIEW and not _is_reshape_only(c.arg, shape_of(n)) for c in cons)
            if len(cons) > 1 or expands:
                targets.add(n)
        elif cost and n not in targets and n.op is not Ops.VIEW and \
                any(c.op is Ops.VIEW and _expands(c, shape_of(n)) for c in consumers[n]):
            targets.add(n)
        has_reduce[n] = hr and n not in targets
        costly[n] = cost and n not in targets
    _share_reduced_inputs(nodes, consumers, targets)
    _bound_kernels(nodes, targets)
    for n in nodes:
        if n.op is Ops.ASSIGN and _reads_target_elsewhere(n, targets):
            targets.add(n.src[1])  # compute the new value aside, then copy it in
    return [n for n in nodes if n in targets]


#: fusion rule 9 stores an elementwise value computed in several places (one a reduction) when it reads this many
#: buffers or more ...
SHARED_MIN_INPUTS = 3
#: ... holding together at least this many times as many elements as the value (an input broadcast to it counts
#: for its own size): stored, the value costs one write and one read per place; fused, each place reads all its
#: inputs again. A max-pool and relu gradient (the pre-activation, the pooled maxima, their counts and the incoming
#: gradient: 1.75 times its size) read by every sum of a BatchNorm backward is stored; a LayerNorm backward's
#: row of x and per-row statistics (one time its size), or a softmax gradient of two full inputs, is not
SHARED_MIN_FOOTPRINT = 1.5


def _worth_storing(n: UOp, reads: frozenset[UOp]) -> bool:
    """Whether the elementwise value ``n``, computed from ``reads`` (BUFFER nodes and computed values), reads enough
    to be stored once rather than computed in each of several places (fusion rule 9)."""
    if len(reads) < SHARED_MIN_INPUTS:
        return False
    size = sprod(shape_of(n))
    if not isinstance(size, int) or size == 0:
        return False
    footprint = 0.0
    for u in reads:
        elems = u.arg[2] if u.op is Ops.BUFFER else sprod(shape_of(u))
        footprint += min(1.0, elems / size) if isinstance(elems, int) else 1.0
    return footprint >= SHARED_MIN_FOOTPRINT


def _share_reduced_inputs(nodes: list[UOp], consumers: dict[UOp, list[UOp]], targets: set[UOp]) -> None:
    """Fusion rule 9: add to ``targets`` every elementwise value that would be computed, fused, in two or more
    places (reduction loops or kernels), at least one a reduction, and that reads enough (:func:`_worth_storing`).
    Each place would load all those buffers again and redo the arithmetic on every element; stored once,
    each place loads one buffer. The largest such value is taken (consumers are visited first), so what it is
    computed from is then read by its kernel alone."""
    inputs: dict[UOp, frozenset[UOp]] = {}
    none: frozenset[UOp] = frozenset()
    for n in nodes:
        if n.op not in (Ops.BUFFER, Ops.CONST, Ops.DEVICE):
            inputs[n] = none.union(*(frozenset((s,)) if s in targets or s.op is Ops.BUFFER else inputs.get(s, none)
                                     for s in n.src))
    # where each node is computed: (reductions, other kernels) it is fused into, at most 2 of each (enough to decide)
    places: dict[UOp, tuple[frozenset[UOp], frozenset[UOp]]] = {}
    for n in reversed(nodes):
        if n.op in (Ops.BUFFER, Ops.CONST, Ops.DEVICE):
            continue
        red: set[UOp] = set()
        other: set[UOp] = set()
        for c in consumers[n]:
            if c.op is Ops.REDUCE_AXIS:
                red.add(c)
            elif c in targets:
                other.add(c)
            elif c in places:
                red.update(places[c][0])
                other.update(places[c][1])
        if n not in targets and n.op in GroupOp.Elementwise and red and len(red) + len(other) >= 2 and \
                _worth_storing(n, inputs[n]):
            targets.add(n)
        places[n] = (frozenset(list(red)[:2]), frozenset(list(other)[:2]))


#: the longest chain of operations one kernel computes (fusion rule 8): a longer one is cut, its intermediate
#: result stored. Each kernel is then one expression a C compiler builds in milliseconds, whatever the graph
MAX_FUSED_DEPTH = 200
#: the most buffers one kernel reads (fusion rule 8): a sum or concatenation of thousands of tensors becomes a
#: few kernels of this many inputs each, not one function with thousands of parameters for the compiler (and
#: within every target's binding limit: Metal binds 31 buffers)
MAX_KERNEL_INPUTS = 24


def _bound_kernels(nodes: list[UOp], targets: set[UOp]) -> None:
    """Fusion rule 8: add to ``targets`` (nodes in dependency order) the intermediate results that keep each
    kernel within :data:`MAX_FUSED_DEPTH` operations along any path and :data:`MAX_KERNEL_INPUTS` buffers read.

    Where a node would pass a bound, the fused sources (through their views, at their base: never an expanded
    copy) with the deepest chains or the most inputs are materialized until it no longer does."""
    depth: dict[UOp, int] = {}
    inputs: dict[UOp, frozenset[UOp]] = {}
    none: frozenset[UOp] = frozenset()

    def fused_base(s: UOp) -> UOp | None:
        """The node a fused source is read from, to materialize; None when it is a leaf already."""
        b = base_of(s)
        return None if b.op in (Ops.BUFFER, Ops.CONST, Ops.DEVICE) or b in targets else b

    def leaf_inputs(s: UOp) -> frozenset[UOp]:
        if s in targets or s.op is Ops.BUFFER:
            return frozenset((s,))
        return inputs.get(s, none)

    for n in nodes:
        if n.op in (Ops.BUFFER, Ops.DEVICE, Ops.CONST):
            depth[n], inputs[n] = 0, none
            continue
        while True:
            d = max((depth.get(s, 0) for s in n.src if s not in targets), default=0) + (n.op is not Ops.VIEW)
            ins = none.union(*(leaf_inputs(s) for s in n.src))
            if d <= MAX_FUSED_DEPTH and len(ins) <= MAX_KERNEL_INPUTS:
                break
            # materialize the heaviest fused source (by the bound passed), then look again
            cands = [(b, depth.get(b, 0), len(inputs.get(b, none))) for s in n.src if (b := fused_base(s)) is not None]
            if not cands:
                break
            key = (lambda c: (c[1], c[2])) if d > MAX_FUSED_DEPTH else (lambda c: (c[2], c[1]))
            b = max(cands, key=key)[0]
            targets.add(b)
            _forget_fused(b, n, depth, inputs)
        depth[n], inputs[n] = d, ins


def _forget_fused(b: UOp, n: UOp, depth: dict[UOp, int], inputs: dict[UOp, frozenset[UOp]]) -> None:
    """The views between the new target ``b`` and its reader ``n`` read a buffer now: their chains start there."""
    for s in n.src:
        chain = []
        while s.op is Ops.VIEW and s is not b:
            chain.append(s)
            s = s.src[0]
        if s is b:
            for v in chain:
                depth[v], inputs[v] = 0, frozenset((b,))


def assign_view(n: UOp) -> ShapeTracker:
    """Where the ASSIGN node ``n`` writes in its buffer (the target's view)."""
    t = n.src[0]
    return t.arg if t.op is Ops.VIEW else ShapeTracker.from_shape(shape_of(t))


def _view_of_buffer(u: UOp, buf: UOp) -> ShapeTracker | None:
    """How ``u`` reads the BUFFER ``buf`` (directly, through an earlier ASSIGN into it, or a view of
    either), or None when ``u`` is none of these."""
    if u is buf:
        return ShapeTracker.from_shape((buf.arg[2],))
    if u.op is Ops.ASSIGN:
        return assign_view(u) if base_of(u.src[0]) is buf else None
    if u.op is Ops.VIEW and u.src[0] is buf:
        return u.arg
    if u.op is Ops.VIEW and (inner := _view_of_buffer(u.src[0], buf)) is not None:
        return inner + u.arg
    return None


def _reads_target_elsewhere(n: UOp, targets: set[UOp]) -> bool:
    """Whether the kernel of ASSIGN ``n`` would read the target buffer other than element for element (what
    other kernels, the ``targets``, compute from it is read from their own buffers)."""
    buf, st = base_of(n.src[0]), assign_view(n)
    value = n.src[1]
    if value in targets:
        return False
    if (v := _view_of_buffer(value, buf)) is not None:
        return v != st
    stop = (Ops.BUFFER, Ops.ASSIGN, Ops.COPY, Ops.CONTIGUOUS)
    for u in toposort([value], stop=lambda u: u in targets or u.op in stop):
        if u in targets or u.op is Ops.VIEW:
            continue
        for s in u.src:
            if (v := _view_of_buffer(s, buf)) is not None and v != st:
                return True
    return False


def _stored_view(n: UOp, buf: UOp) -> ShapeTracker:
    """How the target ``n`` lies in its buffer ``buf``."""
    if n.op is Ops.ASSIGN:
        return assign_view(n)
    return ShapeTracker.from_shape((buf.arg[2],)).reshape(shape_of(n))


def _build_ast(target: UOp, target_bufs: dict[UOp, UOp]) -> tuple[tuple[UOp, dict[str, int]], list[UOp], set[UOp]]:
    """The kernel AST for ``target`` with the values of its variables, the BUFFER nodes it uses (output first)
    and what it reads (targets of this schedule, and BUFFER nodes read directly: their contents before this
    schedule)."""
    params: list[UOp] = [target_bufs[target]]
    globals_: dict[UOp, UOp] = {}
    memo: dict[UOp, UOp] = {}
    reads: set[UOp] = set()
    is_assign = target.op is Ops.ASSIGN
    symbolic = is_assign and assign_view(target).symbolic  # a view with variables: values are stripped below
    out_shape = shape_of(target)
    out_size = target_bufs[target].arg[2] if is_assign else sint_max(sprod(out_shape))
    out_g = UOp(Ops.DEFINE_GLOBAL, PtrDType(target.value_dtype), (), (0, out_size))
    if is_assign:
        globals_[target_bufs[target]] = out_g  # the value may read the buffer it overwrites (same element)
        reads.update(target.src[2:])  # an earlier assign into the same buffer runs first

    def define_global(buf: UOp) -> UOp:
        if buf not in globals_:
            # a ramp's loads are computed from their index: the AST says so (it keys the compiled program)
            arg = (len(params), buf.arg[2], "ramp") if buf in lazy.ramps else (len(params), buf.arg[2])
            globals_[buf] = UOp(Ops.DEFINE_GLOBAL, PtrDType(buf.value_dtype), (), arg)
            params.append(buf)
        return globals_[buf]

    def is_input(n: UOp) -> bool:
        return (n is not target and n in target_bufs) or n.op in (Ops.BUFFER, Ops.CONST)

    # iterative (deep graphs must not hit the recursion limit), sources before users
    root = target.src[1] if is_assign else target
    for n in toposort([root], stop=is_input):
        if n is not target and n in target_bufs:
            reads.add(n)
            buf = target_bufs[n]
            g = define_global(buf)
            st = _stored_view(n, buf)
            symbolic = symbolic or st.symbolic
            out = UOp(Ops.VIEW, n.dtype, (UOp(Ops.LOAD, n.dtype, (g,)),), st)
        elif n.op is Ops.BUFFER:
            reads.add(n)
            out = UOp(Ops.LOAD, n.dtype, (define_global(n),))
        elif n.op is Ops.VIEW:
            symbolic = symbolic or n.arg.symbolic
            inner = memo[n.src[0]]
            if inner.op is Ops.VIEW:
                # over a contiguous view (a kernel's own buffer) the outer view alone addresses the buffer; composed,
                # a masked outer view (a pad) stays a second view, indexed back into coordinates with / and %
                out = UOp(Ops.VIEW, n.dtype, (inner.src[0],), n.arg if inner.arg.contiguous else inner.arg + n.arg)
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

    value = memo[root]
    store_view = assign_view(target) if is_assign else ShapeTracker.from_shape(out_shape)
    symbolic = symbolic or store_view.symbolic
    store = UOp(Ops.STORE, None, (out_g, value), store_view)
    sink = UOp(Ops.SINK, None, (store,))
    return (unbind_ast(sink) if symbolic else (sink, {})), params, reads


def unbind_ast(ast: UOp) -> tuple[UOp, dict[str, int]]:
    """The kernel AST with its views' variable values stripped (one kernel for every value), and the values."""
    var_vals: dict[str, int] = {}
    memo: dict[UOp, UOp] = {}
    for n in toposort([ast]):
        arg = n.arg
        if n.op in (Ops.VIEW, Ops.STORE) and isinstance(arg, ShapeTracker) and arg.symbolic:
            arg, vals = arg.unbind()
            for name, v in vals.items():
                if var_vals.setdefault(name, v) != v:
                    raise ValueError(f"variable {name!r} is bound to both {var_vals[name]} and {v} in one kernel")
        src = tuple(memo[s] for s in n.src)
        same = arg is n.arg and all(a is b for a, b in zip(src, n.src))
        memo[n] = n if same else UOp(n.op, n.dtype, src, arg)
    return memo[ast], var_vals


def create_schedule(roots: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Schedule everything needed to realize ``roots``.

    Returns the items in run order and a map from each original root (and each node that got
    its own buffer) to its realized replacement (a VIEW of a BUFFER). Nothing is recorded as
    realized here: after running the items, the caller passes the map to :func:`mark_realized`.
    """
    if any(type(device_of(r)) is tuple for r in roots):
        return _schedule_multi(roots)
    sub = _substitute_realized(roots)
    shared: set[UOp] = set()
    new_roots = _split_reductions([sub[r] for r in roots], shared)
    targets = _targets(new_roots, shared)
    target_bufs: dict[UOp, UOp] = {}
    items: list[tuple[UOp, ScheduleItem, set[UOp]]] = []  # (target, item, targets it reads)
    for t in targets:
        # a symbolic size: the buffer holds the largest the variables allow
        size = sint_max(sprod(shape_of(t)))
        if t.op is Ops.ALLREDUCE:
            if t not in target_bufs:  # the first of its group: one item for all of them
                items.append(_collective_item(t, size, target_bufs))
            continue
        if t.op is Ops.COPY:
            out = new_buffer(device_of(t), size, t.value_dtype)
            target_bufs[t] = out
            into = 0  # a gathering copy places its sources one after another
            for src in t.src[:-1]:
                sb = base_of(src)
                src_buf = target_bufs.get(src) or target_bufs.get(sb) or sb
                # the first element copied: where a view of a stored node starts in its buffer
                offset = 0 if src in target_bufs else _copy_offset(src, sb)
                assert offset is not None, "a copy's source must be a contiguous range of a buffer"
                n = size if len(t.src) == 2 else sint_max(sprod(shape_of(src)))
                if n:
                    reads = {r for r in (src, sb) if (r in target_bufs and r is not t) or r.op is Ops.BUFFER}
                    arg = (n, offset) if len(t.src) == 2 else (n, offset, into)
                    items.append((t, ScheduleItem(UOp(Ops.COPY, t.dtype, (), arg),
                                                  (buffers[out], buffers[src_buf])), reads))
                into += n
            continue
        out = base_of(t.src[0]) if t.op is Ops.ASSIGN else new_buffer(device_of(t), size, t.value_dtype)
        target_bufs[t] = out
        if size == 0:
            continue
        (ast, var_vals), params, reads = _build_ast(t, target_bufs)
        items.append((t, ScheduleItem(ast, tuple(buffers[p] for p in params), tuple(sorted(var_vals.items()))), reads))
    if any(t.op is Ops.ASSIGN for t, _, _ in items):
        items = _order_writes_after_reads(items)
    schedule = [si for _, si, _ in items]
    becomes: dict[UOp, UOp] = {}
    for t, buf in target_bufs.items():
        becomes[t] = t.src[0] if t.op is Ops.ASSIGN else buffer_view(buf, shape_of(t))
    for orig, new in zip(roots, new_roots):
        becomes[orig] = _replacement(new, target_bufs)
    return schedule, becomes


def _collective_item(t: UOp, size: int, target_bufs: dict[UOp, UOp]) -> tuple[UOp, ScheduleItem, set[UOp]]:
    """The one item of the native allreduce ``t`` belongs to (``t`` is the result on one device of its group):
    a buffer for the result on every device of the group (its nodes made here), then the partials it reads."""
    parts, (op, _) = t.src[:-1], t.arg
    group = [UOp(Ops.ALLREDUCE, t.dtype, parts + (UOp(Ops.DEVICE, None, (), device_of(p)),), (op, j))
             for j, p in enumerate(parts)]
    for g in group:
        target_bufs[g] = new_buffer(device_of(g), size, t.value_dtype)
    srcs = [target_bufs.get(p) or target_bufs.get(base_of(p)) or base_of(p) for p in parts]
    reads = {n for p in parts for n in (p, base_of(p)) if n in target_bufs or n.op is Ops.BUFFER}
    bufs = tuple(buffers[target_bufs[g]] for g in group) + tuple(buffers[b] for b in srcs)
    return t, ScheduleItem(UOp(Ops.ALLREDUCE, t.dtype, (), (op, len(parts))), bufs), reads


def _schedule_multi(roots: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """:func:`create_schedule` of roots some of which live on several devices: each of those is lowered to
    per-device graphs (:func:`ember.ir.multi.lower`), all are scheduled together, and each multi-device root
    becomes the MULTI of its shards' realized views."""
    lowered = {r: lower(r) for r in roots if type(device_of(r)) is tuple}
    flat = [s for r in roots for s in (lowered[r].src if r in lowered else (r,))]
    schedule, becomes = create_schedule(flat)
    for r, m in lowered.items():
        becomes[r] = UOp(Ops.MULTI, m.dtype, tuple(becomes.get(s, s) for s in m.src), m.arg)
    return schedule, becomes


def _order_writes_after_reads(items: list[tuple[UOp, ScheduleItem, set[UOp]]]) -> list[tuple[UOp, ScheduleItem,
                                                                                             set[UOp]]]:
    """Reorder ``items`` so each ASSIGN runs after every item that reads the old contents of its buffer."""
    index = {t: i for i, (t, _, _) in enumerate(items)}
    writers: dict[UOp, list[int]] = {}  # BUFFER node -> items that assign into it
    for i, (t, _, _) in enumerate(items):
        if t.op is Ops.ASSIGN:
            writers.setdefault(base_of(t.src[0]), []).append(i)
    deps: list[set[int]] = [{index[r] for r in reads if r in index} for _, _, reads in items]
    later_writer = {t.src[2]: i for i, (t, _, _) in enumerate(items) if t.op is Ops.ASSIGN and len(t.src) > 2}
    for i, (_, _, reads) in enumerate(items):
        for r in reads:
            # the old contents of a buffer are read before anything assigns into it; the value an assign
            # wrote is read before the next assign into the same buffer
            for w in writers.get(r, ()) if r.op is Ops.BUFFER else [later_writer.get(r, i)]:
                if w != i:
                    deps[w].add(i)
    order: list[int] = []
    state = [0] * len(items)  # 0 new, 1 on the stack, 2 done
    for start in range(len(items)):
        stack = [(start, False)]
        while stack:
            i, expanded = stack.pop()
            if expanded:
                state[i] = 2
                order.append(i)
                continue
            if state[i] == 2:
                continue
            if state[i] == 1:
                raise RuntimeError("a kernel reads both the old and the assigned value of one buffer; "
                                   "realize the assign first")
            state[i] = 1
            stack.append((i, True))
            stack.extend((d, False) for d in sorted(deps[i], reverse=True) if state[d] != 2)
    return [items[i] for i in order]


def mark_realized(becomes: dict[UOp, UOp]) -> None:
    """Remember that these nodes now live in buffers (call only after their schedule ran).

    Buffers written in place by an ASSIGN hold new values now, so every remembered result computed
    from their old contents is forgotten (an identical graph built later computes afresh).
    """
    for node, view in becomes.items():
        # a constant (a VIEW of a CONST: ``Tensor.zeros(n).realize()``) is not remembered: identical nodes are one
        # object, so every later ``x + 0.0`` of that shape would read the buffer instead of folding the constant,
        # and the wrong value once the buffer is assigned into
        if node.op is not Ops.BUFFER and base_of(node).op not in (Ops.BUFFER, Ops.CONST):
            realized[node] = view
    written = {base_of(n.src[0]) for n in becomes if n.op is Ops.ASSIGN}
    if written:
        forget_readers(written)


def forget_readers(written: set[UOp]) -> None:
    """Drop every entry of ``realized`` whose computation reads one of the BUFFER nodes ``written``.

    ASSIGN nodes stay: each names one write that happened (nodes are unique), and stands for the
    buffer it wrote into. A node realized into a buffer that is assigned into later keeps standing for that
    buffer, as in tinygrad: a twin built before (``x * 2`` made twice, one of them realized and assigned into)
    reads the buffer's current contents.
    """
    keys = list(realized.keys())
    reads: dict[UOp, bool] = {}
    for n in toposort(keys, stop=lambda u: u.op is Ops.BUFFER):
        reads[n] = n in written or any(reads[s] for s in n.src if s in reads)
    for k in keys:
        if reads.get(k) and k.op is not Ops.ASSIGN:
            realized.pop(k, None)


def _replacement(root: UOp, target_bufs: dict[UOp, UOp]) -> UOp:
    if root in target_bufs:
        return root.src[0] if root.op is Ops.ASSIGN else buffer_view(target_bufs[root], shape_of(root))
    b = base_of(root)
    if b.op is Ops.BUFFER:
        return root
    buf = target_bufs[b]
    return UOp(Ops.VIEW, root.dtype, (buf,), _stored_view(b, buf) + root.arg)
