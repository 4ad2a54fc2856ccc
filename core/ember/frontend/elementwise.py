"""Elementwise ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

Semantics follow torch: type promotion with weak Python scalars, ``//`` floors and ``%`` takes
the sign of the divisor (``idiv`` truncates toward zero, as tinygrad's does), integer arithmetic
wraps in its own width, ``int ** int`` stays an integer, and a call torch rejects raises the
exception type torch raises. Two deliberate, documented differences: an integer tensor divided
(``//``, ``%``, ``idiv``) by a zero *tensor element* gives 0 where torch raises, and a float
``//`` is ``floor(a / b)`` (``%`` is ``a - floor(a / b) * b``), which can differ from torch by one
in the rare case where ``a / b`` rounds up to an integer.

Transcendental functions are built from the device primitives (EXP, LOG, EXP2, LOG2, SIN,
SQRT, RECIP, POW) and small polynomial kernels (Chebyshev fits computed with mpmath; interval,
variable and degree are noted beside each table):

* the activations used in training loops (tanh, sigmoid, softplus, logsigmoid, gelu, silu,
  mish, elu ...) compute in the tensor's own float type (float16 and bfloat16 in float32), with
  formulations that neither overflow nor cancel;
* the math-library functions (cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh,
  erf, expm1, log1p, log10) evaluate float32 inputs in float64 when the device supports it and
  round once, the way C libraries implement their float versions; elsewhere they run in float32.

Functions composed of several primitives carry their own gradient rule, so a gradient never
passes through an unused branch of a ``where`` (which would turn ``0 * inf`` into nan) and
kinks get the derivative torch defines (``relu'(0) = 0``, hardtanh's strict interior ...).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ember.device.registry import Device
from ember.dtype import DType, dtypes, result_type_scalar
from ember.frontend.util import Scalar, broadcast_shape, make_const
from ember.graph.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor

#: Evaluate float32 math-library functions in float64 where the device has float64.
PREFER_WIDE_MATH: bool = True

# --- polynomial kernels -------------------------------------------------------------------------
# Coefficients are highest degree first. "_32" tables reach float32 accuracy, "_64" tables float64.

# atan(u) = u + u**3 * P(u*u) for |u| <= tan(pi/8); P fitted on u*u in [0, 0.171573], degree 5 / 11
_ATAN_32 = (0.05048136501229186, -0.08624675365968232, 0.1107136491738574, -0.14284151187990332, 0.19999977258583856,
            -0.33333333279254496)
_ATAN_64 = (0.01628574303651472, -0.034570549512274305, 0.0455159273578562, -0.052304541643613894,
            0.05878928983403345, -0.0666642488448313, 0.07692296374962261, -0.0909090875349846,
            0.11111111105155398, -0.14285714285659828, 0.19999999999999804, -0.3333333333333333)
# erf(x) = x * E(x*x) for |x| < 1; E fitted on x*x in [0, 1], degree 6 / 12
_ERF_SMALL_32 = (7.875875062685488e-05, -0.000801686428716587, 0.005189087423433974, -0.026854212010626412,
                 0.11283594715160218, -0.37612626666720334, 1.1283791658483509)
_ERF_SMALL_64 = (5.957176147748911e-11, -1.1372848856791674e-09, 1.4659775274047436e-08, -1.6350312701054695e-07,
                 1.6461000484121368e-06, -1.4925595266831182e-05, 0.0001205533111164271, -0.000854832698083379,
                 0.0052239776248180145, -0.026866170645076792, 0.11283791670954879, -0.3761263890318375,
                 1.1283791670955126)
# erfc(x) * exp(x*x) = R((x - mid) / half) for x in [1, 4] (float32, degree 14) and [1, 6] (float64, degree 30)
_ERF_BIG_32 = (1.7581148051902643e-06, -5.053533408902687e-06, 7.66530081754953e-06, -2.050470840301931e-05,
               6.340933229062602e-05, -0.00016447866403796163, 0.00040873798595246475, -0.0010047997001988746,
               0.002403721451080501, -0.005570925693607461, 0.01248936700079338, -0.027005276189744354,
               0.05611049362976063, -0.11152102073476088, 0.2108063640611436)
_ERF_BIG_64 = (6.096624968614332e-10, -1.5114786449782725e-09, -1.0099480876298564e-09, 2.6635869107568587e-09,
               9.597458511055547e-09, -2.313380406055404e-08, 2.0766620450808687e-08, -4.5551021827612916e-08,
               1.4614480520522422e-07, -3.263444005599658e-07, 6.740620690712834e-07, -1.4583791026934757e-06,
               3.1473331910963984e-06, -6.644171891044074e-06, 1.38206733448045e-05, -2.8375421033603888e-05,
               5.742080518440341e-05, -0.00011444274581909268, 0.00022452993059700351, -0.0004333616469641549,
               0.0008222552565141488, -0.0015325157195868503, 0.0028033261864894706, -0.005028067967896857,
               0.00883342391639231, -0.01518251154565966, 0.0254955596437064, -0.04176678811943095,
               0.06663208245319109, -0.10330894458313124, 0.1552936556088943)
_ERF_BIG_RANGE = {32: (1.0, 4.0), 64: (1.0, 6.0)}
# expm1(x) = x + x*x * Q(x) for |x| <= 1; Q fitted on [-1, 1], degree 8 / 14
_EXPM1_32 = (2.803093809740753e-07, 2.8126444348705754e-06, 2.479802594840029e-05, 0.00019836988492303372,
             0.0013888898792537832, 0.00833334524139073, 0.04166666659235877, 0.16666666577313438, 0.5)
_EXPM1_64 = (4.838397490830109e-14, 7.753289909061301e-13, 1.1469860083749003e-11, 1.6057448519013338e-10,
             2.0876763758519634e-09, 2.505212058452295e-08, 2.755731919627328e-07, 2.7557319174051555e-06,
             2.4801587301645516e-05, 0.0001984126984137474, 0.0013888888888888835, 0.008333333333333236,
             0.041666666666666664, 0.16666666666666666, 0.5)
# log1p(t) = t + t*t * L((t - 0.35) / 0.65) for t in [-0.3, 1] (float32 only), degree 13
_LOG1P_32 = (1.0498500793539008e-05, -2.315833808906031e-05, 1.4543693649359788e-05, -3.305404981131739e-05,
             0.00012623438814864818, -0.0002864662826842824, 0.0006214438647324549, -0.0014422337397587894,
             0.0034067087556985793, -0.008164252875032117, 0.020052666650648403, -0.051028593388848235,
             0.13720229374895343, -0.4073094499680138)
# tanh(x) = x + x**3 * T(x*x) for |x| < 0.75; T fitted on x*x in [0, 0.5625], degree 7 / 13
_TANH_32 = (0.00025407582101150665, -0.001198577584792352, 0.003479914972375457, -0.00883507109676353,
            0.021865573468906514, -0.05396798348797654, 0.13333332615350418, -0.33333333330183745)
_TANH_64 = (5.985399672039163e-07, -3.833589294501544e-06, 1.3601729022897116e-05, -3.784864316675998e-05,
            9.628953316427487e-05, -0.0002389332673687292, 0.0005899837682081133, -0.0014558275482916571,
            0.003592127305771337, -0.008863235479105364, 0.021869488534033452, -0.0539682539682076,
            0.13333333333333294, -0.3333333333333333)

_LN2 = math.log(2.0)
_PI_2_HI = 1.5707963267948966  # pi/2 in double, and the rest of pi/2
_PI_2_LO = 6.123233995736766e-17
_PI_4_HI = 0.7853981633974483
_PI_4_LO = 3.061616997868383e-17
_TAN_PI_8 = 0.41421356237309503
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946

#: torch's names for dtypes in its "not implemented for" messages
_TORCH_NAMES = {"bool": "Bool", "char": "Char", "uchar": "Byte", "short": "Short", "ushort": "UInt16", "int": "Int",
                "uint": "UInt32", "long": "Long", "ulong": "UInt64", "half": "Half", "bfloat16": "BFloat16",
                "float": "Float", "double": "Double"}

_F64_SUPPORT: dict[str, bool] = {}


def _not_implemented(kernel: str, dt: DType) -> NotImplementedError:
    return NotImplementedError(f'"{kernel}" not implemented for \'{_TORCH_NAMES.get(dt.name, dt.name)}\'')


def _has_float64(device: str) -> bool:
    if device not in _F64_SUPPORT:
        _F64_SUPPORT[device] = dtypes.float64 in Device[device].renderer.supported_dtypes
    return _F64_SUPPORT[device]


def _compute_dtype(dt: DType) -> DType:
    """The float type a composed function computes in: float16 and bfloat16 go through float32."""
    return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt


def _bits(x: Tensor) -> int:
    return 64 if x.dtype == dtypes.float64 else 32


def _poly(x: Tensor, coeffs: Sequence[float]) -> Tensor:
    """Horner evaluation of ``coeffs`` (highest degree first) at ``x``."""
    acc = x * coeffs[0] + coeffs[1]
    for c in coeffs[2:]:
        acc = acc * x + c
    return acc


def _odd(x: Tensor, r: Tensor) -> Tensor:
    """An odd function's value at ``x`` from its value ``r`` at ``|x|`` (``-0.0`` stays ``-0.0``)."""
    return (x == 0).where(x, (x < 0).where(-r, r))


def _expm1(x: Tensor) -> Tensor:
    """``exp(x) - 1`` without cancellation near 0 (in x's dtype, float32 or float64)."""
    q = _EXPM1_64 if _bits(x) == 64 else _EXPM1_32
    near = x + x * x * _poly(x, q)
    far = x.exp() - 1
    return (x == 0).where(x, (x.abs() <= 1).where(near, far))


def _log1p(t: Tensor) -> Tensor:
    """``log(1 + t)`` without cancellation near 0 (in t's dtype, float32 or float64)."""
    u = t + 1
    # log(u) * t / (u - 1) corrects the rounding of 1 + t (u - 1 is exact)
    corrected = u.log() * (t / (u - 1))
    out = (u == 1).where(t, (t == math.inf).where(t, corrected))
    if _bits(t) == 32:
        near = t + t * t * _poly((t - 0.35) * (1 / 0.65), _LOG1P_32)
        out = ((t >= -0.3) & (t <= 1.0)).where(near, out)
    return (t == 0).where(t, out)


def _sigmoid(x: Tensor) -> Tensor:
    e = (-x.abs()).exp()
    d = e + 1
    return (x < 0).where(e / d, d.reciprocal())


def _softplus_parts(x: Tensor) -> Tensor:
    """``log1p(exp(-|x|))``: softplus(x) = max(x, 0) + this, logsigmoid(x) = min(x, 0) - this."""
    return _log1p((-x.abs()).exp())


def _tanh(x: Tensor) -> Tensor:
    a = x.abs()
    z = a * a
    near = a + a * z * _poly(z, _TANH_64 if _bits(x) == 64 else _TANH_32)
    far = 1 - 2 / ((a * 2).exp() + 1)
    return _odd(x, (a < 0.75).where(near, far))


def _erf(x: Tensor) -> Tensor:
    bits = _bits(x)
    a = x.abs()
    z = a * a
    small = a * _poly(z, _ERF_SMALL_64 if bits == 64 else _ERF_SMALL_32)
    lo, hi = _ERF_BIG_RANGE[bits]
    c = a.minimum(hi)
    r = _poly((c - (lo + hi) / 2) * (2 / (hi - lo)), _ERF_BIG_64 if bits == 64 else _ERF_BIG_32)
    big = 1 - (-(c * c)).exp() * r
    return _odd(x, (a < 1).where(small, big))


def _atan(x: Tensor) -> Tensor:
    a = x.abs()
    inv = a > 1
    t = inv.where(a.reciprocal(), a)
    mid = t > _TAN_PI_8
    u = mid.where((t - 1) / (t + 1), t)
    z = u * u
    r = u + u * z * _poly(z, _ATAN_64 if _bits(x) == 64 else _ATAN_32)
    r = mid.where((r + _PI_4_LO) + _PI_4_HI, r)
    r = inv.where(_PI_2_HI - (r - _PI_2_LO), r)
    return _odd(x, r)


def _huge(x: Tensor) -> float:
    """Magnitudes above which ``2 * x`` would overflow."""
    return 8.0e307 if _bits(x) == 64 else 1.0e38


def _cos(x: Tensor) -> Tensor:
    # sin(2x) / (2 sin x): both sines come from the primitive, whose argument reduction is exact,
    # so the quotient stays accurate near the zeros of cos, where cos(x) = sin(pi/2 - x) does not.
    s1 = x.sin()
    ratio = (x * 2).sin() / (s1 * 2)
    half = (x * 0.5).sin()
    huge = 1 - half * half * 2
    return (x == 0).where(1.0, (x.abs() > _huge(x)).where(huge, ratio))


def _tan(x: Tensor) -> Tensor:
    s1 = x.sin()
    ratio = s1 * s1 * 2 / (x * 2).sin()
    half = (x * 0.5).sin()
    huge = s1 / (1 - half * half * 2)
    out = (x.abs() > _huge(x)).where(huge, ratio)
    return (x.abs() < 1e-8).where(x, out)


def _sinh(x: Tensor) -> Tensor:
    a = x.abs()
    u = _expm1(a)
    small = (u + u / (u + 1)) * 0.5
    h = (a * 0.5).exp()
    big = (h * 0.5) * h
    return _odd(x, (a > (700.0 if _bits(x) == 64 else 88.0)).where(big, small))


def _cosh(x: Tensor) -> Tensor:
    a = x.abs()
    e = a.exp()
    small = (e + e.reciprocal()) * 0.5
    h = (a * 0.5).exp()
    return (a > (700.0 if _bits(x) == 64 else 88.0)).where((h * 0.5) * h, small)


def _asinh(x: Tensor) -> Tensor:
    a = x.abs()
    a2 = a * a
    r = _log1p(a + a2 / ((a2 + 1).sqrt() + 1))
    big = a.log() + _LN2
    return _odd(x, (a > (2.0 ** 28 if _bits(x) == 64 else 4096.0)).where(big, r))


def _acosh(x: Tensor) -> Tensor:
    t = x - 1
    r = _log1p(t + (t * 2 + t * t).sqrt())
    big = x.log() + _LN2
    r = (x > (2.0 ** 28 if _bits(x) == 64 else 4096.0)).where(big, r)
    return (x < 1).where(math.nan, r)


def _atanh(x: Tensor) -> Tensor:
    a = x.abs()
    return _odd(x, _log1p(a * 2 / (1 - a)) * 0.5)


def _asin(x: Tensor) -> Tensor:
    return _atan(x / ((1 - x) * (1 + x)).sqrt())


def _acos(x: Tensor) -> Tensor:
    return _atan(((1 - x) / (1 + x)).sqrt()) * 2


def _round_half_even(x: Tensor) -> Tensor:
    t = x.trunc()
    d = (x - t).abs()  # exact
    half_t = t * 0.5
    odd = half_t != half_t.trunc()
    up = (d > 0.5) | ((d == 0.5) & odd)
    step = (x < 0).where(_full_like(x, -1.0), _full_like(x, 1.0))
    return up.where(t + step, t)


class ElementwiseMixin:
    """Elementwise arithmetic, comparisons, bitwise ops, math functions and activations."""

    __slots__ = ()

    # --- helpers -----------------------------------------------------------------------------
    def _to_float(self) -> Tensor:
        """Self as a float tensor (integers and bools become the default float, like torch)."""
        return self if self.dtype.kind == "f" else self.cast(dtypes.default_float)  # type: ignore[attr-defined]

    def _need_float(self, kernel: str) -> None:
        if self.dtype.kind != "f":  # type: ignore[attr-defined]
            raise _not_implemented(kernel, self.dtype)  # type: ignore[attr-defined]

    def _custom(self, parents: tuple[Tensor, ...], out: Tensor,
                rule: Callable[[Tensor, Tensor, Sequence[Tensor]], Sequence[Tensor | None]], name: str) -> Tensor:
        """Attach ``rule`` as the gradient of ``out`` (computed from detached inputs) when it is a float."""
        if out.dtype.kind == "f":
            out._record(parents, rule, name)
        return out

    def _unary(self, name: str, fwd: Callable[[Tensor], Tensor], grad: Callable[[Tensor, Tensor, Tensor], Tensor],
               wide: bool = False) -> Tensor:
        """A float function computed from primitives with its own derivative ``grad(g, out, x)``.

        ``fwd`` runs on a detached input in the compute dtype: float32 for float16/bfloat16, and
        float64 for float32 when ``wide`` and the device supports float64.
        """
        x = self._to_float()
        dt = x.dtype
        cdt = _compute_dtype(dt)
        if wide and dt == dtypes.float32 and PREFER_WIDE_MATH and _has_float64(x.device):
            cdt = dtypes.float64
        out = fwd(x.detach().cast(cdt)).cast(dt)
        return self._custom((x,), out, lambda g, o, p: (grad(g, o, p[0]),), name)

    def _check_bitwise(self, y: Tensor | Scalar, kernel: str, reverse: bool = False,
                       allow_bool: bool = True) -> tuple[Tensor, Tensor]:
        a, b = self._broadcasted(y, reverse)  # type: ignore[attr-defined]
        if a.dtype.kind == "f" or (not allow_bool and a.dtype.kind == "b"):
            raise _not_implemented(kernel, a.dtype)
        return a, b

    # --- arithmetic ----------------------------------------------------------------------------
    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self + x`` with broadcasting and promotion (bools: logical or)."""
        a, b = self._broadcasted(x, reverse)  # type: ignore[attr-defined]
        return a._alu(Ops.ADD, b) if a.dtype != dtypes.bool else a._alu(Ops.OR, b)

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self - x`` (``x - self`` when ``reverse``)."""
        other_bool = x.dtype == dtypes.bool if isinstance(x, type(self)) else isinstance(x, bool)
        if self.dtype == dtypes.bool and other_bool:  # type: ignore[attr-defined]
            raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                               "Use the `^` or `logical_xor()` operator instead.")
        if self.dtype == dtypes.bool or other_bool:  # type: ignore[attr-defined]
            raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. "
                               "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
        a, b = self._broadcasted(x, reverse)  # type: ignore[attr-defined]
        return a._alu(Ops.SUB, b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self * x`` (bools: logical and)."""
        a, b = self._broadcasted(x, reverse)  # type: ignore[attr-defined]
        return a._alu(Ops.MUL, b) if a.dtype != dtypes.bool else a._alu(Ops.AND, b)

    def div(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """``self / x``: true division (integers give the default float), or rounded with
        ``rounding_mode="trunc"`` (toward zero) or ``"floor"`` (toward -inf), which keep integer dtypes."""
        a, b = self._broadcasted(x, reverse)  # type: ignore[attr-defined]
        if rounding_mode is None:
            if a.dtype.kind != "f":
                a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
            return a._alu(Ops.FDIV, b)
        if rounding_mode not in ("trunc", "floor"):
            raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                               f"'{rounding_mode}'")
        if a.dtype.kind == "f":
            q = a._alu(Ops.FDIV, b)
            return q.trunc() if rounding_mode == "trunc" else _float_floor_div(a, b, q)
        if a.dtype.kind == "b":
            raise _not_implemented(f"div_{rounding_mode}_cpu", a.dtype)
        _check_int_divisor(x, reverse, a.dtype)
        q = a._alu(Ops.IDIV, b)
        if rounding_mode == "trunc" or a.dtype.kind == "u":
            return q
        r = a._alu(Ops.MOD, b)
        fix = (r != 0) & ((r < 0) ^ (b < 0))
        return fix.where(q - 1, q)

    def idiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Division truncating toward zero (tinygrad's ``idiv``); float inputs give ``trunc(a / b)``."""
        return self.div(x, reverse, rounding_mode="trunc")

    def floor_divide(self, x: Tensor | Scalar) -> Tensor:
        """``self // x``: division rounding toward -inf (torch's ``floor_divide``)."""
        return self.div(x, rounding_mode="floor")

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self % x`` with the sign of the divisor (Python's and torch's ``remainder``)."""
        a, b = self._broadcasted(x, reverse)  # type: ignore[attr-defined]
        if a.dtype.kind == "f":
            return _float_mod(a, b)
        if a.dtype.kind == "b":
            raise _not_implemented("remainder_cpu", a.dtype)
        _check_int_divisor(x, reverse, a.dtype)
        r = a._alu(Ops.MOD, b)
        if a.dtype.kind == "u":
            return r
        fix = (r != 0) & ((r < 0) ^ (b < 0))
        return fix.where(r + b, r)

    def remainder(self, x: Tensor | Scalar) -> Tensor:
        """torch's name for :meth:`mod`."""
        return self.mod(x)

    def true_divide(self, x: Tensor | Scalar) -> Tensor:
        """torch's name for true division."""
        return self.div(x)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self ** x`` (``x ** self`` when ``reverse``).

        Floats use the device's ``pow`` (negative bases with integer-valued exponents get the right
        sign, ``0 ** 0 = 1``); ``x`` = 2, 3, 0.5, -0.5, -1, -2 take exact shortcuts as in torch.
        Integer ``**`` integer stays an integer and wraps on overflow; a negative Python exponent
        raises, a negative tensor exponent gives 0 except for bases 1 and -1.
        """
        if isinstance(x, np.generic):
            x = x.item()
        if not reverse and not isinstance(x, type(self)):
            if not isinstance(x, (int, float, bool)):
                raise TypeError(f"unsupported exponent type {type(x).__name__}")
            dt = result_type_scalar(self.dtype, x)  # type: ignore[attr-defined]
            base = self.cast(dt)  # type: ignore[attr-defined]
            if dt.kind == "b":
                raise _not_implemented("pow", dt)
            if dt.kind in "iu":
                if x < 0:
                    raise RuntimeError("Integers to negative integer powers are not allowed.")
                return _int_pow_const(base, int(x))
            return _float_pow_scalar(base, float(x))
        a, b = self._broadcasted(x, reverse)  # type: ignore[attr-defined]
        if a.dtype.kind == "b":
            raise _not_implemented("pow", a.dtype)
        if a.dtype.kind in "iu":
            return _int_pow_tensor(a, b)
        return _float_pow(a, b)

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise maximum; nan wins, equal inputs share the gradient."""
        a, b = self._broadcasted(x)  # type: ignore[attr-defined]
        return a._alu(Ops.MAX, b) if a.dtype != dtypes.bool else a._alu(Ops.OR, b)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise minimum; nan wins, equal inputs share the gradient."""
        a, b = self._broadcasted(x)  # type: ignore[attr-defined]
        if a.dtype == dtypes.bool:
            return a._alu(Ops.AND, b)
        if a.dtype.kind == "f":
            return -((-a)._alu(Ops.MAX, -b))
        return (a < b).where(a, b)

    def clamp(self, min_: Tensor | Scalar | None = None, max_: Tensor | Scalar | None = None, *,
              min: Tensor | Scalar | None = None, max: Tensor | Scalar | None = None) -> Tensor:
        """Limit values to ``[min_, max_]`` (either may be None or a tensor; torch's ``min=``/``max=``
        keywords work too); ``max_`` wins when ``min_ > max_``, nan stays nan. The gradient flows
        where ``min_ <= self <= max_``."""
        min_ = min if min_ is None else min_
        max_ = max if max_ is None else max_
        if min_ is None and max_ is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        x = self.detach()  # type: ignore[attr-defined]
        out = x
        lo = hi = None
        if min_ is not None:
            lo = min_.detach() if isinstance(min_, type(self)) else min_
            out = out.maximum(lo)
        if max_ is not None:
            hi = max_.detach() if isinstance(max_, type(self)) else max_
            out = out.minimum(hi)
        if out.dtype.kind != "f":
            return out
        parents = (self,) + tuple(t for t in (min_, max_) if isinstance(t, type(self)))

        def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor | None, ...]:
            xs = p[0].detach().cast(o.dtype)
            conds = ([xs >= lo] if lo is not None else []) + ([xs <= hi] if hi is not None else [])
            inside = conds[0] & conds[1] if len(conds) == 2 else conds[0]  # false at nan, as in torch
            grads: list[Tensor | None] = [_unbroadcast(inside.where(g, 0.0), p[0].shape)]
            if isinstance(min_, type(self)):
                below = xs < lo
                if hi is not None:
                    below = below & (_as_tensor(lo, xs) <= hi)
                grads.append(_unbroadcast(below.where(g, 0.0), min_.shape))
            if isinstance(max_, type(self)):
                above = (xs > hi) if lo is None else ((xs > hi) | (_as_tensor(lo, xs) > hi))
                grads.append(_unbroadcast(above.where(g, 0.0), max_.shape))
            return tuple(grads)

        return self._custom(parents, out, rule, "clamp")

    def clip(self, min_: Tensor | Scalar | None = None, max_: Tensor | Scalar | None = None, *,
             min: Tensor | Scalar | None = None, max: Tensor | Scalar | None = None) -> Tensor:
        """Alias of :meth:`clamp`."""
        return self.clamp(min_, max_, min=min, max=max)

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """``x`` where self is true (nonzero), else ``y``; all three broadcast together."""
        cond = self.cast(dtypes.bool)  # type: ignore[attr-defined]
        if isinstance(x, type(self)):
            x2, y2 = x._broadcasted(y)
        elif isinstance(y, type(self)):
            y2, x2 = y._broadcasted(x)
        else:
            dt = _scalar_pair_dtype(x, y)
            x2, y2 = type(self)(make_const(x, dt, self.device)), type(self)(make_const(y, dt, self.device))
        shape = broadcast_shape(cond.shape, x2.shape, y2.shape)
        c, a, b = cond._broadcast_to(shape), x2._broadcast_to(shape), y2._broadcast_to(shape)
        return c._alu(Ops.WHERE, a, b, dtype=a.dtype)

    def lerp(self, end: Tensor, weight: Tensor | float) -> Tensor:
        """``self + weight * (end - self)`` (floats only, like torch)."""
        self._need_float("lerp_kernel_scalar")
        if not isinstance(end, type(self)):
            raise TypeError(f"lerp(): argument 'end' must be Tensor, not {type(end).__name__}")
        if end.dtype != self.dtype:
            raise RuntimeError(f"expected dtype {self.dtype.name} for `end` but got dtype {end.dtype.name}")
        if isinstance(weight, type(self)) and weight.dtype != self.dtype:
            raise RuntimeError(f"expected dtype {self.dtype.name} for `weight` but got dtype {weight.dtype.name}")
        s, e = self.detach()._broadcasted(end.detach())  # type: ignore[attr-defined]
        w = weight.detach() if isinstance(weight, type(self)) else weight
        if isinstance(w, type(self)):
            shape = broadcast_shape(s.shape, w.shape)
            s, e, w = s._broadcast_to(shape), e._broadcast_to(shape), w._broadcast_to(shape)
        diff = e - s
        if isinstance(w, type(self)):
            out = (w.abs() < 0.5).where(s + diff * w, e - diff * (1 - w))
        else:
            out = s + diff * w if abs(w) < 0.5 else e - diff * (1 - w)
        parents = (self, end) + ((weight,) if isinstance(weight, type(self)) else ())

        def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor, ...]:
            wt = p[2] if len(p) > 2 else weight
            grads = [_unbroadcast(g * (1 - wt), p[0].shape), _unbroadcast(g * wt, p[1].shape)]
            if len(p) > 2:
                grads.append(_unbroadcast(g * (p[1] - p[0]), p[2].shape))
            return tuple(grads)

        return self._custom(parents, out, rule, "lerp")

    def neg(self) -> Tensor:
        """``-self`` (bools raise, as in torch)."""
        if self.dtype == dtypes.bool:  # type: ignore[attr-defined]
            raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. "
                               "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
        return self._alu(Ops.NEG)  # type: ignore[attr-defined]

    def reciprocal(self) -> Tensor:
        """``1 / self`` (integers give the default float)."""
        return self._to_float()._alu(Ops.RECIP)

    def square(self) -> Tensor:
        """``self * self`` (bools give int64, like torch)."""
        x = self.cast(dtypes.int64) if self.dtype == dtypes.bool else self  # type: ignore[attr-defined]
        return x * x

    def abs(self) -> Tensor:
        """``|self|`` (``abs(-0.0) = 0.0``); the gradient is ``sign(self)``, 0 at 0."""
        dt = self.dtype  # type: ignore[attr-defined]
        if dt.kind == "b":
            raise _not_implemented("abs_cpu", dt)
        if dt.kind == "u":
            return self  # type: ignore[return-value]
        if dt.kind == "i":
            return (self < 0).where(-self, self)
        x = self.detach()  # type: ignore[attr-defined]
        out = (x <= 0).where(0 - x, x)
        return self._custom((self,), out, lambda g, o, p: (g * p[0].detach().sign(),), "abs")

    def sign(self) -> Tensor:
        """-1, 0 or 1 in self's dtype (nan gives 0, like torch)."""
        dt = self.dtype  # type: ignore[attr-defined]
        if dt.kind == "b":
            return self  # type: ignore[return-value]
        x = self.detach()  # type: ignore[attr-defined]
        one, zero = _full_like(x, 1), _full_like(x, 0)
        out = (x > 0).where(one, zero if dt.kind == "u" else (x < 0).where(_full_like(x, -1), zero))
        return self._custom((self,), out, _zero_rule, "sign")

    def trunc(self) -> Tensor:
        """Round toward zero (integers are returned as they are)."""
        return self._round_op("trunc_cpu", lambda x: x._alu(Ops.TRUNC))

    def floor(self) -> Tensor:
        """Round toward -inf."""
        def fn(x: Tensor) -> Tensor:
            t = x._alu(Ops.TRUNC)
            return (x < t).where(t - 1, t)
        return self._round_op("floor_vml_cpu", fn)

    def ceil(self) -> Tensor:
        """Round toward +inf."""
        def fn(x: Tensor) -> Tensor:
            t = x._alu(Ops.TRUNC)
            return (x > t).where(t + 1, t)
        return self._round_op("ceil_vml_cpu", fn)

    def round(self, decimals: int = 0) -> Tensor:
        """Round half to even (like torch and numpy); ``decimals`` scales by ``10**decimals`` first."""
        if decimals == 0:
            return self._round_op("round_vml_cpu", _round_half_even)
        scale = 10.0 ** decimals
        return self._round_op("round_vml_cpu", lambda x: _round_half_even(x * scale) / scale)

    def _round_op(self, kernel: str, fn: Callable[[Tensor], Tensor]) -> Tensor:
        dt = self.dtype  # type: ignore[attr-defined]
        if dt.kind == "b":
            raise _not_implemented(kernel, dt)
        if dt.kind in "iu":
            return self  # type: ignore[return-value]
        out = fn(self.detach().cast(_compute_dtype(dt))).cast(dt)  # type: ignore[attr-defined]
        return self._custom((self,), out, _zero_rule, kernel.split("_")[0])

    # --- exp, log, roots, trigonometry --------------------------------------------------------------
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
        return self._unary("log1p", _log1p, lambda g, o, x: g / (x + 1), wide=True)

    def expm1(self) -> Tensor:
        """``exp(self) - 1``, accurate for small inputs."""
        return self._unary("expm1", _expm1, lambda g, o, x: g * (o + 1), wide=True)

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
        return self._unary("cos", _cos, lambda g, o, x: -g * x.sin(), wide=True)

    def tan(self) -> Tensor:
        """Tangent (radians)."""
        return self._unary("tan", _tan, lambda g, o, x: g * (o * o + 1), wide=True)

    def asin(self) -> Tensor:
        """Inverse sine; nan outside [-1, 1]."""
        return self._unary("asin", _asin, lambda g, o, x: g * ((1 - x) * (1 + x)).rsqrt(), wide=True)

    def acos(self) -> Tensor:
        """Inverse cosine; nan outside [-1, 1]."""
        return self._unary("acos", _acos, lambda g, o, x: -g * ((1 - x) * (1 + x)).rsqrt(), wide=True)

    def atan(self) -> Tensor:
        """Inverse tangent."""
        return self._unary("atan", _atan, lambda g, o, x: g / (x * x + 1), wide=True)

    def sinh(self) -> Tensor:
        """Hyperbolic sine."""
        return self._unary("sinh", _sinh, lambda g, o, x: g * x.cosh(), wide=True)

    def cosh(self) -> Tensor:
        """Hyperbolic cosine."""
        return self._unary("cosh", _cosh, lambda g, o, x: g * x.sinh(), wide=True)

    def tanh(self) -> Tensor:
        """Hyperbolic tangent, accurate near 0 and saturating to exactly +-1."""
        return self._unary("tanh", _tanh, lambda g, o, x: g * (1 - o * o))

    def asinh(self) -> Tensor:
        """Inverse hyperbolic sine."""
        return self._unary("asinh", _asinh, lambda g, o, x: g * (x * x + 1).rsqrt(), wide=True)

    def acosh(self) -> Tensor:
        """Inverse hyperbolic cosine; nan below 1."""
        return self._unary("acosh", _acosh, lambda g, o, x: g * ((x - 1) * (x + 1)).rsqrt(), wide=True)

    def atanh(self) -> Tensor:
        """Inverse hyperbolic tangent; +-inf at +-1, nan outside [-1, 1]."""
        return self._unary("atanh", _atanh, lambda g, o, x: g / ((1 - x) * (1 + x)), wide=True)

    def erf(self) -> Tensor:
        """The error function."""
        return self._unary("erf", _erf, lambda g, o, x: g * (-(x * x)).exp() * (2 / math.sqrt(math.pi)), wide=True)

    # --- activations --------------------------------------------------------------------------------
    def relu(self) -> Tensor:
        """``max(self, 0)`` (nan stays nan); the gradient at 0 is 0."""
        if self.dtype == dtypes.bool:  # type: ignore[attr-defined]
            raise RuntimeError("Boolean inputs not supported for relu")
        out = self.detach().maximum(0)  # type: ignore[attr-defined]
        return self._custom((self,), out, lambda g, o, p: ((p[0].detach() > 0).where(g, 0.0),), "relu")

    def relu6(self) -> Tensor:
        """``min(max(self, 0), 6)``."""
        return self.hardtanh(0, 6)

    def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
        """Clamp to ``[min_val, max_val]``; the gradient flows strictly inside the interval."""
        dt = self.dtype  # type: ignore[attr-defined]
        if dt == dtypes.bool:
            raise RuntimeError("Bool inputs not supported for hardtanh")
        if dt.kind == "u" and (min_val < 0 or max_val < 0):
            raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")
        x = self.detach()  # type: ignore[attr-defined]
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
        x = self.detach()  # type: ignore[attr-defined]
        out = (x > 0).where(x, x * neg_slope)
        return self._custom((self,), out, lambda g, o, p: ((p[0].detach() > 0).where(g, g * neg_slope),),
                            "leaky_relu")

    def elu(self, alpha: float = 1.0) -> Tensor:
        """``self`` where positive, else ``alpha * (exp(self) - 1)``."""
        self._need_float("elu_cpu")

        def fwd(x: Tensor) -> Tensor:
            return (x > 0).where(x, _expm1(x) * alpha)

        return self._unary("elu", fwd, lambda g, o, x: (x > 0).where(g, g * x.exp() * alpha))

    def celu(self, alpha: float = 1.0) -> Tensor:
        """``max(0, self) + min(0, alpha * (exp(self / alpha) - 1))``."""
        self._need_float("elu_cpu")

        def fwd(x: Tensor) -> Tensor:
            return (x > 0).where(x, _expm1(x * (1 / alpha)) * alpha)

        return self._unary("celu", fwd,
                           lambda g, o, x: (x > 0).where(g, g * (x * (1 / alpha)).exp()))

    def selu(self, alpha: float = _SELU_ALPHA, gamma: float = _SELU_SCALE) -> Tensor:
        """``gamma * (self if self > 0 else alpha * (exp(self) - 1))`` (torch's constants)."""
        self._need_float("elu_cpu")

        def fwd(x: Tensor) -> Tensor:
            return (x > 0).where(x * gamma, _expm1(x) * (alpha * gamma))

        return self._unary("selu", fwd, lambda g, o, x: (x > 0).where(
            g * gamma, g * x.exp() * (alpha * gamma)))

    def sigmoid(self) -> Tensor:
        """``1 / (1 + exp(-self))`` without overflow; tiny results stay exact (no flush to 0)."""
        return self._unary("sigmoid", _sigmoid, lambda g, o, x: g * o * (1 - o))

    def logsigmoid(self) -> Tensor:
        """``log(sigmoid(self))``, stable for large inputs of either sign."""
        self._need_float("log_sigmoid_forward")
        return self._unary("logsigmoid", lambda x: x.minimum(0) - _softplus_parts(x),
                           lambda g, o, x: g * (-x).sigmoid())

    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """``log(1 + exp(beta * self)) / beta``, and ``self`` itself where ``beta * self > threshold``."""
        self._need_float("softplus_cpu")

        def fwd(x: Tensor) -> Tensor:
            z = x * beta if beta != 1 else x
            sp = z.maximum(0) + _softplus_parts(z)
            sp = sp / beta if beta != 1 else sp
            return (z > threshold).where(x, sp)

        def grad(g: Tensor, o: Tensor, x: Tensor) -> Tensor:
            z = x * beta
            return (z > threshold).where(g, g * z.sigmoid())

        return self._unary("softplus", fwd, grad)

    def softsign(self) -> Tensor:
        """``self / (1 + |self|)``."""
        if self.dtype.kind != "f":  # type: ignore[attr-defined]
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
                return x * _sigmoid(inner)

            def grad(g: Tensor, o: Tensor, xt: Tensor) -> Tensor:
                x = xt
                inner = (x + x * x * x * _GELU_C) * (2 * _SQRT_2_PI)
                s = inner.sigmoid()
                return g * (s + x * s * (1 - s) * (2 * _SQRT_2_PI) * (x * x * (3 * _GELU_C) + 1))

            return self._unary("gelu", fwd, grad)
        if approximate != "none":
            raise RuntimeError(f"approximate argument must be either none or tanh, got {approximate!r}")

        def fwd_exact(x: Tensor) -> Tensor:
            return x * 0.5 * (_erf(x * (1 / math.sqrt(2.0))) + 1)

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

    # --- comparisons and logic -------------------------------------------------------------------
    def _cmp(self, op: Ops, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)  # type: ignore[attr-defined]
        return a._alu(op, b, dtype=dtypes.bool)

    def __lt__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        """``self < x`` as a bool tensor."""
        return self._cmp(Ops.CMPLT, x)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        """``self > x`` as a bool tensor."""
        return self._cmp(Ops.CMPLT, x, reverse=True)

    def __le__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        """``self <= x`` as a bool tensor (false where either side is nan)."""
        return self._cmp(Ops.CMPLT, x)._alu(Ops.OR, self._cmp(Ops.CMPEQ, x))

    def __ge__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
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
        if self.dtype.kind != "f":  # type: ignore[attr-defined]
            return self._cmp(Ops.CMPNE, self)  # always false for integers
        return self._alu(Ops.CMPNE, self, dtype=dtypes.bool)  # type: ignore[attr-defined]

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        """True where the value is +inf (``detect_positive``) or -inf (``detect_negative``)."""
        out = self._cmp(Ops.CMPLT, self)  # all false, nan included
        if self.dtype.kind != "f":  # type: ignore[attr-defined]
            return out
        if detect_positive:
            out = out | (self == math.inf)
        if detect_negative:
            out = out | (self == -math.inf)
        return out

    def isfinite(self) -> Tensor:
        """True where the value is neither inf nor nan."""
        if self.dtype.kind != "f":  # type: ignore[attr-defined]
            return self._cmp(Ops.CMPEQ, self)
        return self.abs() < math.inf

    def logical_not(self) -> Tensor:
        """``not self`` as a bool tensor (nonzero counts as true)."""
        return self.cast(dtypes.bool)._alu(Ops.NEG)  # type: ignore[attr-defined]

    def _logical(self, op: Ops, x: Tensor | Scalar) -> Tensor:
        a = self.cast(dtypes.bool)  # type: ignore[attr-defined]
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

    # --- bitwise ---------------------------------------------------------------------------------
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
        dt = self.dtype  # type: ignore[attr-defined]
        if dt == dtypes.bool:
            return self.logical_not()
        if dt.kind == "f":
            raise _not_implemented("bitwise_not_cpu", dt)
        return self._alu(Ops.XOR, type(self)(make_const(-1, dt, self.device))._broadcast_to(self.shape))  # type: ignore

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
    def __neg__(self) -> Tensor:
        """``-self``."""
        return self.neg()

    def __add__(self, x: Tensor | Scalar) -> Tensor:
        """``self + x``."""
        return self.add(x)

    def __radd__(self, x: Scalar) -> Tensor:
        """``x + self``."""
        return self.add(x, True)

    def __sub__(self, x: Tensor | Scalar) -> Tensor:
        """``self - x``."""
        return self.sub(x)

    def __rsub__(self, x: Scalar) -> Tensor:
        """``x - self``."""
        return self.sub(x, True)

    def __mul__(self, x: Tensor | Scalar) -> Tensor:
        """``self * x``."""
        return self.mul(x)

    def __rmul__(self, x: Scalar) -> Tensor:
        """``x * self``."""
        return self.mul(x, True)

    def __truediv__(self, x: Tensor | Scalar) -> Tensor:
        """``self / x``."""
        return self.div(x)

    def __rtruediv__(self, x: Scalar) -> Tensor:
        """``x / self``."""
        return self.div(x, True)

    def __floordiv__(self, x: Tensor | Scalar) -> Tensor:
        """``self // x`` (rounds toward -inf)."""
        return self.div(x, rounding_mode="floor")

    def __rfloordiv__(self, x: Scalar) -> Tensor:
        """``x // self`` (rounds toward -inf)."""
        return self.div(x, True, rounding_mode="floor")

    def __mod__(self, x: Tensor | Scalar) -> Tensor:
        """``self % x`` (sign of ``x``)."""
        return self.mod(x)

    def __rmod__(self, x: Scalar) -> Tensor:
        """``x % self`` (sign of ``self``)."""
        return self.mod(x, True)

    def __pow__(self, x: Tensor | Scalar) -> Tensor:
        """``self ** x``."""
        return self.pow(x)

    def __rpow__(self, x: Scalar) -> Tensor:
        """``x ** self``."""
        return self.pow(x, True)

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
        if self.dtype.kind == "f":  # type: ignore[attr-defined]
            raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type tensors")
        return self.bitwise_not()

    def __ifloordiv__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self //= x``."""
        return self.assign(self // x)  # type: ignore[attr-defined]

    def __imod__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self %= x``."""
        return self.assign(self % x)  # type: ignore[attr-defined]

    def __ipow__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self **= x``."""
        return self.assign(self ** x)  # type: ignore[attr-defined]

    def __iand__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self &= x``."""
        return self.assign(self & x)  # type: ignore[attr-defined]

    def __ior__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self |= x``."""
        return self.assign(self | x)  # type: ignore[attr-defined]

    def __ixor__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self ^= x``."""
        return self.assign(self ^ x)  # type: ignore[attr-defined]

    def __ilshift__(self, x: Tensor | int) -> Tensor:
        """In-place ``self <<= x``."""
        return self.assign(self << x)  # type: ignore[attr-defined]

    def __irshift__(self, x: Tensor | int) -> Tensor:
        """In-place ``self >>= x``."""
        return self.assign(self >> x)  # type: ignore[attr-defined]

    # --- dtype shortcuts ---------------------------------------------------------------------------
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


# --- helpers used by the methods above ---------------------------------------------------------------

def _zero_rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor]:
    return (g.zeros_like(),)


def _full_like(x: Tensor, value: Scalar) -> Tensor:
    return type(x)(make_const(value, x.dtype, x.device))._broadcast_to(x.shape)


def _as_tensor(v: Tensor | Scalar, like: Tensor) -> Tensor:
    return v if isinstance(v, type(like)) else _full_like(like, v)


def _unbroadcast(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum ``g`` over the axes that broadcasting added to reach its shape from ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    out = g.sum(axes, keepdim=True) if axes else g
    return out.reshape(shape)


def _scalar_pair_dtype(x: Scalar, y: Scalar) -> DType:
    """torch's result dtype for ``where(cond, x, y)`` with two Python scalars."""
    kinds = {dtypes.from_py(x).kind, dtypes.from_py(y).kind}
    if "f" in kinds:
        return dtypes.default_float
    return dtypes.default_int if "i" in kinds else dtypes.bool


def _check_int_divisor(x: Any, reverse: bool, dt: DType) -> None:
    """An integer tensor divided by the Python constant 0 raises, as in torch."""
    if isinstance(x, np.generic):
        x = x.item()
    if not reverse and isinstance(x, (int, bool)) and x == 0 and dt.kind in "iu":
        raise RuntimeError("ZeroDivisionError")


def _float_floor_div(a: Tensor, b: Tensor, q: Tensor) -> Tensor:
    """``floor(a / b)`` with Python's and torch's answers where an operand is infinite."""
    out = q.floor()
    a_inf, b_inf = a.isinf(), b.isinf()
    opposite = (a != 0) & ((a < 0) ^ (b < 0))
    out = (b_inf & a.isfinite() & opposite).where(-1.0, out)
    return (a_inf & b.isfinite() & (b != 0)).where(math.nan, out)


def _float_mod(a: Tensor, b: Tensor) -> Tensor:
    """``a - floor(a / b) * b``, with the sign of ``b`` (a zero keeps the sign of ``a``), like torch's remainder."""
    r = a - a._alu(Ops.FDIV, b).floor() * b
    r = ((r != 0) & ((r < 0) ^ (b < 0))).where(r + b, r)
    r = (r == 0).where(a * 0.0, r)
    same = (a == 0) | ((a < 0) ^ (b > 0))
    return (b.isinf() & a.isfinite()).where(same.where(a, b), r)


def _int_pow_const(x: Tensor, n: int) -> Tensor:
    """``x ** n`` for an integer tensor and a non-negative Python int, by repeated squaring (wraps)."""
    if n == 0:
        return _full_like(x, 1)
    out: Tensor | None = None
    base = x
    while n:
        if n & 1:
            out = base if out is None else out * base
        n >>= 1
        if n:
            base = base * base
    assert out is not None
    return out


def _int_pow_tensor(a: Tensor, e: Tensor) -> Tensor:
    """``a ** e`` for integer tensors: square-and-multiply over every bit of the exponent's width."""
    dt = a.dtype
    out = _full_like(a, 1)
    base, rest = a, e
    for _ in range(dt.bitsize - (1 if dt.kind == "i" else 0)):
        out = ((rest & 1) != 0).where(out * base, out)
        base = base * base
        rest = rest >> 1
    if dt.kind == "u":
        return out
    one = _full_like(a, 1)
    odd = (e & 1) != 0
    negative = (a == 1).where(one, (a == -1).where(odd.where(-one, one), _full_like(a, 0)))
    return (e < 0).where(negative, out)


def _float_pow(a: Tensor, b: Tensor) -> Tensor:
    """``a ** b`` for float tensors with torch's gradient (0 where the exponent is 0 / the base is 0)."""
    out = a.detach()._alu(Ops.POW, b.detach())

    def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        x, y = p[0], p[1]
        gx = (y == 0).where(0.0, g * y * x._alu(Ops.POW, y - 1))
        gy = ((x == 0) & (y >= 0)).where(0.0, g * o * x.log())
        return gx, gy

    return out._record((a, b), rule, "pow") if out.dtype.kind == "f" else out


def _float_pow_scalar(x: Tensor, y: float) -> Tensor:
    """``x ** y`` for a float tensor and a Python exponent, with torch's exact shortcuts."""
    if y == 2:
        return x * x
    if y == 3:
        return x * x * x
    if y == 0.5:
        return x.sqrt()
    if y == -0.5:
        return x.rsqrt()
    if y == -1:
        return x.reciprocal()
    if y == -2:
        return (x * x).reciprocal()
    return _float_pow(x, _full_like(x, y))
