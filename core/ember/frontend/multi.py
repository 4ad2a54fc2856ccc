"""Tensors on several devices: ``shard``, ``to(devices)``, gathering, and movement ops on sharded tensors.

A multi-device tensor is one lazy tensor whose graph has MULTI nodes at its leaves (see :mod:`ember.ir.multi`):
its ``device`` is the tuple of devices, its ``shape`` the logical (whole) shape, and every op and gradient rule
works on it as on any tensor. Movement ops are pushed down to the shards here, when they are built: each movement
is replayed on every shard with the sizes of the sharded axis divided by the device count, and the axis is
followed through it (a reshape keeps it when the elements before it stay together, a permute moves it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ember.device.registry import Device
from ember.frontend.base import TensorBase
from ember.helpers import prod
from ember.ir.lazy import device_of, shape_of
from ember.ir.multi import (
    ShardingError,
    common_axis,
    copy_to,
    describe,
    lower,
    match_sharding,
    multi,
    shard_slice,
    shrink_across,
    view_of,
    view_replicated,
)
from ember.ir.shapetracker import ShapeTracker
from ember.ir.uop import Ops, UOp

if TYPE_CHECKING:
    from ember.tensor import Tensor


def canonical_devices(devices: Any) -> tuple[str, ...]:
    """``devices`` (a tuple or list of names) canonicalized, each checked to exist."""
    if isinstance(devices, str) or not isinstance(devices, (tuple, list)) or not devices:
        raise TypeError(f"devices must be a non-empty tuple of device names, got {devices!r}")
    out = tuple(Device.canonicalize(d) for d in devices)
    for d in out:
        Device[d]  # fail now, naming the device and what is installed
    return out


class MultiMixin(TensorBase):
    """``shard``, ``shard_``, ``shard_like``, ``to_`` and the multi-device parts of ``to`` and movement ops."""

    __slots__ = ()

    def shard(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        """This tensor split along ``axis`` into equal parts, one per device of ``devices`` in order, or
        replicated on every device when ``axis`` is None."""
        if isinstance(self.device, tuple):
            raise RuntimeError(f"can't shard a tensor that is already on several devices {self.device}")
        devs = canonical_devices(devices)
        if len(devs) == 1:
            return self.to(devs[0])
        if axis is None:
            return self.to(devs)
        a = self._axis(axis)
        size = self.shape[a]
        if not isinstance(size, int) or size % len(devs):
            raise RuntimeError(f"shard: axis {a} of shape {self.shape} (size {size}) does not split evenly over "
                               f"{len(devs)} devices")
        x = self.lazydata
        # a shard staying on this tensor's device gets a buffer of its own too: a view would keep the whole alive
        parts = tuple(copy_to(part, d) if d != self.device else UOp(Ops.CONTIGUOUS, x.dtype, (part,))
                      for d, part in ((d, shard_slice(x, a, i, len(devs))) for i, d in enumerate(devs)))
        src_dev = self.device
        out = type(self)(multi(parts, a))
        return out._record((self,), lambda g, o, p: (g.to(src_dev),), "copy")  # (saves nothing, as a copy)

    def shard_(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        """:meth:`shard` in place: this tensor becomes the sharded one (its history is dropped)."""
        return self.replace(self.shard(devices, axis))

    def shard_like(self, y: Tensor) -> Tensor:
        """This tensor on ``y``'s device(s), sharded as ``y`` is."""
        if not isinstance(y.device, tuple):
            return self.to(y.device)
        axis = lower(y.lazydata).arg
        if isinstance(self.device, tuple) and self.device == y.device and lower(self.lazydata).arg == axis:
            return self
        return self.shard(y.device, axis)

    def to_(self, device: Any) -> Tensor:
        """:meth:`to` in place (a gradient already computed moves too)."""
        moved = self.to(device)
        grad = self.grad.to(device) if self.grad is not None else None
        self.replace(moved)
        self.grad = grad
        return self

    # --- used by Tensor ------------------------------------------------------------------------
    def _to_multi(self, dev: Any) -> Tensor:
        """``to`` where this tensor or ``dev`` is a tuple of devices: a broadcast copy, or a gather."""
        src_dev = self.device
        x = self.lazydata
        if not isinstance(src_dev, tuple):
            out = type(self)(UOp(Ops.COPY, x.dtype, (x, UOp(Ops.DEVICE, None, (), dev))))
            return out._record((self,), lambda g, o, p: (g.to(src_dev),), "copy")
        m = lower(x)
        if isinstance(dev, tuple):  # another tuple of devices: gathered, replicated there (as tinygrad does)
            out = type(self)(UOp(Ops.COPY, x.dtype, (x, UOp(Ops.DEVICE, None, (), canonical_devices(dev)))))
            axis = m.arg
            return out._record((self,), lambda g, o, p: (g.to(src_dev)._sliced(axis),), "copy")
        if m.arg is None:
            here = next((s for s in m.src if device_of(s) == dev), m.src[0])
            out = type(self)(copy_to(here, dev))
        else:
            parts = [type(self)(copy_to(s, dev)) for s in m.src]
            out = type(self)(parts[0].cat(*parts[1:], dim=m.arg).lazydata)
        axis = m.arg
        return out._record((self,), lambda g, o, p: (g.shard(src_dev, axis),), "copy")

    def _sliced(self, axis: int | None) -> Tensor:
        """This replicated tensor sharded on ``axis`` of its devices: each keeps its slice (a view, no copy)."""
        m = lower(self.lazydata)
        if axis is None or m.arg == axis:
            return self
        return type(self)(multi(match_sharding(m, axis), axis))

    def _assign_multi(self, x: Tensor) -> Tensor:
        """``assign`` into a multi-device tensor: each shard written on its device (in place where it lives in a
        buffer), ``x`` already on the same devices. A replicated value assigned into a sharded tensor gives each
        shard its slice."""
        target, value = lower(self.lazydata), lower(x.lazydata)
        axis = target.arg
        if value.arg is not None and value.arg != axis:
            raise ShardingError(f"assign: a value {describe(value.arg, x.device)} into a tensor "
                                f"{describe(axis, self.device)} (tinygrad 0.14 refuses it too)")
        values = match_sharding(value, axis)
        cls = type(self)
        writes = tuple(cls(t).assign(cls(v)).lazydata for t, v in zip(target.src, values))
        self.lazydata = multi(writes, axis)
        self._ctx = x._ctx
        return self

    def _check_sharding(self, y: Tensor) -> None:
        """Refuse now, naming both, two operands of an elementwise op on different device tuples (operands sharded
        on different axes are resharded when the op is lowered)."""
        common_axis("elementwise op", [lower(self.lazydata), lower(y.lazydata)])

    def _multi_view(self, fn: Callable[[ShapeTracker], ShapeTracker], backward: Callable[[Tensor], Tensor]) -> Tensor:
        """A movement (``fn``, as given to ``_view``) of a multi-device tensor, applied to every shard."""
        m = lower(self.lazydata)
        recorder = _Moves()
        fn(recorder)  # (it records the calls a ShapeTracker would get)
        moves = recorder.calls
        if m.arg is None:
            out = type(self)(view_replicated(m, fn(ShapeTracker.from_shape(shape_of(m.src[0])))))
            return out._record((self,), lambda g, o, p: (backward(g),), "view")
        elif len(moves) == 1 and moves[0][0] == "shrink" and tuple(moves[0][1][m.arg]) != (0, self.shape[m.arg]):
            out = type(self)(shrink_across(m, tuple(moves[0][1])))
            return out._record((self,), lambda g, o, p: (backward(g),), "view")
        else:
            local, axis = _follow_axis(moves, self.shape, m.arg, self.device)
            shards = tuple(view_of(s, _replay(local, ShapeTracker.from_shape(shape_of(s)))) for s in m.src)
        out = type(self)(multi(shards, axis))
        return out._record((self,), lambda g, o, p: (backward(g),), "view")


class _Moves:
    """Stands in for a ShapeTracker to record the movement calls a ``_view`` function makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Callable[[Any], _Moves]:
        if name not in ("reshape", "permute", "expand", "pad", "shrink", "flip"):
            raise AttributeError(name)

        def record(arg: Any) -> _Moves:
            self.calls.append((name, arg))
            return self
        return record


def _replay(calls: list[tuple[str, Any]], st: ShapeTracker) -> ShapeTracker:
    for name, arg in calls:
        st = getattr(st, name)(arg)
    return st


def _follow_axis(calls: list[tuple[str, Any]], shape: tuple[Any, ...], axis: int,
                 devices: tuple[str, ...]) -> tuple[list[tuple[str, Any]], int]:
    """The movement ``calls`` as each shard makes them (sizes along the sharded axis divided by the device
    count), and where the sharded axis ends up; :class:`ShardingError` for a movement that would move elements
    between shards (tinygrad 0.14 refuses the same ones)."""
    n = len(devices)
    local: list[tuple[str, Any]] = []
    for name, arg in calls:
        if any(isinstance(s, UOp) for s in shape):
            raise _refuse(name, arg, shape, axis, devices, "symbolic sizes")
        if name == "reshape":
            new = tuple(arg)
            before = prod(shape[:axis])
            # the new axis: the last one with exactly the elements before the sharded axis before it
            acc = [prod(new[:k]) for k in range(len(new))]
            at = [k for k, p in enumerate(acc) if p == before and new[k] % n == 0 and new[k] > 1]
            if not at:
                raise _refuse(name, arg, shape, axis, devices, "the sharded axis does not survive the reshape")
            axis = at[-1]
            local.append((name, tuple(s // n if k == axis else s for k, s in enumerate(new))))
            shape = new
        elif name == "permute":
            axis = tuple(arg).index(axis)
            local.append((name, arg))
            shape = tuple(shape[k] for k in arg)
        elif name == "expand":
            local.append((name, tuple(s // n if k == axis else s for k, s in enumerate(arg))))
            shape = tuple(arg)
        elif name == "pad":
            if tuple(arg[axis]) != (0, 0):
                raise _refuse(name, arg, shape, axis, devices, f"it pads the sharded axis {axis}")
            local.append((name, arg))
            shape = tuple(s + b + e for s, (b, e) in zip(shape, arg))
        elif name == "shrink":
            if tuple(arg[axis]) != (0, shape[axis]):
                raise _refuse(name, arg, shape, axis, devices, f"it shrinks the sharded axis {axis}")
            local.append((name, tuple((0, s // n) if k == axis else r for k, (r, s) in enumerate(zip(arg, shape)))))
            shape = tuple(e - b for b, e in arg)
        elif name == "flip":
            if axis in tuple(arg):
                raise _refuse(name, arg, shape, axis, devices, f"it flips the sharded axis {axis}")
            local.append((name, arg))
    return local, axis


def _refuse(name: str, arg: Any, shape: tuple[Any, ...], axis: int, devices: tuple[str, ...],
            why: str) -> ShardingError:
    # tinygrad 0.14 refuses these too (RuntimeError "moved items between shards", "flipping not supported ...")
    return ShardingError(f"{name}{tuple(arg)} of a tensor of shape {shape} {describe(axis, devices)}: {why}, which "
                         "would move elements between shards; gather it first with .to(device) or reshard with "
                         ".to(other devices)")


__all__ = ["MultiMixin", "ShardingError", "canonical_devices"]
