"""Foundation benchmarks: ember vs numpy and torch (when installed), same process.

Prints times and ratios ``other/ember`` (above 1: ember is faster). On a shared machine absolute
times are noisy: each contender is timed in interleaved rounds and keeps its best round, so a burst
of load elsewhere hits all of them alike. Run: ``python bench/bench_foundation.py``; to compare
single-thread kernels (steadier on a busy machine), set ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1``
(torch follows ``OMP_NUM_THREADS``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Callable

import numpy as np

try:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count() or 1)
except ImportError:
    torch = None


def best_times(fns: dict[str, Callable[[], object]], rounds: int = 7, per_round: int = 1) -> dict[str, float]:
    """The best time of each function over ``rounds`` interleaved rounds (each after one warm-up call)."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            st = time.perf_counter()
            for _ in range(per_round):
                fn()
            best[name] = min(best[name], (time.perf_counter() - st) / per_round)
    return best


def report(title: str, times: dict[str, float], flops: float | None = None) -> None:
    """One line per contender: time, GFLOPS when ``flops`` is given, and its time over ember's."""
    print(title)
    for name, t in times.items():
        rate = f" {flops / t / 1e9:7.1f} GFLOPS" if flops else ""
        ratio = "" if name == "ember" else f"  {name}/ember = {t / times['ember']:5.2f}x"
        print(f"  {name:6s} {t * 1e3:8.2f} ms{rate}{ratio}")


def bench_chain(size: int = 16 * 1024 * 1024) -> None:
    """A fused 5-op elementwise chain with an exp."""
    from ember import Tensor
    from ember.engine.realize import run_schedule

    rng = np.random.default_rng(0)
    a_np, b_np = rng.random(size, dtype=np.float32), rng.random(size, dtype=np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()

    # schedule once, then time running the kernel itself (a re-realize of the same graph would be a cache hit)
    sched = ((a * 2 + b).relu().exp() * b - a).schedule()
    assert len(sched) == 1, f"expected one fused kernel, got {len(sched)}"
    fns: dict[str, Callable[[], object]] = {
        "ember": lambda: run_schedule(sched, wait=True),
        "numpy": lambda: np.exp(np.maximum(a_np * 2 + b_np, 0)) * b_np - a_np,
    }
    if torch is not None:
        ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
        fns["torch"] = lambda: torch.relu(ta * 2 + tb).exp() * tb - ta
    report(f"elementwise chain (x*2+y).relu().exp()*y-x, {size / 1e6:.1f}M float32:", best_times(fns))


def bench_matmul(n: int = 512, transposed: bool = False) -> None:
    """``a @ b`` (or ``x @ w.T``, a linear layer's layout) on n x n float32."""
    from ember import Tensor
    from ember.engine.realize import run_schedule

    rng = np.random.default_rng(0)
    a_np, b_np = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    sched = (a @ (b.T if transposed else b)).schedule()
    rhs_np = b_np.T if transposed else b_np
    fns: dict[str, Callable[[], object]] = {"ember": lambda: run_schedule(sched, wait=True),
                                            "numpy": lambda: a_np @ rhs_np}
    if torch is not None:
        ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
        rhs_t = tb.T if transposed else tb
        fns["torch"] = lambda: ta @ rhs_t
    title = f"matmul {n}x{n}x{n} float32, {'x @ w.T' if transposed else 'a @ b'}:"
    report(title, best_times(fns, rounds=7, per_round=5), flops=2 * n ** 3)


def bench_cold_start() -> None:
    """Time from `import ember` to the first result of a small graph in a fresh process (warm disk cache)."""
    code = ("import time; st=time.perf_counter(); from ember import Tensor; "
            "v=((Tensor([1.,2.,3.])*2+1).relu().sum().item()); print(time.perf_counter()-st)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # warm the compile cache
    times = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
             for _ in range(3)]
    print(f"cold start, import ember -> first result (warm compile cache): {min(times) * 1e3:7.1f} ms "
          "(target < 500 ms)")


if __name__ == "__main__":
    bench_chain()
    bench_matmul()
    bench_matmul(transposed=True)
    bench_cold_start()
