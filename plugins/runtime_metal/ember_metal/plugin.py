"""Entry point module of the ``ember-metal`` distribution (group ``ember.devices``).

Importing it stays cheap and works on every system: the Objective-C runtime is only loaded by the
probe, and only on macOS.
"""
from __future__ import annotations

import functools
import sys

from ember.device import DeviceSpec, hookimpl

#: On macOS above the CPU device (10) and OpenCL (5): on a Mac the GPU is the device a user expects by
#: default. Elsewhere Metal cannot exist, so it ranks below every device (only above PYTHON, -100): an
#: installed ember-metal on Linux (CI checks its renderer there) never makes default selection warn.
PRIORITY = 20 if sys.platform == "darwin" else -50


def precheck() -> str | None:
    """Why METAL cannot work on this operating system, or ``None`` on macOS."""
    return None if sys.platform == "darwin" else f"Metal needs macOS (this system is {sys.platform})"


@functools.cache
def probe() -> str | None:
    """``None`` when a Metal GPU is usable here, else why the METAL device cannot work."""
    if (reason := precheck()) is not None:
        return reason
    from ember_metal.objc import ObjCError, system_objc

    try:
        objc = system_objc()
        device = objc.default_device()
    except (OSError, ObjCError) as e:  # a system without Metal.framework or libobjc: say which
        return f"the Metal framework cannot be loaded: {e}"
    if not device:
        return "no Metal device: MTLCreateSystemDefaultDevice() returned nil (no Metal-capable GPU, or a VM " \
               "without GPU access)"
    try:
        return objc.unusable_gpu(device)
    finally:
        objc.release(device)  # MTLCreateSystemDefaultDevice returns an owned reference


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    """The METAL device (the system's default Metal GPU)."""
    return [DeviceSpec(name="METAL", factory="ember_metal.device:MetalDevice", priority=PRIORITY, extra="metal",
                       probe=probe, precheck=precheck,
                       description="Metal Shading Language kernels run through the Objective-C runtime")]


@hookimpl
def ember_report_header() -> list[str]:
    """The GPU's name, or why there is none."""
    reason = probe()
    if reason is not None:
        return [f"METAL: {reason}"]
    from ember_metal.objc import system_objc

    objc = system_objc()
    device = objc.default_device()
    try:
        with objc.pool():
            return [f"METAL: {objc.string(objc.send(device, 'name'))}"]
    finally:
        objc.release(device)
