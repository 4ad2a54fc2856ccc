"""ember's math library: float formulas for the Tensor API's transcendental functions.

Each function takes a float32 or float64 tensor and returns one of the same dtype, built from the
device primitives (EXP, LOG, EXP2, LOG2, SIN, SQRT, RECIP, POW) and small polynomial kernels
(Chebyshev fits computed with mpmath; interval, variable and degree are noted beside each table).
The formulas neither overflow nor cancel where a textbook identity would, and they keep the signs
of zero. They build graphs only and record no gradient: the transcendental and activation mixins
call them on detached inputs and attach the derivative themselves.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ember.dtype import dtypes

if TYPE_CHECKING:
    from ember.tensor import Tensor

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


def expm1(x: Tensor) -> Tensor:
    """``exp(x) - 1`` without cancellation near 0 (in x's dtype, float32 or float64)."""
    q = _EXPM1_64 if _bits(x) == 64 else _EXPM1_32
    near = x + x * x * _poly(x, q)
    far = x.exp() - 1
    return (x == 0).where(x, (x.abs() <= 1).where(near, far))


def log1p(t: Tensor) -> Tensor:
    """``log(1 + t)`` without cancellation near 0 (in t's dtype, float32 or float64)."""
    u = t + 1
    # log(u) * t / (u - 1) corrects the rounding of 1 + t (u - 1 is exact)
    corrected = u.log() * (t / (u - 1))
    out = (u == 1).where(t, (t == math.inf).where(t, corrected))
    if _bits(t) == 32:
        near = t + t * t * _poly((t - 0.35) * (1 / 0.65), _LOG1P_32)
        out = ((t >= -0.3) & (t <= 1.0)).where(near, out)
    return (t == 0).where(t, out)


def sigmoid(x: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))`` from ``exp(-|x|)``, so neither side overflows."""
    e = (-x.abs()).exp()
    d = e + 1
    return (x < 0).where(e / d, d.reciprocal())


def softplus_parts(x: Tensor) -> Tensor:
    """``log1p(exp(-|x|))``: softplus(x) = max(x, 0) + this, logsigmoid(x) = min(x, 0) - this."""
    return log1p((-x.abs()).exp())


def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent: a polynomial near 0, ``1 - 2 / (exp(2|x|) + 1)`` beyond."""
    a = x.abs()
    z = a * a
    near = a + a * z * _poly(z, _TANH_64 if _bits(x) == 64 else _TANH_32)
    far = 1 - 2 / ((a * 2).exp() + 1)
    return _odd(x, (a < 0.75).where(near, far))


def erf(x: Tensor) -> Tensor:
    """The error function: a polynomial below 1, ``1 - exp(-x*x) * R(x)`` above."""
    bits = _bits(x)
    a = x.abs()
    z = a * a
    small = a * _poly(z, _ERF_SMALL_64 if bits == 64 else _ERF_SMALL_32)
    lo, hi = _ERF_BIG_RANGE[bits]
    c = a.minimum(hi)
    r = _poly((c - (lo + hi) / 2) * (2 / (hi - lo)), _ERF_BIG_64 if bits == 64 else _ERF_BIG_32)
    big = 1 - (-(c * c)).exp() * r
    return _odd(x, (a < 1).where(small, big))


def atan(x: Tensor) -> Tensor:
    """Inverse tangent, reduced to ``|u| <= tan(pi/8)`` through ``1/x`` and ``(t - 1) / (t + 1)``."""
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


def cos(x: Tensor) -> Tensor:
    """Cosine, accurate near its zeros and for arguments so large that ``2 * x`` would overflow."""
    # sin(2x) / (2 sin x): both sines come from the primitive, whose argument reduction is exact,
    # so the quotient stays accurate near the zeros of cos, where cos(x) = sin(pi/2 - x) does not.
    s1 = x.sin()
    ratio = (x * 2).sin() / (s1 * 2)
    half = (x * 0.5).sin()
    huge = 1 - half * half * 2
    return (x == 0).where(1.0, (x.abs() > _huge(x)).where(huge, ratio))


def tan(x: Tensor) -> Tensor:
    """Tangent from the same two sines as :func:`cos`."""
    s1 = x.sin()
    ratio = s1 * s1 * 2 / (x * 2).sin()
    half = (x * 0.5).sin()
    huge = s1 / (1 - half * half * 2)
    out = (x.abs() > _huge(x)).where(huge, ratio)
    return (x.abs() < 1e-8).where(x, out)


def sinh(x: Tensor) -> Tensor:
    """Hyperbolic sine from ``expm1``, without overflow where ``exp(|x|)`` alone would."""
    a = x.abs()
    u = expm1(a)
    small = (u + u / (u + 1)) * 0.5
    h = (a * 0.5).exp()
    big = (h * 0.5) * h
    return _odd(x, (a > (700.0 if _bits(x) == 64 else 88.0)).where(big, small))


def cosh(x: Tensor) -> Tensor:
    """Hyperbolic cosine, without overflow where ``exp(|x|)`` alone would."""
    a = x.abs()
    e = a.exp()
    small = (e + e.reciprocal()) * 0.5
    h = (a * 0.5).exp()
    return (a > (700.0 if _bits(x) == 64 else 88.0)).where((h * 0.5) * h, small)


def asinh(x: Tensor) -> Tensor:
    """Inverse hyperbolic sine through ``log1p``; ``log(2|x|)`` where squaring would overflow."""
    a = x.abs()
    a2 = a * a
    r = log1p(a + a2 / ((a2 + 1).sqrt() + 1))
    big = a.log() + _LN2
    return _odd(x, (a > (2.0 ** 28 if _bits(x) == 64 else 4096.0)).where(big, r))


def acosh(x: Tensor) -> Tensor:
    """Inverse hyperbolic cosine through ``log1p``; nan below 1."""
    t = x - 1
    r = log1p(t + (t * 2 + t * t).sqrt())
    big = x.log() + _LN2
    r = (x > (2.0 ** 28 if _bits(x) == 64 else 4096.0)).where(big, r)
    return (x < 1).where(math.nan, r)


def atanh(x: Tensor) -> Tensor:
    """Inverse hyperbolic tangent as ``log1p(2|x| / (1 - |x|)) / 2``."""
    a = x.abs()
    return _odd(x, log1p(a * 2 / (1 - a)) * 0.5)


def asin(x: Tensor) -> Tensor:
    """Inverse sine as ``atan(x / sqrt(1 - x*x))``."""
    return atan(x / ((1 - x) * (1 + x)).sqrt())


def acos(x: Tensor) -> Tensor:
    """Inverse cosine as ``2 * atan(sqrt((1 - x) / (1 + x)))``."""
    return atan(((1 - x) / (1 + x)).sqrt()) * 2
