"""Bitwise ops and shifts of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

They take integers and bools (shifts integers only) and raise torch's error for floats. Shifts
follow torch: by the bit width or more, a left shift gives 0 and a right shift 0 or -1.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ember.dtype import dtypes
from ember.frontend.base import TensorBase
from ember.frontend.util import Scalar, make_const, not_implemented
from ember.ir.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor


class BitwiseMixin(TensorBase):
    """``& | ^ ~ << >>`` and their named forms."""

    __slots__ = ()

    def _check_bitwise(self, y: Tensor | Scalar, kernel: str, reverse: bool = False,
                       allow_bool: bool = True) -> tuple[Tensor, Tensor]:
        a, b = self._broadcasted(y, reverse)
        if a.dtype.kind == "f" or (not allow_bool and a.dtype.kind == "b"):
            raise not_implemented(kernel, a.dtype)
        return a, b

    def bitwise_and(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self & x`` for integers and bools."""
        a, b = self._check_bitwise(x, "bitwise_and_cpu", reverse)
        return a._alu(Ops.AND, b)

    def bitwise_or(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self | x`` for integers and bools."""
        a, b = self._check_bitwise(x, "bitwise_or_cpu", reverse)
        return a._alu(Ops.OR, b)

    def bitwise_xor(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self ^ x`` for integers and bools."""
        a, b = self._check_bitwise(x, "bitwise_xor_cpu", reverse)
        return a._alu(Ops.XOR, b)

    def xor(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Alias of :meth:`bitwise_xor`."""
        return self.bitwise_xor(x, reverse)

    def bitwise_not(self) -> Tensor:
        """``~self`` for integers; logical not for bools."""
        dt = self.dtype
        if dt == dtypes.bool:
            return self.logical_not()
        if dt.kind == "f":
            raise not_implemented("bitwise_not_cpu", dt)
        return self._alu(Ops.XOR, type(self)(make_const(-1, dt, self.device))._broadcast_to(self.shape))

    def lshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        """``self << x``; shifting by the bit width or more gives 0."""
        a, b = self._check_bitwise(x, "lshift_cpu", reverse, allow_bool=False)
        return a._alu(Ops.SHL, b)

    def rshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        """``self >> x`` (arithmetic for signed types); shifting by the bit width or more gives 0 or -1."""
        a, b = self._check_bitwise(x, "rshift_cpu", reverse, allow_bool=False)
        return a._alu(Ops.SHR, b)

    def bitwise_left_shift(self, x: Tensor | int) -> Tensor:
        """torch's name for :meth:`lshift`."""
        return self.lshift(x)

    def bitwise_right_shift(self, x: Tensor | int) -> Tensor:
        """torch's name for :meth:`rshift`."""
        return self.rshift(x)

    # --- operators -------------------------------------------------------------------------------
    def __and__(self, x: Tensor | Scalar) -> Tensor:
        """``self & x``."""
        return self.bitwise_and(x)

    def __rand__(self, x: Scalar) -> Tensor:
        """``x & self``."""
        return self.bitwise_and(x, True)

    def __or__(self, x: Tensor | Scalar) -> Tensor:
        """``self | x``."""
        return self.bitwise_or(x)

    def __ror__(self, x: Scalar) -> Tensor:
        """``x | self``."""
        return self.bitwise_or(x, True)

    def __xor__(self, x: Tensor | Scalar) -> Tensor:
        """``self ^ x``."""
        return self.bitwise_xor(x)

    def __rxor__(self, x: Scalar) -> Tensor:
        """``x ^ self``."""
        return self.bitwise_xor(x, True)

    def __lshift__(self, x: Tensor | int) -> Tensor:
        """``self << x``."""
        return self.lshift(x)

    def __rlshift__(self, x: int) -> Tensor:
        """``x << self``."""
        return self.lshift(x, True)

    def __rshift__(self, x: Tensor | int) -> Tensor:
        """``self >> x``."""
        return self.rshift(x)

    def __rrshift__(self, x: int) -> Tensor:
        """``x >> self``."""
        return self.rshift(x, True)

    def __invert__(self) -> Tensor:
        """``~self``: bitwise not for integers, logical not for bools (floats raise TypeError)."""
        if self.dtype.kind == "f":
            raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type tensors")
        return self.bitwise_not()

    def __iand__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self &= x``."""
        return self.assign(self & x)

    def __ior__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self |= x``."""
        return self.assign(self | x)

    def __ixor__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self ^= x``."""
        return self.assign(self ^ x)

    def __ilshift__(self, x: Tensor | int) -> Tensor:
        """In-place ``self <<= x``."""
        return self.assign(self << x)

    def __irshift__(self, x: Tensor | int) -> Tensor:
        """In-place ``self >>= x``."""
        return self.assign(self >> x)
