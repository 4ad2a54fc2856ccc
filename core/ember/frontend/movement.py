"""Movement ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`).

Everything here is built from the movement primitives of the Tensor (reshape, permute,
expand, pad, shrink, flip), so the results stay views (no copy, no kernel) and gradients
come from those primitives. ``cat``/``stack`` and the non-constant pad modes combine
padded views with ``where``, which fuses into the consumer's kernel. Diagonals, sliding windows
(``unfold``) and einops-style ``rearrange`` are views too.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Sequence

from ember.dtype import dtypes, least_upper_dtype
from ember.frontend.base import TensorBase
from ember.frontend.util import ArgumentError, EmptyTensorList, size_arg
from ember.helpers import prod
from ember.ir.symbolic import Variable, sadd, sint_of, ssub
from ember.ir.uop import UOp

if TYPE_CHECKING:
    from ember.tensor import Tensor

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _argfix(args: Sequence[Any]) -> tuple[Any, ...]:
    """``f(1, 2)`` and ``f((1, 2))`` / ``f([1, 2])`` mean the same."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


class _NoTensors:
    """The default ``self`` of ``Tensor.cat()``/``Tensor.stack()`` called with no tensors, so the call reaches
    the "non-empty list" error instead of Python's "missing 1 required positional argument: 'self'"."""


_NO_TENSORS: Any = _NoTensors()


def _tensor_list(first: Any, rest: Sequence[Any], name: str = "cat") -> list[Any]:
    """The tensors of ``Tensor.cat(a, b)``, ``Tensor.cat([a, b])``, ``a.cat(b, c)`` and ``a.cat([b, c])``."""
    out: list[Any] = []
    for item in (() if first is _NO_TENSORS else (first,)) + tuple(rest):
        if isinstance(item, (list, tuple)):
            out.extend(item)
        else:
            out.append(item)
    for i, t in enumerate(out):
        if not isinstance(t, TensorBase):
            raise TypeError(f"{name}(): expected a sequence of Tensors, but got {type(t).__name__} at position {i}")
    return out


def _along(x: Any, d: int, lo: int, hi: int) -> Any:
    """``x`` shrunk to ``[lo, hi)`` along dimension ``d``."""
    return x.shrink(tuple((lo, hi) if i == d else None for i in range(x.ndim)))


class MovementMixin(TensorBase):
    """Movement methods; see the module docstring."""

    __slots__ = ()

    # --- dimension shuffles ------------------------------------------------------------------
    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        """Swap dimensions ``dim0`` and ``dim1`` (tinygrad's defaults swap the first two)."""
        order = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def swapaxes(self, axis0: int, axis1: int) -> Tensor:
        """Alias of :meth:`transpose` (numpy/torch name)."""
        return self.transpose(axis0, axis1)

    def swapdims(self, dim0: int, dim1: int) -> Tensor:
        """Alias of :meth:`transpose` (torch name)."""
        return self.transpose(dim0, dim1)

    @property
    def T(self) -> Tensor:
        """All dimensions reversed (a matrix transposed)."""
        return self.permute(tuple(reversed(range(self.ndim))))

    # --- reshapes ------------------------------------------------------------------------------
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge dimensions ``start_dim..end_dim`` (inclusive) into one; a 0-d tensor becomes 1-d."""
        if self.ndim == 0:
            self._axis(start_dim), self._axis(end_dim)
            return self.reshape(1)
        s, e = self._axis(start_dim), self._axis(end_dim)
        if s > e:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        """Split dimension ``dim`` into ``sizes`` (one entry may be -1); the inverse of :meth:`flatten`."""
        if self.ndim == 0:
            raise RuntimeError("unflatten: Dimension specified as 0 but tensor has no dimensions")
        d = self._axis(dim)
        sizes = tuple(int(s) for s in sizes)
        if not sizes:
            raise RuntimeError("unflatten: sizes must be non-empty")
        n = self.shape[d]
        if sizes.count(-1) > 1:
            raise RuntimeError("unflatten: only one dimension can be inferred")
        known = prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if known == 0 or n % known:
                raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim "
                                   f"{dim} ({n}) in the input tensor")
            sizes = tuple(n // known if s == -1 else s for s in sizes)
        if any(s < 0 for s in sizes) or prod(sizes) != n:
            raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {dim} "
                               f"({n}) in the input tensor")
        return self.reshape(self.shape[:d] + sizes + self.shape[d + 1:])

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Drop size-1 dimensions: all of them, or those among ``dim`` (an int or a tuple)."""
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
        axes = [self._axis(d) for d in dims]
        for a in axes:
            if axes.count(a) > 1:
                raise RuntimeError(f"dim {a} appears multiple times in the list of dims")
        if self.ndim == 0:
            return self
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in axes and s == 1)))

    def unsqueeze(self, dim: int) -> Tensor:
        """Insert a size-1 dimension at ``dim`` (negative counts from the end of the result)."""
        d = self._axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    # --- repeats -------------------------------------------------------------------------------
    def repeat(self, repeats: int | Sequence[int], *args: int) -> Tensor:
        """Tile the tensor ``repeats[i]`` times along each dimension (extra leading repeats add dimensions)."""
        reps = tuple(size_arg(r, "repeats entry") for r in _argfix((repeats, *args)))
        if len(reps) < self.ndim:
            raise ArgumentError(f"Number of dimensions of repeat dims can not be smaller than number of dimensions "
                                f"of tensor: got repeats {reps} for shape {self.shape}")
        base = (1,) * (len(reps) - self.ndim) + self.shape
        if any(r < 0 for r in reps):
            bad = [r * s for r, s in zip(reps, base)]
            raise ArgumentError(f"Trying to create tensor with negative dimension {min(bad)}: {bad}")
        if all(r == 1 for r in reps):
            return self.reshape(base)
        split = tuple(x for s in base for x in (1, s))
        tiled = tuple(x for r, s in zip(reps, base) for x in (r, s))
        return self.reshape(split).expand(tiled).reshape(tuple(r * s for r, s in zip(reps, base)))

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
        """Repeat each element ``repeats`` times along ``dim`` (of the flattened tensor when None)."""
        if not isinstance(repeats, int) or isinstance(repeats, bool):
            raise TypeError(f"repeat_interleave: repeats must be an int, got {type(repeats).__name__}")
        if repeats < 0:
            raise RuntimeError("Repeats must be non-negative")
        x, d = (self.reshape(-1), 0) if dim is None else (self, self._axis(dim))
        if x.ndim == 0:
            x, d = x.reshape(1), 0
        shp = x.shape
        x = x.reshape(shp[:d + 1] + (1,) + shp[d + 1:]).expand(shp[:d + 1] + (repeats,) + shp[d + 1:])
        return x.reshape(shp[:d] + (shp[d] * repeats,) + shp[d + 1:])

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Shift elements circularly by ``shifts`` along ``dims`` (of the flattened tensor when None)."""
        if dims is None:
            shift = shifts if isinstance(shifts, int) else _argfix((shifts,))
            if not isinstance(shift, int):
                if len(shift) != 1:
                    raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shift)}, dims:0")
                shift = shift[0]
            return self.reshape(-1).roll(shift, 0).reshape(self.shape)
        dim_t = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
        shift_t = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
        shift_t = tuple(size_arg(s, "shifts entry") for s in shift_t)
        if len(dim_t) != len(shift_t):
            raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shift_t)}, dims:{len(dim_t)}")
        x = self
        for d, s in zip((self._axis(d) for d in dim_t), shift_t):
            n = x.shape[d]
            if n == 0 or s % n == 0:
                continue
            start = n - s % n
            twice = x.repeat(tuple(2 if i == d else 1 for i in range(x.ndim)))
            x = twice.shrink(tuple((start, start + n) if i == d else None for i in range(x.ndim)))
        return x

    # --- padding -------------------------------------------------------------------------------
    def _pad_pairs(self, padding: Sequence[Any]) -> list[tuple[int, int]]:
        """Per-dim ``(before, after)`` pairs from torch's flat form (last dim first) or a per-dim sequence."""
        if padding and all(isinstance(p, int) for p in padding):
            flat = [int(p) for p in padding]
            if len(flat) % 2 or len(flat) // 2 > self.ndim:
                raise ArgumentError(f"Padding length must be divisible by 2 and at most twice the number of dims; "
                                    f"got {len(flat)} entries for a tensor of {self.ndim} dims")
            tail = [(flat[i], flat[i + 1]) for i in range(len(flat) - 2, -1, -2)]
            return [(0, 0)] * (self.ndim - len(tail)) + tail
        if len(padding) != self.ndim:
            raise ArgumentError(f"padding has {len(padding)} entries for a tensor of {self.ndim} dims")
        return [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]

    def _pad_mode(self, padding: Sequence[Any], mode: str) -> Tensor:
        """Pad in ``mode`` "reflect", "replicate" or "circular" (torch's semantics, any number of dims).

        Negative amounts crop: first for circular (as torch), after padding for reflect and replicate (as
        tinygrad, so a reflection may use what the crop removes). Built from shrink/flip/expand and :meth:`cat`.
        """
        if mode not in PAD_MODES:
            raise NotImplementedError(f"Unrecognised padding mode {mode}")
        pairs = self._pad_pairs(padding)
        if mode == "constant":
            return self.pad(tuple(pairs))
        x, crop = self, pairs
        if any(b < 0 or a < 0 for b, a in pairs):
            # circular crops first; reflect and replicate pad from the whole tensor and crop after, as tinygrad
            # does (torch crops first and refuses a reflection wider than what is left)
            pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
            if mode == "circular":
                x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(crop, x.shape)))
                crop = pairs
        for d, (before, after) in enumerate(pairs):
            if before == 0 and after == 0:
                continue
            n = x.shape[d]
            if mode == "reflect":
                if before >= n or after >= n:
                    raise ArgumentError(f"reflect padding ({before}, {after}) should be less than the input size={n} "
                                        f"for dim={d} of input {list(x.shape)}")
                pieces = [_along(x, d, 1, before + 1).flip(d), x, _along(x, d, n - 1 - after, n - 1).flip(d)]
            elif mode == "replicate":
                if n == 0:
                    raise ArgumentError(f"replicate padding needs a non-empty dimension {d} of input {list(x.shape)}")
                pieces = [_along(x, d, 0, 1).expand(tuple(before if i == d else -1 for i in range(x.ndim))), x,
                          _along(x, d, n - 1, n).expand(tuple(after if i == d else -1 for i in range(x.ndim)))]
            else:
                if before > n or after > n:
                    raise ArgumentError(f"Padding value causes wrapping around more than once: padding ({before}, "
                                        f"{after}) at dimension {d} of input {list(x.shape)}")
                pieces = [_along(x, d, n - before, n), x, _along(x, d, 0, after)]
            x = type(self).cat(*(p for p in pieces if p.shape[d] > 0), dim=d)
        if any(b < 0 or a < 0 for b, a in crop):
            for d, ((b, a), s) in enumerate(zip(crop, x.shape)):
                if s + min(b, 0) + min(a, 0) < 0:
                    raise ArgumentError(f"padding {tuple(crop)} crops more than dimension {d} of size {s} holds")
            x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(crop, x.shape)))
        return x

    def pad_to(self, shape: Sequence[int | None], *args: int | None) -> Tensor:
        """Pad (with zeros, at the end of each dimension) up to ``shape``; None keeps a dimension."""
        new = _argfix((shape, *args))
        if len(new) != self.ndim:
            raise RuntimeError(f"pad_to: {tuple(new)} has {len(new)} dims, the tensor {self.ndim}")
        return self.pad(tuple((0, 0) if n is None else (0, int(n) - s) for s, n in zip(self.shape, new)))

    def shrink_to(self, shape: Sequence[int | None], *args: int | None) -> Tensor:
        """Keep the first ``shape[i]`` elements of each dimension; None keeps a dimension."""
        new = _argfix((shape, *args))
        if len(new) != self.ndim:
            raise RuntimeError(f"shrink_to: {tuple(new)} has {len(new)} dims, the tensor {self.ndim}")
        return self.shrink(tuple(None if n is None else (0, int(n)) for n in new))

    # --- joining and splitting -----------------------------------------------------------------
    def cat(self: Any = _NO_TENSORS, *args: Tensor | Sequence[Tensor], dim: int = 0) -> Tensor:
        """Concatenate self with ``args`` along ``dim`` (dtypes promote like torch).

        Called as ``a.cat(b, c)``, ``Tensor.cat(a, b)`` or with a list, ``Tensor.cat([a, b])``.
        """
        tensors = _tensor_list(self, args)
        if not tensors:
            raise EmptyTensorList("cat(): expected a non-empty list of Tensors")
        for i, t in enumerate(tensors):
            if t.ndim == 0:
                raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
        # like torch, 1-d empty tensors are skipped when the others have more dimensions
        ref = next((t for t in tensors if t.shape != (0,)), tensors[0])
        d = ref._axis(dim)
        keep = [t for t in tensors if not (t.shape == (0,) and ref.ndim != 1)]
        for i, t in enumerate(keep):
            if t.device != ref.device:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found {ref.device} and "
                                   f"{t.device}")
            if t.ndim != ref.ndim:
                raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.ndim} and {t.ndim}")
            for k, (a, b) in enumerate(zip(ref.shape, t.shape)):
                if k != d and a != b:
                    raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size {a} but "
                                       f"got size {b} for tensor number {i} in the list (shapes {ref.shape} and "
                                       f"{t.shape})")
        dt = least_upper_dtype(*(t.dtype for t in keep))
        keep = [t.cast(dt) for t in keep]
        if len(keep) == 1:
            return keep[0]
        total = sum(t.shape[d] for t in keep)
        out: Tensor | None = None
        offset = 0
        for t in keep:
            size = t.shape[d]
            arg = tuple((offset, total - offset - size) if k == d else (0, 0) for k in range(t.ndim))
            offset += size
            placed = t.pad(arg)
            if out is None:
                out = placed
            elif size:
                inside = type(t).ones(*t.shape, dtype=dtypes.bool, device=t.device).pad(arg)
                out = inside.where(placed, out)
        assert out is not None
        return out

    def stack(self: Any = _NO_TENSORS, *args: Tensor | Sequence[Tensor], dim: int = 0) -> Tensor:
        """Join self and ``args`` (all the same shape) along a new dimension ``dim``."""
        tensors = _tensor_list(self, args, "stack")
        if not tensors:
            raise EmptyTensorList("stack expects a non-empty list of Tensors")
        first = tensors[0]
        for i, t in enumerate(tensors[1:], start=1):
            if t.shape != first.shape:
                raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(first.shape)} at entry "
                                   f"0 and {list(t.shape)} at entry {i}")
        d = first._axis(dim, first.ndim + 1)
        return tensors[0].unsqueeze(d).cat(*(t.unsqueeze(d) for t in tensors[1:]), dim=d)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Views of consecutive pieces along ``dim``: of ``sizes`` elements each (the last may be
        shorter), or of the listed sizes, which must add up to the dimension."""
        if self.ndim == 0:
            raise RuntimeError("split expects at least a 1-dimensional tensor")
        d = self._axis(dim)
        n = self.shape[d]
        if not isinstance(sizes, (tuple, list)):
            sizes = size_arg(sizes, "split_size")
            if sizes < 0:
                raise RuntimeError(f"split expects split_size be non-negative, but got split_size={sizes}")
            if sizes == 0:
                if n != 0:
                    raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of "
                                       f"{n}")
                return (self,)
            pieces = [min(sizes, n - i) for i in range(0, max(n, 1), sizes)]
        else:
            pieces = [size_arg(s, "split_sizes entry") for s in sizes]
            if any(s < 0 for s in pieces):
                raise RuntimeError(f"split_with_sizes expects split_sizes have only non-negative entries, but got "
                                   f"split_sizes={pieces}")
            if sum(pieces) != n:
                raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size "
                                   f"at dimension {d}), but got split_sizes={pieces}")
        out = []
        start = 0
        for size in pieces:
            out.append(self.shrink(tuple((start, start + size) if i == d else None for i in range(self.ndim))))
            start += size
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        """At most ``chunks`` views of equal size along ``dim`` (the last may be smaller; fewer may come back)."""
        if size_arg(chunks, "chunks") <= 0:
            raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
        if self.ndim == 0:
            raise RuntimeError("chunk expects at least a 1-dimensional tensor")
        d = self._axis(dim)
        n = self.shape[d]
        if n == 0:
            return list(self.split([0] * chunks, d))
        return list(self.split(-(-n // chunks), d))

    def meshgrid(self, *args: Tensor | Sequence[Tensor], indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids from 0-d or 1-d tensors; ``indexing="xy"`` swaps the first two grid axes."""
        if indexing not in ("ij", "xy"):
            raise RuntimeError(f'meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
        tensors = _tensor_list(self, args, "meshgrid")
        for t in tensors:
            if t.ndim > 1:
                raise RuntimeError(f"meshgrid: Expected 0D or 1D tensor in the tensor list but got a tensor of "
                                   f"shape {t.shape}")
            if t.dtype != tensors[0].dtype:
                raise RuntimeError("meshgrid expects all tensors to have the same dtype")
            if t.device != tensors[0].device:
                raise RuntimeError("meshgrid expects all tensors to have the same device")
        sizes = [t.numel() for t in tensors]
        order = list(range(len(tensors)))
        if indexing == "xy" and len(tensors) >= 2:
            order[0], order[1] = 1, 0
        shape = tuple(sizes[o] for o in order)
        grids = []
        for i, t in enumerate(tensors):
            pos = order.index(i)
            grids.append(t.reshape(tuple(sizes[i] if k == pos else 1 for k in range(len(tensors)))).expand(shape))
        return tuple(grids)

    # --- triangles -----------------------------------------------------------------------------
    @classmethod
    def _tri(cls, rows: int, cols: int, diagonal: int = 0, device: str | None = None) -> Tensor:
        """A bool ``(rows, cols)`` mask, True where ``col - row >= diagonal``, built as a view of a constant.

        A row of zeros then ones, of length ``period = rows + cols``, read back ``period - 1`` wide
        slides one step per row, so entry ``[j, k]`` reads position ``k - j + rows - 1``.
        """
        if rows == 0 or cols == 0:
            return cls.zeros(rows, cols, dtype=dtypes.bool, device=device)
        period = rows + cols
        zeros = min(max(diagonal + rows - 1, 0), period)
        line = cls.ones(period - zeros, dtype=dtypes.bool, device=device).pad(((zeros, 0),))
        slid = line.reshape(1, period).expand(rows, period).reshape(rows * period)
        slid = slid.shrink(((0, rows * (period - 1)),)).reshape(rows, period - 1)
        return slid.shrink(((0, rows), (rows - 1, rows - 1 + cols)))

    def _tri_mask(self, diagonal: Any) -> Tensor:
        """``_tri`` over the last two dims for an int ``diagonal`` or a bound Variable (or an expression of one).

        A symbolic diagonal ``d`` in ``[lo, hi]`` reads a mask built for diagonal ``hi`` over ``hi - lo`` more
        columns through a window starting at column ``hi - d``: entry ``[j, k]`` is that mask's
        ``[j, k + hi - d]``, True where ``k - j >= d``, and the window is in bounds for every ``d``.
        """
        rows, cols = self.shape[-2], self.shape[-1]
        if not isinstance(diagonal, (Variable, UOp)):
            return type(self)._tri(rows, cols, size_arg(diagonal, "diagonal"), device=self.device)
        d = sint_of(diagonal)
        if isinstance(d, int):
            return type(self)._tri(rows, cols, d, device=self.device)
        lo, hi = d.vmin, d.vmax
        wide = type(self)._tri(rows, cols + hi - lo, hi, device=self.device)
        start = ssub(hi, d)
        return wide.shrink(((0, rows), (start, sadd(start, cols))))

    def triu(self, diagonal: int | Any = 0) -> Tensor:
        """Keep the elements on and above the ``diagonal``-th diagonal of the last two dims, zero the rest
        (``diagonal`` may be a bound Variable)."""
        if self.ndim < 2:
            raise RuntimeError("triu: input tensor must have at least 2 dimensions")
        return self._tri_mask(diagonal).where(self, self.zeros_like())

    def tril(self, diagonal: int | Any = 0) -> Tensor:
        """Keep the elements on and below the ``diagonal``-th diagonal of the last two dims, zero the rest
        (``diagonal`` may be a bound Variable)."""
        if self.ndim < 2:
            raise RuntimeError("tril: input tensor must have at least 2 dimensions")
        sym = isinstance(diagonal, (Variable, UOp))
        nxt = sadd(sint_of(diagonal), 1) if sym else size_arg(diagonal, "diagonal") + 1
        return self._tri_mask(nxt).where(self.zeros_like(), self)

    # --- diagonals -------------------------------------------------------------------------------
    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The view of the elements ``[i, i + offset]`` of dims ``dim1`` and ``dim2``, as a new last dim.

        ``offset > 0`` is above the main diagonal, ``< 0`` below; the two dims are removed, as in torch.
        """
        offset = size_arg(offset, "offset")
        a, b = self._axis(dim1), self._axis(dim2)
        if a == b:
            raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
        rest = [i for i in range(self.ndim) if i not in (a, b)]
        x = self.permute(rest + [a, b])
        lead = x.shape[:-2]
        keep = tuple((0, s) for s in lead)
        rows, cols = x.shape[-2:]
        r0, c0 = max(-offset, 0), max(offset, 0)
        n = max(0, min(rows - r0, cols - c0))
        x = x.shrink(keep + ((min(r0, rows), min(r0, rows) + n), (min(c0, cols), min(c0, cols) + n)))
        if n == 0:
            return x.reshape(lead + (0,))
        # row i of an n x (n + 1) reading of the flattened square starts at element i * (n + 1): the diagonal
        x = x.reshape(lead + (n * n,)).pad(tuple((0, 0) for _ in lead) + ((0, n),))
        return x.reshape(lead + (n, n + 1)).shrink(keep + ((0, n), (0, 1))).reshape(lead + (n,))

    def diag(self, diagonal: int = 0) -> Tensor:
        """``torch.diag``: a 1-D tensor becomes the ``diagonal``-th diagonal of a square matrix (zeros
        elsewhere); a 2-D tensor gives its ``diagonal``-th diagonal as a 1-D view."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {self.ndim}D")
        n = self.shape[0]
        # each element followed by n zeros, read back n wide: element i lands at [i, i]
        sq = self.reshape(n, 1).pad(((0, 0), (0, n))).reshape(n * (n + 1))[:n * n].reshape(n, n)
        k = abs(diagonal)
        return sq.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))

    # --- sliding windows -------------------------------------------------------------------------
    def unfold(self, dim: int, size: int, step: int) -> Tensor:
        """Windows of ``size`` elements every ``step`` along ``dim``, like ``torch.Tensor.unfold``.

        Dim ``dim`` becomes the window count ``(n - size) // step + 1`` and a new last dim of ``size``
        holds each window. A view: overlapping windows share their elements (and add their gradients).
        """
        d = self._axis(dim)
        n = self.shape[d] if self.ndim else 1
        if size < 0:
            raise RuntimeError(f"size is {size} but must be >= 0")
        if step <= 0:
            raise RuntimeError(f"step is {step} but must be > 0")
        if size > n:
            raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
        if self.ndim == 0:
            return self.reshape(1).shrink(((0, size),))
        count = (n - size) // step + 1
        if size == 0:  # empty windows: any view with no elements (it keeps the gradient link)
            empty = self.shrink(tuple((0, 0) if i == d else None for i in range(self.ndim)))
            return empty.reshape(self.shape[:d] + (count,) + self.shape[d + 1:] + (0,))
        order = [i for i in range(self.ndim) if i != d] + [d]
        windows = self.permute(order)._pool((size,), step)  # (..., count, size)
        back = [order.index(i) for i in range(self.ndim)] + [self.ndim]
        return windows.permute(back)

    # --- einops-style rearrangement ----------------------------------------------------------------
    def rearrange(self, formula: str, **sizes: int) -> Tensor:
        """Reorder, split and merge dims by an einops pattern, e.g. ``"b c (h w) -> b h w c"``, ``h=4``.

        A name in parentheses is one factor of a merged dim; the sizes of split factors come from
        ``sizes`` (one per group may be inferred). ``...`` stands for any number of dims (once per side,
        not inside parentheses on the left); ``()`` and ``1`` are dims of size 1. Names are identifiers
        without a leading or trailing underscore. Malformed patterns raise RuntimeError, as einops does.
        """
        if formula.count("->") != 1:
            raise RuntimeError(f'rearrange: the pattern needs exactly one "->": {formula!r}')
        left_text, right_text = formula.split("->")
        left, right = _parse_axes(left_text, formula), _parse_axes(right_text, formula)
        names_l, names_r = _axis_names(left), _axis_names(right)
        for names in (names_l, names_r):
            if len(set(names)) != len(names):
                raise RuntimeError(f"rearrange: a name appears twice on one side of {formula!r}")
        if set(names_l) != set(names_r):
            raise RuntimeError(f"rearrange: the two sides of {formula!r} name different axes: "
                               f"{sorted(set(names_l) ^ set(names_r))}")
        if any(isinstance(g, list) and "..." in g for g in left):
            raise RuntimeError(f"rearrange: an ellipsis cannot be inside parentheses on the left of {formula!r}")
        for name in sizes:
            if name not in names_l:
                raise RuntimeError(f"rearrange: axis {name} is not used in {formula!r}")
        n_ell = self.ndim - (len(left) - 1) if "..." in names_l else 0
        if n_ell < 0 or ("..." not in names_l and len(left) != self.ndim):
            raise RuntimeError(f"rearrange: {formula!r} has {len(left)} dims on the left, the tensor {self.ndim}")
        dots = [f"...{i}" for i in range(n_ell)]
        dims_l, dims_r = _expand(left, dots), _expand(right, dots)
        size_of: dict[str, int] = {}
        for group, n in zip(dims_l, self.shape):
            if len(group) == 1:
                name = group[0]
                if name in sizes and sizes[name] != n:
                    raise RuntimeError(f"rearrange: axis {name} has size {n}, not {sizes[name]}")
                size_of[name] = n
                continue
            unknown = [x for x in group if x not in sizes]
            known = prod(sizes[x] for x in group if x in sizes)
            if len(unknown) > 1:
                raise RuntimeError(f"rearrange: cannot infer the sizes of {unknown} in {formula!r}")
            if unknown:
                if known == 0 or n % known:
                    raise RuntimeError(f"rearrange: cannot split a dim of {n} into {group} with sizes {sizes}")
                size_of[unknown[0]] = n // known
            elif known != n:
                raise RuntimeError(f"rearrange: the sizes of {group} multiply to {known}, not to the dim's {n}")
            size_of.update((x, sizes[x]) for x in group if x in sizes)
        flat_l, flat_r = _axis_names(dims_l), _axis_names(dims_r)
        x = self.reshape(tuple(size_of[n] for n in flat_l)).permute([flat_l.index(n) for n in flat_r])
        return x.reshape(tuple(prod(size_of[n] for n in g) for g in dims_r))


_AXIS_TOKEN = re.compile(r"\(|\)|\.\.\.|…|[^\s()]+")


def _parse_axes(side: str, formula: str) -> list[list[str] | str]:
    """One side of an einops pattern as its dims: each a list of axis names (empty: a size-1 dim), or the
    string ``"..."`` for a bare ellipsis (any number of dims)."""
    groups: list[list[str] | str] = []
    group: list[str] | None = None
    for tok in _AXIS_TOKEN.findall(side):
        if tok == "(":
            if group is not None:
                raise RuntimeError(f"rearrange: nested parentheses in {formula!r}")
            group = []
        elif tok == ")":
            if group is None:
                raise RuntimeError(f"rearrange: unbalanced parentheses in {formula!r}")
            groups.append(group)
            group = None
        elif tok == "1":
            if group is None:
                groups.append([])
        else:
            name = "..." if tok in ("...", "…") else tok
            if name != "..." and not (name.isidentifier() and not name.startswith("_") and not name.endswith("_")):
                raise RuntimeError(f"rearrange: invalid axis name {tok!r} in {formula!r}")
            if group is None:
                groups.append(name if name == "..." else [name])
            else:
                group.append(name)
    if group is not None:
        raise RuntimeError(f"rearrange: unbalanced parentheses in {formula!r}")
    if _axis_names(groups).count("...") > 1:
        raise RuntimeError(f"rearrange: more than one ellipsis on one side of {formula!r}")
    return groups


def _axis_names(groups: Sequence[list[str] | str]) -> list[str]:
    """Every axis name of one side of a pattern, ``"..."`` included, in order."""
    return [n for g in groups for n in ([g] if isinstance(g, str) else g)]


def _expand(groups: list[list[str] | str], dots: list[str]) -> list[list[str]]:
    """The dims with ``...`` replaced by ``dots``: its own dims where it stands alone, names inside a group."""
    out: list[list[str]] = []
    for g in groups:
        if isinstance(g, str):
            out.extend([d] for d in dots)
        else:
            out.append([d for x in g for d in (dots if x == "..." else [x])])
    return out
