"""Sorting of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): sort, argsort and topk.

ember graphs have no data-dependent loads, so a sort along a dim of ``n`` elements is a ranking:
element ``i`` goes to position ``rank(i)``, the number of elements that come before it (smaller
ones, and equal ones at lower positions, which makes the sort stable). The ranks are one fused
comparison-count kernel of O(n^2) work per row; the sorted values and their indices are then
picked with a one-hot match of the ranks against ``[0, n)`` (O(n^2) again, O(n*k) for ``topk``).
That is three kernels for any shape and fine for moderate ``n`` (thousands of elements per row).

Order follows torch: nan counts as larger than every number (last when ascending, first when
descending), ``-0.0`` and ``0.0`` are equal, and equal elements keep their original order in
both directions. The values carry gradients (each input element receives the gradient of the
output position it was moved to); the indices are the default int (int32), as in tinygrad.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ember.dtype import dtypes
from ember.frontend.base import TensorBase

if TYPE_CHECKING:
    from ember.tensor import Tensor


class SortingMixin(TensorBase):
    """sort, argsort and topk; see the module docstring."""

    __slots__ = ()

    def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        """``(values, indices)``: self sorted along ``dim`` (stable; nan last, or first when ``descending``).

        O(n^2) work per row of ``n`` elements in three kernels (see the module docstring).
        """
        d = self._axis(dim)
        if self.ndim == 0:
            return self, type(self).zeros((), dtype=dtypes.default_int, device=self.device)
        return self._sorted_along(d, self.shape[d], descending)

    def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
        """The indices (the default int) that sort self along ``dim`` (stable; nan as in :meth:`sort`)."""
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
        """``(values, indices)`` of the ``k`` largest (or smallest) elements along ``dim``, best first.

        The result is always in sorted order (``sorted_=False`` allows any order, and this is one);
        among equal elements the earlier one comes first, and nan counts as the largest value.
        O(n^2) work per row for the ranks and O(n*k) for the picks.
        """
        if self.dtype == dtypes.bool:
            raise RuntimeError("topk does not support bool dtypes")
        d = self._axis(dim)
        n = self.shape[d] if self.ndim else 1
        if not isinstance(k, int) or isinstance(k, bool):
            raise TypeError(f"topk(): argument 'k' must be int, not {type(k).__name__}")
        if not 0 <= k <= n:
            raise RuntimeError(f"selected index k out of range (k={k}, size of dim {d} is {n})")
        if self.ndim == 0:
            return self, type(self).zeros((), dtype=dtypes.default_int, device=self.device)
        return self._sorted_along(d, k, largest)

    # --- helpers ---------------------------------------------------------------------------------
    def _sorted_along(self, d: int, k: int, descending: bool) -> tuple[Tensor, Tensor]:
        """The first ``k`` values and (default int) indices of self sorted along dim ``d`` (valid, ndim >= 1)."""
        last = self.ndim - 1
        x = self.transpose(d, last) if d != last else self  # the sorted dim is last: (..., n)
        n = x.shape[-1]
        if k == 0 or x.numel() == 0:
            vals = x.shrink(tuple((0, s) for s in x.shape[:-1]) + ((0, k),))  # keeps the gradient link
            idx = type(self).zeros(*vals.shape, dtype=dtypes.default_int, device=self.device)
        else:
            rank = _ranks(x.detach(), descending)                                  # (..., n) int32
            slot = self._positions(k).reshape(k, 1)
            onehot = rank.unsqueeze(-2) == slot                                    # (..., k, n): rank[i] == r
            idx = onehot.where(self._positions(n).cast(dtypes.default_int), 0).sum(-1, dtype=dtypes.default_int)
            vals = _pick_exact(onehot, x)
        if d != last:
            vals, idx = vals.transpose(d, last), idx.transpose(d, last)
        return vals, idx


def _ranks(x: Tensor, descending: bool) -> Tensor:
    """int32 position of each element of the last dim in the stable sorted order (nan largest)."""
    n = x.shape[-1]
    if x.dtype == dtypes.bool:
        x = x.cast(dtypes.uint8)
    xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)                                     # [..., i, j]
    ahead = xj > xi if descending else xj < xi
    same = xj == xi
    if x.dtype.kind == "f":
        # nan sorts after every number ascending (before every number descending) and equals nan
        ni, nj = xi != xi, xj != xj
        ahead = ahead | ((nj & (xi == xi)) if descending else (ni & (xj == xj)))
        same = same | (ni & nj)
    earlier = type(x)._tri(n, n, 1, device=x.device).T                           # [i, j]: j < i
    before = ahead | (same & earlier)
    return before.cast(dtypes.int32).sum(-1, dtype=dtypes.int32)


def _pick_exact(onehot: Tensor, x: Tensor) -> Tensor:
    """``out[..., r] = x[..., i]`` where ``onehot[..., r, i]`` (exactly one ``i`` per ``r``), bit-exact.

    A max over the row with every other entry at the dtype's minimum keeps ``-0.0`` and nan, which a
    sum would not; the gradient sends ``g[r]`` back to the element picked for ``r``.
    """
    xs = x.detach()
    lowest = dtypes.min(xs.dtype)
    if xs.dtype == dtypes.bool:
        out = onehot.where(xs.unsqueeze(-2).cast(dtypes.uint8), 0)._max_any(-1).cast(dtypes.bool)
    else:
        out = onehot.where(xs.unsqueeze(-2), lowest)._max_any(-1)

    def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor]:
        return (onehot.where(g.unsqueeze(-1), 0.0).sum(-2),)

    return x._custom((x,), out, rule, "sort")
