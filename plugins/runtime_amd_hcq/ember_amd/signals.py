"""AMD signals: value and timestamp words in GPU-visible host memory, with KFD events for host waits."""
from __future__ import annotations

import ctypes
import threading
import time
import weakref
from typing import TYPE_CHECKING

from ember.device import DEFAULT_TIMEOUT_S, Signal

if TYPE_CHECKING:
    from ember_amd.device import AMDDevice

#: a host wait blocks in WAIT_EVENTS for at most this long before it checks the signal again
EVENT_WAIT_SLICE_MS = 50
#: value (u64), timestamp ticks (u64), padding: 8-byte aligned for RELEASE_MEM and SDMA
SIGNAL_BYTES = 32


class SignalPool:
    """Signals in host-visible, uncached GTT memory. The slot of a signal that is gone is reused only once the
    timeline passed every submission made before it went (a queued command may still write it)."""

    def __init__(self, dev: AMDDevice):
        self.dev = dev
        self.free: list[int] = []
        self.retired: list[tuple[int, int]] = []  # (address, timeline value to wait for)
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            timeline = getattr(self.dev, "timeline", None)
            if self.retired and timeline is not None:
                done = timeline.signal.value
                self.free += [addr for addr, tag in self.retired if tag <= done]
                self.retired = [(addr, tag) for addr, tag in self.retired if tag > done]
            if not self.free:
                mem = self.dev.mem_alloc(64 * 1024, vram=False, host=True, uncached=True)
                self.free = list(range(mem.va, mem.va + mem.size, SIGNAL_BYTES))[::-1]
            return self.free.pop()

    def give(self, addr: int) -> None:
        timeline = getattr(self.dev, "timeline", None)
        with self.lock:
            self.retired.append((addr, timeline.last if timeline is not None else 0))


class AMDSignal(Signal):
    """A signal in GPU-visible host memory: the queues write it with RELEASE_MEM / SDMA FENCE and raise the
    device's KFD event, on which host waits block (``WAIT_EVENTS``) instead of spinning."""

    def __init__(self, dev: AMDDevice, name: str = "signal", value: int = 0):
        self.dev = dev
        self.address = dev.signals.take()
        weakref.finalize(self, dev.signals.give, self.address)
        self._words = (ctypes.c_uint64 * 2).from_address(self.address)
        super().__init__(dev.device, name, value)

    def _read(self) -> tuple[int, int]:
        return int(self._words[0]), int(self._words[1]) * 1_000_000_000 // self.dev.table.timestamp_hz

    def _write(self, value: int, timestamp_ns: int) -> None:
        self._words[1] = timestamp_ns * self.dev.table.timestamp_hz // 1_000_000_000
        self._words[0] = value

    def wait(self, value: int, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_if_failed()
            if self._words[0] >= value:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._timeout(value, timeout)
            slice_ms = EVENT_WAIT_SLICE_MS if left is None else max(1, min(EVENT_WAIT_SLICE_MS, int(left * 1000)))
            self.dev.wait_event(slice_ms)
