"""Tokenizers described by a GGUF file's metadata: byte-level BPE (``tokenizer.ggml.model = gpt2``) with the
pre-tokenizer the file names, and SentencePiece-style vocabularies (``llama``: scores, byte fallback).

Control tokens (``token_type`` 3, like ``<|im_start|>``) and user-defined ones (4) written in the text are
matched whole before the text is split, as llama.cpp and transformers do.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import Any

from ember.llm.errors import UnsupportedModelError

_CONTRACTIONS = r"'s|'t|'re|'ve|'m|'ll|'d"
_GPT2 = rf"{_CONTRACTIONS}| ?\p{{L}}+| ?\p{{N}}+| ?[^\s\p{{L}}\p{{N}}]+|\s+(?!\S)|\s+"
_LLAMA3 = (rf"(?i:{_CONTRACTIONS})|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
#: pre-tokenizer name (``tokenizer.ggml.pre``) -> the regular expressions applied one after another (each splits
#: the pieces the previous one left; a match and the text between matches both become pieces)
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "gpt2": (_GPT2,), "default": (_GPT2,),
    # digits one by one first (the vocabulary has no multi-digit tokens), then GPT-2's split
    "smollm": (r"\p{N}", _GPT2), "starcoder": (r"\p{N}", _GPT2), "refact": (r"\p{N}", _GPT2),
    "llama-bpe": (_LLAMA3,), "llama3": (_LLAMA3,), "llama-v3": (_LLAMA3,), "smaug-bpe": (_LLAMA3,),
    "dbrx": (_LLAMA3,), "qwen2": (_QWEN2,), "deepseek-r1-qwen": (_QWEN2,),
}
CONTROL, USER_DEFINED, BYTE = 3, 4, 6


def _regex() -> Any:
    try:
        import regex  # type: ignore[import-untyped]
    except ImportError as e:  # pragma: no cover - the llm extra installs it
        raise ImportError("ember.llm's byte-level tokenizer needs the 'regex' package (Unicode classes such as "
                          r"\p{L}): pip install 'ember[llm]'") from e
    return regex


@functools.lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level vocabularies spell tokens in it)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


class Tokenizer:
    """Text <-> token ids for the vocabulary in a GGUF file's ``tokenizer.ggml.*`` metadata."""

    def __init__(self, metadata: dict[str, Any]):
        model = metadata.get("tokenizer.ggml.model")
        if model not in ("gpt2", "llama"):
            raise UnsupportedModelError(f"tokenizer model {model!r} is not supported by ember.llm (supported: "
                                        "'gpt2' byte-level BPE, 'llama' SentencePiece-style BPE)")
        self.kind = model
        self.tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        n = len(self.tokens)
        self.types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [1] * n)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.bos_id: int | None = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_id: int | None = metadata.get("tokenizer.ggml.eos_token_id")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama"))
        specials = [t for t, ty in zip(self.tokens, self.types) if ty in (CONTROL, USER_DEFINED) and t]
        if model == "gpt2":  # a control token spelled outside the byte alphabet is a mislabel, not text to match
            alphabet = set(_byte_alphabet().values())
            specials = [t for t in specials if set(t) <= alphabet]
        self.specials = set(specials)
        self._special_re = (re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
                            if specials else None)
        if model == "gpt2":
            pre = metadata.get("tokenizer.ggml.pre", "default")
            if pre not in PRE_TOKENIZERS:
                raise UnsupportedModelError(f"byte-level pre-tokenizer {pre!r} is not supported by ember.llm "
                                            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
            rx = _regex()
            self._splits = [rx.compile(p) for p in PRE_TOKENIZERS[pre]]
            merges = metadata.get("tokenizer.ggml.merges")
            if merges is None:
                raise UnsupportedModelError("a byte-level tokenizer without tokenizer.ggml.merges")
            self._ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
            self._to_char = _byte_alphabet()
            self._to_byte = {c: b for b, c in self._to_char.items()}
        else:
            self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
            self.scores: list[float] = list(metadata.get("tokenizer.ggml.scores") or [0.0] * n)
            self._byte_ids = {int(t[3:5], 16): i for i, (t, ty) in enumerate(zip(self.tokens, self.types))
                              if ty == BYTE and len(t) == 6 and t.startswith("<0x")}
        self._bpe_cache: dict[str, list[int]] = {}

    # --- encoding ---------------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; control tokens written in it become their ids (unless ``parse_special`` is
        False). ``add_bos`` defaults to the file's ``tokenizer.ggml.add_bos_token``."""
        ids: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.append(self.bos_id)
        first = True
        for piece, special in self._split_special(text, parse_special):
            if special:
                ids.append(self.vocab[piece])
            elif self.kind == "gpt2":
                ids.extend(self._encode_bytelevel(piece))
            else:
                ids.extend(self._encode_spm(piece, first))
            first = False
        return ids

    def _split_special(self, text: str, parse_special: bool) -> Iterator[tuple[str, bool]]:
        if not parse_special or self._special_re is None:
            if text:
                yield text, False
            return
        at = 0
        for m in self._special_re.finditer(text):
            if m.start() > at:
                yield text[at:m.start()], False
            yield m.group(), True
            at = m.end()
        if at < len(text):
            yield text[at:], False

    def _pretokenize(self, text: str) -> list[str]:
        pieces = [text]
        for rx in self._splits:
            out: list[str] = []
            for p in pieces:
                at = 0
                for m in rx.finditer(p):
                    if m.start() > at:
                        out.append(p[at:m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    at = m.end()
                if at < len(p):
                    out.append(p[at:])
            pieces = out
        return pieces

    def _encode_bytelevel(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in self._pretokenize(text):
            cached = self._bpe_cache.get(word)
            if cached is None:
                cached = self._bpe("".join(self._to_char[b] for b in word.encode("utf-8")))
                if len(self._bpe_cache) < 65536:
                    self._bpe_cache[word] = cached
            ids.extend(cached)
        return ids

    def _bpe(self, word: str) -> list[int]:
        """Merge the lowest-ranked adjacent pair until none is in the merge list."""
        parts = list(word)
        ranks = self._ranks
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            a, b = parts[at], parts[at + 1]
            merged, i = [], 0
            while i < len(parts):  # every occurrence of the pair, left to right
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        out = []
        for p in parts:
            if p not in self.vocab:
                raise ValueError(f"byte-level piece {p!r} is not in the vocabulary (an inconsistent GGUF vocabulary)")
            out.append(self.vocab[p])
        return out

    def _encode_spm(self, text: str, first: bool) -> list[int]:
        if first and self.add_space_prefix and not text.startswith(" "):
            text = " " + text
        text = text.replace(" ", "\u2581")
        parts = list(text)
        while len(parts) > 1:  # merge the adjacent pair whose union scores highest (leftmost on ties)
            best, at = None, -1
            for i in range(len(parts) - 1):
                tid = self.vocab.get(parts[i] + parts[i + 1])
                if tid is not None and (best is None or self.scores[tid] > best):
                    best, at = self.scores[tid], i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        ids: list[int] = []
        for p in parts:
            if p in self.vocab:
                ids.append(self.vocab[p])
            else:
                for b in p.encode("utf-8"):
                    if b not in self._byte_ids:
                        raise ValueError(f"character {p!r} is not in the vocabulary and it has no byte tokens")
                    ids.append(self._byte_ids[b])
        return ids

    # --- decoding ---------------------------------------------------------------------------------

    def token_bytes(self, tid: int) -> bytes:
        """The bytes token ``tid`` stands for (control tokens: their text)."""
        if not 0 <= tid < len(self.tokens):
            raise ValueError(f"token id {tid} is outside the vocabulary of {len(self.tokens)}")
        t = self.tokens[tid]
        if t in self.specials:
            return t.encode("utf-8")
        if self.kind == "gpt2":
            return bytes(self._to_byte[c] for c in t) if all(c in self._to_byte for c in t) else t.encode("utf-8")
        if self.types[tid] == BYTE and len(t) == 6 and t.startswith("<0x"):
            return bytes([int(t[3:5], 16)])
        return t.replace("\u2581", " ").encode("utf-8")

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (invalid UTF-8 shown as U+FFFD)."""
        raw = b"".join(self.token_bytes(i) for i in ids)
        text = raw.decode("utf-8", errors="replace")
        if self.kind == "llama" and self.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def is_special(self, tid: int) -> bool:
        """Whether ``tid`` is a control token (end of turn, role markers ...)."""
        return self.types[tid] == CONTROL if 0 <= tid < len(self.types) else False


class StreamDecoder:
    """Decodes tokens one at a time into text pieces that are always whole UTF-8 characters: the bytes of a
    character split across tokens are held back until it is complete."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok, self.pending, self.started = tokenizer, b"", False

    def feed(self, tid: int) -> str:
        """The new text that token ``tid`` completes (may be empty)."""
        self.pending += self.tok.token_bytes(tid)
        cut = len(self.pending)
        # hold back the tail of an incomplete character (at most 3 bytes of a 4-byte sequence)
        for back in range(1, min(4, len(self.pending)) + 1):
            b = self.pending[-back]
            if b & 0xC0 == 0x80:
                continue
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            if need > back:
                cut = len(self.pending) - back
            break
        out, self.pending = self.pending[:cut], self.pending[cut:]
        text = out.decode("utf-8", errors="replace")
        if not self.started and text:
            self.started = True
            if self.tok.kind == "llama" and self.tok.add_space_prefix and text.startswith(" "):
                text = text[1:]
        return text

    def flush(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD)."""
        out, self.pending = self.pending.decode("utf-8", errors="replace"), b""
        return out
