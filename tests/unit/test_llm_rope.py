"""Rotary embeddings of ember.llm against the pairwise formula in numpy, for both layouts."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ember import Tensor
from ember.llm.model import ModelConfig, Transformer, _rope_tables

_BASE = ModelConfig("llama", 1, 32, 64, 4, 2, 8, 100, 64, 1e-5, 10000.0, 1.0, "interleaved")


@pytest.mark.parametrize("style", ["interleaved", "neox"])
def test_rope_matches_the_pairwise_formula(style: str) -> None:
    c = dataclasses.replace(_BASE, rope_style=style)
    model = Transformer.__new__(Transformer)  # only what _rope reads: no file
    model.config = c
    cos_t, sin_t = _rope_tables(c, 16, None)
    model.rope_cos, model.rope_sin = Tensor(cos_t), Tensor(sin_t)
    x = np.random.default_rng(0).standard_normal((3, c.n_heads, c.head_dim)).astype(np.float32)
    got = model._rope(Tensor(x), 5, 3).numpy()
    ang = (np.arange(5, 8, dtype=np.float64)[:, None] *
           (1.0 / 10000.0 ** (np.arange(0, c.head_dim, 2) / c.head_dim))[None, :])
    cos, sin = np.cos(ang).astype(np.float32)[:, None], np.sin(ang).astype(np.float32)[:, None]
    h = c.head_dim // 2
    x0, x1 = (x[..., :h], x[..., h:]) if style == "neox" else (x[..., 0::2], x[..., 1::2])
    r0, r1 = x0 * cos - x1 * sin, x1 * cos + x0 * sin
    want = np.concatenate([r0, r1], -1) if style == "neox" else np.stack([r0, r1], -1).reshape(x.shape)
    # within an ulp or two: the C compiler may fuse a product and a sum into one rounding (fma)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
