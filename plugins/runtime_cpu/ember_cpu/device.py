"""The CPU device object: wires the allocator, C renderer, C compiler, cffi runtime and batch graph."""
from __future__ import annotations

from typing import Any

from ember.device.compiled import Compiled
from ember_cpu.allocator import CPUAllocator
from ember_cpu.compiler import CPUCompiler
from ember_cpu.graph import CPUGraph
from ember_cpu.runtime import CPUProgram


def _make_renderer() -> Any:
    """The C renderer, or ``None`` while ``ember_cpu.renderer`` is not part of the package."""
    try:
        from ember_cpu.renderer import CPURenderer
    except ModuleNotFoundError as e:
        if e.name != "ember_cpu.renderer":  # a missing dependency inside the renderer is a real error
            raise
        return None
    return CPURenderer()


class CPUDevice(Compiled):
    """``CPU`` (and ``CPU:N``, which share the same host memory and compiler setup)."""

    def __init__(self, device: str = "CPU"):
        super().__init__(device, CPUAllocator(), _make_renderer(), CPUCompiler(), CPUProgram, CPUGraph)
