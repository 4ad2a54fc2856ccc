"""Tensors on several devices at once: the MULTI node, and how a multi-device graph becomes per-device graphs.

A tensor on a tuple of devices has a graph like any other, with one more node kind at its leaves:
``MULTI(shard_0, ..., shard_n-1; arg=axis)`` holds one ordinary single-device graph per device. With an ``axis``
the shards are equal slices of the logical tensor along it, in device order; with ``None`` every device holds
the whole tensor (replicated). Constants on a tuple of devices (``CONST`` whose ``DEVICE`` names the tuple) and
broadcast copies (``COPY`` to a tuple) are multi-device leaves too. Elementwise ops, casts, reductions and
CONTIGUOUS stack on these nodes as on single-device ones, so the frontend and autograd need nothing new: the
logical shape (``shape_of``) and the device tuple (``device_of``) are properties of every node.

Why a node in the graph rather than a tensor holding a list of per-device tensors: autograd, the optimizers
and every composed op see one lazy tensor, as tinygrad's users do; only :func:`lower` knows about devices.
:func:`lower` rewrites a multi-device node into a MULTI of per-device graphs (memoized per node): an
elementwise op runs per shard (a replicated operand of a sharded op is shrunk to each shard's slice), a
reduction over the sharded axis reduces each shard then combines the partial results with an allreduce made
of device-to-device COPY nodes and elementwise kernels, whose result is replicated. The scheduler lowers the
roots it is asked for before anything else, so it, the engine and the JIT only ever see ordinary per-device
kernels and copies. Movement ops are the exception: ember composes them into one ShapeTracker as they are
built, which loses the sharded axis, so they are pushed down to the shards when built (frontend/multi.py)
and never appear above a multi-device node.

Shards are equal: a tensor whose sharded axis does not divide by the device count is refused (tinygrad 0.14
does the same).
"""
from __future__ import annotations

import weakref

from ember.device.collective import native_allreduce_of
from ember.dtype import DType, PtrDType, dtypes
from ember.helpers import prod
from ember.ir.lazy import base_of, device_of, realized, shape_of
from ember.ir.shapetracker import ShapeTracker
from ember.ir.uop import GroupOp, Ops, UOp, toposort


class ShardingError(RuntimeError):
    """Operands sharded in ways an op cannot combine without resharding (not supported yet)."""


def is_multi(u: UOp) -> bool:
    """Whether the tensor-graph node ``u`` lives on a tuple of devices."""
    return type(device_of(u)) is tuple


def describe(axis: int | None, devices: tuple[str, ...]) -> str:
    """A sharding in words, for messages."""
    where = ", ".join(devices)
    return f"replicated on ({where})" if axis is None else f"sharded on axis {axis} over ({where})"


def multi(shards: tuple[UOp, ...], axis: int | None) -> UOp:
    """The MULTI node of ``shards`` (one per device, equal shapes and dtypes)."""
    return UOp(Ops.MULTI, shards[0].dtype, shards, axis)


def view_of(x: UOp, st: ShapeTracker) -> UOp:
    """``x`` seen through ``st`` (a movement of ``x``'s shape), composed with the view ``x`` already is."""
    base, old = (x.src[0], x.arg) if x.op is Ops.VIEW else (x, ShapeTracker.from_shape(shape_of(x)))
    new = old + st
    return base if new.contiguous and new.shape == shape_of(base) else UOp(Ops.VIEW, x.dtype, (base,), new)


def copy_to(x: UOp, device: str) -> UOp:
    """``x`` on ``device``: itself when it is there, a COPY node otherwise (a constant is re-made there)."""
    if device_of(x) == device:
        return x
    dev = UOp(Ops.DEVICE, None, (), device)
    c = base_of(x)
    if c.op is Ops.CONST:
        newc = UOp(Ops.CONST, c.dtype, (dev,), c.arg)
        return newc if x is c else UOp(Ops.VIEW, x.dtype, (newc,), x.arg)
    return UOp(Ops.COPY, x.dtype, (x, dev))


def shard_slice(x: UOp, axis: int, i: int, n: int) -> UOp:
    """The ``i``-th of ``n`` equal slices of the single-device node ``x`` along ``axis``."""
    shape = shape_of(x)
    size = shape[axis] // n
    arg = tuple((i * size, (i + 1) * size) if k == axis else (0, s) for k, s in enumerate(shape))
    return view_of(x, ShapeTracker.from_shape(shape).shrink(arg))


#: the MULTI form of every multi-device node lowered so far (weak keys: an entry lives as long as its node; a
#: value is made of per-device nodes only, so it never keeps its key alive)
_lowered: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


def lower(root: UOp) -> UOp:
    """``root``, a multi-device node, as a MULTI of per-device graphs (which hold no multi-device node)."""
    if root.op is Ops.MULTI:
        return root
    if (hit := _lowered.get(root)) is not None:
        return hit

    def done(u: UOp) -> bool:
        return u.op is Ops.MULTI or u in _lowered or not is_multi(u) or u.op is Ops.DEVICE

    for n in toposort([root], stop=done):
        if not done(n):
            _lowered[n] = realized.get(n) or _lower_one(n)
    return _lowered[root]


def _lower_one(n: UOp) -> UOp:
    devices = device_of(n)
    if n.op is Ops.CONST:
        return multi(tuple(copy_to(n, d) for d in devices), None)
    if n.op is Ops.COPY:  # a single-device value broadcast to every device (``to(devices)``)
        x = n.src[0]
        if is_multi(x):  # another tuple of devices: every one gathers the whole (replicated), as tinygrad does
            return gather_to(lower(x), devices)
        return multi(tuple(copy_to(x, d) for d in devices), None)
    if n.op is Ops.REDUCE_AXIS:
        m = lower(n.src[0])
        # a shard 1 long on every reduced axis (a batch of one row per device) is its own local result
        local = tuple(s if s.dtype == n.dtype and all(shape_of(s)[a] == 1 for a in n.arg[1])
                      else UOp(Ops.REDUCE_AXIS, n.dtype, (s,), n.arg) for s in m.src)
        if m.arg is None or m.arg not in n.arg[1]:
            return multi(local, m.arg)
        total = multi(allreduce(local, n.arg[0]), None)
        _partials[total] = (local, n.arg[0])
        return total
    if n.op is Ops.VIEW:  # views of sharded values are pushed down as they are built; a replicated one may remain
        m = lower(n.src[0])
        if m.arg is not None:
            raise AssertionError("a view of a sharded value must have been pushed down to its shards")
        return view_replicated(m, n.arg)
    if n.op in GroupOp.Elementwise or n.op in (Ops.CONTIGUOUS, Ops.DETACH):
        ms = []
        for s in n.src:
            if not is_multi(s):
                raise RuntimeError(f"{n.op.name} mixes a tensor on {device_of(s)} with tensors on {devices}")
            ms.append(lower(s))
        axis = common_axis(n.op.name, ms)
        shards = [match_sharding(m, axis) for m in ms]
        out = multi(tuple(UOp(n.op, n.dtype, srcs, n.arg) for srcs in zip(*shards)), axis)
        if axis is None and any(m in _partials or m in _recipes for m in ms):
            _recipes[out] = (n.op, n.dtype, n.arg, tuple(ms))
        return out
    raise NotImplementedError(f"{n.op.name} is not supported on a multi-device tensor (devices {devices})")


def common_axis(what: str, ms: list[UOp]) -> int | None:
    """The sharding of an elementwise op on the lowered operands ``ms``: their common axis (replicated operands
    fit any). Operands sharded on different axes are resharded to the axis sharded last among the distinct ones
    in operand order (tinygrad 0.14's choice: ``x0 + x1`` is sharded on 1, ``x1 + x0`` on 0); operands on
    different device tuples are a :class:`ShardingError` naming both."""
    for m in ms[1:]:
        if device_of(m) != device_of(ms[0]):
            raise ShardingError(f"{what}: operands {describe(ms[0].arg, device_of(ms[0]))} and "
                                f"{describe(m.arg, device_of(m))}: different devices; move one with .to(devices)")
    axes = list(dict.fromkeys(m.arg for m in ms if m.arg is not None))
    return axes[-1] if axes else None


def match_sharding(m: UOp, axis: int | None) -> tuple[UOp, ...]:
    """The shards of the lowered value ``m`` for an op sharded on ``axis``: a replicated value is cut into each
    device's slice (a view: nothing is copied); a value sharded on another axis is resharded (:func:`reshard`);
    the replicated result of an allreduce is a reduce-scatter instead (each device combines only its slice)."""
    if m.arg == axis or axis is None:
        return m.src
    if m.arg is not None:
        return reshard(m, axis).src
    if (combined := _partials.get(m)) is not None:
        return reduce_scatter(*combined, axis)
    if (recipe := _recipes.get(m)) is not None:  # computed on each device from its slices of the operands
        op, dtype, arg, ms = recipe
        if op is Ops.VIEW:  # a reshape adding or removing axes of 1: the same slice of the source, reshaped
            src_shape, shape, n = shape_of(ms[0]), shape_of(m), len(m.src)
            k = [i for i, s in enumerate(src_shape) if s != 1][[i for i, s in enumerate(shape) if s != 1].index(axis)]
            local = tuple(s // n if i == axis else s for i, s in enumerate(shape))
            return tuple(view_of(p, ShapeTracker.from_shape(shape_of(p)).reshape(local))
                         for p in match_sharding(ms[0], k))
        return tuple(UOp(op, dtype, srcs, arg) for srcs in zip(*(match_sharding(x, axis) for x in ms)))
    return tuple(shard_slice(s, axis, i, len(m.src)) for i, s in enumerate(m.src))


#: the per-device partials and the op of each allreduce result lowered so far (weak keys, as ``_lowered``): an
#: op that needs only each device's slice of the total reduce-scatters them instead (the allreduce, left unused,
#: is never scheduled)
_partials: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], Ops]] = weakref.WeakKeyDictionary()


#: how each replicated elementwise result computed from an allreduce result was made (op, dtype, arg, lowered
#: operands), so that an op needing only each device's slice of it computes only that slice, from a
#: reduce-scatter (an optimizer update of a sharded parameter from a gradient summed over a sharded batch)
_Recipe = tuple[Ops, DType | PtrDType | None, object, tuple[UOp, ...]]
_recipes: weakref.WeakKeyDictionary[UOp, _Recipe] = weakref.WeakKeyDictionary()


def view_replicated(m: UOp, st: ShapeTracker) -> UOp:
    """The replicated lowered value ``m`` seen through ``st`` on every device."""
    out = multi(tuple(view_of(s, st) for s in m.src), None)
    if (m in _partials or m in _recipes) and _squeeze_only(shape_of(m), st):
        _recipes[out] = (Ops.VIEW, None, st, (m,))
    return out


def _squeeze_only(src_shape: tuple[int, ...], st: ShapeTracker) -> bool:
    """Whether the view ``st`` of a value of ``src_shape`` only adds or removes axes of size 1."""
    return st.contiguous and st.size == prod(src_shape) and \
        [s for s in src_shape if s != 1] == [s for s in st.shape if s != 1]


def reduce_scatter(parts: tuple[UOp, ...], op: Ops, axis: int) -> tuple[UOp, ...]:
    """Device i's slice along ``axis`` of the combination of the per-device partials ``parts`` with ``op``: it
    fetches slice i of every other partial (the part a ring's reduce-scatter would bring it: (n-1)/n of the
    data) and combines them in device order, so each element is computed once, on its owner."""
    n = len(parts)
    parts = tuple(stored(p) for p in parts)  # (computed once; a slice that is a range of it is copied straight out)
    out = []
    for i, p in enumerate(parts):
        device = device_of(p)
        acc: UOp | None = None
        for q in parts:
            piece = copy_to(shard_slice(q, axis, i, n), device)
            acc = piece if acc is None else UOp(op, acc.dtype, (acc, piece))
        assert acc is not None
        out.append(acc)
    return tuple(out)


def reshard(m: UOp, axis: int | None) -> UOp:
    """The lowered value ``m``, sharded on ``m.arg``, sharded on ``axis`` instead (None: replicated, an
    allgather). Device i fetches from every shard only the part it will hold (the slice ``i`` of ``axis``; with
    None all of it) and joins the parts along the old axis, so each element crosses at most one link."""
    old, devices, n = m.arg, device_of(m), len(m.src)
    if old is None or old == axis:
        return m if axis is None or old == axis else multi(match_sharding(m, axis), axis)
    local = shape_of(m.src[0])
    whole = shape_of(m)
    if axis is not None and whole[axis] % n:
        raise ShardingError(f"resharding a tensor of shape {whole} {describe(old, devices)} to "
                            f"{describe(axis, devices)}: axis {axis} (size {whole[axis]}) does not split evenly over "
                            f"{n} devices")
    out = []
    for i, device in enumerate(devices):
        keep = tuple((i * (s // n), (i + 1) * (s // n)) if k == axis else (0, s) for k, s in enumerate(local))
        pieces = [(copy_to(view_of(s, ShapeTracker.from_shape(local).shrink(keep)), device), j * local[old])
                  for j, s in enumerate(m.src)]
        out_shape = tuple(e - b if k != old else whole[old] for k, (b, e) in enumerate(keep))
        out.append(join(pieces, old, out_shape, device))
    return multi(tuple(out), axis)


def gather_to(m: UOp, devices: tuple[str, ...]) -> UOp:
    """The lowered value ``m`` replicated on ``devices`` (another tuple): each gathers every shard (a replicated
    ``m`` is fetched from the same device where it has one, else from its first)."""
    if m.arg is None:
        here = {device_of(s): s for s in m.src}
        return multi(tuple(copy_to(here.get(d, m.src[0]), d) for d in devices), None)
    local, whole = shape_of(m.src[0]), shape_of(m)
    # (shards that are flat ranges of the whole, in order, are copied into place)
    if prod(local[:m.arg]) == 1 and gathers_into(devices, prod(local) * m.src[0].value_dtype.itemsize):
        flat = ShapeTracker.from_shape((prod(whole),)).reshape(whole)
        return multi(tuple(view_of(gathered(list(m.src), d), flat) for d in devices), None)
    return multi(tuple(join([(copy_to(s, d), j * local[m.arg]) for j, s in enumerate(m.src)], m.arg, whole, d)
                       for d in devices), None)


def allreduce(parts: tuple[UOp, ...], op: Ops) -> tuple[UOp, ...]:
    """Combine per-device partial results with the binary ``op`` (ADD, MAX, MUL) so every device holds the
    total. Each element of the total is computed once, on one device, and copied to the others, so replicas
    stay identical (an allreduce where each device combined in its own order would not).

    When every device offers a native collective (:func:`ember.device.collective.native_allreduce_of`), one
    ALLREDUCE node per device, scheduled as one item that calls it. Otherwise, two devices (or fewer elements
    than devices): reduce onto the first device, then broadcast. More: a ring (:func:`ring_allreduce`), which
    moves 2(n-1)/n of the data per device instead of n-1 times it through one."""
    if op in _NATIVE_OPS and native_allreduce_of(tuple(device_of(p) for p in parts)) is not None:
        whole = tuple(_whole(p) for p in parts)
        return tuple(UOp(Ops.ALLREDUCE, p.dtype, whole + (UOp(Ops.DEVICE, None, (), device_of(p)),),
                         (_NATIVE_OPS[op], i)) for i, p in enumerate(parts))
    if len(parts) > 2 and prod(shape_of(parts[0])) >= len(parts):
        return ring_allreduce(parts, op)
    home = device_of(parts[0])
    total = parts[0]
    for p in parts[1:]:
        total = UOp(op, total.dtype, (total, copy_to(p, home)))
    return tuple(copy_to(total, device_of(p)) for p in parts)


def ring_allreduce(parts: tuple[UOp, ...], op: Ops) -> tuple[UOp, ...]:
    """Allreduce over a ring of the n devices of ``parts``: the values are cut into n chunks; chunk c is
    combined device after device around the ring, starting after device c and ending on it (reduce-scatter),
    then each device fetches every chunk from its owner and joins them (allgather).

    Each partial is stored once, flat and padded to n equal chunks (rows of an (n, chunk) view), so every hop
    copies its chunk straight out of a buffer (a COPY of a range) and every add reads its own chunk in place;
    the join places whole rows, so its kernel picks a source per row rather than per element."""
    n, shape, dtype = len(parts), shape_of(parts[0]), parts[0].value_dtype
    total = prod(shape)
    devices = [device_of(p) for p in parts]
    step = -(-total // n)
    flat = ShapeTracker.from_shape(shape).reshape((total,))
    if step * n != total:
        flat = flat.pad(((0, step * n - total),))
    rows = [stored(view_of(p, flat)) for p in parts]

    def chunk(x: UOp, c: int) -> UOp:
        return view_of(x, ShapeTracker.from_shape((n * step,)).shrink(((c * step, (c + 1) * step),)))

    live = [c for c in range(n) if c * step < total]  # (a chunk of padding only is neither reduced nor sent)
    owned = {}
    for c in live:
        ring = [(c + k) % n for k in range(1, n + 1)]
        acc = chunk(rows[ring[0]], c)
        for d in ring[1:]:
            acc = UOp(op, dtype, (chunk(rows[d], c), copy_to(acc, devices[d])))
        owned[c] = acc
    out = []
    for device in devices:
        if gathers_into(devices, step * dtype.itemsize):  # every chunk copied into its place: no join kernel
            whole = gathered([owned[c] for c in live], device)
            back = ShapeTracker.from_shape((len(live) * step,))
        else:
            row = ShapeTracker.from_shape((step,)).reshape((1, step))
            pieces = [(view_of(copy_to(owned[c], device), row), c) for c in live]
            whole = join(pieces, 0, (n, step), device)
            back = ShapeTracker.from_shape((n, step)).reshape((n * step,))
        if len(live) * step != total:
            back = back.shrink(((0, total),))
        out.append(view_of(whole, back.reshape(shape)))
    return tuple(out)


def gathers_into(devices: list[str] | tuple[str, ...], piece_bytes: int) -> bool:
    """Whether copies can write pieces of ``piece_bytes`` into ranges of a buffer on each of ``devices`` (their
    allocators make offset views), so a gather is copies into one buffer rather than copies then a kernel
    joining them. Device memory often views only ranges aligned to some bytes (OpenCL's base address
    alignment, up to 128 bytes): other pieces are joined by a kernel there, not patched through the host."""
    from ember.device.allocator import Allocator
    from ember.device.registry import Device

    allocators = [type(Device[d].allocator) for d in devices]
    if any(a.offset is Allocator.offset for a in allocators):
        return False
    return piece_bytes % 256 == 0 or all(a.as_buffer is not Allocator.as_buffer for a in allocators)


def gathered(pieces: list[UOp], device: str) -> UOp:
    """The pieces (nodes on any devices) one after another, flat, in one buffer on ``device``: a gathering copy,
    each piece copied into its place (a piece already on ``device`` is copied there too)."""
    return UOp(Ops.COPY, pieces[0].dtype, tuple(pieces) + (UOp(Ops.DEVICE, None, (), device),))


#: the collective's name of each op an allreduce combines with
_NATIVE_OPS = {Ops.ADD: "add", Ops.MAX: "max", Ops.MUL: "mul"}


def _whole(x: UOp) -> UOp:
    """``x`` as a node whose buffer holds exactly its elements in order (a collective reads whole buffers)."""
    base = base_of(x)
    size = base.arg[2] if base.op is Ops.BUFFER else prod(shape_of(base))
    if base.op in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY) and (x is base or x.arg.contiguous) \
            and prod(shape_of(x)) == size:
        return x
    return UOp(Ops.CONTIGUOUS, x.dtype, (x,))


def stored(x: UOp) -> UOp:
    """``x`` as a node the scheduler keeps in a buffer of its own, in order: itself when it already is one."""
    base = x.src[0] if x.op is Ops.VIEW else x
    if base.op in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY) and (x is base or x.arg.contiguous):
        return x
    return UOp(Ops.CONTIGUOUS, x.dtype, (x,))


def join(pieces: list[tuple[UOp, int]], axis: int, shape: tuple[int, ...], device: str) -> UOp:
    """The pieces (node on ``device``, offset along ``axis``), which tile ``axis`` of ``shape``, as one node:
    each padded to ``shape`` and picked where it lies (a select, not a sum: -0.0 and nan stay as they are)."""
    whole: UOp | None = None
    for piece, offset in pieces:
        pshape = shape_of(piece)
        pad = tuple((offset, shape[axis] - offset - pshape[axis]) if k == axis else (0, 0) for k in range(len(shape)))
        placed = ShapeTracker.from_shape(pshape).pad(pad)
        if whole is None:
            whole = view_of(piece, placed)
            continue
        inside = UOp(Ops.CONST, dtypes.bool, (UOp(Ops.DEVICE, None, (), device),), True)
        mask = view_of(inside, ShapeTracker.from_shape(()).reshape((1,) * len(shape)).expand(pshape) + placed)
        whole = UOp(Ops.WHERE, piece.dtype, (mask, view_of(piece, placed), whole))
    assert whole is not None, "nothing to join"
    return whole


def shrink_across(m: UOp, arg: tuple[tuple[int, int], ...]) -> UOp:
    """``shrink(arg)`` of the sharded value ``m`` where it cuts the sharded axis: a replicated result, each device
    fetching only the parts of the shards that lie inside (the first row of a batch is one row from one device)."""
    axis, n = m.arg, len(m.src)
    local_shape = shape_of(m.src[0])
    size = local_shape[axis]
    lo, hi = arg[axis]
    out_shape = tuple(e - b for b, e in arg)
    parts = [(j, max(lo, j * size) - j * size, min(hi, (j + 1) * size) - j * size) for j in range(n)]
    parts = [p for p in parts if p[1] < p[2]] or [(0, 0, 0)]
    out = []
    for device in device_of(m):
        pieces = []
        for j, a, b in parts:
            local = tuple((a, b) if k == axis else r for k, r in enumerate(arg))
            piece = view_of(m.src[j], ShapeTracker.from_shape(local_shape).shrink(local))
            pieces.append((copy_to(piece, device), j * size + a - lo))
        out.append(join(pieces, axis, out_shape, device))
    return multi(tuple(out), None)
