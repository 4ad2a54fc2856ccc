"""The random-graph fuzzer (``ember.testing.fuzz``) finds planted bugs, stays quiet on a correct device, and
prints reproducers that run.

The planted bugs live in small in-process devices built on the PYTHON interpreter (no compiler needed):
its program text is edited after rendering, the way a miscompiling backend would produce it.
"""
from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.builtin_devices.python import PythonDevice, PythonRenderer
from ember.device import DeviceSpec, hookimpl
from ember.device.registry import Device, register_plugin
from ember.testing import fuzz

#: device name -> how its rendered program text differs from PYTHON's
PLANTS = {
    "FUZZ_CLEAN": lambda src: src,
    # a comparison that looks the wrong way: where, relu, max and clip give wrong values and gradients
    "FUZZ_CMP_BUG": lambda src: re.sub(r'\["CMPLT", "bool", \[(\d+), (\d+)\]', r'["CMPLT", "bool", [\2, \1]', src),
    # a float16 conversion that flips the sign
    "FUZZ_F16_BUG": lambda src: src.replace('["CAST", "half", ', '["NEG", "half", '),
}


class _PlantedRenderer(PythonRenderer):
    def __init__(self, device: str):
        self.device, self.plant = device, PLANTS[device]

    def render(self, name: str, uops: list) -> str:
        return self.plant(super().render(name, uops))


class PlantedDevice(PythonDevice):
    """The PYTHON device with one of :data:`PLANTS` applied to every kernel it renders."""

    def __init__(self, name: str):
        super().__init__(name)
        self.renderer = _PlantedRenderer(name)


class _PlantedPlugin:
    @hookimpl
    def ember_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec(n, factory=f"{__name__}:PlantedDevice", priority=-1000) for n in PLANTS]


@pytest.fixture(scope="module", autouse=True)
def planted_devices() -> Iterator[None]:
    """The planted devices, for this module only (other tests list devices)."""
    register_plugin(_PlantedPlugin(), "fuzz-planted-bugs")
    yield
    Device.unregister_plugin("fuzz-planted-bugs")


POOL = ("float32", "float32", "float16", "int32", "bool")


def _mismatches(device: str, seeds: range, grad: bool = False) -> list[fuzz.CheckResult]:
    graphs = [fuzz.generate(s, pool=POOL, grad=grad, size=6) for s in seeds]
    return [r for r in fuzz.check_many(graphs, device, grad=grad) if not r.ok]


def test_a_correct_device_passes() -> None:
    assert _mismatches("FUZZ_CLEAN", range(40)) == []
    assert _mismatches("FUZZ_CLEAN", range(100, 115), grad=True) == []


@pytest.mark.parametrize("device,marker", [("FUZZ_CMP_BUG", None), ("FUZZ_F16_BUG", "float16")])
def test_planted_bug_is_found_and_shrunk(device: str, marker: str | None) -> None:
    """Forward graphs find each planted bug; the first one shrinks to a few lines that still fail."""
    found = _mismatches(device, range(40))
    assert found, f"40 random graphs did not notice the bug planted in {device}"
    small = fuzz.shrink(found[0].graph, device)
    result = fuzz.check(small, device)
    assert not result.ok and len(small.nodes) <= len(found[0].graph.nodes)
    ops = [n for n in small.nodes if n.expr != "input"]
    assert 1 <= len(ops) <= 4, small.source()
    if marker is not None:
        assert marker in small.source(), small.source()
    assert "--- reproducer ---" in result.report()


def test_planted_comparison_bug_is_found_by_gradients() -> None:
    assert _mismatches("FUZZ_CMP_BUG", range(200, 230), grad=True)


def test_reproducer_runs_and_shows_the_difference() -> None:
    found = _mismatches("FUZZ_F16_BUG", range(40))
    script = fuzz.reproducer(fuzz.shrink(found[0].graph, "FUZZ_F16_BUG"), "FUZZ_F16_BUG")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script, "<reproducer>", "exec"), {})
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["FUZZ_F16_BUG", "PYTHON"]
    assert lines[0].split(None, 1)[1] != lines[1].split(None, 1)[1]


def test_graphs_are_reproducible_from_the_seed() -> None:
    a, b = fuzz.generate(1234), fuzz.generate(1234)
    assert a.source() == b.source() and a.outputs == b.outputs
    assert all(np.array_equal(fuzz.input_array(a, i), fuzz.input_array(b, i), equal_nan=True) for i in a.inputs())
    assert fuzz.generate(1235).source() != a.source()
    # every op family appears somewhere in a few hundred graphs
    text = "\n".join(fuzz.generate(s).source() for s in range(300))
    for needle in (".exp()", ".sin()", " @ ", ".cast(", ".sum(", ".max(", ".cumsum(", ".where(", ".reshape",
                   ".permute", ".expand", ".pad(", ".shrink(", ".flip(", " < ", " // ", ".argmax("):
        assert needle in text, f"no {needle!r} in 300 graphs"


def test_gradient_graphs_only_hold_float_tensors() -> None:
    for s in range(50):
        g = fuzz.generate(s, grad=True)
        assert all(n.dtype in ("float32", "float16", "bfloat16", "float64") for n in g.nodes), g.source()


def test_mismatch_tolerances() -> None:
    f = np.array([1.0, np.nan, np.inf, -0.0], np.float32)
    assert fuzz.mismatch(f, f.copy(), "float32") is None
    assert fuzz.mismatch(f * (1 + 1e-6), f, "float32") is None
    assert fuzz.mismatch(np.array([1.0, np.nan, -np.inf, 0.0], np.float32), f, "float32") is not None
    assert fuzz.mismatch(np.array([1.01], np.float32), np.array([1.0], np.float32), "float32") is not None
    assert fuzz.mismatch(np.array([1.01], np.float32), np.array([1.0], np.float32), "float16") is None
    assert fuzz.mismatch(np.array([3], np.int32), np.array([4], np.int32), "int32") is not None
    assert fuzz.mismatch(np.zeros((2, 3)), np.zeros((3, 2)), "float32") == "shape (2, 3) != (3, 2)"


def test_a_crash_on_one_side_is_a_finding() -> None:
    g = fuzz.generate(5)
    ok = fuzz.Evaluation([np.zeros(1)], ["float32"])
    broken = fuzz.Evaluation(error=RuntimeError("kernel failed"))
    assert fuzz.compare(g, broken, ok) == ["device raised RuntimeError: kernel failed"]
    assert fuzz.compare(g, broken, fuzz.Evaluation(error=RuntimeError("same"))) == []


def test_numpy_oracle_covers_float_graphs() -> None:
    graphs = [fuzz.generate(s, pool=("float32",)) for s in range(60)]
    covered = [g for g in graphs if fuzz.evaluate_numpy(g) is not None]
    assert len(covered) >= 20
    for g in covered[:10]:
        ours = fuzz.evaluate(g, "PYTHON")
        assert fuzz.compare(g, ours, ours, fuzz.evaluate_numpy(g)) == [], g.source()
    x = Tensor(np.float32(2.0)).cast(dtypes.float16)
    assert x.dtype == dtypes.float16
