"""The kernel corpus: records read back, a torn last record is dropped, an unreadable one is an error."""
from __future__ import annotations

import pickle
import sys
import types

import pytest

from ember import Tensor
from ember.engine import corpus


def _record_two(tmp_path, monkeypatch, n: int) -> None:
    """Two new kernels (of a size no other test uses: a kernel the process built already is not lowered again)."""
    monkeypatch.setattr(corpus, "corpus_dir", lambda: tmp_path)
    monkeypatch.setattr(corpus, "_seen", set())
    a = Tensor.arange(n).float()
    (a * 2 + 1).realize()
    (a.sum() * 3).realize()


def test_records_read_back(tmp_path, monkeypatch) -> None:
    _record_two(tmp_path, monkeypatch, 1237)
    assert len(corpus.load_corpus(tmp_path)) >= 2


def test_a_torn_last_record_is_dropped(tmp_path, monkeypatch) -> None:
    _record_two(tmp_path, monkeypatch, 1239)
    n = len(corpus.load_corpus(tmp_path))
    (path,) = tmp_path.glob("*.pkl")
    data = path.read_bytes()
    last = pickle.dumps(corpus.load_corpus(tmp_path)[0])
    path.write_bytes(data + last[: len(last) // 2])  # a writer killed mid-record
    assert len(corpus.load_corpus(tmp_path)) == n


def test_an_unreadable_record_names_the_file(tmp_path, monkeypatch) -> None:
    # a record of a class this ember does not have (as one written by another version would be)
    module = types.ModuleType("ember_corpus_test_gone")

    class Gone:
        pass

    Gone.__module__, Gone.__qualname__ = module.__name__, "Gone"
    module.Gone = Gone
    monkeypatch.setitem(sys.modules, module.__name__, module)
    (tmp_path / "1.pkl").write_bytes(pickle.dumps(Gone()))
    monkeypatch.delitem(sys.modules, module.__name__)
    with pytest.raises(ValueError, match=r"1\.pkl.*incompatible"):
        corpus.load_corpus(tmp_path)
