"""ember.device.entry_points reads the installed plugins' entry points as importlib.metadata would; with DEV unset
no installed plugin can take the program down (segfault, os._exit, sys.exit, KeyboardInterrupt, hang) or take over
another distribution's device name."""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import textwrap
import time
import warnings
import zipfile
from typing import Any

import pytest

import ember
from ember.device import DevicePluginError, DeviceSpec, DeviceUnavailableError, hookimpl
from ember.device import entry_points as ep_mod
from ember.device.registry import _DeviceRegistry


def _as_tuples(eps: list) -> list[tuple[str, str, str, str]]:
    return sorted((e.name, e.value, e.dist.name, e.dist.version) for e in eps)


@pytest.mark.parametrize("group", ["ember.devices", "console_scripts", "pytest11"])
def test_the_installed_entry_points_match_importlib_metadata(group: str):
    ours = ep_mod.entry_points(group)
    assert _as_tuples(ours) == _as_tuples(list(importlib.metadata.entry_points(group=group)))


def _dist(root: pathlib.Path, folder: str, name: str, version: str, entry_points: str) -> None:
    d = root / folder
    d.mkdir(parents=True)
    meta = "METADATA" if folder.endswith(".dist-info") else "PKG-INFO"
    (d / meta).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nName: not-a-header\n")
    if entry_points:
        (d / "entry_points.txt").write_text(entry_points)


def test_folders_on_sys_path_are_read_and_the_first_of_a_name_wins(tmp_path: pathlib.Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    first, second = tmp_path / "first", tmp_path / "second"
    _dist(first, "my_plugin-1.0.dist-info", "my-plugin", "1.0",
          "# a comment\n[other]\nx = a:b\n\n[ember.test_group]\nfast = my_plugin.entry:hooks.impl\n")
    _dist(second, "my_plugin-2.0.dist-info", "my-plugin", "2.0", "[ember.test_group]\nshadowed = nope:x\n")
    _dist(second, "dev_thing.egg-info", "dev-thing", "0.3", "[ember.test_group]\ndev = dev_thing\n")
    _dist(second, "no_eps-1.0.dist-info", "no-eps", "1.0", "")
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(tmp_path / "missing")])
    found = ep_mod.entry_points("ember.test_group")
    assert _as_tuples(found) == [("dev", "dev_thing", "dev-thing", "0.3"),
                                 ("fast", "my_plugin.entry:hooks.impl", "my-plugin", "1.0")]
    (first / "ember_ep_test_module.py").write_text("class hooks:\n    impl = 7\n")
    fast = next(e for e in found if e.name == "fast")
    fast.value = "ember_ep_test_module:hooks.impl"
    assert fast.load() == 7 and fast.dist.metadata["Name"] == "my-plugin"
    sys.modules.pop("ember_ep_test_module", None)


def test_a_zip_on_sys_path_is_left_to_importlib_metadata(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\nVersion: 1.0\n")
        z.writestr("zipped-1.0.dist-info/entry_points.txt", "[ember.test_group]\nz = zipped.plugin\n")
    monkeypatch.setattr(sys, "path", [str(archive)])
    assert ep_mod._scan("ember.test_group") is None
    assert _as_tuples(ep_mod.entry_points("ember.test_group")) == [("z", "zipped.plugin", "zipped", "1.0")]


# --- plugins cannot take the program down (DEV unset: each plugin call is tried in a child first) -----------
guarded = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                             reason="plugin calls are tried in a forked child only where fork is safe (Linux)")
CORE_DIR = pathlib.Path(ember.__file__).resolve().parent.parent


class Made:
    """What a fake plugin's factory makes."""

    def __init__(self, name: str):
        self.device = name


def segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def hang() -> None:
    time.sleep(3600)


def interrupt() -> None:
    raise KeyboardInterrupt("from the plugin")


def exit_quietly() -> None:
    os._exit(0)


def exit_loudly() -> None:
    sys.exit(3)


BEHAVIOURS: dict[str, Any] = {"segfault": segfault, "os._exit(0)": exit_quietly, "sys.exit": exit_loudly,
                              "KeyboardInterrupt": interrupt, "hang": hang}
WHY = {"segfault": "crashed the process that ran it (SIGSEGV)", "os._exit(0)": "ended the process that ran it "
       "(exit status 0", "sys.exit": "raised SystemExit: 3", "KeyboardInterrupt": "raised KeyboardInterrupt: from "
       "the plugin", "hang": "did not return within 0.3 s"}


class FakeDist:
    def __init__(self, name: str):
        self.name, self.version, self.metadata = name, "1.0", {"Name": name}


class FakeEntryPoint:
    """An installed entry point whose import runs ``on_import`` and whose plugin's ``ember_devices()`` runs
    ``on_hook``, then returns ``specs``."""

    def __init__(self, name: str, dist: str, specs: tuple[DeviceSpec, ...], on_import: Any = None,
                 on_hook: Any = None):
        self.name, self.value, self.dist = name, f"{dist.replace('-', '_')}.plugin", FakeDist(dist)
        self.specs, self.on_import, self.on_hook = specs, on_import, on_hook

    def load(self) -> Any:
        if self.on_import is not None:
            self.on_import()
        specs, on_hook = self.specs, self.on_hook

        class Plugin:
            @hookimpl
            def ember_devices(self) -> list[DeviceSpec]:
                if on_hook is not None:
                    on_hook()
                return list(specs)
        return Plugin()


@pytest.fixture
def isolated(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """DEV unset, a short plugin time limit and a cache of the test's own (nothing remembered from elsewhere)."""
    monkeypatch.delenv("DEV", raising=False)
    monkeypatch.delenv("EMBER_PROBE_GUARD", raising=False)
    monkeypatch.setenv("EMBER_PLUGIN_TIMEOUT", "0.3")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _limit(monkeypatch: pytest.MonkeyPatch, behaviour: str) -> None:
    """The plugin time limit for ``behaviour``: short for a hang (the limit is what ends it), generous for a call
    that ends by itself (a crash or an exit), so that a slow child process on a loaded machine is not taken for
    a hang."""
    if behaviour != "hang":
        monkeypatch.setenv("EMBER_PLUGIN_TIMEOUT", "120")


def _default(reg: _DeviceRegistry) -> tuple[str, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.monotonic()
        default = reg.DEFAULT
        if os.environ.get("EMBER_PLUGIN_TIMEOUT") == "0.3":
            assert time.monotonic() - start < 8, "each plugin call is bounded by EMBER_PLUGIN_TIMEOUT"
    return default, [str(w.message) for w in caught]


GOOD = FakeEntryPoint("good", "good-dist", (DeviceSpec("GOOD", f"{__name__}:Made", priority=10),))


@guarded
@pytest.mark.parametrize("behaviour", list(BEHAVIOURS))
@pytest.mark.parametrize("stage", ["import", "ember_devices"])
def test_a_plugin_whose_import_or_hook_takes_the_process_down_is_broken_not_fatal(isolated, stage, behaviour,
                                                                                  monkeypatch):
    _limit(monkeypatch, behaviour)
    fn = BEHAVIOURS[behaviour]
    bad = FakeEntryPoint("bad", "bad-dist", (DeviceSpec("BAD", f"{__name__}:Made", priority=90),),
                         on_import=fn if stage == "import" else None, on_hook=fn if stage == "ember_devices" else None)
    reg = _DeviceRegistry(entry_points=[bad, GOOD])
    default, said = _default(reg)
    assert default == "GOOD"
    (failure,) = reg.failures()
    assert failure.origin.dist == "bad-dist" and failure.stage == stage, failure
    assert WHY[behaviour] in str(failure.error) and "bad-dist==1.0" in str(failure.error), failure.error
    assert any("bad-dist" in s for s in said), said
    assert "bad-dist" in reg.unsafe_plugins()[0]
    with pytest.raises(DevicePluginError, match="bad-dist"):
        reg["BAD"]


@guarded
@pytest.mark.parametrize("behaviour", list(BEHAVIOURS))
@pytest.mark.parametrize("stage", ["precheck", "probe", "factory"])
def test_a_device_whose_precheck_probe_or_factory_takes_the_process_down_is_skipped(isolated, stage, behaviour,
                                                                                     monkeypatch):
    _limit(monkeypatch, behaviour)
    fn = BEHAVIOURS[behaviour]
    monkeypatch.setattr(sys.modules[__name__], "_factory_behaviour", fn)
    spec = DeviceSpec("BAD", f"{__name__}:{'made_badly' if stage == 'factory' else 'Made'}", priority=90,
                      precheck=fn if stage == "precheck" else None, probe=fn if stage == "probe" else None)
    reg = _DeviceRegistry(entry_points=[FakeEntryPoint("bad", "bad-dist", (spec,)), GOOD])
    default, said = _default(reg)
    assert default == "GOOD"
    reason = reg.probe("BAD")
    what = {"precheck": "the precheck of", "probe": "the probe of", "factory": "creating"}[stage]
    assert reason is not None and f"{what} device BAD (bad-dist==1.0)" in reason and WHY[behaviour] in reason, reason
    assert any("BAD (bad-dist==1.0)" in s and WHY[behaviour] in s for s in said), said
    assert reg.unsafe_plugins() == [reason]
    with pytest.raises(DeviceUnavailableError, match="bad-dist"):
        reg["BAD"]


def made_badly(name: str) -> Any:
    return _factory_behaviour()


_factory_behaviour: Any = None


@guarded
def test_a_clean_run_is_remembered_so_a_warm_start_forks_nothing(isolated, monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    spec = DeviceSpec("FINE", f"{__name__}:Made", priority=10, precheck=lambda: calls.append("precheck"),
                      probe=lambda: calls.append("probe"))
    ep = FakeEntryPoint("fine", "fine-dist", (spec,))
    assert _default(_DeviceRegistry(entry_points=[ep]))[0] == "FINE"
    assert calls == ["precheck", "probe"], "tried in a child, then run here once"
    with monkeypatch.context() as m:
        m.setattr(os, "fork", lambda: pytest.fail("forked again for a plugin that passed"))
        assert _default(_DeviceRegistry(entry_points=[ep]))[0] == "FINE"
    monkeypatch.setenv("FINE_DRIVER_MODE", "other")  # what a plugin sees changed: tried again
    forks: list[int] = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    assert _default(_DeviceRegistry(entry_points=[ep]))[0] == "FINE"
    assert len(forks) == 1, "one child imports the plugin and tries its device"


@guarded
def test_an_explicit_dev_runs_the_plugin_in_this_process(isolated, monkeypatch: pytest.MonkeyPatch):
    """DEV=X asks for X: its plugin runs here, as before (no child, no fallback)."""
    monkeypatch.setenv("DEV", "GOOD")
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked with DEV set"))
    reg = _DeviceRegistry(entry_points=[GOOD])
    assert reg.DEFAULT == "GOOD" and reg["GOOD"].device == "GOOD"


def test_a_third_party_entry_point_named_cpu_is_a_conflict_not_a_takeover(isolated, monkeypatch: pytest.MonkeyPatch):
    """Two distributions with an entry point named ``cpu`` that both declare CPU: the documented conflict error
    naming both (whichever comes first on sys.path), until EMBER_PLUGIN_CPU picks one."""
    mine = FakeEntryPoint("cpu", "ember-cpu", (DeviceSpec("CPU", f"{__name__}:Made", priority=10),))
    theirs = FakeEntryPoint("cpu", "evil-cpu", (DeviceSpec("CPU", f"{__name__}:Made", priority=99),))
    for order in ([theirs, mine], [mine, theirs]):
        reg = _DeviceRegistry(entry_points=order)
        with pytest.raises(DevicePluginError, match="declared by more than one distribution: .*EMBER_PLUGIN_CPU="):
            reg["CPU"]
        assert "evil-cpu" in str(reg.probe("CPU")) and "ember-cpu" in str(reg.probe("CPU"))
        assert _default(reg)[0] == "PYTHON", "no silent choice of either"
    monkeypatch.setenv("EMBER_PLUGIN_CPU", "ember-cpu")
    reg = _DeviceRegistry(entry_points=[theirs, mine])
    assert reg["CPU"].device == "CPU" and reg.origin("CPU").dist == "ember-cpu"


def _installed(root: pathlib.Path, dist: str, module: str, entry: str, body: str) -> None:
    _dist(root, f"{dist.replace('-', '_')}-0.1.dist-info", dist, "0.1", f"[ember.devices]\n{entry} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(body))


@guarded
def test_installed_plugins_that_crash_exit_or_hang_leave_the_first_step_alone(tmp_path: pathlib.Path):
    """End to end, in fresh processes: installed distributions that segfault at import, exit quietly in their
    probe and hang in their factory, plus one that claims the name ``cpu``; a training step still runs on the
    next usable device, and the program's own exit status is its own."""
    _installed(tmp_path, "crash-at-import", "crash_at_import", "crashimp", "import ctypes\nctypes.string_at(0)\n")
    _installed(tmp_path, "exit-in-probe", "exit_in_probe", "exitprobe", """
        import os
        from ember.device import DeviceSpec, hookimpl

        @hookimpl
        def ember_devices():
            return [DeviceSpec("EXITP", "exit_in_probe:X", priority=1000, probe=lambda: os._exit(0))]
    """)
    _installed(tmp_path, "hang-in-factory", "hang_in_factory", "hangfac", """
        import time
        from ember.device import DeviceSpec, hookimpl

        def make(name):
            time.sleep(3600)

        @hookimpl
        def ember_devices():
            return [DeviceSpec("HANGF", "hang_in_factory:make", priority=999)]
    """)
    _installed(tmp_path, "evil-cpu", "evil_cpu", "cpu", """
        from ember.device import DeviceSpec, hookimpl

        @hookimpl
        def ember_devices():
            return [DeviceSpec("CPU", "evil_cpu:X", priority=998)]
    """)
    # the limit ends the hanging factory; it is long enough that the crashing plugins' children end (and are named)
    # before it on a loaded machine
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CORE_DIR), *sys.path]),
           "EMBER_PLUGIN_TIMEOUT": "10", "EMBER_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DEV", None)
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "from ember import Device, Tensor\n"
            "x = Tensor([1.0, 2.0], requires_grad=True); (x * x).sum().backward()\n"
            "print('RESULT', Device.DEFAULT, x.grad.tolist())\n"
            "for line in Device.unsafe_plugins(): print('UNSAFE', line)\n"
            "print('CPU', Device.probe('CPU'))\n"
            "raise SystemExit(7)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert "RESULT" in proc.stdout and "[2.0, 4.0]" in proc.stdout, proc.stdout + proc.stderr
    unsafe = [line for line in proc.stdout.splitlines() if line.startswith("UNSAFE")]
    assert any("crash-at-import==0.1" in u and "SIGSEGV" in u for u in unsafe), unsafe
    assert any("device EXITP (exit-in-probe==0.1)" in u and "exit status 0" in u for u in unsafe), unsafe
    assert any("creating device HANGF (hang-in-factory==0.1)" in u and "did not return" in u for u in unsafe), unsafe
    cpu_line = next(line for line in proc.stdout.splitlines() if line.startswith("CPU "))
    assert "more than one distribution" in cpu_line and "evil-cpu==0.1" in cpu_line, cpu_line
