"""examples/kv_decode.py, small: the jitted decode over a symbolic position (attention over
``cache[:, :pos + 1]``) matches the eager decode and a full forward pass, and its replays compile nothing."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "kv_decode.py"


def test_kv_decode_matches_eager_and_full_forward(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("kv_decode_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--prompt", "2", "--new", "3", "--max-len", "8"])  # SystemExit(1) on a mismatch
    out = capsys.readouterr().out
    assert "OK: the jitted decode matches" in out and "0 compiled on replay" in out
