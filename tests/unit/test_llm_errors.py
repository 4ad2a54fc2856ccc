"""ember.llm names what it cannot run: the architecture, the quant type, the tokenizer, a file that is not GGUF."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember import Tensor
from ember.llm import ModelConfig, UnsupportedModelError
from ember.llm.__main__ import main
from ember.llm.model import Weight
from ember.nn.gguf import GGUFTensor

_LLAMA = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
          "llama.feed_forward_length": 128, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
          "llama.context_length": 256, "llama.attention.layer_norm_rms_epsilon": 1e-5}


def test_config_from_metadata() -> None:
    c = ModelConfig.from_metadata(_LLAMA)
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.rope_style) == (2, 64, 4, 2, 16, "interleaved")
    q = ModelConfig.from_metadata({k.replace("llama", "qwen2"): v for k, v in _LLAMA.items()} |
                                  {"general.architecture": "qwen2"})
    assert q.rope_style == "neox"


def test_unknown_architecture_and_rope_scaling_are_named() -> None:
    with pytest.raises(UnsupportedModelError, match="architecture 'gptneox'"):
        ModelConfig.from_metadata({"general.architecture": "gptneox"})
    with pytest.raises(UnsupportedModelError, match="rope scaling 'yarn'"):
        ModelConfig.from_metadata(_LLAMA | {"llama.rope.scaling.type": "yarn"})
    with pytest.raises(UnsupportedModelError, match="llama.block_count"):
        ModelConfig.from_metadata({k: v for k, v in _LLAMA.items() if k != "llama.block_count"})


def test_unsupported_quant_type_is_named() -> None:
    gt = GGUFTensor((4, 256), 10, Tensor(np.zeros((4, 84), np.uint8)))
    with pytest.raises(UnsupportedModelError, match="'blk.0.attn_q.weight' uses quant type Q2_K"):
        Weight(gt, "blk.0.attn_q.weight", "CPU")


def test_cli_refuses_a_file_that_is_not_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a model at all")
    assert main(["--model", str(bad), "--prompt", "hi"]) == 2
    assert "not a GGUF file" in capsys.readouterr().err
