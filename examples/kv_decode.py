"""Incremental decoding with a KV cache: a small transformer (random weights) generates tokens one at a time.

    python examples/kv_decode.py                 # 8 prompt tokens, 16 generated, checked three ways
    python examples/kv_decode.py --new 40

Each step feeds one token at position ``pos``: its keys and values are written into the cache at
``pos`` (an in-place assign into a view of the cache), and attention reads ``cache[:, :pos + 1]``,
the positions so far: a length that grows with ``pos``. The step is jitted over a symbolic position
(``Variable("pos", 0, MAX - 1)``): the attention's loops run to ``pos + 1``, read at run time, so the
step is captured once and every later token replays the same kernels with a new ``pos`` value,
compiling nothing.

The jitted run is checked against the same step run eagerly with plain integer positions, and the
last logits against a full forward pass over the whole sequence without a cache.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from ember import GlobalCounters, Tensor, TinyJit, Variable


class TinyTransformer:
    """Token + position embeddings, ``layers`` pre-norm blocks (multi-head attention, GELU MLP), a logit head."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, max_len: int = 64,
                 seed: int = 0):
        rng = np.random.default_rng(seed)

        def w(*shape: int, scale: float = 1.0) -> Tensor:
            return Tensor((rng.standard_normal(shape) * scale / math.sqrt(shape[0])).astype(np.float32)).realize()

        self.dim, self.heads, self.max_len = dim, heads, max_len
        self.head_dim = dim // heads
        self.tok_emb, self.pos_emb = w(vocab, dim, scale=math.sqrt(vocab)), w(max_len, dim, scale=math.sqrt(max_len))
        self.blocks = [{"wq": w(dim, dim), "wk": w(dim, dim), "wv": w(dim, dim), "wo": w(dim, dim),
                        "w1": w(dim, 4 * dim), "w2": w(4 * dim, dim)} for _ in range(layers)]
        self.head = w(dim, vocab)
        # one cache per layer for keys and for values: (heads, max_len, head_dim), filled position by position
        self.cache_k = [Tensor.zeros(heads, max_len, self.head_dim).contiguous().realize() for _ in range(layers)]
        self.cache_v = [Tensor.zeros(heads, max_len, self.head_dim).contiguous().realize() for _ in range(layers)]

    @staticmethod
    def _norm(x: Tensor) -> Tensor:
        return x * (x.square().mean(axis=-1, keepdim=True) + 1e-5).rsqrt()

    def _split(self, x: Tensor) -> Tensor:
        """(n, dim) -> (heads, n, head_dim)."""
        return x.reshape(x.shape[0], self.heads, self.head_dim).permute(1, 0, 2)

    def step(self, token: Tensor, pos: Variable | int) -> Tensor:
        """Logits (vocab,) for ``token`` at position ``pos``, reading and extending the KV cache."""
        x = self.tok_emb[token] + self.pos_emb[pos:pos + 1]  # (1, dim)
        for b, ck, cv in zip(self.blocks, self.cache_k, self.cache_v):
            h = self._norm(x)
            q, k, v = (self._split(h @ b[name]) for name in ("wq", "wk", "wv"))
            # written before attention reads the cache (the cache tensors themselves read the buffer)
            ck[:, pos:pos + 1].assign(k).realize()
            cv[:, pos:pos + 1].assign(v).realize()
            # the positions so far, 0..pos: with a symbolic pos a length the kernels read at run time
            keys, values = ck[:, :pos + 1], cv[:, :pos + 1]  # (heads, pos + 1, head_dim)
            probs = ((q @ keys.transpose(1, 2)) / math.sqrt(self.head_dim)).softmax(axis=-1)  # (heads, 1, pos + 1)
            att = (probs @ values).permute(1, 0, 2).reshape(1, self.dim)
            x = x + att @ b["wo"]
            x = x + (self._norm(x) @ b["w1"]).gelu() @ b["w2"]
        return (self._norm(x) @ self.head).reshape(-1)

    def forward_full(self, tokens: list[int]) -> Tensor:
        """Logits of the last token from a forward pass over the whole sequence (no cache; causal mask)."""
        t = len(tokens)
        x = self.tok_emb[Tensor(np.array(tokens, np.int32))] + self.pos_emb[:t]
        causal = Tensor(np.tril(np.ones((t, t), np.float32))).reshape(1, t, t)
        for b in self.blocks:
            h = self._norm(x)
            q, k, v = (self._split(h @ b[name]) for name in ("wq", "wk", "wv"))
            scores = (q @ k.transpose(1, 2)) / math.sqrt(self.head_dim)
            probs = (causal > 0).where(scores, float("-inf")).softmax(axis=-1)
            x = x + (probs @ v).permute(1, 0, 2).reshape(t, self.dim) @ b["wo"]
            x = x + (self._norm(x) @ b["w1"]).gelu() @ b["w2"]
        return (self._norm(x) @ self.head)[t - 1]


def decode(prompt: list[int], new: int, step: Callable[[Tensor, int], Tensor]) -> tuple[list[int], list[np.ndarray],
                                                                                       list[float]]:
    """Feed ``prompt`` then ``new`` greedy tokens through ``step(token, pos)``; returns the tokens, every step's
    logits and every step's seconds."""
    tokens, all_logits, times = list(prompt), [], []
    for pos in range(len(prompt) + new - 1):
        st = time.perf_counter()
        logits = step(Tensor(np.array([tokens[pos]], np.int32)), pos).numpy()
        times.append(time.perf_counter() - st)
        all_logits.append(logits)
        if pos + 1 >= len(prompt):
            tokens.append(int(logits.argmax()))
    return tokens, all_logits, times


def main(argv: list[str] | None = None) -> None:
    """Decode with the jitted step, then check it against the eager step and a full forward pass."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompt", type=int, default=8, help="prompt length (default 8)")
    p.add_argument("--new", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--max-len", type=int, default=64, help="cache length (default 64)")
    args = p.parse_args(argv)
    if args.prompt < 1 or args.new < 3 or args.prompt + args.new > args.max_len:
        p.error(f"need 1 <= prompt, 3 <= new and prompt + new <= max-len ({args.max_len})")
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, 64, args.prompt)]
    pos_var = Variable("pos", 0, args.max_len - 1)

    jitted_model = TinyTransformer(max_len=args.max_len)
    jit_step = TinyJit(lambda token, pos: jitted_model.step(token, pos).realize())
    tokens, jit_logits, jit_times = decode(prompt, args.new, lambda tok, pos: jit_step(tok, pos_var.bind(pos)))
    GlobalCounters.reset()
    jit_step(Tensor(np.array([tokens[-1]], np.int32)), pos_var.bind(len(tokens) - 1))  # one more, to count
    compiled_in_replay = GlobalCounters.kernels_compiled

    eager_model = TinyTransformer(max_len=args.max_len)
    eager_tokens, eager_logits, eager_times = decode(prompt, args.new, eager_model.step)

    diff = max(float(np.abs(a - b).max()) for a, b in zip(jit_logits, eager_logits))
    full = eager_model.forward_full(tokens[:-1]).numpy()
    full_diff = float(np.abs(full - eager_logits[-1]).max())
    steps = len(jit_logits)
    print(f"prompt {prompt}")
    print(f"generated {tokens[len(prompt):]}")
    print(f"{steps} steps; after the first two: jitted {np.median(jit_times[2:]) * 1e3:.2f} ms/token "
          f"({jit_step.captured.kernel_count} kernels per step, {compiled_in_replay} compiled on replay), eager "
          f"{np.median(eager_times[2:]) * 1e3:.2f} ms/token (median)")
    print(f"max |jitted - eager| logits {diff:.2e}; max |incremental - full forward| last logits {full_diff:.2e}")
    ok = tokens == eager_tokens and diff < 1e-4 and full_diff < 1e-4 and compiled_in_replay == 0
    print("OK: the jitted decode matches" if ok else "MISMATCH")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
