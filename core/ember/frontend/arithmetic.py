"""Arithmetic of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): ``+ - * / // % **``,
minimum and maximum, clamp, where, lerp, abs, sign and rounding.

Semantics follow torch: type promotion with weak Python scalars, ``//`` floors and ``%`` takes
the sign of the divisor (``idiv`` truncates toward zero, as tinygrad's does), integer arithmetic
wraps in its own width, ``int ** int`` stays an integer, and a call torch rejects raises the
exception type torch raises. Float ``%`` and ``//`` build on the device's exact ``fmod`` (the
primitive ``MOD`` on floats), so they match torch at any quotient (``70000. % 0.001``,
``2.5 // 0.1 == 24``). One deliberate, documented difference: an integer tensor divided (``//``,
``%``, ``idiv``) by a zero *tensor element* gives 0 where torch raises.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from ember.dtype import DType, dtypes, result_type_scalar
from ember.frontend import checks, elementwise
from ember.frontend.base import TensorBase
from ember.frontend.util import Scalar, broadcast_shape, compute_dtype, make_const, not_implemented
from ember.helpers import is_np_scalar
from ember.ir.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor


class ArithmeticMixin(TensorBase):
    """Arithmetic, clamping, selection, sign and rounding, with their Python operators."""

    __slots__ = ()

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self + x`` with broadcasting and promotion (bools: logical or)."""
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b) if a.dtype != dtypes.bool else a._alu(Ops.OR, b)

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self - x`` (``x - self`` when ``reverse``)."""
        other_bool = x.dtype == dtypes.bool if isinstance(x, type(self)) else isinstance(x, bool)
        if self.dtype == dtypes.bool and other_bool:
            raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                               "Use the `^` or `logical_xor()` operator instead.")
        if self.dtype == dtypes.bool or other_bool:
            raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. "
                               "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.SUB, b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """``self * x`` (bools: logical and)."""
        a, b = self._broadcasted(x, reverse)
        if a.dtype == dtypes.bool:
            return a._alu(Ops.AND, b)
        if a.dtype.kind == "f" and (out := _saturating_product(a, b)) is not None:
            return out
        return a._alu(Ops.MUL, b)

    def div(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """``self / x``: true division (integers give the default float), or rounded with
        ``rounding_mode="trunc"`` (toward zero) or ``"floor"`` (toward -inf), which keep integer dtypes."""
        a, b = self._broadcasted(x, reverse)
        if rounding_mode is None:
            if a.dtype.kind != "f":
                a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
            if _is_one_plus(b, a):  # 1, not inf / inf, where x is inf (see _saturating_product)
                return _x_over_one_plus(a)
            return a._alu(Ops.FDIV, b)
        if rounding_mode not in ("trunc", "floor"):
            raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                               f"'{rounding_mode}'")
        if a.dtype.kind == "f":
            return a._alu(Ops.FDIV, b).trunc() if rounding_mode == "trunc" else _float_floor_div(a, b)
        if a.dtype.kind == "b":
            raise not_implemented(f"div_{rounding_mode}_cpu", a.dtype)
        _check_int_divisor(x, reverse, a.dtype, self)
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
        a, b = self._broadcasted(x, reverse)
        if a.dtype.kind == "f":
            return _float_mod(a, b)
        if a.dtype.kind == "b":
            raise not_implemented("remainder_cpu", a.dtype)
        _check_int_divisor(x, reverse, a.dtype, self)
        r = a._alu(Ops.MOD, b)
        if a.dtype.kind == "u":
            return r
        fix = (r != 0) & ((r < 0) ^ (b < 0))
        return fix.where(r + b, r)

    def remainder(self, x: Tensor | Scalar) -> Tensor:
        """torch's name for :meth:`mod`."""
        return self.mod(x)

    def fmod(self, x: Tensor | Scalar) -> Tensor:
        """C's remainder ``self - trunc(self / x) * x``: the sign follows the dividend (torch's ``fmod``).

        Integers use the device's truncating remainder (a Python 0 divisor raises like torch). Floats
        compute the quotient in float64 where the device has it (float16/bfloat16 in float32), which is
        exact for quotients below 2**29; ``fmod(x, inf) = x`` for finite ``x``, a zero divisor gives nan,
        and a zero result keeps the dividend's sign. Gradients: ``g`` for self, ``-g * trunc(self / x)``
        for ``x``.
        """
        a, b = self._broadcasted(x)
        if a.dtype.kind == "b":
            raise not_implemented("fmod_cpu", a.dtype)
        if a.dtype.kind in "iu":
            _check_int_divisor(x, False, a.dtype, self)
            return a._alu(Ops.MOD, b)
        dt = a.dtype
        wide = dt == dtypes.float32 and elementwise.PREFER_WIDE_MATH and elementwise._has_float64(a.device)
        cdt = dtypes.float64 if wide else compute_dtype(dt)
        n, d = a.detach().cast(cdt), b.detach().cast(cdt)
        r = n - n._alu(Ops.FDIV, d)._alu(Ops.TRUNC) * d
        # a quotient rounded up to the next integer leaves r with the wrong sign: add one |d| back
        r = ((r != 0) & ((r < 0) ^ (n < 0))).where(r + d.abs() * n.sign(), r)
        r = (r == 0).where(n * 0.0, r)  # -0.0 for a negative dividend, like C
        out = (d.isinf() & n.isfinite()).where(n, r).cast(dt)

        def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
            return g, -g * p[0].detach().div(p[1].detach(), rounding_mode="trunc")

        return self._custom((a, b), out, rule, "fmod")

    def copysign(self, other: Tensor | Scalar) -> Tensor:
        """The magnitude of self with the sign bit of ``other`` (``-0.0`` and signed nan included), like torch.

        Integer and bool inputs give the default float, as in torch. The gradient for self is
        ``g * out / self`` (0 where self is 0); ``other`` gets none.
        """
        a, b = self._broadcasted(other)
        if a.dtype.kind != "f":
            a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
        bits = _INT_OF_SIZE[a.dtype.itemsize]
        sign = dtypes.min(bits)  # only the top bit set
        mag = a.detach().bitcast(bits) & dtypes.max(bits)
        out = (mag | (b.detach().bitcast(bits) & sign)).bitcast(a.dtype)

        def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
            x = p[0].detach()
            return (x == 0).where(0.0, g * (o / x)), g.zeros_like()

        return self._custom((a, b), out, rule, "copysign")

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
        if is_np_scalar(x):
            x = x.item()
        if not reverse and not isinstance(x, type(self)):
            if not isinstance(x, (int, float, bool)):
                raise TypeError(f"unsupported exponent type {type(x).__name__}")
            dt = result_type_scalar(self.dtype, x)
            base = self.cast(dt)
            if dt.kind == "b":
                raise not_implemented("pow", dt)
            if dt.kind in "iu":
                if x < 0:
                    raise RuntimeError("Integers to negative integer powers are not allowed.")
                return _int_pow_const(base, int(x))
            return _float_pow_scalar(base, float(x))
        a, b = self._broadcasted(x, reverse)
        if a.dtype.kind == "b":
            raise not_implemented("pow", a.dtype)
        if a.dtype.kind in "iu":
            return _int_pow_tensor(a, b)
        return _float_pow(a, b)

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise maximum; nan wins, equal inputs share the gradient."""
        a, b = self._broadcasted(x)
        return a._alu(Ops.MAX, b) if a.dtype != dtypes.bool else a._alu(Ops.OR, b)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise minimum; nan wins, equal inputs share the gradient."""
        a, b = self._broadcasted(x)
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
        x = self.detach()
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
        cond = self.cast(dtypes.bool)
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
        s, e = self.detach()._broadcasted(end.detach())
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
        if self.dtype == dtypes.bool:
            raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. "
                               "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
        return self._alu(Ops.NEG)

    def reciprocal(self) -> Tensor:
        """``1 / self`` (integers give the default float)."""
        return self._to_float()._alu(Ops.RECIP)

    def square(self) -> Tensor:
        """``self * self`` (bools give int64, like torch)."""
        x = self.cast(dtypes.int64) if self.dtype == dtypes.bool else self
        return x * x

    def abs(self) -> Tensor:
        """``|self|`` (``abs(-0.0) = 0.0``); the gradient is ``sign(self)``, 0 at 0."""
        dt = self.dtype
        if dt.kind == "b":
            raise not_implemented("abs_cpu", dt)
        if dt.kind == "u":
            return self
        if dt.kind == "i":
            return (self < 0).where(-self, self)
        x = self.detach()
        out = (x <= 0).where(0 - x, x)
        return self._custom((self,), out, lambda g, o, p: (g * p[0].detach().sign(),), "abs")

    def sign(self) -> Tensor:
        """-1, 0 or 1 in self's dtype (nan gives 0, like torch)."""
        dt = self.dtype
        if dt.kind == "b":
            return self
        x = self.detach()
        one, zero = _full_like(x, 1), _full_like(x, 0)
        out = (x > 0).where(one, zero if dt.kind == "u" else (x < 0).where(_full_like(x, -1), zero))
        return self._custom((self,), out, _zero_rule, "sign")

    # --- rounding ---------------------------------------------------------------------------------
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
        dt = self.dtype
        if dt.kind == "b":
            raise not_implemented(kernel, dt)
        if dt.kind in "iu":
            return self
        out = fn(self.detach().cast(compute_dtype(dt))).cast(dt)
        return self._custom((self,), out, _zero_rule, kernel.split("_")[0])

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

    def __ifloordiv__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self //= x``."""
        return self.assign(self // x)

    def __imod__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self %= x``."""
        return self.assign(self % x)

    def __ipow__(self, x: Tensor | Scalar) -> Tensor:
        """In-place ``self **= x``."""
        return self.assign(self ** x)


# --- helpers used by the methods above ---------------------------------------------------------------

#: the signed integer dtype of each float item size, for bit manipulation of floats
_INT_OF_SIZE = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


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


def _check_int_divisor(x: Any, reverse: bool, dt: DType, this: Tensor) -> None:
    """An integer division by zero raises, as in torch: now for the Python constant 0 (or a constant tensor of
    zeros), at the next read for a computed divisor tensor (see :mod:`ember.frontend.checks`)."""
    if is_np_scalar(x):
        x = x.item()
    if dt.kind not in "iu":
        return
    if not reverse and isinstance(x, (int, bool)):
        if x == 0:
            raise RuntimeError("ZeroDivisionError")
        return
    divisor = this if reverse else x
    u = divisor.lazydata
    while u.op is Ops.VIEW and u.src:
        u = u.src[0]
    if u.op is Ops.CONST:  # a constant divisor is known now
        if u.arg == 0:
            raise RuntimeError("ZeroDivisionError")
        return
    checks.nonzero_divisor(divisor)


def _round_half_even(x: Tensor) -> Tensor:
    t = x.trunc()
    d = (x - t).abs()  # exact
    half_t = t * 0.5
    odd = half_t != half_t.trunc()
    up = (d > 0.5) | ((d == 0.5) & odd)
    step = (x < 0).where(_full_like(x, -1.0), _full_like(x, 1.0))
    return up.where(t + step, t)


def _float_floor_div(a: Tensor, b: Tensor) -> Tensor:
    """torch's float floor division, exact at any quotient: ``(a - fmod(a, b)) / b`` is within rounding of
    an integer, one less when the remainder's sign differs from the divisor's, rounded to the nearest
    integer; a zero quotient keeps the sign of ``a / b`` and a zero divisor gives ``a / b``. Computing
    ``floor(a / b)`` instead is off by one where ``a / b`` rounds up to an integer (``2.5 // 0.1``)."""
    dt = a.dtype
    n, d = a.detach().cast(compute_dtype(dt)), b.detach().cast(compute_dtype(dt))
    q = n._alu(Ops.FDIV, d)
    m = n._alu(Ops.MOD, d)
    div = (n - m)._alu(Ops.FDIV, d)
    div = ((m != 0) & ((d < 0) ^ (m < 0))).where(div - 1, div)
    fl = div.floor()
    fl = ((div - fl) > 0.5).where(fl + 1, fl)
    fl = (div == 0).where(q * 0.0, fl)  # q is finite here: the zero takes its sign
    out = (d == 0).where(q, fl).cast(dt)
    return out._record((a, b), lambda g, o, p: (g.zeros_like(), g.zeros_like()), "floor_divide")  # a step function


def _float_mod(a: Tensor, b: Tensor) -> Tensor:
    """torch's float remainder: the exact C ``fmod`` moved into the divisor's sign (``m + b`` when the signs
    differ). The device's ``fmod`` is exact at any quotient, where ``a - floor(a / b) * b`` loses every digit
    once ``a / b`` passes 2**24. Gradients: ``g`` for ``a``, ``-g * floor(a / b)`` for ``b``, as in torch."""
    dt = a.dtype
    n, d = a.detach().cast(compute_dtype(dt)), b.detach().cast(compute_dtype(dt))
    m = n._alu(Ops.MOD, d)
    out = ((m != 0) & ((d < 0) ^ (m < 0))).where(m + d, m).cast(dt)

    def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        return g, -g * _float_floor_div(p[0].detach(), p[1].detach())

    return out._record((a, b), rule, "remainder") if dt.kind == "f" else out


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


def _is_one_plus(b: Tensor, x: Tensor) -> bool:
    """Whether ``b`` was built as ``1 + x`` (or ``x + 1``) from this very ``x``."""
    u = b.lazydata
    if u.op is not Ops.ADD:
        return False
    for one, other in ((u.src[0], u.src[1]), (u.src[1], u.src[0])):
        if other is x.lazydata:
            while one.op is Ops.VIEW and one.src:
                one = one.src[0]
            return one.op is Ops.CONST and one.arg == 1
    return False


def _saturating_product(a: Tensor, b: Tensor) -> Tensor | None:
    """``x * (y / (1 + x))`` and ``x * (y * (1 / (1 + x)))`` as ``y * s(x)`` with ``s(x) = x / (1 + x)`` computed
    by :func:`_x_over_one_plus` (``x * (1 / (1 + x))`` as ``s(x)``), else None.

    ``s`` is finite where ``x`` overflowed to inf (1 there, not inf / inf), as tinygrad's rewrites of these
    forms make it. That is what keeps the gradient of ``exp(x) / (1 + exp(x))`` at 0 for large ``|x|``: its
    backward multiplies a ``g / (1 + e) / (1 + e)`` by ``e``, which this reads as ``(g / (1 + e)) * s(e)``.
    """
    for x, q in ((a, b), (b, a)):
        for y, den in _over_one_plus(q):
            if _is_one_plus(den, x):
                sat = _x_over_one_plus(x)
                return sat if y is None else y * sat
    return None


def _x_over_one_plus(x: Tensor) -> Tensor:
    """``x / (1 + x)``, finite where ``x`` is inf (1), with the derivative ``g / (1 + x) / (1 + x)``.

    Above 1 it is ``1 - 1 / (1 + x)`` (no cancellation there: ``1 / (1 + x) < 1/2``), elsewhere the quotient
    itself (so tiny ``x`` keep their relative precision, unlike tinygrad's ``1 - 1 / (1 + x)`` everywhere). Each
    branch reads an input the other branch's range cannot make inf, so neither gives a nan to the gradient.
    """
    d = x.detach()
    big = d > 1
    xb, xs = big.where(d, 2.0), big.where(0.0, d)
    out = big.where(1 - (1 + xb).reciprocal(), xs._alu(Ops.FDIV, 1 + xs))
    return x._custom((x,), out, lambda g, o, p: ((g / (1 + p[0])) / (1 + p[0]),), "x/(1+x)")


def _over_one_plus(q: Tensor) -> list[tuple[Tensor | None, Tensor]]:
    """The ways ``q`` reads as ``y / den`` with ``den`` an ADD (y None for ``1 / den``): ``y / den``,
    ``reciprocal(den)`` and ``y * reciprocal(den)``, as tensors (its recorded parents when it has them)."""
    u = q.lazydata

    def parts() -> tuple[Tensor, ...]:
        if q._ctx is not None and len(q._ctx.parents) == len(u.src):
            return tuple(q._ctx.parents)
        return tuple(type(q)(s) for s in u.src)

    if u.op is Ops.RECIP and u.src[0].op is Ops.ADD:
        return [(None, parts()[0])]
    if u.op is Ops.FDIV and u.src[1].op is Ops.ADD:
        y, den = parts()
        return [(y, den)]
    if u.op is Ops.MUL and any(s.op is Ops.RECIP and s.src[0].op is Ops.ADD for s in u.src):
        p = parts()
        return [(p[1 - i], _over_one_plus(p[i])[0][1]) for i, s in enumerate(u.src)
                if s.op is Ops.RECIP and s.src[0].op is Ops.ADD]
    return []
