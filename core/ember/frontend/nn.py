"""NN ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ember.tensor import Tensor


class NNMixin:
    """NN methods; see the module docstring."""

    __slots__ = ()

    def dot(self, w: Tensor) -> Tensor:
        return self.matmul(w)

    def matmul(self, w: Tensor) -> Tensor:
        """Matrix product with numpy/torch semantics for 1-D and batched inputs."""
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {x.ndim}D and {w.ndim}D")
        k_x = x.shape[-1]
        k_w = w.shape[-2] if w.ndim > 1 else w.shape[0]
        if k_x != k_w:
            xs = "x".join(map(str, x.shape if x.ndim > 1 else (1,) + x.shape))
            ws = "x".join(map(str, w.shape))
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({xs} and {ws})")
        x2 = x.reshape(*x.shape[:-1], 1, k_x)
        w2 = w.reshape(1, k_w, *w.shape[-1:]) if w.ndim == 1 else w
        w2 = w2.transpose(-1, -2)  # (..., m, k)
        if w.ndim == 1:
            w2 = w.reshape(1, k_w)
        out = (x2 * w2).sum(-1)
        if w.ndim == 1:
            out = out.reshape(out.shape[:-1])
        return out

    def __matmul__(self, y: Tensor) -> Tensor:
        return self.matmul(y)

    def __rmatmul__(self, y: Tensor) -> Tensor:
        return y.matmul(self)
