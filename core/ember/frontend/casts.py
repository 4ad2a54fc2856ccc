"""Casts named after torch's dtype methods: ``x.float()``, ``x.long()`` ...

A mixin of :class:`ember.tensor.Tensor`; each method is :meth:`cast` to one dtype. Also the dtype
query ``is_floating_point`` and ``to_``, which moves a tensor to another device in place.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ember.dtype import dtypes

if TYPE_CHECKING:
    from ember.tensor import Tensor


class CastMixin:
    """``float``, ``half``, ``bfloat16``, ``double``, ``int``, ``long``, ``short``, ``char``, ``byte``, ``bool``;
    ``is_floating_point`` and ``to_``."""

    __slots__ = ()

    def float(self) -> Tensor:
        """Cast to float32."""
        return self.cast(dtypes.float32)  # type: ignore[attr-defined]

    def half(self) -> Tensor:
        """Cast to float16."""
        return self.cast(dtypes.float16)  # type: ignore[attr-defined]

    def bfloat16(self) -> Tensor:
        """Cast to bfloat16."""
        return self.cast(dtypes.bfloat16)  # type: ignore[attr-defined]

    def double(self) -> Tensor:
        """Cast to float64."""
        return self.cast(dtypes.float64)  # type: ignore[attr-defined]

    def int(self) -> Tensor:
        """Cast to int32."""
        return self.cast(dtypes.int32)  # type: ignore[attr-defined]

    def long(self) -> Tensor:
        """Cast to int64."""
        return self.cast(dtypes.int64)  # type: ignore[attr-defined]

    def short(self) -> Tensor:
        """Cast to int16."""
        return self.cast(dtypes.int16)  # type: ignore[attr-defined]

    def char(self) -> Tensor:
        """Cast to int8."""
        return self.cast(dtypes.int8)  # type: ignore[attr-defined]

    def byte(self) -> Tensor:
        """Cast to uint8."""
        return self.cast(dtypes.uint8)  # type: ignore[attr-defined]

    def bool(self) -> Tensor:
        """Cast to bool (nonzero is true)."""
        return self.cast(dtypes.bool)  # type: ignore[attr-defined]

    def is_floating_point(self) -> bool:
        """Whether the dtype is a float type (float16, bfloat16, float32, float64)."""
        return self.dtype.kind == "f"  # type: ignore[attr-defined]

    def to_(self, device: str | None) -> Tensor:
        """Move this tensor (and its ``.grad``) to ``device`` in place; returns self.

        A leaf stays a leaf, so an optimizer holding it keeps working. A computed tensor becomes a copy
        of its old value, and gradients flow back to the old device through that copy.
        """
        moved = self.to(device)  # type: ignore[attr-defined]
        if moved is self:
            return self  # type: ignore[return-value]
        if self._ctx is not None:  # type: ignore[attr-defined]
            old = type(self)(self.lazydata, requires_grad=self.requires_grad)  # type: ignore[attr-defined]
            old._ctx = self._ctx  # type: ignore[attr-defined]
            moved = old.to(device)
            self._ctx = moved._ctx  # type: ignore[attr-defined]
        self.lazydata = moved.lazydata  # type: ignore[attr-defined]
        if self.grad is not None:  # type: ignore[attr-defined]
            self.grad = self.grad.to(device)  # type: ignore[attr-defined]
        return self  # type: ignore[return-value]
