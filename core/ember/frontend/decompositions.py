"""Matrix decompositions built from tensor ops, so they run lazily on any device: QR by Householder reflections
and the SVD by one-sided Jacobi rotations of QR's R (tinygrad's ``Tensor.qr`` and ``Tensor.svd``).

Both work on the last two dims (any leading batch dims) in the tensor's float dtype. Sizes are Python ints: the
loops unroll into graph ops (one reflection per column; a Jacobi round rotates every column pair at once).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ember.tensor import Tensor


def _matrix_dims(t: Tensor, what: str) -> tuple[tuple[int, ...], int, int]:
    if t.ndim < 2:
        raise RuntimeError(f"{what}: expected a tensor with two or more dimensions, got shape {t.shape}")
    if not all(isinstance(d, int) for d in t.shape):
        raise RuntimeError(f"{what}: symbolic shapes are not supported, got shape {t.shape}")
    if t.dtype.kind != "f":
        raise RuntimeError(f"{what}: expected a floating point tensor, got {t.dtype.name}")
    return tuple(t.shape[:-2]), int(t.shape[-2]), int(t.shape[-1])


def _eye(t: Tensor, n: int, batch: tuple[int, ...]) -> Tensor:
    return type(t).eye(n, dtype=t.dtype, device=t.device).expand(batch + (n, n))


def qr(a: Tensor) -> tuple[Tensor, Tensor]:
    """``(Q, R)`` with ``Q @ R == a``: Q (..., m, m) orthogonal, R (..., m, n) upper triangular.

    Column k of R below the diagonal is cleared by the reflection ``I - tau v v^T`` with ``v_k = 1``; the
    reflection maps the column onto ``-sign(x_k) |x|`` (a zero column is left alone), so R's diagonal has the sign
    opposite to the column's head, for every column including the last of a square matrix (tinygrad's signs)."""
    batch, m, n = _matrix_dims(a, "qr")
    cls = type(a)
    rows = cls(np.arange(m, dtype=np.int32), device=a.device)
    r, q = a, _eye(a, m, batch)
    for k in range(min(m, n)):
        x = (rows >= k).where(r[..., :, k], 0)  # the column from the diagonal down, (..., m)
        norm = (x * x).sum(-1, keepdim=True).sqrt()
        head = r[..., k:k + 1, k]  # (..., 1)
        sign = (head != 0).where(head.sign(), 1)
        alpha = head + sign * norm  # v's head before scaling it to 1
        nonzero = norm != 0
        v = ((rows == k).where(alpha, x) / nonzero.where(alpha, 1)).unsqueeze(-1)  # (..., m, 1)
        tau = nonzero.where(sign * alpha / nonzero.where(norm, 1), 0).unsqueeze(-1)  # 2 / (v^T v)
        r = r - (tau * v) @ (v.transpose(-2, -1) @ r)
        q = q - (q @ v) @ (tau * v).transpose(-2, -1)
    return q, r


def _round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint column pairs covering every pair once per sweep (a round-robin tournament; a column
    sits out each round when n is odd)."""
    players = list(range(n)) + ([-1] if n % 2 else [])
    size, rounds = len(players), []
    for _ in range(size - 1):
        pairs = [(players[i], players[size - 1 - i]) for i in range(size // 2)]
        rounds.append([(min(p), max(p)) for p in pairs if -1 not in p])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def svd(a: Tensor, full_matrices: bool = True, sweeps: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """``(U, S, Vh)`` with ``U @ diag(S) @ Vh == a``, S descending. U is (..., m, m) (``full_matrices``) or
    (..., m, k) with k = min(m, n); Vh is (..., k, n) for m >= n, else (..., n, n) mirrored as for the transpose.

    The matrix (or its transpose, when wider than tall) is reduced to QR's square R; Jacobi rotations then make
    R's columns orthogonal (``sweeps`` sweeps of rounds in which every disjoint column pair rotates at once); the
    column norms are the singular values. Column signs of U and V may differ from LAPACK's."""
    batch, m, n = _matrix_dims(a, "svd")
    tall = m >= n
    q, r = qr(a if tall else a.transpose(-2, -1))
    k, big = min(m, n), max(m, n)
    u = r[..., :k, :k].contiguous()
    v = _eye(a, k, batch).contiguous()
    cls = type(a)
    for _ in range(sweeps):
        for pairs in _round_robin(k):
            if not pairs:
                continue
            h = len(pairs)
            pick_i = np.zeros((k, h), np.float32)
            pick_j = np.zeros((k, h), np.float32)
            for p, (i, j) in enumerate(pairs):
                pick_i[i, p], pick_j[j, p] = 1, 1
            si = cls(pick_i, device=a.device).cast(a.dtype)
            sj = cls(pick_j, device=a.device).cast(a.dtype)
            ui, uj = u @ si, u @ sj  # (..., k, h): the pairs' columns
            alpha, beta, gamma = (ui * ui).sum(-2), (uj * uj).sum(-2), (ui * uj).sum(-2)  # (..., h)
            turn = gamma != 0
            zeta = (beta - alpha) / (2 * turn.where(gamma, 1))
            t = (zeta >= 0).where(1, -1) / (zeta.abs() + (1 + zeta * zeta).sqrt())
            t = turn.where(t, 0)
            c = 1 / (1 + t * t).sqrt()
            s = c * t
            # the rotation: columns i, j become c*u_i - s*u_j and s*u_i + c*u_j; the rest stay
            cm1, sn = (c - 1).unsqueeze(-2), s.unsqueeze(-2)  # (..., 1, h)
            rot = (_eye(a, k, batch) + (si * cm1) @ si.transpose(-2, -1) + (sj * cm1) @ sj.transpose(-2, -1)
                   + (si * sn) @ sj.transpose(-2, -1) - (sj * sn) @ si.transpose(-2, -1))
            u, v = u @ rot, v @ rot
        u, v = u.contiguous().realize(), v.contiguous().realize()  # a sweep's graph, not all of them
    norms = (u * u).sum(-2).sqrt()  # (..., k)
    sv, order = norms.sort(-1, descending=True)
    cols = order.unsqueeze(-2).expand(batch + (k, k))
    u = u.gather(-1, cols) / (sv != 0).where(sv, 1).unsqueeze(-2)
    v = v.gather(-1, cols)
    # the k x k left factor inside the big x big identity, then back through Q
    pad = ((0, 0),) * len(batch) + ((0, big - k), (0, big - k))
    block = u.pad(pad) + _eye(a, big, batch) - _eye(a, k, batch).pad(pad)
    u_full = q @ block
    if not full_matrices:
        u_full = u_full[..., :, :k]
    if tall:
        return u_full, sv, v.transpose(-2, -1)
    return v, sv, u_full.transpose(-2, -1)
