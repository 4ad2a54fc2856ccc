"""Comparisons and logic of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

Comparisons broadcast and promote like arithmetic and give bool tensors; nan compares unequal to
everything, itself included. The logical ops treat any nonzero value as true. ``isclose`` and
``allclose`` compare within tolerances, like torch's.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.dtype import dtypes
from ember.frontend.base import TensorBase
from ember.frontend.util import Scalar
from ember.ir.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor


class ComparisonMixin(TensorBase):
    """``< > <= >= == !=``, nan and inf tests, logical not/and/or/xor, isclose and allclose."""

    __slots__ = ()

    def _cmp(self, op: Ops, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return a._alu(op, b, dtype=dtypes.bool)

    def __lt__(self, x: Tensor | Scalar) -> Tensor:
        """``self < x`` as a bool tensor."""
        return self._cmp(Ops.CMPLT, x)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        """``self > x`` as a bool tensor."""
        return self._cmp(Ops.CMPLT, x, reverse=True)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        """``self <= x`` as a bool tensor (false where either side is nan)."""
        return self._cmp(Ops.CMPLT, x)._alu(Ops.OR, self._cmp(Ops.CMPEQ, x))

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        """``self >= x`` as a bool tensor (false where either side is nan)."""
        return self._cmp(Ops.CMPLT, x, True)._alu(Ops.OR, self._cmp(Ops.CMPEQ, x))

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        """``self == x`` as a bool tensor."""
        return self._cmp(Ops.CMPEQ, x)

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        """``self != x`` as a bool tensor."""
        return self._cmp(Ops.CMPNE, x)

    def eq(self, x: Tensor | Scalar) -> Tensor:
        """``self == x`` as a bool tensor."""
        return self._cmp(Ops.CMPEQ, x)

    def ne(self, x: Tensor | Scalar) -> Tensor:
        """``self != x``."""
        return self._cmp(Ops.CMPNE, x)

    def lt(self, x: Tensor | Scalar) -> Tensor:
        """``self < x``."""
        return self < x

    def gt(self, x: Tensor | Scalar) -> Tensor:
        """``self > x``."""
        return self > x

    def le(self, x: Tensor | Scalar) -> Tensor:
        """``self <= x``."""
        return self <= x

    def ge(self, x: Tensor | Scalar) -> Tensor:
        """``self >= x``."""
        return self >= x

    def isnan(self) -> Tensor:
        """True where the value is nan."""
        if self.dtype.kind != "f":
            return self._cmp(Ops.CMPNE, self)  # always false for integers
        return self._alu(Ops.CMPNE, self, dtype=dtypes.bool)

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        """True where the value is +inf (``detect_positive``) or -inf (``detect_negative``)."""
        out = self._cmp(Ops.CMPLT, self)  # all false, nan included
        if self.dtype.kind != "f":
            return out
        if detect_positive:
            out = out | (self == math.inf)
        if detect_negative:
            out = out | (self == -math.inf)
        return out

    def isfinite(self) -> Tensor:
        """True where the value is neither inf nor nan."""
        if self.dtype.kind != "f":
            return self._cmp(Ops.CMPEQ, self)
        return self.abs() < math.inf

    def logical_not(self) -> Tensor:
        """``not self`` as a bool tensor (nonzero counts as true)."""
        return self.cast(dtypes.bool)._alu(Ops.NEG)

    def _logical(self, op: Ops, x: Tensor | Scalar) -> Tensor:
        a = self.cast(dtypes.bool)
        b = x.cast(dtypes.bool) if isinstance(x, type(self)) else bool(x)
        l, r = a._broadcasted(b)
        return l._alu(op, r)

    def logical_and(self, x: Tensor | Scalar) -> Tensor:
        """``self and x`` elementwise, as bools."""
        return self._logical(Ops.AND, x)

    def logical_or(self, x: Tensor | Scalar) -> Tensor:
        """``self or x`` elementwise, as bools."""
        return self._logical(Ops.OR, x)

    def logical_xor(self, x: Tensor | Scalar) -> Tensor:
        """``self xor x`` elementwise, as bools."""
        return self._logical(Ops.XOR, x)

    # --- closeness ---------------------------------------------------------------------------------
    def isclose(self, other: Tensor | Scalar, rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> Tensor:
        """True where ``|self - other| <= atol + rtol * |other|`` (or the two are equal), like ``torch.isclose``.

        Infinities are close only to themselves; nan is close to nan only with ``equal_nan``. ``other``
        may be a Python number; a tensor must have self's dtype (as in torch). Integers compute the
        difference in their own dtype and compare it with the float tolerance, as torch does.
        """
        if rtol < 0:
            raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
        if atol < 0:
            raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
        if isinstance(other, type(self)) and other.dtype != self.dtype:
            raise RuntimeError(f"{self.dtype.name} did not match {other.dtype.name}")
        a, b = self._broadcasted(other)
        close = a == b
        if equal_nan and a.dtype.kind == "f":
            close = close | (a.isnan() & b.isnan())
        if rtol == 0 and atol == 0:
            return close
        if a.dtype == dtypes.bool:
            a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
        allowed = (b * rtol).abs() + atol
        diff = (a - b).abs()
        return close | (diff.isfinite() & (diff <= allowed))

    def allclose(self, other: Tensor | Scalar, rtol: float = 1e-05, atol: float = 1e-08,
                 equal_nan: bool = False) -> Tensor:
        """Whether every element is :meth:`isclose` to ``other``, as a 0-d bool tensor (as in tinygrad).

        ``bool()`` of it is torch's answer; until it is read, it stays on the device (no host round trip).
        """
        return self.isclose(other, rtol=rtol, atol=atol, equal_nan=equal_nan).all()
