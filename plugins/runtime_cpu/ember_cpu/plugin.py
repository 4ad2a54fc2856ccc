"""Entry point module of the ``ember-cpu`` distribution (group ``ember.devices``).

Importing it must stay cheap: the device itself is imported only when first used.
"""
from __future__ import annotations

import os

from ember.device import DeviceSpec, getenv, hookimpl
from ember_cpu.toolchain import find_compilers, prefetch_toolchain, select_toolchain


def probe() -> str | None:
    """``None`` when a C compiler is found, else why the CPU device cannot work."""
    if not find_compilers():
        cc = os.environ.get("CC", "").strip()
        if cc:
            return f"CC={cc} is not an executable on PATH: set CC to an installed C compiler, or unset it"
        return "no C compiler found: install gcc or clang (Debian/Ubuntu: apt install gcc), or set CC to one"
    return None


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    """The CPU device. Its compiler's probe starts now, in the background (unless ``DEV`` names another
    device): a fresh cache's first kernel would otherwise wait for it."""
    if getenv("DEV", "").upper().partition(":")[0] in ("", "CPU"):
        prefetch_toolchain()
    return [DeviceSpec(name="CPU", factory="ember_cpu.device:open_device", priority=10, extra="cpu", precheck=probe,
                       description="C kernels compiled by the system C compiler, OpenMP-parallel when available")]


@hookimpl
def ember_report_header() -> list[str]:
    """The C compiler, and for OpenMP and float16 what is used and, for each "no", why and the remedy."""
    tc = select_toolchain()
    if tc is None:
        return [f"CPU: {probe()}"]
    lines = [f"CPU: compiler {' '.join(tc.cc)} ({tc.version})"]
    if not getenv("CPU_OPENMP", 1):
        lines.append("CPU: OpenMP: off (CPU_OPENMP=0): kernels run on one thread")
    elif tc.openmp:
        lines.append("CPU: OpenMP: yes (kernels use every core)")
    else:
        lines.append(f"CPU: OpenMP: no, kernels run on one thread: {tc.openmp_reason}")
    if tc.float16 == "native":
        lines.append("CPU: float16: native _Float16")
    else:
        lines.append(f"CPU: float16: emulated (16-bit storage, float arithmetic rounded to half; correct, slower): "
                     f"{tc.float16_reason}")
    return lines
