"""Activation functions of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

They compute in the tensor's own float type (float16 and bfloat16 in float32), with formulations
from :mod:`ember.frontend.libm` that neither overflow nor cancel (``tanh`` stands with the
hyperbolic functions in :mod:`ember.frontend.transcendental`). Each carries the derivative torch
defines, kinks included: ``relu'(0) = 0``, and hardtanh's gradient flows strictly inside its
interval. Where torch rejects an integer or bool input, so does ember, with torch's error.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ember.dtype import DType, dtypes
from ember.frontend import libm
from ember.frontend.base import TensorBase
from ember.frontend.util import make_const

if TYPE_CHECKING:
    from ember.tensor import Tensor

_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


class ActivationMixin(TensorBase):
    """relu and its relatives, sigmoid, softplus, gelu, silu, mish, the hard approximations and softmin."""

    __slots__ = ()

    def relu(self) -> Tensor:
        """``max(self, 0)`` (nan stays nan); the gradient at 0 is 0."""
        if self.dtype == dtypes.bool:
            raise RuntimeError("Boolean inputs not supported for relu")
        out = self.detach().maximum(0)
        return self._custom((self,), out, lambda g, o, p: ((p[0].detach() > 0).where(g, 0.0),), "relu")

    def relu6(self) -> Tensor:
        """``min(max(self, 0), 6)``."""
        return self.hardtanh(0, 6)

    def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
        """Clamp to ``[min_val, max_val]``; the gradient flows strictly inside the interval."""
        dt = self.dtype
        if dt == dtypes.bool:
            raise RuntimeError("Bool inputs not supported for hardtanh")
        if dt.kind == "u" and (min_val < 0 or max_val < 0):
            raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")
        x = self.detach()
        if dt.kind != "f":
            lo, hi = (int(min_val), int(max_val))
            return x.maximum(type(self)(make_const(lo, dt, x.device))).minimum(type(self)(make_const(hi, dt, x.device)))
        out = x.maximum(min_val).minimum(max_val)

        def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor]:
            xs = p[0].detach()
            return (((xs > min_val) & (xs < max_val)).where(g, 0.0),)

        return self._custom((self,), out, rule, "hardtanh")

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        """``self`` where positive, else ``neg_slope * self``."""
        self._need_float("leaky_relu_cpu")
        x = self.detach()
        out = (x > 0).where(x, x * neg_slope)
        return self._custom((self,), out, lambda g, o, p: ((p[0].detach() > 0).where(g, g * neg_slope),),
                            "leaky_relu")

    def elu(self, alpha: float = 1.0) -> Tensor:
        """``self`` where positive, else ``alpha * (exp(self) - 1)``."""
        self._need_float("elu_cpu")

        def fwd(x: Tensor) -> Tensor:
            return (x > 0).where(x, libm.expm1(x) * alpha)

        return self._unary("elu", fwd, lambda g, o, x: (x > 0).where(g, g * x.exp() * alpha))

    def celu(self, alpha: float = 1.0) -> Tensor:
        """``max(0, self) + min(0, alpha * (exp(self / alpha) - 1))``."""
        self._need_float("elu_cpu")

        def fwd(x: Tensor) -> Tensor:
            return (x > 0).where(x, libm.expm1(x * (1 / alpha)) * alpha)

        return self._unary("celu", fwd,
                           lambda g, o, x: (x > 0).where(g, g * (x * (1 / alpha)).exp()))

    def selu(self, alpha: float = _SELU_ALPHA, gamma: float = _SELU_SCALE) -> Tensor:
        """``gamma * (self if self > 0 else alpha * (exp(self) - 1))`` (torch's constants)."""
        self._need_float("elu_cpu")

        def fwd(x: Tensor) -> Tensor:
            return (x > 0).where(x * gamma, libm.expm1(x) * (alpha * gamma))

        return self._unary("selu", fwd, lambda g, o, x: (x > 0).where(
            g * gamma, g * x.exp() * (alpha * gamma)))

    def sigmoid(self) -> Tensor:
        """``1 / (1 + exp(-self))`` without overflow; tiny results stay exact (no flush to 0)."""
        return self._unary("sigmoid", libm.sigmoid, lambda g, o, x: g * o * (1 - o))

    def logsigmoid(self) -> Tensor:
        """``log(sigmoid(self))``, stable for large inputs of either sign."""
        self._need_float("log_sigmoid_forward")
        return self._unary("logsigmoid", lambda x: x.minimum(0) - libm.softplus_parts(x),
                           lambda g, o, x: g * (-x).sigmoid())

    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """``log(1 + exp(beta * self)) / beta``, and ``self`` itself where ``beta * self > threshold``."""
        self._need_float("softplus_cpu")

        def fwd(x: Tensor) -> Tensor:
            z = x * beta if beta != 1 else x
            sp = z.maximum(0) + libm.softplus_parts(z)
            sp = sp / beta if beta != 1 else sp
            return (z > threshold).where(x, sp)

        def grad(g: Tensor, o: Tensor, x: Tensor) -> Tensor:
            z = x * beta
            return (z > threshold).where(g, g * z.sigmoid())

        return self._unary("softplus", fwd, grad)

    def softsign(self) -> Tensor:
        """``self / (1 + |self|)``."""
        if self.dtype.kind != "f":
            return self / (self.abs() + 1)  # integer arithmetic (wrapping) first, as torch does
        return self._unary("softsign", lambda x: x / (x.abs() + 1),
                           lambda g, o, x: g / ((x.abs() + 1) * (x.abs() + 1)))

    def silu(self) -> Tensor:
        """``self * sigmoid(self)``."""
        self._need_float("silu_cpu")
        return self * self.sigmoid()

    def swish(self) -> Tensor:
        """Alias of :meth:`silu`."""
        return self.silu()

    def mish(self) -> Tensor:
        """``self * tanh(softplus(self))``."""
        self._need_float("mish_cpu")
        return self * self.softplus().tanh()

    def quick_gelu(self) -> Tensor:
        """``self * sigmoid(1.702 * self)``."""
        return self * (self * 1.702).sigmoid()

    def gelu(self, approximate: str = "tanh") -> Tensor:
        """Gaussian error linear unit.

        ``approximate="tanh"`` (tinygrad's ``gelu()``) is ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3)))``,
        computed as ``x * sigmoid(2 * inner)`` so large negative inputs do not cancel;
        ``approximate="none"`` is the exact ``0.5 * x * (1 + erf(x / sqrt(2)))`` (torch's default).
        """
        self._need_float("GeluKernelImpl")
        if approximate == "tanh":
            def fwd(x: Tensor) -> Tensor:
                inner = (x + x * x * x * _GELU_C) * (2 * _SQRT_2_PI)
                return x * libm.sigmoid(inner)

            def grad(g: Tensor, o: Tensor, xt: Tensor) -> Tensor:
                x = xt
                inner = (x + x * x * x * _GELU_C) * (2 * _SQRT_2_PI)
                s = inner.sigmoid()
                return g * (s + x * s * (1 - s) * (2 * _SQRT_2_PI) * (x * x * (3 * _GELU_C) + 1))

            return self._unary("gelu", fwd, grad)
        if approximate != "none":
            raise RuntimeError(f"approximate argument must be either none or tanh, got {approximate!r}")

        def fwd_exact(x: Tensor) -> Tensor:
            return x * 0.5 * (libm.erf(x * (1 / math.sqrt(2.0))) + 1)

        def grad_exact(g: Tensor, o: Tensor, xt: Tensor) -> Tensor:
            x = xt
            cdf = ((x * (1 / math.sqrt(2.0))).erf() + 1) * 0.5
            pdf = (x * x * -0.5).exp() * (1 / math.sqrt(2 * math.pi))
            return g * (cdf + x * pdf)

        return self._unary("gelu", fwd_exact, grad_exact)

    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        """``clamp(alpha * self + beta, 0, 1)`` (torch's defaults)."""
        self._need_float("hardsigmoid_cpu")
        torch_form = alpha == 1 / 6 and beta == 0.5

        def lin(x: Tensor) -> Tensor:
            return x * alpha + beta

        def fwd(x: Tensor) -> Tensor:
            if torch_form:
                return (x + 3).maximum(0).minimum(6) / 6
            return lin(x).maximum(0).minimum(1)

        def grad(g: Tensor, o: Tensor, xt: Tensor) -> Tensor:
            y = lin(xt)
            return ((y > 0) & (y < 1)).where(g * alpha, 0.0)

        return self._unary("hardsigmoid", fwd, grad)

    def hardswish(self) -> Tensor:
        """``self * relu6(self + 3) / 6``."""
        self._need_float("hardswish_cpu")

        def grad(g: Tensor, o: Tensor, xt: Tensor) -> Tensor:
            x = xt
            return (x <= -3).where(0.0, (x < 3).where(g * (x / 3 + 0.5), g))

        return self._unary("hardswish", lambda x: x * (x + 3).maximum(0).minimum(6) / 6, grad)

    def softmin(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """``softmax(-self)`` along ``axis``: weights in [0, 1] that sum to 1, largest for the smallest inputs.

        ``dtype`` casts the negated input first, as torch does (so bool inputs raise like torch's negation).
        """
        return (-self).softmax(axis, dtype)
