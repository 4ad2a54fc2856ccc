"""ember's conformance suite catches a float16 cast bug in an out-of-tree plugin.

The example plugin of docs/plugins.md (``docs/example_plugin``: dist ``ember-foo``, device ``FOO``) is
installed twice into scratch directories, as a third party would install it: once as shipped, once with a
bug planted in its renderer (float64 -> float16 converted through float, so some values round twice: the
libgcc ``__truncdfhf2`` class of bug). The cast part of the suite then runs on each in a subprocess
(``pytest --pyargs ember.testing --device=FOO``): the buggy plugin must fail exactly the float64 ->
float16 checks, the shipped one must pass them.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "example_plugin"
CORRECT_CAST = 'return f"((_Float16)({x}))"'
PLANTED_CAST = 'return f"((_Float16)(float)({x}))"'  # float64 -> float -> float16: two roundings
# only the checks a float16 cast bug can touch, so the two runs stay short
SELECTION = "test_casts and (float64 or float16)"


def _install(tmp: pathlib.Path, plant: bool) -> dict[str, str]:
    """The environment of a process that sees ember-foo installed (with the bug when ``plant``)."""
    src, site = tmp / "src", tmp / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    renderer = src / "ember_foo" / "renderer.py"
    text = renderer.read_text()
    assert CORRECT_CAST in text, f"{renderer} no longer renders float16 casts as this test expects"
    if plant:
        renderer.write_text(text.replace(CORRECT_CAST, PLANTED_CAST))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(src)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp / "cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    if shutil.which("gcc"):
        env["CC"] = "gcc"  # a compiler with _Float16 on x86-64 (clang 14 has none: FOO then offers no float16)
    env.pop("DEV", None)
    return env


def _run_suite(env: dict[str, str]) -> tuple[int, set[str], str]:
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--pyargs", "ember.testing", "--device=FOO", "-k", SELECTION],
                         env=env, capture_output=True, text=True, timeout=600)
    failed = set(re.findall(r"^FAILED \S+::(\S+)", run.stdout, re.M))
    return run.returncode, failed, run.stdout[-4000:] + run.stderr[-2000:]


@pytest.fixture(scope="module")
def installs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        pytest.skip("the example plugin needs a C compiler")
    envs = {name: _install(tmp_path_factory.mktemp(name), plant=name == "buggy") for name in ("clean", "buggy")}
    probe = subprocess.run([sys.executable, "-c", "from ember import Device, dtypes\n"
                            "print(dtypes.float16 in Device['FOO'].renderer.supported_dtypes)"],
                           env=envs["clean"], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    if probe.stdout.strip() != "True":
        pytest.skip("FOO offers no float16 with this machine's C compiler")
    return envs


def test_suite_fails_the_planted_float16_cast_bug(installs: dict[str, dict[str, str]]) -> None:
    code, failed, tail = _run_suite(installs["buggy"])
    assert code == 1, tail
    assert "test_cast[float64-float16]" in failed, tail
    # nothing else breaks: every failure is a float64 -> float16 conversion
    assert failed <= {"test_cast[float64-float16]", "test_reference_agrees_on_casts",
                      "test_cast_after_arithmetic_rounds_once"}, tail


def test_suite_passes_the_plugin_as_shipped(installs: dict[str, dict[str, str]]) -> None:
    code, failed, tail = _run_suite(installs["clean"])
    assert code == 0 and not failed, tail
    assert re.search(r"(\d+) passed", tail) and int(re.search(r"(\d+) passed", tail).group(1)) >= 25, tail
