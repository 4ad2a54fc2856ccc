"""HCQ on the CPU device vs the default CPU device, in one run.

1. Launch overhead: 100 tiny kernels replayed as one graph (CPUGraph: one foreign call running a C
   loop; HCQGraph: one submission of a prebuilt queue to a native engine thread), and the same
   100 kernels launched one by one. Host time per kernel, median of repeats.
2. The main job's training step (examples/train_digits.py, 2 epochs) with ``CPU_HCQ=0`` and
   ``CPU_HCQ=1``, each in a fresh process: median step time as the script reports it.

    python bench/bench_hcq.py
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ember_cpu.device import CPUDevice
from ember_cpu.hcq import CPUHCQDevice

KERNELS = 100
REPEATS = 200
TINY_SRC = """void tiny(void **bufs, const long long *vals) {
  float *out = (float *)bufs[0]; const float *in = (const float *)bufs[1];
  out[0] = in[0] + 1.0f;
}
"""


def calls_for(dev):
    prg = dev.runtime("tiny", dev.compiler.compile_cached(TINY_SRC))
    bufs = [dev.allocator.alloc(4) for _ in range(KERNELS + 1)]
    dev.allocator.copyin(bufs[0], memoryview(np.zeros(1, np.float32)).cast("B"))
    return prg, bufs, [(prg, [bufs[i + 1], bufs[i]], ()) for i in range(KERNELS)]


def result(dev, buf) -> float:
    out = np.empty(1, np.float32)
    dev.allocator.copyout(memoryview(out).cast("B"), buf)
    return float(out[0])


def per_kernel_us(fn, sync) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / KERNELS * 1e6


def launch_overhead() -> None:
    print(f"launch overhead, {KERNELS} tiny kernels (host time per kernel, median of {REPEATS})")
    rows = []
    for label, dev in (("CPU (CPUGraph)", CPUDevice("CPU:20")), ("CPU_HCQ (HCQGraph)", CPUHCQDevice("CPU:21"))):
        prg, bufs, calls = calls_for(dev)
        graph = dev.graph(calls)
        graph_us = per_kernel_us(lambda g=graph: g(), dev.synchronize)
        assert result(dev, bufs[-1]) == KERNELS, "the chain of kernels computed the wrong value"

        def one_by_one(prg=prg, bufs=bufs):
            for i in range(KERNELS):
                prg(bufs[i + 1], bufs[i])

        single_us = per_kernel_us(one_by_one, dev.synchronize)
        rows.append((label, graph_us, single_us))
        if hasattr(dev, "finalize"):
            dev.finalize()
    for label, graph_us, single_us in rows:
        print(f"  {label:22s} graph replay {graph_us:7.2f} us/kernel   one by one {single_us:7.2f} us/kernel")
    print(f"  HCQ / default: graph {rows[1][1] / rows[0][1]:.2f}x, one by one {rows[1][2] / rows[0][2]:.2f}x")


def training_step_ms(hcq: bool) -> float:
    script = Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"
    env = dict(os.environ, CPU_HCQ="1" if hcq else "0", DEV="CPU")
    out = subprocess.run([sys.executable, str(script), "--epochs", "2", "--no-save"], capture_output=True,
                         text=True, env=env, check=True).stdout
    match = re.search(r"median step time ([\d.]+) ms", out)
    if match is None:
        raise RuntimeError(f"train_digits.py printed no step time:\n{out}")
    return float(match.group(1))


def training() -> None:
    default, hcq = training_step_ms(False), training_step_ms(True)
    print("training step (examples/train_digits.py, median of 2 epochs, fresh process each)")
    print(f"  CPU {default:7.2f} ms   CPU_HCQ {hcq:7.2f} ms   HCQ / default {hcq / default:.2f}x")


if __name__ == "__main__":
    launch_overhead()
    training()
