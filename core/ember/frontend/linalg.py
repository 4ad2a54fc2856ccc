"""Matrix products of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): matmul, linear and einsum,
and ``sequential``, which applies a list of layers (callables) in turn.

A matrix product is a broadcasted multiply followed by a sum, which the scheduler fuses into one
kernel; half-precision products multiply and sum in float32. A large product whose operands are laid out so
that its kernel's register tile would read them badly gets one operand copied first (see :func:`_tile_layout`).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ember.dtype import DType, dtypes, least_upper_dtype, to_dtype
from ember.frontend.base import TensorBase
from ember.frontend.util import broadcast_shape, device_policy
from ember.helpers import prod
from ember.ir.uop import Ops

if TYPE_CHECKING:
    from ember.tensor import Tensor


class LinalgMixin(TensorBase):
    """``@``, dot, matmul, linear, sequential and einsum."""

    __slots__ = ()

    def dot(self, w: Tensor, dtype: DType | str | None = None) -> Tensor:
        """Matrix product (the same as :meth:`matmul`): 1-D, 2-D and batched inputs."""
        return self.matmul(w, dtype=dtype)

    def matmul(self, x: Tensor, reverse: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Matrix product with torch semantics: a 1-D operand is a vector, leading (batch) dims broadcast.

        ``reverse=True`` computes ``x @ self``; ``dtype`` sets the accumulation and output dtype.
        """
        if not isinstance(x, type(self)):
            raise TypeError(f"matmul(): argument 'other' must be Tensor, not {type(x).__name__}")
        a, b = (x, self) if reverse else (self, x)
        if a.ndim == 0 or b.ndim == 0:
            raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {a.ndim}D and {b.ndim}D")
        k_a, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k_a != k_b:
            if a.ndim == 1 and b.ndim == 1:
                raise RuntimeError(f"inconsistent tensor size, expected tensor [{k_a}] and src [{k_b}] to have the "
                                   f"same number of elements, but got {k_a} and {k_b} elements respectively")
            from ember.ir.symbolic import binding_conflict, sint_str

            sa, sb = "x".join(map(sint_str, a.shape)), "x".join(map(sint_str, b.shape))
            if (conflict := binding_conflict(k_a, k_b)) is not None:
                raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({sa} and {sb}): {conflict}")
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({sa} and {sb})")
        try:
            broadcast_shape(a.shape[:-2], b.shape[:-2])
        except RuntimeError as e:
            raise RuntimeError(f"matmul: the batch dims of shapes {a.shape} and {b.shape} do not broadcast") from e
        out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(a.dtype, b.dtype)
        a2 = a.reshape(1, k_a) if a.ndim == 1 else a
        b2 = b.reshape(k_b, 1) if b.ndim == 1 else b
        if a.ndim > 1 and b.ndim > 1:
            a2, b2 = _tile_layout(a2, b2)
        lhs = a2.reshape(*a2.shape[:-1], 1, k_a)                                    # (..., n, 1, k)
        rhs = b2.transpose(-1, -2).reshape(*b2.shape[:-2], 1, b2.shape[-1], k_b)    # (..., 1, m, k)
        if out_dt in (dtypes.float16, dtypes.bfloat16):
            # half-precision products and sums are exact enough only in float32 (as torch's CPU kernels do)
            lhs, rhs = lhs.cast(dtypes.float32), rhs.cast(dtypes.float32)
        out = (lhs * rhs).sum(-1, dtype=out_dt)
        if a.ndim == 1:
            out = out.reshape(out.shape[:-2] + out.shape[-1:])
        if b.ndim == 1:
            out = out.reshape(out.shape[:-1])
        return out

    def __matmul__(self, x: Tensor) -> Tensor:
        """``self @ x``."""
        return self.matmul(x)

    def __rmatmul__(self, x: Tensor) -> Tensor:
        """``x @ self``."""
        return self.matmul(x, reverse=True)

    def __imatmul__(self, x: Tensor) -> Tensor:
        """``self @= x`` (an :meth:`assign` of the product)."""
        return self.assign(self.matmul(x))

    def qr(self) -> tuple[Tensor, Tensor]:
        """QR decomposition of the last two dims: ``(Q, R)``, Q square and orthogonal, R upper triangular
        (Householder reflections; see :mod:`ember.frontend.decompositions`)."""
        from ember.frontend.decompositions import qr

        return qr(self)

    def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """Singular value decomposition of the last two dims: ``(U, S, Vh)``, S descending (one-sided Jacobi on
        QR's R; see :mod:`ember.frontend.decompositions`)."""
        from ember.frontend.decompositions import svd

        return svd(self, full_matrices)

    def linear(self, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
        """``self @ weight + bias`` with ``weight`` of shape (in, out); a 1-D weight scales elementwise."""
        if dtype is not None:
            dt = to_dtype(dtype)
            return self.cast(dt).linear(weight.cast(dt), bias.cast(dt) if bias is not None else None)
        out = self * weight if weight.ndim == 1 else self.dot(weight)
        return out if bias is None else out + bias

    def sequential(self, ll: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        """Apply the callables of ``ll`` in order, each to the previous result: ``ll[-1](...ll[0](self))``."""
        return functools.reduce(lambda x, f: f(x), ll, self)

    @staticmethod
    def einsum(formula: str, *operands: Any, dtype: DType | str | None = None) -> Tensor:
        """Einstein summation like ``torch.einsum``: ``Tensor.einsum("ij,jk->ik", a, b)``.

        Supports an implicit output (letters used once, sorted), ``...`` for broadcast dims and repeated
        letters within one operand (a diagonal).
        """
        ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
        if not ops:
            raise RuntimeError("einsum(): must provide at least one operand")
        eq = formula.replace(" ", "")
        lhs, rhs = eq.split("->", 1) if "->" in eq else (eq, None)
        terms = lhs.split(",")
        if len(terms) != len(ops):
            raise RuntimeError(f"einsum(): {len(terms)} operands were specified in the equation {formula!r} but "
                               f"{len(ops)} were provided")
        # name the dims an ellipsis stands for with characters no subscript can use
        n_ell = 0
        for i, (term, t) in enumerate(zip(terms, ops)):
            if term.count("...") > 1 or (term.count(".") % 3):
                raise RuntimeError(f"einsum(): invalid ellipsis in the subscripts {term!r} of operand {i}")
            n_named = len(term) - (3 if "..." in term else 0)
            if ("..." in term and n_named > t.ndim) or ("..." not in term and n_named != t.ndim):
                raise RuntimeError(f"einsum(): the number of subscripts in the equation ({n_named}) does not match the "
                                   f"number of dimensions ({t.ndim}) for operand {i}"
                                   f"{'' if '...' in term else ' and no ellipsis was given'}")
            if "..." in term:
                n_ell = max(n_ell, t.ndim - n_named)
        ell = [chr(0x100 + j) for j in range(n_ell)]
        letters: list[list[str]] = []
        for term, t in zip(terms, ops):
            for c in term.replace("...", ""):
                if not c.isalpha() or not c.isascii():
                    raise RuntimeError(f"einsum(): invalid subscript {c!r} in the equation {formula!r}; subscripts "
                                       f"must be in [a-zA-Z]")
            if "..." in term:
                pre, post = term.split("...")
                n_here = t.ndim - len(pre) - len(post)
                letters.append(list(pre) + ell[n_ell - n_here:] + list(post))
            else:
                letters.append(list(term))
        counts: dict[str, int] = {}
        for ls in letters:
            for c in ls:
                counts[c] = counts.get(c, 0) + 1
        if rhs is None:
            out = ell + sorted(c for c, n in counts.items() if n == 1 and c not in ell)
        else:
            if rhs.count("...") > 1:
                raise RuntimeError(f"einsum(): more than one ellipsis in the output subscripts {rhs!r}")
            pre, _, post = rhs.partition("...")
            out = list(pre) + (ell if "..." in rhs else []) + list(post)
            for c in out:
                if c not in counts:
                    raise RuntimeError(f"einsum(): output subscript {c!r} does not appear in the equation for any "
                                       f"input operand")
            if len(set(out)) != len(out):
                raise RuntimeError(f"einsum(): output subscripts in {rhs!r} must appear only once")
        # take diagonals for letters repeated within one operand
        tensors: list[Tensor] = []
        for j, t in enumerate(ops):
            ls = letters[j]
            while len(set(ls)) != len(ls):
                c = next(c for c in ls if ls.count(c) > 1)
                p, q = [i for i, x in enumerate(ls) if x == c][:2]
                t = _diagonal(t, p, q)
                ls = [x for i, x in enumerate(ls) if i not in (p, q)] + [c]
            tensors.append(t)
            letters[j] = ls
        sizes: dict[str, int] = {}
        for i, (t, ls) in enumerate(zip(tensors, letters)):
            for c, s in zip(ls, t.shape):
                if c in sizes and sizes[c] != s and 1 not in (sizes[c], s):
                    raise RuntimeError(f"einsum(): subscript {c!r} has size {s} for operand {i} which does not "
                                       f"broadcast with the previously seen size {sizes[c]}")
                sizes[c] = s if c not in sizes or sizes[c] == 1 else sizes[c]
        summed = [c for c in sizes if c not in out]
        order = out + summed
        aligned: list[Tensor] = []
        for t, ls in zip(tensors, letters):
            mine = [c for c in order if c in ls]
            t = t.permute([ls.index(c) for c in mine])
            aligned.append(t.reshape([t.shape[mine.index(c)] if c in ls else 1 for c in order]))
        out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(*(t.dtype for t in aligned))
        result = aligned[0]
        for t in aligned[1:]:
            result = result * t
        result = result._broadcast_to(tuple(sizes[c] for c in order)) if order else result
        if summed:
            return result.sum(tuple(range(len(out), len(order))), dtype=out_dt)
        return result.cast(out_dt)


def _last_strides(t: Tensor) -> tuple[int, int] | None:
    """How far ``t``'s elements lie apart along its last two dims, in its base's contiguous layout (a view of a
    buffer, or of a value computed into one); None when its view cannot say (several views, masks, symbols) or
    broadcasts (a copy would store every repeat)."""
    x = t.lazydata
    if x.op is not Ops.VIEW:
        return (t.shape[-1], 1) if isinstance(t.shape[-1], int) else None
    views = x.arg.views
    if len(views) != 1 or views[0].mask is not None:
        return None
    v = views[0]
    if not all(isinstance(s, int) for s in v.strides) or any(s == 0 and d != 1 for s, d in zip(v.strides, v.shape)):
        return None
    return v.strides[-2], v.strides[-1]


def _regroups(t: Tensor) -> bool:
    """Whether ``t`` is a view through several views (a reshape no single set of strides describes) of concrete
    sizes, with no mask and nothing broadcast: a copy of it stores each element of its base once."""
    x = t.lazydata
    if x.op is not Ops.VIEW or len(x.arg.views) < 2:
        return False
    return all(v.mask is None and all(isinstance(s, int) and isinstance(d, int) and (s != 0 or d == 1)
                                      for s, d in zip(v.strides, v.shape)) for v in x.arg.views)


def _tile_layout(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a`` (..., n, k) and ``b`` (..., k, m), one of them copied into the layout a matmul kernel wants when the
    product is large and neither pairing it tiles well holds. The device's renderer says what "large" is, or that
    no copy pays (``matmul_copy_*`` of :class:`~ember.renderer.Renderer`).

    A register tile of outputs is a row of vector lanes along an output axis times broadcast elements of the
    other operand: it wants one operand contiguous along its output axis (``b`` along m, or ``a`` along n) and
    the other along k. ``a @ b.T`` has both contiguous along k (the tile sums lanes along k and reloads both
    operands for every few outputs: 1.5-2x slower on CPU), ``a.T @ b`` both along their output axes (the
    broadcast operand is read a row apart per step of k: slower only for a long k). The smaller operand is then
    copied, transposed, into the other layout: one pass over it, where the product reads each of its elements m
    (or n) times."""
    n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
    if not all(isinstance(d, int) for d in (*a.shape, *b.shape)):
        return a, b
    policy = device_policy(a.device)
    if policy.matmul_copy_min_macs is None or n * k * m < policy.matmul_copy_min_macs or \
            min(n, m) < policy.matmul_copy_min_dim:
        return a, b
    sa, sb = _last_strides(a), _last_strides(b)
    if sa is None and sb is not None and _regroups(a):
        # a reads its base through a reshape that regroups its axes (heads joined back into features:
        # ``att.transpose(1, 2).reshape(b, t, h * d)``): its index along k is a division and a remainder, which
        # the tile cannot vectorize. It is copied into the layout that pairs with b's
        return (a.transpose(-1, -2).contiguous().transpose(-1, -2) if sb[0] == 1 else a.contiguous()), b
    if sb is None and sa is not None and _regroups(b):
        return a, (b.contiguous() if sa[1] == 1 else b.transpose(-1, -2).contiguous().transpose(-1, -2))
    if sa is None or sb is None:
        return a, b
    a_out, a_k, b_k, b_out = sa[0] == 1, sa[1] == 1, sb[0] == 1, sb[1] == 1
    if (a_out and b_k) or (a_k and b_out):
        return a, b
    size_a, size_b = prod(a.shape), prod(b.shape)
    # the smaller operand is copied; of two the same size, the one whose copy gives ``a @ b``'s layout (b the
    # row of lanes): with the loops over a's rows outside, its tiles reuse the row of b from the cache (1024^2 on
    # two cores: 11.7 ms against 14.4 for the other)
    if a_k and b_k:
        # one operand contiguous along its output axis: a as (..., k, n), or b as (..., k, m)
        return (a.transpose(-1, -2).contiguous().transpose(-1, -2), b) if size_a < size_b else (a, b.contiguous())
    if a_out and b_out and k >= policy.matmul_copy_min_k_across and n * m >= policy.matmul_copy_min_outputs_across:
        # one operand contiguous along k: a as (..., n, k), or b as (..., m, k)
        return (a.contiguous(), b) if size_a <= size_b else (a, b.transpose(-1, -2).contiguous().transpose(-1, -2))
    return a, b


def _diagonal(t: Tensor, p: int, q: int) -> Tensor:
    """Elements with equal indices along dims p and q, as a new last dim (those two dims removed)."""
    n = t.shape[p]
    if t.shape[q] != n:
        raise RuntimeError(f"einsum(): subscript repeated in one operand needs equal sizes, got {t.shape[p]} and "
                           f"{t.shape[q]} in shape {t.shape}")
    rest = [a for a in range(t.ndim) if a not in (p, q)]
    x = t.permute(rest + [p, q])
    lead = x.shape[:-2]
    x = x.reshape(lead + (n * n,)).pad(tuple((0, 0) for _ in lead) + ((0, n),))
    x = x.reshape(lead + (n, n + 1)).shrink(tuple((0, s) for s in lead) + ((0, n), (0, 1)))
    return x.reshape(lead + (n,))
