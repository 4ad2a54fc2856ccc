"""The generation loop over a stand-in model: which steps it runs and what the cache is said to hold."""
from __future__ import annotations

import numpy as np

from ember.llm.generate import LLM


class _Model:
    """Logits that always pick token ``(last + 1) % vocab``; counts the steps it is asked for."""

    def __init__(self, vocab: int = 16, max_context: int = 64):
        self.vocab, self.max_context, self.steps = vocab, max_context, []

    def _logits(self, token: int) -> np.ndarray:
        out = np.zeros(self.vocab, np.float32)
        out[(token + 1) % self.vocab] = 1.0
        return out

    def prefill(self, ids: list[int], pos: int) -> np.ndarray:
        self.steps.append(("prefill", len(ids), pos))
        return self._logits(ids[-1])

    def decode_step(self, token: int, pos: int) -> np.ndarray:
        self.steps.append(("decode", token, pos))
        return self._logits(token)


def _llm(max_context: int = 64) -> LLM:
    llm = LLM.__new__(LLM)  # no file: only the loop's own state
    llm.model, llm.stop_ids, llm.cached = _Model(max_context=max_context), {15}, []
    llm.generated, llm.finish_reason = 0, ""
    return llm


def test_no_step_after_the_last_token() -> None:
    llm = _llm()
    assert list(llm.generate([1, 2, 3], max_tokens=1)) == [4]
    assert llm.model.steps == [("prefill", 3, 0)]  # the logits after token 4 would never be read
    assert llm.cached == [1, 2, 3] and llm.finish_reason == "length"
    assert list(llm.generate([1, 2, 3, 4, 5], max_tokens=3)) == [6, 7, 8]
    # the cache held 1 2 3: only 4 5 are fed, then 6 and 7 are decoded; 8 is the last and is not
    assert llm.model.steps[1:] == [("prefill", 2, 3), ("decode", 6, 5), ("decode", 7, 6)]
    assert llm.cached == [1, 2, 3, 4, 5, 6, 7]


def test_stop_token_and_context_end() -> None:
    llm = _llm()
    assert list(llm.generate([12], max_tokens=10)) == [13, 14]  # 15 is the end-of-text token
    assert llm.finish_reason == "stop" and llm.generated == 2
    small = _llm(max_context=4)
    assert list(small.generate([1, 2], max_tokens=10)) == [3, 4, 5]
    assert small.cached == [1, 2, 3, 4] and small.finish_reason == "length"
