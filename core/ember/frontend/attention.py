"""Attention of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): scaled dot-product attention.

Like ``F.scaled_dot_product_attention``: masks, causal masking, grouped-query heads and dropout,
composed of matmul and softmax.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.dtype import dtypes
from ember.frontend.base import TensorBase

if TYPE_CHECKING:
    from ember.tensor import Tensor


class AttentionMixin(TensorBase):
    """scaled_dot_product_attention."""

    __slots__ = ()

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
        q = self._to_float()
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


def _repeat_heads(t: Tensor, r: int) -> Tensor:
    """Repeat each head (dim -3) ``r`` times in place, like ``repeat_interleave(r, dim=-3)``."""
    shape = t.shape
    x = t.reshape(shape[:-2] + (1,) + shape[-2:]).expand(shape[:-2] + (r,) + shape[-2:])
    return x.reshape(shape[:-3] + (shape[-3] * r,) + shape[-2:])
