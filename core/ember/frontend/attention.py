"""Attention of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): scaled dot-product attention.

Like ``F.scaled_dot_product_attention``: masks, causal masking, grouped-query heads and dropout,
composed of matmul and softmax; without dropout, its gradient is taken in fewer kernels (see
:func:`_attention`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

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
        if _fused_backward(q, key, value, attn_mask, dropout_p):
            return _attention(q, key, value, factor, is_causal, attn_mask)
        scores = _masked(q.matmul(key.transpose(-2, -1)) * factor, is_causal, attn_mask)
        return scores.softmax(-1).dropout(dropout_p).matmul(value)


def _masked(scores: Tensor, is_causal: bool, attn_mask: Tensor | None) -> Tensor:
    """``scores`` with the causal and the given mask applied: compares of two ramps and a ``where``, fused into
    the kernels that read the scores (no (queries x keys) mask is materialized)."""
    if is_causal:
        n_q, n_k = scores.shape[-2], scores.shape[-1]
        rows = type(scores).arange(n_q, device=scores.device).reshape(n_q, 1)
        cols = type(scores).arange(n_k, device=scores.device).reshape(1, n_k)
        scores = (cols <= rows).where(scores, -math.inf)
    if attn_mask is not None:
        scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask
    return scores


def _fused_backward(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float) -> bool:
    """Whether :func:`_attention` applies: same float dtype and leading dims for q, k and v (no broadcasting to
    undo in the gradients), no dropout in effect and no mask that needs a gradient."""
    if dropout_p > 0 and type(q).training:
        return False
    if attn_mask is not None and attn_mask.requires_grad:
        return False
    return q.dtype == k.dtype == v.dtype and q.dtype.kind == "f" and q.ndim == k.ndim == v.ndim >= 2 and \
        q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and k.shape[-2] == v.shape[-2]


def _attention(q: Tensor, k: Tensor, v: Tensor, factor: float, is_causal: bool, attn_mask: Tensor | None) -> Tensor:
    """``softmax(mask(q k^T * factor)) v`` with its own gradient.

    Autograd through the softmax would form ``dP = g v^T``, reduce ``dP * P`` over the keys, then ``dS``: three
    kernels over (queries x keys). Here ``sum_j P_ij dP_ij = g_i . out_i`` (a reduction over the head dim), so
    ``dS = P * (g v^T - rowsum(g * out)) * factor`` is the ``g v^T`` kernel with an elementwise epilogue.
    """
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    p = _masked(qd.matmul(kd.transpose(-2, -1)) * factor, is_causal, attn_mask).softmax(-1)
    out = p.matmul(vd)

    def rule(g: Tensor, o: Tensor, parents: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        delta = (g * o).sum(-1, keepdim=True)
        ds = p * (g.matmul(vd.transpose(-2, -1)) - delta) * factor
        return ds.matmul(kd), ds.transpose(-2, -1).matmul(qd), p.transpose(-2, -1).matmul(g)

    return q._custom((q, k, v), out, rule, "scaled_dot_product_attention")


def _repeat_heads(t: Tensor, r: int) -> Tensor:
    """Repeat each head (dim -3) ``r`` times in place, like ``repeat_interleave(r, dim=-3)``."""
    shape = t.shape
    x = t.reshape(shape[:-2] + (1,) + shape[-2:]).expand(shape[:-2] + (r,) + shape[-2:])
    return x.reshape(shape[:-3] + (shape[-3] * r,) + shape[-2:])
