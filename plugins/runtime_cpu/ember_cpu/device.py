"""The CPU device object: wires the allocator, C renderer, C compiler, cffi runtime and batch graph."""
from __future__ import annotations

import os
from typing import Any

from ember.device import Compiled, Compiler, Renderer, getenv, host_allreduce
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
    """``CPU`` (and ``CPU:N``, which share the same host memory and compiler setup).

    The compiler and the renderer are made when first used: they need the compiler's probe (which flags,
    whether float16 is native), and with an empty cache that probe is still building its program in the
    background when the device is opened. A program meanwhile builds its first graph and schedule."""

    #: CPU devices share host memory: an allreduce over them is one pass over the partials (no ring of copies)
    allreduce = host_allreduce

    def __init__(self, device: str = "CPU"):
        self._compiler: Compiler | None = None
        self._renderer: Renderer | None = None
        # None: made on first use (the setters below keep None as "not made yet")
        super().__init__(device, CPUAllocator(), None, None, CPUProgram, CPUGraph)  # type: ignore[arg-type]

    @property
    def compiler(self) -> Compiler:
        """The C compiler (probed on first use)."""
        if self._compiler is None:
            self._compiler = CPUCompiler()
        return self._compiler

    @compiler.setter
    def compiler(self, compiler: Compiler) -> None:
        self._compiler = compiler

    @property
    def renderer(self) -> Renderer:
        """The C renderer, with native or emulated float16 as the compiler's probe found (made on first use)."""
        if self._renderer is None:
            compiler = self.compiler
            cc = compiler.cc if isinstance(compiler, CPUCompiler) else CPUCompiler().cc
            self._renderer = CPURenderer(float16=probe_toolchain(cc).float16)
        return self._renderer

    @renderer.setter
    def renderer(self, renderer: Renderer) -> None:
        self._renderer = renderer

    @property
    def supported_dtypes(self) -> frozenset[Any]:
        """Every dtype (float16 natively or emulated, as the probe finds), known without waiting for the probe:
        a graph asks this while it is built (a float32 cosine is computed in float64 where float64 exists)."""
        return self._renderer.supported_dtypes if self._renderer is not None else CPURenderer.supported_dtypes


def open_device(device: str = "CPU") -> Compiled:
    """The device factory: :class:`CPUDevice`, or with ``CPU_HCQ=1`` the same device on command queues
    (:class:`ember_cpu.hcq.CPUHCQDevice`)."""
    if getenv("CPU_HCQ", 0):
        from ember_cpu.hcq import CPUHCQDevice

        return CPUHCQDevice(device)
    return CPUDevice(device)
