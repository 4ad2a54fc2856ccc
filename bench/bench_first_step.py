"""Time to first result with an empty kernel cache: one training step of a small CNN, from a fresh process.

Each row runs in its own Python process with empty ember and PoCL caches, and times
import -> model -> forward, backward and Adam step -> loss on the host. ember rows compare
batched builds (the default: a schedule's new kernels are built as one program, C builds
split across cores) with one build per kernel; torch eager is the peer (it compiles nothing, so
this is the price of ember's code generation). Prints seconds and ratios.

Run: ``python bench/bench_first_step.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

STEP = r"""
import json, os, sys, time
start = time.perf_counter()
framework, device, batched = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if framework == "ember":
    from ember import Device, GlobalCounters, Tensor
    from ember.device.batch_compiler import BatchCompiler
    from ember.nn import BatchNorm2d, Conv2d, Linear, get_parameters
    from ember.nn.optim import Adam
    if not batched:  # one build per kernel, as without batching
        BatchCompiler.max_batch, BatchCompiler.parallel_builds = 1, 1
    Tensor.manual_seed(0)
    conv, bn, fc = Conv2d(1, 16, 3, padding=1), BatchNorm2d(16), Linear(256, 10)
    params = get_parameters([conv, bn, fc])
    for p in params:
        p.to_(device)
    opt = Adam(params, lr=1e-3)
    x, y = Tensor.randn(64, 1, 8, 8, device=device), Tensor.randint(64, high=10, device=device)
    with Tensor.train():
        loss = fc(bn(conv(x)).relu().max_pool2d(2).flatten(1)).sparse_categorical_crossentropy(y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
    kernels = GlobalCounters.kernels_compiled
else:
    import torch
    torch.manual_seed(0)
    conv, bn, fc = torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.Linear(256, 10)
    params = [*conv.parameters(), *bn.parameters(), *fc.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    loss = torch.nn.functional.cross_entropy(fc(torch.nn.functional.max_pool2d(bn(conv(x)).relu(), 2).flatten(1)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    value, kernels = loss.item(), 0
print(json.dumps({"seconds": time.perf_counter() - start, "loss": value, "kernels": kernels}))
"""


def run(framework: str, device: str, batched: bool) -> dict | None:
    """One fresh process; ``None`` (with the reason printed) when it cannot run here."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(cache, "ember"), POCL_CACHE_DIR=os.path.join(cache, "pocl"))
        proc = subprocess.run([sys.executable, "-c", STEP, framework, device, "1" if batched else "0"],
                              capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        print(f"  {framework} {device}: failed: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    from ember.device import Device

    rows: list[tuple[str, dict]] = []
    torch_row = run("torch", "cpu", True)
    if torch_row:
        rows.append(("torch eager (CPU)", torch_row))
    for device in ("CPU", "CL"):
        reason = Device.probe(device)
        if reason is not None:
            print(f"{device}: skipped ({reason})")
            continue
        for batched in (False, True):
            row = run("ember", device, batched)
            if row:
                rows.append((f"ember {device}, {'batched builds' if batched else 'one build per kernel'}", row))
    print("first training step (conv-bn-relu-pool-linear, Adam), fresh process, empty caches:")
    for label, row in rows:
        extra = f", {row['kernels']} kernels compiled" if row["kernels"] else ""
        print(f"  {label:40s} {row['seconds']:7.2f} s{extra}")
    by_label = dict(rows)
    for device in ("CPU", "CL"):
        one = by_label.get(f"ember {device}, one build per kernel")
        batch = by_label.get(f"ember {device}, batched builds")
        if one and batch:
            print(f"  {device}: batched builds are {one['seconds'] / batch['seconds']:.2f}x faster to the first result")
            if torch_row:
                print(f"  {device}: ember (batched) / torch eager = {batch['seconds'] / torch_row['seconds']:.1f}x")


if __name__ == "__main__":
    main()
