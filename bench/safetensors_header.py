"""Time and memory of parsing a safetensors header with many tensors: ember against its peers, in one run.

Writes a file of ``--tensors`` one-element tensors (1,000,000 by default: about 90 MB of header), then parses its
header in a fresh process per reader, ``--repeat`` times each, and prints the best CPU time, the wall time and the
peak memory the parse added (resident, from /proc: Linux only), and ember's ratio to each peer:

- ``ember``: ember's header parser and checker (what :func:`ember.nn.safetensors.safe_load` runs before it makes
  any tensor);
- ``safetensors``: the reference library's ``safe_open(...).keys()``, when the ``safetensors`` package is
  installed;
- ``json.loads``: the standard library parsing the same header text, without any checks.

    python bench/safetensors_header.py [--tensors 1000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

_READERS = {
    "ember": """
from ember.nn.safetensors import _safe_header
from ember.nn.weights import _Source
src = _Source.open(PATH)
def run():
    return _safe_header(src)
""",
    "safetensors": """
import safetensors
def run():
    with safetensors.safe_open(PATH, "numpy") as f:
        return f.keys()
""",
    "json.loads": """
import json
with open(PATH, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    header = f.read(n)
def run():
    return json.loads(header)
""",
}

_MEASURE = """
import gc, sys, time
PATH = sys.argv[1]
{setup}
def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # restart the peak (VmHWM) from the current size
before = status("VmRSS")
cpu, wall = time.process_time(), time.perf_counter()
out = run()
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(cpu, wall, status("VmHWM") - before)
"""
# (ru_maxrss would not do: Linux carries the parent's peak into a child across fork and exec)


def write_file(path: str, n: int) -> None:
    """A safetensors file of ``n`` one-element float32 tensors named like a model's."""
    header = {f"model.layers.{i}.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
              for i in range(n)}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.write(bytes(4 * n))


def measure(reader: str, path: str) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, bytes of peak memory added) of one parse in a fresh process."""
    code = _MEASURE.format(setup=_READERS[reader])
    res = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True)
    cpu, wall, mem = res.stdout.split()
    return float(cpu), float(wall), int(mem)


def main() -> None:
    """Write the file, time each reader, print the table and the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    readers = ["ember", "json.loads"]
    try:
        import safetensors  # noqa: F401
        readers.insert(1, "safetensors")
    except ImportError:
        print("the safetensors package is not installed: comparing with json.loads only")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "many.safetensors")
        write_file(path, args.tensors)
        header_mb = (os.path.getsize(path) - 4 * args.tensors) / 1e6
        print(f"{args.tensors} tensors, {header_mb:.1f} MB header, best of {args.repeat} fresh processes each")
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.repeat):  # interleaved, so a burst of load elsewhere hits every reader alike
            for r in readers:
                cpu, wall, mem = measure(r, path)
                old = best.get(r)
                best[r] = (cpu, wall, mem) if old is None else (min(old[0], cpu), min(old[1], wall), min(old[2], mem))
    print(f"{'reader':<12} {'cpu s':>8} {'wall s':>8} {'peak MB':>8}")
    for r in readers:
        cpu, wall, mem = best[r]
        print(f"{r:<12} {cpu:8.3f} {wall:8.3f} {mem / 1e6:8.0f}")
    for peer in readers[1:]:
        print(f"ember / {peer}: cpu {best['ember'][0] / best[peer][0]:.2f}x, "
              f"peak memory {best['ember'][2] / max(best[peer][2], 1):.2f}x")


if __name__ == "__main__":
    main()
