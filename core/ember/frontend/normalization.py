"""Normalization and dropout of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

The functions a network applies to rescale activations between its weighted layers: layer,
batch, RMS and group normalization (without their learned parameters where torch's functional
forms have none), Lp normalization along a dim (``F.normalize``), and dropout, which acts only in
training mode.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ember.frontend.base import TensorBase
from ember.frontend.util import _TORCH_NAMES

if TYPE_CHECKING:
    from ember.tensor import Tensor


class NormalizationMixin(TensorBase):
    """layernorm, batchnorm, rms_norm, group_norm, normalize and dropout."""

    __slots__ = ()

    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        """Normalize to zero mean and unit (biased) variance over ``axis``, like ``F.layer_norm`` without affine.

        The mean is taken about a sample of the data (``_centered_mean``), so a large common offset does
        not cost the float32 sums their precision."""
        centered = _centered(self, axis)
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
        x = self._to_float()
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

    def normalize(self, p: float = 2.0, dim: int | Sequence[int] = 1, eps: float = 1e-12) -> Tensor:
        """``self / max(||self||_p, eps)`` with the norm over ``dim``, like ``torch.nn.functional.normalize``.

        ``p`` may be any float, ``inf`` and ``-inf`` (largest and smallest magnitude) and 0 (the count of
        nonzero entries). The norm has torch's gradient, which is 0 (not nan) for an all-zero slice.
        """
        if self.dtype.kind != "f":
            raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got "
                               f"{_TORCH_NAMES.get(self.dtype.name, self.dtype.name)}")
        return self / _vector_norm(self, float(p), dim).maximum(eps)

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


def _centered(x: Tensor, axis: int | Sequence[int]) -> Tensor:
    """``x`` minus its mean over ``axis``, the mean taken about a sample of ``x`` (see ``Tensor._centered_mean``)."""
    return x - x._centered_mean(x._reduce_axes(axis))


def _vector_norm(x: Tensor, p: float, dim: int | Sequence[int]) -> Tensor:
    """The ``p``-norm of ``x`` over ``dim`` (kept as size-1 dims), with torch's gradient where it is not smooth."""
    axes = x._reduce_axes(dim)
    xs = x.detach()
    mag = xs.abs()
    if p == 0:
        out = (xs != 0).sum(axes, keepdim=True, dtype=xs.dtype)
    elif p == 1:
        out = mag.sum(axes, keepdim=True)
    elif math.isinf(p):
        out = mag.max(axes, keepdim=True) if p > 0 else mag.min(axes, keepdim=True)
    elif p == 2:
        out = (xs * xs).sum(axes, keepdim=True).sqrt()
    else:
        out = (mag ** p).sum(axes, keepdim=True) ** (1.0 / p)

    def rule(g: Tensor, o: Tensor, parents: Sequence[Tensor]) -> tuple[Tensor]:
        v = parents[0].detach()
        if p == 0:
            return (v.zeros_like(),)
        if p == 1:
            return (g * v.sign(),)
        if math.isinf(p):
            # split evenly between the entries that reach the extreme magnitude (like torch's amax/amin)
            hit = (v.abs() == o).cast(v.dtype)
            return (g * v.sign() * hit / hit.sum(axes, keepdim=True),)
        if p == 2:
            return ((o == 0).where(0.0, g * v / o),)
        local = v.sign() * v.abs() ** (p - 1) / o ** (p - 1)
        return ((o == 0).where(0.0, g * local),)

    return x._custom((x,), out, rule, "norm")
