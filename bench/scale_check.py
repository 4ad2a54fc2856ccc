"""Right answers past 2**31 elements on real memory (not views): buffers of billions of elements on a device with
the memory for them (a large GPU), checked against exact expectations.

The test suite checks the same index arithmetic through huge *views* of small buffers (nothing allocated); this
script allocates: a sum over 3 * 2**30 + 5 ones (exact in float32 only if the reduction keeps its partials
accurate), the last elements of a buffer past 2**31 and 2**32 bytes and elements, a gather at indices past
2**31, and an elementwise op over the whole buffer. Each line prints ``ok`` or ``WRONG`` with the values; the exit
status is the number of wrong answers.

Run: ``python bench/scale_check.py --device CUDA`` (needs ~40 GB of device memory; ``--small`` divides the sizes
by 64 for a dry run anywhere).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="device to check (default: the best usable one)")
    p.add_argument("--small", action="store_true", help="sizes divided by 64 (a dry run)")
    args = p.parse_args()

    from ember import Device, Tensor, dtypes

    device = args.device or Device.DEFAULT
    if (reason := Device.probe(device)) is not None:
        print(f"scale_check: {device} is not usable here: {reason}")
        return 0
    div = 64 if args.small else 1
    wrong = 0

    def check(name: str, got, want) -> None:
        nonlocal wrong
        ok = np.array_equal(np.asarray(got), np.asarray(want))
        wrong += not ok
        print(f"{'ok   ' if ok else 'WRONG'} {name}: got {np.asarray(got).tolist()} want {np.asarray(want).tolist()}",
              flush=True)

    t0 = time.perf_counter()
    n = (3 * 2 ** 30 + 5) // div
    ones = Tensor.ones(n, dtype=dtypes.float32, device=device).contiguous().realize()  # 12.9 GB
    check(f"sum of {n} float32 ones", ones.sum().item(), float(np.float32(n)))  # n rounded to float32
    check(f"mean of {n} float32 ones", ones.mean().item(), 1.0)
    del ones

    m = (2 ** 31 + 7) // div
    idx = Tensor.arange(m, dtype=dtypes.int64, device=device).realize()  # 17 GB of int64
    check(f"last of arange({m})", idx[-3:].numpy(), np.arange(m - 3, m))
    check("max of the arange", idx.max().item(), m - 1)
    check("sum of the arange (int64)", idx.sum().item(), m * (m - 1) // 2)
    at = Tensor([0, m // 2, m - 1, m - 2], dtype=dtypes.int64, device=device)
    check("gather past 2**31", idx[at].numpy(), np.array([0, m // 2, m - 1, m - 2]))
    halves = (idx.cast(dtypes.float32) * 0.5).realize()  # an elementwise kernel over all of it
    check("elementwise at the far end", halves[-2:].numpy(), np.array([(m - 2) * 0.5, (m - 1) * 0.5], np.float32))
    del idx, halves

    k = (5 * 2 ** 30) // div  # 5 GiB of bytes: uint8 offsets past 2**32
    b = (Tensor.arange(k, dtype=dtypes.int64, device=device) % 251).cast(dtypes.uint8).realize()
    check(f"uint8 buffer of {k} bytes, the last", b[-4:].numpy(), (np.arange(k - 4, k) % 251).astype(np.uint8))
    check("its sum", b.sum(dtype=dtypes.int64).item() if _has_sum_dtype() else b.cast(dtypes.int64).sum().item(),
          int((np.arange(251).sum() * (k // 251)) + np.arange(k % 251).sum()))
    print(f"scale_check: {wrong} wrong, {time.perf_counter() - t0:.1f} s on {device}")
    return wrong


def _has_sum_dtype() -> bool:
    import inspect

    from ember import Tensor

    return "dtype" in inspect.signature(Tensor.sum).parameters


if __name__ == "__main__":
    sys.exit(main())
