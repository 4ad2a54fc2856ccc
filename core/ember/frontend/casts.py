"""Casts named after torch's dtype methods: ``x.float()``, ``x.long()`` ...

A mixin of :class:`ember.tensor.Tensor`; each method is :meth:`cast` to one dtype.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ember.dtype import dtypes

if TYPE_CHECKING:
    from ember.tensor import Tensor


class CastMixin:
    """``float``, ``half``, ``bfloat16``, ``double``, ``int``, ``long``, ``short``, ``char``, ``byte``, ``bool``."""

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
