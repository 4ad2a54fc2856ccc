"""The random-graph fuzzer (``ember.testing.fuzz``) finds planted bugs, stays quiet on a correct device, and
prints reproducers that run.

The planted bugs live in small in-process devices built on the PYTHON interpreter (no compiler needed):
its program text is edited after rendering, the way a miscompiling backend would produce it.
"""
from __future__ import annotations

import contextlib
import io
import math
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


def test_integers_cast_from_computed_floats_get_the_floats_tolerance() -> None:
    # a float32 sum rounded differently on two devices (another order, a fused multiply-add) is 1 ulp apart: 64
    # at 8e8; cast to an integer, that difference stays, and near an integer it becomes a difference of 1
    Node = fuzz.Node
    g = fuzz.FuzzGraph(0, (Node("input", shape=(3,)), Node("({0} * 2)", (0,), shape=(3,)),
                           Node("{0}.cast(dtypes.int64)", (1,), shape=(3,), dtype="int64"),
                           Node("({0} + 1)", (2,), shape=(3,), dtype="int64"),
                           Node("{0}.cast(dtypes.int64)", (0,), shape=(3,), dtype="int64")), (3, 4))

    def problems(computed: list[int], want: list[int], from_input: list[int] | None = None) -> list[str]:
        w = np.array(want, np.int64)
        got = [np.array(computed, np.int64), np.array(from_input if from_input is not None else want, np.int64)]
        return fuzz.compare(g, fuzz.Evaluation(got, ["int64"] * 2), fuzz.Evaluation([w, w], ["int64"] * 2))

    assert problems([791853056, 1], [791852992, 1]) == []
    assert problems([792852992, 1], [791852992, 1]) != []  # 1e6 apart: beyond float32's tolerance
    assert problems([3, -5, 7], [2, -5, 7]) == []  # the float was on the other side of 3.0
    assert problems([4, -5, 7], [2, -5, 7]) != []
    assert problems([2, -5, 7], [2, -5, 7], from_input=[3, -5, 7]) != []  # cast straight from an input: exact


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


def test_new_families_appear_and_large_ones_only_when_asked() -> None:
    text = "\n".join(fuzz.generate(s).source() for s in range(200))
    for needle in ("Tensor.full(", ".expand(", " // 1)", " % 0.5)", " // -1.5)", " % 3)"):
        assert needle in text, f"no {needle!r} in 200 graphs"
    assert any(line.count("(") >= 10 for line in text.splitlines()), "no chain in 200 graphs"
    assert ", 4096, " not in text and ", 8192, " not in text and ", 16384, " not in text
    large = [fuzz.generate(s, large=True) for s in range(30)]
    big = [n for g in large for n in g.nodes if ").sum((1, 2))" in n.expr or ").max((1, 2))" in n.expr
           or ").mean((1, 2))" in n.expr]
    assert big and all(g.large for g in large)
    # the expanded tensor has more than 2**24 elements; only the reduced one is kept
    n, rows, cols = (int(x) for x in big[0].expr.split(".expand(")[1].split(")")[0].split(", "))
    assert n * rows * cols > 2 ** 24 and math.prod(big[0].shape) <= 4096


def test_numpy_twin_covers_each_output_it_can() -> None:
    """An output with a numpy twin is checked against numpy even when another output of the graph has none:
    the twin is the only check that does not share ember's rewrite rules."""
    covered = 0
    for s in range(120):
        g = fuzz.generate(s)
        twins = fuzz.evaluate_numpy(g)
        if twins is None:
            continue
        covered += 1
        for o, twin in zip(g.outputs, twins):
            assert twin is None or twin.shape == g.nodes[o].shape
    assert covered >= 30


def test_float_divmod_twins_follow_floor_semantics() -> None:
    """The numpy twins of ``//`` and ``%`` by constants are Python's (and torch's) floor division."""
    x = np.array([6.75, -2.25, 0.5, -0.5])
    assert np.floor_divide(x, 1).tolist() == [6.0, -3.0, 0.0, -1.0]
    assert np.mod(x, 1).tolist() == [0.75, 0.75, 0.5, 0.5]
    assert np.mod(x, -1.5).tolist() == [x_ % -1.5 for x_ in x.tolist()]


def test_fuzz_seed_option_and_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.testing import plugin

    class Config:
        def __init__(self, seed: str | None, large: bool | None = None):
            self.opts = {"--fuzz-seed": seed, "--fuzz-large": large}

        def getoption(self, name: str, default: object = None) -> object:
            return self.opts.get(name, default)

    monkeypatch.delenv(plugin.SEED_ENV, raising=False)
    monkeypatch.delenv(plugin.LARGE_ENV, raising=False)
    assert plugin.fuzz_seed(Config(None)) == 0 and plugin.pytest_report_header(Config(None)) is None  # type: ignore[arg-type]
    assert plugin.fuzz_seed(Config("1234")) == 1234  # type: ignore[arg-type]
    cfg = Config("random")
    first = plugin.fuzz_seed(cfg)  # type: ignore[arg-type]
    assert plugin.fuzz_seed(cfg) == first  # type: ignore[arg-type]  # drawn once per session
    assert f"--fuzz-seed={first}" in plugin.pytest_report_header(cfg)  # type: ignore[arg-type,operator]
    monkeypatch.setenv(plugin.SEED_ENV, "77")
    monkeypatch.setenv(plugin.LARGE_ENV, "1")
    assert plugin.fuzz_seed(Config(None)) == 77 and plugin.fuzz_large(Config(None))  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="--fuzz-seed"):
        plugin.fuzz_seed(Config("abc"))  # type: ignore[arg-type]


_PLANTED_RULE_SCRIPT = """
import ember.ir.symbolic as sym
from ember.ir.pattern import PatternMatcher, UPat
from ember.ir.uop import Ops, UOp
# the fold that once hid in the rules: x % 1 -> 0 for floats (the device and the reference share it)
wrong = (UPat(Ops.MOD, src=(UPat.var("x"), UPat(Ops.CONST, arg=1)), name="m"), lambda x, m: UOp.const(m.dtype, 0))
sym.symbolic = PatternMatcher([wrong] + sym.symbolic.rules)
from ember.testing import fuzz
graphs = [fuzz.generate(s, size=3 + s % 6) for s in SEEDS]
print(sum(not r.ok for r in fuzz.check_many(graphs, "PYTHON")))
"""


def test_a_wrong_rule_shared_by_both_devices_is_found_by_the_numpy_twins(tmp_path) -> None:
    import os
    import subprocess
    import sys

    def numpy_checks_a_mod_1(g) -> bool:  # some `x % 1` node of the graph has a numpy value
        vals = fuzz.numpy_values(g)
        return any(" % 1)" in n.expr and vals[i] is not None for i, n in enumerate(g.nodes))

    seeds = [s for s in range(600) if " % 1)" in (g := fuzz.generate(s, size=3 + s % 6)).source()
             and fuzz.evaluate_numpy(g) is not None and numpy_checks_a_mod_1(g)][:4]
    assert seeds
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path)}  # a fresh process and cache: no kernel built before
    out = subprocess.run([sys.executable, "-c", _PLANTED_RULE_SCRIPT.replace("SEEDS", repr(seeds))], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 1, f"the planted rule passed the fuzzer on seeds {seeds}"
