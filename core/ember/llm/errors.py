"""Errors of ember.llm."""
from __future__ import annotations


class UnsupportedModelError(ValueError):
    """A GGUF file ember.llm cannot run: the message names the architecture, quant type or tokenizer."""
