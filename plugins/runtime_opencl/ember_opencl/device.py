"""The CL device object: one OpenCL device with its queue, allocator, renderer, compiler and runtime."""
from __future__ import annotations

import functools
import hashlib
import warnings
import weakref
from typing import Any

from ember.device import Compiled
from ember_opencl.allocator import CLAllocator
from ember_opencl.compiler import CLCompiler
from ember_opencl.graph import CLGraph
from ember_opencl.platforms import find_device, import_pyopencl, platform_context
from ember_opencl.renderer import CLRenderer
from ember_opencl.runtime import CLProgram

#: queued host copies a device holds before it waits for them all
MAX_PENDING = 256


class CLDevice(Compiled):
    """``CL`` (the first OpenCL device) or ``CL:N`` (the N-th, counted across platforms).

    Attributes beyond :class:`~ember.device.compiled.Compiled`: ``cl_device`` (the
    ``pyopencl.Device``), ``context`` (shared by the devices of one platform) and ``queue`` (an
    in-order queue with profiling enabled).
    """

    def __init__(self, device: str = "CL"):
        cl = import_pyopencl()
        info = find_device(device)
        self.info = info
        self.cl_device = info.device
        self.context = platform_context(info.platform)
        self.queue = cl.CommandQueue(self.context, self.cl_device,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.extensions = frozenset(self.cl_device.extensions.split())
        self._pending: list[Any] = []  # events of queued host copies (see keep_until_synchronized)
        self._programs: weakref.WeakValueDictionary[bytes, Any] = weakref.WeakValueDictionary()
        super().__init__(device, CLAllocator(self), self._make_renderer(device), CLCompiler(self.cl_device),
                         functools.partial(CLProgram, self), CLGraph)

    def _make_renderer(self, name: str) -> CLRenderer:
        """A renderer with this device's capabilities."""
        dev = self.cl_device
        size_max = (1 << int(dev.address_bits)) - 1  # global sizes are size_t
        return CLRenderer(fp16="cl_khr_fp16" in self.extensions, fp64="cl_khr_fp64" in self.extensions,
                          global_max=(size_max,) * 3, local_max=tuple(int(s) for s in dev.max_work_item_sizes[:3]),
                          shared_max=int(dev.local_mem_size), device=name)

    def load_program(self, binary: bytes) -> Any:
        """The built ``cl.Program`` for a driver binary, loaded once per device and shared by its kernels."""
        key = hashlib.sha256(binary).digest()
        program = self._programs.get(key)
        if program is None:
            cl = import_pyopencl()
            with warnings.catch_warnings():
                # a driver's notes while finishing a binary are only a warning; a failure raises
                warnings.simplefilter("ignore", cl.CompilerWarning)
                program = self._programs[key] = cl.Program(self.context, [self.cl_device], [binary]).build()
        return program

    def keep_until_synchronized(self, event: Any) -> None:
        """Hold ``event`` (a queued copy's) until the next :meth:`synchronize`; many pending copies synchronize."""
        self._pending.append(event)
        if len(self._pending) >= MAX_PENDING:
            self.synchronize()

    def synchronize(self) -> None:
        """Wait until every command queued on this device has finished."""
        self.queue.finish()
        self.release_finished()

    def release_finished(self) -> None:
        """Drop the events of queued copies once the queue has run past them (after a wait on it)."""
        self._pending.clear()
