"""Properties of tensor-graph UOps: shape, device, base/view, and the buffers behind BUFFER nodes.

In the tensor graph a *base* node computes into a contiguous buffer of its shape, and a
VIEW(base, ShapeTracker) is a movement of it. A VIEW never has a VIEW as its source: movement
ops compose their ShapeTrackers.
"""
from __future__ import annotations

import itertools
import math
import weakref
from typing import Any

from ember.dtype import DType
from ember.ir.shapetracker import ShapeTracker
from ember.ir.uop import GroupOp, Ops, UOp, toposort

_buffer_ids = itertools.count()
#: the Buffer object behind each live BUFFER node
buffers: weakref.WeakKeyDictionary[UOp, Any] = weakref.WeakKeyDictionary()
#: computed node -> VIEW(BUFFER) holding its value, once realized
realized: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


def shape_of(u: UOp) -> tuple[int, ...]:
    """Logical shape of a tensor-graph node (memoized on the node)."""
    d = u.__dict__
    if "_shape" in d:
        return d["_shape"]
    if u.op is Ops.VIEW:
        out = u.arg.shape
    elif u.op is Ops.BUFFER:
        out = (u.arg[2],)
    elif u.op in (Ops.CONST, Ops.DEVICE):
        out = ()
    elif u.op is Ops.REDUCE_AXIS:
        s = shape_of(u.src[0])
        out = tuple(1 if i in u.arg[1] else x for i, x in enumerate(s))
    elif u.op is Ops.COPY and len(u.src) > 2:  # a gathering copy: its sources one after another, flat
        out = (sum(math.prod(shape_of(s)) for s in u.src[:-1]),)
    elif u.op is Ops.MULTI:  # the logical shape: the shards side by side along the sharded axis
        s, a = shape_of(u.src[0]), u.arg
        out = s if a is None else s[:a] + (s[a] * len(u.src),) + s[a + 1:]
    else:
        out = shape_of(u.src[0])
    d["_shape"] = out
    return out


def device_of(u: UOp) -> Any:
    """The device a tensor-graph node lives on: a name, or a tuple of names for a multi-device node."""
    d = u.__dict__
    if "_device" in d:
        return d["_device"]
    if u.op is Ops.DEVICE:
        out = u.arg
    elif u.op is Ops.BUFFER:
        out = u.arg[1]
    elif u.op in (Ops.COPY, Ops.ALLREDUCE):
        out = u.src[-1].arg
    elif u.op is Ops.CONST:
        out = u.src[0].arg
    elif u.op is Ops.MULTI:
        out = tuple(device_of(s) for s in u.src)
    else:
        out = device_of(u.src[0])
    d["_device"] = out
    return out


#: BUFFER nodes whose element ``i`` holds ``i`` and that are never written (the cached ramps of
#: ``Tensor._ramp``): a kernel computes a load of one from its index (see ``ember.codegen.lowerer``)
ramps: set[UOp] = set()


def base_of(u: UOp) -> UOp:
    return u.src[0] if u.op is Ops.VIEW else u


def new_buffer(device: str, size: int, dtype: DType, buf: Any = None) -> UOp:
    """A fresh BUFFER node (unique) owning ``buf`` (a :class:`ember.device.buffer.Buffer`)."""
    from ember.device.buffer import Buffer

    node = UOp(Ops.BUFFER, dtype, (), (next(_buffer_ids), device, size))
    buffers[node] = buf if buf is not None else Buffer(device, size, dtype)
    return node


def buffer_view(buf: UOp, shape: tuple[int, ...]) -> UOp:
    """VIEW of a BUFFER node as a contiguous tensor of ``shape``."""
    return UOp(Ops.VIEW, buf.dtype, (buf,), ShapeTracker.from_shape((buf.arg[2],)).reshape(tuple(shape)))


def constant_along(value: UOp, axes: tuple[int, ...]) -> bool:
    """Whether the tensor-graph node ``value`` is the same at every index along ``axes``: it is made, through
    elementwise ops, only of views that broadcast along them (stride 0, and no mask that cuts them), of constants,
    and of nodes 1 long on them. Matmul's product of two views broadcast along different axes is not."""
    shape = shape_of(value)
    if not all(isinstance(shape[a], int) for a in axes):
        return False
    live = [a for a in axes if shape[a] != 1]
    for n in toposort([value], stop=lambda u: u.op not in GroupOp.Elementwise and u.op is not Ops.DETACH):
        if n.op in GroupOp.Elementwise or n.op is Ops.DETACH or n.op is Ops.CONST:
            continue
        if shape_of(n) != shape:
            return False
        if n.op is not Ops.VIEW:
            if live:
                return False
            continue
        v = n.arg.views[-1]  # the outermost view: where it reads does not depend on an axis with stride 0
        for a in live:
            st, m = v.strides[a], None if v.mask is None else v.mask[a]
            if not (isinstance(st, int) and st == 0) or (m is not None and tuple(m) != (0, shape[a])):
                return False
    return True
