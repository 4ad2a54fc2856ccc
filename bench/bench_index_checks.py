"""What the deferred index checks cost: an embedding + cross-entropy training step with and without them.

Each step looks up token embeddings (``nn.Embedding``), takes a cross-entropy loss against integer
targets, runs backward and an SGD step, and reads the loss (the read is where pending checks run). The
checks add one small reduction per indexed op (here two: the embedding lookup and the targets) to the
schedule of that read. Prints the median step time with ``INDEX_CHECK=1`` (the default) and ``0``.

Run: ``python bench/bench_index_checks.py [--steps 60] [--device CPU]``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ember import Context, Tensor
from ember.nn import Embedding, Linear
from ember.nn.optim import SGD


def step_times(device: str, steps: int, check: int) -> list[float]:
    """Seconds per training step (after two warm-up steps) with ``INDEX_CHECK=check``."""
    Tensor.manual_seed(0)
    rng = np.random.default_rng(0)
    emb, head = Embedding(1000, 64), Linear(64, 1000)
    params = [emb.weight, head.weight, head.bias]
    for p in params:
        p.lazydata = p.to(device).realize().lazydata
    opt = SGD(params, lr=0.01)
    times = []
    with Context(INDEX_CHECK=check):
        for i in range(steps + 2):
            tokens = Tensor(rng.integers(0, 1000, (32,)), device=device)
            targets = Tensor(rng.integers(0, 1000, (32,)), device=device)
            start = time.perf_counter()
            with Tensor.train():
                loss = head(emb(tokens)).cross_entropy(targets)
                opt.zero_grad()
                loss.backward()
                opt.step()
            loss.item()
            if i >= 2:
                times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--device", default="CPU")
    args = ap.parse_args()
    results = {}
    for check in (0, 1, 0, 1):  # interleaved, so warm-up and caches favour neither
        results.setdefault(check, []).extend(step_times(args.device, args.steps, check))
    off, on = statistics.median(results[0]), statistics.median(results[1])
    print(f"{args.device}: median step {off * 1e3:.2f} ms without checks, {on * 1e3:.2f} ms with checks "
          f"({(on / off - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
