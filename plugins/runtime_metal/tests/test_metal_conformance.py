"""ember's conformance suite against the METAL plugin on Linux: ``METALHOST`` (metal_host_device) is the real
device stack over the recording fake, with each dispatch run as MSL on the host CPU.

The raw contract (allocator round trips, offset views, launches with sizes and int variables, graph replay)
runs in every test run; the whole suite (about 250 tests, minutes) only with ``EMBER_SLOW_TESTS=1``. Passing
checks ember's side of every launch; it cannot check Apple's compiler or GPU.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent


def run_suite(target: str, timeout: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "metal_host_device", "--pyargs", target, "--device=METALHOST"],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=HERE)


def test_raw_contract_through_the_metal_plugin(host_clang: str) -> None:
    proc = run_suite("ember.testing.test_contract", timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


@pytest.mark.skipif(os.environ.get("EMBER_SLOW_TESTS") != "1", reason="set EMBER_SLOW_TESTS=1 to run")
def test_whole_conformance_suite_through_the_metal_plugin(host_clang: str) -> None:
    proc = run_suite("ember.testing", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
