"""What the jit buys: a training step jitted vs eager vs torch, replay overhead per kernel, first-step latency.

1. The 784-512-512-10 MLP SGD step (batch 256): ember eager, ember jitted and torch eager on
   ``--threads`` threads (default 2), timed interleaved in one process (median of ``--steps``).
2. Replay host overhead: a jitted function of 100 tiny kernels (target: <= 10 us per kernel on CPU).
3. The first training step of the MLP in a fresh process with an empty kernel cache
   (``EMBER_CACHE_DIR`` pointed at an empty folder), then again with the cache that run filled;
   by default and with tiered compilation (``TIERED=1``). Each row gives the wall time (import to
   loss) and the CPU time of the process and its compiler children (what the machine's load does
   not change). The children run with Python's bytecode cache on, as an installed ember does
   (``PYTHONDONTWRITEBYTECODE`` is dropped from their environment; a first import writes it).
   ``--first-runs N`` (default 5) repeats each pair with a new cache and gives medians (and the
   range): on a busy machine one run says little (runs of the same checkout spread over 0.48-0.57 s).

Run: ``python bench/bench_jit.py [--device CPU] [--steps 20] [--first-runs 5]``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

FIRST_STEP = r"""
import sys, time
start = time.perf_counter()
from ember import Tensor, nn
from ember.nn.optim import SGD
device = sys.argv[1]
Tensor.manual_seed(0)
layers = [nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)]
params = [t for lin in layers for t in (lin.weight, lin.bias)]
for p in params:
    p.to_(device)
opt = SGD(params, lr=0.01)
x, y = Tensor.randn(256, 784, device=device), Tensor.randint(256, high=10, device=device)
with Tensor.train():
    opt.zero_grad()
    loss = layers[2](layers[1](layers[0](x).relu()).relu()).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize_all(loss, *opt.schedule_step())  # loss and update in one schedule (a loss read after the
    value = loss.item()                              # in-place update would be recomputed from the new weights)
print(time.perf_counter() - start, value)
"""


def _mlp_step_ember(device: str, jitted: bool):  # noqa: ANN202 - returns (step callable, inputs)
    from ember import Tensor, TinyJit, nn
    from ember.nn.optim import SGD

    Tensor.manual_seed(0)
    layers = [nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)]
    params = [t for lin in layers for t in (lin.weight, lin.bias)]
    for p in params:
        p.to_(device)
    opt = SGD(params, lr=0.01)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = layers[2](layers[1](layers[0](x).relu()).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            Tensor.realize_all(loss, *opt.schedule_step())
            return loss

    rng = np.random.default_rng(0)
    x_np, y_np = rng.standard_normal((256, 784)).astype(np.float32), rng.integers(0, 10, 256).astype(np.int32)
    fn = TinyJit(step) if jitted else step
    return lambda: float(fn(Tensor(x_np, device=device), Tensor(y_np, device=device)).item())


def _mlp_step_torch(threads: int):  # noqa: ANN202
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    x, y = torch.from_numpy(rng.standard_normal((256, 784)).astype(np.float32)), torch.from_numpy(
        rng.integers(0, 10, 256))

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


def bench_mlp(device: str, steps: int, threads: int) -> None:
    """Median step time of each contender, timed round-robin so load changes hit all alike."""
    contenders = {"ember eager": _mlp_step_ember(device, False), "ember jitted": _mlp_step_ember(device, True)}
    try:
        contenders[f"torch eager ({threads} threads)"] = _mlp_step_torch(threads)
    except ImportError:
        print("torch is not installed: no torch row")
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():  # warm up: compile, capture
        for _ in range(3):
            fn()
    for _ in range(steps):
        for name, fn in contenders.items():
            st = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - st)
    print(f"MLP 784-512-512-10 SGD step, batch 256, {device} (median of {steps}):")
    med = {k: float(np.median(v)) for k, v in times.items()}
    for name, t in med.items():
        print(f"  {name:28s} {t * 1e3:8.2f} ms")
    torch_t = next((t for k, t in med.items() if k.startswith("torch")), None)
    print(f"  jitted / eager = {med['ember jitted'] / med['ember eager']:.2f}x"
          + (f"; jitted / torch = {med['ember jitted'] / torch_t:.2f}x" if torch_t else ""))


def bench_replay_overhead(device: str, kernels: int = 100, reps: int = 200) -> None:
    """Host time of one replay of ``kernels`` tiny kernels (kernels run synchronously on CPU)."""
    from ember import Device, Tensor, TinyJit

    def chain(x: Tensor) -> Tensor:
        for _ in range(kernels):
            x = (x + 1).realize()  # one kernel each
        return x

    f = TinyJit(chain)
    x = Tensor(np.zeros(16, np.float32), device=device).realize()
    for _ in range(3):
        out = f(x)
    assert f.captured is not None and f.captured.kernel_count == kernels
    assert float(out.numpy()[0]) == kernels
    samples = []
    for _ in range(reps):
        st = time.perf_counter()
        f(x)
        Device[device].synchronize()
        samples.append(time.perf_counter() - st)
    t = float(np.median(samples))
    print(f"replay of {kernels} tiny kernels on {device}: {t * 1e3:.3f} ms per call, {t / kernels * 1e6:.2f} us per "
          f"kernel ({len(f.captured.runs)} launch{'es' if len(f.captured.runs) != 1 else ''}; target <= 10 us)")


def bench_first_step(device: str, runs: int = 1) -> None:
    """A fresh process runs one MLP training step: with an empty cache, then with the cache it filled; by
    default, then with tiered compilation (``TIERED=1``: quick builds first, the optimized ones in the
    background; the first process waits for those at exit, so the second finds them). ``runs`` pairs
    each, alternating the two settings, give medians."""
    results: dict[str, list[tuple[float, float, float, str]]] = {}
    for _ in range(runs):
        for tiered in ("0", "1"):
            for label, row in _first_step_pair(device, tiered).items():
                results.setdefault(label, []).append(row)
    for label, rows in results.items():
        inside, wall, cpu = (sorted(r[i] for r in rows) for i in range(3))
        spread = f" (range {inside[0]:.2f}-{inside[-1]:.2f} s over {len(rows)} runs)" if len(rows) > 1 else ""
        print(f"first MLP training step, fresh process, {label}: {float(np.median(inside)):.2f} s from import to loss"
              f"{spread} ({float(np.median(wall)):.2f} s with interpreter start; {float(np.median(cpu)):.2f} s CPU "
              f"with the compiler's), loss {rows[0][3]}")


def _child_env(**extra: str) -> dict[str, str]:
    """The environment of a first-step process: this one's, with the bytecode cache on."""
    env = dict(os.environ, **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _first_step_pair(device: str, tiered: str) -> dict[str, tuple[float, float, float, str]]:
    """Seconds from import to loss, with interpreter start, and CPU seconds, and the loss: per cache state."""
    rows: dict[str, tuple[float, float, float, str]] = {}
    with tempfile.TemporaryDirectory() as cache:
        # compiled bytecode exists for an installed package: write it before timing (with a kernel cache of its own)
        subprocess.run([sys.executable, "-c", "import ember, ember.nn.optim; ember.Device[ember.Device.DEFAULT]"],
                       env=_child_env(EMBER_CACHE_DIR=os.path.join(cache, "warm-up")), capture_output=True, check=False)
        env = _child_env(EMBER_CACHE_DIR=os.path.join(cache, "ember"), POCL_CACHE_DIR=os.path.join(cache, "pocl"),
                         TIERED=tiered)
        for cache_state in ("empty cache", "warm cache"):
            label = cache_state + (", TIERED=1" if tiered == "1" else "")
            st = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([sys.executable, "-c", FIRST_STEP, device], capture_output=True, text=True, env=env,
                                  check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall = time.perf_counter() - st
            if proc.returncode != 0:
                print(f"first step ({label}): failed: {proc.stderr.strip().splitlines()[-1:]}")
                return rows
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            inside, loss = proc.stdout.split()[-2:]
            rows[label] = (float(inside), wall, cpu, f"{float(loss):.4f}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="CPU")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--first-runs", type=int, default=5, help="fresh-process runs per first-step row (medians)")
    args = p.parse_args()
    print(json.dumps({"device": args.device, "steps": args.steps}))
    bench_mlp(args.device, args.steps, args.threads)
    bench_replay_overhead(args.device)
    bench_first_step(args.device, args.first_runs)


if __name__ == "__main__":
    main()
