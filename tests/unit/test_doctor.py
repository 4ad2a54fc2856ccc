"""`python -m ember.doctor`: lists every device with its status and smoke-tests the usable ones."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ember import Device


@pytest.fixture(scope="module")
def doctor(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path_factory.mktemp("doctor-cache"))}
    env.pop("DEV", None)
    return subprocess.run([sys.executable, "-m", "ember.doctor"], env=env, capture_output=True, text=True, timeout=300)


def device_line(output: str, name: str) -> str | None:
    """The line of the devices table for ``name``."""
    table = output.split("devices:", 1)[1].split("\n\n", 1)[0]
    return next((line for line in table.splitlines() if line.split()[:1] == [name]), None)


def test_exits_zero(doctor):
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "ok: the default device works" in doctor.stdout


def test_reports_versions(doctor):
    assert re.search(r"^ember\s+\d+\.\d+", doctor.stdout, re.MULTILINE)
    assert "python" in doctor.stdout


@pytest.mark.parametrize("name", ["PYTHON", "CPU"])
def test_lists_device_as_usable(doctor, name):
    if name not in Device.available():
        pytest.skip(f"{name} is not usable here: {Device.probe(name)}")
    line = device_line(doctor.stdout, name)
    assert line is not None, f"{name} missing from:\n{doctor.stdout}"
    assert line.rstrip().endswith("usable") and "unusable" not in line, line
    assert re.search(rf"^\s+{name}\s+ok$", doctor.stdout, re.MULTILINE), f"no smoke test ok for {name}"


def test_every_installed_device_is_listed(doctor):
    for name in Device.specs():
        assert device_line(doctor.stdout, name) is not None, f"{name} missing from:\n{doctor.stdout}"
