"""Reduce ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

Reductions (sum, prod, max, min, mean, var, std, any, all, argmax, argmin, logsumexp),
softmax and log_softmax, and cumulative scans (cumsum, cumprod, cummax, cummin,
logcumsumexp). Everything is composed from the primitive ``_reduce`` (ADD / MAX / MUL
over axes) and elementwise ops, so gradients come from the local rules of those
primitives, except ``prod``, which records its own rule (it handles zeros in the input).

Gradient of ``max``/``min`` (and of ``cummax``/``cummin`` values): the output gradient is
split evenly between all inputs equal to the result, for full and per-axis reductions
alike (like ``torch.amax``). ``torch.max(dim)`` instead gives it all to the one index it
returns; the two agree whenever the maximum is unique.

Cumulative scans along an axis of length ``n`` use a masked ``(n, n)`` window reduced in
one kernel (O(n^2) work); above ``SCAN_SPLIT`` elements the axis is cut into blocks of
``b = min(sqrt(n), SCAN_BLOCK)`` elements: scan inside each block, scan the block totals
(recursively, when there are many), and combine: O(n*b) work in a few kernels (1e5
elements: 4 kernels instead of 1e10 multiply-adds).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ember.dtype import DType, dtypes, promote_types, to_dtype
from ember.frontend.base import TensorBase
from ember.helpers import prod
from ember.ir.lazy import constant_along
from ember.ir.symbolic import sint_str
from ember.ir.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor

#: axes longer than this are scanned in blocks (of ~sqrt(n) elements, at most SCAN_BLOCK) instead of one O(n^2) window
SCAN_SPLIT = 512
SCAN_BLOCK = 256
#: mean/var statistics over at least STAT_BLOCK**2 elements are summed in levels of at most STAT_BLOCK additions
#: (see _blocked_sum)
STAT_BLOCK = 64

Axis = int | Sequence[int] | None


def _acc_dtype(dt: DType) -> DType:
    """The dtype tinygrad gives sum/cumsum/prod of ``dt``: bool and narrow ints widen to the default int (int32),
    unsigned ones to at least uint32; wider types and floats keep their dtype."""
    if dt.kind == "u":
        return promote_types(dt, dtypes.uint32)
    return promote_types(dt, dtypes.default_int) if dt.kind in "bi" else dt


class ReduceMixin(TensorBase):
    """Reduce methods; see the module docstring."""

    __slots__ = ()

    # --- helpers ---------------------------------------------------------------------------
    def _reduce_axes(self, axis: Axis) -> tuple[int, ...]:
        """Normalized, sorted reduce axes; None or an empty sequence means every axis (like torch)."""
        if axis is None:
            return tuple(range(self.ndim))
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        if not axes:
            return tuple(range(self.ndim))
        norm = [self._axis(a, what="axis") for a in axes]
        if self.ndim == 0:
            return ()
        for a in norm:
            if norm.count(a) > 1:
                raise RuntimeError(f"dim {a} appears multiple times in the list of dims")
        return tuple(sorted(norm))

    def _reduced_shape(self, axis: Axis) -> tuple[int, ...]:
        axes = self._reduce_axes(axis)
        return tuple(s for i, s in enumerate(self.shape) if i not in axes)

    def _check_nonempty_reduce(self, axis: Axis, name: str) -> None:
        axes = self._reduce_axes(axis)
        if self.numel() == 0 and (axis is None or (isinstance(axis, (tuple, list)) and not axis)):
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               f"Specify the reduction dim with the 'dim' argument.")
        for a in axes:
            if self.shape[a] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {a} to have non-zero size.")

    def _max_any(self, axis: Axis, keepdim: bool = False) -> Tensor:
        """Maximum that also accepts empty reductions (giving the dtype's minimum, -inf for floats)."""
        axes = self._reduce_axes(axis)
        if self.dtype == dtypes.bool:
            return self.cast(dtypes.uint8)._reduce(Ops.MAX, axes, keepdim).cast(dtypes.bool)
        return self._reduce(Ops.MAX, axes, keepdim)

    def _inverse(self) -> Tensor:
        """An order-reversing map: ``-x`` for floats, ``~x`` for integers, ``not x`` for bools."""
        if self.dtype.kind == "f":
            return -self
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return ~self

    def _isnan(self) -> Tensor:
        return self != self if self.dtype.kind == "f" else self.zeros_like(dtype=dtypes.bool)

    # --- reductions ------------------------------------------------------------------------
    def sum(self, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Sum over ``axis`` (all axes when None).

        Bool and integer inputs sum as int32 (uint32 if unsigned) or wider, like tinygrad.

        float16/bfloat16 accumulate in float32 and return their own dtype.
        """
        axes = self._reduce_axes(axis)
        out_dt = to_dtype(dtype) if dtype is not None else _acc_dtype(self.dtype)
        acc_dt = dtypes.float32 if out_dt in (dtypes.float16, dtypes.bfloat16) else out_dt
        return self.cast(acc_dt)._reduce(Ops.ADD, axes, keepdim).cast(out_dt)

    def prod(self, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Product over ``axis``. Bool and integer inputs multiply in the dtype :meth:`sum` uses.

        The gradient is exact with zeros in the input: with one zero only that element gets
        the product of the others; with two or more every gradient is zero.
        """
        axes = self._reduce_axes(axis)
        out_dt = to_dtype(dtype) if dtype is not None else _acc_dtype(self.dtype)
        x = self.cast(out_dt)
        if x.ndim == 0:
            return x
        red = x._reduce(Ops.MUL, axes, True)
        if out_dt.kind == "f":
            red._record((x,), _prod_rule(axes), "prod")
        return red if keepdim else red.reshape(self._reduced_shape(axes))

    def max(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Maximum over ``axis``; nan propagates. Ties share the gradient evenly (see the module docstring)."""
        self._check_nonempty_reduce(axis, "max")
        return self._max_any(axis, keepdim)

    def min(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Minimum over ``axis``; nan propagates. Ties share the gradient evenly."""
        self._check_nonempty_reduce(axis, "min")
        return self._inverse()._max_any(axis, keepdim)._inverse()

    def mean(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Arithmetic mean over ``axis`` (nan for an empty reduction, like torch).

        Bool and integer inputs give the default float, like tinygrad (``(pred == y).mean()`` is an accuracy).
        """
        axes = self._reduce_axes(axis)
        n = prod(self.shape[a] for a in axes)
        if n and isinstance(n, int):
            # a value that does not change along the axes (a broadcast): its mean is the value, read once, not
            # summed and divided (float32(3 * (2**24 + 3)) / float32(2**24 + 3) is 3 - 2**-22). Not where it
            # changes along some: a short float32 chain over those would be less accurate than the sum's tree
            if n > 1 and constant_along(self.lazydata, axes):
                x = self.shrink(tuple((0, 1) if i in axes else None for i in range(self.ndim)))
                x = x if x.dtype.kind == "f" else x.cast(dtypes.default_float)
                return x if keepdim else x.reshape(self._reduced_shape(axes))
        s = self.sum(axes, keepdim)
        if s.dtype.kind != "f":
            s = s.cast(dtypes.default_float)
        return s.div(n) if n else s * math.nan

    def var(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
        """Variance over ``axis`` with ``correction`` (1 is Bessel's correction, the default).

        Two passes: the mean (see :meth:`_centered_mean`), then the sum of squared deviations from it, which
        does not cancel the way ``E[x^2] - E[x]^2`` does when the mean is large next to the spread."""
        if self.dtype.kind != "f":
            raise RuntimeError("std and var only support floating point and complex dtypes")
        axes = self._reduce_axes(axis)
        return self._var_about(self._centered_mean(axes), axes, keepdim, correction)

    def _var_about(self, mean: Tensor, axes: tuple[int, ...], keepdim: bool, correction: int | float) -> Tensor:
        """The variance over ``axes`` about ``mean`` (kept as size-1 dims): squared deviations summed, divided
        by ``n - correction`` (at least 0, so too large a correction gives inf or nan like torch)."""
        n = prod(self.shape[a] for a in axes)
        squares = (self - mean).square()
        if not isinstance(n, int):  # a length that depends on a variable: divided by n - correction at run time
            from ember.ir.symbolic import sint_of, ssub

            if not float(correction).is_integer():
                raise ValueError(f"var over a symbolic length needs an integer correction, got {correction}")
            total = squares.sum(axes, keepdim, dtype=_stat_dtype(self.dtype))
            return total.div(ssub(sint_of(n), int(correction))).cast(self.dtype)
        # divided before the cast back: a float16 sum of 65536 squares near 1 would overflow to inf
        return _blocked_sum(squares, axes, keepdim).div(max(0, n - correction)).cast(self.dtype)

    def _centered_mean(self, axes: tuple[int, ...]) -> Tensor:
        """The mean over ``axes`` (kept as size-1 dims) as ``shift + mean(self - shift)``, for statistics.

        ``shift`` is the first element along ``axes`` (0 where it is not finite), detached. A float32 sum
        of many values near a large mean rounds at the scale of the running total (65536 values near 1000
        in one accumulator: the mean off by ~5e-3, and an output normalized to unit spread by as much);
        the deviations from a nearby sample add up to far less, so their sum rounds far less. One more
        load per output, in the same kernel. Plain :meth:`mean` stays a single sum, as torch's is."""
        sizes = [self.shape[a] for a in axes]
        if not all(isinstance(s, int) and s > 0 for s in sizes):  # empty or symbolic: nothing to sample
            return self.mean(axes, keepdim=True)
        first = self.detach().shrink(tuple((0, 1) if i in axes else None for i in range(self.ndim)))
        shift = first.isfinite().where(first, 0.0)
        return shift + _blocked_sum(self - shift, axes, True).div(prod(sizes)).cast(self.dtype)

    def std(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
        """Standard deviation over ``axis`` (the square root of :meth:`var`)."""
        return self.var(axis, keepdim, correction).sqrt()

    def var_mean(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
        """``(var, mean)`` over ``axis``, like ``torch.var_mean``; the mean is computed once, for both."""
        if self.dtype.kind != "f":
            raise RuntimeError("std and var only support floating point and complex dtypes")
        axes = self._reduce_axes(axis)
        mean = self._centered_mean(axes)
        var = self._var_about(mean, axes, keepdim, correction)
        return var, mean if keepdim else mean.reshape(self._reduced_shape(axes))

    def std_mean(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
        """``(std, mean)`` over ``axis``, like ``torch.std_mean``."""
        var, mean = self.var_mean(axis, keepdim, correction)
        return var.sqrt(), mean

    def any(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """True where any element along ``axis`` is nonzero (False for an empty reduction).

        Like torch, a uint8 input gives a uint8 result; every other dtype gives bool.
        """
        axes = self._reduce_axes(axis)
        out = self.cast(dtypes.bool).cast(dtypes.uint8)._reduce(Ops.MAX, axes, keepdim)
        return out if self.dtype == dtypes.uint8 else out.cast(dtypes.bool)

    def all(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """True where every element along ``axis`` is nonzero (True for an empty reduction)."""
        out = self.cast(dtypes.bool).logical_not().any(axis, keepdim).logical_not()
        return out.cast(dtypes.uint8) if self.dtype == dtypes.uint8 else out

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index (the default int, int32) of the maximum along ``axis`` (of the flattened tensor when None).

        The first index wins on ties, and a nan counts as the maximum, like torch.
        """
        return self._arg_reduce(axis, keepdim, "argmax")

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index (the default int) of the minimum along ``axis``; first index on ties, nan counts as the minimum."""
        if self.dtype == dtypes.bool:  # tinygrad ranks False < True (torch refuses bool)
            return self.cast(dtypes.int32).argmin(axis, keepdim)
        return self.detach()._inverse()._arg_reduce(axis, keepdim, "argmin")

    def _arg_reduce(self, axis: int | None, keepdim: bool, name: str) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.cast(dtypes.int32)._arg_reduce(axis, keepdim, name)
        x = self.detach()
        if axis is None:
            if x.numel() == 0:
                raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
            out = x.reshape(-1)._arg_reduce(0, False, name)
            return out.reshape((1,) * x.ndim) if keepdim else out
        d = x._axis(axis)
        if x.ndim == 0:
            return type(self).zeros((), dtype=dtypes.default_int, device=self.device)
        n = x.shape[d]
        if n == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        hit = (x == x._max_any(d, keepdim=True))._alu(Ops.OR, x._isnan())
        countdown = type(self).arange(n, 0, -1, device=self.device).reshape((n,) + (1,) * (x.ndim - d - 1))
        return n - hit.where(countdown, 0)._max_any(d, keepdim)

    def logsumexp(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """``log(sum(exp(x)))`` over ``axis``, computed stably (shifted by the maximum)."""
        x = self if self.dtype.kind == "f" else self.cast(dtypes.default_float)
        axes = x._reduce_axes(axis)
        m = x.detach()._max_any(axes, keepdim=True)
        m = (m.abs() == math.inf).where(0.0, m)  # all -inf (or an empty reduction) and +inf need no shift
        out = (x - m).exp().sum(axes, keepdim=True).log() + m
        return out if keepdim else out.reshape(x._reduced_shape(axes))

    # --- softmax ----------------------------------------------------------------------------
    def _softmax_parts(self, axis: int, dtype: DType | str | None, name: str) -> tuple[Tensor, Tensor]:
        x = self.cast(dtype) if dtype is not None else self
        if x.dtype.kind != "f":
            raise NotImplementedError(f'"{name}" not implemented for \'{x.dtype.name}\'; pass a float dtype=')
        shifted = x - x.detach()._max_any(axis, keepdim=True)
        return shifted, shifted.exp()

    def softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """``exp(x) / sum(exp(x))`` along ``axis``, shifted by the maximum for stability.

        ``dtype`` casts the input first (as torch does). Three kernels for any shape.
        """
        _, e = self._softmax_parts(axis, dtype, "softmax")
        return e.div(e.sum(axis, keepdim=True))

    def log_softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """``x - logsumexp(x)`` along ``axis``, computed stably; ``dtype`` casts the input first."""
        shifted, e = self._softmax_parts(axis, dtype, "log_softmax")
        return shifted - e.sum(axis, keepdim=True).log()

    # --- cumulative scans ---------------------------------------------------------------------
    def cumsum(self, axis: int = 0) -> Tensor:
        """Running sum along ``axis``. Bool and integer inputs give the dtype :meth:`sum` uses."""
        out_dt = _acc_dtype(self.dtype)
        acc_dt = dtypes.float32 if out_dt in (dtypes.float16, dtypes.bfloat16) else out_dt
        return self.cast(acc_dt)._scan(axis, "sum").cast(out_dt)

    def cumprod(self, axis: int) -> Tensor:
        """Running product along ``axis``.

        Bool and integer inputs give the dtype :meth:`sum` uses; the gradient handles zeros."""
        return self.cast(_acc_dtype(self.dtype))._scan(axis, "prod")

    def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """``(values, indices)``: the running maximum along ``axis`` and where it was found (the default int).

        Like torch, ties point at the latest equal element and a nan, once seen, stays the
        value (its index follows the latest nan).
        """
        d = self._axis(axis)
        if self.ndim == 0:
            return self, type(self).zeros((), dtype=dtypes.default_int, device=self.device)
        x = self.cast(dtypes.uint8) if self.dtype == dtypes.bool else self
        values = x._scan(d, "max")
        n = x.shape[d]
        # a "record" is an element equal to the running maximum at its own position (or a nan): the
        # index at position j is the latest record at or before j, itself a running maximum
        xd = x.detach()
        record = (xd == values.detach())._alu(Ops.OR, xd._isnan())
        position = type(self).arange(n, device=self.device).reshape((n,) + (1,) * (x.ndim - d - 1))
        indices = record.where(position, 0)._scan(d, "max")
        return (values.cast(dtypes.bool) if self.dtype == dtypes.bool else values), indices

    def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """``(values, indices)``: the running minimum along ``axis`` (ties and nan as in :meth:`cummax`)."""
        values, indices = self._inverse().cummax(axis)
        return values._inverse(), indices

    def logcumsumexp(self, axis: int = 0) -> Tensor:
        """``log(cumsum(exp(x)))`` along ``axis``, stable for any spread of values."""
        x = self if self.dtype.kind == "f" else self.cast(dtypes.default_float)
        return x._scan(axis, "logsumexp")

    def _scan(self, axis: int, op: str) -> Tensor:
        """Inclusive scan along ``axis`` with ``op`` in sum / prod / max / logsumexp (dtype kept)."""
        d = self._axis(axis)
        if self.ndim == 0:
            return self
        if not isinstance(self.shape[d], int):
            raise NotImplementedError(f"cumulative {op} along axis {d}, whose size {sint_str(self.shape[d])} "
                                      "depends on a Variable, is not supported")
        if self.shape[d] == 0:
            return self
        last = self.ndim - 1
        x = self.transpose(d, last) if d != last else self
        out = x._scan_last(op)
        return out.transpose(d, last) if d != last else out

    def _scan_identity(self, op: str) -> int | float | bool:
        if op == "sum":
            return 0
        if op == "prod":
            return 1
        if op == "logsumexp":
            return -math.inf
        return dtypes.min(self.dtype)

    def _scan_last(self, op: str) -> Tensor:
        """Inclusive scan along the last axis (length >= 1)."""
        n = self.shape[-1]
        if n <= SCAN_SPLIT:
            return self._scan_window(op)
        lead = self.shape[:-1]
        block = min(math.isqrt(n - 1) + 1, SCAN_BLOCK)  # ceil(sqrt(n)), capped
        nblocks = -(-n // block)
        ident = self._scan_identity(op)
        x = self.pad(((0, 0),) * len(lead) + ((0, nblocks * block - n),), value=ident)
        inner = x.reshape(lead + (nblocks, block))._scan_window(op)
        totals = inner[..., block - 1]
        # exclusive scan of the block totals: shift right by one, identity first
        before = totals._scan_last(op).pad(((0, 0),) * len(lead) + ((1, -1),), value=ident).unsqueeze(-1)
        if op == "sum":
            out = inner + before
        elif op == "prod":
            out = inner * before
        elif op == "max":
            out = inner.maximum(before)
        else:
            out = _logaddexp(inner, before)
        return out.reshape(lead + (nblocks * block,))[..., :n]

    def _scan_window(self, op: str) -> Tensor:
        """Inclusive scan along the last axis as one masked (n, n) reduction: O(n^2) work."""
        n = self.shape[-1]
        if n == 1:
            return self
        lead = self.shape[:-1]
        below = type(self)._tri(n, n, 1, device=self.device).logical_not()  # [j, k]: k <= j
        rows = self.unsqueeze(-2).expand(lead + (n, n))  # [..., j, k] = x[..., k]
        if op == "sum":
            return below.where(rows, 0).sum(-1)
        if op == "prod":
            return below.where(rows, 1).prod(-1)
        if op == "max":
            return below.where(rows, self._scan_identity(op))._max_any(-1)
        # logsumexp: shift every row by its running maximum (no underflow of early terms)
        run_max = self.detach()._scan_window("max")
        run_max = (run_max.abs() == math.inf).where(0.0, run_max)
        shifted = below.where(rows - run_max.unsqueeze(-1), -math.inf)
        return shifted.exp().sum(-1).log() + run_max


def _stat_dtype(dt: DType) -> DType:
    """The dtype statistics of ``dt`` are summed and divided in: float32 for float16 and bfloat16."""
    return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt


def _blocked_sum(x: Tensor, axes: tuple[int, ...], keepdim: bool) -> Tensor:
    """``x.sum(axes)`` of a float ``x`` in levels of at most STAT_BLOCK additions each, innermost first, in
    the dtype :func:`_stat_dtype` gives (a float16 total is returned as float32, for the caller to divide).

    One float32 accumulator over n elements rounds at the scale of its growing total, and adding many equal
    values (the zeros of a ReLU, centered) drifts systematically: a variance over 65536 such values in one
    OpenCL accumulator was off by 4e-4 (relative), in levels by 1e-6.
    Summed in levels (each reduce axis longer than STAT_BLOCK cut into factors of at most STAT_BLOCK where its
    length allows), every total stays small, as in a pairwise sum; the codegen nests the levels' loops in one
    kernel. Reductions shorter than STAT_BLOCK**2 elements, or of symbolic length, are one sum."""
    sizes = [x.shape[a] for a in axes]
    acc_dt = _stat_dtype(x.dtype)
    if not all(isinstance(s, int) for s in sizes) or prod(sizes) < STAT_BLOCK * STAT_BLOCK:
        return x.sum(axes, keepdim, dtype=acc_dt)
    shape: list[int] = []
    reduced: list[int] = []  # positions of the reduced (cut) axes in ``shape``
    for i, s in enumerate(x.shape):
        factors = _block_factors(s) if i in axes else [s]
        reduced += [len(shape) + k for k in range(len(factors))] if i in axes else []
        shape += factors
    y = x.cast(acc_dt).reshape(tuple(shape))
    level: list[int] = []
    for a in reversed(reduced):  # trailing reduced axes grouped while their product stays within a block
        if level and prod(shape[i] for i in level) * shape[a] > STAT_BLOCK:
            y, level = y._reduce(Ops.ADD, tuple(level), True), []
        level.append(a)
    y = y._reduce(Ops.ADD, tuple(level), True)
    return y.reshape(tuple(1 if i in axes else s for i, s in enumerate(x.shape)) if keepdim else x._reduced_shape(axes))


def _block_factors(length: int) -> list[int]:
    """``length`` as factors (outermost first) of at most STAT_BLOCK each, as far as its divisors allow:
    65536 -> [16, 64, 64]; a factor with no divisor from 8 to STAT_BLOCK stays whole (a large prime)."""
    factors: list[int] = []
    while length > STAT_BLOCK:
        b = next((d for d in range(STAT_BLOCK, 7, -1) if length % d == 0), 0)
        if not b:
            break
        factors.insert(0, b)
        length //= b
    return [length, *factors]


def _logaddexp(a: Tensor, b: Tensor) -> Tensor:
    """``log(exp(a) + exp(b))`` without overflow; -inf with -inf gives -inf."""
    m = a.detach().maximum(b.detach())
    m = (m.abs() == math.inf).where(0.0, m)
    return ((a - m).exp() + (b - m).exp()).log() + m


def _prod_rule(axes: tuple[int, ...]):
    """Gradient of a keepdim product over ``axes``, exact when some inputs are zero."""

    def rule(g: Tensor, out: Tensor, parents: Sequence[Tensor]) -> tuple[Tensor]:
        x = parents[0].detach()
        shape = x.shape
        is_zero = x == 0
        zeros = is_zero.sum(axes, keepdim=True).expand(shape)
        without_zeros = is_zero.where(1.0, x).prod(axes, keepdim=True).expand(shape)
        no_zero = out.detach().expand(shape) / x
        one_zero = is_zero.where(without_zeros, 0.0)
        local = (zeros == 0).where(no_zero, (zeros == 1).where(one_zero, 0.0))
        return (g.expand(shape) * local,)

    return rule
