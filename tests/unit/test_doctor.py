"""`python -m ember.doctor`: lists every device with its status and smoke-tests the usable ones."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

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


def _doctor_with_plugin(tmp_path: pathlib.Path, body: str) -> subprocess.CompletedProcess:
    """Run the doctor with one more installed distribution, ``ember-doc-test`` (module ``ember_doc_test``)."""
    dist = tmp_path / "ember_doc_test-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ember-doc-test\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[ember.devices]\ndoctest = ember_doc_test\n")
    (tmp_path / "ember_doc_test.py").write_text(textwrap.dedent(body))
    core = pathlib.Path(sys.modules["ember"].__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(core), *sys.path]),
           "EMBER_PLUGIN_TIMEOUT": "60", "EMBER_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DEV", None)
    # (no plugin here hangs: each ends by itself, so the limit only has to outlast a slow fork)
    return subprocess.run([sys.executable, "-m", "ember.doctor"], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="plugins are tried in forked children")
def test_names_every_plugin_that_crashed(tmp_path: pathlib.Path):
    out = _doctor_with_plugin(tmp_path, """
        import ctypes, os
        from ember.device import DeviceSpec, hookimpl

        @hookimpl
        def ember_devices():
            return [DeviceSpec("DOCSEGV", "ember_doc_test:X", priority=1000, probe=lambda: ctypes.string_at(0)),
                    DeviceSpec("DOCEXIT", "ember_doc_test:X", priority=999, precheck=lambda: os._exit(0))]
    """)
    crashed = out.stdout.split("crashed plugins", 1)[-1].split("\n\n", 1)[0]
    assert "device DOCSEGV (ember-doc-test==0.1) crashed the process that ran it (SIGSEGV)" in crashed, out.stdout
    assert "device DOCEXIT (ember-doc-test==0.1) ended the process that ran it (exit status 0" in crashed, out.stdout
    assert out.stdout.rstrip().endswith("ok: the default device works") and out.returncode == 0, out.stdout


def test_a_report_cut_off_by_a_plugin_exits_non_zero(tmp_path: pathlib.Path):
    """A plugin's report-header hook ends the checking process with status 0 halfway through the report: the
    doctor says the report is incomplete and exits 1, not 0."""
    out = _doctor_with_plugin(tmp_path, """
        import os
        from ember.device import hookimpl

        @hookimpl
        def ember_devices():
            return []

        @hookimpl
        def ember_report_header():
            os._exit(0)
    """)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: the report is incomplete" in out.stdout and "status 0" in out.stdout, out.stdout
