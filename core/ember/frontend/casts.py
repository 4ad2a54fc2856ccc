"""Casts named after torch's dtype methods: ``x.float()``, ``x.long()`` ...

A mixin of :class:`ember.tensor.Tensor`; each method is :meth:`cast` to one dtype. Also the dtype
query ``is_floating_point`` and ``to_``, which moves a tensor to another device in place.
"""
from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from ember.dtype import dtypes
from ember.frontend.base import TensorBase

if TYPE_CHECKING:
    from ember.tensor import Tensor


class CastMixin(TensorBase):
    """``float``, ``half``, ``bfloat16``, ``double``, ``int``, ``long``, ``short``, ``char``, ``byte``, ``bool``;
    ``is_floating_point`` and ``to_``."""

    __slots__ = ()

    def float(self) -> Tensor:
        """Cast to float32."""
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        """Cast to float16."""
        return self.cast(dtypes.float16)

    def bfloat16(self) -> Tensor:
        """Cast to bfloat16."""
        return self.cast(dtypes.bfloat16)

    def double(self) -> Tensor:
        """Cast to float64."""
        return self.cast(dtypes.float64)

    def int(self) -> Tensor:
        """Cast to int32."""
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        """Cast to int64."""
        return self.cast(dtypes.int64)

    def short(self) -> Tensor:
        """Cast to int16."""
        return self.cast(dtypes.int16)

    def char(self) -> Tensor:
        """Cast to int8."""
        return self.cast(dtypes.int8)

    def byte(self) -> Tensor:
        """Cast to uint8."""
        return self.cast(dtypes.uint8)

    def bool(self) -> Tensor:
        """Cast to bool (nonzero is true)."""
        return self.cast(dtypes.bool)

    def is_floating_point(self) -> builtins.bool:  # builtins: the method bool() above shadows the type here
        """Whether the dtype is a float type (float16, bfloat16, float32, float64)."""
        return self.dtype.kind == "f"

    def to_(self, device: str | None) -> Tensor:
        """Move this tensor (and its ``.grad``) to ``device`` in place; returns self.

        A leaf stays a leaf, so an optimizer holding it keeps working. A computed tensor becomes a copy
        of its old value, and gradients flow back to the old device through that copy.
        """
        moved = self.to(device)
        if moved is self:
            return self
        if self._ctx is not None:
            old = type(self)(self.lazydata, requires_grad=self.requires_grad)
            old._ctx = self._ctx
            moved = old.to(device)
            self._ctx = moved._ctx
        self.lazydata = moved.lazydata
        if self.grad is not None:
            self.grad = self.grad.to(device)
        return self
