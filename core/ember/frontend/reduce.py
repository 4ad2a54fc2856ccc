"""Reduce ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ember.dtype import DType, dtypes, to_dtype
from ember.graph.uop import Ops
from ember.helpers import prod

if TYPE_CHECKING:
    from ember.tensor import Tensor


class ReduceMixin:
    """Reduce methods; see the module docstring."""

    __slots__ = ()

    def _reduce_axes(self, axis: int | Sequence[int] | None) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return tuple(sorted({self._axis(a) for a in axes}))

    def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False,
            dtype: DType | str | None = None) -> Tensor:
        """Sum over ``axis`` (all axes when None). Bool and int inputs sum as int64, like torch."""
        if dtype is not None:
            out_dt = to_dtype(dtype)
        elif self.dtype.kind in "bi" or (self.dtype.kind == "u"):
            out_dt = dtypes.int64 if self.dtype.kind in "bi" else dtypes.uint64 if self.dtype.itemsize == 8 else dtypes.int64
        else:
            out_dt = self.dtype
        acc_dt = dtypes.float32 if out_dt in (dtypes.float16, dtypes.bfloat16) else out_dt
        return self.cast(acc_dt)._reduce(Ops.ADD, axis, keepdim).cast(out_dt)

    def prod(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        out_dt = dtypes.int64 if self.dtype.kind in "bi" else self.dtype
        return self.cast(out_dt)._reduce(Ops.MUL, axis, keepdim)

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Maximum over ``axis``; nan propagates."""
        self._check_nonempty_reduce(axis, "max")
        if self.dtype == dtypes.bool:
            return self.cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Minimum over ``axis``; nan propagates."""
        self._check_nonempty_reduce(axis, "min")
        if self.dtype == dtypes.bool:
            return self.logical_not().max(axis, keepdim).logical_not()
        if self.dtype.kind == "f":
            return -((-self).max(axis, keepdim))
        return ~((~self).max(axis, keepdim))

    def _check_nonempty_reduce(self, axis: int | Sequence[int] | None, name: str) -> None:
        axes = self._reduce_axes(axis)
        if any(self.shape[a] == 0 for a in axes) or (self.ndim and self.numel() == 0 and axis is None):
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                             f"Specify the reduction dim with the 'dim' argument.")

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Arithmetic mean over ``axis``."""
        if self.dtype.kind != "f":
            raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                               f"or complex dtype. Got: {self.dtype.name}")
        axes = self._reduce_axes(axis)
        n = prod(self.shape[a] for a in axes)
        s = self.sum(axis, keepdim)
        return s.div(n) if n else s * math.nan
