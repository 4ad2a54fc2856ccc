"""Random op graphs at scale: each graph on a device and on the PYTHON reference (and numpy), compared.

    python bench/fuzz.py --n 10000 [--grad] [--device CPU] [--start 0] [--batch 50]
    python bench/fuzz.py --seed 4711 --device CPU      # one graph: shrink it and print its reproducer

Graphs are generated from their seeds alone (see ember.testing.fuzz), so the seeds a run reports are
complete reproducers. Every mismatch is shrunk and printed as a script to paste; the exit status is 1
when any graph differed or crashed.
"""
from __future__ import annotations

import argparse
import sys
import time

from ember import Device
from ember.dtype import to_dtype
from ember.progress import progress
from ember.testing import fuzz


def _pool(device: str) -> tuple[str, ...]:
    ours = Device[device].renderer.supported_dtypes
    ref = Device[fuzz.REFERENCE].renderer.supported_dtypes
    return tuple(d for d in fuzz.DEFAULT_DTYPES if to_dtype(d) in ours and to_dtype(d) in ref)


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer; returns the process exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="number of graphs")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, default=None, help="check only this seed (and shrink it if it fails)")
    ap.add_argument("--device", default=None, help="device under test (default: DEV= or the best usable device)")
    ap.add_argument("--grad", action="store_true", help="compare gradients instead of outputs")
    ap.add_argument("--batch", type=int, default=50, help="graphs realized together (one batched compile)")
    ap.add_argument("--no-numpy", action="store_true", help="skip the numpy comparison of float graphs")
    ap.add_argument("--no-shrink", action="store_true", help="print mismatches as found, without shrinking")
    ap.add_argument("--max-report", type=int, default=10, help="mismatches printed in full")
    args = ap.parse_args(argv)
    if args.n < 1 or args.batch < 1:
        ap.error(f"--n and --batch must be positive (got --n {args.n}, --batch {args.batch})")
    device = Device.canonicalize(args.device or Device.DEFAULT)
    if (reason := Device.probe(device)) is not None:
        print(f"device {device} is not usable: {reason}", file=sys.stderr)
        return 2
    pool = _pool(device)
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.n))
    what = "gradients" if args.grad else "forward"
    print(f"fuzz: {len(seeds)} graphs ({what}) on {device} against {fuzz.REFERENCE}"
          f"{'' if args.no_numpy or args.grad else ' and numpy'}; dtypes {', '.join(sorted(set(pool)))}")
    failures: list[fuzz.CheckResult] = []
    start = time.perf_counter()
    bar = progress(total=len(seeds), desc="fuzz", unit="graph")
    for i in range(0, len(seeds), args.batch):
        graphs = [fuzz.generate(s, pool=pool, grad=args.grad) for s in seeds[i:i + args.batch]]
        for result in fuzz.check_many(graphs, device, grad=args.grad, use_numpy=not args.no_numpy):
            if not result.ok:
                failures.append(result)
                print(f"\nseed {result.graph.seed}: {result.problems[0]}", file=sys.stderr)
        bar.update(len(graphs))
        bar.set_postfix(mismatches=len(failures))
    bar.close()
    elapsed = time.perf_counter() - start
    print(f"{len(seeds)} graphs in {elapsed:.1f} s ({len(seeds) / elapsed:.1f} graphs/s): "
          f"{len(failures)} mismatched or crashed")
    for result in failures[:args.max_report]:
        if not args.no_shrink:
            result = fuzz.check(fuzz.shrink(result.graph, device, args.grad), device, args.grad)
        print("\n" + "=" * 100 + "\n" + result.report())
    if len(failures) > args.max_report:
        rest = ", ".join(str(r.graph.seed) for r in failures[args.max_report:])
        print(f"\n{len(failures) - args.max_report} more mismatching seeds: {rest}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
