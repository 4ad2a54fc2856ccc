"""Exponentials, logarithms, roots, trigonometric and hyperbolic functions of the Tensor API.

A mixin of :class:`ember.tensor.Tensor`. Integer and bool inputs give the default float, like
torch. exp, exp2, log, log2, sqrt and sin are single device primitives; the others are formulas
from :mod:`ember.frontend.libm` with their own derivatives. The math-library functions (cos, tan,
asin, acos, atan, sinh, cosh, asinh, acosh, atanh, erf, expm1, log1p, log10) evaluate float32
inputs in float64 when the device supports it and round once; elsewhere they run in float32.
``logaddexp`` combines two tensors: ``log(exp(a) + exp(b))`` without overflow.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.frontend import libm
from ember.frontend.base import TensorBase
from ember.frontend.reduce import _logaddexp
from ember.frontend.util import Scalar, compute_dtype, not_implemented
from ember.ir.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor


class TranscendentalMixin(TensorBase):
    """exp, log, sqrt, trigonometric, hyperbolic and error functions, and logaddexp."""

    __slots__ = ()

    def _float_unary(self, op: Ops) -> Tensor:
        return self._to_float()._alu(op)

    def exp(self) -> Tensor:
        """``e ** self``."""
        return self._float_unary(Ops.EXP)

    def exp2(self) -> Tensor:
        """``2 ** self``."""
        return self._float_unary(Ops.EXP2)

    def log(self) -> Tensor:
        """Natural logarithm (``log(0) = -inf``, negative inputs give nan)."""
        return self._float_unary(Ops.LOG)

    def log2(self) -> Tensor:
        """Base-2 logarithm."""
        return self._float_unary(Ops.LOG2)

    def log10(self) -> Tensor:
        """Base-10 logarithm."""
        return self._unary("log10", lambda x: x.log() * (1 / math.log(10.0)),
                           lambda g, o, x: g / (x * math.log(10.0)), wide=True)

    def log1p(self) -> Tensor:
        """``log(1 + self)``, accurate for small inputs."""
        return self._unary("log1p", libm.log1p, lambda g, o, x: g / (x + 1), wide=True)

    def expm1(self) -> Tensor:
        """``exp(self) - 1``, accurate for small inputs."""
        return self._unary("expm1", libm.expm1, lambda g, o, x: g * (o + 1), wide=True)

    def sqrt(self) -> Tensor:
        """Square root (negative inputs give nan)."""
        return self._float_unary(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        """``1 / sqrt(self)``."""
        return self.sqrt().reciprocal()

    def sin(self) -> Tensor:
        """Sine (radians)."""
        return self._float_unary(Ops.SIN)

    def cos(self) -> Tensor:
        """Cosine (radians), accurate for large arguments too."""
        return self._unary("cos", libm.cos, lambda g, o, x: -g * x.sin(), wide=True)

    def tan(self) -> Tensor:
        """Tangent (radians)."""
        return self._unary("tan", libm.tan, lambda g, o, x: g * (o * o + 1), wide=True)

    def asin(self) -> Tensor:
        """Inverse sine; nan outside [-1, 1]."""
        return self._unary("asin", libm.asin, lambda g, o, x: g * ((1 - x) * (1 + x)).rsqrt(), wide=True)

    def acos(self) -> Tensor:
        """Inverse cosine; nan outside [-1, 1]."""
        return self._unary("acos", libm.acos, lambda g, o, x: -g * ((1 - x) * (1 + x)).rsqrt(), wide=True)

    def atan(self) -> Tensor:
        """Inverse tangent."""
        return self._unary("atan", libm.atan, lambda g, o, x: g / (x * x + 1), wide=True)

    def sinh(self) -> Tensor:
        """Hyperbolic sine."""
        return self._unary("sinh", libm.sinh, lambda g, o, x: g * x.cosh(), wide=True)

    def cosh(self) -> Tensor:
        """Hyperbolic cosine."""
        return self._unary("cosh", libm.cosh, lambda g, o, x: g * x.sinh(), wide=True)

    def tanh(self) -> Tensor:
        """Hyperbolic tangent, accurate near 0 and saturating to exactly +-1."""
        return self._unary("tanh", libm.tanh, lambda g, o, x: g * (1 - o * o))

    def asinh(self) -> Tensor:
        """Inverse hyperbolic sine."""
        return self._unary("asinh", libm.asinh, lambda g, o, x: g * (x * x + 1).rsqrt(), wide=True)

    def acosh(self) -> Tensor:
        """Inverse hyperbolic cosine; nan below 1."""
        return self._unary("acosh", libm.acosh, lambda g, o, x: g * ((x - 1) * (x + 1)).rsqrt(), wide=True)

    def atanh(self) -> Tensor:
        """Inverse hyperbolic tangent; +-inf at +-1, nan outside [-1, 1]."""
        return self._unary("atanh", libm.atanh, lambda g, o, x: g / ((1 - x) * (1 + x)), wide=True)

    def erf(self) -> Tensor:
        """The error function."""
        return self._unary("erf", libm.erf, lambda g, o, x: g * (-(x * x)).exp() * (2 / math.sqrt(math.pi)), wide=True)

    def logaddexp(self, other: Tensor | Scalar) -> Tensor:
        """``log(exp(self) + exp(other))`` elementwise, shifted by the larger input so it never overflows.

        Floats only, like torch (float16/bfloat16 compute in float32). Two ``-inf`` give ``-inf``; the
        gradients are ``g * exp(self - out)`` and ``g * exp(other - out)``.
        """
        a, b = self._broadcasted(other)
        if a.dtype.kind != "f":
            raise not_implemented("logaddexp_cpu", a.dtype)
        cdt = compute_dtype(a.dtype)
        return _logaddexp(a.cast(cdt), b.cast(cdt)).cast(a.dtype)
