"""Entry point module of the ``ember-cpu`` distribution (group ``ember.devices``).

Importing it must stay cheap: the device itself is imported only when first used.
"""
from __future__ import annotations

from ember.device.hookspecs import hookimpl
from ember.device.spec import DeviceSpec
from ember.helpers import getenv
from ember_cpu.compiler import cc_version, find_cc, openmp_supported


def probe() -> str | None:
    """``None`` when a C compiler is found, else why the CPU device cannot work."""
    if find_cc() is None:
        return "no C compiler found: install gcc or clang, or set CC to one"
    return None


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    """The CPU device."""
    return [DeviceSpec(name="CPU", factory="ember_cpu.device:CPUDevice", priority=10, extra="cpu", probe=probe,
                       description="C kernels compiled by the system C compiler, OpenMP-parallel when available")]


@hookimpl
def ember_report_header() -> list[str]:
    """One line naming the C compiler and whether OpenMP works."""
    cc = find_cc()
    if cc is None:
        return ["CPU: no C compiler found"]
    if not getenv("CPU_OPENMP", 1):
        omp = "off (CPU_OPENMP=0)"
    else:
        omp = "yes" if openmp_supported(tuple(cc)) else "no"
    return [f"CPU: compiler {' '.join(cc)} ({cc_version(tuple(cc))}), OpenMP: {omp}"]
