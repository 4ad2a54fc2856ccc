"""Accuracy of long float32 sums against the float64 sum, next to numpy's, with the time of each.

The goal (fusion rule 7 of the scheduler: long sums become a tree of short ones): a float32 sum of 2e8 uniform
values within 2e-7 (relative) of the float64 sum; numpy's pairwise sum is about 2e-8 off. Run:
``python bench/bench_accurate_sum.py`` (``--n 20000000`` for a smaller, quicker run; 2e8 values take 800 MB).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ember import Tensor

GOAL = 2e-7


def main() -> None:
    """Print the relative error and the time of ember's and numpy's sums of ``--n`` uniform float32 values."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200_000_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    x = np.random.default_rng(args.seed).random(args.n, dtype=np.float32)
    exact = float(np.sum(x, dtype=np.float64))
    t = Tensor(x).realize()
    t.sum().item()  # compiled once before timing
    st = time.perf_counter()
    ours = t.sum().item()
    ours_s = time.perf_counter() - st
    st = time.perf_counter()
    theirs = float(x.sum())
    theirs_s = time.perf_counter() - st
    err, np_err = abs(ours - exact) / exact, abs(theirs - exact) / exact
    print(f"n={args.n}: ember rel err {err:.2e} ({ours_s * 1e3:.1f} ms), numpy {np_err:.2e} ({theirs_s * 1e3:.1f} ms), "
          f"goal {GOAL:.0e}: {'ok' if err <= GOAL else 'MISSED'}")


if __name__ == "__main__":
    main()
