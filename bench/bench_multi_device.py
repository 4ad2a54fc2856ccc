"""Allreduce over several CPU devices against its lower bound, copying the bytes a ring must move.

A ring allreduce of S bytes over N devices moves 2(N-1)/N * S bytes into each device. The goal: the allreduce
(a sum along the sharded axis of a (N, S/4) float32 tensor sharded on axis 0, whose local sums are the rows)
within 1.5x of copying the same bytes between two devices, timed in the same run. Two ways are timed: the CPU
devices' native collective (one pass over shared host memory, ``ember.device.collective.host_allreduce``, what
ember uses on CPU) and the ring of copies and kernels every device gets (``NATIVE_ALLREDUCE=0``). CPU devices of
one process run the ring's copies and kernels one after another, so the ring's time is also compared with every
device's share copied in turn. Run:
``python bench/bench_multi_device.py`` (``--mib 64 --devices 4``; ``--mib 4`` for a quick run).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ember import Context, Tensor
from ember.engine.realize import run_schedule


def _best(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        st = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - st)
    return min(times)


def main() -> None:
    """Print the allreduce time, the copy time of its lower bound and their ratio."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.devices
    devices = tuple(f"CPU:{i}" for i in range(n))
    elems = args.mib * (1 << 20) // 4
    x = Tensor(np.random.default_rng(0).random((n, elems), dtype=np.float32)).shard(devices, axis=0).realize()
    want = x.numpy().sum(0)

    def allreduce() -> None:
        run_schedule(x.sum(0).schedule())

    # the lower bound: 2(N-1)/N of the bytes, copied from one device to another
    moved = int(elems * 2 * (n - 1) / n)
    src = Tensor(np.ones(moved, dtype=np.float32), device="CPU:0").realize()

    def copy() -> None:
        run_schedule(src.to("CPU:1").schedule())

    copy()
    t_copy = _best(copy, args.repeat)
    print(f"allreduce of {args.mib} MiB float32 over {n} CPU devices; copying 2(N-1)/N of it: {t_copy * 1e3:.2f} ms")
    print(f"  {'way':34s} {'time':>10s} {'/ copy':>7s} {'/ N copies':>10s}")
    for name, native in (("native (one pass over host memory)", 1), ("ring of copies and kernels", 0)):
        with Context(NATIVE_ALLREDUCE=native):
            allreduce()  # compiled once before timing
            np.testing.assert_allclose(x.sum(0).numpy(), want, rtol=1e-5)
            t_all = _best(allreduce, args.repeat)
        print(f"  {name:34s} {t_all * 1e3:8.2f} ms {t_all / t_copy:7.2f} {t_all / (n * t_copy):10.2f}")
    print("  (goal: time / copy <= 1.5; '/ N copies' compares with every device's share copied one after another)")


if __name__ == "__main__":
    main()
