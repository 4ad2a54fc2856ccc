"""The CPU device on hardware command queues (``CPU_HCQ=1``): the HCQ layer proven without a GPU.

Each ``CPU`` device gets two engines, compute and copy. An engine is a native worker thread
consuming a ring of commands in memory, as a GPU's command processor would: Python encodes each
command as five 64-bit words (op, three addresses, a value), publishes the ring's new head and
wakes the worker; the worker runs kernels (the same compiled C functions the default CPU device
calls, reading their arguments from the argument block a command points at), copies, waits and
signal writes without ever taking Python's GIL. Signals are two 64-bit words in host memory
(value, timestamp); host waits block in C with a timeout, so a hung queue raises instead of
hanging Python.
"""
from __future__ import annotations

import collections
import functools
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from ember.device import (
    DEFAULT_TIMEOUT_S,
    Compiled,
    Copy,
    Exec,
    HCQDevice,
    HCQGraph,
    HCQProgram,
    HWQueue,
    KernelArgs,
    KernelBinary,
    MemoryBarrier,
    Signal,
    SignalCmd,
    Timeline,
    Timestamp,
    Wait,
    profiled_copy,
)
from ember_cpu.allocator import CPUAllocator, CPUBuffer
from ember_cpu.compiler import CPUCompiler
from ember_cpu.renderer import CPURenderer
from ember_cpu.runtime import CPUProgram, SharedObject, ffi, load_shared_object
from ember_cpu.toolchain import probe_toolchain

ENGINE_SRC = r"""#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*ember_kernel_fn)(void **bufs, const long long *vals);
enum { CMD_EXEC = 1, CMD_WAIT = 2, CMD_SIGNAL = 3, CMD_TIMESTAMP = 4, CMD_COPY = 5, CMD_BARRIER = 6 };

/* every signal write wakes every waiter: waits are rare and short, one condition is enough */
static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sig_cv;
static pthread_once_t sig_once = PTHREAD_ONCE_INIT;
static void sig_init(void) {
  pthread_condattr_t a; pthread_condattr_init(&a); pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&sig_cv, &a);
}

unsigned long long ember_hcq_now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

void ember_hcq_signal(unsigned long long *word, unsigned long long value) {
  pthread_once(&sig_once, sig_init);
  pthread_mutex_lock(&sig_mu);
  __atomic_store_n(word, value, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&sig_cv);
  pthread_mutex_unlock(&sig_mu);
}

/* 0 once *word >= value, 1 when timeout_ns (< 0: none) passed first */
int ember_hcq_wait(unsigned long long *word, unsigned long long value, long long timeout_ns) {
  pthread_once(&sig_once, sig_init);
  if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= value) return 0;
  struct timespec dl; clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_ns >= 0) {
    long long ns = dl.tv_nsec + timeout_ns % 1000000000ll;
    dl.tv_sec += timeout_ns / 1000000000ll + ns / 1000000000ll; dl.tv_nsec = ns % 1000000000ll;
  }
  int timed_out = 0;
  pthread_mutex_lock(&sig_mu);
  while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < value) {
    if (timeout_ns < 0) pthread_cond_wait(&sig_cv, &sig_mu);
    else if (pthread_cond_timedwait(&sig_cv, &sig_mu, &dl) != 0) {
      timed_out = __atomic_load_n(word, __ATOMIC_ACQUIRE) < value; break; }
  }
  pthread_mutex_unlock(&sig_mu);
  return timed_out;
}

typedef struct {
  long long *ring, cap, head, tail, stop;
  pthread_mutex_t mu; pthread_cond_t cv; pthread_t th;
} ember_engine;

static void run(const long long *c) {
  switch (c[0]) {
    case CMD_EXEC: ((ember_kernel_fn)(void *)c[1])((void **)(void *)c[2], (const long long *)(void *)c[3]); break;
    case CMD_WAIT: ember_hcq_wait((unsigned long long *)(void *)c[1], (unsigned long long)c[4], -1); break;
    case CMD_SIGNAL: ember_hcq_signal((unsigned long long *)(void *)c[1], (unsigned long long)c[4]); break;
    case CMD_TIMESTAMP:
      __atomic_store_n((unsigned long long *)(void *)c[1] + 1, ember_hcq_now(), __ATOMIC_RELEASE); break;
    case CMD_COPY: memmove((void *)c[1], (const void *)c[2], (size_t)c[4]); break;
    default: __atomic_thread_fence(__ATOMIC_SEQ_CST); break;
  }
}

static void *worker(void *p) {
  ember_engine *e = (ember_engine *)p;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (e->tail == e->head && !e->stop) pthread_cond_wait(&e->cv, &e->mu);
    long long head = e->head, stop = e->stop;
    pthread_mutex_unlock(&e->mu);
    if (e->tail == head && stop) return 0;
    for (long long t = e->tail; t < head; t++) {
      run(e->ring + (t % e->cap) * 5);
      __atomic_store_n(&e->tail, t + 1, __ATOMIC_RELEASE);
    }
  }
}

void *ember_hcq_engine_start(long long *ring, long long cap) {
  ember_engine *e = (ember_engine *)calloc(1, sizeof(ember_engine));
  if (!e) return 0;
  e->ring = ring; e->cap = cap;
  pthread_mutex_init(&e->mu, 0); pthread_cond_init(&e->cv, 0);
  if (pthread_create(&e->th, 0, worker, e) != 0) { free(e); return 0; }
  pthread_detach(e->th);
  return e;
}

void ember_hcq_engine_push(void *p, long long head) {
  ember_engine *e = (ember_engine *)p;
  pthread_mutex_lock(&e->mu); e->head = head; pthread_cond_signal(&e->cv); pthread_mutex_unlock(&e->mu);
}

long long ember_hcq_engine_tail(void *p) { return __atomic_load_n(&((ember_engine *)p)->tail, __ATOMIC_ACQUIRE); }

void ember_hcq_engine_stop(void *p) {
  ember_engine *e = (ember_engine *)p;
  pthread_mutex_lock(&e->mu); e->stop = 1; pthread_cond_signal(&e->cv); pthread_mutex_unlock(&e->mu);
}
"""

_ENGINE_FUNCTIONS = {
    "ember_hcq_now": "unsigned long long(*)(void)",
    "ember_hcq_signal": "void(*)(unsigned long long *, unsigned long long)",
    "ember_hcq_wait": "int(*)(unsigned long long *, unsigned long long, long long)",
    "ember_hcq_engine_start": "void *(*)(long long *, long long)",
    "ember_hcq_engine_push": "void(*)(void *, long long)",
    "ember_hcq_engine_tail": "long long(*)(void *)",
    "ember_hcq_engine_stop": "void(*)(void *)",
}
_OPS = {Exec: 1, Wait: 2, SignalCmd: 3, Timestamp: 4, Copy: 5, MemoryBarrier: 6}
#: commands an engine's ring holds; a submission waits for room when the engine is this far behind
RING_SIZE = 4096
#: a host wait blocks in C for at most this long at a time, then checks its deadline again
_WAIT_SLICE_NS = 50_000_000


@functools.cache
def engine_library() -> tuple[SharedObject, dict[str, Any]]:
    """The compiled engine (built once, through the compile cache) and its functions."""
    lib = load_shared_object(KernelBinary.unpack(CPUCompiler(openmp=False).compile_cached(ENGINE_SRC)).program)
    return lib, {name[len("ember_hcq_"):]: lib.function(name, ctype) for name, ctype in _ENGINE_FUNCTIONS.items()}


def _fn(name: str) -> Any:
    return engine_library()[1][name]


def _address(cdata: Any) -> int:
    return 0 if cdata == ffi.NULL else int(ffi.cast("uintptr_t", cdata))


class CPUSignal(Signal):
    """A signal as two 64-bit words (value, timestamp) the engines write and wait on natively."""

    def __init__(self, device: str, name: str = "signal", value: int = 0):
        self.words = ffi.new("unsigned long long[2]")
        self.address = _address(self.words)
        super().__init__(device, name, value)

    def _read(self) -> tuple[int, int]:
        return int(self.words[0]), int(self.words[1])

    def _write(self, value: int, timestamp_ns: int) -> None:
        self.words[1] = timestamp_ns
        _fn("signal")(self.words, value)  # wakes engines waiting on it

    def wait(self, value: int, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_if_failed()
            if _fn("wait")(self.words, value, _WAIT_SLICE_NS) == 0:  # blocks in C, without the GIL
                return
            if deadline is not None and time.monotonic() > deadline:
                raise self._timeout(value, timeout)


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
    """One native worker thread and the ring of commands it consumes."""

    def __init__(self, device: str, name: str):
        self.name = f"{device} {name}"
        self.ring = ffi.new("long long[]", RING_SIZE * 5)
        self.handle = _fn("engine_start")(self.ring, RING_SIZE)
        if self.handle == ffi.NULL:
            raise RuntimeError(f"{self.name}: cannot start the engine's worker thread")
        self.head = 0
        self._tail, self._push = _fn("engine_tail"), _fn("engine_push")
        # what each submitted command points at stays alive until the engine has run it
        self._alive: collections.deque[tuple[int, list[Any]]] = collections.deque()
        self._lock = threading.Lock()
        # encodings of commands whose words never change (kernels, copies, timestamps): a graph's prebuilt
        # queue is encoded once; waits and signal writes carry values that are patched, so they are not kept
        self._encoded: weakref.WeakKeyDictionary[Any, tuple[list[int], list[Any]]] = weakref.WeakKeyDictionary()

    def submit(self, cmds: Sequence[Any]) -> None:
        """Encode ``cmds`` into the ring, publish them and wake the worker."""
        encoded = [self._encoded.get(cmd) or self._encode(cmd) for cmd in cmds]  # raises before publishing
        with self._lock:
            keep: list[Any] = []
            for words, refs in encoded:
                while self.head - self._tail(self.handle) >= RING_SIZE:
                    time.sleep(1e-5)  # the ring is full: the worker is this far behind
                base = (self.head % RING_SIZE) * 5
                self.ring[base:base + 5] = words
                keep.extend(refs)
                self.head += 1
            self._alive.append((self.head, keep))
            self._push(self.handle, self.head)
            tail = self._tail(self.handle)
            while self._alive and self._alive[0][0] <= tail:
                self._alive.popleft()

    def _encode(self, cmd: Any) -> tuple[list[int], list[Any]]:
        encoded = self._encode_words(cmd)
        if not isinstance(cmd, (Wait, SignalCmd)):
            self._encoded[cmd] = encoded
        return encoded

    def _encode_words(self, cmd: Any) -> tuple[list[int], list[Any]]:
        op = _OPS.get(type(cmd))
        if op is None:
            raise TypeError(f"{self.name}: cannot run {type(cmd).__name__}")
        if isinstance(cmd, Exec):
            fn = getattr(cmd.program, "fn", None)
            if fn is None or not isinstance(cmd.args, CPUKernelArgs):
                raise TypeError(f"{self.name}: exec needs a compiled CPU kernel and CPUKernelArgs, got "
                                f"{type(cmd.program).__name__} and {type(cmd.args).__name__}")
            words = [op, _address(fn), _address(cmd.args.buf_array), _address(cmd.args.val_array), 0]
            return words, [cmd.program, cmd.args]
        if isinstance(cmd, (Wait, SignalCmd)):
            return [op, self._signal_address(cmd.signal), 0, 0, cmd.value], [cmd.signal]
        if isinstance(cmd, Timestamp):
            return [op, self._signal_address(cmd.signal), 0, 0, 0], [cmd.signal]
        if isinstance(cmd, Copy):
            return [op, _address(cmd.dest.ptr), _address(cmd.src.ptr), 0, cmd.nbytes], [cmd.dest, cmd.src]
        return [op, 0, 0, 0, 0], []

    def _signal_address(self, signal: Signal) -> int:
        if not isinstance(signal, CPUSignal):
            raise TypeError(f"{self.name}: queues wait on and write CPUSignal, got {type(signal).__name__}")
        return signal.address

    def stop(self) -> None:
        """Let the worker thread finish what it has and exit."""
        _fn("engine_stop")(self.handle)


class CPUQueue(HWQueue):
    """A queue for one of the CPU device's engines."""

    def __init__(self, engine: str = "compute"):
        super().__init__()
        self.engine = engine

    def _submit(self, device: Any) -> None:
        device.engines[self.engine].submit(self.cmds)


class CPUHCQAllocator(CPUAllocator):
    """Host memory like the default CPU allocator; copies go through the copy engine, after earlier work."""

    def __init__(self) -> None:
        super().__init__()
        self.hcq: CPUHCQDevice | None = None

    def _through_copy_engine(self, dest: CPUBuffer, src: CPUBuffer, nbytes: int) -> None:
        dev = self.hcq
        assert dev is not None, "the allocator is used before its device exists"
        q = dev.copy_queue()
        profiled_copy(dev, q, dest, src, nbytes)
        value = dev.submit_and_signal(q)
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
        return CPUSignal(self.device, name, value)

    def _program(self, name: str, binary: bytes) -> HCQProgram:
        return HCQProgram(self, name, CPUProgram(name, binary), CPUKernelArgs)

    def _graph(self, calls: Sequence[tuple[Any, ...]]) -> HCQGraph:
        return HCQGraph(self, calls)

    def synchronize(self) -> None:
        HCQDevice.synchronize(self)

    def finalize(self) -> None:
        for engine in self.engines.values():
            engine.stop()
