"""The MLP's first training step (empty cache) of two ember checkouts, timed interleaved.

On a shared machine the same command can take 30% longer from one minute to the next, so a before/after
figure from two separate runs of ``bench_jit.py`` says little. This runs the step of ``bench_jit.py`` in fresh
processes, alternating checkout A and checkout B (each with its own empty ``EMBER_CACHE_DIR`` per run and its
packages first on ``PYTHONPATH``), and prints each side's median, the runs, and B / A.

Run: ``python bench/compare_first_step.py A_DIR B_DIR [--runs 8] [--device CPU]`` where each directory is an
ember checkout (``git worktree add /tmp/base <commit>`` makes one).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_jit import FIRST_STEP  # noqa: E402  (the same step as bench_jit's first-step rows)


def python_path(checkout: pathlib.Path) -> str:
    """The core package and every plugin package of ``checkout``, in front of whatever is installed."""
    return os.pathsep.join([str(checkout / "core"), *(str(p) for p in sorted((checkout / "plugins").glob("*"))
                                                       if p.is_dir())])


def first_step(checkout: pathlib.Path, device: str) -> float:
    """Seconds from import to loss of one fresh process on ``checkout`` with an empty kernel cache."""
    env = dict(os.environ, PYTHONPATH=python_path(checkout))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed ember has its bytecode
    with tempfile.TemporaryDirectory() as cache:
        env["EMBER_CACHE_DIR"] = cache
        proc = subprocess.run([sys.executable, "-c", FIRST_STEP, device], capture_output=True, text=True, env=env,
                              cwd=checkout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the first step failed in {checkout}: {proc.stderr.strip().splitlines()[-1:]}")
    return float(proc.stdout.split()[-2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=pathlib.Path, help="checkout A (e.g. the commit before a change)")
    p.add_argument("b", type=pathlib.Path, help="checkout B")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--device", default="CPU")
    args = p.parse_args()
    for side in (args.a, args.b):  # write each side's bytecode first, as an installed package has it
        first_step(side, args.device)
    times: dict[str, list[float]] = {"A": [], "B": []}
    for _ in range(args.runs):
        for label, side in (("A", args.a), ("B", args.b)):
            times[label].append(first_step(side, args.device))
    med = {k: statistics.median(v) for k, v in times.items()}
    for label, side in (("A", args.a), ("B", args.b)):
        print(f"{label} {side}: median {med[label]:.3f} s  runs {' '.join(f'{t:.3f}' for t in times[label])}")
    print(f"B / A = {med['B'] / med['A']:.2f}")


if __name__ == "__main__":
    main()
