"""Losses of the Tensor API (a mixin of :class:`ember.tensor.Tensor`), and one_hot for class labels.

Binary and categorical cross-entropy and negative log likelihood with torch's arguments,
reductions, label smoothing, class weights and ignored labels; ``self`` is the prediction.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ember.dtype import dtypes
from ember.frontend import checks
from ember.frontend.base import TensorBase
from ember.frontend.util import broadcast_shape, size_arg

if TYPE_CHECKING:
    from ember.tensor import Tensor

REDUCTIONS = ("none", "mean", "sum")


def _check_target_broadcasts(x: Tensor, y: Tensor) -> None:
    """A binary cross-entropy's target must broadcast with its input (tinygrad computes the loss elementwise)."""
    try:
        broadcast_shape(x.shape, y.shape)
    except RuntimeError:
        raise ValueError(f"the target's shape {y.shape} does not broadcast with the input's shape {x.shape}") from None


class LossMixin(TensorBase):
    """Cross-entropy and nll losses, and one-hot encoding of class labels."""

    __slots__ = ()

    def one_hot(self, num_classes: int | None = None) -> Tensor:
        """A tensor (the default int) with a trailing dim of ``num_classes`` holding 1 at each index.

        Without ``num_classes`` it is the largest index + 1 (torch's default); a negative ``num_classes``
        (torch's explicit -1 included) is a ValueError, as in tinygrad, whose code passes it explicitly.
        """
        if self.dtype.kind not in "iu":
            raise RuntimeError(f"one_hot is only applicable to index tensors, got dtype {self.dtype}")
        if num_classes is None:
            if self.numel() == 0:
                raise RuntimeError("Can not infer total number of classes from empty tensor.")
            num_classes = int(self.max().item()) + 1
        if size_arg(num_classes, "num_classes") < 0:
            raise ValueError(f"one_hot: num_classes must be non-negative, got {num_classes}")
        checks.index_in_range(self, num_classes, self.ndim, message="one_hot: class value {index} is out of range "
                              "for num_classes={size} (new dimension {dim})")
        classes = type(self).arange(num_classes, device=self.device)
        return (self.unsqueeze(-1) == classes).cast(dtypes.default_int)

    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        """Binary cross-entropy of probabilities ``self`` against targets ``Y`` (logs clamped at -100, like torch).

        ``Y`` broadcasts with ``self`` as in tinygrad (torch wants equal shapes)."""
        _check_reduction(reduction)
        _check_target_broadcasts(self, Y)
        if Y.dtype == dtypes.bool:  # a mask as target, as tinygrad takes it
            Y = Y.cast(self.dtype if self.dtype.kind == "f" else dtypes.default_float)
        p = self._to_float()
        loss = -(Y * p.log().maximum(-100) + (1 - Y) * (1 - p).log().maximum(-100))
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean",
                                   pos_weight: Tensor | None = None) -> Tensor:
        """Binary cross-entropy of logits ``self`` against targets ``Y`` (numerically stable), like torch.

        ``Y`` broadcasts with ``self`` as in tinygrad (torch wants equal shapes)."""
        _check_reduction(reduction)
        _check_target_broadcasts(self, Y)
        if Y.dtype == dtypes.bool:  # a mask as target, as tinygrad takes it
            Y = Y.cast(self.dtype if self.dtype.kind == "f" else dtypes.default_float)
        x = self._to_float()
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
        return _sparse_xent(self._to_float(), Y, ignore_index, label_smoothing, reduction)

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
        logp = self._to_float().log_softmax(cdim)
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


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction (expected one of {REDUCTIONS})")


def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    raise ValueError(f"{reduction} is not a valid value for reduction (expected one of {REDUCTIONS})")


def _sparse_xent(x: Tensor, Y: Tensor, ignore_index: int, label_smoothing: float, reduction: str) -> Tensor:
    """Cross-entropy of float logits ``x`` (classes last) at labels ``Y``, with its own gradient.

    Per row ``lse - (1 - s) * x[y] - s/K * sum(x)``: the label's logit is a one-hot sum the codegen lowers to
    one load, and the gradient ``g * (softmax - (1 - s) * onehot - s/K)`` is one elementwise pass over the
    logits (the softmax from the saved row ``lse``, the one-hot compare recomputed, nothing of (rows x
    classes) kept), instead of log_softmax's backward with its extra reduction over the classes.
    """
    n_cls = x.shape[-1]
    checks.index_in_range(Y, n_cls, x.ndim - 1, ignore=ignore_index,
                          message="Target {index} is out of bounds (size {size} along dimension {dim} of the input).")
    xd = x.detach()
    m = xd._max_any(-1, keepdim=True)
    m = (m.abs() == float("inf")).where(0.0, m)
    lse = ((xd - m).exp().sum(-1, keepdim=True).log() + m).contiguous()
    classes = type(x).arange(n_cls, device=x.device)
    hit = Y.unsqueeze(-1) == classes
    loss = lse.squeeze(-1) - hit.where(xd, 0).sum(-1) * (1 - label_smoothing)
    if label_smoothing > 0:
        loss = loss - xd.sum(-1) * (label_smoothing / n_cls)
    valid = Y != ignore_index
    loss = valid.where(loss, 0)

    def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor]:
        w = valid.where(g, 0).unsqueeze(-1)
        soft = (xd - lse).exp() - hit.where(1.0 - label_smoothing, 0.0)
        return (w * (soft - label_smoothing / n_cls if label_smoothing > 0 else soft),)

    loss = x._custom((x,), loss, rule, "sparse_categorical_crossentropy")
    if reduction != "mean":
        return _reduce_loss(loss, reduction)
    return loss.sum() / valid.cast(loss.dtype).sum()


def _nll(logp: Tensor, Y: Tensor, cdim: int, weight: Tensor | None, ignore_index: int | None, label_smoothing: float,
         reduction: str) -> Tensor:
    """Negative log likelihood at integer labels along ``cdim`` with weights, ignored labels and label smoothing."""
    n_cls = logp.shape[cdim]
    cshape = tuple(n_cls if a == cdim else 1 for a in range(logp.ndim))
    checks.index_in_range(Y, n_cls, cdim, ignore=ignore_index,
                          message="Target {index} is out of bounds (size {size} along dimension {dim} of the input).")
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
