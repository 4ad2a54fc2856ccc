"""The device contract of PLUGIN_API 2 as core uses it: BufferSpec options, an allocator that knows its
device, ``finalize()`` at exit, and a "not installed" hint that names only pip extras that exist."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from typing import Any

import pytest

from ember import dtypes
from ember.device import (
    PLUGIN_API,
    BufferSpec,
    Compiled,
    Compiler,
    DeviceNotFoundError,
    DeviceSpec,
    LRUAllocator,
    hookimpl,
)
from ember.device.buffer import Buffer
from ember.device.registry import KNOWN_PLUGINS, Device, _DeviceRegistry


class RecordingAllocator(LRUAllocator):
    """Host memory as bytearrays; records every real allocation with its options."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[int, BufferSpec | None]] = []

    def _alloc(self, nbytes: int, options: BufferSpec | None) -> bytearray:
        self.made.append((nbytes, options))
        return bytearray(nbytes)

    def _free(self, opaque: Any, nbytes: int, options: BufferSpec | None) -> None:
        pass

    def copyin(self, dest: bytearray, src: memoryview) -> None:
        dest[:src.nbytes] = src

    def copyout(self, dest: memoryview, src: bytearray) -> None:
        dest[:] = src[:dest.nbytes]


class NullCompiler(Compiler):
    def compile(self, src: str) -> bytes:
        return src.encode()


class LoggingDevice(Compiled):
    """A device that only records its lifecycle (it runs no kernels)."""

    log: list[str] = []

    def __init__(self, device: str):
        super().__init__(device, RecordingAllocator(), object(), NullCompiler(None), lambda name, lib: None)  # type: ignore[arg-type]

    def synchronize(self) -> None:
        self.log.append(f"sync {self.device}")

    def finalize(self) -> None:
        self.log.append(f"finalize {self.device}")
        if self.device == "LOG:2":
            raise RuntimeError("already gone")


class LogPlugin:
    @hookimpl
    def ember_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec("LOG", factory=f"{__name__}:LoggingDevice")]


def test_plugin_api_is_2_and_the_default_of_a_spec() -> None:
    assert PLUGIN_API == 2
    assert DeviceSpec("X", factory="m:C").plugin_api == 2


def test_buffer_spec_is_validated_and_hashable() -> None:
    assert BufferSpec(host_visible=True) == BufferSpec(host_visible=True) != BufferSpec()
    assert len({BufferSpec(), BufferSpec(uncached=True), BufferSpec(uncached=True)}) == 2
    with pytest.raises(TypeError, match="host_visible"):
        BufferSpec(host_visible=1)  # type: ignore[arg-type]


def test_lru_cache_reuses_only_buffers_of_the_same_options() -> None:
    alloc = RecordingAllocator()
    pinned = BufferSpec(host_visible=True)
    a = alloc.alloc(64, pinned)
    alloc.free(a, 64, pinned)
    b = alloc.alloc(64)          # same size, other kind: a new allocation
    c = alloc.alloc(64, pinned)  # the cached host-visible buffer
    assert c is a and b is not a
    assert alloc.made == [(64, pinned), (64, None)]
    with pytest.raises(TypeError, match="BufferSpec"):
        alloc.alloc(8, "pinned")  # type: ignore[arg-type]


def test_global_buffer_forwards_options() -> None:
    alloc = Device["PYTHON"].allocator
    calls: list[Any] = []
    original = alloc.alloc

    def spy(nbytes: int, options: BufferSpec | None = None) -> Any:
        calls.append(options)
        return original(nbytes, options)

    alloc.alloc = spy  # type: ignore[method-assign]
    try:
        Buffer("PYTHON", 4, dtypes.float32, options=BufferSpec(host_visible=True)).allocate()
    finally:
        del alloc.alloc
    assert calls == [BufferSpec(host_visible=True)]


def test_an_allocator_reaches_its_device() -> None:
    reg = _DeviceRegistry(entry_points=[])
    reg.register_plugin(LogPlugin(), "log")
    assert reg["LOG"].allocator.device is reg["LOG"]
    assert Device["PYTHON"].allocator.device is Device["PYTHON"]


def test_finalize_runs_newest_first_and_survives_a_failing_device() -> None:
    LoggingDevice.log.clear()
    reg = _DeviceRegistry(entry_points=[])
    reg.register_plugin(LogPlugin(), "log")
    for name in ("LOG", "LOG:1", "LOG:2"):
        reg[name]
    with pytest.warns(UserWarning, match="finalizing device LOG:2 failed: RuntimeError: already gone"):
        reg.finalize()
    assert LoggingDevice.log == ["sync LOG:2", "finalize LOG:2", "sync LOG:1", "finalize LOG:1",
                                 "sync LOG", "finalize LOG"]
    assert reg.finalized


def test_devices_are_finalized_at_exit() -> None:
    code = (f"import sys; sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})\n"
            "import test_plugin_contract as t\n"
            "from ember.device.registry import Device\n"
            "import atexit; atexit.register(lambda: print(t.LoggingDevice.log))  # runs after ember's (LIFO)\n"
            "Device.register_plugin(t.LogPlugin(), 'log')\n"
            "Device['LOG:1']\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['sync LOG:1', 'finalize LOG:1']"


def test_not_installed_hint_names_only_existing_extras() -> None:
    try:
        extras = set(importlib.metadata.metadata("ember").get_all("Provides-Extra") or [])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("ember is not installed, so its extras are unknown")
    reg = _DeviceRegistry(entry_points=[])
    assert "TPU" not in KNOWN_PLUGINS
    for name, (extra, dist) in KNOWN_PLUGINS.items():
        with pytest.raises(DeviceNotFoundError) as err:
            reg[name]
        msg = str(err.value)
        assert dist in msg
        assert (f'ember[{extra}]' in msg) == (extra in extras), msg
    with pytest.raises(DeviceNotFoundError) as err:
        reg["TPU"]  # no first-party plugin: no install hint
    assert "ember[" not in str(err.value)


def test_core_asks_for_cpu_access_memory_for_runtime_constants() -> None:
    """A float that changes between runs becomes a one-element input the host writes each run: core allocates it
    with BufferSpec(cpu_access=True), and the result is still right."""
    import numpy as np

    from ember import Tensor

    alloc = Device["PYTHON"].allocator
    seen: list[Any] = []
    original = alloc.alloc

    def spy(nbytes: int, options: BufferSpec | None = None) -> Any:
        seen.append(options)
        return original(nbytes, options)

    x = Tensor(np.arange(5, dtype=np.float32), device="PYTHON").realize()
    alloc.alloc = spy  # type: ignore[method-assign]
    try:
        outs = [(x * scale + 1).numpy() for scale in (0.5, 0.25, 0.125)]
    finally:
        del alloc.alloc
    assert BufferSpec(cpu_access=True) in seen
    for scale, out in zip((0.5, 0.25, 0.125), outs):
        np.testing.assert_allclose(out, np.arange(5, dtype=np.float32) * scale + 1)
