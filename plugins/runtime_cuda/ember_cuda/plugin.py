"""Entry point module of the ``ember-cuda`` distribution (group ``ember.devices``).

Importing it stays cheap: cuda-python is imported by the probe and the device, not here.
"""
from __future__ import annotations

from ember.device import DeviceSpec, hookimpl
from ember_cuda.driver import device_name, driver_problem, gpu_count, gpu_info, no_driver_problem

#: Above the CPU (10) and OpenCL (5) devices: a machine with a usable NVIDIA GPU runs on it by default.
PRIORITY = 60


def probe() -> str | None:
    """``None`` when the CUDA driver sees a GPU and NVRTC can build for it, else why not (and what to install)."""
    return driver_problem()


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    """The CUDA device (``CUDA:N`` addresses the N-th GPU)."""
    return [DeviceSpec(name="CUDA", factory="ember_cuda.device:CUDADevice", priority=PRIORITY, extra="cuda",
                       probe=probe, precheck=no_driver_problem,
                       description="NVIDIA GPUs: CUDA C compiled by NVRTC, run through the CUDA driver")]


@hookimpl
def ember_report_header() -> list[str]:
    """cuda-python's and NVRTC's versions, then one line per GPU (or the reason there is none)."""
    lines: list[str] = []
    try:
        from cuda.bindings import __version__ as bindings_version

        from ember_cuda.compiler import cuda_include_dirs, nvrtc_version

        nvrtc = ".".join(map(str, nvrtc_version()))
        headers = cuda_include_dirs()
        lines.append(f"CUDA: cuda-bindings {bindings_version}, NVRTC {nvrtc}, fp16/bf16 headers: "
                     f"{headers[0] if headers else 'not found (install a CUDA toolkit or nvidia-cuda-runtime)'}")
    except (ImportError, RuntimeError) as e:
        lines.append(f"CUDA: {e}")
    reason = probe()
    if reason is not None:
        return lines + [f"CUDA: {reason}"]
    for i in range(gpu_count()):
        info = gpu_info(i)
        lines.append(f"CUDA: {device_name(i)} = {info.name}, {info.arch}, {info.total_memory / 2**30:.1f} GiB")
    return lines
