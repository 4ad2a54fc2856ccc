"""Indexing ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

Advanced indexing (integer tensors, lists, numpy arrays and boolean masks), ``__setitem__``,
``gather``/``scatter``/``scatter_reduce`` and ``masked_fill`` (``masked_select`` and ``nonzero``: see
:mod:`ember.frontend.selection`).

There is no data-dependent load in the graph, so a lookup by an index tensor is a one-hot
selection: compare the index with a ramp ``[0, K)`` and sum the selected values over ``K``. That
is one fused kernel, with work proportional to ``output size x K``: fine for moderate sizes.
Gradients need no special rules: they flow through ``where``, the sum and the views, and come out
as scatter-adds. Results whose shape depends on the data (boolean masks) read the mask on the host.

Constant indices (lists, numpy arrays, Python ints) are bounds-checked and raise ``IndexError``
like torch. Index *tensors* are checked at the next read to the host (:mod:`ember.frontend.checks`):
an out-of-range entry raises there, naming the index, the size and the dimension; negative entries
wrap in ``t[idx]`` and ``t[idx] = v`` as in torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from ember.dtype import DType, dtypes
from ember.frontend import checks
from ember.frontend.base import TensorBase
from ember.frontend.util import Scalar, broadcast_shape, make_const
from ember.helpers import is_int_like, is_np_array, is_np_scalar, prod
from ember.ir.uop import Ops

if TYPE_CHECKING:
    import numpy as np

    from ember.tensor import Tensor
else:
    from ember.helpers import lazy_numpy as np


class _IndexPlan(NamedTuple):
    """A parsed index: a basic view of self, then integer index tensors on some of its dims."""

    basic: tuple[Any, ...]      # ints, slices and None: ``self[basic]`` is the view the advanced part indexes
    positions: tuple[int, ...]  # dims of that view that the index tensors select on, in order
    indices: tuple[Any, ...]    # one int index tensor per position, not broadcast yet, negatives wrapped
    shape: tuple[int, ...]      # the broadcast shape of the index tensors


_BAD_INDEX = "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are valid indices"


class BadScatterReduce(TypeError, RuntimeError):
    """An unknown ``reduce`` for ``scatter``: the TypeError tinygrad raises and the RuntimeError torch raises."""


class IndexingMixin(TensorBase):
    """Indexing methods; see the module docstring."""

    __slots__ = ()

    # --- helpers ---------------------------------------------------------------------------------
    def _const(self, value: Scalar, dtype: DType | None = None) -> Tensor:
        """A 0-d constant on self's device (self's dtype unless given)."""
        return type(self)(make_const(value, dtype or self.dtype, self.device))

    def _positions(self, n: int) -> Tensor:
        """``[0, n)`` on self's device: int32, or int64 for more than 2**31 positions (int32 would wrap)."""
        return type(self)._ramp(n, self.device).cast(dtypes.int32 if n <= 2 ** 31 else dtypes.int64)

    @staticmethod
    def _pick(onehot: Tensor, values: Tensor, axis: int) -> Tensor:
        """The value where ``onehot`` is true along ``axis`` (a sum with at most one hit), in values' dtype."""
        if values.dtype == dtypes.bool:
            return onehot._and_mask(values).cast(dtypes.uint8).max(axis).cast(dtypes.bool)
        zero = values._const(0)
        return onehot.where(values, zero).sum(axis, dtype=values.dtype)

    def _and_mask(self, other: Tensor) -> Tensor:
        """Elementwise logical and (both sides read as bool, broadcast together)."""
        a, b = self.cast(dtypes.bool)._broadcasted(other.cast(dtypes.bool))
        return a._alu(Ops.AND, b)

    def _index_tensor(self, index: Any, name: str) -> Tensor:
        """``index`` as an integer tensor on self's device (lists allowed); floats raise like torch."""
        t = index if isinstance(index, type(self)) else type(self)(np.asarray(index), device=self.device)
        if t.dtype.kind not in "iu":
            raise RuntimeError(f"{name}(): Expected dtype int32/int64 for index, got {t.dtype.name}")
        return t.to(self.device)

    # --- reading: t[idx] with tensors, lists, arrays and masks ----------------------------------
    def _parse_index(self, indices: Any) -> _IndexPlan:
        entries = list(indices) if isinstance(indices, tuple) else [indices]
        items: list[tuple[str, Any]] = []
        for e in entries:
            items.append(self._classify_index(e))
        if sum(1 for kind, _ in items if kind == "ellipsis") > 1:
            raise IndexError("indices can only have a single ellipsis ('...')")
        consumed = sum(self._dims_used(kind, p) for kind, p in items)
        if consumed > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
        fill = [("slice", slice(None))] * (self.ndim - consumed)
        e_at = next((i for i, (kind, _) in enumerate(items) if kind == "ellipsis"), None)
        items = items[:e_at] + fill + items[e_at + 1:] if e_at is not None else items + fill

        basic: list[Any] = []
        adv: list[tuple[int, Any]] = []  # (position in the basic view, index array or tensor)
        dim = view_dim = 0
        for kind, p in items:
            if kind == "none":
                basic.append(None)
                view_dim += 1
            elif kind == "int":
                size = self.shape[dim]
                if not -size <= p < size:
                    raise IndexError(f"index {p} is out of bounds for dimension {dim} with size {size}")
                basic.append(p)
                dim += 1
            elif kind == "slice":
                basic.append(p)
                dim += 1
                view_dim += 1
            elif kind == "index":
                basic.append(slice(None))
                adv.append((view_dim, self._checked_index(p, dim)))
                dim += 1
                view_dim += 1
            else:  # a boolean mask: its true positions index the next mask.ndim dims
                for hits in self._mask_hits(p, dim):
                    if hits is None:  # a 0-d mask (True / False): a new axis of size 1, kept or emptied
                        basic.append(None)
                        adv.append((view_dim, np.zeros((1 if p else 0,), np.int64)))
                    else:
                        basic.append(slice(None))
                        adv.append((view_dim, hits))
                        dim += 1
                    view_dim += 1
        shapes = [tuple(np.shape(i)) if not isinstance(i, type(self)) else i.shape for _, i in adv]
        try:
            shape = broadcast_shape(*shapes) if shapes else ()
        except RuntimeError:
            raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                             + ", ".join(str(list(s)) for s in shapes)) from None
        return _IndexPlan(tuple(basic), tuple(pos for pos, _ in adv), tuple(i for _, i in adv), shape)

    def _dims_used(self, kind: str, p: Any) -> int:
        if kind in ("int", "slice", "index"):
            return 1
        if kind == "mask":
            return p.ndim if isinstance(p, type(self)) else int(np.ndim(p))
        return 0

    def _classify_index(self, e: Any) -> tuple[str, Any]:
        if e is None:
            return "none", None
        if e is Ellipsis:
            return "ellipsis", None
        if isinstance(e, bool) or (is_np_scalar(e) and e.dtype == bool):
            return "mask", np.asarray(bool(e))
        if is_int_like(e):
            return "int", int(e)
        if isinstance(e, slice):
            return "slice", e
        if isinstance(e, type(self)):
            if e.dtype in (dtypes.bool, dtypes.uint8):
                return "mask", e
            if e.dtype.kind not in "iu":
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            return "index", e
        if isinstance(e, (list, tuple)) or is_np_array(e):
            try:
                arr = np.asarray(e)
            except ValueError as err:
                raise IndexError(f"{_BAD_INDEX} (got a ragged sequence: {err})") from None
            if arr.dtype == np.bool_ or arr.dtype == np.uint8 and is_np_array(e):
                return "mask", arr
            if arr.size == 0:
                return "index", arr.astype(np.int64)
            if arr.dtype.kind in "iu":
                return "index", arr.astype(np.int64)
            if arr.dtype.kind == "f":  # torch would truncate them; tinygrad and numpy refuse, and so does ember
                raise IndexError(f"{_BAD_INDEX} (got float indices {arr.tolist()})")
            raise IndexError(f"{_BAD_INDEX} (got an array of {arr.dtype})")
        if isinstance(e, (str, bytes)):
            raise TypeError(f"invalid index type {type(e).__name__}")
        raise IndexError(f"{_BAD_INDEX} (got {type(e).__name__})")

    def _mask_hits(self, mask: Any, dim: int) -> list[np.ndarray | None]:
        """The positions of a mask's true entries, one int64 array per dim it covers (read on the host).

        ``[None]`` for a 0-d mask, which adds an axis instead of covering one.
        """
        m = (mask.numpy() if isinstance(mask, type(self)) else np.asarray(mask)).astype(bool)
        if m.ndim == 0:
            return [None]
        want = self.shape[dim:dim + m.ndim]
        if m.shape != want:
            raise IndexError(f"The shape of the mask {list(m.shape)} at index {dim} does not match the shape of the "
                             f"indexed tensor {list(self.shape)} at index {dim}")
        return [hits.astype(np.int64) for hits in np.nonzero(m)]

    def _checked_index(self, index: Any, dim: int) -> Any:
        """Constant indices: bounds-checked and wrapped. Tensors: negatives wrapped in the graph."""
        size = self.shape[dim]
        if isinstance(index, type(self)):
            i = index.to(self.device)
            checks.index_in_range(i, size, dim, negative_ok=True)
            return (i < 0).where(i + size, i)
        arr = np.asarray(index, dtype=np.int64)
        bad = (arr < -size) | (arr >= size)
        if bad.any():
            if size == 0:
                raise IndexError("index is out of bounds for dimension with size 0")
            raise IndexError(f"index {int(arr[bad].flat[0])} is out of bounds for dimension {dim} with size {size}")
        return np.where(arr < 0, arr + size, arr)

    def _flat_index(self, plan: _IndexPlan, sizes: Sequence[int]) -> Tensor:
        """One integer tensor of shape ``plan.shape``: the row-major position within the indexed dims."""
        idx_dt = dtypes.int32 if prod(sizes) < 2 ** 31 else dtypes.int64
        flat: Tensor | None = None
        stride = 1
        for index, size in reversed(list(zip(plan.indices, sizes))):
            t = index if isinstance(index, type(self)) else type(self)(np.asarray(index), device=self.device)
            t = t.cast(idx_dt)._broadcast_to(plan.shape)
            term = t * stride if stride != 1 else t
            flat = term if flat is None else flat + term
            stride *= size
        assert flat is not None
        return flat

    def _getitem_advanced(self, indices: Any) -> Tensor:
        """``self[indices]`` where the index has tensors, lists, numpy arrays or bools (torch semantics).

        Integer indices broadcast together; when they index adjacent dims the result's index dims
        replace them in place, otherwise they come first. Boolean masks select their true positions
        (read on the host). Python ints and slices are applied first, as a view.
        """
        plan = self._parse_index(indices)
        sub = self[plan.basic]
        return sub._take(plan) if plan.positions else sub

    @staticmethod
    def _layout(pos: tuple[int, ...], ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The dims that come before and after the index dims in torch's result layout.

        Index dims that are adjacent stay in place; otherwise the index dims come first.
        """
        rest = tuple(d for d in range(ndim) if d not in pos)
        if list(pos) == list(range(pos[0], pos[0] + len(pos))):
            return tuple(d for d in rest if d < pos[0]), tuple(d for d in rest if d > pos[0])
        return (), rest

    def _take(self, plan: _IndexPlan) -> Tensor:
        """Apply plan's index tensors to self (the basic view), straight into the result layout (one kernel)."""
        pos, s = plan.positions, plan.shape
        before, after = self._layout(pos, self.ndim)
        sizes = [self.shape[d] for d in pos]
        k = prod(sizes)
        bshape, ashape = tuple(self.shape[d] for d in before), tuple(self.shape[d] for d in after)
        if k == 0 or prod(s) == 0:
            return type(self).zeros(*(bshape + s + ashape), dtype=self.dtype, device=self.device)
        values = self.permute(before + after + pos).reshape(bshape + (1,) * len(s) + ashape + (k,))
        flat = self._flat_index(plan, sizes).reshape((1,) * len(before) + s + (1,) * len(after) + (1,))
        onehot = flat == self._positions(k).cast(flat.dtype)
        return self._pick(onehot, values, -1)

    # --- writing: t[idx] = value --------------------------------------------------------------------
    def __setitem__(self, indices: Any, value: Tensor | Scalar) -> None:
        """``self[indices] = value``: any index ``__getitem__`` takes; ``value`` a scalar or broadcastable tensor.

        The update is functional (``self.assign`` of a masked composition), so other tensors built
        from the old value keep it. With repeated indices the last write wins.
        """
        self.assign(self._setitem_result(indices, value))

    def _setitem_result(self, indices: Any, value: Tensor | Scalar) -> Tensor:
        v = self._setitem_value(value)
        mask_only = self._single_mask(indices)
        if mask_only is not None:
            return self._masked_set(mask_only, v)
        plan = self._parse_index(indices)
        sub = self[plan.basic]
        if plan.positions:
            before, after = self._layout(plan.positions, sub.ndim)
            target = tuple(sub.shape[d] for d in before) + plan.shape + tuple(sub.shape[d] for d in after)
        else:
            target = sub.shape
        v = self._fit_value(v, target)
        if plan.positions:
            new_sub = sub._put(plan, v)
        else:
            new_sub = v._broadcast_to(target)
        return self._unbasic(plan.basic, new_sub)

    def _setitem_value(self, value: Any) -> Tensor:
        if isinstance(value, type(self)):
            return value.to(self.device).cast(self.dtype)
        if isinstance(value, (bool, int, float)) or is_np_scalar(value):
            return self._const(value.item() if is_np_scalar(value) else value)
        return type(self)(np.asarray(value), device=self.device).cast(self.dtype)

    @staticmethod
    def _fit_value(v: Tensor, target: tuple[int, ...]) -> Tensor:
        while v.ndim > len(target) and v.shape[0] == 1:
            v = v.reshape(v.shape[1:])
        try:
            ok = v.ndim <= len(target) and broadcast_shape(v.shape, target) == tuple(target)
        except RuntimeError:
            ok = False
        if not ok:
            raise RuntimeError(f"shape mismatch: value tensor of shape {list(v.shape)} cannot be broadcast to indexing "
                               f"result of shape {list(target)}")
        return v._broadcast_to(tuple(target))

    def _single_mask(self, indices: Any) -> Tensor | None:
        """The mask when the index is one boolean mask over leading dims (no host read needed to write)."""
        e = indices[0] if isinstance(indices, tuple) and len(indices) == 1 else indices
        if isinstance(e, type(self)) and e.dtype == dtypes.bool and 0 < e.ndim <= self.ndim:
            return e if e.shape == self.shape[:e.ndim] else None
        if is_np_array(e) and e.dtype == np.bool_ and 0 < e.ndim <= self.ndim and \
                e.shape == self.shape[:e.ndim]:
            return type(self)(e, device=self.device)
        return None

    def _masked_set(self, mask: Tensor, v: Tensor) -> Tensor:
        """``self[mask] = v`` for a value that does not depend on how many entries are true."""
        rest = self.shape[mask.ndim:]
        try:
            fits = v.ndim <= len(rest) + 1 and (v.ndim <= len(rest) or v.shape[0] == 1)
            inner = v.reshape(v.shape[1:]) if v.ndim == len(rest) + 1 else v
            fits = fits and broadcast_shape(inner.shape, rest) == tuple(rest)
        except RuntimeError:
            fits = False
        if not fits:  # the value has one entry per true mask element: the general path places it
            return self._setitem_general_mask(mask, v)
        m = mask.to(self.device).reshape(mask.shape + (1,) * len(rest))
        return m.where(inner._broadcast_to(rest), self)

    def _setitem_general_mask(self, mask: Tensor, v: Tensor) -> Tensor:
        plan = self._parse_index((mask,))
        sub = self[plan.basic]
        target = plan.shape + sub.shape[len(plan.positions):]
        return self._unbasic(plan.basic, sub._put(plan, self._fit_value(v, target)))

    def _put(self, plan: _IndexPlan, value: Tensor) -> Tensor:
        """Self (the basic view) with ``value`` (shaped like ``self._take(plan)``) written at the indexed places.

        Of repeated indices the last one wins: one reduction finds it per destination, a second one
        selects its value.
        """
        pos = plan.positions
        before, after = self._layout(pos, self.ndim)
        sizes = [self.shape[d] for d in pos]
        k, n = prod(sizes), prod(plan.shape)
        if k == 0 or n == 0 or self.numel() == 0:
            return self
        bshape, ashape = tuple(self.shape[d] for d in before), tuple(self.shape[d] for d in after)
        nb, na = len(before), len(after)
        v = value.reshape(bshape + (n, 1) + ashape)
        flat = self._flat_index(plan, sizes).reshape(n, 1)
        onehot = flat == self._positions(k).cast(flat.dtype).reshape(1, k)  # (n, k)
        entry = self._positions(n).reshape(n, 1)
        last = onehot.where(entry, -1).max(0, keepdim=True)  # (1, k): the last entry writing each destination
        chosen = onehot._and_mask(entry == last).reshape((1,) * nb + (n, k) + (1,) * na)
        picked = self._pick(chosen, v, nb)  # bshape + (k,) + ashape
        order = before + pos + after
        moved = self.permute(order).reshape(bshape + (k,) + ashape)
        written = (last >= 0).reshape((1,) * nb + (k,) + (1,) * na)
        updated = written.where(picked, moved).reshape(bshape + tuple(sizes) + ashape)
        return updated.permute(tuple(sorted(range(self.ndim), key=order.__getitem__)))

    def _unbasic(self, basic: tuple[Any, ...], y: Tensor) -> Tensor:
        """Self with ``y`` written where ``self[basic]`` reads (ints, slices of any step and None)."""
        if all(isinstance(b, slice) and b == slice(None) for b in basic) and len(basic) == self.ndim:
            return y.reshape(self.shape)
        full_shape: list[int] = []
        view_dim = 0
        for b in basic:
            if b is None:
                view_dim += 1
            elif isinstance(b, slice):
                full_shape.append(y.shape[view_dim])
                view_dim += 1
            else:
                full_shape.append(1)
        vals = y.reshape(tuple(full_shape))
        mask = type(self).ones(*vals.shape, dtype=dtypes.bool, device=self.device)
        dims = [b for b in basic if b is not None]
        pads: list[tuple[int, int]] = []
        for d, (b, size) in enumerate(zip(dims, self.shape)):
            if not isinstance(b, slice):
                j = b + size if b < 0 else b
                pads.append((j, size - j - 1))
                continue
            start, stop, step = b.indices(size)
            n = len(range(start, stop, step))
            if n == 0:
                return self
            if step < 0:
                vals, mask = vals.flip(d), mask.flip(d)
                start, step = start + (n - 1) * step, -step
            if step > 1:
                vals, mask = (_spread(t, d, step) for t in (vals, mask))
            span = (n - 1) * step + 1
            pads.append((start, size - start - span))
        vals, mask = vals.pad(tuple(pads)), mask.pad(tuple(pads))
        return mask.where(vals, self)

    # --- gather and scatter --------------------------------------------------------------------------
    def _check_index_shape(self, dim: int, index: Tensor, src: Tensor | None = None) -> None:
        if index.ndim != self.ndim:
            raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
        for d, (i, s) in enumerate(zip(index.shape, self.shape)):
            if d != dim and i > s:
                raise RuntimeError(f"Size does not match at dimension {d} expected index {list(index.shape)} to be "
                                   f"no larger than self {list(self.shape)} apart from dimension {dim}")
            if src is not None and i > src.shape[d]:
                raise RuntimeError(f"Expected index {list(index.shape)} to be no larger than self {list(self.shape)} "
                                   f"apart from dimension {dim} and to be no larger size than src {list(src.shape)}")

    def gather(self, dim: int, index: Tensor) -> Tensor:
        """``out[i][j] = self[index[i][j]][j]`` for ``dim=0`` (and likewise for other dims), like torch.gather.

        ``index`` has self's number of dims and no dim larger than self's, except along ``dim``.
        One kernel: a one-hot match of ``index`` against ``[0, self.shape[dim])`` and a sum.
        """
        index = self._index_tensor(index, "gather")
        if self.ndim == 0:
            return self.reshape(1).gather(0, index.reshape(1)).reshape(index.shape)
        d = self._axis(dim)
        self._check_index_shape(d, index)
        k = self.shape[d]
        checks.index_in_range(index, k, d)
        if index.numel() == 0 or k == 0:
            return type(self).zeros(*index.shape, dtype=self.dtype, device=self.device)
        x = self.shrink(tuple((0, k) if i == d else (0, s) for i, s in enumerate(index.shape)))
        others = tuple(i for i in range(self.ndim) if i != d)
        moved = x.permute(others + (d,)).unsqueeze(d).expand(index.shape + (k,))
        onehot = index.unsqueeze(-1) == self._positions(k).cast(index.dtype)
        return self._pick(onehot, moved, -1)

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        """The entries of ``index`` (a 1-D integer tensor) along ``dim``."""
        index = self._index_tensor(index, "index_select")
        if index.ndim > 1:
            raise IndexError("index_select(): Index is supposed to be a vector")
        d = self._axis(dim)
        checks.index_in_range(index, self.shape[d], d, message="index {index} is out of range for dimension {dim} "
                              "with size {size} (index_select)")
        return self._getitem_advanced((slice(None),) * d + (index.reshape(-1),))

    def _scatter_parts(self, dim: int, index: Any, src: Any, name: str) -> tuple[int, Tensor, Tensor]:
        """Checked ``(dim, onehot, values)`` for a scatter along ``dim``.

        Both have the shape ``self.shape[:dim] + (m, K) + self.shape[dim + 1:]`` where ``m`` is the
        index length along ``dim`` and ``K`` self's: ``onehot`` says which index entry hits which
        destination (padded with False where the index is smaller than self). Reducing over axis
        ``dim`` then lands in self's layout, so the final combine fuses with the reduction.
        """
        index = self._index_tensor(index, name)
        d = self._axis(dim)
        if isinstance(src, type(self)):
            if src.dtype != self.dtype:
                raise RuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype")
            self._check_index_shape(d, index, src)
            part = src.to(self.device).shrink(tuple((0, s) for s in index.shape))
        else:
            self._check_index_shape(d, index)
            part = self._const(src)._broadcast_to(index.shape)
        k, nd = self.shape[d], self.ndim
        checks.index_in_range(index, k, d)
        ramp = self._positions(k).cast(index.dtype).reshape((1,) * (d + 1) + (k,) + (1,) * (nd - d - 1))
        onehot = index.unsqueeze(d + 1) == ramp
        values = part.unsqueeze(d + 1)._broadcast_to(onehot.shape)
        pads = tuple((0, 0) if i in (d, d + 1) else (0, self.shape[i if i < d else i - 1] - n)
                     for i, n in enumerate(onehot.shape))
        if any(p != (0, 0) for p in pads):
            onehot, values = onehot.pad(pads), values.pad(pads)
        return d, onehot, values

    def scatter(self, dim: int, index: Tensor, src: Tensor | Scalar, reduce: str | None = None) -> Tensor:
        """Self with ``src`` written at ``index`` along ``dim`` (torch.scatter); a scalar ``src`` writes that value.

        ``reduce="add"`` or ``"multiply"`` combines instead of overwriting. With repeated indices and no
        reduce, the last write wins.
        """
        if reduce not in (None, "add", "multiply"):
            raise BadScatterReduce(f"reduce={reduce!r}: the reduce argument must be None, 'add' or 'multiply'")
        if reduce is not None and isinstance(src, TensorBase):
            # tinygrad refuses a tensor src with reduce (torch deprecates it); scatter_reduce does that
            raise TypeError(f"scatter with reduce={reduce!r} takes a scalar src only; for a tensor src use "
                            f"scatter_reduce(dim, index, src, {'sum' if reduce == 'add' else 'prod'!r})")
        d, onehot, vals = self._scatter_parts(dim, index, src, "scatter")
        if onehot.shape[d] == 0 or self.numel() == 0:
            return self
        if reduce == "add":
            return self + self._reduce_hits(onehot, vals, d, "sum")
        if reduce == "multiply":
            return self * self._reduce_hits(onehot, vals, d, "prod")
        if not isinstance(src, type(self)):  # one value for every hit: no need to find the last write
            hit = onehot.cast(dtypes.uint8).max(d).cast(dtypes.bool)
            return hit.where(self._const(src), self)
        m = onehot.shape[d]
        entry = self._positions(m).reshape((1,) * d + (m, 1) + (1,) * (self.ndim - d - 1))
        last = onehot.where(entry, -1).max(d, keepdim=True)
        chosen = onehot._and_mask(entry == last)
        written = (last >= 0).reshape(self.shape)
        return written.where(self._pick(chosen, vals, d), self)

    def _reduce_hits(self, onehot: Tensor, vals: Tensor, d: int, how: str) -> Tensor:
        """Combine the values that hit each destination (``how`` in sum, prod, amax, amin) over axis ``d``.

        A destination nothing hits gets the reduction's identity (0, 1, the dtype's min or max).
        """
        dt = self.dtype
        if how == "sum":
            return onehot.where(vals, self._const(0)).sum(d, dtype=dt)
        if how == "prod":
            return onehot.where(vals, self._const(1)).prod(d).cast(dt)
        if how == "amax":
            return onehot.where(vals, self._const(dtypes.min(dt))).max(d)
        return onehot.where(vals, self._const(dtypes.max(dt))).min(d)

    def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """Self plus ``src`` added at ``index`` along ``dim`` (repeated indices accumulate)."""
        return self.scatter_reduce(dim, index, src, "sum")

    def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
        """Combine ``src`` into self at ``index`` along ``dim`` with ``reduce`` in sum, prod, mean, amax, amin.

        With ``include_self`` the existing value takes part; otherwise destinations that any index hits
        are replaced by the reduction of what hits them. Integer ``mean`` rounds down, like torch.
        """
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
        if not isinstance(src, type(self)):
            raise TypeError(f"scatter_reduce(): argument 'src' must be Tensor, not {type(src).__name__}")
        d, onehot, vals = self._scatter_parts(dim, index, src, "scatter_reduce")
        if onehot.shape[d] == 0 or self.numel() == 0:
            return self
        red = self._reduce_hits(onehot, vals, d, "sum" if reduce == "mean" else reduce)
        if reduce == "sum" and include_self:
            return self + red
        count = onehot.cast(dtypes.int32).sum(d, dtype=dtypes.int32)
        hit = count > 0
        if reduce == "mean":
            total = self + red if include_self else red
            n = (count + 1 if include_self else count.maximum(1)).cast(self.dtype)
            return hit.where(total / n if self.dtype.kind == "f" else _floor_div(total, n), self)
        if not include_self:
            return hit.where(red, self)
        if reduce == "prod":
            return self * red
        return hit.where(self.maximum(red) if reduce == "amax" else self.minimum(red), self)

    # --- masks ---------------------------------------------------------------------------------
    def masked_fill(self, mask: Tensor, value: Tensor | Scalar) -> Tensor:
        """``value`` where ``mask`` (bool, broadcastable to self) is true, self elsewhere."""
        if not isinstance(mask, type(self)) or mask.dtype != dtypes.bool:
            got = mask.dtype.name if isinstance(mask, type(self)) else type(mask).__name__
            raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype {got}")
        if isinstance(value, type(self)):
            if value.ndim != 0:
                raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                                   f"{value.ndim} dimension(s).")
            fill = value.to(self.device).cast(self.dtype)
        else:
            fill = self._const(value)
        return mask.to(self.device).where(fill, self)


def _spread(t: Tensor, d: int, step: int) -> Tensor:
    """Put ``step - 1`` fill slots between consecutive entries of dim ``d`` (the inverse of a strided read)."""
    n = t.shape[d]
    wide = t.reshape(t.shape[:d + 1] + (1,) + t.shape[d + 1:])
    wide = wide.pad(tuple((0, step - 1) if i == d + 1 else (0, 0) for i in range(wide.ndim)))
    flat = wide.reshape(t.shape[:d] + (n * step,) + t.shape[d + 1:])
    return flat.shrink(tuple((0, (n - 1) * step + 1) if i == d else (0, s) for i, s in enumerate(flat.shape)))


def _floor_div(a: Tensor, b: Tensor) -> Tensor:
    """Integer division rounding toward negative infinity (b > 0)."""
    q = a._alu(Ops.IDIV, b)
    return (q * b != a)._and_mask(a < 0).where(q - 1, q)
