"""A plugin that hangs (in its import, its ember_devices() hook or its probe), crashes, fails to build its device
or declares another distribution's device name cannot hang or hijack ember."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from typing import Any

import pytest

import ember
from ember.device import Device, DevicePluginError, DeviceSpec, hookimpl
from ember.device.registry import _DeviceRegistry

CORE_DIR = pathlib.Path(ember.__file__).resolve().parent.parent
FACTORY = f"{__name__}:FakeDevice"
BROKEN_FACTORY = f"{__name__}:BrokenDevice"
_release = threading.Event()  # set at the end of the module: lets the hanging threads of these tests finish


class FakeDevice:
    def __init__(self, name: str):
        self.device = name


class BrokenDevice:
    def __init__(self, name: str):
        raise OSError(f"driver refused to open {name}")


class FakeDist:
    def __init__(self, name: str):
        self.name, self.version, self.metadata = name, "1.0", {"Name": name}


class FakeEntryPoint:
    def __init__(self, name: str, loader: Any, dist: str):
        self.name, self.value, self.dist, self._loader = name, f"{dist}.plugin", FakeDist(dist), loader
        self.loaded = False

    def load(self) -> Any:
        self.loaded = True
        return self._loader()


def plugin(*specs: DeviceSpec, hook_sleeps: bool = False) -> Any:
    class Plugin:
        @hookimpl
        def ember_devices(self) -> list[DeviceSpec]:
            if hook_sleeps:
                _release.wait(60)
            return list(specs)
    return Plugin()


def hanging_import() -> Any:
    _release.wait(60)
    return plugin(DeviceSpec("SLOW", FACTORY))


@pytest.fixture(autouse=True)
def _short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_PLUGIN_TIMEOUT", "0.5")
    monkeypatch.delenv("DEV", raising=False)


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def test_hanging_probe_is_cut_off():
    def probe() -> str | None:
        _release.wait(60)
        return None
    specs = (DeviceSpec("HANG", FACTORY, priority=50, probe=probe), DeviceSpec("GOOD", FACTORY, priority=10))
    reg = _DeviceRegistry(entry_points=[FakeEntryPoint("hang", lambda: plugin(*specs), "ember-hang")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default, took = _timed(lambda: reg.DEFAULT)
    assert default == "GOOD" and took < 30, (default, took)  # (the probe hangs for 60 s)
    assert "did not return within 0.5 s" in reg.probe("HANG")



@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="the crash check forks (Linux)")
def test_a_probe_that_crashes_its_process_is_skipped_not_fatal(tmp_path: pathlib.Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    """A probe that kills its process (a driver segfaulting) runs first in a forked child: default selection
    skips the device with the reason, and this process lives on. A probe that passed once is not forked again."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    # the crash ends the child by itself: a generous limit, so a slow fork on a loaded machine is not a hang
    monkeypatch.setenv("EMBER_PLUGIN_TIMEOUT", "120")
    calls: list[int] = []

    def crash() -> str | None:
        os.kill(os.getpid(), signal.SIGSEGV)
        return None

    def fine() -> str | None:
        calls.append(os.getpid())
        return None
    specs = (DeviceSpec("CRASHY", FACTORY, priority=50, probe=crash), DeviceSpec("GOOD", FACTORY, priority=10,
                                                                                 probe=fine))
    reg = _DeviceRegistry(entry_points=[FakeEntryPoint("crashy", lambda: plugin(*specs), "ember-crashy")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert reg.DEFAULT == "GOOD"
    reason = reg.probe("CRASHY")
    assert reason is not None and "crashed the process that ran it (SIGSEGV)" in reason, reason
    assert any("CRASHY" in str(w.message) and "SIGSEGV" in str(w.message) for w in caught)
    assert calls == [os.getpid()], "the passing probe ran here once (its first run was in a child)"
    fresh = _DeviceRegistry(entry_points=[FakeEntryPoint("crashy", lambda: plugin(*specs), "ember-crashy")])
    with monkeypatch.context() as m:  # a second process would find the passing probe recorded: no fork
        m.setattr(os, "fork", lambda: pytest.fail("forked for a probe that already passed"))
        assert fresh.probe("GOOD") is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_the_crash_check_sees_a_child_end_at_once_and_stops_waiting_at_its_limit():
    from ember.device.isolation import _wait_child

    pid = os.fork()
    if pid == 0:
        time.sleep(0.03)
        os._exit(3)
    start = time.monotonic()
    status = _wait_child(pid, 60.0)
    waited = time.monotonic() - start
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3
    # (far below the 60 s limit however loaded the machine is: the wait ends when the child does)
    assert waited < 20.0, f"a child that ended after 30 ms was noticed after {waited:.2f} s"
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    try:
        start = time.monotonic()
        assert _wait_child(pid, 0.2) is None
        assert time.monotonic() - start < 60.0  # (the limit, not the child's 600 s, however loaded the machine)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_hanging_import_and_hook_are_cut_off():
    slow_import = FakeEntryPoint("slow", hanging_import, "ember-slow")
    slow_hook = FakeEntryPoint("slowhook", lambda: plugin(DeviceSpec("SH", FACTORY), hook_sleeps=True), "ember-sh")
    good = FakeEntryPoint("good", lambda: plugin(DeviceSpec("GOOD", FACTORY)), "ember-good")
    reg = _DeviceRegistry(entry_points=[slow_import, slow_hook, good])
    specs, took = _timed(reg.specs)
    assert "GOOD" in specs and "SLOW" not in specs and "SH" not in specs and took < 30
    stages = {f.origin.dist: (f.stage, type(f.error).__name__) for f in reg.failures()}
    assert stages == {"ember-slow": ("import", "PluginTimeout"), "ember-sh": ("ember_devices", "PluginTimeout")}
    with pytest.raises(DevicePluginError, match="did not return within"):
        reg["SLOW"]


def test_asking_for_one_device_loads_only_its_plugins(monkeypatch: pytest.MonkeyPatch):
    slow = FakeEntryPoint("slow", hanging_import, "ember-slow")
    cpu = FakeEntryPoint("fake", lambda: plugin(DeviceSpec("FAKE", FACTORY)), "ember-fake")
    reg = _DeviceRegistry(entry_points=[slow, cpu])
    monkeypatch.setenv("DEV", "FAKE")
    (default, took) = _timed(lambda: reg.DEFAULT)
    assert default == "FAKE" and reg["FAKE"].device == "FAKE" and took < 30  # (the other plugin hangs for 60 s)
    assert cpu.loaded and not slow.loaded


def test_failing_factory_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch):
    ep = FakeEntryPoint("two", lambda: plugin(DeviceSpec("BAD", BROKEN_FACTORY, priority=50),
                                              DeviceSpec("OK", FACTORY, priority=10)), "ember-two")
    reg = _DeviceRegistry(entry_points=[ep])
    with pytest.warns(UserWarning, match="BAD .*driver refused to open BAD"):
        assert reg.DEFAULT == "OK"
    monkeypatch.setenv("DEV", "BAD")  # an explicit choice never falls back
    reg = _DeviceRegistry(entry_points=[ep])
    assert reg.DEFAULT == "BAD"
    with pytest.raises(DevicePluginError, match="driver refused"):
        reg["BAD"]


def test_another_distribution_cannot_take_over_a_device_name():
    mine = FakeEntryPoint("fake", lambda: plugin(DeviceSpec("FAKE", FACTORY)), "ember-fake")
    theirs = FakeEntryPoint("evil", lambda: plugin(DeviceSpec("FAKE", FACTORY, priority=99)), "evil-fake")
    reg = _DeviceRegistry(entry_points=[theirs, mine])
    assert "FAKE" in reg.specs()  # every plugin loaded (default selection does this)
    with pytest.raises(DevicePluginError, match="evil-fake==1.0 and ember-fake==1.0"):
        reg["FAKE"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert reg.DEFAULT == "PYTHON"  # not the hijacked name, whichever comes first
    # asking for the device by name loads the plugins with that entry-point name only: here ember-fake's
    theirs.loaded = mine.loaded = False
    reg = _DeviceRegistry(entry_points=[theirs, mine])
    assert reg["FAKE"].device == "FAKE" and reg.origin("FAKE").dist == "ember-fake" and not theirs.loaded


def _installed_plugin(tmp_path: pathlib.Path, body: str) -> dict[str, str]:
    """An installed distribution ``ember-hangx`` (dist-info + module) on PYTHONPATH; the environment to use it."""
    dist_info = tmp_path / "ember_hangx-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: ember-hangx\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[ember.devices]\nhangx = ember_hangx_plugin\n")
    (tmp_path / "ember_hangx_plugin.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CORE_DIR)]),
           "EMBER_PLUGIN_TIMEOUT": "1", "EMBER_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DEV", None)
    return env


def _run(env: dict[str, str], code: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.perf_counter() - start


COMPUTE = "from ember import Tensor; print('RESULT', (Tensor([1.0, 2.0]) * 2).tolist())"


def test_installed_plugin_hanging_at_import(tmp_path: pathlib.Path):
    env = _installed_plugin(tmp_path, "import time\ntime.sleep(3600)\n")
    base, _ = _run(env, "import ember")
    assert base.returncode == 0, base.stderr
    explicit = "CPU" if "CPU" in Device.available() else "PYTHON"
    for extra in ({"DEV": explicit}, {}):  # an explicit device, then default selection (waits one timeout)
        proc, took = _run({**env, **extra}, COMPUTE)
        assert proc.returncode == 0 and "RESULT [2.0, 4.0]" in proc.stdout, proc.stderr
        assert took < 60, took


def test_doctor_survives_hanging_and_crashing_probes(tmp_path: pathlib.Path):
    env = _installed_plugin(tmp_path, """
        import os, signal, time
        from ember.device import DeviceSpec, hookimpl

        def hang():
            time.sleep(3600)

        def crash():
            if os.environ.get("HANGX_CRASH"):
                os.kill(os.getpid(), signal.SIGSEGV)

        @hookimpl
        def ember_devices():
            return [DeviceSpec("HANGX", "ember_hangx_plugin:X", priority=1000, probe=hang),
                    DeviceSpec("CRASHX", "ember_hangx_plugin:X", priority=999, probe=crash)]
    """)
    proc, took = _run(env, "from ember.doctor import main; raise SystemExit(main([]))")
    assert took < 60, took
    assert "HANGX" in proc.stdout and "did not return within 1 s" in proc.stdout, proc.stdout + proc.stderr
    # a limit long enough that the crashing probe's child ends (and is named) before it on a loaded machine
    crashed, took = _run({**env, "HANGX_CRASH": "1", "EMBER_PLUGIN_TIMEOUT": "10"},
                         "from ember.doctor import main; raise SystemExit(main([]))")
    assert took < 60
    # the crash is named and the report goes on to its end
    listed = crashed.stdout.split("crashed plugins", 1)[-1]
    assert "the probe of device CRASHX (ember-hangx==0.1) crashed the process that ran it (SIGSEGV)" in listed, \
        crashed.stdout + crashed.stderr
    assert crashed.stdout.rstrip().endswith("the default device works") == (crashed.returncode == 0)


def teardown_module() -> None:
    _release.set()


def test_a_precheck_reason_is_final_and_forks_nothing(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    """A device whose plain-Python precheck says no (no driver files) is skipped with that reason: its probe
    never runs, here or in a forked child. A precheck that passes leads to the probe as before."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    probed: list[str] = []

    def probe(name: str) -> Any:
        return lambda: probed.append(name)

    specs = (DeviceSpec("NODRIVER", FACTORY, priority=50, precheck=lambda: "no /dev/gpu0", probe=probe("NODRIVER")),
             DeviceSpec("BROKEN", FACTORY, priority=40, precheck=lambda: 1 / 0, probe=probe("BROKEN")),
             DeviceSpec("GOOD", FACTORY, priority=10, precheck=lambda: None, probe=probe("GOOD")))
    reg = _DeviceRegistry(entry_points=[FakeEntryPoint("pre", lambda: plugin(*specs), "ember-pre")])
    forks: list[int] = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert reg.DEFAULT == "GOOD"
    assert reg.probe("NODRIVER") == "no /dev/gpu0"
    assert reg.probe("BROKEN") == "precheck raised ZeroDivisionError: division by zero"
    assert any("no /dev/gpu0" in str(w.message) for w in caught)
    assert probed == ["GOOD"], "only the device whose precheck passed was probed (in this process)"
    guarded = hasattr(os, "fork") and sys.platform != "darwin"
    # the first time: one child imports the plugin and tries its devices as selection does (prechecks included)
    assert len(forks) == (1 if guarded else 0), forks
    forks.clear()
    again = _DeviceRegistry(entry_points=[FakeEntryPoint("pre", lambda: plugin(*specs), "ember-pre")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert again.DEFAULT == "GOOD" and again.probe("NODRIVER") == "no /dev/gpu0"
    assert forks == [], "a clean run is remembered: a warm start forks nothing"


def test_device_spec_rejects_a_precheck_that_is_not_callable():
    with pytest.raises(ValueError, match="precheck of device X must be callable"):
        DeviceSpec("X", FACTORY, precheck="yes")  # type: ignore[arg-type]


def test_plugin_calls_share_one_thread_yet_a_nested_or_hung_call_gets_its_own():
    from ember.device.isolation import PluginTimeout, call_with_timeout

    def name() -> str:
        return threading.current_thread().name

    assert call_with_timeout(name, "first") == "ember plugin: first"
    first = call_with_timeout(threading.current_thread, "a")
    assert call_with_timeout(threading.current_thread, "b") is first, "calls in turn reuse one thread"
    # a call made from inside a call (a plugin whose import asks for a device) runs beside it, not after it
    inner, outer = call_with_timeout(lambda: (call_with_timeout(threading.current_thread, "inner"),
                                              threading.current_thread()), "outer")
    assert inner is not outer
    with pytest.raises(ValueError, match="from the plugin"):
        call_with_timeout(lambda: (_ for _ in ()).throw(ValueError("from the plugin")), "raises")
    with pytest.raises(PluginTimeout, match="hangs did not return within 0.1 s"):
        call_with_timeout(lambda: _release.wait(60), "hangs", timeout=0.1)
    after = call_with_timeout(threading.current_thread, "after")
    assert after is not first and after.is_alive(), "the hung thread was replaced"
    assert call_with_timeout(lambda: 7, "value") == 7
