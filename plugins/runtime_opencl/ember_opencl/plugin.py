"""Entry point module of the ``ember-opencl`` distribution (group ``ember.devices``).

Importing it stays cheap: pyopencl is imported by the probe and the device, not here.
"""
from __future__ import annotations

import functools

from ember.device import DeviceSpec, hookimpl
from ember_opencl.platforms import INSTALL_HINT, device_name, enumerate_devices, import_pyopencl

#: Below the CPU device (10): a CPU OpenCL platform such as PoCL is common and slower than native C kernels,
#: so CL becomes the default device only when chosen (DEV=CL) or when no CPU plugin is installed.
PRIORITY = 5


@functools.cache
def probe() -> str | None:
    """``None`` when at least one OpenCL device is visible, else why the CL device cannot work."""
    try:
        import_pyopencl()
    except ImportError as e:
        return f"pyopencl cannot be imported ({e}): pip install pyopencl"
    try:
        devices = enumerate_devices()
    except Exception as e:  # a broken ICD loader or driver: report it, never raise from a probe
        return f"listing OpenCL platforms failed: {type(e).__name__}: {e}"
    if not devices:
        return f"no OpenCL platform found ({INSTALL_HINT})"
    return None


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    """The CL device (``CL:N`` addresses the N-th OpenCL device across all platforms)."""
    return [DeviceSpec(name="CL", factory="ember_opencl.device:CLDevice", priority=PRIORITY, extra="opencl",
                       probe=probe, description="OpenCL C kernels built and launched through pyopencl")]


@hookimpl
def ember_report_header() -> list[str]:
    """pyopencl's version and one line per OpenCL device with its ember name."""
    reason = probe()
    if reason is not None:
        return [f"CL: {reason}"]
    cl = import_pyopencl()
    lines = [f"CL: pyopencl {cl.VERSION_TEXT}"]
    for info in enumerate_devices():
        dev = info.device
        fp64 = "yes" if "cl_khr_fp64" in dev.extensions.split() else "no"
        fp16 = "native" if "cl_khr_fp16" in dev.extensions.split() else "storage only (computed as float)"
        lines.append(f"CL: {device_name(info.index)} = {info.label}, {dev.opencl_c_version.strip()}, "
                     f"driver {dev.driver_version.strip()}, fp64 {fp64}, fp16 {fp16}")
    return lines
