"""Copies between devices take the plugin's own path: ``Allocator.transfer`` between devices of one plugin,
and a single pass through host memory otherwise (no staging copy when either side has a host view).

Each test counts what the copy did by wrapping the allocators' methods: staging copies
(``Buffer.as_bytes``), transfers, and the host copies in and out of the device.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ember import Device, Tensor
from ember.device.buffer import Buffer


def _usable(*names: str) -> None:
    for name in names:
        if (reason := Device.probe(name)) is not None:
            pytest.skip(f"{name} is not usable: {reason}")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Counter[str], Any]]:
    """A counter of calls, and ``watch(device)`` that counts its allocator's copyin/copyout/transfer."""
    counts: Counter[str] = Counter()
    as_bytes = Buffer.as_bytes

    def staged(self: Buffer) -> bytearray:
        counts["staging"] += 1
        return as_bytes(self)

    monkeypatch.setattr(Buffer, "as_bytes", staged)

    def watch(device: str) -> None:
        alloc = Device[device].allocator
        for method in ("copyin", "copyout", "transfer"):
            original = getattr(alloc, method)

            def counted(*args: Any, _m: str = method, _f: Any = original, **kwargs: Any) -> Any:
                counts[f"{device}.{_m}"] += 1
                return _f(*args, **kwargs)

            monkeypatch.setattr(alloc, method, counted)

    yield counts, watch


def _copy(x: np.ndarray, src: str, dest: str) -> tuple[Tensor, Tensor]:
    a = Tensor(x, device=src).realize()
    return a, a.to(dest).realize()


def test_two_cpu_devices_use_the_plugins_transfer(calls: tuple[Counter[str], Any]) -> None:
    _usable("CPU")
    counts, watch = calls
    x = np.arange(24, dtype=np.float32)
    a = Tensor(x, device="CPU").realize()
    watch("CPU:1")
    b = a.to("CPU:1").realize()
    assert counts["CPU:1.transfer"] == 1 and counts["staging"] == 0 and counts["CPU:1.copyin"] == 0
    np.testing.assert_array_equal(b.numpy(), x)


def test_cl_to_cpu_and_back_pass_the_host_once(calls: tuple[Counter[str], Any]) -> None:
    _usable("CPU", "CL")
    counts, watch = calls
    x = np.arange(40, dtype=np.float32) - 7
    a = Tensor(x, device="CL").realize()
    watch("CL")
    watch("CPU")
    b = a.to("CPU").realize()
    # CL reads straight into the CPU buffer's memory: one device-to-host copy, no staging, no transfer
    assert counts == Counter({"CL.copyout": 1}), counts
    counts.clear()
    c = b.to("CL").realize()
    assert counts == Counter({"CL.copyin": 1}), counts
    np.testing.assert_array_equal(b.numpy(), x)
    np.testing.assert_array_equal(c.numpy(), x)


def test_a_plugin_without_transfer_falls_back_to_the_host() -> None:
    """PYTHON and PYTHON:1 come from one provider, whose allocator has no transfer: the copy still works."""
    x = np.arange(10, dtype=np.int32)
    _, b = _copy(x, "PYTHON", "PYTHON:1")
    np.testing.assert_array_equal(b.numpy(), x)


CL_PAIR = """
import json
from collections import Counter
import numpy as np
from ember import Device, Tensor
counts = Counter()
for dev in ("CL", "CL:1"):
    alloc = Device[dev].allocator
    for m in ("copyin", "copyout", "transfer"):
        def counted(*a, _m=m, _f=getattr(alloc, m), _d=dev, **k):
            counts[f"{_d}.{_m}"] += 1
            return _f(*a, **k)
        setattr(alloc, m, counted)
x = np.arange(33, dtype=np.float32)
a = Tensor(x, device="CL").realize()
counts.clear()
b = a.to("CL:1").realize()
moved = dict(counts)
ok = bool((b.numpy() == x).all())
print(json.dumps({"counts": moved, "ok": ok}))
"""


def test_two_cl_devices_copy_on_the_device() -> None:
    """Two PoCL devices (POCL_DEVICES) share a context: CL -> CL:1 is one device-side copy, no host round trip."""
    _usable("CL")
    env = {**os.environ, "POCL_DEVICES": "pthread pthread"}
    env.pop("DEV", None)
    run = subprocess.run([sys.executable, "-c", CL_PAIR], env=env, capture_output=True, text=True, timeout=300)
    if run.returncode != 0 and "CL:1" in run.stderr and "no" in run.stderr.lower():
        pytest.skip(f"no second OpenCL device: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"counts": {"CL:1.transfer": 1}, "ok": True}
