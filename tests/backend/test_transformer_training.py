"""Pieces of transformer training: the cross-entropy's fused gradient, and a small GPT trained 50 steps.

- ``sparse_categorical_crossentropy``'s logits gradient is one elementwise kernel over (rows x classes) and no
  (rows x classes) integer tensor is materialized; values and gradients against torch at a ragged size.
- A one-block GPT (embeddings over a vocabulary large enough for the scatter-add gradient, causal attention,
  GELU MLP, AdamW) gives the same losses over 50 jitted steps with the kernels optimized as with ``NOOPT``.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor, TinyJit, dtypes, nn
from ember.helpers import NOOPT, Context
from ember.ir.uop import Ops
from ember.nn.state import get_parameters

RNG = np.random.default_rng(5)


def test_cross_entropy_gradient_is_one_pass_over_the_logits():
    rows, classes = 96, 37
    x = Tensor(RNG.standard_normal((rows, classes)).astype(np.float32), requires_grad=True)
    y = Tensor(RNG.integers(0, classes, rows).astype(np.int32))
    loss = x.sparse_categorical_crossentropy(y)
    loss.backward()
    loss.realize()
    kernels = [si for si in x.grad.schedule() if si.ast.op is Ops.SINK]
    # the gradient itself and the count of labels (the mean's denominator); log_softmax's backward would add a
    # reduction over the classes
    assert len(kernels) == 2, [si.ast for si in kernels]
    assert sum(si.bufs[0].size == rows * classes for si in kernels) == 1
    assert all(b.dtype != dtypes.int32 or b.size < rows * classes for si in kernels for b in si.bufs)


@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.2, "ignore_index": 3}, {"reduction": "none"}], ids=str)
def test_cross_entropy_matches_torch_at_a_ragged_size(kw):
    torch = pytest.importorskip("torch")
    xs = (RNG.standard_normal((3, 11, 29)) * 4).astype(np.float32)
    ys = RNG.integers(0, 29, (3, 11)).astype(np.int64)
    g = RNG.standard_normal((3, 11) if kw.get("reduction") == "none" else ()).astype(np.float32)
    x = Tensor(xs, requires_grad=True)
    out = x.sparse_categorical_crossentropy(Tensor(ys), **kw)
    (out * Tensor(g)).sum().backward()
    tx = torch.tensor(xs, requires_grad=True)
    tout = torch.nn.functional.cross_entropy(tx.permute(0, 2, 1), torch.tensor(ys), **{"ignore_index": -1, **kw})
    (tout * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)


VOCAB, DIM, HEADS, SEQ, BATCH = 600, 32, 2, 8, 2


class _TinyGPT:
    def __init__(self) -> None:
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(DIM), nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2, self.head = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM), nn.Linear(DIM, VOCAB)

    def __call__(self, idx: Tensor) -> Tensor:
        b, t = idx.shape
        x = self.tok(idx) + self.pos(Tensor.arange(t).reshape(1, t))
        qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = qkv[0].scaled_dot_product_attention(qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, DIM))
        x = x + self.fc2(self.fc1(self.ln2(x)).gelu())
        return self.head(self.ln_f(x))


def _losses(steps: int) -> list[float]:
    Tensor.manual_seed(7)
    model = _TinyGPT()
    rng = np.random.default_rng(9)
    toks = rng.integers(0, 40, (BATCH, SEQ + 1)).astype(np.int32)  # few distinct tokens: repeats to scatter-add
    x, y = Tensor(toks[:, :-1]), Tensor(toks[:, 1:])
    opt = nn.optim.AdamW(get_parameters(model), lr=3e-3)

    @TinyJit
    @Context(TRAINING=1)
    def step() -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    return [float(step().numpy()) for _ in range(steps)]


def test_tiny_gpt_50_steps_match_noopt(monkeypatch):
    # (the scatter-add gradient against the one-hot one is checked in test_scatter_add_rows)
    assert nn.scatter_add_is_cheaper(BATCH * SEQ, DIM, VOCAB)  # the scatter-add path is the one trained
    got = _losses(50)
    assert got[-1] < got[0] - 1.0  # it learns
    monkeypatch.setattr(NOOPT, "value", 1)
    plain = _losses(50)
    np.testing.assert_allclose(got, plain, rtol=2e-4, atol=2e-4)


def _attention_case(tq: int, tk: int, mask: str, causal: bool, gqa: bool):
    torch = pytest.importorskip("torch")
    heads, kv_heads, d = 4, (2 if gqa else 4), 8
    qs = RNG.standard_normal((2, heads, tq, d)).astype(np.float32)
    ks = RNG.standard_normal((2, kv_heads, tk, d)).astype(np.float32)
    vs = RNG.standard_normal((2, kv_heads, tk, d)).astype(np.float32)
    gs = RNG.standard_normal((2, heads, tq, d)).astype(np.float32)
    ms = None
    if mask == "bool":
        ms = RNG.random((tq, tk)) < 0.7
        ms[:, 0] = True  # every query keeps a key (a row with none is nan in both)
    elif mask == "float":
        ms = (RNG.standard_normal((2, 1, tq, tk)) * 2).astype(np.float32)
    kw = {"is_causal": causal, "enable_gqa": gqa}
    ts = [Tensor(a, requires_grad=True) for a in (qs, ks, vs)]
    out = ts[0].scaled_dot_product_attention(ts[1], ts[2], attn_mask=None if ms is None else Tensor(ms), **kw)
    (out * Tensor(gs)).sum().backward()
    rs = [torch.tensor(a, requires_grad=True) for a in (qs, ks, vs)]
    want = torch.nn.functional.scaled_dot_product_attention(
        *rs, attn_mask=None if ms is None else torch.tensor(ms), **kw)
    (want * torch.tensor(gs)).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for t, r in zip(ts, rs):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tq,tk,mask,causal,gqa", [
    (7, 7, "none", True, False), (5, 9, "bool", False, False), (9, 4, "float", False, False),
    (6, 6, "none", True, True), (3, 11, "bool", False, True), (1, 13, "none", False, False)])
def test_attention_matches_torch_with_masks_and_lengths(tq, tk, mask, causal, gqa):
    _attention_case(tq, tk, mask, causal, gqa)


def test_attention_gradient_takes_fewer_kernels():
    q, k, v = (Tensor(RNG.standard_normal((2, 2, 16, 8)).astype(np.float32), requires_grad=True) for _ in range(3))
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    out.sum().backward()
    out.realize()
    kernels = [si for si in q.grad.schedule(k.grad, v.grad) if si.ast.op is Ops.SINK]
    # rowsum(g * out), dS (g v^T with the softmax's gradient as its epilogue), dQ, dK, dV; through the softmax's
    # own gradient dS alone took three kernels over (queries x keys)
    assert len(kernels) <= 5, len(kernels)
