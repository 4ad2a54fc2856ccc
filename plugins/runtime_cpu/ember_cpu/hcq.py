"""The CPU device on hardware command queues (``CPU_HCQ=1``): the HCQ layer proven without a GPU.

Each ``CPU`` device gets two worker threads, a compute engine and a copy engine, each consuming
the command lists submitted to its queue in order, as a GPU's command processor would. Signals
are words in host memory (:class:`ember.device.hcq.HostSignal`); kernels are the same compiled C
functions the default CPU device calls, reading their arguments from the argument block
(:class:`CPUKernelArgs`) the queue carries, which a graph patches in place between replays.

A command that raises marks the queue's signals failed, so the host's next wait raises the
error instead of hanging.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from ember.device import Compiled
from ember.device.hcq import (
    Copy,
    Exec,
    HCQDevice,
    HCQGraph,
    HCQProgram,
    HostSignal,
    HWQueue,
    KernelArgs,
    MemoryBarrier,
    Signal,
    SignalCmd,
    Timeline,
    Timestamp,
    Wait,
)
from ember_cpu.allocator import CPUAllocator, CPUBuffer
from ember_cpu.compiler import CPUCompiler
from ember_cpu.renderer import CPURenderer
from ember_cpu.runtime import CPUProgram, ffi


class CPUKernelArgs(KernelArgs):
    """The CPU kernel ABI's argument block: a ``void*`` array of buffers and a ``long long`` array of values."""

    def __init__(self, bufs: Sequence[CPUBuffer], vals: Sequence[int] = ()):
        super().__init__(bufs, vals)
        self.buf_array = ffi.new("void*[]", [b.ptr for b in bufs]) if bufs else ffi.NULL
        self.val_array = ffi.new("long long[]", list(vals)) if vals else ffi.NULL

    def update_buffer(self, index: int, buf: Any) -> None:
        if not 0 <= index < len(self.bufs):
            raise IndexError(f"this launch has {len(self.bufs)} buffers, no buffer {index}")
        super().update_buffer(index, buf)
        self.buf_array[index] = buf.ptr

    def update_var(self, index: int, value: int) -> None:
        if not 0 <= index < len(self.vals):
            raise IndexError(f"this launch has {len(self.vals)} runtime values, no value {index}")
        super().update_var(index, value)
        self.val_array[index] = value


class CPUEngine:
    """A worker thread that runs submitted command lists in order."""

    def __init__(self, device: str, name: str):
        self.name = f"{device} {name}"
        self.pending: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=f"ember {self.name}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (cmds := self.pending.get()) is not None:
            try:
                for cmd in cmds:
                    self._run(cmd)
            except BaseException as e:  # a failing command fails every signal the list would have written
                for cmd in cmds:
                    if isinstance(cmd, (SignalCmd, Timestamp)):
                        cmd.signal.fail(e)

    @staticmethod
    def _run(cmd: Any) -> None:
        if isinstance(cmd, Exec):
            cmd.program.fn(cmd.args.buf_array, cmd.args.val_array)
        elif isinstance(cmd, Wait):
            cmd.signal.wait(cmd.value, timeout=None)
        elif isinstance(cmd, SignalCmd):
            cmd.signal.set(cmd.value)
        elif isinstance(cmd, Timestamp):
            cmd.signal._write(cmd.signal.value, time.perf_counter_ns())
        elif isinstance(cmd, Copy):
            if cmd.nbytes:
                ffi.memmove(cmd.dest.ptr, cmd.src.ptr, cmd.nbytes)
        elif isinstance(cmd, MemoryBarrier):
            pass  # one process, and the engine's own ordering: writes are already visible
        else:
            raise TypeError(f"the CPU engine cannot run {type(cmd).__name__}")

    def stop(self) -> None:
        self.pending.put(None)


class CPUQueue(HWQueue):
    """A queue for one of the CPU device's engines."""

    def __init__(self, engine: str = "compute"):
        super().__init__()
        self.engine = engine

    def _submit(self, device: Any) -> None:
        device.engines[self.engine].pending.put(list(self.cmds))


class CPUHCQAllocator(CPUAllocator):
    """Host memory like the default CPU allocator; copies go through the copy engine, after earlier work."""

    def __init__(self) -> None:
        super().__init__()
        self.hcq: CPUHCQDevice | None = None

    def _through_copy_engine(self, dest: CPUBuffer, src: CPUBuffer, nbytes: int) -> None:
        dev = self.hcq
        assert dev is not None, "the allocator is used before its device exists"
        value = dev.submit_and_signal(dev.copy_queue().copy(dest, src, nbytes))
        dev.timeline.signal.wait(value, timeout=dev.timeout)

    def copyin(self, dest: CPUBuffer, src: memoryview) -> None:
        nbytes = memoryview(src).nbytes
        staging = super()._alloc(nbytes, None)
        super().copyin(staging, src)  # checks sizes and layout like the default allocator
        self._through_copy_engine(dest, staging, nbytes)

    def copyout(self, dest: memoryview, src: CPUBuffer) -> None:
        nbytes = min(memoryview(dest).nbytes, src.nbytes)
        staging = super()._alloc(nbytes, None)
        self._through_copy_engine(staging, src, nbytes)
        super().copyout(dest, staging)

    def as_buffer(self, opaque: CPUBuffer) -> memoryview:
        if self.hcq is not None:
            self.hcq.synchronize()  # the host reads the memory directly: queued writes must land first
        return super().as_buffer(opaque)

    def transfer(self, dest: CPUBuffer, src: CPUBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        if nbytes > src.nbytes or nbytes > dest.nbytes:
            raise ValueError(f"transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
        self._through_copy_engine(dest, src, nbytes)


class CPUHCQDevice(Compiled, HCQDevice):
    """``CPU`` on command queues: a compute and a copy engine per device, signals in host memory."""

    def __init__(self, device: str = "CPU"):
        compiler = CPUCompiler()
        from ember_cpu.toolchain import probe_toolchain

        renderer = CPURenderer(float16=probe_toolchain(compiler.cc).float16)
        allocator = CPUHCQAllocator()
        super().__init__(device, allocator, renderer, compiler, self._program, self._graph)
        allocator.hcq = self
        self.engines = {"compute": CPUEngine(device, "compute"), "copy": CPUEngine(device, "copy")}
        self.timeline = Timeline(self.new_signal("timeline"))

    def compute_queue(self) -> CPUQueue:
        return CPUQueue("compute")

    def copy_queue(self) -> CPUQueue:
        return CPUQueue("copy")

    def new_signal(self, name: str = "signal", value: int = 0) -> Signal:
        return HostSignal(self.device, name, value)

    def _program(self, name: str, binary: bytes) -> HCQProgram:
        return HCQProgram(self, name, CPUProgram(name, binary), CPUKernelArgs)

    def _graph(self, calls: Sequence[tuple[Any, ...]]) -> HCQGraph:
        return HCQGraph(self, calls)

    def synchronize(self) -> None:
        HCQDevice.synchronize(self)

    def finalize(self) -> None:
        for engine in self.engines.values():
            engine.stop()
