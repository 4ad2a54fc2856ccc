"""Elementwise ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.dtype import dtypes
from ember.frontend.util import Scalar, broadcast_shape, make_const
from ember.graph.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor


class ElementwiseMixin:
    """Elementwise methods; see the module docstring."""

    __slots__ = ()

    def add(self, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return a._alu(Ops.ADD, b) if a.dtype != dtypes.bool else a._alu(Ops.OR, b)

    def sub(self, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        if a.dtype == dtypes.bool:
            raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                               "Use the `^` or `logical_xor()` operator instead.")
        return a._alu(Ops.SUB, b)

    def mul(self, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return a._alu(Ops.MUL, b) if a.dtype != dtypes.bool else a._alu(Ops.AND, b)

    def div(self, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """True division; integer inputs give the default float dtype."""
        a, b = self._broadcasted(y, reverse)
        if a.dtype.kind != "f":
            a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
        return a._alu(Ops.FDIV, b)

    def maximum(self, y: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(y)
        return a._alu(Ops.MAX, b) if a.dtype != dtypes.bool else a._alu(Ops.OR, b)

    def minimum(self, y: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(y)
        if a.dtype == dtypes.bool:
            return a._alu(Ops.AND, b)
        return a.lt_nan(b).where(a, b)

    def lt_nan(self, b: Tensor) -> Tensor:
        """``a < b`` or ``a`` is nan (so minimum propagates nan like torch)."""
        lt = self._alu(Ops.CMPLT, b, dtype=dtypes.bool)
        if self.dtype.kind != "f":
            return lt
        return lt._alu(Ops.OR, self._alu(Ops.CMPNE, self, dtype=dtypes.bool))

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """``x`` where self is true, else ``y`` (all broadcast together)."""
        cond = self.cast(dtypes.bool)
        if isinstance(x, type(self)):
            x2, y2 = x._broadcasted(y)
        elif isinstance(y, type(self)):
            y2, x2 = y._broadcasted(x)
        else:
            dt = dtypes.from_py(x) if dtypes.from_py(x).kind >= dtypes.from_py(y).kind else dtypes.from_py(y)
            x2, y2 = type(self)(make_const(x, dt, self.device)), type(self)(make_const(y, dt, self.device))
        shape = broadcast_shape(cond.shape, x2.shape, y2.shape)
        c, a, b = cond._broadcast_to(shape), x2._broadcast_to(shape), y2._broadcast_to(shape)
        return c._alu(Ops.WHERE, a, b, dtype=a.dtype)

    def _cmp(self, op: Ops, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return a._alu(op, b, dtype=dtypes.bool)

    def __lt__(self, y: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPLT, y)

    def __gt__(self, y: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPLT, y, reverse=True)

    def __le__(self, y: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return (self > y).logical_not() if self.dtype.kind != "f" else self._cmp(Ops.CMPLT, y)._alu(
            Ops.OR, self._cmp(Ops.CMPEQ, y))

    def __ge__(self, y: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return (self < y).logical_not() if self.dtype.kind != "f" else self._cmp(Ops.CMPLT, y, True)._alu(
            Ops.OR, self._cmp(Ops.CMPEQ, y))

    def __eq__(self, y: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPEQ, y)

    def __ne__(self, y: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPNE, y)

    def logical_not(self) -> Tensor:
        return self.cast(dtypes.bool)._alu(Ops.NEG)

    def neg(self) -> Tensor:
        if self.dtype == dtypes.bool:
            raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. "
                               "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
        return self._alu(Ops.NEG)

    def _float_unary(self, op: Ops) -> Tensor:
        x = self if self.dtype.kind == "f" else self.cast(dtypes.default_float)
        return x._alu(op)

    def exp(self) -> Tensor:
        return self._float_unary(Ops.EXP)

    def log(self) -> Tensor:
        return self._float_unary(Ops.LOG)

    def exp2(self) -> Tensor:
        return self._float_unary(Ops.EXP2)

    def log2(self) -> Tensor:
        return self._float_unary(Ops.LOG2)

    def sqrt(self) -> Tensor:
        return self._float_unary(Ops.SQRT)

    def sin(self) -> Tensor:
        return self._float_unary(Ops.SIN)

    def cos(self) -> Tensor:
        x = self if self.dtype.kind == "f" else self.cast(dtypes.default_float)
        return (math.pi / 2 - x).sin()

    def reciprocal(self) -> Tensor:
        return self._float_unary(Ops.RECIP)

    def relu(self) -> Tensor:
        """max(x, 0), with nan passing through."""
        return self.maximum(0)

    def sigmoid(self) -> Tensor:
        return (1 + (-self).exp()).reciprocal()

    def tanh(self) -> Tensor:
        return 2.0 * (2.0 * self).sigmoid() - 1.0

    def abs(self) -> Tensor:
        if self.dtype.kind in "ub":
            return self
        return (self < 0).where(-self, self)

    def trunc(self) -> Tensor:
        return self._alu(Ops.TRUNC) if self.dtype.kind == "f" else self

    def square(self) -> Tensor:
        return self * self

    def pow(self, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        if a.dtype.kind != "f":
            raise NotImplementedError("integer pow is not supported yet")
        return a._alu(Ops.POW, b)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __add__(self, y: Tensor | Scalar) -> Tensor:
        return self.add(y)

    def __radd__(self, y: Scalar) -> Tensor:
        return self.add(y, True)

    def __sub__(self, y: Tensor | Scalar) -> Tensor:
        return self.sub(y)

    def __rsub__(self, y: Scalar) -> Tensor:
        return self.sub(y, True)

    def __mul__(self, y: Tensor | Scalar) -> Tensor:
        return self.mul(y)

    def __rmul__(self, y: Scalar) -> Tensor:
        return self.mul(y, True)

    def __truediv__(self, y: Tensor | Scalar) -> Tensor:
        return self.div(y)

    def __rtruediv__(self, y: Scalar) -> Tensor:
        return self.div(y, True)

    def __pow__(self, y: Tensor | Scalar) -> Tensor:
        return self.pow(y)

    def __rpow__(self, y: Scalar) -> Tensor:
        return self.pow(y, True)

    def __invert__(self) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self._alu(Ops.XOR, type(self)(make_const(-1, self.dtype, self.device))._broadcast_to(self.shape))

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def double(self) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        return self.cast(dtypes.int64)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)
