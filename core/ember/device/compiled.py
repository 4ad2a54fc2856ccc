"""The device object every plugin's factory returns, and the protocol its programs follow.

See ``docs/contracts.md`` ("Device object") for the full contract.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ember.device.allocator import Allocator
from ember.device.compiler import Compiler


@runtime_checkable
class Program(Protocol):
    """A loaded kernel, made by ``device.runtime(name, binary)``.

    Calling it launches the kernel on opaque buffers (in parameter order) with the int
    variables ``vals`` (in ``DEFINE_VAR`` order). It returns the elapsed seconds when
    ``wait`` is true (after the kernel finished), else ``None`` (it may still be running).
    """

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None: ...


class Compiled:
    """One device: memory, code generation, compilation and execution in one object.

    ``renderer`` is the device's ``Renderer`` (typed loosely here because the renderer layer
    sits above this one). ``runtime`` is called as ``runtime(name, binary)`` and returns a
    :class:`Program`. ``graph`` is an optional batch-replay class (``None`` when the device
    has none).
    """

    def __init__(self, device: str, allocator: Allocator, renderer: Any, compiler: Compiler,
                 runtime: Callable[[str, bytes], Program], graph: type | None = None):
        self.device = device
        self.allocator = allocator
        self.renderer = renderer
        self.compiler = compiler
        self.runtime = runtime
        self.graph = graph

    def synchronize(self) -> None:
        """Wait until all work queued on the device has finished (a no-op for synchronous devices)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device}>"
