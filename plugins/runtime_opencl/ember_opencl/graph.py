"""Replay a captured list of kernel launches on one CL device.

Each call gets its own ``cl.Kernel`` object with its arguments bound once, at capture time, so
a replay is only one ``clEnqueueNDRangeKernel`` per kernel: no argument setting, no size
checks, no Python objects built. On a CPU device the kernels start once all are queued
(``CLGraph.gated``); a new symbolic value rebinds only the int arguments.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ember_opencl.runtime import CLProgram, event_seconds, launch_sizes, set_kernel_args, set_val_args


class CLGraph:
    """A batch of kernel calls replayed in order by ``graph()``.

    ``calls`` holds ``(program, bufs, vals, global_size)`` or ``(program, bufs, vals,
    global_size, local_size)`` tuples; every program is a
    :class:`~ember_opencl.runtime.CLProgram` of the same device. The graph keeps the programs and
    buffers alive; :meth:`update_buffer` and :meth:`update_vals` change one call's arguments.
    """

    def __init__(self, calls: Sequence[Sequence[Any]]):
        self.programs: list[CLProgram] = []
        self.bufs: list[list[Any]] = []
        self.vals: list[tuple[int, ...]] = []
        self.kernels: list[Any] = []
        self.sizes: list[tuple[tuple[int, ...], tuple[int, ...] | None]] = []
        for i, call in enumerate(calls):
            if not 4 <= len(call) <= 5:
                raise ValueError(f"CLGraph call {i}: expected (program, bufs, vals, global_size[, local_size]), "
                                 f"got {len(call)} items")
            prg, bufs, vals, global_size = call[:4]
            local_size = call[4] if len(call) == 5 else None
            if not isinstance(prg, CLProgram):
                raise TypeError(f"CLGraph call {i}: expected a CLProgram, got {type(prg).__name__}")
            if self.programs and prg.device is not self.programs[0].device:
                raise ValueError(f"CLGraph call {i} runs on {prg.device.device}, the graph on "
                                 f"{self.programs[0].device.device}")
            kernel = prg.new_kernel()
            set_kernel_args(kernel, prg.buffer_args(bufs, vals), vals)
            self.programs.append(prg)
            self.bufs.append(list(bufs))
            self.vals.append(tuple(vals))
            self.kernels.append(kernel)
            self.sizes.append(launch_sizes(global_size, local_size))
        self.device = self.programs[0].device if self.programs else None
        # empty grids are skipped when replaying
        self._launches = [(k, g, lsz) for k, (g, lsz) in zip(self.kernels, self.sizes) if 0 not in g]
        #: hold the kernels until all are queued: on a CPU device (PoCL) the kernels run on host threads that
        #: would otherwise contend with the enqueueing thread for each launch; a GPU gains from starting early
        self.gated = self.device is not None and bool(self.device.cl_device.type & self.programs[0].cl.device_type.CPU)

    def __call__(self, wait: bool = False) -> float | None:
        """Enqueue every call in order; with ``wait``, wait and return the device time in seconds."""
        if not self._launches:
            return 0.0 if wait else None
        cl = self.programs[0].cl
        assert self.device is not None, "a graph with launches has programs"
        queue = self.device.queue
        enqueue = cl.enqueue_nd_range_kernel
        start = time.perf_counter()
        # when gated, the first kernel waits on a user event released once every kernel is queued
        gate = cl.UserEvent(self.device.context) if self.gated else None
        try:
            kernel, gsize, lsize = self._launches[0]
            first = last = enqueue(queue, kernel, gsize, lsize, wait_for=None if gate is None else [gate])
            for kernel, gsize, lsize in self._launches[1:]:
                last = enqueue(queue, kernel, gsize, lsize)
        finally:
            if gate is not None:
                gate.set_status(cl.command_execution_status.COMPLETE)
        if not wait:
            return None
        assert last is not None, "a graph with launches enqueued none"
        last.wait()
        try:
            return event_seconds(last, first)
        except cl.Error:
            return time.perf_counter() - start

    def update_buffer(self, call_index: int, buf_index: int, opaque: Any) -> None:
        """Make argument ``buf_index`` of call ``call_index`` the buffer ``opaque``."""
        bufs = self.bufs[call_index]
        if not 0 <= buf_index < len(bufs):
            raise IndexError(f"call {call_index} has {len(bufs)} buffers, no buffer {buf_index}")
        bufs[buf_index] = opaque
        if buf_index < self.programs[call_index].num_args - len(self.vals[call_index]):  # else the kernel ignores it
            self.kernels[call_index].set_arg(buf_index, opaque.mem)

    def update_vals(self, call_index: int, vals: Sequence[int]) -> None:
        """Replace the int variables of call ``call_index`` (same count as at capture)."""
        count = len(self.vals[call_index])
        if len(vals) != count:
            raise ValueError(f"call {call_index} takes {count} int variables, got {len(vals)}")
        vals = tuple(vals)
        if vals == self.vals[call_index]:
            return
        self.vals[call_index] = vals
        # the buffers stay bound: only the int parameters (after the used buffers) change
        set_val_args(self.kernels[call_index], self.programs[call_index].num_args - count, vals)

    def __len__(self) -> int:
        return len(self.programs)
