"""Normalization and dropout of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

The functions a network applies to rescale activations between its weighted layers: layer,
batch, RMS and group normalization (without their learned parameters where torch's functional
forms have none), and dropout, which acts only in training mode.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ember.tensor import Tensor


class NormalizationMixin:
    """layernorm, batchnorm, rms_norm, group_norm and dropout."""

    __slots__ = ()

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
