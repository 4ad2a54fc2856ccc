"""Device plugin discovery and the Device registry, tested on isolated registries with fake plugins."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import ember.device
from ember.device import (
    PLUGIN_API,
    DeviceNotFoundError,
    DevicePluginError,
    DeviceSpec,
    DeviceUnavailableError,
    hookimpl,
)
from ember.device.registry import _DeviceRegistry, canonicalize

CORE_DIR = pathlib.Path(ember.__file__).resolve().parent.parent


class FakeDevice:
    """A stand-in device object: it only remembers the name it was created with."""

    created: list[str] = []

    def __init__(self, name: str):
        self.device = name
        FakeDevice.created.append(name)


class ExplodingDevice:
    """A device whose constructor fails, as a driver error would."""

    def __init__(self, name: str):
        raise OSError(f"cannot open {name}")


FAKE_FACTORY = f"{__name__}:FakeDevice"


class FakeDist:
    """Just enough of importlib.metadata.Distribution for the registry."""

    def __init__(self, name: str, version: str):
        self.name, self.version, self.metadata = name, version, {"Name": name}


class FakeEntryPoint:
    """An entry point whose load() runs ``loader``."""

    def __init__(self, name: str, loader: Callable[[], Any], dist: FakeDist | None = None, value: str = "fake.mod"):
        self.name, self.value, self.dist, self._loader = name, value, dist, loader

    def load(self) -> Any:
        return self._loader()


def make_plugin(*specs: DeviceSpec, header: list[str] | None = None) -> Any:
    """A plugin object whose ember_devices returns ``specs`` (and optionally a report header)."""

    class Plugin:
        @hookimpl
        def ember_devices(self) -> list[DeviceSpec]:
            return list(specs)

    if header is not None:
        Plugin.ember_report_header = hookimpl(lambda self: header)  # type: ignore[attr-defined]
    return Plugin()


def good_ep(name: str = "fake", *specs: DeviceSpec) -> FakeEntryPoint:
    specs = specs or (DeviceSpec("FAKE", FAKE_FACTORY, priority=10),)
    return FakeEntryPoint(name, lambda: make_plugin(*specs), FakeDist(f"ember-{name}", "0.1.0"))


def broken_ep(name: str, error: BaseException, dist: str = "ember-broken", version: str = "9.9.1") -> FakeEntryPoint:
    def load() -> Any:
        raise error

    return FakeEntryPoint(name, load, FakeDist(dist, version), value=f"{dist.replace('-', '_')}.plugin")


@pytest.fixture(autouse=True)
def _no_dev_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEV", raising=False)


# ----- broken plugins -----

def test_broken_entry_point_is_contained_and_raised_on_request() -> None:
    original = ImportError("libbroken.so: cannot open shared object file")
    reg = _DeviceRegistry(entry_points=[broken_ep("broken", original), good_ep()])
    assert set(reg.specs()) == {"PYTHON", "DISK", "FAKE"}
    assert reg["FAKE"].device == "FAKE"
    with pytest.raises(DevicePluginError) as info:
        reg["broken"]
    message = str(info.value)
    assert "ember-broken==9.9.1" in message and "BROKEN" in message and "libbroken.so" in message
    assert info.value.__cause__ is original
    (failure,) = reg.failures()
    assert failure.stage == "import" and failure.error is original and failure.origin.dist == "ember-broken"


def test_broken_first_party_plugin_matched_by_distribution() -> None:
    reg = _DeviceRegistry(entry_points=[broken_ep("whatever", ModuleNotFoundError("No module named 'x'"), "ember-cpu")])
    with pytest.raises(DevicePluginError, match="ember-cpu") as info:
        reg["cpu"]
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_plugin_whose_hook_raises_is_contained() -> None:
    class Plugin:
        @hookimpl
        def ember_devices(self) -> list[DeviceSpec]:
            raise RuntimeError("driver table corrupt")

    reg = _DeviceRegistry(entry_points=[FakeEntryPoint("bad", Plugin, FakeDist("ember-bad", "1.0")), good_ep()])
    assert "FAKE" in reg.specs()
    with pytest.raises(DevicePluginError, match="ember-bad==1.0") as info:
        reg["BAD"]
    assert str(info.value.__cause__) == "driver table corrupt"
    assert [f.stage for f in reg.failures()] == ["ember_devices"]


def test_hook_returning_garbage_is_recorded() -> None:
    class Plugin:
        @hookimpl
        def ember_devices(self) -> Any:
            return ["CPU"]

    reg = _DeviceRegistry(entry_points=[FakeEntryPoint("junk", Plugin, FakeDist("ember-junk", "1.0"))])
    (failure,) = reg.failures()
    assert isinstance(failure.error, TypeError) and "list of DeviceSpec" in str(failure.error)


def test_entry_point_without_required_hook_is_recorded() -> None:
    reg = _DeviceRegistry(entry_points=[FakeEntryPoint("empty", lambda: object(), FakeDist("ember-empty", "1.0"))])
    (failure,) = reg.failures()
    assert failure.stage == "register" and "ember_devices" in str(failure.error)
    assert set(reg.specs()) == {"PYTHON", "DISK"}


def test_import_ember_survives_a_broken_installed_distribution(tmp_path: pathlib.Path) -> None:
    """Real discovery through importlib.metadata: a dist-info whose entry point module raises on import."""
    dist_info = tmp_path / "ember_brokenx-1.2.3.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: ember-brokenx\nVersion: 1.2.3\n")
    (dist_info / "entry_points.txt").write_text("[ember.devices]\nbrokenx = ember_brokenx_plugin\n")
    (tmp_path / "ember_brokenx_plugin.py").write_text("raise ImportError('missing libbrokenx')\n")
    script = textwrap.dedent("""
        import ember.device as d
        assert "PYTHON" in d.Device.specs()
        try:
            d.Device["brokenx"]
        except d.DevicePluginError as e:
            print("RAISED", e)
            print("CAUSE", repr(e.__cause__))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CORE_DIR)])}
    env.pop("DEV", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RAISED" in out.stdout and "ember-brokenx==1.2.3" in out.stdout
    assert "CAUSE ImportError('missing libbrokenx')" in out.stdout


# ----- errors for missing, incompatible and unusable devices -----

def test_unknown_first_party_device_names_the_extra() -> None:
    reg = _DeviceRegistry(entry_points=[good_ep()])
    with pytest.raises(DeviceNotFoundError) as info:
        reg["cl"]
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert '"CL"' in message and "FAKE, PYTHON" in message
    assert 'pip install "ember[opencl]"' in message and "ember-opencl" in message


def test_unknown_third_party_device() -> None:
    reg = _DeviceRegistry(entry_points=[])
    with pytest.raises(DeviceNotFoundError, match="third-party") as info:
        reg["TPU"]
    assert '"TPU"' in str(info.value) and "PYTHON" in str(info.value) and "pip install" not in str(info.value)


def test_unknown_device_message_lists_broken_plugins() -> None:
    reg = _DeviceRegistry(entry_points=[broken_ep("other", ImportError("nope"))])
    with pytest.raises(DeviceNotFoundError, match="ember-broken==9.9.1"):
        reg["CUDA"]


def test_incompatible_plugin_api() -> None:
    old = DeviceSpec("OLD", FAKE_FACTORY, priority=1000, plugin_api=PLUGIN_API + 1)
    reg = _DeviceRegistry(entry_points=[good_ep("old", old), good_ep()])
    assert "OLD" in reg.specs()
    assert "incompatible" in (reg.probe("OLD") or "")
    with pytest.raises(DevicePluginError, match=f"plugin API {PLUGIN_API + 1}"):
        reg["OLD"]
    with pytest.warns(UserWarning, match="OLD"):
        assert reg.DEFAULT == "FAKE"
    assert "OLD" not in reg.available()


def test_probe_failing_device() -> None:
    gpu = DeviceSpec("GPU", FAKE_FACTORY, priority=50, probe=lambda: "no GPU visible (driver not loaded)")
    reg = _DeviceRegistry(entry_points=[good_ep("gpu", gpu)])
    assert reg.probe("gpu") == "no GPU visible (driver not loaded)"
    with pytest.raises(DeviceUnavailableError, match="driver not loaded"):
        reg["GPU:1"]
    assert reg.available() == ["PYTHON"]


def test_probe_that_raises_counts_as_unusable() -> None:
    def probe() -> str | None:
        raise OSError("ioctl failed")

    reg = _DeviceRegistry(entry_points=[good_ep("x", DeviceSpec("X", FAKE_FACTORY, probe=probe))])
    assert reg.probe("X") == "probe raised OSError: ioctl failed"


def test_factory_import_failure_and_constructor_failure() -> None:
    specs = (DeviceSpec("NOMOD", "ember_no_such_module:Dev"), DeviceSpec("BOOM", f"{__name__}:ExplodingDevice"))
    reg = _DeviceRegistry(entry_points=[good_ep("multi", *specs)])
    with pytest.raises(DevicePluginError, match="ember_no_such_module") as info:
        reg["NOMOD"]
    assert isinstance(info.value.__cause__, ImportError)
    with pytest.raises(DevicePluginError, match="cannot open BOOM:2") as info:
        reg["boom:2"]
    assert isinstance(info.value.__cause__, OSError)


def test_probe_of_unknown_device_returns_a_reason() -> None:
    reg = _DeviceRegistry(entry_points=[])
    assert "not installed" in (reg.probe("NOPE") or "")


# ----- names and device objects -----

@pytest.mark.parametrize("raw, canonical", [
    ("cpu", "CPU"), ("CPU", "CPU"), ("CPU:0", "CPU"), ("cuda:1", "CUDA:1"), (" cl ", "CL"),
    ("disk:/tmp/Weights.bin", "DISK:/tmp/Weights.bin"),
])
def test_canonicalize(raw: str, canonical: str) -> None:
    assert canonicalize(raw) == canonical
    assert _DeviceRegistry.canonicalize(raw) == canonical
    assert ember.device.Device.canonicalize(raw) == canonical


def test_device_objects_are_cached_per_canonical_name() -> None:
    reg = _DeviceRegistry(entry_points=[good_ep()])
    first = reg["FAKE"]
    assert reg["fake"] is first and reg["FAKE:0"] is first
    second = reg["fake:1"]
    assert second is not first and second.device == "FAKE:1"


@pytest.mark.parametrize("name", ["cpu", "CPU:1", "", "1CPU", "C-PU", "CP U"])
def test_spec_rejects_bad_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid device name"):
        DeviceSpec(name, FAKE_FACTORY)


@pytest.mark.parametrize("factory", ["module.Class", "module:", ":Class", "a b:C"])
def test_spec_rejects_bad_factories(factory: str) -> None:
    with pytest.raises(ValueError, match="factory"):
        DeviceSpec("OK", factory)


def test_spec_is_frozen_with_defaults() -> None:
    spec = DeviceSpec("OK", FAKE_FACTORY)
    assert (spec.priority, spec.plugin_api, spec.probe, spec.extra, spec.description) == (0, PLUGIN_API, None, None, "")
    with pytest.raises(AttributeError):
        spec.name = "NO"  # type: ignore[misc]


def test_name_declared_by_two_distributions_is_an_error_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _DeviceRegistry(entry_points=[good_ep("one"), good_ep("two")])
    with pytest.raises(DevicePluginError, match="ember-one==0.1.0 and ember-two==0.1.0.*EMBER_PLUGIN_FAKE"):
        reg["FAKE"]
    assert "FAKE" not in reg.available()
    monkeypatch.setenv("EMBER_PLUGIN_FAKE", "ember-two")  # the user's choice
    reg = _DeviceRegistry(entry_points=[good_ep("one"), good_ep("two")])
    assert reg.origin("FAKE").dist == "ember-two" and reg["FAKE"].device == "FAKE"
    (failure,) = reg.failures()
    assert failure.stage == "conflict" and failure.origin.dist == "ember-one"


def test_plugin_cannot_shadow_a_builtin() -> None:
    reg = _DeviceRegistry(entry_points=[good_ep("py", DeviceSpec("PYTHON", FAKE_FACTORY, priority=99))])
    assert reg.origin("PYTHON").label == "built-in"
    assert reg.specs()["PYTHON"].priority == -100


# ----- in-process registration -----

def test_register_plugin_in_process() -> None:
    reg = _DeviceRegistry(entry_points=[])
    reg.register_plugin(make_plugin(DeviceSpec("MINE", FAKE_FACTORY)), "mine")
    assert reg["mine"].device == "MINE"
    assert reg.origin("MINE").label == "in-process plugin 'mine'"
    with pytest.raises(ValueError):
        reg.register_plugin(make_plugin(), "mine")
    with pytest.raises(TypeError, match="ember_devices"):
        reg.register_plugin(object(), "nothing")
    reg.unregister_plugin("mine")
    assert "MINE" not in reg.specs()


def test_load_entry_point_after_discovery() -> None:
    reg = _DeviceRegistry(entry_points=[])
    assert reg.specs().keys() == {"PYTHON", "DISK"}
    assert reg.load_entry_point(good_ep()) is True
    assert "FAKE" in reg.specs()
    assert reg.load_entry_point(broken_ep("late", ImportError("late failure"))) is False
    with pytest.raises(DevicePluginError, match="late failure"):
        reg["LATE"]


def test_report_header() -> None:
    class Failing:
        @hookimpl
        def ember_devices(self) -> list[DeviceSpec]:
            return []

        @hookimpl
        def ember_report_header(self) -> list[str]:
            raise ValueError("no version")

    reg = _DeviceRegistry(entry_points=[
        FakeEntryPoint("hdr", lambda: make_plugin(header=["driver 1.2"]), FakeDist("ember-hdr", "0.1.0")),
        FakeEntryPoint("bad", Failing, FakeDist("ember-bad", "0.1.0")),
    ])
    headers = {origin.label: lines for origin, lines in reg.report_header().items()}
    assert headers["ember-hdr==0.1.0"] == ["driver 1.2"]
    assert headers["ember-bad==0.1.0"] == ["ember_report_header failed: ValueError: no version"]


# ----- the default device -----

def _priority_registry() -> _DeviceRegistry:
    specs = (
        DeviceSpec("HIGH", FAKE_FACTORY, priority=50, probe=lambda: "no hardware"),
        DeviceSpec("MID", FAKE_FACTORY, priority=10),
        DeviceSpec("LOW", FAKE_FACTORY, priority=1),
    )
    return _DeviceRegistry(entry_points=[good_ep("prio", *specs)])


def test_default_is_highest_usable_priority_and_warns_about_skipped() -> None:
    reg = _priority_registry()
    with pytest.warns(UserWarning, match="HIGH.*no hardware"):
        assert reg.DEFAULT == "MID"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reg.DEFAULT == "MID"  # cached: warns once
    assert reg.available() == ["MID", "LOW", "PYTHON"]


@pytest.mark.parametrize("dev, expected", [("low", "LOW"), ("LOW:1", "LOW:1"), ("python", "PYTHON"), ("MID:0", "MID")])
def test_dev_env_selects_explicitly(monkeypatch: pytest.MonkeyPatch, dev: str, expected: str) -> None:
    monkeypatch.setenv("DEV", dev)
    reg = _priority_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit choice is not second-guessed
        assert reg.DEFAULT == expected


def test_dev_env_never_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _priority_registry()
    monkeypatch.setenv("DEV", "HIGH")
    with pytest.raises(DeviceUnavailableError, match="no hardware"):
        _ = reg.DEFAULT
    monkeypatch.setenv("DEV", "CL")
    with pytest.raises(DeviceNotFoundError, match=r'ember\[opencl\]'):
        _ = reg.DEFAULT
    monkeypatch.setenv("DEV", "low")  # the env is re-read when it changes
    assert reg.DEFAULT == "LOW"


def test_python_is_the_last_resort_with_a_warning() -> None:
    reg = _DeviceRegistry(entry_points=[broken_ep("cpu", ImportError("no cpu"), "ember-cpu")])
    with pytest.warns(UserWarning) as record:
        assert reg.DEFAULT == "PYTHON"
    message = str(record[0].message)
    assert "slow" in message and 'pip install "ember[cpu]"' in message and "ember-cpu==9.9.1" in message


def test_default_setter() -> None:
    reg = _priority_registry()
    reg.DEFAULT = "low:1"
    assert reg.DEFAULT == "LOW:1"
    with pytest.raises(DeviceNotFoundError):
        reg.DEFAULT = "nope"
    with pytest.raises(DeviceUnavailableError):
        reg.DEFAULT = "HIGH"
    assert reg.DEFAULT == "LOW:1"
    reg.DEFAULT = None
    with pytest.warns(UserWarning):
        assert reg.DEFAULT == "MID"


def test_no_usable_device_at_all() -> None:
    reg = _DeviceRegistry(entry_points=[], builtins=False)
    with pytest.raises(DeviceNotFoundError, match="no usable device"):
        _ = reg.DEFAULT


# ----- the global registry and the doctor -----

def test_global_registry_and_exports() -> None:
    from ember.device import Device, hookspec

    assert "PYTHON" in Device.specs()
    assert Device.origin("PYTHON").label == "built-in"
    assert callable(hookspec) and isinstance(Device, _DeviceRegistry)


def test_doctor_reports_every_plugin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import ember.doctor

    gpu = DeviceSpec("GPU", FAKE_FACTORY, priority=50, probe=lambda: "no GPU here")
    reg = _DeviceRegistry(entry_points=[
        good_ep("gpu", gpu), good_ep(), broken_ep("cpu", ImportError("no libcpu"), "ember-cpu", "0.1.0"),
        FakeEntryPoint("hdr", lambda: make_plugin(header=["compiler x 1.0"]), FakeDist("ember-hdr", "0.1.0")),
    ])
    monkeypatch.setattr(ember.doctor, "Device", reg)
    monkeypatch.setattr(ember.doctor, "smoke_test", lambda device: None if device == "FAKE" else "boom")
    assert ember.doctor.report() == 0  # the in-process part (main() runs it in a child process)
    out = capsys.readouterr().out
    assert "GPU" in out and "unusable: no GPU here" in out
    assert "ember-cpu==0.1.0" in out and "broken (import): ImportError: no libcpu" in out
    assert "[ember-hdr==0.1.0] compiler x 1.0" in out
    assert "default device: FAKE" in out
    assert "PYTHON   FAILED: boom" in out


def test_doctor_runs_as_a_module() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CORE_DIR), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "ember.doctor"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert "PYTHON" in out.stdout and "smoke test" in out.stdout


# ----- a real pip install of a broken distribution (slow) -----

@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("EMBER_SLOW_TESTS") != "1", reason="set EMBER_SLOW_TESTS=1 to run")
def test_pip_installed_broken_plugin(tmp_path: pathlib.Path) -> None:
    project = tmp_path / "ember-bogus"
    (project / "ember_bogus").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n')
    (project / "setup.cfg").write_text(textwrap.dedent("""
        [metadata]
        name = ember-bogus
        version = 0.0.1
        [options]
        packages = ember_bogus
        [options.entry_points]
        ember.devices =
            bogus = ember_bogus.plugin
    """))
    (project / "ember_bogus" / "__init__.py").write_text("")
    (project / "ember_bogus" / "plugin.py").write_text("import ember_bogus_missing_dependency\n")
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--target", str(target)]
    subprocess.run([*pip, str(project)], check=True, capture_output=True, timeout=600)
    script = ("import ember.device as d\n"
              "try:\n    d.Device['BOGUS']\n"
              "except d.DevicePluginError as e:\n    print('RAISED', e, '|', type(e.__cause__).__name__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(CORE_DIR)])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ember-bogus==0.0.1" in out.stdout and "| ModuleNotFoundError" in out.stdout
