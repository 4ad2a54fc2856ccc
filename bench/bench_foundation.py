"""Foundation benchmarks: ember vs numpy (and torch/tinygrad when installed), same process.

Prints ratios; absolute times on shared machines are noisy. Run: ``python bench/bench_foundation.py``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np


def best_of(fn, n: int = 7) -> float:
    """Minimum wall time of ``n`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(n):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return min(times)


def bench_chain(size: int = 16 * 1024 * 1024) -> None:
    from ember import Tensor
    from ember.engine.realize import run_schedule

    rng = np.random.default_rng(0)
    a_np, b_np = rng.random(size, dtype=np.float32), rng.random(size, dtype=np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()

    # schedule once, then time running the kernel itself (a re-realize of the same graph would be a cache hit)
    sched = ((a * 2 + b).relu().exp() * b - a).schedule()
    assert len(sched) == 1, f"expected one fused kernel, got {len(sched)}"

    def ember_chain() -> None:
        run_schedule(sched, wait=True)

    def numpy_chain() -> None:
        np.exp(np.maximum(a_np * 2 + b_np, 0)) * b_np - a_np

    t_e, t_n = best_of(ember_chain), best_of(numpy_chain)
    print(f"elementwise chain, 5 ops, {size / 1e6:.1f}M float32: ember {t_e * 1e3:7.2f} ms  numpy {t_n * 1e3:7.2f} ms  "
          f"numpy/ember = {t_n / t_e:5.2f}x")
    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
        t_t = best_of(lambda: (torch.relu(ta * 2 + tb).exp() * tb - ta))
        print(f"  torch eager {t_t * 1e3:7.2f} ms  torch/ember = {t_t / t_e:5.2f}x")
    except ImportError:
        print("  torch not installed: skipped")


def bench_matmul(n: int = 512) -> None:
    from ember import Tensor
    from ember.engine.realize import run_schedule

    rng = np.random.default_rng(0)
    a_np, b_np = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    sched = (a @ b).schedule()
    t_e = best_of(lambda: run_schedule(sched, wait=True), 3)
    t_n = best_of(lambda: a_np @ b_np, 3)
    print(f"matmul {n}x{n}x{n} float32: ember {t_e * 1e3:7.2f} ms ({2 * n ** 3 / t_e / 1e9:6.2f} GFLOPS)  "
          f"numpy {t_n * 1e3:7.2f} ms  numpy/ember = {t_n / t_e:5.3f}x")


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
    bench_cold_start()
