"""HCQ: devices driven through hardware command queues that ember fills itself.

A queue-driven device exposes no runtime that launches kernels for us. Instead ember writes
commands into queues the device consumes in order, and devices and host synchronize through
*signals*: words in memory holding a value (and the time it was written) that a queue writes
and the host or another queue waits on. Every device keeps a *timeline*: one signal whose value
grows by one per submission, so "wait for everything so far" is "wait until the timeline signal
reaches the last value handed out".

What a device implements (each class says so in its docstring):

- :class:`Signal` — ``_read`` / ``_write`` of the value and timestamp words (and, optionally, a
  faster ``wait``). :class:`HostSignal` is a complete one for memory the host shares with the
  device.
- :class:`HWQueue` — ``_submit(device)``: hand the recorded commands to the hardware (or to a
  worker thread of the host's own). The builder methods (``wait``, ``signal``,
  ``timestamp``, ``exec``, ``copy``, ``memory_barrier``) are shared.
- :class:`KernelArgs` — the bytes a kernel launch reads its buffer addresses and runtime values
  from, in the device's own layout; ``update_buffer`` / ``update_var`` patch them in place.

:class:`HCQProgram`, :class:`HCQAllocator`-style copies and :class:`HCQGraph` are written once on
top of these. A graph is built once as a list of prebuilt queues; each replay patches buffer
addresses, runtime values and signal values in place and submits again.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ember.helpers import getenv

if TYPE_CHECKING:
    import numpy as np
else:
    from ember.helpers import lazy_numpy as np

#: how long a wait on a signal may take before it raises (seconds); a hung device never hangs Python
DEFAULT_TIMEOUT_S = 30.0


class HCQTimeoutError(RuntimeError):
    """A signal did not reach the value waited for in time (the device is hung or a command failed)."""


class HCQCommandError(RuntimeError):
    """A command in a queue failed on the device; raised at the next wait on that device."""


class Signal:
    """A value (and the timestamp of its last write) in memory both a queue and the host can see.

    A device implements :meth:`_read` and :meth:`_write` for its own memory; :meth:`wait` polls
    :meth:`_read` with backoff unless the device overrides it with something better (an event,
    an interrupt).
    """

    def __init__(self, device: str, name: str = "signal", value: int = 0):
        self.device, self.name = device, name
        self.error: BaseException | None = None
        self._write(value, 0)

    # --- what a device implements ---------------------------------------------------------
    def _read(self) -> tuple[int, int]:
        """(value, timestamp in ns) as the device last wrote them."""
        raise NotImplementedError(f"{type(self).__name__} must implement _read")

    def _write(self, value: int, timestamp_ns: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement _write")

    # --- shared -----------------------------------------------------------------------------
    @property
    def value(self) -> int:
        """The value last written."""
        return self._read()[0]

    @property
    def timestamp_ns(self) -> int:
        """When the last ``timestamp`` command (or write) touched this signal, in ns of ``time.perf_counter_ns``."""
        return self._read()[1]

    def set(self, value: int) -> None:
        """Write ``value`` (keeping the timestamp)."""
        self._write(value, self._read()[1])

    def fail(self, error: BaseException) -> None:
        """Mark the signal failed: every current and later :meth:`wait` raises :class:`HCQCommandError`."""
        self.error = error
        self._write(self._read()[0], self._read()[1])

    def wait(self, value: int, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Block until the signal's value is at least ``value``; raise :class:`HCQTimeoutError` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 1e-6
        while True:
            self._raise_if_failed()
            if self._read()[0] >= value:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise self._timeout(value, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise HCQCommandError(f"{self.device}: a command before {self.name} failed: "
                                  f"{type(self.error).__name__}: {self.error}") from self.error

    def _timeout(self, value: int, timeout: float | None) -> HCQTimeoutError:
        return HCQTimeoutError(f"{self.device}: {self.name} did not reach {value} within {timeout} s "
                               f"(it holds {self._read()[0]}); the device may be hung")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device} {self.name}={self.value}>"


class HostSignal(Signal):
    """A signal in host memory (two 64-bit words: value, timestamp) with a condition variable for waits."""

    def __init__(self, device: str, name: str = "signal", value: int = 0):
        self.words = np.zeros(2, dtype=np.uint64)
        self._cond = threading.Condition()
        super().__init__(device, name, value)

    def _read(self) -> tuple[int, int]:
        return int(self.words[0]), int(self.words[1])

    def _write(self, value: int, timestamp_ns: int) -> None:
        with self._cond:
            self.words[0], self.words[1] = value, timestamp_ns
            self._cond.notify_all()

    def wait(self, value: int, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_if_failed()
                if int(self.words[0]) >= value:
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise self._timeout(value, timeout)
                self._cond.wait(left)


# --- commands: small records a queue holds; mutable so a prebuilt queue can be patched in place, and
# compared by identity so a device may cache each command's encoding ---
@dataclass(eq=False)
class Wait:
    signal: Signal
    value: int


@dataclass(eq=False)
class SignalCmd:
    signal: Signal
    value: int


@dataclass(eq=False)
class Timestamp:
    signal: Signal


@dataclass(eq=False)
class Exec:
    program: Any
    args: KernelArgs
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None


@dataclass(eq=False)
class Copy:
    dest: Any
    src: Any
    nbytes: int


@dataclass(eq=False)
class MemoryBarrier:
    pass


Command = Wait | SignalCmd | Timestamp | Exec | Copy | MemoryBarrier


class KernelArgs:
    """The argument block of one kernel launch: buffer addresses and runtime values in the device's layout.

    The base class keeps them as Python lists; a device subclass packs them where its kernels
    read them (for C kernels on the host: a ``void*`` array and a ``long long`` array) and overrides the two
    ``update_*`` methods to patch that memory in place.
    """

    def __init__(self, bufs: Sequence[Any], vals: Sequence[int] = ()):
        self.bufs, self.vals = list(bufs), list(vals)

    def update_buffer(self, index: int, buf: Any) -> None:
        """Point buffer argument ``index`` at ``buf``."""
        self.bufs[index] = buf

    def update_var(self, index: int, value: int) -> None:
        """Set runtime value ``index``."""
        self.vals[index] = value


class HWQueue:
    """A list of commands for one hardware queue, built with chained calls and submitted to a device.

    ``HWQueue().wait(sig, 3).exec(prg, args, gs, ls).signal(timeline, 4).submit(dev)``. A device
    implements :meth:`_submit`; everything else is shared. A submitted queue may be submitted again
    (a graph does so on every replay, after patching its commands).
    """

    #: which engine of the device consumes this queue ("compute" or "copy"); queues of one engine run in order
    engine: str = "compute"

    def __init__(self) -> None:
        self.cmds: list[Command] = []

    def wait(self, signal: Signal, value: int) -> HWQueue:
        """Stall the queue until ``signal`` holds at least ``value``."""
        self.cmds.append(Wait(signal, value))
        return self

    def signal(self, signal: Signal, value: int) -> HWQueue:
        """Write ``value`` to ``signal`` once every earlier command of this queue has finished."""
        self.cmds.append(SignalCmd(signal, value))
        return self

    def timestamp(self, signal: Signal) -> HWQueue:
        """Record the current time in ``signal``'s timestamp word."""
        self.cmds.append(Timestamp(signal))
        return self

    def exec(self, program: Any, args: KernelArgs, global_size: tuple[int, ...],
             local_size: tuple[int, ...] | None = None) -> HWQueue:
        """Run ``program`` with the argument block ``args``."""
        self.cmds.append(Exec(program, args, tuple(global_size), None if local_size is None else tuple(local_size)))
        return self

    def copy(self, dest: Any, src: Any, nbytes: int) -> HWQueue:
        """Copy ``nbytes`` from device buffer ``src`` to ``dest`` (a copy queue's command)."""
        self.cmds.append(Copy(dest, src, nbytes))
        return self

    def memory_barrier(self) -> HWQueue:
        """Make earlier writes visible to later commands and to the host."""
        self.cmds.append(MemoryBarrier())
        return self

    def submit(self, device: HCQDevice) -> HWQueue:
        """Hand the commands to ``device``; returns self so a queue can be kept and submitted again."""
        self._submit(device)
        return self

    def _submit(self, device: HCQDevice) -> None:
        """Hand a snapshot of ``self.cmds`` to the device (the list may change right after this returns;
        the command objects themselves are only patched once the device finished with them)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _submit")


@dataclass
class Timeline:
    """A device's timeline: one signal and the next value to hand out.

    Values wrap around before ``limit`` (a hardware signal word may be 32 bits): the host waits for
    everything so far, resets the signal to 0 and starts again at 1.
    """

    signal: Signal
    limit: int = (1 << 32) - 1
    value: int = field(default=1)

    def next(self, drain: Callable[[], None]) -> int:
        """The value the next submission signals (``drain`` waits for the device first when the timeline wraps)."""
        if self.value >= self.limit:
            drain()
            self.signal.set(0)
            self.value = 1
        v = self.value
        self.value += 1
        return v

    @property
    def last(self) -> int:
        """The last value handed out (0 when none)."""
        return self.value - 1


class HCQDevice:
    """What a queue-driven device provides on top of :class:`~ember.device.Compiled`.

    A device sets ``self.timeline`` and implements :meth:`compute_queue`, :meth:`copy_queue` and
    :meth:`new_signal`; :meth:`synchronize` and :meth:`submit_and_signal` are shared.
    """

    device: str
    timeline: Timeline
    #: seconds a synchronize may wait before raising (a hung device never hangs Python)
    timeout: float = DEFAULT_TIMEOUT_S

    def compute_queue(self) -> HWQueue:
        raise NotImplementedError(f"{type(self).__name__} must implement compute_queue")

    def copy_queue(self) -> HWQueue:
        raise NotImplementedError(f"{type(self).__name__} must implement copy_queue")

    def new_signal(self, name: str = "signal", value: int = 0) -> Signal:
        raise NotImplementedError(f"{type(self).__name__} must implement new_signal")

    def synchronize(self) -> None:
        """Wait until every submission so far has finished (raising if one failed or the device hangs)."""
        self.timeline.signal.wait(self.timeline.last, timeout=self.timeout)

    def submit_and_signal(self, queue: HWQueue) -> int:
        """Append "signal the timeline" to ``queue``, submit it, and return the value it will signal.

        Submissions to one engine finish in order; a submission to another engine than the previous
        one first waits for the timeline, so the timeline's value only ever grows.
        """
        value = self.timeline.next(self.synchronize)
        engine_changed = getattr(self, "_last_engine", queue.engine) != queue.engine
        self._last_engine = queue.engine
        if engine_changed:
            queue.cmds.insert(0, Wait(self.timeline.signal, value - 1))
        queue.signal(self.timeline.signal, value).submit(self)
        queue.cmds.pop()  # the queue can be reused without the timeline commands
        if engine_changed:
            queue.cmds.pop(0)
        return value


class Profiler:
    """``PROFILE=1``: every kernel and copy a queue runs, as spans between two signal timestamps.

    At exit the spans are written as Chrome trace-event JSON (``PROFILE_PATH``, default
    ``ember_profile.json``) that chrome://tracing and Perfetto open: one process per device, one
    thread per engine.
    """

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, Signal, Signal]] = []
        self._registered = False

    @staticmethod
    def enabled() -> bool:
        return bool(getenv("PROFILE", 0))

    def record(self, device: str, engine: str, name: str, start: Signal, end: Signal) -> None:
        """Remember a span whose timestamps ``start`` and ``end`` will hold once the queue ran it."""
        self.spans.append((device, engine, name, start, end))
        if not self._registered:
            self._registered = True
            atexit.register(self.write)

    def events(self) -> list[dict[str, Any]]:
        """The recorded spans as trace events (times in microseconds since the first span)."""
        done = [s for s in self.spans if s[4].timestamp_ns >= s[3].timestamp_ns > 0]
        t0 = min((s[3].timestamp_ns for s in done), default=0)
        return [{"name": name, "cat": engine, "ph": "X", "pid": device, "tid": engine,
                 "ts": (start.timestamp_ns - t0) / 1e3, "dur": (end.timestamp_ns - start.timestamp_ns) / 1e3}
                for device, engine, name, start, end in done]

    def write(self, path: str | None = None) -> str:
        """Write the trace (to ``path``, else ``PROFILE_PATH``, else ``ember_profile.json``); return the path."""
        path = path or os.environ.get("PROFILE_PATH") or "ember_profile.json"
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events(), "displayTimeUnit": "ms"}, f)
        return path


PROFILER = Profiler()


def profiled_exec(device: HCQDevice, queue: HWQueue, name: str, program: Any, args: KernelArgs,
                  global_size: tuple[int, ...], local_size: tuple[int, ...] | None) -> None:
    """``queue.exec(...)``, between two timestamps recorded as a profile span when ``PROFILE=1``."""
    if not Profiler.enabled():
        queue.exec(program, args, global_size, local_size)
        return
    start, end = device.new_signal(f"{name} start"), device.new_signal(f"{name} end")
    queue.timestamp(start).exec(program, args, global_size, local_size).timestamp(end)
    PROFILER.record(getattr(device, "device", "?"), queue.engine, name, start, end)


def profiled_copy(device: HCQDevice, queue: HWQueue, dest: Any, src: Any, nbytes: int) -> None:
    """``queue.copy(...)``, recorded as a profile span when ``PROFILE=1``."""
    if not Profiler.enabled():
        queue.copy(dest, src, nbytes)
        return
    start, end = device.new_signal("copy start"), device.new_signal("copy end")
    queue.timestamp(start).copy(dest, src, nbytes).timestamp(end)
    PROFILER.record(getattr(device, "device", "?"), queue.engine, f"copy {nbytes} bytes", start, end)


class HCQProgram:
    """A kernel launched through the device's compute queue; timed with two timestamp signals when waited on.

    ``make_args(bufs, vals)`` builds the device's :class:`KernelArgs`.
    """

    def __init__(self, device: HCQDevice, name: str, kernel: Any, make_args: Callable[..., KernelArgs]):
        self.device, self.name, self.kernel, self.make_args = device, name, kernel, make_args
        self._start = device.new_signal(f"{name} start")
        self._end = device.new_signal(f"{name} end")
        # argument blocks reused across launches with the same buffers and values (a launch reads its block
        # when it runs, and a reused block is never patched, so sharing it between queued launches is safe)
        self._arg_cache: dict[tuple[Any, ...], KernelArgs] = {}

    def _args(self, bufs: Sequence[Any], vals: Sequence[int]) -> KernelArgs:
        key = (*map(id, bufs), None, *vals)
        args = self._arg_cache.get(key)
        if args is None or any(a is not b for a, b in zip(args.bufs, bufs)):
            if len(self._arg_cache) >= 64:
                self._arg_cache.clear()
            args = self._arg_cache[key] = self.make_args(bufs, vals)
        return args

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: Sequence[int] = (),
                 wait: bool = False) -> float | None:
        q = self.device.compute_queue()
        if wait:
            q.timestamp(self._start)
        profiled_exec(self.device, q, self.name, self.kernel, self._args(bufs, vals), global_size, local_size)
        if wait:
            q.timestamp(self._end)
        value = self.device.submit_and_signal(q)
        if not wait:
            return None
        self.device.timeline.signal.wait(value, timeout=self.device.timeout)
        return (self._end.timestamp_ns - self._start.timestamp_ns) / 1e9


class HCQGraph:
    """A captured list of kernel calls replayed as one prebuilt compute queue, patched in place.

    ``calls`` are ``(program, bufs, vals[, global_size, local_size])`` (the graph contract) with
    ``program`` an :class:`HCQProgram`. Replaying updates only what changed (:meth:`update_buffer`,
    :meth:`update_vals`) and submits the same queue again.
    """

    def __init__(self, device: HCQDevice, calls: Sequence[tuple[Any, ...]]):
        self.device = device
        self.queue = device.compute_queue()
        self.args: list[KernelArgs] = []
        self._start, self._end = device.new_signal("graph start"), device.new_signal("graph end")
        self.queue.timestamp(self._start)
        for i, (prg, bufs, vals, *sizes) in enumerate(calls):
            if not isinstance(prg, HCQProgram):
                raise TypeError(f"HCQGraph call {i}: expected an HCQProgram, got {type(prg).__name__}")
            args = prg.make_args(bufs, vals)
            self.args.append(args)
            global_size = tuple(sizes[0]) if sizes and sizes[0] is not None else (1, 1, 1)
            local_size = tuple(sizes[1]) if len(sizes) > 1 and sizes[1] is not None else None
            profiled_exec(device, self.queue, prg.name, prg.kernel, args, global_size, local_size)
        self.queue.timestamp(self._end)
        self._last = 0  # the timeline value of the latest replay

    def _idle(self) -> None:
        # a replay still running reads these argument blocks: patch only after it finished
        if self._last:
            self.device.timeline.signal.wait(self._last, timeout=self.device.timeout)

    def update_buffer(self, call_index: int, buf_index: int, opaque: Any) -> None:
        """Point buffer ``buf_index`` of call ``call_index`` at ``opaque``."""
        self._idle()
        self.args[call_index].update_buffer(buf_index, opaque)

    def update_vals(self, call_index: int, vals: Sequence[int]) -> None:
        """Replace the runtime values of call ``call_index`` (as many as it was captured with)."""
        count = len(self.args[call_index].vals)
        if len(vals) != count:
            raise ValueError(f"call {call_index} takes {count} runtime values, got {len(vals)}")
        self._idle()
        for i, v in enumerate(vals):
            self.args[call_index].update_var(i, v)

    def __len__(self) -> int:
        return len(self.args)

    def __call__(self, wait: bool = False) -> float | None:
        value = self._last = self.device.submit_and_signal(self.queue)
        if not wait:
            return None
        self.device.timeline.signal.wait(value, timeout=self.device.timeout)
        return (self._end.timestamp_ns - self._start.timestamp_ns) / 1e9
