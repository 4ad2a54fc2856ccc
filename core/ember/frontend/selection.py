"""Selection by a mask of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): masked_select and nonzero.

Without ``size`` the result's length depends on the data, so the mask is read on the host. With
``size=N`` (tinygrad's form) the length is fixed and nothing is read back: the ``j``-th selected
element is found by a one-hot match of a running count of the mask against ``j`` (``N x numel``
work in one fused kernel), and slots past the number of hits take ``fill_value``. Such a call can
live in a captured, replayed graph.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.dtype import dtypes, to_np_dtype
from ember.frontend.base import TensorBase
from ember.frontend.util import Scalar, broadcast_shape
from ember.helpers import is_int_like, prod
from ember.ir.uop import Ops

if TYPE_CHECKING:
    import numpy as np

    from ember.tensor import Tensor
else:
    from ember.helpers import lazy_numpy as np


class SelectionMixin(TensorBase):
    """masked_select and nonzero; see the module docstring."""

    __slots__ = ()

    def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Scalar = 0) -> Tensor:
        """The elements of self (broadcast with ``mask``) where ``mask`` is true, as a 1-D tensor.

        Without ``size`` the output length depends on the data (the mask is read on the host). With
        ``size=N`` (tinygrad's form) the output has exactly ``N`` elements, the first ``N`` selected ones
        padded with ``fill_value``, and nothing is read back: the selection is an ``N x numel`` one-hot match.
        """
        if not isinstance(mask, type(self)) or mask.dtype != dtypes.bool:
            got = mask.dtype.name if isinstance(mask, type(self)) else type(mask).__name__
            raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {got}")
        shape = broadcast_shape(self.shape, mask.shape)
        flat = self._broadcast_to(shape).reshape(-1)
        m = mask.to(self.device)._broadcast_to(shape).reshape(-1)
        if size is None:
            return flat._getitem_advanced(np.flatnonzero(m.numpy()))
        from ember.frontend.sorting import _pick_exact

        onehot, found = m._select_slots(_check_size(size, "masked_select"))
        picked = _pick_exact(onehot, flat) if flat.numel() else flat._const(0)._broadcast_to((size,))
        return found.where(picked, flat._const(fill_value))

    def nonzero(self, as_tuple: bool = False, size: int | None = None,
                fill_value: Scalar = 0) -> Tensor | tuple[Tensor, ...]:
        """Positions of the nonzero elements (the default int): ``(count, ndim)``, or one 1-D tensor per dim.

        Without ``size`` the count depends on the data (self is read on the host). With ``size=N``
        (tinygrad's form) the result has ``N`` rows, the first ``N`` positions padded with ``fill_value``,
        computed on the device.
        """
        cls, it = type(self), dtypes.default_int
        if size is not None:
            n = _check_size(size, "nonzero")
            flat = self.reshape(-1) != 0
            onehot, found = flat._select_slots(n)
            pos = onehot.where(self._positions(flat.numel()).unsqueeze(0), -1)._max_any(-1).cast(it)  # flat index
            cols = []
            for d in range(self.ndim):  # unravel the flat index (sizes of 0 only occur with nothing found)
                stride = max(prod(self.shape[d + 1:]), 1)
                cols.append((pos._alu(Ops.IDIV, pos._const(stride)) % max(self.shape[d], 1)).unsqueeze(-1))
            out = cls.cat(*cols, dim=-1) if cols else cls.zeros(n, 0, dtype=it, device=self.device)
            out = found.unsqueeze(-1).where(out, out._const(fill_value))
            return tuple(out[:, d] for d in range(self.ndim)) if as_tuple else out
        hits = np.nonzero(self.numpy().reshape(self.shape) if self.ndim else self.numpy().reshape(1))
        npi = to_np_dtype(it)
        if as_tuple:
            return tuple(cls(h.astype(npi), device=self.device) for h in hits)
        if self.ndim == 0:
            return cls(np.zeros((len(hits[0]), 0), npi), device=self.device)
        return cls(np.stack(hits, axis=1).astype(npi).reshape(-1, self.ndim), device=self.device)

    def _select_slots(self, n: int) -> tuple[Tensor, Tensor]:
        """For a 1-D bool mask: ``onehot[j, k]`` is true where ``k`` is the (j+1)-th true entry, ``found[j]``
        where there is one (j < count)."""
        c = self.cast(dtypes.int32).cumsum() if self.numel() else self.cast(dtypes.int32)
        slots = self._positions(n).reshape(n, 1)
        onehot = (c.unsqueeze(0) == slots + 1)._and_mask(self.unsqueeze(0))
        count = self.cast(dtypes.int32).sum()
        return onehot, self._positions(n) < count


def _check_size(size: Any, name: str) -> int:
    """A non-negative int ``size=`` argument, else a ValueError naming it."""
    if not is_int_like(size) or isinstance(size, bool) or size < 0:
        raise ValueError(f"{name}(): size must be a non-negative int, got {size!r}")
    return int(size)
