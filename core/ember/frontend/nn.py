"""Linear algebra and neural-network functions of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

Everything here is composed from the primitives: a matrix product is a broadcasted multiply
followed by a sum, and a convolution or pooling window is a chain of views (pad, reshape,
expand, shrink, permute) over the input, so the scheduler fuses each of them into one kernel.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ember.dtype import DType, dtypes, least_upper_dtype, to_dtype
from ember.frontend.util import broadcast_shape
from ember.graph.uop import Ops
from ember.helpers import prod

if TYPE_CHECKING:
    from ember.tensor import Tensor

Pads = tuple[tuple[int, int], ...]
REDUCTIONS = ("none", "mean", "sum")


# --- argument helpers ---------------------------------------------------------------------------------------
def _int_tuple(value: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    """``value`` repeated ``n`` times, or ``value`` itself when it already has ``n`` entries."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    vals = tuple(int(v) for v in value)
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise RuntimeError(f"expected {name} to be a single integer value or a list of {n} values, "
                           f"but got {list(vals)}")
    return vals


def _resolve_pads(padding: int | Sequence[int], n: int) -> Pads:
    """Per spatial dim ``(before, after)`` from an int, ``n`` symmetric values or ``2n`` torch-style flat values.

    The flat form lists the last dim first: ``(left, right, top, bottom, ...)``.
    """
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        return ((int(padding), int(padding)),) * n
    vals = tuple(int(p) for p in padding)
    if len(vals) == n:
        return tuple((p, p) for p in vals)
    if len(vals) == 2 * n:
        return tuple((vals[2 * j], vals[2 * j + 1]) for j in reversed(range(n)))
    raise RuntimeError(f"padding must be an int or a sequence of {n} or {2 * n} ints, but got {list(vals)}")


def _shape_str(shape: Sequence[int]) -> str:
    return " x ".join(str(s) for s in shape)


def _check_positive(values: Sequence[int], what: str) -> None:
    if any(v <= 0 for v in values):
        raise RuntimeError(f"non-positive {what} is not supported: got {list(values)}")


def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    raise ValueError(f"{reduction} is not a valid value for reduction (expected one of {REDUCTIONS})")


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction (expected one of {REDUCTIONS})")


def _float(x: Tensor) -> Tensor:
    return x if x.dtype.kind == "f" else x.cast(dtypes.default_float)


def _pool_out_size(i: int, k: int, s: int, d: int, before: int, after: int, ceil_mode: bool) -> int:
    """Number of windows along one dim (torch's rule: in ceil mode the last window must start inside the input)."""
    span = i + before + after - (d * (k - 1) + 1)
    if span < 0:
        return 0
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= i + before:
        o -= 1
    return o


def _adaptive_bounds(i: int, o: int) -> list[tuple[int, int]]:
    """torch's adaptive pooling windows: output j covers ``[floor(j*i/o), ceil((j+1)*i/o))``."""
    return [((j * i) // o, -(-((j + 1) * i) // o)) for j in range(o)]


class NNMixin:
    """Matrix products, convolutions, pooling, normalization, attention and losses."""

    __slots__ = ()

    # --- matrix products --------------------------------------------------------------------------------------
    def dot(self, w: Tensor, dtype: DType | str | None = None) -> Tensor:
        """Matrix product (the same as :meth:`matmul`): 1-D, 2-D and batched inputs."""
        return self.matmul(w, dtype=dtype)

    def matmul(self, x: Tensor, reverse: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Matrix product with torch semantics: a 1-D operand is a vector, leading (batch) dims broadcast.

        ``reverse=True`` computes ``x @ self``; ``dtype`` sets the accumulation and output dtype.
        """
        if not isinstance(x, type(self)):
            raise TypeError(f"matmul(): argument 'other' must be Tensor, not {type(x).__name__}")
        a, b = (x, self) if reverse else (self, x)
        if a.ndim == 0 or b.ndim == 0:
            raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {a.ndim}D and {b.ndim}D")
        if a.dtype == dtypes.bool or b.dtype == dtypes.bool:
            raise NotImplementedError(f"matmul is not implemented for bool tensors (shapes {a.shape} and {b.shape})")
        k_a, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k_a != k_b:
            if a.ndim == 1 and b.ndim == 1:
                raise RuntimeError(f"inconsistent tensor size, expected tensor [{k_a}] and src [{k_b}] to have the "
                                   f"same number of elements, but got {k_a} and {k_b} elements respectively")
            sa, sb = "x".join(map(str, a.shape)), "x".join(map(str, b.shape))
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({sa} and {sb})")
        try:
            broadcast_shape(a.shape[:-2], b.shape[:-2])
        except RuntimeError as e:
            raise RuntimeError(f"matmul: the batch dims of shapes {a.shape} and {b.shape} do not broadcast") from e
        out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(a.dtype, b.dtype)
        a2 = a.reshape(1, k_a) if a.ndim == 1 else a
        b2 = b.reshape(k_b, 1) if b.ndim == 1 else b
        lhs = a2.reshape(*a2.shape[:-1], 1, k_a)                                    # (..., n, 1, k)
        rhs = b2.transpose(-1, -2).reshape(*b2.shape[:-2], 1, b2.shape[-1], k_b)    # (..., 1, m, k)
        if out_dt in (dtypes.float16, dtypes.bfloat16):
            # half-precision products and sums are exact enough only in float32 (as torch's CPU kernels do)
            lhs, rhs = lhs.cast(dtypes.float32), rhs.cast(dtypes.float32)
        out = (lhs * rhs).sum(-1, dtype=out_dt)
        if a.ndim == 1:
            out = out.reshape(out.shape[:-2] + out.shape[-1:])
        if b.ndim == 1:
            out = out.reshape(out.shape[:-1])
        return out

    def __matmul__(self, x: Tensor) -> Tensor:
        """``self @ x``."""
        return self.matmul(x)

    def __rmatmul__(self, x: Tensor) -> Tensor:
        """``x @ self``."""
        return self.matmul(x, reverse=True)

    def __imatmul__(self, x: Tensor) -> Tensor:
        """``self @= x`` (an :meth:`assign` of the product)."""
        return self.assign(self.matmul(x))

    def linear(self, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
        """``self @ weight + bias`` with ``weight`` of shape (in, out); a 1-D weight scales elementwise."""
        if dtype is not None:
            dt = to_dtype(dtype)
            return self.cast(dt).linear(weight.cast(dt), bias.cast(dt) if bias is not None else None)
        out = self * weight if weight.ndim == 1 else self.dot(weight)
        return out if bias is None else out + bias

    @staticmethod
    def einsum(formula: str, *operands: Any, dtype: DType | str | None = None) -> Tensor:
        """Einstein summation like ``torch.einsum``: ``Tensor.einsum("ij,jk->ik", a, b)``.

        Supports an implicit output (letters used once, sorted), ``...`` for broadcast dims and repeated
        letters within one operand (a diagonal).
        """
        ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
        if not ops:
            raise RuntimeError("einsum(): must provide at least one operand")
        eq = formula.replace(" ", "")
        lhs, rhs = eq.split("->", 1) if "->" in eq else (eq, None)
        terms = lhs.split(",")
        if len(terms) != len(ops):
            raise RuntimeError(f"einsum(): {len(terms)} operands were specified in the equation {formula!r} but "
                               f"{len(ops)} were provided")
        # name the dims an ellipsis stands for with characters no subscript can use
        n_ell = 0
        for i, (term, t) in enumerate(zip(terms, ops)):
            if term.count("...") > 1 or (term.count(".") % 3):
                raise RuntimeError(f"einsum(): invalid ellipsis in the subscripts {term!r} of operand {i}")
            n_named = len(term) - (3 if "..." in term else 0)
            if ("..." in term and n_named > t.ndim) or ("..." not in term and n_named != t.ndim):
                raise RuntimeError(f"einsum(): the number of subscripts in the equation ({n_named}) does not match the "
                                   f"number of dimensions ({t.ndim}) for operand {i}"
                                   f"{'' if '...' in term else ' and no ellipsis was given'}")
            if "..." in term:
                n_ell = max(n_ell, t.ndim - n_named)
        ell = [chr(0x100 + j) for j in range(n_ell)]
        letters: list[list[str]] = []
        for term, t in zip(terms, ops):
            for c in term.replace("...", ""):
                if not c.isalpha() or not c.isascii():
                    raise RuntimeError(f"einsum(): invalid subscript {c!r} in the equation {formula!r}; subscripts "
                                       f"must be in [a-zA-Z]")
            if "..." in term:
                pre, post = term.split("...")
                n_here = t.ndim - len(pre) - len(post)
                letters.append(list(pre) + ell[n_ell - n_here:] + list(post))
            else:
                letters.append(list(term))
        counts: dict[str, int] = {}
        for ls in letters:
            for c in ls:
                counts[c] = counts.get(c, 0) + 1
        if rhs is None:
            out = ell + sorted(c for c, n in counts.items() if n == 1 and c not in ell)
        else:
            if rhs.count("...") > 1:
                raise RuntimeError(f"einsum(): more than one ellipsis in the output subscripts {rhs!r}")
            pre, _, post = rhs.partition("...")
            out = list(pre) + (ell if "..." in rhs else []) + list(post)
            for c in out:
                if c not in counts:
                    raise RuntimeError(f"einsum(): output subscript {c!r} does not appear in the equation for any "
                                       f"input operand")
            if len(set(out)) != len(out):
                raise RuntimeError(f"einsum(): output subscripts in {rhs!r} must appear only once")
        # take diagonals for letters repeated within one operand
        tensors: list[Tensor] = []
        for j, t in enumerate(ops):
            ls = letters[j]
            while len(set(ls)) != len(ls):
                c = next(c for c in ls if ls.count(c) > 1)
                p, q = [i for i, x in enumerate(ls) if x == c][:2]
                t = _diagonal(t, p, q)
                ls = [x for i, x in enumerate(ls) if i not in (p, q)] + [c]
            tensors.append(t)
            letters[j] = ls
        sizes: dict[str, int] = {}
        for i, (t, ls) in enumerate(zip(tensors, letters)):
            for c, s in zip(ls, t.shape):
                if c in sizes and sizes[c] != s and 1 not in (sizes[c], s):
                    raise RuntimeError(f"einsum(): subscript {c!r} has size {s} for operand {i} which does not "
                                       f"broadcast with the previously seen size {sizes[c]}")
                sizes[c] = s if c not in sizes or sizes[c] == 1 else sizes[c]
        summed = [c for c in sizes if c not in out]
        order = out + summed
        aligned: list[Tensor] = []
        for t, ls in zip(tensors, letters):
            mine = [c for c in order if c in ls]
            t = t.permute([ls.index(c) for c in mine])
            aligned.append(t.reshape([t.shape[mine.index(c)] if c in ls else 1 for c in order]))
        out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(*(t.dtype for t in aligned))
        result = aligned[0]
        for t in aligned[1:]:
            result = result * t
        result = result._broadcast_to(tuple(sizes[c] for c in order)) if order else result
        if summed:
            return result.sum(tuple(range(len(out), len(order))), dtype=out_dt)
        return result.cast(out_dt)

    # --- sliding windows -----------------------------------------------------------------------------------
    def _pool(self, kernel: Sequence[int], stride: int | Sequence[int] = 1,
              dilation: int | Sequence[int] = 1) -> Tensor:
        """Sliding windows over the last ``len(kernel)`` dims as a view: shape ``(..., *out, *kernel)``.

        Window ``o`` of a dim of size ``i`` holds elements ``o*stride + j*dilation`` for ``j < k``; the
        caller pads first. Only movement ops are used, so consumers fuse with it.
        """
        n = len(kernel)
        k_ = tuple(int(k) for k in kernel)
        s_, d_ = _int_tuple(stride, n, "stride"), _int_tuple(dilation, n, "dilation")
        lead, ins = self.shape[:-n], self.shape[-n:]
        outs = tuple((i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(ins, k_, s_, d_))
        keep_lead = tuple((0, sz) for sz in lead)
        nl = len(lead)
        perm = list(range(nl)) + [nl + 2 * j for j in range(n)] + [nl + 2 * j + 1 for j in range(n)]
        if all(d == 1 and k <= s for k, s, d in zip(k_, s_, d_)):
            # windows do not overlap: cut each dim into rows of length s and keep the first k of each row
            x = self.pad(((0, 0),) * nl + tuple((0, max(o * s - i, 0)) for i, o, s in zip(ins, outs, s_)))
            x = x.shrink(keep_lead + tuple((0, o * s) for o, s in zip(outs, s_)))
            x = x.reshape(lead + _interleave(outs, s_)).shrink(keep_lead + _interleave_pairs(outs, k_))
            return x.permute(perm)
        # overlapping windows: repeat each dim e times and re-read it in rows of length L = i*m + d, so row j
        # starts j*d elements further along; then keep every s-th element of the first o*s of each row.
        # All dims are handled by one expand and one merging reshape, so the view stack grows by one view.
        rows = tuple(i * max(1, -(-(o * s - d) // i)) + d for i, o, s, d in zip(ins, outs, s_, d_))
        reps = tuple(-(-(k * r) // i) for i, k, r in zip(ins, k_, rows))
        x = self.reshape(lead + _interleave((1,) * n, ins)).expand(lead + _interleave(reps, ins))
        x = x.reshape(lead + tuple(e * i for e, i in zip(reps, ins)))
        x = x.shrink(keep_lead + tuple((0, k * r) for k, r in zip(k_, rows))).reshape(lead + _interleave(k_, rows))
        x = x.shrink(keep_lead + _interleave_pairs(k_, tuple(o * s for o, s in zip(outs, s_))))
        x = x.reshape(lead + tuple(v for k, o, s in zip(k_, outs, s_) for v in (k, o, s)))
        x = x.shrink(keep_lead + tuple(r for k, o in zip(k_, outs) for r in ((0, k), (0, o), (0, 1))))
        x = x.reshape(lead + _interleave(k_, outs))
        swap = list(range(nl)) + [nl + 2 * j + 1 for j in range(n)] + [nl + 2 * j for j in range(n)]
        return x.permute(swap)

    # --- convolutions --------------------------------------------------------------------------------------
    def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: int | Sequence[int] = 1,
               dilation: int | Sequence[int] = 1, padding: int | str | Sequence[int] = 0,
               dtype: DType | str | None = None) -> Tensor:
        """Convolution (cross-correlation) like ``torch.nn.functional.conv2d``, for any number of spatial dims.

        ``weight`` is ``(out_channels, in_channels // groups, *kernel)``; the input is ``(batch, in_channels,
        *spatial)`` or unbatched ``(in_channels, *spatial)``. ``padding`` is an int, one int per spatial dim,
        ``2 * dims`` ints in torch's flat order ``(left, right, top, bottom, ...)``, or ``"same"``/``"valid"``.
        """
        n = weight.ndim - 2
        if n < 1:
            raise RuntimeError(f"conv: weight must have at least 3 dims (out, in, *kernel), got shape {weight.shape}")
        if isinstance(padding, str):
            pads = _string_pads(padding, weight.shape[2:], _int_tuple(stride, n, "stride"),
                                _int_tuple(dilation, n, "dilation"))
        else:
            pads = _resolve_pads(padding, n)
            flat_form = not isinstance(padding, (int, np.integer)) and len(padding) == 2 * n
            if any(p < 0 for pair in pads for p in pair) and not flat_form:  # the flat form may crop, as in tinygrad
                raise RuntimeError(f"negative padding is not supported: got {padding}")
        return _conv(self, weight, bias, groups, stride, dilation, pads, dtype)

    def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
                         padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0) -> Tensor:
        """Transposed convolution like ``torch.nn.functional.conv_transpose2d``, for any number of spatial dims.

        ``weight`` is ``(in_channels, out_channels // groups, *kernel)``.
        """
        n = weight.ndim - 2
        if n < 1:
            raise RuntimeError(f"conv_transpose: weight must have at least 3 dims (in, out, *kernel), got "
                               f"{weight.shape}")
        unbatched = self.ndim == weight.ndim - 1
        x = self.unsqueeze(0) if unbatched else self
        if x.ndim != weight.ndim:
            raise RuntimeError(f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to conv_transpose{n}d, but "
                               f"got input of size: {list(self.shape)}")
        if not isinstance(groups, int) or groups <= 0:
            raise RuntimeError(f"non-positive groups is not supported: got {groups}")
        cin, rcout, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
        if x.shape[1] != cin:
            raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected "
                               f"input{list(x.shape)} to have {cin} channels, but got {x.shape[1]} channels instead")
        if cin % groups:
            raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                               f"but got weight of size {list(weight.shape)} instead")
        s_, d_ = _int_tuple(stride, n, "stride"), _int_tuple(dilation, n, "dilation")
        op_ = _int_tuple(output_padding, n, "output_padding")
        _check_positive(s_, "stride")
        _check_positive(d_, "dilation")
        pads = _resolve_pads(padding, n)
        if any(p < 0 for pair in pads for p in pair) or any(p < 0 for p in op_):
            raise RuntimeError(f"negative padding is not supported: got padding={padding}, "
                               f"output_padding={output_padding}")
        for o, s, d in zip(op_, s_, d_):
            if o >= s and o >= d:
                raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got "
                                   f"output_padding={list(op_)}, stride={list(s_)}, dilation={list(d_)}")
        # spread the input out: stride-1 zeros between neighbours along every spatial dim
        for j, s in enumerate(s_):
            if s == 1:
                continue
            ax, i = 2 + j, x.shape[2 + j]
            x = x.reshape(x.shape[:ax] + (i, 1) + x.shape[ax + 1:])
            x = x.pad(tuple((0, s - 1) if a == ax + 1 else (0, 0) for a in range(x.ndim)))
            x = x.reshape(x.shape[:ax] + (i * s,) + x.shape[ax + 2:])
            x = x.shrink(tuple((0, max(i * s - (s - 1), 0)) if a == ax else (0, sz) for a, sz in enumerate(x.shape)))
        # (groups * cin_g, rcout, *k) -> (groups * rcout, cin_g, *k), kernel flipped
        cin_g = cin // groups
        w = weight.reshape(groups, cin_g, rcout, *ks).transpose(1, 2).flip(tuple(range(3, 3 + n)))
        w = w.reshape(groups * rcout, cin_g, *ks)
        new_pads = tuple(((k - 1) * d - pb, (k - 1) * d - pa + o) for k, d, (pb, pa), o in zip(ks, d_, pads, op_))
        out = _conv(x, w, bias, groups, 1, d_, new_pads, None)
        return out.reshape(out.shape[1:]) if unbatched else out

    # --- pooling -------------------------------------------------------------------------------------------
    def max_pool2d(self, kernel_size: int | Sequence[int] = (2, 2), stride: int | Sequence[int] | None = None,
                   dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, ceil_mode: bool = False,
                   return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Max pooling over the last ``len(kernel_size)`` dims (2 for an int), padding with ``-inf``.

        ``return_indices=True`` also returns the int64 position of each max in the flattened spatial input
        (the first one in window order when several are equal), like torch.
        """
        k, s_, d_, pads, outs = _pool_args(self, kernel_size, stride, dilation, padding, ceil_mode, "max_pool2d",
                                           effective=True)
        n = len(k)
        lead = self.ndim - n
        spatial = self.shape[lead:]
        ext = _extended_pads(spatial, k, s_, d_, pads, outs)
        full_ext = ((0, 0),) * lead + ext
        windows = self.pad(full_ext, value=dtypes.min(self.dtype))._pool(k, s_, d_)
        axes = tuple(range(-n, 0))
        if not return_indices:
            return windows.max(axes)
        best = windows.max(axes, keepdim=True)
        big = dtypes.max(dtypes.int64)
        flat = type(self).arange(prod(spatial), device=self.device).reshape(spatial)
        idx = flat.pad(ext, value=big)._pool(k, s_, d_)
        first = (windows == best).where(idx, big).min(axes)
        return best.reshape(best.shape[:-n]), first

    def avg_pool2d(self, kernel_size: int | Sequence[int] = (2, 2), stride: int | Sequence[int] | None = None,
                   dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:
        """Average pooling over the last ``len(kernel_size)`` dims (2 for an int), with torch's divisors.

        With ``count_include_pad`` the zero padding counts toward the divisor (but not the extra room
        ``ceil_mode`` adds); without it only input elements count.
        """
        k, s_, d_, pads, outs = _pool_args(self, kernel_size, stride, dilation, padding, ceil_mode, "avg_pool2d",
                                           effective=False)
        n = len(k)
        lead = self.ndim - n
        spatial = self.shape[lead:]
        ext = _extended_pads(spatial, k, s_, d_, pads, outs)
        x = self if self.dtype.kind in "iu" else _float(self)
        total = x.pad(((0, 0),) * lead + ext)._pool(k, s_, d_).sum(tuple(range(-n, 0)), dtype=x.dtype)
        counts = [_window_counts(i, kk, s, d, pb, pa if count_include_pad else 0, pb if count_include_pad else 0, o)
                  for i, kk, s, d, (pb, pa), o in zip(spatial, k, s_, d_, pads, outs)]
        divisor: Tensor | int
        if all(c.min() == c.max() for c in counts):
            divisor = prod(int(c[0]) for c in counts)
        else:
            table = counts[0]
            for c in counts[1:]:
                table = np.multiply.outer(table, c)
            divisor = type(self)(table.astype(np.int64), device=self.device).cast(x.dtype)
        if x.dtype.kind in "iu":  # torch divides integer sums with truncation and keeps the dtype
            num, den = total._broadcasted(divisor)
            return num._alu(Ops.IDIV, den)
        return total / divisor

    def adaptive_avg_pool2d(self, output_size: int | Sequence[int | None]) -> Tensor:
        """Average pooling to a fixed output size over the last ``len(output_size)`` dims (2 for an int).

        Output ``j`` of a dim of size ``i`` averages ``[floor(j*i/o), ceil((j+1)*i/o))``, like torch; ``None``
        keeps a dim's size.
        """
        outs = _adaptive_sizes(self, output_size, "adaptive_avg_pool2d")
        n = len(outs)
        spatial = self.shape[-n:]
        if 0 in outs:
            return _float(self).shrink(tuple((0, s) for s in self.shape[:-n]) + tuple((0, o) for o in outs))
        if all(i % o == 0 for i, o in zip(spatial, outs)):
            k = tuple(i // o for i, o in zip(spatial, outs))
            return self.avg_pool2d(k, k) if any(kk != 1 for kk in k) else _float(self)
        x = _float(self)
        for j, (i, o) in enumerate(zip(spatial, outs)):
            if i == o:
                continue
            ax = x.ndim - n + j
            mask = np.zeros((o, i), dtype=bool)
            for r, (lo, hi) in enumerate(_adaptive_bounds(i, o)):
                mask[r, lo:hi] = True
            m = type(self)(mask, device=self.device)
            moved = x.transpose(ax, -1).unsqueeze(-2)                       # (..., 1, i)
            summed = m.where(moved, 0).sum(-1)                              # (..., o)
            counts = type(self)(mask.sum(1).astype(np.float32), device=self.device).cast(x.dtype)
            x = (summed / counts).transpose(ax, -1)
        return x

    def adaptive_max_pool2d(self, output_size: int | Sequence[int | None],
                            return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Max pooling to a fixed output size over the last ``len(output_size)`` dims, with torch's windows."""
        outs = _adaptive_sizes(self, output_size, "adaptive_max_pool2d")
        n = len(outs)
        spatial = self.shape[-n:]
        if 0 in outs:
            empty = self.shrink(tuple((0, s) for s in self.shape[:-n]) + tuple((0, o) for o in outs))
            return (empty, empty.cast(dtypes.int64)) if return_indices else empty
        if all(i % o == 0 for i, o in zip(spatial, outs)):
            k = tuple(i // o for i, o in zip(spatial, outs))
            return self.max_pool2d(k, k, return_indices=return_indices)
        lo_val = dtypes.min(self.dtype)
        if not return_indices:
            x = self
            for j, (i, o) in enumerate(zip(spatial, outs)):
                if i == o:
                    continue
                ax = x.ndim - n + j
                m = type(self)(_adaptive_mask(i, o), device=self.device)
                x = m.where(x.transpose(ax, -1).unsqueeze(-2), lo_val).max(-1).transpose(ax, -1)
            return x
        # indices need every window over every spatial dim at once: (..., *out, *spatial)
        mask = np.ones((), dtype=bool)
        for i, o in zip(spatial, outs):
            mask = np.logical_and.outer(mask, _adaptive_mask(i, o)) if mask.ndim else _adaptive_mask(i, o)
        order = [2 * j for j in range(n)] + [2 * j + 1 for j in range(n)]
        mask_t = type(self)(np.ascontiguousarray(mask.transpose(order)), device=self.device)
        lead = self.ndim - n
        x = self.reshape(self.shape[:lead] + (1,) * n + spatial)
        cand = mask_t.where(x, lo_val)
        axes = tuple(range(-n, 0))
        best = cand.max(axes, keepdim=True)
        big = dtypes.max(dtypes.int64)
        flat = type(self).arange(prod(spatial), device=self.device).reshape(spatial)
        first = (cand == best).where(mask_t, False).where(flat, big).min(axes)
        return best.reshape(best.shape[:-n]), first

    # --- resampling ----------------------------------------------------------------------------------------
    def interpolate(self, size: int | Sequence[int], mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resize the last ``len(size)`` dims (an int resizes every dim after the first two).

        ``mode`` is ``"linear"`` (also ``"bilinear"``/``"trilinear"``: linear along each resized dim),
        ``"nearest"`` or ``"nearest-exact"``, with torch's source-index rules.
        """
        if mode not in ("linear", "bilinear", "trilinear", "nearest", "nearest-exact"):
            raise NotImplementedError(f"interpolate: mode {mode!r} is not supported (use linear, bilinear, trilinear, "
                                      f"nearest or nearest-exact)")
        linear = mode in ("linear", "bilinear", "trilinear")
        if align_corners and not linear:
            raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                             "trilinear")
        if isinstance(size, (int, np.integer)):
            sizes = (int(size),) * max(self.ndim - 2, 1)
        else:
            sizes = tuple(int(s) for s in size)
        if not 0 < len(sizes) <= self.ndim or any(s <= 0 for s in sizes):
            raise ValueError(f"interpolate: invalid size {size} for an input of shape {self.shape}")
        n = len(sizes)
        x = self
        for j, o in enumerate(sizes):
            ax = self.ndim - n + j
            i = x.shape[ax]
            if i == o:
                continue
            if not linear and o % i == 0:      # whole-number upsampling: repeat each element
                r = o // i
                x = x.reshape(x.shape[:ax + 1] + (1,) + x.shape[ax + 1:])
                x = x.expand(x.shape[:ax + 1] + (r,) + x.shape[ax + 2:]).reshape(x.shape[:ax] + (o,) + x.shape[ax + 2:])
                continue
            if mode == "nearest" and i % o == 0:   # whole-number downsampling: every r-th element
                r = i // o
                x = x.reshape(x.shape[:ax] + (o, r) + x.shape[ax + 1:])
                x = x.shrink(tuple((0, 1) if a == ax + 1 else (0, sz) for a, sz in enumerate(x.shape)))
                x = x.reshape(x.shape[:ax + 1] + x.shape[ax + 2:])
                continue
            weights = _interp_weights(i, o, mode, align_corners)
            moved = x.transpose(ax, -1).unsqueeze(-2)                                  # (..., 1, i)
            if linear:
                xf = _float(moved)
                w = type(self)(weights, device=self.device).cast(xf.dtype)
                m = type(self)(weights != 0, device=self.device)
                res = m.where(xf * w, 0).sum(-1)
            else:
                m = type(self)(weights != 0, device=self.device)
                res = m.where(moved, 0).sum(-1, dtype=moved.dtype)
            x = res.transpose(ax, -1)
        return x

    # --- normalization -------------------------------------------------------------------------------------
    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        """Normalize to zero mean and unit (biased) variance over ``axis``, like ``F.layer_norm`` without affine."""
        centered = self - self.mean(axis, keepdim=True)
        return centered * ((centered * centered).mean(axis, keepdim=True) + eps).sqrt().reciprocal()

    def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                  axis: int | Sequence[int] = 1) -> Tensor:
        """``(self - mean) * weight * invstd + bias`` with the statistics laid along ``axis`` (channels by default)."""
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(self._axis(a) for a in axes)
        shape = tuple(s if a in axes else 1 for a, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        out = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return out + bias.reshape(shape) if bias is not None else out

    def rms_norm(self, axis: int | Sequence[int] = -1, eps: float = 1e-6) -> Tensor:
        """Divide by the root mean square over ``axis``: ``x / sqrt(mean(x**2) + eps)``."""
        x = _float(self)
        return x * ((x * x).mean(axis, keepdim=True) + eps).sqrt().reciprocal()

    def group_norm(self, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
                   eps: float = 1e-5) -> Tensor:
        """Layer norm over groups of channels (dim 1), then a per-channel affine, like ``F.group_norm``."""
        if self.ndim < 2:
            raise RuntimeError(f"group_norm: expected an input with at least 2 dims, got shape {self.shape}")
        c = self.shape[1]
        if num_groups <= 0 or c % num_groups:
            raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got input of "
                               f"shape {list(self.shape)} and num_groups={num_groups}")
        y = self.reshape(self.shape[0], num_groups, -1).layernorm(eps=eps).reshape(self.shape)
        cshape = (1, c) + (1,) * (self.ndim - 2)
        if weight is not None:
            y = y * weight.reshape(cshape)
        return y + bias.reshape(cshape) if bias is not None else y

    def dropout(self, p: float = 0.5) -> Tensor:
        """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)``, only in training mode."""
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if not type(self).training or p == 0:
            return self
        if p == 1:
            return self * 0
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self * (1.0 / (1.0 - p)), 0)

    def one_hot(self, num_classes: int = -1) -> Tensor:
        """An int64 tensor with a trailing dim of ``num_classes`` holding 1 at each index (-1: max + 1)."""
        if self.dtype.kind not in "iu":
            raise RuntimeError(f"one_hot is only applicable to index tensors, got dtype {self.dtype}")
        if num_classes == -1:
            if self.numel() == 0:
                raise RuntimeError("Can not infer total number of classes from empty tensor.")
            num_classes = int(self.max().item()) + 1
        if num_classes < 0:
            raise RuntimeError(f"one_hot: num_classes should be -1 or non-negative, got {num_classes}")
        classes = type(self).arange(num_classes, device=self.device)
        return (self.unsqueeze(-1) == classes).cast(dtypes.int64)

    # --- attention -----------------------------------------------------------------------------------------
    def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                     dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False,
                                     scale: float | None = None) -> Tensor:
        """``softmax(self @ key^T * scale + mask) @ value`` with self as the query.

        A bool ``attn_mask`` keeps the True positions; a float one is added. ``is_causal`` keeps key
        positions up to each query's index. ``enable_gqa`` repeats key/value heads (dim -3) to match the query.
        Dropout applies only in training mode.
        """
        if is_causal and attn_mask is not None:
            raise RuntimeError("scaled_dot_product_attention: an explicit attn_mask should not be set when "
                               "is_causal=True")
        if enable_gqa and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            if self.shape[-3] % key.shape[-3]:
                raise RuntimeError(f"enable_gqa: query heads {self.shape[-3]} are not a multiple of key heads "
                                   f"{key.shape[-3]}")
            key, value = _repeat_heads(key, self.shape[-3] // key.shape[-3]), \
                _repeat_heads(value, self.shape[-3] // value.shape[-3])
        q = _float(self)
        factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scores = q.matmul(key.transpose(-2, -1)) * factor
        if is_causal:
            n_q, n_k = scores.shape[-2], scores.shape[-1]
            rows = type(self).arange(n_q, device=self.device).reshape(n_q, 1)
            cols = type(self).arange(n_k, device=self.device).reshape(1, n_k)
            scores = (cols <= rows).where(scores, -math.inf)
        if attn_mask is not None:
            scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask
        return scores.softmax(-1).dropout(dropout_p).matmul(value)

    # --- losses --------------------------------------------------------------------------------------------
    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        """Binary cross-entropy of probabilities ``self`` against targets ``Y`` (logs clamped at -100, like torch)."""
        _check_reduction(reduction)
        if Y.shape != self.shape:
            raise ValueError(f"Using a target size ({Y.shape}) that is different to the input size ({self.shape}) is "
                             f"not supported. Please ensure they have the same size.")
        p = _float(self)
        loss = -(Y * p.log().maximum(-100) + (1 - Y) * (1 - p).log().maximum(-100))
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean",
                                   pos_weight: Tensor | None = None) -> Tensor:
        """Binary cross-entropy of logits ``self`` against targets ``Y`` (numerically stable), like torch."""
        _check_reduction(reduction)
        if Y.shape != self.shape:
            raise ValueError(f"Target size ({Y.shape}) must be the same as input size ({self.shape})")
        x = _float(self)
        pos = Y if pos_weight is None else pos_weight * Y
        return _reduce_loss(-(pos * x.logsigmoid() + (1 - Y) * (-x).logsigmoid()), reduction)

    def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                        reduction: str = "mean") -> Tensor:
        """Cross-entropy of logits ``self`` (classes on the LAST axis) against integer labels ``Y``.

        Labels equal to ``ignore_index`` contribute nothing and are left out of the mean.
        """
        _check_reduction(reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
        if self.ndim == 0:
            raise RuntimeError("sparse_categorical_crossentropy: logits need a class axis")
        if Y.shape != self.shape[:-1]:
            raise RuntimeError(f"sparse_categorical_crossentropy: labels of shape {Y.shape} do not match logits of "
                               f"shape {self.shape} (expected {self.shape[:-1]})")
        logp = _float(self).log_softmax(-1)
        return _nll(logp, Y, self.ndim - 1, None, ignore_index, label_smoothing, reduction)

    def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                      ignore_index: int = -100, weight: Tensor | None = None) -> Tensor:
        """Cross-entropy of logits ``self`` (classes on dim 1, or dim 0 for 1-D) like ``F.cross_entropy``.

        ``Y`` holds class indices (integer dtype) or class probabilities (same shape as ``self``).
        """
        _check_reduction(reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
        if self.ndim == 0:
            raise RuntimeError("cross_entropy: input needs a class dim, got a 0-d tensor")
        cdim = 0 if self.ndim == 1 else 1
        n_cls = self.shape[cdim]
        if weight is not None and weight.shape != (n_cls,):
            raise RuntimeError(f"weight tensor should be defined either for all {n_cls} classes or no classes but got "
                               f"weight tensor of shape: {list(weight.shape)}")
        logp = _float(self).log_softmax(cdim)
        if Y.dtype.kind == "f":
            if Y.shape != self.shape:
                raise RuntimeError(f"cross_entropy: probability targets of shape {Y.shape} must match the input "
                                   f"shape {self.shape}")
            probs = Y * (1 - label_smoothing) + label_smoothing / n_cls
            if weight is not None:
                probs = probs * weight.reshape(tuple(n_cls if a == cdim else 1 for a in range(self.ndim)))
            return _reduce_loss(-(logp * probs).sum(cdim), reduction)
        expected = self.shape[:cdim] + self.shape[cdim + 1:]
        if Y.shape != expected:
            if self.ndim >= 2 and (Y.ndim == 0 or Y.shape[0] != self.shape[0]):
                raise ValueError(f"Expected input batch_size ({self.shape[0]}) to match target batch_size "
                                 f"({Y.shape[0] if Y.ndim else 0}).")
            raise RuntimeError(f"cross_entropy: target of shape {Y.shape} does not match input of shape {self.shape} "
                               f"(expected {expected})")
        return _nll(logp, Y, cdim, weight, ignore_index, label_smoothing, reduction)

    def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
                 reduction: str = "mean") -> Tensor:
        """Negative log likelihood of log-probabilities ``self`` (classes on dim 1, or 0 for 1-D) at labels ``Y``."""
        _check_reduction(reduction)
        if self.ndim == 0:
            raise RuntimeError("nll_loss: input needs a class dim, got a 0-d tensor")
        cdim = 0 if self.ndim == 1 else 1
        expected = self.shape[:cdim] + self.shape[cdim + 1:]
        if Y.shape != expected:
            if self.ndim >= 2 and (Y.ndim == 0 or Y.shape[0] != self.shape[0]):
                raise ValueError(f"Expected input batch_size ({self.shape[0]}) to match target batch_size "
                                 f"({Y.shape[0] if Y.ndim else 0}).")
            raise RuntimeError(f"nll_loss: target of shape {Y.shape} does not match input of shape {self.shape}")
        if weight is not None and weight.shape != (self.shape[cdim],):
            raise RuntimeError(f"weight tensor should be defined either for all {self.shape[cdim]} classes or no "
                               f"classes but got weight tensor of shape: {list(weight.shape)}")
        return _nll(self, Y, cdim, weight, ignore_index, 0.0, reduction)


# --- helpers that build graphs ------------------------------------------------------------------------------
def _interleave(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(v for pair in zip(a, b) for v in pair)


def _interleave_pairs(a: Sequence[int], b: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Shrink ranges ``(0, a0), (0, b0), (0, a1), (0, b1), ...``."""
    return tuple((0, v) for pair in zip(a, b) for v in pair)


def _string_pads(padding: str, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> Pads:
    if padding == "valid":
        return ((0, 0),) * len(kernel)
    if padding == "same":
        if any(s != 1 for s in stride):
            raise RuntimeError("padding='same' is not supported for strided convolutions")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in total)
    raise RuntimeError(f"Invalid padding string: {padding!r} (expected 'same' or 'valid')")


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, groups: int, stride: int | Sequence[int],
          dilation: int | Sequence[int], pads: Pads, dtype: DType | str | None) -> Tensor:
    """Grouped N-d convolution with explicit per-side padding (negative padding crops)."""
    n = weight.ndim - 2
    unbatched = x.ndim == weight.ndim - 1
    inp = x.unsqueeze(0) if unbatched else x
    if inp.ndim != weight.ndim:
        raise RuntimeError(f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to conv{n}d, but got input of "
                           f"size: {list(x.shape)}")
    if not isinstance(groups, int) or groups <= 0:
        raise RuntimeError(f"non-positive groups is not supported: got {groups}")
    bs, cin = inp.shape[:2]
    cout, cin_g, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
    if cout % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but "
                           f"got weight of size {list(weight.shape)} instead")
    if cin != cin_g * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected "
                           f"input{list(inp.shape)} to have {cin_g * groups} channels, but got {cin} channels instead")
    s_, d_ = _int_tuple(stride, n, "stride"), _int_tuple(dilation, n, "dilation")
    _check_positive(s_, "stride")
    _check_positive(d_, "dilation")
    if bias is not None and bias.shape != (cout,):
        raise RuntimeError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with {cout} "
                           f"elements, but got bias of size {list(bias.shape)} instead")
    padded = tuple(i + pb + pa for i, (pb, pa) in zip(inp.shape[2:], pads))
    eff = tuple(d * (k - 1) + 1 for k, d in zip(ks, d_))
    if any(p < e for p, e in zip(padded, eff)):
        raise RuntimeError(f"Calculated padded input size per channel: ({_shape_str(padded)}). Kernel size: "
                           f"({_shape_str(eff)}). Kernel size can't be greater than actual input size")
    windows = inp.pad(((0, 0), (0, 0)) + tuple(pads))._pool(ks, s_, d_)       # (bs, cin, *out, *k)
    outs = windows.shape[2:2 + n]
    rcout = cout // groups
    windows = windows.reshape(bs, groups, cin_g, 1, *outs, *ks).expand(bs, groups, cin_g, rcout, *outs, *ks)
    windows = windows.permute(0, 1, 3, *range(4, 4 + n), 2, *range(4 + n, 4 + 2 * n))  # (bs, g, rc, *out, cin_g, *k)
    w = weight.reshape(1, groups, rcout, *([1] * n), cin_g, *ks)
    out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(inp.dtype, weight.dtype)
    out = (windows * w).sum(tuple(range(-1 - n, 0)), dtype=out_dt).reshape(bs, cout, *outs)
    if bias is not None:
        out = out + bias.reshape(1, cout, *([1] * n))
    return out.reshape(out.shape[1:]) if unbatched else out


def _pool_args(x: Tensor, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None,
               dilation: int | Sequence[int], padding: int | Sequence[int], ceil_mode: bool, name: str,
               effective: bool) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], Pads, list[int]]:
    """Validate pooling arguments the way torch does; returns kernel, stride, dilation, pads and output sizes."""
    k = (int(kernel_size),) * 2 if isinstance(kernel_size, (int, np.integer)) else tuple(int(v) for v in kernel_size)
    n = len(k)
    if n == 0 or x.ndim < n:
        raise RuntimeError(f"{name}: a kernel of {n} dims needs an input with at least {n} dims, got shape {x.shape}")
    s_ = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _int_tuple(stride, n, "stride")
    d_ = _int_tuple(dilation, n, "dilation")
    if any(v <= 0 for v in k):
        raise RuntimeError(f"{name}: kernel_size must be greater than zero, but got {list(k)}")
    if any(v <= 0 for v in s_):
        raise RuntimeError(f"{name}: stride must be greater than zero, but got {list(s_)}")
    if any(v <= 0 for v in d_):
        raise RuntimeError(f"{name}: dilation must be greater than zero, but got {list(d_)}")
    pads = _resolve_pads(padding, n)
    for kk, d, (pb, pa) in zip(k, d_, pads):
        limit = (d * (kk - 1) + 1) // 2 if effective else kk // 2
        if pb < 0 or pa < 0 or pb > limit or pa > limit:
            raise RuntimeError(f"{name}: pad should be at most half of {'effective ' if effective else ''}kernel size, "
                               f"but got pad={list(pads)}, kernel_size={list(k)} and dilation={list(d_)}")
    spatial = x.shape[x.ndim - n:]
    outs = [_pool_out_size(i, kk, s, d, pb, pa, ceil_mode) for i, kk, s, d, (pb, pa) in zip(spatial, k, s_, d_, pads)]
    if any(o <= 0 for o in outs):
        raise RuntimeError(f"{name}: Given input size: ({_shape_str(x.shape[:-n][-1:] + spatial)}). Calculated output "
                           f"size: ({_shape_str(x.shape[:-n][-1:] + tuple(outs))}). Output size is too small")
    return k, s_, d_, pads, outs


def _extended_pads(spatial: Sequence[int], k: Sequence[int], s_: Sequence[int], d_: Sequence[int], pads: Pads,
                   outs: Sequence[int]) -> Pads:
    """Padding that makes the padded input exactly as long as the windows reach (ceil mode may need more)."""
    return tuple((pb, (o - 1) * s + d * (kk - 1) + 1 - i - pb)
                 for i, kk, s, d, (pb, _), o in zip(spatial, k, s_, d_, pads, outs))


def _window_counts(i: int, k: int, s: int, d: int, pb: int, pa: int, pb_counted: int, o: int) -> np.ndarray:
    """How many window taps of each output land in ``[-pb_counted, i + pa)`` (the region that counts)."""
    starts = np.arange(o) * s - pb
    taps = starts[:, None] + np.arange(k)[None, :] * d
    return ((taps >= -pb_counted) & (taps < i + pa)).sum(1)


def _adaptive_sizes(x: Tensor, output_size: int | Sequence[int | None], name: str) -> tuple[int, ...]:
    if isinstance(output_size, (int, np.integer)):
        req: tuple[int | None, ...] = (int(output_size),) * 2
    else:
        req = tuple(None if v is None else int(v) for v in output_size)
    n = len(req)
    if n == 0 or x.ndim < n:
        raise RuntimeError(f"{name}: output_size {output_size} needs an input with at least {n} dims, got {x.shape}")
    spatial = x.shape[-n:]
    if any(i == 0 for i in spatial):
        raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input has "
                           f"sizes {list(x.shape)}")
    outs = tuple(i if o is None else o for i, o in zip(spatial, req))
    if any(o < 0 for o in outs):
        raise RuntimeError(f"{name}: elements of output_size must be greater than or equal to 0 but got {list(outs)}")
    return outs


def _adaptive_mask(i: int, o: int) -> np.ndarray:
    mask = np.zeros((o, i), dtype=bool)
    for r, (lo, hi) in enumerate(_adaptive_bounds(i, o)):
        mask[r, lo:hi] = True
    return mask


def _interp_weights(i: int, o: int, mode: str, align_corners: bool) -> np.ndarray:
    """An (o, i) matrix: row j mixes the input elements output j reads (torch's source-index rules)."""
    w = np.zeros((o, i), dtype=np.float64)
    dst = np.arange(o, dtype=np.float32)
    if mode in ("nearest", "nearest-exact"):
        scale = np.float32(i / o)
        src = np.floor((dst + np.float32(0.5)) * scale if mode == "nearest-exact" else dst * scale).astype(np.int64)
        w[np.arange(o), np.minimum(src, i - 1)] = 1.0
        return w
    if align_corners:
        src = dst * np.float32((i - 1) / (o - 1)) if o > 1 else np.zeros(o, dtype=np.float32)
    else:
        src = np.maximum((dst + np.float32(0.5)) * np.float32(i / o) - np.float32(0.5), np.float32(0))
    lo = np.minimum(np.floor(src).astype(np.int64), i - 1)
    hi = np.minimum(lo + 1, i - 1)
    frac = (src - lo).astype(np.float64)
    rows = np.arange(o)
    np.add.at(w, (rows, lo), 1.0 - frac)
    np.add.at(w, (rows, hi), frac)
    return w


def _diagonal(t: Tensor, p: int, q: int) -> Tensor:
    """Elements with equal indices along dims p and q, as a new last dim (those two dims removed)."""
    n = t.shape[p]
    if t.shape[q] != n:
        raise RuntimeError(f"einsum(): subscript repeated in one operand needs equal sizes, got {t.shape[p]} and "
                           f"{t.shape[q]} in shape {t.shape}")
    rest = [a for a in range(t.ndim) if a not in (p, q)]
    x = t.permute(rest + [p, q])
    lead = x.shape[:-2]
    x = x.reshape(lead + (n * n,)).pad(tuple((0, 0) for _ in lead) + ((0, n),))
    x = x.reshape(lead + (n, n + 1)).shrink(tuple((0, s) for s in lead) + ((0, n), (0, 1)))
    return x.reshape(lead + (n,))


def _repeat_heads(t: Tensor, r: int) -> Tensor:
    """Repeat each head (dim -3) ``r`` times in place, like ``repeat_interleave(r, dim=-3)``."""
    shape = t.shape
    x = t.reshape(shape[:-2] + (1,) + shape[-2:]).expand(shape[:-2] + (r,) + shape[-2:])
    return x.reshape(shape[:-3] + (shape[-3] * r,) + shape[-2:])


def _nll(logp: Tensor, Y: Tensor, cdim: int, weight: Tensor | None, ignore_index: int | None, label_smoothing: float,
         reduction: str) -> Tensor:
    """Negative log likelihood at integer labels along ``cdim`` with weights, ignored labels and label smoothing."""
    n_cls = logp.shape[cdim]
    cshape = tuple(n_cls if a == cdim else 1 for a in range(logp.ndim))
    classes = type(logp).arange(n_cls, device=logp.device).reshape(cshape)
    hit = Y.unsqueeze(cdim) == classes
    picked = hit.where(logp, 0).sum(cdim)
    if weight is not None:
        wc = weight.reshape(cshape).cast(logp.dtype)
        wy = hit.where(wc, 0).sum(cdim)
        loss = -picked * wy
    else:
        wc, wy = None, None
        loss = -picked
    if label_smoothing > 0:
        smooth = -(logp * wc).sum(cdim) if wc is not None else -logp.sum(cdim)
        loss = loss * (1 - label_smoothing) + smooth * (label_smoothing / n_cls)
    valid = (Y != ignore_index) if ignore_index is not None else None
    if valid is not None:
        loss = valid.where(loss, 0)
    if reduction != "mean":
        return _reduce_loss(loss, reduction)
    if wy is not None:
        denom = valid.where(wy, 0).sum() if valid is not None else wy.sum()
    elif valid is not None:
        denom = valid.cast(logp.dtype).sum()
    else:
        return loss.mean()
    return loss.sum() / denom
