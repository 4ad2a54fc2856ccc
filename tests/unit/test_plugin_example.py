"""The example plugin of docs/plugins.md (``docs/example_plugin``: dist ``ember-foo``, device ``FOO``) installs
into a scratch directory like a third-party plugin and passes ember's conformance suite.

It is installed with pip (offline: ``--no-deps --no-build-isolation``) into a ``--target`` directory that a
subprocess puts on ``PYTHONPATH``, so ember finds it only through its entry point, as it would a plugin
from PyPI. The random-graph fuzzer of the suite runs only with EMBER_SLOW_TESTS=1.
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


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process that sees ember-foo installed (and a fresh cache directory)."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("the example plugin needs a C compiler (cc or $CC)")
    tmp = tmp_path_factory.mktemp("ember_foo")
    src, site = tmp / "src", tmp / "site"
    # build from a copy, so the build leaves nothing (build/, *.egg-info) in the repository
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(src)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp / "cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop("DEV", None)
    return env


def test_example_is_found_through_its_entry_point(installed: dict[str, str]) -> None:
    code = ("from ember import Device, Tensor\n"
            "print(Device.origin('FOO').label, Device.probe('FOO'))\n"
            "print((Tensor([1.0, 2.0, 3.0], device='FOO') * 2).sum().item())\n")
    run = subprocess.run([sys.executable, "-c", code], env=installed, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ember-foo==0.1.0", "None", "12.0"]


def test_example_gets_vector_code_by_declaring_it(installed: dict[str, str]) -> None:
    # FOO declares vector_widths and vector_alu and has no vector code of its own: codegen hands it vector loads,
    # arithmetic and accumulators, and the C-family renderer writes them
    code = ("import numpy as np\n"
            "from ember import Tensor\n"
            "from ember.codegen import get_program\n"
            "from ember.device.registry import Device\n"
            "a, b = np.random.default_rng(0).standard_normal((2, 64, 64)).astype(np.float32)\n"
            "out = Tensor(a, device='FOO') @ Tensor(b, device='FOO')\n"
            "ast = out.schedule()[-1].ast\n"
            "src = get_program(ast, Device['FOO'].renderer).src\n"
            "print(src.count('vector_size'), float(np.abs(out.numpy() - a @ b).max()))\n")
    run = subprocess.run([sys.executable, "-c", code], env=installed, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    vectors, err = run.stdout.split()
    assert int(vectors) >= 1 and float(err) < 1e-4, run.stdout


def _conformance(env: dict[str, str], *select: str) -> None:
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--pyargs", "ember.testing", "--device=FOO", *select],
                         env=env, capture_output=True, text=True, timeout=600)
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    passed = re.search(r"(\d+) passed", run.stdout)
    # every check ran on FOO: the suite skips everything when the device is unusable
    assert passed is not None and int(passed.group(1)) >= 30, tail
    assert "failed" not in run.stdout, tail


def test_example_passes_the_conformance_suite(installed: dict[str, str]) -> None:
    """The whole suite but the random-graph fuzzer (hundreds of new kernels: see the slow test below).

    About 15 s of CPU with cold caches, most of it the C compiler.
    """
    _conformance(installed, "-k", "not fuzz")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("EMBER_SLOW_TESTS") != "1", reason="set EMBER_SLOW_TESTS=1 to run")
def test_example_passes_the_whole_conformance_suite(installed: dict[str, str]) -> None:
    _conformance(installed)
