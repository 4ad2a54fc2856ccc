"""ember's CUDA device against torch on the same GPU, in one process.

- matmul 4096^3 in float32 and float16 (TFLOPS; torch uses cuBLAS, tensor cores for float16)
- a fused 5-op elementwise chain on 256M float32 (GB/s of the 3 x 4 bytes each element moves)
- a sum of 64M float32 (GB/s)
- one jitted training step of an MLP (784-1024-1024-10, batch 512, SGD) against torch eager

ember's kernels are timed by running a prepared schedule (``run_schedule(sched, wait=True)``, GPU time from
CUDA events); torch's with CUDA events around the call. Each result is checked against torch. Without a GPU
(or without a CUDA build of torch) the script says why and exits 0.

Run: ``python bench/bench_cuda.py`` (``--quick`` for smaller sizes).
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def cuda_reason() -> str | None:
    """Why the CUDA device cannot be benchmarked here, or None."""
    from ember.device import Device

    return Device.probe("CUDA")


def torch_cuda() -> Any | None:
    """torch when it has a usable CUDA build, else None (ember alone is timed)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def best_of(fn: Callable[[], float | None], n: int) -> float:
    """The smallest of ``n`` timed calls after one warm-up; ``fn`` returns seconds (or None: wall time)."""
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        t = fn()
        times.append(t if t is not None else time.perf_counter() - start)
    return min(times)


def torch_seconds(torch: Any, fn: Callable[[], Any]) -> float:
    """GPU seconds of one call of ``fn`` (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def ember_schedule_seconds(out: Any, n: int) -> tuple[float, Any]:
    """Schedule ``out`` once and time running the schedule; returns (seconds, the realized output Tensor)."""
    from ember.engine.realize import run_schedule

    sched = out.schedule()
    seconds = best_of(lambda: _run(run_schedule, sched), n)
    return seconds, out.realize()


def _run(run_schedule: Callable[..., Any], sched: list) -> float:
    from ember.device import Device

    start = time.perf_counter()
    run_schedule(sched, wait=True)
    Device["CUDA"].synchronize()
    return time.perf_counter() - start


def report(name: str, unit: str, work: float, t_ember: float, t_torch: float | None, goal: str) -> None:
    line = f"  {name:34s} ember {t_ember * 1e3:9.3f} ms {work / t_ember:9.1f} {unit}"
    if t_torch is not None:
        line += f" | torch {t_torch * 1e3:9.3f} ms {work / t_torch:9.1f} {unit} | ember/torch {t_torch / t_ember:5.2f}x"
    print(line + f"  (goal {goal})")


def bench_matmul(torch: Any | None, n: int) -> None:
    from ember import Tensor, dtypes

    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    for dt, tname, tol in ((dtypes.float32, "float32", 1e-3), (dtypes.float16, "float16", 2e-2)):
        a = Tensor(a_np, device="CUDA").cast(dt).realize()
        b = Tensor(b_np, device="CUDA").cast(dt).realize()
        t_ember, out = ember_schedule_seconds(a @ b, 3)
        t_torch = None
        if torch is not None:
            ta, tb = (torch.from_numpy(x).cuda().to(getattr(torch, tname)) for x in (a_np, b_np))
            t_torch = best_of(lambda ta=ta, tb=tb: torch_seconds(torch, lambda: ta @ tb), 5)
            ref = (ta @ tb).float().cpu().numpy()
            np.testing.assert_allclose(out.cast(dtypes.float32).numpy(), ref, rtol=tol, atol=tol * n ** 0.5)
        report(f"matmul {n}^3 {tname}", "TFLOPS", 2 * n ** 3 / 1e12, t_ember, t_torch, ">= 0.5x cuBLAS")


def bench_elementwise(torch: Any | None, size: int) -> None:
    from ember import Tensor

    rng = np.random.default_rng(1)
    a_np, b_np = rng.random(size, dtype=np.float32), rng.random(size, dtype=np.float32)
    a, b = Tensor(a_np, device="CUDA").realize(), Tensor(b_np, device="CUDA").realize()
    t_ember, out = ember_schedule_seconds((a * 2 + b).relu().exp() * b - a, 5)
    t_torch = None
    if torch is not None:
        ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
        t_torch = best_of(lambda: torch_seconds(torch, lambda: (ta * 2 + tb).relu().exp() * tb - ta), 5)
        np.testing.assert_allclose(out.numpy(), ((ta * 2 + tb).relu().exp() * tb - ta).cpu().numpy(), rtol=1e-5,
                                   atol=1e-5)
    report(f"elementwise chain {size >> 20}M float32", "GB/s", 3 * 4 * size / 1e9, t_ember, t_torch,
           ">= 80% of torch's bandwidth")


def bench_reduce(torch: Any | None, size: int) -> None:
    from ember import Tensor

    a_np = np.random.default_rng(2).random(size, dtype=np.float32)
    a = Tensor(a_np, device="CUDA").realize()
    t_ember, out = ember_schedule_seconds(a.sum(), 5)
    t_torch = None
    if torch is not None:
        ta = torch.from_numpy(a_np).cuda()
        t_torch = best_of(lambda: torch_seconds(torch, lambda: ta.sum()), 5)
        np.testing.assert_allclose(out.numpy(), ta.sum().cpu().numpy(), rtol=1e-4)
    report(f"sum of {size >> 20}M float32", "GB/s", 4 * size / 1e9, t_ember, t_torch, "report")


def bench_mlp_step(torch: Any | None, batch: int, hidden: int, steps: int = 20) -> None:
    from ember import Tensor, TinyJit
    from ember.device import Device
    from ember.nn import Linear, get_parameters
    from ember.nn.optim import SGD

    rng = np.random.default_rng(3)
    x_np = rng.standard_normal((batch, 784), dtype=np.float32)
    y_np = rng.integers(0, 10, batch).astype(np.int32)
    layers = [Linear(784, hidden), Linear(hidden, hidden), Linear(hidden, 10)]
    params = get_parameters(layers)
    for p in params:
        p.to_("CUDA")
    opt = SGD(params, lr=0.01)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            h = layers[1](layers[0](x).relu()).relu()
            loss = layers[2](h).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            return loss.realize()

    x, y = Tensor(x_np, device="CUDA").realize(), Tensor(y_np, device="CUDA").realize()
    for _ in range(3):  # capture, then replay
        step(x, y)
    Device["CUDA"].synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    Device["CUDA"].synchronize()
    t_ember = (time.perf_counter() - start) / steps
    t_torch = None
    if torch is not None:
        model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                    torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).cuda()
        topt = torch.optim.SGD(model.parameters(), lr=0.01)
        tx, ty = torch.from_numpy(x_np).cuda(), torch.from_numpy(y_np).long().cuda()

        def torch_step() -> None:
            topt.zero_grad()
            torch.nn.functional.cross_entropy(model(tx), ty).backward()
            topt.step()

        for _ in range(3):
            torch_step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            torch_step()
        torch.cuda.synchronize()
        t_torch = (time.perf_counter() - start) / steps
    flops = 6 * batch * (784 * hidden + hidden * hidden + hidden * 10)
    report(f"jitted MLP step (batch {batch}, {hidden} wide)", "TFLOPS", flops / 1e12, t_ember, t_torch, "report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a quick check that everything runs)")
    args = parser.parse_args()
    reason = cuda_reason()
    if reason is not None:
        print(f"CUDA: skipped (no CUDA device: {reason})")
        return
    from ember.device import Device

    info = Device["CUDA"].info
    torch = torch_cuda()
    print(f"CUDA = {info.name} ({info.arch}, {info.total_memory / 2 ** 30:.0f} GiB); torch: "
          f"{torch.__version__ + ' ' + torch.cuda.get_device_name() if torch is not None else 'no CUDA build'}")
    scale = 16 if args.quick else 1
    bench_matmul(torch, 4096 // scale)
    bench_elementwise(torch, (256 << 20) // scale)
    bench_reduce(torch, (64 << 20) // scale)
    bench_mlp_step(torch, 512, 1024 // (4 if args.quick else 1))


if __name__ == "__main__":
    main()
