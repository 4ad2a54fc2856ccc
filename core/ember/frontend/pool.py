"""Pooling of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): max, average and adaptive pooling.

A pooling window is a chain of views (pad, reshape, expand, shrink, permute) over the input, built
by ``_pool``, which convolution uses too; the reduction over the window then fuses with the views
into one kernel. Arguments, output sizes, ceil mode and divisors follow torch. ``max_unpool2d`` puts
pooled maxima back at the positions ``max_pool2d(return_indices=True)`` reported.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ember.dtype import dtypes
from ember.frontend.base import TensorBase
from ember.frontend.util import Pads, int_tuple, nonnegative_pads, resolve_pads, shape_str, size_arg
from ember.helpers import is_int_like, prod
from ember.ir.uop import Ops

if TYPE_CHECKING:
    import numpy as np

    from ember.tensor import Tensor
else:
    from ember.helpers import lazy_numpy as np


class PoolMixin(TensorBase):
    """Sliding-window views, max/avg/adaptive pooling over the trailing dims, and max unpooling."""

    __slots__ = ()

    # --- sliding windows -----------------------------------------------------------------------------------
    def _pool(self, kernel: Sequence[int], stride: int | Sequence[int] = 1,
              dilation: int | Sequence[int] = 1) -> Tensor:
        """Sliding windows over the last ``len(kernel)`` dims as a view: shape ``(..., *out, *kernel)``.

        Window ``o`` of a dim of size ``i`` holds elements ``o*stride + j*dilation`` for ``j < k``; the
        caller pads first. Only movement ops are used, so consumers fuse with it.
        """
        n = len(kernel)
        k_ = tuple(int(k) for k in kernel)
        s_, d_ = int_tuple(stride, n, "stride"), int_tuple(dilation, n, "dilation")
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

    # --- pooling -------------------------------------------------------------------------------------------
    def max_pool2d(self, kernel_size: int | Sequence[int] = (2, 2), stride: int | Sequence[int] | None = None,
                   dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, ceil_mode: bool = False,
                   return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Max pooling over the last ``len(kernel_size)`` dims (2 for an int), padding with ``-inf``.

        ``return_indices=True`` also returns the position (the default int) of each max in the flattened spatial input
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
        big = dtypes.max(dtypes.default_int)
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
        x = self if self.dtype.kind in "iu" else self._to_float()
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
            return self._to_float().shrink(tuple((0, s) for s in self.shape[:-n]) + tuple((0, o) for o in outs))
        if all(i % o == 0 for i, o in zip(spatial, outs)):
            k = tuple(i // o for i, o in zip(spatial, outs))
            return self.avg_pool2d(k, k) if any(kk != 1 for kk in k) else self._to_float()
        x = self._to_float()
        for j, (i, o) in enumerate(zip(spatial, outs)):
            if i == o:
                continue
            ax = x.ndim - n + j
            mask = _adaptive_mask(i, o)
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
            return (empty, empty.cast(dtypes.default_int)) if return_indices else empty
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
        big = dtypes.max(dtypes.default_int)
        flat = type(self).arange(prod(spatial), device=self.device).reshape(spatial)
        first = (cand == best).where(mask_t, False).where(flat, big).min(axes)
        return best.reshape(best.shape[:-n]), first

    def max_unpool2d(self, indices: Tensor, kernel_size: int | Sequence[int] = (2, 2),
                     stride: int | Sequence[int] | None = None, dilation: int | Sequence[int] = 1,
                     padding: int | Sequence[int] = 0, output_size: Sequence[int] | None = None) -> Tensor:
        """The partial inverse of :meth:`max_pool2d`: each value goes to the flat spatial position given by
        ``indices`` (from ``max_pool2d(..., return_indices=True)``); every other position is 0.

        Works over the last ``len(kernel_size)`` dims (2 for an int) with at least one leading dim. The
        output size is ``(i - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1`` per dim unless
        ``output_size`` (``n`` or ``n + 2`` sizes, as in torch) picks one within a stride of it. One
        kernel of ``input numel x output spatial size`` work (a one-hot match of the indices); entries of
        ``indices`` outside the output write nothing. The gradient gathers ``g`` at the indices.
        """
        k = ((int(kernel_size),) * 2 if is_int_like(kernel_size)
             else tuple(int(v) for v in kernel_size))
        n = len(k)
        if n == 0 or self.ndim <= n:
            raise RuntimeError(f"Input to max_unpooling{n}d should be a {n + 1}d or {n + 2}d Tensor, but got a tensor "
                               f"with {self.ndim} dimensions.")
        if not isinstance(indices, type(self)) or indices.shape != self.shape:
            got = list(indices.shape) if isinstance(indices, type(self)) else type(indices).__name__
            raise RuntimeError(f"Expected shape of indices to be same as that of the input tensor ({list(self.shape)}) "
                               f"but got indices tensor with shape: {got}")
        if indices.dtype.kind not in "iu":
            raise RuntimeError(f"elements in indices should be an integer type but got: {indices.dtype.name}")
        s_ = k if stride is None else int_tuple(stride, n, "stride")
        d_ = int_tuple(dilation, n, "dilation")
        pads = resolve_pads(padding, n)
        lead, spatial = self.shape[:-n], self.shape[-n:]
        default = tuple((i - 1) * s - (pb + pa) + d * (kk - 1) + 1
                        for i, kk, s, d, (pb, pa) in zip(spatial, k, s_, d_, pads))
        outs = default if output_size is None else _unpool_size(output_size, default, s_)
        cells, total = prod(spatial), prod(outs)
        x = self.reshape(lead + (cells,))
        slot = indices.reshape(lead + (1, cells))
        hit = slot == self._positions(total).cast(indices.dtype).reshape(total, 1)  # (..., total, cells)
        xs = x.detach().unsqueeze(-2)
        # duplicate indices (overlapping windows) all carry the same maximum: take it once, not their sum
        if self.dtype == dtypes.bool:
            best = hit.where(xs.cast(dtypes.uint8), 0)._max_any(-1).cast(dtypes.bool)
        else:
            best = hit.where(xs, dtypes.min(self.dtype))._max_any(-1)
        out = hit.any(-1).where(best, type(self).zeros((), dtype=self.dtype, device=self.device))

        def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor]:
            flat = g.reshape(lead + (total, 1))
            return (hit.where(flat, 0.0).sum(-2).reshape(p[0].shape),)

        return self._custom((self,), out.reshape(lead + outs), rule, "max_unpool")


def _interleave(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(v for pair in zip(a, b) for v in pair)


def _interleave_pairs(a: Sequence[int], b: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Shrink ranges ``(0, a0), (0, b0), (0, a1), (0, b1), ...``."""
    return tuple((0, v) for pair in zip(a, b) for v in pair)


def _pool_out_size(i: int, k: int, s: int, d: int, before: int, after: int, ceil_mode: bool) -> int:
    """Number of windows along one dim (torch's rule: in ceil mode the last window must start inside the input)."""
    span = i + before + after - (d * (k - 1) + 1)
    if span < 0:
        return 0
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= i + before:
        o -= 1
    return o


def _pool_args(x: Tensor, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None,
               dilation: int | Sequence[int], padding: int | Sequence[int], ceil_mode: bool, name: str,
               effective: bool) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], Pads, list[int]]:
    """Validate pooling arguments the way torch does; returns kernel, stride, dilation, pads and output sizes."""
    k = (size_arg(kernel_size, "kernel_size"),) * 2 if is_int_like(kernel_size) else \
        int_tuple(kernel_size, len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 0, "kernel_size")
    n = len(k)
    if n == 0 or x.ndim < n:
        raise RuntimeError(f"{name}: a kernel of {n} dims needs an input with at least {n} dims, got shape {x.shape}")
    s_ = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else int_tuple(stride, n, "stride")
    d_ = int_tuple(dilation, n, "dilation")
    if any(v <= 0 for v in k):
        raise RuntimeError(f"{name}: kernel_size must be greater than zero, but got {list(k)}")
    if any(v <= 0 for v in s_):
        raise RuntimeError(f"{name}: stride must be greater than zero, but got {list(s_)}")
    if any(v <= 0 for v in d_):
        raise RuntimeError(f"{name}: dilation must be greater than zero, but got {list(d_)}")
    pads = resolve_pads(padding, n)
    nonnegative_pads(pads, padding, name)
    for kk, d, (pb, pa) in zip(k, d_, pads):
        limit = (d * (kk - 1) + 1) // 2 if effective else kk // 2
        if pb < 0 or pa < 0 or pb > limit or pa > limit:
            raise RuntimeError(f"{name}: pad should be at most half of {'effective ' if effective else ''}kernel size, "
                               f"but got pad={list(pads)}, kernel_size={list(k)} and dilation={list(d_)}")
    spatial = x.shape[x.ndim - n:]
    outs = [_pool_out_size(i, kk, s, d, pb, pa, ceil_mode) for i, kk, s, d, (pb, pa) in zip(spatial, k, s_, d_, pads)]
    if any(o <= 0 for o in outs):
        raise RuntimeError(f"{name}: Given input size: ({shape_str(x.shape[:-n][-1:] + spatial)}). Calculated output "
                           f"size: ({shape_str(x.shape[:-n][-1:] + tuple(outs))}). Output size is too small")
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
    if is_int_like(output_size):
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
    """torch's adaptive pooling windows as an (o, i) bool matrix: row j covers ``[floor(j*i/o), ceil((j+1)*i/o))``."""
    mask = np.zeros((o, i), dtype=bool)
    for j in range(o):
        mask[j, (j * i) // o:-(-((j + 1) * i) // o)] = True
    return mask


def _unpool_size(output_size: Sequence[int], default: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """torch's check of an explicit unpooling size: the last ``n`` entries, each within a stride of the default."""
    n = len(default)
    req = tuple(int(v) for v in output_size)
    if len(req) == n + 2:
        req = req[2:]
    if len(req) != n:
        raise ValueError(f"output_size should be a sequence containing {n} or {n + 2} elements, but it has a length "
                         f"of '{len(req)}'")
    for j, (o, dflt, s) in enumerate(zip(req, default, stride)):
        if not dflt - s < o < dflt + s:
            raise ValueError(f'invalid output_size "{req}" (dim {j} must be between {dflt - s} and {dflt + s})')
    return req
