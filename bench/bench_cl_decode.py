"""KV-cache decoding per token on the CL device against the CPU device, in the same run.

    python bench/bench_cl_decode.py                  # 40 tokens, 5 interleaved rounds
    python bench/bench_cl_decode.py --new 40 --rounds 9

The model is ``examples/kv_decode.py``'s small transformer, its step jitted over a symbolic position
(47 kernels a step). Each device gets its own model (same weights); the two decode the same tokens,
in interleaved rounds so that a loaded machine slows both alike. A step is timed from the token's
upload to the logits back on the host (what a generation loop waits for). Prints, per device, the
median and the best round's median ms/token, the first two calls' seconds (capture and compile; the
kernel cache on disk makes them fast when it is warm), and the CL/CPU ratios. The two devices'
tokens must agree and their logits match to 1e-4, or the script exits with status 1.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


class Decoder:
    """A model and its jitted step on one device; ``run(tokens, start)`` times greedy steps."""

    def __init__(self, device: str, max_len: int):
        from kv_decode import TinyTransformer

        from ember import Device, TinyJit, Variable

        self.device = device
        Device.DEFAULT = device  # the example builds its weights and caches on the default device
        try:
            self.model = TinyTransformer(max_len=max_len)
        finally:
            Device.DEFAULT = None  # back to DEV= or the priority order
        self.pos = Variable("pos", 0, max_len - 1)
        self.step = TinyJit(lambda token, pos: self.model.step(token, pos).realize())
        self.first_calls = 0.0

    def logits(self, token: int, pos: int) -> np.ndarray:
        """One decoding step: the logits of ``token`` at position ``pos``."""
        from ember import Tensor

        return self.step(Tensor(np.array([token], np.int32), device=self.device), self.pos.bind(pos)).numpy()

    def run(self, tokens: list[int], start: int, count: int) -> tuple[list[float], list[np.ndarray]]:
        """Feed ``tokens[start:start + count]``; each step's seconds and logits."""
        times, out = [], []
        for pos in range(start, start + count):
            st = time.perf_counter()
            logits = self.logits(tokens[pos], pos)
            times.append(time.perf_counter() - st)
            out.append(logits)
        return times, out


def usable(name: str) -> bool:
    from ember.device import Device

    reason = Device.probe(name)
    if reason is not None:
        print(f"{name}: skipped ({reason})")
    return reason is None


def main(argv: list[str] | None = None) -> int:
    """Decode on CPU and CL in interleaved rounds; print ms/token and the CL/CPU ratio."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new", type=int, default=40, help="tokens decoded per round (default 40)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per device (default 5)")
    args = p.parse_args(argv)
    devices = [d for d in ("CPU", "CL") if usable(d)]
    if len(devices) < 2:
        print("need both the CPU and the CL device")
        return 0
    max_len = args.new + 2
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 64, max_len)]
    decoders: dict[str, Decoder] = {}
    for d in devices:
        st = time.perf_counter()
        dec = decoders[d] = Decoder(d, max_len)
        dec.run(tokens, 0, 2)  # call 1 runs eagerly, call 2 captures
        dec.first_calls = time.perf_counter() - st
    medians: dict[str, list[float]] = {d: [] for d in devices}
    steps: dict[str, list[float]] = {d: [] for d in devices}
    logits: dict[str, list[Any]] = {}
    for _ in range(args.rounds):
        for d in devices:
            # the KV cache positions are rewritten each round with the same tokens: every round computes the same
            times, logits[d] = decoders[d].run(tokens, 2, args.new)
            medians[d].append(float(np.median(times)) * 1e3)
            steps[d].extend(t * 1e3 for t in times)
    print(f"kv_decode, {decoders['CL'].step.captured.kernel_count} kernels per step, {args.new} tokens x "
          f"{args.rounds} rounds")
    p10 = {d: float(np.percentile(steps[d], 10)) for d in devices}
    for d in devices:
        print(f"{d:>4}: {np.median(medians[d]):.3f} ms/token (median of rounds), best round {min(medians[d]):.3f}, "
              f"10th percentile of steps {p10[d]:.3f}; first two calls {decoders[d].first_calls:.2f} s")
    # a loaded machine delays a driver's worker threads far more than the CPU device's single thread:
    # the best round and the fast steps show the cost of the code, the median also the machine's load
    print(f"CL/CPU: {np.median(medians['CL']) / np.median(medians['CPU']):.2f}x median, "
          f"{min(medians['CL']) / min(medians['CPU']):.2f}x best round, {p10['CL'] / p10['CPU']:.2f}x 10th percentile")
    diff = max(float(np.abs(a - b).max()) for a, b in zip(logits["CPU"], logits["CL"]))
    same = [int(x.argmax()) for x in logits["CPU"]] == [int(x.argmax()) for x in logits["CL"]]
    print(f"max |CL - CPU| logits {diff:.2e}; greedy tokens {'agree' if same else 'DIFFER'}")
    return 0 if same and diff < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
