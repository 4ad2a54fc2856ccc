"""Resampling of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): interpolate.

Each resized dim is a product with a small (out, in) weight matrix built on the host with torch's
source-index rules; whole-number nearest scaling is a view instead.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ember.dtype import dtypes
from ember.frontend.base import TensorBase
from ember.frontend.util import ArgumentError
from ember.helpers import is_int_like

if TYPE_CHECKING:
    import numpy as np

    from ember.tensor import Tensor
else:
    from ember.helpers import lazy_numpy as np


class ResampleMixin(TensorBase):
    """Linear and nearest-neighbour resizing of the trailing dims."""

    __slots__ = ()

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
        if is_int_like(size):
            sizes = (int(size),) * max(self.ndim - 2, 1)
        else:
            sizes = tuple(int(s) for s in size)
        if not 0 < len(sizes) <= self.ndim or any(s <= 0 for s in sizes):
            raise ArgumentError(f"interpolate: invalid size {size} for an input of shape {self.shape}")
        n = len(sizes)
        x = self
        for j, o in reversed(list(enumerate(sizes))):  # last dim first, as tinygrad (uint8 rounds per dim)
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
            if linear and x.dtype == dtypes.uint8:
                res = _lerp_uint8(moved, i, o, align_corners)
            elif linear:
                xf = moved._to_float()
                w = type(self)(weights, device=self.device).cast(xf.dtype)
                m = type(self)(weights != 0, device=self.device)
                res = m.where(xf * w, 0).sum(-1)
            else:
                m = type(self)(weights != 0, device=self.device)
                res = m.where(moved, 0).sum(-1, dtype=moved.dtype)
            x = res.transpose(ax, -1)
        # integer inputs keep their dtype, as in tinygrad (uint8 is rounded per dim above, others truncate)
        return x.cast(self.dtype) if x.dtype != self.dtype else x


def _lerp_uint8(moved: Tensor, i: int, o: int, align_corners: bool) -> Tensor:
    """Linear resampling of uint8 ``moved`` (..., 1, i) to (..., o) in tinygrad's 7-bit fixed point: output j is
    ``a + floor(((b - a) * w + 64) / 128)`` with ``a``, ``b`` its two source elements and ``w`` its weight toward
    ``b`` rounded to 1/128. tinygrad takes ``b - a`` as an int8, which wraps when the two differ by more than
    127; here it is the true difference (the same result whenever tinygrad's is right)."""
    j = np.arange(o, dtype=np.int64)
    if align_corners:  # source position j * (i - 1) / (o - 1) as an exact fraction num / den
        num, den = j * (i - 1), max(o - 1, 1)
    else:              # (j + 0.5) * i / o - 0.5, clamped to [0, i - 1]
        num, den = (2 * j + 1) * i - o, 2 * o
    num = np.clip(num, 0, (i - 1) * den)
    lo, hi = num // den, -(-num // den)
    w = ((num % den).astype(np.float32) / np.float32(den) * np.float32(128) + np.float32(0.5)).astype(np.int32)
    rows = np.zeros((o, i), dtype=bool)
    pick = type(moved)

    def gathered(at: np.ndarray) -> Tensor:
        sel = rows.copy()
        sel[j, at] = True
        return pick(sel, device=moved.device).where(moved, 0).sum(-1, dtype=dtypes.int32)

    a, b = gathered(lo), gathered(hi)
    wt = pick(w, device=moved.device)
    return (a + ((b - a) * wt + 64).div(128, rounding_mode="floor")).cast(dtypes.uint8)


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
