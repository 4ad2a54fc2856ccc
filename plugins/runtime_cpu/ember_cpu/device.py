"""The CPU device object: wires the allocator, C renderer, C compiler, cffi runtime and batch graph."""
from __future__ import annotations

import os

from ember.device import Compiled, getenv
from ember_cpu.allocator import CPUAllocator
from ember_cpu.compiler import CPUCompiler
from ember_cpu.graph import CPUGraph
from ember_cpu.renderer import CPURenderer
from ember_cpu.runtime import CPUProgram
from ember_cpu.toolchain import probe_toolchain

# OpenMP workers that spin between kernels steal the core Python (or a second test worker) runs on:
# a training step of small kernels ran 2.5x slower with libgomp's default spinning on 2 cores.
# Must be set before the first kernel loads libgomp; an explicit user setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


class CPUDevice(Compiled):
    """``CPU`` (and ``CPU:N``, which share the same host memory and compiler setup)."""

    def __init__(self, device: str = "CPU"):
        compiler = CPUCompiler()
        renderer = CPURenderer(float16=probe_toolchain(compiler.cc).float16)
        super().__init__(device, CPUAllocator(), renderer, compiler, CPUProgram, CPUGraph)


def open_device(device: str = "CPU") -> Compiled:
    """The device factory: :class:`CPUDevice`, or with ``CPU_HCQ=1`` the same device on command queues
    (:class:`ember_cpu.hcq.CPUHCQDevice`)."""
    if getenv("CPU_HCQ", 0):
        from ember_cpu.hcq import CPUHCQDevice

        return CPUHCQDevice(device)
    return CPUDevice(device)
