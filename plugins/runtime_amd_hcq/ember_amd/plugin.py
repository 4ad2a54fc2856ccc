"""Entry point module of the ``ember-amd`` distribution (group ``ember.devices``): the ``AMD`` device.

Importing it stays cheap: the runtime, the mock and the compiler are imported by the probe and the
device, not here.
"""
from __future__ import annotations

import grp
import os
from typing import Any

from ember.device import DeviceSpec, getenv, hookimpl

#: Above the CPU (10) and OpenCL (5) devices, below CUDA (60): a machine with a usable AMD GPU runs on it.
PRIORITY = 55
MOCK_NOTE = "mock KFD (AMD_MOCK=1): checks ioctls, packets and synchronization, not the GPU's instructions"
#: ``ember_amd.kfd.KFD_PATH``, named here so a machine without it is told so without importing the runtime
KFD_PATH = "/dev/kfd"
NO_KFD = ("no /dev/kfd: the amdgpu kernel driver with KFD is not loaded (no AMD GPU, or a kernel built without "
          "CONFIG_HSA_AMD); install an AMD GPU and a distribution kernel, or set AMD_MOCK=1 to run on the mock KFD")


def _group_of(path: str) -> str:
    try:
        return grp.getgrgid(os.stat(path).st_gid).gr_name
    except (OSError, KeyError):
        return "render"


def precheck() -> str | None:
    """:data:`NO_KFD` on a machine without ``/dev/kfd`` (and without the mock), else ``None``: a file test, so
    the registry needs neither the runtime's import (10-12 ms) nor the forked probe there."""
    if not getenv("AMD_MOCK", 0) and not os.path.exists(KFD_PATH):
        return NO_KFD
    return None


def probe() -> str | None:
    """``None`` when KFD shows a supported GPU this user may open and clang builds for it, else why not and
    what to install or change."""
    if (reason := precheck()) is not None:
        return reason
    from ember_amd.device import os_interface

    return problem(os_interface())


def problem(osif: Any) -> str | None:
    """:func:`probe` for the OS interface ``osif`` (the real OS or a mock)."""
    from ember_amd import gfx, kfd
    from ember_amd.toolchain import toolchain_problem

    prefix = f"{MOCK_NOTE}: " if osif.mock else ""
    if not osif.exists(kfd.KFD_PATH):
        return NO_KFD
    if not osif.access(kfd.KFD_PATH, os.R_OK | os.W_OK):
        group = _group_of(kfd.KFD_PATH)
        return (f"no permission to open /dev/kfd: add the user to group {group!r} (sudo usermod -aG {group} $USER) "
                f"and log in again")
    nodes = kfd.gpu_nodes(osif)
    if not nodes:
        return f"{prefix}KFD lists no GPU node in {kfd.TOPOLOGY} (the GPU is not supported by the loaded amdgpu driver)"
    node = nodes[0]
    if not osif.access(node.render_node, os.R_OK | os.W_OK):
        group = _group_of(node.render_node)
        return (f"no permission to open {node.render_node}: add the user to group {group!r} "
                f"(sudo usermod -aG {group} $USER) and log in again")
    try:
        gfx.gfx_table(node.arch)
    except ValueError as e:
        return f"{prefix}{e}"
    problem = toolchain_problem(node.arch)
    return f"{prefix}{problem}" if problem else None


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    """The AMD device (``AMD:N`` addresses the N-th GPU of the KFD topology)."""
    return [DeviceSpec(name="AMD", factory="ember_amd.device:AMDDevice", priority=PRIORITY, extra="amd", probe=probe,
                       precheck=precheck,
                       description="AMD GPUs through KFD: OpenCL C compiled by clang, PM4/SDMA queues filled by ember "
                                   "(AMD_MOCK=1: a mock KFD that runs kernels on the CPU)")]


@hookimpl
def ember_report_header() -> list[str]:
    """Whether the mock is in use, then one line per GPU (or the reason there is none)."""
    from ember_amd import kfd
    from ember_amd.device import os_interface

    lines = [f"AMD: {MOCK_NOTE}, target {os.environ.get('AMD_MOCK_ARCH') or 'gfx1100'}"] if getenv("AMD_MOCK", 0) \
        else []
    reason = probe()
    if reason is not None:
        return lines + [f"AMD: {reason}"]
    for i, node in enumerate(kfd.gpu_nodes(os_interface())):
        cus = node.prop("simd_count") // max(1, node.prop("simd_per_cu", 2))
        lines.append(f"AMD:{i} = {node.arch} (KFD node {node.node}, gpu_id 0x{node.gpu_id:x}), {cus} CUs, "
                     f"{node.render_node}")
    return lines
