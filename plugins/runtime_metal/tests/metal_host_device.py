"""``METALHOST``: the whole METAL device stack (renderer, compiler, allocator, runtime, graph) over the recording
fake of the Objective-C runtime, with every dispatch run as MSL on the host CPU (metal_host_run).

It lets ember's conformance suite drive the plugin end to end on Linux:

    pytest -p metal_host_device --pyargs ember.testing --device=METALHOST   (with this folder on PYTHONPATH)

Passing says ember's side of every launch is right (sources, arguments, offsets, sizes, copies, replay);
it says nothing about Apple's compiler or GPU.
"""
from __future__ import annotations

import sys

from ember_metal.device import MetalDevice
from metal_fake_objc import FakeObjC
from metal_msl_check import find_clang

from ember.device import DeviceSpec, hookimpl


class HostMetalDevice(MetalDevice):
    """A METAL device whose Objective-C layer is the fake, running kernels on the host."""

    def __init__(self, device: str = "METALHOST"):
        super().__init__(device, objc=FakeObjC(run_kernels=True))


def probe() -> str | None:
    return None if find_clang() else "no clang on PATH (the host runs the MSL compiled by clang++)"


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    return [DeviceSpec(name="METALHOST", factory="metal_host_device:HostMetalDevice", priority=-90, probe=probe,
                       description="the METAL plugin over a fake Metal that runs kernels on the host CPU")]


def pytest_configure(config: object) -> None:
    """As a pytest plugin (``-p metal_host_device``): make the device known before the suite asks for it."""
    from ember.device.registry import register_plugin

    register_plugin(sys.modules[__name__], "metalhost")
