"""The on-disk kernel cache across processes: a second process with the same EMBER_CACHE_DIR compiles nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ember import Device

# A few kernels of different kinds (elementwise, reduce, matmul); prints what was compiled and the answer.
PROGRAM = """
import numpy as np
from ember import GlobalCounters, Tensor
a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
b = Tensor(np.ones((4, 2), dtype=np.float32))
GlobalCounters.reset()
out = ((a * 2 + 1).relu() @ b).sum(1)
values = out.tolist()
print(GlobalCounters.kernels_compiled, GlobalCounters.kernel_count, values)
"""


@pytest.fixture
def cpu() -> None:
    if "CPU" not in Device.available():
        pytest.skip(f"CPU is not usable here: {Device.probe('CPU')}")


def run(cache_dir, **env: str) -> tuple[int, int, str]:
    """Run PROGRAM in a fresh interpreter on CPU with ``cache_dir``; (kernels compiled, kernels run, values)."""
    full_env = {k: v for k, v in os.environ.items() if k != "CACHELEVEL"}
    full_env.update(EMBER_CACHE_DIR=str(cache_dir), DEV="CPU", **env)
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=full_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    compiled, ran, values = proc.stdout.strip().splitlines()[-1].split(" ", 2)
    return int(compiled), int(ran), values


def test_second_process_compiles_nothing(cpu, tmp_path):
    cache = tmp_path / "cache"
    compiled, ran, values = run(cache)
    assert compiled > 0
    assert ran >= 1
    assert any((cache / "compile").iterdir())
    compiled2, ran2, values2 = run(cache)
    assert compiled2 == 0
    assert ran2 == ran
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert values2 == values == str((np.maximum(a * 2 + 1, 0) @ np.ones((4, 2), np.float32)).sum(1).tolist())


def test_other_cache_dir_compiles_again(cpu, tmp_path):
    assert run(tmp_path / "one")[0] > 0
    assert run(tmp_path / "two")[0] > 0


def test_corrupt_entries_are_recompiled(cpu, tmp_path):
    cache = tmp_path / "cache"
    compiled, _, values = run(cache)
    entries = [p for p in (cache / "compile").iterdir() if p.is_file()]
    assert entries
    for p in entries:
        p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])  # truncated, as by a crash mid-write
    compiled2, _, values2 = run(cache)
    assert compiled2 == compiled
    assert values2 == values
    assert run(cache)[0] == 0  # the rewritten entries are good again


def test_cachelevel_zero_skips_the_disk(cpu, tmp_path):
    cache = tmp_path / "cache"
    assert run(cache, CACHELEVEL="0")[0] > 0
    assert run(cache, CACHELEVEL="0")[0] > 0
    assert not (cache / "compile").exists() or not any((cache / "compile").iterdir())
