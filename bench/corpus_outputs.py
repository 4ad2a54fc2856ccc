"""Run every kernel of a recorded corpus on one device and write a digest of its outputs per kernel.

A codegen change that is meant to keep results bit-identical (a new renderer path, another tile, vectors in the
IR) is checked by running this with the code before and after it (``PYTHONPATH`` selects which) on the same
corpus and comparing the two files: every line must match. Each kernel gets deterministic inputs (floats drawn
from its index in [0.5, 1), integer buffers zero, so that indices read from buffers stay in range); kernels with
symbolic variables or buffers over a GiB are skipped and counted. ::

    KERNEL_CORPUS=/tmp/corpus python -m pytest -p no:xdist -q tests/backend/test_reduce_matmul.py
    PYTHONPATH=<old> python bench/corpus_outputs.py /tmp/corpus --device CPU -o /tmp/before.txt
    PYTHONPATH=<new> python bench/corpus_outputs.py /tmp/corpus --device CPU -o /tmp/after.txt
    python bench/corpus_outputs.py --compare /tmp/before.txt /tmp/after.txt
"""
from __future__ import annotations

import argparse
import faulthandler
import hashlib
import sys
import time

import numpy as np

#: kernels whose buffers need more memory than this are skipped (and counted)
MAX_BYTES = 1 << 30


def digests(folders: list[str], device: str, limit: int | None, start: int = 0) -> list[str]:
    """One line per kernel: its AST's digest and the digest of every buffer after one run."""
    from ember.codegen import get_program
    from ember.device.buffer import Buffer
    from ember.device.registry import Device
    from ember.dtype import dtypes, to_np_dtype
    from ember.engine.corpus import load_corpus
    from ember.engine.realize import CompiledRunner
    from ember.ir.uop import Ops, serialize_uop
    from ember.progress import progress

    asts = [a for f in folders for a in load_corpus(f)][:limit]
    renderer = Device[device].renderer
    lines, skipped = [], 0
    for i, ast in enumerate(progress(asts, desc="kernels", unit="kernel")):
        if i < start:
            continue
        key = hashlib.sha256(repr(serialize_uop(ast)).encode()).hexdigest()[:16]
        spec = get_program(ast, renderer, f"k{i}")
        if any(u.op is Ops.DEFINE_VAR for u in spec.uops):
            skipped += 1
            continue
        rng = np.random.default_rng(i)
        params = {u.arg[0]: (u.arg[1], u.dtype.base) for u in spec.uops if u.op is Ops.DEFINE_GLOBAL}
        if sum(size * dt.itemsize for size, dt in params.values()) > MAX_BYTES:
            skipped += 1  # the huge-shape tests' kernels: their buffers are views of small ones in real use
            continue
        bufs = []
        for slot in range(max(params, default=-1) + 1):  # a slot the kernel does not use gets a 1-element buffer
            size, dt = params.get(slot, (1, dtypes.uint8))
            npdt = np.dtype(to_np_dtype(dt))
            # floats in [0.5, 1): an index computed from them (a gather through a float cast) stays in range
            arr = (rng.random(size) * 0.5 + 0.5).astype(npdt) if npdt.kind == "f" else np.zeros(size, npdt)
            b = Buffer(device, size, dt).allocate()
            b.copyin(memoryview(np.ascontiguousarray(arr)).cast("B"))
            bufs.append(b)
        try:
            CompiledRunner(device, spec)(bufs, wait=True)
            out = hashlib.sha256(b"".join(bytes(b.as_bytes()) for b in bufs)).hexdigest()[:16]
        except Exception as e:  # a kernel that cannot run is a line too, so both sides must agree on it
            out = f"error {type(e).__name__}"
        lines.append(f"{key} {out}")
    print(f"{len(asts)} kernels on {device}: {len(lines)} run, {skipped} skipped (symbolic variables or "
          f"buffers over {MAX_BYTES >> 20} MiB)",
          file=sys.stderr)
    return lines


def compare(a: str, b: str) -> int:
    """Print how the two digest files differ; returns the number of kernels whose outputs differ."""
    left = dict(line.split(" ", 1) for line in open(a).read().splitlines())
    right = dict(line.split(" ", 1) for line in open(b).read().splitlines())
    common = left.keys() & right.keys()
    diff = sorted(k for k in common if left[k] != right[k])
    print(f"{len(common)} kernels in both ({len(left)} and {len(right)}): {len(diff)} differ")
    for k in diff[:20]:
        print(f"  {k}: {left[k]} != {right[k]}")
    return len(diff)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", help="corpus folders (KERNEL_CORPUS recordings)")
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--limit", type=int, default=None, help="only the first N kernels")
    ap.add_argument("--start", type=int, default=0, help="skip the kernels before this index")
    ap.add_argument("-o", "--output", default="-")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two digest files")
    args = ap.parse_args()
    if args.compare:
        return 1 if compare(*args.compare) else 0
    start = time.perf_counter()
    faulthandler.enable()  # a kernel that crashes the process is named by the traceback
    lines = digests(args.folders, args.device, args.limit, args.start)
    text = "\n".join(lines) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
