"""Row scatter-add from ember ops: ``out[v] += src[i]`` for every ``i`` with ``index[i] == v``.

ember graphs have no data-dependent stores, and the direct form, a one-hot match of the ``n`` indices against the
``rows`` destinations summed over ``n``, costs ``rows * n * d`` (an embedding's gradient over a 50k vocabulary
reads every token's gradient once per vocabulary row). Sorting turns the scatter into gathers, which the codegen
lowers to one load each (a one-hot sum against a ramp collapses, see the lowerer):

1. rank the indices (a stable argsort, O(n^2) scalar compares) and gather them and the rows of ``src`` in that
   order; equal indices now form runs;
2. a segmented inclusive scan of the sorted rows in two levels: within blocks of ``b`` rows (each row summed
   with the earlier rows of its block holding the same index, O(n * b * d)), then each row plus the tails of the
   earlier blocks whose last index equals its own (a run crosses a block boundary only as such a tail, so this
   is the sum of the whole run so far, O(n * n/b * d)); with ``b ~ sqrt(n)`` both are O(n^1.5 * d);
3. the end of each destination's run is the count of indices ``<= v`` (O(rows * n) scalar compares), and
   ``out[v]`` is the scan at that position when the index there is ``v`` (a gather: O(rows * d)), else 0.

Every sum adds only rows of the same index, so nothing cancels: results match the one-hot sum to float rounding.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.dtype import dtypes

if TYPE_CHECKING:
    from ember.tensor import Tensor


def _rows_at(x: Tensor, at: Tensor) -> Tensor:
    """``x[at]`` for a 2-D ``x`` and in-range 1-D int ``at``, as a one-hot sum the codegen lowers to loads."""
    m = x.shape[0]
    ramp = x._positions(m).cast(at.dtype).reshape(1, m, 1)
    return (at.reshape(-1, 1, 1) == ramp).where(x.unsqueeze(0), 0).sum(1, dtype=x.dtype)


def scatter_add_rows(index: Tensor, src: Tensor, rows: int) -> Tensor:
    """A ``(rows, d)`` tensor: row ``v`` is the sum of the rows ``src[i]`` with ``index[i] == v`` (0 if none).

    ``index`` is 1-D of integers in ``[0, rows)`` (not checked here: callers check or build it), ``src`` is
    ``(len(index), d)``. Work is O(n^1.5 * d + n^2 + rows * (n + d)) for ``n`` indices, not ``rows * n * d``.
    """
    if index.ndim != 1 or src.ndim != 2 or src.shape[0] != index.shape[0]:
        raise ValueError(f"scatter_add_rows: index of shape {index.shape} and src of shape {src.shape} do not "
                         "match (expected (n,) and (n, d))")
    if index.dtype.kind not in "iu":
        raise TypeError(f"scatter_add_rows: index must be an integer tensor, got {index.dtype}")
    n, d = src.shape
    if n == 0 or rows == 0:
        return type(src).zeros(rows, d, dtype=src.dtype, device=src.device)
    kdt = dtypes.int32 if rows < 2 ** 31 - 1 else dtypes.int64
    index = index.cast(kdt)
    perm = index.argsort()
    keys, vals = _rows_at(index.reshape(n, 1), perm).reshape(n), _rows_at(src, perm)
    b = max(1, min(n, math.isqrt(n - 1) + 1))
    nb = -(-n // b)
    # padded rows hold index ``rows``: after every real index, so runs stay sorted, and matching no destination
    keys = keys.pad(((0, nb * b - n),), value=rows).reshape(nb, b)
    vals = vals.pad(((0, nb * b - n), (0, 0))).reshape(nb, 1, b, d)
    cls = type(src)
    upto = cls._tri(b, b, 1, device=src.device).logical_not()                        # [j, i]: i <= j
    same = (keys.unsqueeze(-1) == keys.unsqueeze(-2)) & upto                         # [blk, j, i]
    inner = same.unsqueeze(-1).where(vals, 0).sum(2)                                 # [blk, j, d]
    if nb > 1:
        last_key, tail = keys[:, b - 1], inner[:, b - 1, :]                          # per block
        earlier = cls._tri(nb, nb, 1, device=src.device).T.reshape(nb, 1, nb)        # [blk, 1, blk']: blk' < blk
        hits = (keys.unsqueeze(-1) == last_key.reshape(1, 1, nb)) & earlier          # [blk, j, blk']
        inner = inner + hits.unsqueeze(-1).where(tail.reshape(1, 1, nb, d), 0).sum(2)
    scan = inner.reshape(nb * b, d)
    # where each destination's run ends: one before the count of indices <= v
    dest = src._positions(rows).cast(kdt)
    end = (index.reshape(1, n) <= dest.reshape(rows, 1)).cast(kdt).sum(1, dtype=kdt) - 1
    at = end.maximum(0)
    hit = (end >= 0) & (_rows_at(keys.reshape(nb * b, 1), at).reshape(rows) == dest)
    return hit.unsqueeze(-1).where(_rows_at(scan, at), 0)


def scatter_add_is_cheaper(n: int, d: int, rows: int) -> bool:
    """Whether :func:`scatter_add_rows` beats the one-hot sum (``rows * n * d`` multiply-adds) for these sizes.

    Its kernels are masked reductions and rankings that run several times slower per operation than the
    one-hot sum (measured ~10x on the CPU device), and it takes ~8 kernels instead of one, so it pays off only
    when the vocabulary is large against the token count: a 50k vocabulary, yes; a 65-character one, no.
    """
    b = math.isqrt(max(n - 1, 0)) + 1
    return rows * n * d > 8 * (2 * n * n + 2 * n * b * d + rows * n)
