"""Finding OpenCL devices: every device of every platform, in a stable order, and one context per platform.

``CL`` is the first device found, ``CL:1`` the second and so on, counting across platforms in
the order the ICD loader lists them. All devices of one platform share a context, so buffers
can be copied between them on the device side.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

#: What to tell a user whose machine shows no OpenCL platform at all.
INSTALL_HINT = "install PoCL: pip install pocl-binary-distribution, or apt install pocl-opencl-icd"


@dataclass(frozen=True)
class CLDeviceInfo:
    """One OpenCL device and the platform it belongs to (``index`` is N in ``CL:N``)."""

    index: int
    platform: Any  # pyopencl.Platform
    device: Any  # pyopencl.Device

    @property
    def label(self) -> str:
        """``"pthread-AMD EPYC (Portable Computing Language, OpenCL 3.0 PoCL 3.0)"``."""
        return f"{self.device.name.strip()} ({self.platform.name.strip()}, {self.platform.version.strip()})"


def import_pyopencl() -> Any:
    """The ``pyopencl`` module; raises ``ImportError`` when it is not installed or cannot load."""
    return importlib.import_module("pyopencl")


@functools.cache
def enumerate_devices() -> tuple[CLDeviceInfo, ...]:
    """Every OpenCL device visible to this process (memoized: the ICD loader is asked once).

    Raises ``ImportError`` when pyopencl is missing. A platform that fails to list its devices
    is skipped; no platform at all gives an empty tuple.
    """
    cl = import_pyopencl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader found no platform (CL_PLATFORM_NOT_FOUND_KHR)
        return ()
    found: list[CLDeviceInfo] = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:  # CL_DEVICE_NOT_FOUND: a platform without devices
            continue
        for device in devices:
            found.append(CLDeviceInfo(len(found), platform, device))
    return tuple(found)


def device_index(name: str) -> int:
    """The N of a device name: ``"CL"`` -> 0, ``"CL:2"`` -> 2."""
    _, sep, rest = name.partition(":")
    if not sep:
        return 0
    if not rest.isdigit():
        raise ValueError(f"invalid OpenCL device name {name!r}: expected CL or CL:N with N a number")
    return int(rest)


def find_device(name: str) -> CLDeviceInfo:
    """The device called ``name`` (``"CL"``, ``"CL:1"``); raises ``RuntimeError`` naming what exists."""
    index = device_index(name)
    devices = enumerate_devices()
    if not devices:
        raise RuntimeError(f"no OpenCL platform found ({INSTALL_HINT})")
    if index >= len(devices):
        listing = ", ".join(f"{device_name(d.index)} = {d.label}" for d in devices)
        raise RuntimeError(f"there is no OpenCL device {name}: {len(devices)} found ({listing})")
    return devices[index]


def device_name(index: int) -> str:
    """The ember name of the ``index``-th OpenCL device."""
    return "CL" if index == 0 else f"CL:{index}"


@functools.cache
def platform_context(platform: Any) -> Any:
    """The shared ``pyopencl.Context`` holding every device of ``platform``."""
    cl = import_pyopencl()
    devices = [d.device for d in enumerate_devices() if d.platform == platform]
    return cl.Context(devices)
