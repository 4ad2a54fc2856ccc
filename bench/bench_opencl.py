"""CL vs CPU vs numpy, same process: a fused 5-op elementwise chain on 16M float32 and a 512^3 matmul.

Each ember program is scheduled once; the timed part is running the schedule
(``run_schedule(sched, wait=True)``), i.e. the kernel launches and their execution.
Prints times and ratios. Run: ``python bench/bench_opencl.py``.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def best_of(fn: Callable[[], object], n: int = 5) -> float:
    """Minimum wall time of ``n`` calls after one warm-up (which also compiles)."""
    fn()
    times = []
    for _ in range(n):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return min(times)


def usable_devices() -> list[str]:
    from ember.device import Device

    devices = []
    for name in ("CL", "CPU"):
        reason = Device.probe(name)
        if reason is None:
            devices.append(name)
        else:
            print(f"{name}: skipped ({reason})")
    return devices


def time_schedule(out: object, expected: np.ndarray, n: int) -> float:
    """Schedule ``out`` once, time running the schedule, and check what the last kernel wrote."""
    from ember.engine.realize import run_schedule

    sched = out.schedule()  # type: ignore[attr-defined]
    assert sched, "nothing to run: the result was already computed"
    seconds = best_of(lambda: run_schedule(sched, wait=True), n)
    got = np.frombuffer(sched[-1].bufs[0].as_bytes(), np.float32).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    return seconds


def bench_chain(devices: list[str], size: int = 16 * 1024 * 1024) -> None:
    from ember import Tensor

    rng = np.random.default_rng(0)
    a_np, b_np = rng.random(size, dtype=np.float32), rng.random(size, dtype=np.float32)
    inputs = {d: (Tensor(a_np, device=d).realize(), Tensor(b_np, device=d).realize()) for d in devices}

    def chain(device: str) -> object:
        a, b = inputs[device]
        return (a * 2 + b).relu().exp() * b - a

    expected = np.exp(np.maximum(a_np * 2 + b_np, 0)) * b_np - a_np
    t_np = best_of(lambda: np.exp(np.maximum(a_np * 2 + b_np, 0)) * b_np - a_np)
    times = {d: time_schedule(chain(d), expected, 5) for d in devices}
    print(f"elementwise chain, 5 ops fused, {size / 2 ** 20:.0f}M float32 (numpy {t_np * 1e3:7.2f} ms):")
    for d, t in times.items():
        gbs = 3 * size * 4 / t / 1e9
        print(f"  {d:4s} {t * 1e3:8.2f} ms  {gbs:6.2f} GB/s  numpy/{d} = {t_np / t:5.2f}x")
    if "CL" in times and "CPU" in times:
        print(f"  CL takes {times['CL'] / times['CPU']:6.2f}x the CPU device's time")


def bench_matmul(devices: list[str], n: int = 512) -> None:
    from ember import Tensor

    rng = np.random.default_rng(0)
    a_np, b_np = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    inputs = {d: (Tensor(a_np, device=d).realize(), Tensor(b_np, device=d).realize()) for d in devices}

    def matmul(device: str) -> object:
        a, b = inputs[device]
        return a @ b

    t_np = best_of(lambda: a_np @ b_np, 3)
    times = {d: time_schedule(matmul(d), a_np @ b_np, 3) for d in devices}
    flops = 2 * n ** 3
    print(f"matmul {n}x{n}x{n} float32 (numpy {t_np * 1e3:7.2f} ms, {flops / t_np / 1e9:6.1f} GFLOPS):")
    for d, t in times.items():
        print(f"  {d:4s} {t * 1e3:8.2f} ms  {flops / t / 1e9:6.2f} GFLOPS  numpy/{d} = {t_np / t:6.3f}x")
    if "CL" in times and "CPU" in times:
        print(f"  CL takes {times['CL'] / times['CPU']:6.2f}x the CPU device's time")


def main() -> None:
    devices = usable_devices()
    if "CL" in devices:
        from ember.device import Device

        print(f"CL is {Device['CL'].info.label}")
    if not devices:
        print("no device to benchmark")
        return
    bench_chain(devices)
    bench_matmul(devices)


if __name__ == "__main__":
    main()
