"""The METAL plugin on a system without Metal: it installs and registers, and says why it is unusable."""
from __future__ import annotations

import subprocess
import sys

import pytest
from ember_metal import plugin
from metal_fake_objc import FakeObjC

from ember.device import Device, DeviceUnavailableError

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="checks the behaviour on systems without Metal")


def test_probe_says_metal_needs_macos() -> None:
    assert Device.probe("METAL") == f"Metal needs macOS (this system is {sys.platform})"
    with pytest.raises(DeviceUnavailableError, match="Metal needs macOS"):
        Device["METAL"]


def test_probe_on_a_mac_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On macOS with no Metal device (a VM without GPU access) the probe names MTLCreateSystemDefaultDevice."""
    import ember_metal.objc

    monkeypatch.setattr(plugin.sys, "platform", "darwin")
    monkeypatch.setattr(ember_metal.objc, "system_objc", lambda: FakeObjC(has_device=False))
    plugin.probe.cache_clear()
    try:
        assert "MTLCreateSystemDefaultDevice() returned nil" in plugin.probe()
        monkeypatch.setattr(ember_metal.objc, "system_objc", lambda: FakeObjC(families=(2001,)))
        plugin.probe.cache_clear()
        assert "non-uniform threadgroup" in plugin.probe()
        monkeypatch.setattr(ember_metal.objc, "system_objc", lambda: FakeObjC())
        plugin.probe.cache_clear()
        assert plugin.probe() is None
        assert plugin.ember_report_header() == ["METAL: Fake Apple GPU"]
    finally:
        plugin.probe.cache_clear()


def test_ranked_below_every_real_device_here() -> None:
    """Where Metal cannot exist it never becomes the default (nor makes default selection warn)."""
    spec = Device.specs()["METAL"]
    assert spec.extra == "metal" and spec.priority < 0
    assert Device.origin("METAL").dist == "ember-metal"


def test_doctor_lists_metal_unusable_with_the_reason() -> None:
    out = subprocess.run([sys.executable, "-m", "ember.doctor"], capture_output=True, text=True, timeout=300).stdout
    [line] = [ln for ln in out.splitlines() if ln.strip().startswith("METAL ")]
    assert "ember-metal" in line and "unusable: Metal needs macOS" in line
