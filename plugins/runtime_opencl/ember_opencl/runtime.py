"""Load program binaries and launch their kernels on a device's command queue."""
from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.device import KernelBinary
from ember_opencl.platforms import import_pyopencl


def launch_sizes(global_size: Sequence[int], local_size: Sequence[int] | None) -> tuple[tuple[int, ...],
                                                                                         tuple[int, ...] | None]:
    """``global_size`` without trailing 1s past the first dimension, and ``local_size`` cut to the same length."""
    dims = len(global_size)
    while dims > 1 and global_size[dims - 1] == 1 and (local_size is None or local_size[dims - 1] == 1):
        dims -= 1
    return tuple(int(g) for g in global_size[:dims]), None if local_size is None else tuple(
        int(s) for s in local_size[:dims])


def event_seconds(event: Any, start_event: Any = None) -> float:
    """Device time from the start of ``start_event`` (default: ``event``) to the end of ``event``."""
    first = event if start_event is None else start_event
    return (event.profile.end - first.profile.start) * 1e-9


class CLProgram:
    """A kernel loaded from a program binary: ``CLProgram(device, name, binary)(*bufs, global_size=...)``.

    ``binary`` is what :class:`~ember_opencl.compiler.CLCompiler` returns: a
    :class:`~ember.device.batch_compiler.KernelBinary` naming the kernel's symbol in a program that may
    hold the other kernels of its batch; kernels of one program share one loaded ``cl.Program``.

    Buffers are :class:`~ember_opencl.allocator.CLBuffer` handles; ``vals`` are the int variables,
    passed as 64-bit ``long`` arguments after the buffers. A launch only enqueues the kernel;
    with ``wait`` it also waits and returns the kernel's device time in seconds (from the
    queue's profiling counters).
    """

    def __init__(self, device: Any, name: str, binary: bytes):
        self.cl = import_pyopencl()
        self.device, self.name, self.binary = device, name, binary
        try:
            kb = KernelBinary.unpack(binary)
        except ValueError as e:
            raise ValueError(f"kernel {name}: {e}") from None
        self.symbol = kb.kernel_symbol(name)
        self.program = device.load_program(kb.program)
        self.kernel = self.new_kernel()
        #: kernel parameters: the buffers the program uses (a trailing unused buffer has none), then the ints
        self.num_args = int(self.kernel.num_args)
        self._bound: tuple[Any, ...] | None = None  # the arguments the kernel object holds now

    def new_kernel(self) -> Any:
        """A fresh ``cl.Kernel`` of this program (each holds its own argument values)."""
        return self.cl.Kernel(self.program, self.symbol)

    def buffer_args(self, bufs: Sequence[Any], vals: Sequence[int]) -> list[Any]:
        """The ``cl.Buffer`` of each buffer parameter (buffers past the kernel's last parameter are unused)."""
        count = self.num_args - len(vals)
        if count < 0 or count > len(bufs):
            raise ValueError(f"kernel {self.name} takes {self.num_args} arguments; got {len(bufs)} buffers and "
                             f"{len(vals)} int variables")
        return [b.mem for b in bufs[:count]]

    def __call__(self, *bufs: Any, global_size: Sequence[int] = (1, 1, 1), local_size: Sequence[int] | None = None,
                 vals: Sequence[int] = (), wait: bool = False) -> float | None:
        args = (*bufs, *vals)
        if args != self._bound:
            set_kernel_args(self.kernel, self.buffer_args(bufs, vals), vals)
            self._bound = args
        gsize, lsize = launch_sizes(global_size, local_size)
        if 0 in gsize:  # an empty grid: nothing to run (OpenCL 1.2 rejects it)
            return 0.0 if wait else None
        if not wait:
            self.cl.enqueue_nd_range_kernel(self.device.queue, self.kernel, gsize, lsize)
            return None
        start = time.perf_counter()
        event = self.cl.enqueue_nd_range_kernel(self.device.queue, self.kernel, gsize, lsize)
        event.wait()
        try:
            return event_seconds(event)
        except self.cl.Error:  # a driver without profiling counters: host time instead
            return time.perf_counter() - start

    def __repr__(self) -> str:
        return f"<CLProgram {self.name} on {self.device.device}>"


def set_kernel_args(kernel: Any, mems: Sequence[Any], vals: Sequence[int]) -> None:
    """Bind buffers, then the int variables as 64-bit values."""
    for i, mem in enumerate(mems):
        kernel.set_arg(i, mem)
    set_val_args(kernel, len(mems), vals)


_LONG = struct.Struct("<q")


def set_val_args(kernel: Any, first: int, vals: Sequence[int]) -> None:
    """Bind the int variables ``vals`` as 64-bit arguments ``first, first + 1, ...``.

    pyopencl's generic ``set_arg`` finds a scalar's type by trying the buffer types first, which
    costs about 30 times a buffer's binding on PoCL; the packed bytes go straight to clSetKernelArg.
    """
    set_buf = getattr(kernel, "_set_arg_buf", None)
    for j, v in enumerate(vals):
        if set_buf is None:  # a pyopencl without the raw-bytes binding
            kernel.set_arg(first + j, np.int64(v))
        else:
            set_buf(first + j, _LONG.pack(v))
