"""The device object every plugin's factory returns.

See ``docs/contracts.md`` ("Device object") for the full contract and
:mod:`ember.device.contracts` for the Protocols of its parts.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.device.allocator import Allocator
from ember.device.compiler import Compiler
from ember.device.contracts import GraphFactory, Program, Renderer

__all__ = ["Compiled", "Program"]


class Compiled:
    """One device: memory, code generation, compilation and execution in one object.

    Args:
        device: the full device name (``"CL:1"``).
        allocator: the device's :class:`~ember.device.Allocator`; its ``device`` attribute is set
            to this object when it is still ``None``, so an allocator can reach its device.
        renderer: a :class:`~ember.device.Renderer` (usually an ``ember.renderer.Renderer`` subclass).
        compiler: a :class:`~ember.device.Compiler`.
        runtime: called as ``runtime(name, binary)``; returns a :class:`~ember.device.Program`.
        graph: an optional :data:`~ember.device.GraphFactory` (``graph(calls)`` returns a
            :class:`~ember.device.Graph`); ``None`` when the device has no batch replay.
    """

    #: an optional device-native collective: a method ``allreduce(srcs, dests, devices, dtype, op)`` combining one
    #: buffer per device of a group of this plugin's devices (see :mod:`ember.device.collective`); None: the
    #: engine builds allreduces from copies and kernels (a ring). Host-memory devices can use
    #: :func:`ember.device.collective.host_allreduce`.
    allreduce: Callable[..., None] | None = None

    def __init__(self, device: str, allocator: Allocator, renderer: Renderer, compiler: Compiler,
                 runtime: Callable[[str, bytes], Program], graph: GraphFactory | None = None):
        self.device = device
        self.allocator = allocator
        if allocator.device is None:
            allocator.device = self
        self.renderer = renderer
        self.compiler = compiler
        self.runtime = runtime
        self.graph = graph

    @property
    def supported_dtypes(self) -> frozenset[Any]:
        """The dtypes the device can load, store and compute with: its renderer's. A device whose renderer
        waits on something slow (a compiler probe) may answer sooner."""
        return self.renderer.supported_dtypes

    def synchronize(self) -> None:
        """Wait until all work queued on the device has finished (a no-op for synchronous devices)."""

    def finalize(self) -> None:
        """Release what the device holds outside Python's reach (queues, contexts, worker threads).

        Called once per device object at interpreter exit (``atexit``), in reverse order of
        creation, after :meth:`synchronize`. The default does nothing. It must not raise for a
        device that is already half torn down; exceptions are reported and ignored.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device}>"
