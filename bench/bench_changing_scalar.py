"""Memory and cache growth of a training loop whose Python float changes every step.

A small MLP trains with a hand-written SGD step whose learning rate decays every step and a loss scale
that changes every step, both plain Python floats. Such floats become kernel inputs after the first
change (:mod:`ember.engine.runtime_consts`), so the loop should compile nothing after warm-up and keep
RSS and the disk cache flat. Prints, at checkpoints: kernels compiled so far, RSS and cache size.

Run: ``python bench/bench_changing_scalar.py [--steps 3000] [--device CPU]`` (``RUNTIME_CONSTS=0`` shows the
growth without the feature).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux /proc; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cache_stats(root: Path) -> tuple[int, float]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files) / 2 ** 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--device", default="CPU")
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="ember-growth-"))
    os.environ["EMBER_CACHE_DIR"] = str(cache)

    import numpy as np

    from ember import GlobalCounters, Tensor, no_grad

    rng = np.random.default_rng(0)
    w1 = Tensor(rng.standard_normal((32, 64)).astype(np.float32) * 0.1, device=args.device, requires_grad=True)
    w2 = Tensor(rng.standard_normal((64, 10)).astype(np.float32) * 0.1, device=args.device, requires_grad=True)
    x = Tensor(rng.standard_normal((16, 32)).astype(np.float32), device=args.device)
    y = Tensor(rng.integers(0, 10, 16), device=args.device)
    checkpoints = {10, 100, 500, 1000, 2000, args.steps}
    print(f"{'step':>6} {'compiled':>9} {'RSS MB':>8} {'cache files':>12} {'cache MB':>9} {'loss':>8}")
    for step in range(1, args.steps + 1):
        lr = 0.05 * 0.999 ** step
        scale = 1.0 + (step % 7) * 0.01
        with Tensor.train():
            loss = (x @ w1).relu().matmul(w2).cross_entropy(y) * scale
            w1.grad = w2.grad = None
            loss.backward()
            with no_grad():
                for w in (w1, w2):
                    w.assign(w.detach() - lr * w.grad)
            Tensor.realize_all(w1, w2)
        value = loss.item()
        if step in checkpoints:
            files, mb = cache_stats(cache)
            print(f"{step:6d} {GlobalCounters.kernels_compiled:9d} {rss_mb():8.1f} {files:12d} {mb:9.2f} {value:8.4f}")


if __name__ == "__main__":
    main()
