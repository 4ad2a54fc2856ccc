"""Row scatter-add through sorting (``ember.frontend.segment``) and the Embedding gradient built on it.

Values against numpy's ``np.add.at`` (runs of equal indices inside one block, across many blocks, rows hit by no
index, one index, int64 indices), the Embedding gradient of a large vocabulary against the one-hot path and
torch, and the work its kernels do (well under the one-hot sum's ``vocab * tokens * dim``).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from ember import Device, Tensor, nn
from ember.codegen import get_program
from ember.frontend.segment import scatter_add_is_cheaper, scatter_add_rows
from ember.helpers import NOOPT
from ember.ir.uop import Ops

RNG = np.random.default_rng(11)


def _want(idx: np.ndarray, src: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, src.shape[1]), np.float32)
    np.add.at(out, idx, src)
    return out


@pytest.mark.parametrize("rows,idx", [
    (5, np.array([3])),                                   # one index
    (6, np.array([1, 4, 1, 1, 0, 4, 1])),                 # n not a multiple of the block
    (4, np.full(50, 2)),                                  # one run across every block
    (40, RNG.integers(0, 40, 37)),                        # mostly singles, rows hit by nothing
    (3, RNG.integers(0, 3, 64)),                          # long runs crossing block boundaries
    (9, np.array([8, 8, 0, 0, 8, 0, 8, 8, 0, 0, 8])),     # first and last rows only
])
def test_matches_add_at(rows, idx):
    src = RNG.standard_normal((len(idx), 3)).astype(np.float32)
    out = scatter_add_rows(Tensor(idx.astype(np.int32)), Tensor(src), rows).numpy()
    np.testing.assert_allclose(out, _want(idx, src, rows), rtol=1e-5, atol=1e-5)


def test_int64_index_and_no_indices():
    idx = np.array([2, 0, 2, 2], np.int64)
    src = RNG.standard_normal((4, 2)).astype(np.float32)
    np.testing.assert_allclose(scatter_add_rows(Tensor(idx), Tensor(src), 3).numpy(), _want(idx, src, 3), rtol=1e-5)
    empty = scatter_add_rows(Tensor(np.zeros(0, np.int32)), Tensor(np.zeros((0, 2), np.float32)), 3)
    np.testing.assert_array_equal(empty.numpy(), np.zeros((3, 2), np.float32))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"index of shape \(3,\) and src of shape \(4, 2\)"):
        scatter_add_rows(Tensor(np.zeros(3, np.int32)), Tensor(np.zeros((4, 2), np.float32)), 5)
    with pytest.raises(TypeError, match="integer"):
        scatter_add_rows(Tensor(np.zeros(4, np.float32)), Tensor(np.zeros((4, 2), np.float32)), 5)


def test_cost_rule_picks_large_vocabularies():
    assert not scatter_add_is_cheaper(1024, 64, 65)        # a character vocabulary: the one-hot sum
    assert scatter_add_is_cheaper(1024, 768, 50257)        # GPT-2's: the scatter-add


def _embedding_grad(vocab: int, dim: int, ids: np.ndarray, upstream: np.ndarray, weight: np.ndarray) -> np.ndarray:
    emb = nn.Embedding(vocab, dim)
    emb.weight.assign(Tensor(weight)).realize()
    (emb(Tensor(ids)) * Tensor(upstream)).sum().backward()
    return emb.weight.grad.numpy()


def test_embedding_large_vocab_gradient_matches_one_hot_and_torch(monkeypatch):
    vocab, dim, ids = 3000, 16, RNG.integers(0, 50, (4, 30)).astype(np.int32)  # repeats: runs to sum
    assert scatter_add_is_cheaper(ids.size, dim, vocab)
    weight = RNG.standard_normal((vocab, dim)).astype(np.float32)
    upstream = RNG.standard_normal(ids.shape + (dim,)).astype(np.float32)
    got = _embedding_grad(vocab, dim, ids, upstream, weight)
    monkeypatch.setattr(nn, "scatter_add_is_cheaper", lambda *a: False)
    one_hot = _embedding_grad(vocab, dim, ids, upstream, weight)
    np.testing.assert_allclose(got, one_hot, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, _want(ids.reshape(-1), upstream.reshape(-1, dim), vocab), rtol=1e-5, atol=1e-5)
    torch = pytest.importorskip("torch")
    w = torch.tensor(weight, requires_grad=True)
    (torch.nn.functional.embedding(torch.tensor(ids).long(), w) * torch.tensor(upstream)).sum().backward()
    np.testing.assert_allclose(got, w.grad.numpy(), rtol=1e-5, atol=1e-5)


def _iterations(spec) -> int:
    """The innermost-body executions of an unoptimized kernel: its grid times its reduce loops' lengths."""
    loops = math.prod(u.src[1].arg for u in spec.uops if u.op is Ops.RANGE and u.arg[1] == "reduce")
    return math.prod(spec.global_size) * loops


def _gradient_work(vocab: int, dim: int, ids: np.ndarray) -> int:
    emb = nn.Embedding(vocab, dim)
    emb(Tensor(ids)).sum().backward()
    renderer = Device[Device.DEFAULT].renderer
    return sum(_iterations(get_program(si.ast, renderer)) for si in emb.weight.grad.schedule()
               if si.ast.op is Ops.SINK)


def test_embedding_gradient_work_is_not_vocab_times_tokens_times_dim(monkeypatch):
    monkeypatch.setattr(NOOPT, "value", 1)  # no upcasts or unrolls: the loops are the plain iteration space
    vocab, dim, ids = 20000, 32, RNG.integers(0, 20000, 64).astype(np.int32)
    scattered = _gradient_work(vocab, dim, ids)
    monkeypatch.setattr(nn, "scatter_add_is_cheaper", lambda *a: False)
    one_hot = _gradient_work(vocab, dim, ids)
    assert one_hot >= vocab * ids.size * dim
    assert scattered * 8 < one_hot, (scattered, one_hot)
