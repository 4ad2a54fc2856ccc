"""``ember.llm``: run Llama-family language models from GGUF files (chat, one-shot prompts, an OpenAI-style server).

    python -m ember.llm --model PATH.gguf                 # chat in the terminal
    python -m ember.llm --model PATH.gguf --prompt "..."  # one answer

See docs/llm.md.
"""
from __future__ import annotations

from ember.llm.errors import UnsupportedModelError
from ember.llm.model import ModelConfig, Transformer
from ember.llm.tokenizer import StreamDecoder, Tokenizer

__all__ = ["ModelConfig", "StreamDecoder", "Tokenizer", "Transformer", "UnsupportedModelError"]
