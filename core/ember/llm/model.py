"""A Llama-family transformer built from a GGUF file: llama, SmolLM, Mistral, Qwen2, Qwen3.

Weights stay as the file stores them: every tensor is a zero-copy view of the memory-mapped file, copied to the
device in its stored (quantized) form; a matmul unpacks the blocks inside its own kernel
(:func:`ember.nn.gguf.ggml_dequantize_tensor`). The decode step runs under :class:`ember.TinyJit` over a
symbolic position, so it is captured once; prefill runs in fixed-size chunks, also jitted.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ember import Tensor, TinyJit, Variable
from ember.llm.errors import UnsupportedModelError
from ember.nn.gguf import (
    GGML_TYPES,
    GRAPH_DEQUANT_TYPES,
    GGUFTensor,
    ggml_dequantize,
    ggml_dequantize_tensor,
    ggml_matmul,
    gguf_read,
)

#: architecture -> rope layout: "interleaved" pairs (x0, x1), (x2, x3) ... (llama.cpp permutes Llama's q/k weights
#: for it), or "neox" halves (x_i, x_{i + d/2})
ARCHITECTURES: dict[str, str] = {"llama": "interleaved", "mistral": "interleaved", "qwen2": "neox", "qwen3": "neox"}
_PLAIN_FLOAT = {0, 1, 30}


@dataclass(frozen=True)
class ModelConfig:
    """The hyperparameters a GGUF file's ``{arch}.*`` metadata gives."""
    arch: str
    n_layers: int
    dim: int
    hidden_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    norm_eps: float
    rope_base: float
    rope_scale: float
    rope_style: str

    @staticmethod
    def from_metadata(md: dict[str, Any]) -> ModelConfig:
        """Read the config; an architecture outside the Llama family raises :class:`UnsupportedModelError`."""
        arch = md.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise UnsupportedModelError(f"architecture {arch!r} is not supported by ember.llm (supported: "
                                        f"{', '.join(ARCHITECTURES)})")

        def get(key: str, default: Any = None) -> Any:
            v = md.get(f"{arch}.{key}", default)
            if v is None:
                raise UnsupportedModelError(f"the file lacks metadata {arch}.{key}")
            return v

        dim, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
        head_dim = int(md.get(f"{arch}.attention.key_length", dim // n_heads))
        rope_dim = int(md.get(f"{arch}.rope.dimension_count", head_dim))
        if rope_dim != head_dim:
            raise UnsupportedModelError(f"partial rotary embeddings ({arch}.rope.dimension_count {rope_dim} < head "
                                        f"size {head_dim}) are not supported by ember.llm")
        scaling = md.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise UnsupportedModelError(f"rope scaling {scaling!r} is not supported by ember.llm (supported: none, "
                                        "linear, and llama3's rope_freqs tensor)")
        factor = float(md.get(f"{arch}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        tokens = md.get("tokenizer.ggml.tokens")
        return ModelConfig(arch, int(get("block_count")), dim, int(get("feed_forward_length")), n_heads,
                           int(md.get(f"{arch}.attention.head_count_kv", n_heads)), head_dim,
                           int(md.get(f"{arch}.vocab_size", len(tokens) if tokens else 0)),
                           int(get("context_length")), float(get("attention.layer_norm_rms_epsilon", 1e-5)),
                           float(md.get(f"{arch}.rope.freq_base", 10000.0)), factor, ARCHITECTURES[arch])


class Weight:
    """A weight matrix (out, in) as stored in the file, on the device; ``x @ W.T`` unpacks it in the kernel."""

    def __init__(self, gt: GGUFTensor, name: str, device: str):
        if gt.type_name not in GRAPH_DEQUANT_TYPES:
            raise UnsupportedModelError(f"tensor {name!r} uses quant type {gt.type_name}, which ember.llm cannot "
                                        f"run (supported: {', '.join(GRAPH_DEQUANT_TYPES)})")
        self.shape, self.ggml_type = gt.shape, gt.ggml_type
        self.data = gt.data.to(device).realize()

    def matrix(self) -> Tensor:
        """The float32 (out, in) matrix, as a lazy graph over the stored blocks."""
        w = ggml_dequantize_tensor(self.data, self.ggml_type)
        return w.reshape(self.shape)

    def __call__(self, x: Tensor) -> Tensor:
        return ggml_matmul(x, self.data, self.ggml_type)


def _rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return x * (x.square().mean(axis=-1, keepdim=True) + eps).rsqrt() * w


class Transformer:
    """The network, its KV cache and its jitted steps. ``max_context`` bounds the cache (the file's context
    length by default, capped at 4096 to keep the cache small)."""

    def __init__(self, path: str | os.PathLike[str], device: str | None = None, max_context: int | None = None,
                 chunk: int = 32):
        from ember import Device
        self.path = os.fspath(path)
        self.device = device or Device.DEFAULT
        md, tensors = gguf_read(self.path)
        self.metadata, self.config = md, ModelConfig.from_metadata(md)
        c = self.config
        self.max_context = min(max_context or min(c.context_length, 4096), c.context_length)
        self.chunk = chunk

        def need(name: str) -> GGUFTensor:
            if name not in tensors:
                raise UnsupportedModelError(f"the file lacks tensor {name!r} ({c.arch} model)")
            return tensors[name]

        def vec(name: str) -> Tensor:
            return need(name).data.to(self.device).cast("float32").realize()

        emb = need("token_embd.weight")
        if emb.ggml_type not in _PLAIN_FLOAT and emb.type_name not in GRAPH_DEQUANT_TYPES:
            raise UnsupportedModelError(f"tensor 'token_embd.weight' uses quant type {emb.type_name}, which ember.llm "
                                        f"cannot run (supported: {', '.join(GRAPH_DEQUANT_TYPES)})")
        # the embedding rows are looked up on the host (one row per token), from the file's bytes
        self._emb_type, self._emb_rows = emb.ggml_type, emb.data.numpy()
        self.output = Weight(tensors.get("output.weight", emb), "output.weight", self.device)
        self.output_norm = vec("output_norm.weight")
        self.layers: list[dict[str, Any]] = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            layer: dict[str, Any] = {k: Weight(need(p + k + ".weight"), p + k + ".weight", self.device)
                                     for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                               "ffn_down")}
            layer["attn_norm"], layer["ffn_norm"] = vec(p + "attn_norm.weight"), vec(p + "ffn_norm.weight")
            for k in ("attn_q", "attn_k", "attn_v"):
                if p + k + ".bias" in tensors:
                    layer[k + "_bias"] = vec(p + k + ".bias")
            for k in ("attn_q_norm", "attn_k_norm"):
                if p + k + ".weight" in tensors:
                    layer[k] = vec(p + k + ".weight")
            self.layers.append(layer)
        freq_factors = tensors["rope_freqs.weight"].data.numpy().astype(np.float64) if "rope_freqs.weight" in \
            tensors else None
        cos, sin = _rope_tables(c, self.max_context + chunk, freq_factors)
        self.rope_cos = Tensor(cos, device=self.device).realize()
        self.rope_sin = Tensor(sin, device=self.device).realize()
        cache_len = self.max_context + chunk  # a padded last prefill chunk writes past the prompt
        self.cache_k = [Tensor.zeros(c.n_kv_heads, cache_len, c.head_dim, device=self.device).contiguous().realize()
                        for _ in range(c.n_layers)]
        self.cache_v = [Tensor.zeros(c.n_kv_heads, cache_len, c.head_dim, device=self.device).contiguous().realize()
                        for _ in range(c.n_layers)]
        self.pos_var = Variable("pos", 0, self.max_context)
        # every weight, table and cache buffer is realized above, so there is nothing for a plain first call to
        # initialize: each step is recorded on its first call (one eager pass over the layers instead of two,
        # which is most of the first token's time)
        self._decode = TinyJit(lambda x, pos: self.logits(self.forward(x, pos)).realize(), capture_first=True)
        self._prefill = TinyJit(lambda x, pos: self.forward(x, pos).realize(), capture_first=True)
        self._head = TinyJit(lambda h: self.logits(h).realize(), capture_first=True)

    # --- the network ------------------------------------------------------------------------------

    def embed(self, ids: list[int]) -> np.ndarray:
        """(len(ids), dim) float32 embeddings, dequantized from the file's rows on the host."""
        c = self.config
        for t in ids:
            if not 0 <= t < self._emb_rows.shape[0]:
                raise ValueError(f"token id {t} is outside the vocabulary of {self._emb_rows.shape[0]}")
        rows = self._emb_rows[np.asarray(ids, dtype=np.int64)]
        if self._emb_type in _PLAIN_FLOAT:
            return rows.astype(np.float32).reshape(len(ids), c.dim)
        return ggml_dequantize(rows.tobytes(), self._emb_type, len(ids) * c.dim).reshape(len(ids), c.dim)

    def _rope(self, x: Tensor, pos: Variable | int, t: int) -> Tensor:
        """Rotate (t, heads, head_dim) by the angles of positions pos .. pos + t - 1.

        ``x * cos + swapped(x) * signed sin``, with the pairs (interleaved) or halves (neox) swapped by a flip:
        a view, so the rotation stays two multiply-adds per element in whatever kernel reads it (a stack or
        concatenation of the two halves would be a masked select per element). The same products and sums as
        ``x0 * cos - x1 * sin``, ``x1 * cos + x0 * sin`` (where a compiler fuses one into an fma, the last bit
        may differ)."""
        cos, sin = self.rope_cos[pos:pos + t].reshape(t, 1, -1), self.rope_sin[pos:pos + t].reshape(t, 1, -1)
        h = x.shape[-1] // 2
        pairs = x.reshape(*x.shape[:-1], 2, h) if self.config.rope_style == "neox" else \
            x.reshape(*x.shape[:-1], h, 2)
        swapped = pairs.flip(-2 if self.config.rope_style == "neox" else -1).reshape(x.shape)
        return x * cos + swapped * sin

    def forward(self, x: Tensor, pos: Variable | int) -> Tensor:
        """Hidden states (t, dim) after the final norm for embeddings ``x`` (t, dim) at positions pos .. pos+t-1,
        reading and extending the KV cache."""
        c = self.config
        t = x.shape[0]
        group = c.n_heads // c.n_kv_heads
        mask = None
        if t > 1:  # causal: query i (at pos + i) sees keys 0 .. pos + i
            keys_at = Tensor.arange(self.max_context + self.chunk, device=self.device)[:pos + t].reshape(1, pos + t)
            query_at = cast(Tensor, Tensor.arange(t, device=self.device).reshape(t, 1) + pos)
            mask = keys_at <= query_at
        for layer, ck, cv in zip(self.layers, self.cache_k, self.cache_v):
            h = _rms_norm(x, layer["attn_norm"], c.norm_eps)
            q, k, v = layer["attn_q"](h), layer["attn_k"](h), layer["attn_v"](h)
            if "attn_q_bias" in layer:
                q, k, v = q + layer["attn_q_bias"], k + layer["attn_k_bias"], v + layer["attn_v_bias"]
            q = q.reshape(t, c.n_heads, c.head_dim)
            k = k.reshape(t, c.n_kv_heads, c.head_dim)
            v = v.reshape(t, c.n_kv_heads, c.head_dim)
            if "attn_q_norm" in layer:
                q, k = _rms_norm(q, layer["attn_q_norm"], c.norm_eps), _rms_norm(k, layer["attn_k_norm"], c.norm_eps)
            # q is rotated once into a buffer: fused into the scores it would be rotated again for every key
            q, k = self._rope(q, pos, t).contiguous(), self._rope(k, pos, t)
            # x is realized with the cache writes: else the next layer's writes would recompute every earlier layer
            Tensor.realize_all(ck[:, pos:pos + t].assign(k.permute(1, 0, 2)),
                               cv[:, pos:pos + t].assign(v.permute(1, 0, 2)), x)
            keys, values = ck[:, :pos + t].unsqueeze(1), cv[:, :pos + t].unsqueeze(1)  # (kv, 1, L, hd)
            qg = q.reshape(t, c.n_kv_heads, group, c.head_dim).permute(1, 2, 0, 3)  # (kv, group, t, hd)
            scores = (qg @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))  # (kv, group, t, L)
            if mask is not None:
                scores = mask.where(scores, float("-inf"))
            # the probabilities into a buffer: fused into the product with the values, each exp would be computed
            # once per element of a head
            att = (scores.softmax(-1).contiguous() @ values).permute(2, 0, 1, 3).reshape(t, c.n_heads * c.head_dim)
            x = x + layer["attn_output"](att)
            h = _rms_norm(x, layer["ffn_norm"], c.norm_eps)
            x = x + layer["ffn_down"](layer["ffn_gate"](h).silu() * layer["ffn_up"](h))
        return _rms_norm(x, self.output_norm, c.norm_eps)

    def logits(self, h: Tensor) -> Tensor:
        """(vocab,) logits of the hidden state h (1, dim)."""
        return self.output(h).reshape(-1)

    # --- running it -------------------------------------------------------------------------------

    def decode_step(self, token: int, pos: int) -> np.ndarray:
        """Logits after feeding ``token`` at ``pos`` (the cache holds positions 0 .. pos-1)."""
        self._check_pos(pos, 1)
        x = Tensor(self.embed([token]), device=self.device)
        return self._decode(x, self.pos_var.bind(pos)).numpy()

    def prefill(self, ids: list[int], pos: int) -> np.ndarray:
        """Feed ``ids`` at positions pos .. in chunks; returns the logits of the last one."""
        if not ids:
            raise ValueError("prefill needs at least one token")
        self._check_pos(pos, len(ids))
        if len(ids) == 1:
            return self.decode_step(ids[0], pos)
        last = None
        for at in range(0, len(ids), self.chunk):
            part = ids[at:at + self.chunk]
            emb = np.zeros((self.chunk, self.config.dim), np.float32)
            emb[:len(part)] = self.embed(part)
            hidden = self._prefill(Tensor(emb, device=self.device), self.pos_var.bind(pos + at))
            last = hidden.numpy()[len(part) - 1:len(part)]
        assert last is not None
        return self._head(Tensor(last, device=self.device)).numpy()

    def _check_pos(self, pos: int, n: int) -> None:
        if pos < 0 or pos + n > self.max_context:
            raise ValueError(f"{pos + n} tokens do not fit the context of {self.max_context} tokens")


def _rope_tables(c: ModelConfig, n: int, freq_factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed sin (n, head_dim) of every position's angles, laid out as :meth:`Transformer._rope` reads
    them."""
    inv = 1.0 / (c.rope_base ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
    if freq_factors is not None:
        inv = inv / freq_factors[:inv.shape[0]]
    ang = (np.arange(n, dtype=np.float64) / c.rope_scale)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    # per element of a head: the first of each pair (or half) takes -sin, the second +sin (see Transformer._rope)
    if c.rope_style == "neox":
        return np.concatenate([cos, cos], axis=1), np.concatenate([-sin, sin], axis=1)
    return np.stack([cos, cos], axis=2).reshape(n, -1), np.stack([-sin, sin], axis=2).reshape(n, -1)


__all__ = ["ARCHITECTURES", "GGML_TYPES", "ModelConfig", "Transformer", "Weight"]
