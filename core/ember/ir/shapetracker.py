"""Views: how a logical shape maps onto a flat buffer, and stacks of them (ShapeTracker).

A :class:`View` is (shape, strides, offset, mask): element ``idx`` lives at
``offset + sum(idx[i] * strides[i])`` and is valid (else reads as 0) when every
``mask[i][0] <= idx[i] < mask[i][1]``. Movement ops (reshape, permute, expand, pad, shrink,
flip) make new views without touching data. When a reshape cannot be expressed as one view,
a :class:`ShapeTracker` stacks views; codegen composes them into one index expression.

Sizes, strides, offsets and mask bounds may be symbolic ("sint"): integer expressions (UOps)
over bound variables (``DEFINE_VAR`` nodes whose arg carries the value, see
:class:`ember.ir.symbolic.Variable`), as made by ``reshape``, ``shrink`` and ``pad`` with a
:class:`~ember.ir.symbolic.Variable`. A symbolic size stands for any value in the variable's
range: a buffer holding such a view is sized for the largest. :meth:`ShapeTracker.unbind`
strips the values for a kernel AST, so one compiled kernel serves every value. Reshapes that
would split or merge a symbolic dimension with others of a strided view stack a second view.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ember.dtype import DType, dtypes
from ember.ir.symbolic import rebind_uop, sadd, simplify, sint_eval, smax, smin, smul, sprod, ssub, sym_le, unbind_uop
from ember.ir.uop import Ops, UOp

sint = int | UOp
Mask = tuple[tuple[sint, sint], ...]


def strides_for_shape(shape: tuple[sint, ...]) -> tuple[sint, ...]:
    """Row-major strides, with 0 for size-1 dims (they never move the index)."""
    strides: list[sint] = []
    acc: sint = 1
    for s in reversed(shape):
        strides.append(acc if s != 1 else 0)
        acc = smul(acc, s)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class View:
    """One affine view with an optional validity mask. Build with :meth:`create`."""

    shape: tuple[sint, ...]
    strides: tuple[sint, ...]
    offset: sint
    mask: Mask | None
    contiguous: bool

    @staticmethod
    @functools.cache
    def create(shape: tuple[sint, ...], strides: tuple[sint, ...] | None = None, offset: sint = 0,
               mask: Mask | None = None) -> View:
        """Canonicalize and build a view (size-1 strides are 0, full masks are dropped)."""
        strides = strides_for_shape(shape) if strides is None else tuple(0 if s == 1 else st
                                                                          for s, st in zip(shape, strides))
        if mask is not None:
            if all(lo == 0 and hi == s for (lo, hi), s in zip(mask, shape)):
                mask = None
            elif any(sym_le(hi, lo) for lo, hi in mask):
                # nothing valid: normalise so equal views compare equal
                mask, strides, offset = tuple((0, 0) for _ in shape), (0,) * len(shape), 0
        contiguous = isinstance(offset, int) and offset == 0 and mask is None and strides == strides_for_shape(shape)
        return View(shape, strides, offset, mask, contiguous)

    def __repr__(self) -> str:
        # symbolic parts in full (a UOp's own repr stops at depth 3): disk cache keys are built from this text
        def full(x: sint) -> str:
            return x.pretty() if isinstance(x, UOp) else repr(x)

        mask = None if self.mask is None else "(" + ", ".join(f"({full(lo)}, {full(hi)})" for lo, hi in self.mask) + \
            ("," if len(self.mask) == 1 else "") + ")"
        def tup(xs: tuple[sint, ...]) -> str:
            return "(" + ", ".join(full(x) for x in xs) + ("," if len(xs) == 1 else "") + ")"

        return (f"View(shape={tup(self.shape)}, strides={tup(self.strides)}, offset={full(self.offset)}, "
                f"mask={mask}, contiguous={self.contiguous!r})")

    @property
    def size(self) -> sint:
        return sprod(self.shape)

    def permute(self, order: tuple[int, ...]) -> View:
        return View.create(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset,
                           tuple(self.mask[i] for i in order) if self.mask else None)

    def expand(self, new_shape: tuple[sint, ...]) -> View:
        mask = None
        if self.mask:
            mask = tuple(m if s == ns else ((0, ns) if m != (0, 0) else (0, 0))
                         for m, s, ns in zip(self.mask, self.shape, new_shape))
        strides = tuple(st if s == ns else 0 for st, s, ns in zip(self.strides, self.shape, new_shape))
        return View.create(new_shape, strides, self.offset, mask)

    def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> View:
        """Keep ``[lo, hi)`` of each dim; bounds (and so sizes) may be symbolic."""
        offset = self.offset
        for (lo, _), st in zip(arg, self.strides):
            offset = sadd(offset, smul(lo, st)) if st != 0 else offset
        mask = None
        if self.mask:
            mask = tuple((ssub(smax(mlo, lo), lo), ssub(smax(smin(mhi, hi), smax(mlo, lo)), lo))
                         for (mlo, mhi), (lo, hi) in zip(self.mask, arg))
        return View.create(tuple(ssub(hi, lo) for lo, hi in arg), self.strides, offset, mask)

    def pad(self, arg: tuple[tuple[sint, sint], ...]) -> View:
        """Pad each dim with ``(before, after)``; the amounts (and so sizes) may be symbolic."""
        if all(isinstance(b, int) and isinstance(a, int) and b == 0 == a for b, a in arg):
            return self
        new_shape = tuple(sadd(s, sadd(b, a)) for s, (b, a) in zip(self.shape, arg))
        base_mask = self.mask or tuple((0, s) for s in self.shape)
        mask = tuple((sadd(lo, b), sadd(hi, b)) for (lo, hi), (b, _) in zip(base_mask, arg))
        offset = self.offset
        for (b, _), st in zip(arg, self.strides):
            offset = ssub(offset, smul(b, st)) if st != 0 else offset
        return View.create(new_shape, self.strides, offset, mask)

    def flip(self, axes: tuple[int, ...]) -> View:
        strides = list(self.strides)
        offset = self.offset
        mask = list(self.mask) if self.mask else None
        for ax in axes:
            s = self.shape[ax]
            if s == 0:
                continue
            offset = sadd(offset, smul(ssub(s, 1), strides[ax]))
            strides[ax] = smul(strides[ax], -1)
            if mask is not None:
                lo, hi = mask[ax]
                mask[ax] = (ssub(s, hi), ssub(s, lo))
        return View.create(self.shape, tuple(strides), offset, tuple(mask) if mask else None)

    def reshape(self, new_shape: tuple[sint, ...]) -> View | None:
        """The same elements in a new shape as one view, or None if that needs a second view."""
        if self.shape == new_shape:
            return self
        if self.contiguous or 0 in new_shape:
            return View.create(new_shape)
        old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self.mask or [None] * len(self.shape))]
        # drop size-1 dims; they carry no stride and a mask there is (0,1) or empty
        if self.mask and any(s == 1 and m == (0, 0) for s, _, m in old):
            return None
        core = [(s, st, m) for s, st, m in old if s != 1]
        new_core = [s for s in new_shape if s != 1]
        if [s for s, _, _ in core] == new_core:
            it = iter(core)
            strides: list[sint] = []
            mask: list[tuple[sint, sint]] = []
            for s in new_shape:
                if s == 1:
                    strides.append(0)
                    mask.append((0, 1))
                else:
                    _, st, m = next(it)
                    strides.append(st)
                    mask.append(m if m is not None else (0, s))
            return View.create(new_shape, tuple(strides), self.offset, tuple(mask) if self.mask else None)
        if self.mask or any(isinstance(s, UOp) for s in (*self.shape, *new_shape, *self.strides)):
            return None
        # merge/split dims without a mask: walk groups of equal element count
        strides_out: list[int] = []
        i = 0
        # (every size and stride is an int here)
        olds = cast(list[tuple[int, int]], [(s, st) for s, st, _ in core])
        j = 0
        news = cast(list[int], new_core)
        while i < len(olds) or j < len(news):
            if i >= len(olds) or j >= len(news):
                return None
            group_old = [olds[i]]
            group_new = [news[j]]
            po, pn = olds[i][0], news[j]
            i += 1
            j += 1
            while po != pn:
                if po < pn:
                    if i >= len(olds):
                        return None
                    group_old.append(olds[i])
                    po *= olds[i][0]
                    i += 1
                else:
                    if j >= len(news):
                        return None
                    group_new.append(news[j])
                    pn *= news[j]
                    j += 1
            # the old group must be mergeable: each dim's stride = next stride * next size
            for (_, st0), (s1, st1) in zip(group_old, group_old[1:]):
                if st0 != st1 * s1:
                    return None
            inner = group_old[-1][1]
            acc = inner
            gs: list[int] = []
            for s in reversed(group_new):
                gs.append(acc)
                acc *= s
            strides_out.extend(reversed(gs))
        it2 = iter(strides_out)
        full = tuple(0 if s == 1 else next(it2) for s in new_shape)
        return View.create(new_shape, full, self.offset, None)

    def to_index(self, idxs: list[UOp], idx_dtype: DType) -> tuple[UOp, UOp]:
        """The flat index and the validity condition for logical indices ``idxs``."""
        idx = _as_index(self.offset, idx_dtype)
        for i, st in zip(idxs, self.strides):
            if st != 0:
                idx = idx + i * _as_index(st, idx_dtype)
        valid = UOp.const(dtypes.bool, True)
        if self.mask:
            for i, (lo, hi), s in zip(idxs, self.mask, self.shape):
                if not sym_le(lo, 0):
                    valid = valid.logical_and(_as_index(ssub(lo, 1), idx_dtype).lt(i))
                if not sym_le(s, hi):
                    valid = valid.logical_and(i.lt(_as_index(hi, idx_dtype)))
        return idx, valid

    def sints(self) -> tuple[sint, ...]:
        """Every size, stride, offset and mask bound of the view."""
        return (*self.shape, *self.strides, self.offset, *(b for m in self.mask or () for b in m))

    @property
    def symbolic(self) -> bool:
        """Whether a size, stride, the offset or a mask bound depends on a variable."""
        return any(isinstance(x, UOp) for x in self.sints())

    @property
    def symbolic_shape(self) -> bool:
        """Whether a size depends on a variable."""
        return any(isinstance(s, UOp) for s in self.shape)

    def unbind(self, var_vals: dict[str, int]) -> View:
        """This view with its variables' values stripped (collected into ``var_vals``)."""
        return self._map_sints(lambda x: unbind_uop(x, var_vals))

    def rebind(self, var_vals: dict[str, int]) -> View:
        """This view with the variables named in ``var_vals`` bound to those values."""
        return self._map_sints(lambda x: rebind_uop(x, var_vals))

    def _map_sints(self, u: Callable[[sint], sint]) -> View:
        """This view with ``u`` applied to every size, stride, offset and mask bound (itself when none is
        symbolic)."""
        if not self.symbolic:
            return self
        mask = tuple((u(lo), u(hi)) for lo, hi in self.mask) if self.mask is not None else None
        return View.create(tuple(map(u, self.shape)), tuple(map(u, self.strides)), u(self.offset), mask)


@dataclass(frozen=True)
class ShapeTracker:
    """A stack of views; the last one is what the user sees, the first one addresses memory."""

    views: tuple[View, ...]

    @staticmethod
    def from_shape(shape: tuple[sint, ...]) -> ShapeTracker:
        return ShapeTracker((View.create(tuple(shape)),))

    @property
    def shape(self) -> tuple[sint, ...]:
        return self.views[-1].shape

    @property
    def size(self) -> sint:
        return self.views[-1].size

    @property
    def contiguous(self) -> bool:
        return len(self.views) == 1 and self.views[0].contiguous

    def _replace_last(self, v: View) -> ShapeTracker:
        return ShapeTracker(self.views[:-1] + (v,))

    def reshape(self, new_shape: tuple[sint, ...]) -> ShapeTracker:
        new = self.views[-1].reshape(tuple(new_shape))
        if new is not None:
            return self._replace_last(new)
        return ShapeTracker(self.views + (View.create(tuple(new_shape)),))

    def permute(self, order: tuple[int, ...]) -> ShapeTracker:
        return self._replace_last(self.views[-1].permute(tuple(order)))

    def expand(self, new_shape: tuple[sint, ...]) -> ShapeTracker:
        return self._replace_last(self.views[-1].expand(tuple(new_shape)))

    def pad(self, arg: tuple[tuple[sint, sint], ...]) -> ShapeTracker:
        return self._replace_last(self.views[-1].pad(tuple(arg)))

    def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> ShapeTracker:
        return self._replace_last(self.views[-1].shrink(tuple(arg)))

    def flip(self, axes: tuple[int, ...]) -> ShapeTracker:
        return self._replace_last(self.views[-1].flip(tuple(axes)))

    @functools.cached_property
    def symbolic(self) -> bool:
        """Whether any view depends on a variable."""
        return any(v.symbolic for v in self.views)

    def var_names(self) -> set[str]:
        """The names of the variables the views depend on."""
        names: set[str] = set()
        for v in self.views if self.symbolic else ():
            for x in v.sints():
                if isinstance(x, UOp):
                    names.update(n.arg[0] for n in x.toposort() if n.op is Ops.DEFINE_VAR)
        return names

    def var_maxima(self) -> dict[str, int]:
        """The largest value of each variable the views depend on (by name)."""
        out: dict[str, int] = {}
        for v in self.views if self.symbolic else ():
            for x in v.sints():
                if isinstance(x, UOp):
                    out.update((n.arg[0], n.arg[2]) for n in x.toposort() if n.op is Ops.DEFINE_VAR)
        return out

    def unbind(self) -> tuple[ShapeTracker, dict[str, int]]:
        """(this tracker with variable values stripped, the values by name)."""
        var_vals: dict[str, int] = {}
        if not self.symbolic:
            return self, var_vals
        return ShapeTracker(tuple(v.unbind(var_vals) for v in self.views)), var_vals

    def at_values(self, var_vals: dict[str, int]) -> ShapeTracker:
        """This tracker with every variable at its value in ``var_vals`` (all plain ints): a concrete stand-in
        to plan a symbolic kernel's loops with."""
        if not self.symbolic:
            return self

        def c(x: sint) -> int:
            return sint_eval(x, var_vals)

        return ShapeTracker(tuple(View.create(tuple(map(c, v.shape)), tuple(map(c, v.strides)), c(v.offset),
                                              tuple((c(lo), c(hi)) for lo, hi in v.mask) if v.mask else None)
                                  for v in self.views))

    def rebind(self, var_vals: dict[str, int]) -> ShapeTracker:
        """This tracker with the variables named in ``var_vals`` bound to those values (a jitted function's
        result, captured for one value, read for another)."""
        return ShapeTracker(tuple(v.rebind(var_vals) for v in self.views)) if self.symbolic else self

    def __add__(self, other: ShapeTracker) -> ShapeTracker:
        """Compose: ``other`` is a view of the tensor that ``self`` describes."""
        out = self
        for v in other.views:
            if v.contiguous:
                out = out.reshape(v.shape)
            else:
                out = ShapeTracker(out.views + (v,))
        return out


    def to_index(self, idxs: list[UOp], idx_dtype: DType = dtypes.int32) -> tuple[UOp, UOp]:
        """Compose every view into (flat index, validity) for logical indices ``idxs``."""
        idx, valid = self.views[-1].to_index(idxs, idx_dtype)
        for v in reversed(self.views[:-1]):
            idx = simplify(idx)
            sub: list[UOp] = []
            acc: sint = 1
            for s in reversed(v.shape):
                sub.append((idx // _as_index(acc, idx_dtype)) % _as_index(s, idx_dtype) if s != 1
                           else UOp.const(idx_dtype, 0))
                acc = smul(acc, s)
            sub = [simplify(x) for x in reversed(sub)]
            idx, v_valid = v.to_index(sub, idx_dtype)
            valid = valid.logical_and(v_valid)
        return simplify(idx), simplify(valid)




def _as_index(x: sint, idx_dtype: DType) -> UOp:
    """An int or symbolic int as an index expression of ``idx_dtype``."""
    return x.cast(idx_dtype) if isinstance(x, UOp) else UOp.const(idx_dtype, x)

