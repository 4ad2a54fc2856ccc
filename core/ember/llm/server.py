"""An OpenAI-compatible HTTP server for one model (Python's standard library only), and a chat page at ``/``.

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (``"stream": true`` answers with
server-sent events), ``GET /v1/models``. Requests are served one after another (the model and its KV cache
are one); errors come in OpenAI's format (``{"error": {"message", "type", "param", "code"}}``).
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from ember.llm.generate import LLM, Sampling


class RequestError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        """The JSON error object."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _number(req: dict[str, Any], key: str, default: Any, kind: type, low: float, high: float) -> Any:
    v = req.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise RequestError(400, f"'{key}' must be a{'n integer' if kind is int else ' number'}, got {v!r}", key)
    if not low <= v <= high:
        raise RequestError(400, f"'{key}' must be between {low} and {high}, got {v!r}", key)
    return kind(v)


class Engine:
    """Turns OpenAI requests into generations on one :class:`LLM`, one at a time."""

    def __init__(self, llm: LLM):
        self.llm, self.lock = llm, threading.Lock()

    def params(self, req: dict[str, Any]) -> tuple[int, Sampling, list[str]]:
        """max tokens, sampling and stop sequences of a request."""
        limit = self.llm.max_context
        max_tokens = _number(req, "max_completion_tokens", None, int, 1, limit)
        if max_tokens is None:
            max_tokens = _number(req, "max_tokens", 256, int, 1, limit)
        sampling = Sampling(_number(req, "temperature", 1.0, float, 0, 2), _number(req, "top_k", 0, int, 0, 1 << 30),
                            _number(req, "top_p", 1.0, float, 1e-9, 1),
                            _number(req, "seed", None, int, -(1 << 63), (1 << 63) - 1))
        stop = req.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
            raise RequestError(400, "'stop' must be a string or a list of at most 4 strings", "stop")
        return max_tokens, sampling, stop

    def prompt_ids(self, req: dict[str, Any], chat: bool) -> list[int]:
        """The prompt tokens; refuses what does not fit the context with a 400."""
        if chat:
            msgs = req.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise RequestError(400, "'messages' must be a non-empty list", "messages")
            clean = []
            for m in msgs:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):  # content parts: the text ones
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
                    raise RequestError(400, f"each message needs a 'role' and a text 'content', got {m!r}", "messages")
                clean.append({"role": m["role"], "content": content})
            ids = self.llm.chat_ids(clean)
        else:
            prompt = req.get("prompt")
            if not isinstance(prompt, str):
                raise RequestError(400, "'prompt' must be a string", "prompt")
            ids = self.llm.tokenizer.encode(prompt)
        if len(ids) >= self.llm.max_context:
            raise RequestError(400, f"This model's maximum context length is {self.llm.max_context} tokens; the "
                               f"prompt has {len(ids)} tokens.", "messages" if chat else "prompt",
                               "context_length_exceeded")
        return ids

    def run(self, req: dict[str, Any], chat: bool) -> tuple[list[int], Iterator[str], dict[str, Any]]:
        """Check the request, then (tokens, text pieces, info) where info gets finish_reason and usage at the end.
        The caller holds :attr:`lock` while it consumes the pieces."""
        max_tokens, sampling, stop = self.params(req)
        ids = self.prompt_ids(req, chat)
        max_tokens = min(max_tokens, self.llm.max_context - len(ids))
        info: dict[str, Any] = {}

        def pieces() -> Iterator[str]:
            yield from self.llm.stream(ids, max_tokens, sampling, stop)
            n = self.llm.generated
            stopped = self.llm.finish_reason == "stop" or n < max_tokens
            info["finish_reason"] = "stop" if stopped else "length"
            info["usage"] = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
        return ids, pieces(), info


_PAGE = "chat.html"


def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to ``engine``."""
    model_name = engine.llm.name

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request on stderr is noise
            pass

        def _json(self, status: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Access-Control-Allow-Origin", "*")
            self.end_headers()
            self.wfile.write(data)

        def do_OPTIONS(self) -> None:  # noqa: N802 - the http.server naming
            self.send_response(204)
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Access-Control-Allow-Headers", "*")
            self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if path in ("/", "/index.html"):
                page = resources.files("ember.llm").joinpath(_PAGE).read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                                             "owned_by": "ember"}]})
            else:
                self._json(404, RequestError(404, f"no route {path}", code="not_found").body())

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            try:
                if path not in ("/v1/chat/completions", "/v1/completions"):
                    raise RequestError(404, f"no route {path}", code="not_found")
                try:
                    n = int(self.headers.get("Content-Length", "0"))
                    req = json.loads(self.rfile.read(n) or b"null")
                except (ValueError, UnicodeDecodeError) as e:
                    raise RequestError(400, f"the body is not valid JSON: {e}") from e
                if not isinstance(req, dict):
                    raise RequestError(400, "the body must be a JSON object")
                self._complete(req, chat=path == "/v1/chat/completions")
            except RequestError as e:
                self._json(e.status, e.body())
            except Exception as e:  # an answer in OpenAI's format rather than a dropped connection
                self._json(500, RequestError(500, f"{type(e).__name__}: {e}", kind="server_error").body())

        def _complete(self, req: dict[str, Any], chat: bool) -> None:
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            created = int(time.time())
            with engine.lock:
                _, pieces, info = engine.run(req, chat)
                base = {"id": rid, "created": created, "model": model_name}
                if not req.get("stream"):
                    text = "".join(pieces)
                    choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                                              else {"index": 0, "text": text, "logprobs": None})
                    choice["finish_reason"] = info["finish_reason"]
                    self._json(200, {**base, "object": "chat.completion" if chat else "text_completion",
                                     "choices": [choice], "usage": info["usage"]})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.send_header("Access-Control-Allow-Origin", "*")
                self.end_headers()
                self.close_connection = True
                obj = "chat.completion.chunk" if chat else "text_completion"

                def event(delta: str | None, finish: str | None, first: bool = False) -> None:
                    if chat:
                        d: dict[str, Any] = {"role": "assistant", "content": ""} if first else (
                            {"content": delta} if delta is not None else {})
                        ch: dict[str, Any] = {"index": 0, "delta": d, "finish_reason": finish}
                    else:
                        ch = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
                    self.wfile.write(f"data: {json.dumps({**base, 'object': obj, 'choices': [ch]})}\n\n".encode())
                    self.wfile.flush()

                if chat:
                    event(None, None, first=True)
                for piece in pieces:
                    event(piece, None)
                event(None, info["finish_reason"])
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

    return Handler


def make_server(llm: LLM, port: int = 8000, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server for ``llm`` on ``host:port`` (port 0: any free port); call ``serve_forever()`` on it."""
    return ThreadingHTTPServer((host, port), make_handler(Engine(llm)))


def serve(llm: LLM, port: int = 8000, host: str = "127.0.0.1") -> None:
    """Serve until interrupted."""
    server = make_server(llm, port, host)
    print(f"ember.llm: {llm.name} on http://{host}:{server.server_address[1]}/ (OpenAI API under /v1)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
