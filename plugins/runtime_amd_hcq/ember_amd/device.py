"""The AMD device on KFD: GPU memory, a PM4 compute queue and an SDMA copy queue, signals, programs, graphs.

Layers (each below only uses the one under it):

- :class:`KFDContext`: the process's ``/dev/kfd`` file and event page, through the OS interface
  (:class:`ember_amd.kfd.RealOS`, or the mock with ``AMD_MOCK=1``).
- :class:`GPUMemory`: one KFD allocation: an address range reserved with ``mmap``, allocated in
  VRAM or GTT at that address, mapped to the GPU and, when the host needs it, into the process
  through the render node (GPU address == host address).
- :class:`HWRing`: one KFD user-mode queue: ring, read/write pointers, doorbell.
- :class:`AMDSignal`, :class:`AMDKernelArgs`, :class:`AMDQueue`: the HCQ layer's pieces
  (``ember.device.hcq``), encoded as PM4 packets (compute) or SDMA packets (copy).
- :class:`AMDDevice`: ``Compiled`` + ``HCQDevice``; programs are ``HCQProgram`` and graphs ``HCQGraph``.

Nothing here has run on an AMD GPU; see ``docs/amd.md`` for exactly what has.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ember.device import (
    DEFAULT_TIMEOUT_S,
    BufferSpec,
    Compiled,
    Copy,
    Exec,
    HCQDevice,
    HCQGraph,
    HCQProgram,
    HWQueue,
    KernelArgs,
    LRUAllocator,
    MemoryBarrier,
    Signal,
    SignalCmd,
    Timeline,
    Timestamp,
    Wait,
    copyin_source,
    copyout_dest,
    getenv,
    profiled_copy,
)
from ember_amd import gfx, kfd, pm4, sdma
from ember_amd.gfx import GfxTable

PAGE = kfd.PAGE
#: bytes of each queue's ring (a power of two)
RING_BYTES = 1 << 20
#: bytes of host-visible staging one copy to or from the host goes through at a time
STAGING_BYTES = 16 << 20
#: a host wait blocks in WAIT_EVENTS for at most this long before it checks the signal again
EVENT_WAIT_SLICE_MS = 50


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


# --- the OS interface and the process's KFD context ----------------------------------------------------
@functools.cache
def os_interface() -> kfd.OSInterface:
    """The mock (``AMD_MOCK=1``, target ``AMD_MOCK_ARCH``, default gfx1100) or the real operating system."""
    if getenv("AMD_MOCK", 0):
        from ember_amd.mock_kfd import MockKFD

        return MockKFD(os.environ.get("AMD_MOCK_ARCH", "gfx1100") or "gfx1100")
    return kfd.RealOS()


class KFDContext:
    """``/dev/kfd`` opened once per process (the driver keeps one process context per process) and the event
    page every signal event of the process lives in."""

    def __init__(self, osif: kfd.OSInterface):
        self.os = osif
        self.fd = osif.open(kfd.KFD_PATH, os.O_RDWR)
        version = kfd.ioctl(osif, self.fd, "GET_VERSION")
        if version.major_version != kfd.KFD_MAJOR:
            raise RuntimeError(f"KFD ioctl interface {version.major_version}.{version.minor_version}: this runtime "
                               f"speaks major version {kfd.KFD_MAJOR}")
        self.event_page: GPUMemory | None = None
        self.lock = threading.Lock()


_contexts: dict[int, KFDContext] = {}


def kfd_context(osif: kfd.OSInterface) -> KFDContext:
    """The KFD context of ``osif`` (one per OS interface object: the real one, or each mock)."""
    ctx = _contexts.get(id(osif))
    if ctx is None or ctx.os is not osif:
        ctx = _contexts[id(osif)] = KFDContext(osif)
    return ctx


def device_index(device: str) -> int:
    """``AMD`` -> 0, ``AMD:2`` -> 2."""
    _, _, rest = device.partition(":")
    if rest and not rest.isdigit():
        raise ValueError(f"device name {device!r}: expected AMD or AMD:N")
    return int(rest or 0)


def context_save_sizes(arch: str, props: dict[str, int]) -> tuple[int, int, int]:
    """:meth:`AMDDevice.context_save_sizes` for gfx target ``arch`` and topology ``props``."""
    xccs = max(1, props.get("num_xcc", 1))
    cus = max(1, props.get("simd_count", 0) // max(1, props.get("simd_per_cu", 2)) // xccs)
    gfx9 = arch.startswith("gfx9")
    if gfx9:
        engines = max(1, props.get("array_count", 1) // max(1, props.get("simd_arrays_per_engine", 1)) // xccs)
        waves = min(cus * 40, engines * xccs * 512)
    else:
        waves = cus * props.get("max_waves_per_simd", 16) * props.get("simd_per_cu", 2)
    if "ctl_stack_size" in props and "cwsr_size" in props:
        ctl, ctx = props["ctl_stack_size"], props["cwsr_size"]
    else:
        vgprs = 0x60000 if arch in ("gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201") else \
            0x80000 if gfx9 else 0x40000
        ctl = _round_up((8 if gfx9 else 12) * waves + 8 + 40, PAGE)
        ctx = ctl + _round_up((vgprs + 0x4000 + 0x10000 + 0x1000) * cus, PAGE)
    debug = _round_up(waves * 32, 64)
    return ctl, ctx, _round_up((ctx + debug) * xccs, PAGE)


# --- memory ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class GPUMemory:
    """One KFD allocation at GPU address ``va`` (== its host address when ``host`` is true)."""

    va: int
    size: int  # page-rounded
    handle: int
    flags: int
    host: bool

    def view(self, nbytes: int | None = None, offset: int = 0) -> memoryview:
        """The host's view of the memory (host-visible allocations only)."""
        assert self.host, "not mapped into the process"
        n = self.size - offset if nbytes is None else nbytes
        return memoryview((ctypes.c_char * n).from_address(self.va + offset)).cast("B")


class AMDBuffer:
    """An opaque AMD buffer: GPU address ``va``, ``nbytes``, and the allocation it lies in."""

    __slots__ = ("mem", "nbytes", "va")

    def __init__(self, mem: GPUMemory, va: int, nbytes: int):
        self.mem, self.va, self.nbytes = mem, va, nbytes

    def __repr__(self) -> str:
        return f"<AMDBuffer {self.nbytes} bytes at 0x{self.va:x}>"


class AMDAllocator(LRUAllocator):
    """Device memory in VRAM; ``BufferSpec(host_visible / cpu_access)`` memory in GTT, mapped into the process.

    Copies to and from the host go through host-visible staging and the SDMA copy queue, ordered
    after earlier work by the device's timeline.
    """

    oom_errors = (MemoryError,)

    def __init__(self, dev: AMDDevice):
        super().__init__()
        self.dev = dev
        self._staging: GPUMemory | None = None

    def _alloc(self, nbytes: int, options: Any) -> AMDBuffer:
        host = isinstance(options, BufferSpec) and (options.host_visible or options.cpu_access)
        mem = self.dev.mem_alloc(max(nbytes, 1), vram=not host, host=host, uncached=bool(host and options.uncached))
        return AMDBuffer(mem, mem.va, nbytes)

    def _free(self, opaque: AMDBuffer, nbytes: int, options: Any) -> None:
        self.dev.synchronize()  # queued work may still use it
        self.dev.mem_free(opaque.mem)

    def offset(self, opaque: AMDBuffer, byte_offset: int, nbytes: int) -> AMDBuffer:
        """A view of ``nbytes`` at ``byte_offset`` inside ``opaque`` (same memory, never freed itself)."""
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a buffer of "
                             f"{opaque.nbytes} bytes")
        return AMDBuffer(opaque.mem, opaque.va + byte_offset, nbytes)

    def as_buffer(self, opaque: AMDBuffer) -> memoryview:
        """A zero-copy host view, for host-visible buffers only (VRAM is not mapped into the process)."""
        if not opaque.mem.host:
            raise NotImplementedError("VRAM buffers are not mapped into the process: copy them out")
        self.dev.synchronize()
        return opaque.mem.view(opaque.nbytes, opaque.va - opaque.mem.va)

    def staging(self) -> GPUMemory:
        if self._staging is None:
            self._staging = self.dev.mem_alloc(STAGING_BYTES, vram=False, host=True, uncached=False)
        return self._staging

    def _copy(self, dest_va: int, src_va: int, nbytes: int) -> None:
        dev = self.dev
        q = dev.copy_queue()
        profiled_copy(dev, q, _Span(dest_va, nbytes), _Span(src_va, nbytes), nbytes)
        value = dev.submit_and_signal(q)
        dev.timeline.signal.wait(value, timeout=dev.timeout)

    def copyin(self, dest: AMDBuffer, src: memoryview) -> None:
        """Copy ``src`` into the start of ``dest`` through staging and the SDMA queue."""
        data = _bytes_view(copyin_source(src, dest.nbytes))
        staging = self.staging()
        for off in range(0, data.nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, data.nbytes - off)
            staging.view(n)[:] = data[off:off + n]
            self._copy(dest.va + off, staging.va, n)

    def copyout(self, dest: memoryview, src: AMDBuffer) -> None:
        """Fill ``dest`` from the start of ``src`` through the SDMA queue and staging."""
        out = _bytes_view(copyout_dest(dest, src.nbytes))
        staging = self.staging()
        for off in range(0, out.nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, out.nbytes - off)
            self._copy(staging.va, src.va + off, n)
            out[off:off + n] = staging.view(n)

    def transfer(self, dest: AMDBuffer, src: AMDBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        """Device-to-device on one GPU: one SDMA copy. Between GPUs core goes through the host."""
        if src_dev is not dest_dev:
            raise NotImplementedError("copies between AMD GPUs go through the host")
        if nbytes > src.nbytes or nbytes > dest.nbytes:
            raise ValueError(f"transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
        if nbytes:
            self._copy(dest.va, src.va, nbytes)


def _bytes_view(view: memoryview) -> memoryview:
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


@dataclass(frozen=True)
class _Span:
    """An address and size a copy command reads or writes (what :class:`~ember.device.hcq.Copy` carries)."""

    va: int
    nbytes: int


# --- signals ---------------------------------------------------------------------------------------------
SIGNAL_BYTES = 32  # value (u64), timestamp ticks (u64), padding: 8-byte aligned for RELEASE_MEM and SDMA


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


# --- kernels and their argument blocks --------------------------------------------------------------------
#: kernel_code_properties bits of the kernel descriptor -> user SGPRs they take, in the order the hardware loads them
_USER_SGPRS = ((0, "private_segment_buffer", 4), (1, "dispatch_ptr", 2), (2, "queue_ptr", 2),
               (3, "kernarg_segment_ptr", 2), (4, "dispatch_id", 2), (5, "flat_scratch_init", 2),
               (6, "private_segment_size", 1))
DISPATCH_PACKET_BYTES = 64


class AMDKernel:
    """One kernel of a code object uploaded to GPU memory: its descriptor's registers and argument layout."""

    def __init__(self, dev: AMDDevice, name: str, lib: bytes):
        from ember_amd.elf import read_code_object

        co = read_code_object(lib)
        if name not in co.kernels:
            raise ValueError(f"code object has no kernel {name!r} (it has {', '.join(co.kernels) or 'none'})")
        if co.arch != dev.arch:
            raise ValueError(f"kernel {name!r} was built for {co.arch}, the device is {dev.arch}")
        self.name, self.info = name, co.kernels[name]
        self.image_mem = dev.upload_code_object(lib, co.image)
        desc = co.image[self.info.descriptor_offset:self.info.descriptor_offset + 64]
        entry_offset = struct.unpack_from("<q", desc, 16)[0]
        self.rsrc3, self.rsrc1, self.rsrc2, self.properties = struct.unpack_from("<IIIH", desc, 44)
        self.entry = self.image_mem.va + self.info.descriptor_offset + entry_offset
        if self.entry % 256:
            raise ValueError(f"kernel {name!r}: entry 0x{self.entry:x} is not 256-byte aligned (COMPUTE_PGM_LO "
                             f"holds address >> 8)")
        if self.info.private_segment_fixed_size and not dev.os.mock:
            raise NotImplementedError(f"kernel {name!r} needs {self.info.private_segment_fixed_size} bytes of scratch "
                                      f"per work-item: scratch memory is not set up by this runtime yet")
        self.wave32 = self.info.wavefront_size == 32
        self.args_bytes = _round_up(self.info.kernarg_size, 64)
        self.block_bytes = self.args_bytes + DISPATCH_PACKET_BYTES
        self.buffer_args = [a for a in self.info.explicit_args if a.value_kind == "global_buffer"]
        self.value_args = [a for a in self.info.explicit_args if a.value_kind == "by_value"]
        self.max_threads = self.info.max_flat_workgroup_size or 1024

    @functools.lru_cache(maxsize=64)  # noqa: B019 - few distinct launch shapes per kernel
    def launch_dims(self, global_size: tuple[int, ...], local_size: tuple[int, ...] | None
                    ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """``(groups, work-group)`` covering ``global_size`` work-items exactly (3 dimensions, innermost first).

        Without a ``local_size`` each dimension takes the largest divisor of its size that still fits
        (256 work-items in all), so no partial work-groups exist.
        """
        g = [int(x) for x in global_size] + [1] * (3 - len(global_size))
        if local_size is not None:
            loc = [int(x) for x in local_size] + [1] * (3 - len(local_size))
            if any(x % n for x, n in zip(g, loc)) or loc[0] * loc[1] * loc[2] > self.max_threads:
                raise ValueError(f"kernel {self.name}: local size {tuple(loc)} must divide the global size {tuple(g)} "
                                 f"and hold at most {self.max_threads} work-items")
        else:
            budget, loc = min(256, self.max_threads), []
            for size in g:
                b = next(d for d in range(min(size, budget), 0, -1) if size % d == 0) if size else 1
                loc.append(b)
                budget //= b
        groups = (g[0] // loc[0], g[1] // loc[1], g[2] // loc[2])
        return groups, (loc[0], loc[1], loc[2])


class KernargPool:
    """Argument blocks in host-visible GTT memory; a freed block is reused once the timeline passed its last use."""

    CHUNK = 1 << 20

    def __init__(self, dev: AMDDevice):
        self.dev = dev
        self.free: dict[int, list[tuple[int, int]]] = {}  # size class -> [(address, timeline value it waits for)]
        self.cursor, self.end = 0, 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[int, int]:
        size = max(256, 1 << (nbytes - 1).bit_length())
        with self.lock:
            done = self.dev.timeline.signal.value
            bucket = self.free.get(size, [])
            for i, (addr, tag) in enumerate(bucket):
                if tag <= done:
                    bucket.pop(i)
                    return addr, size
            if self.cursor + size > self.end:
                mem = self.dev.mem_alloc(max(self.CHUNK, size), vram=False, host=True, uncached=True)
                self.cursor, self.end = mem.va, mem.va + mem.size
            addr, self.cursor = self.cursor, self.cursor + size
            return addr, size

    def give(self, addr: int, size: int, tag: int) -> None:
        with self.lock:
            self.free.setdefault(size, []).append((addr, tag))


class AMDKernelArgs(KernelArgs):
    """The kernarg segment of one launch in GTT: explicit arguments at the metadata's offsets, hidden arguments
    (work-group sizes and counts, grid dimensions) written when the launch is encoded, then a dispatch packet."""

    def __init__(self, kernel: AMDKernel, dev: AMDDevice, bufs: Sequence[AMDBuffer], vals: Sequence[int] = ()):
        # buffers past the kernel's parameters are ones its code never touches (the renderer left them out)
        if len(bufs) < len(kernel.buffer_args) or len(vals) != len(kernel.value_args):
            raise ValueError(f"kernel {kernel.name} takes {len(kernel.buffer_args)} buffers and "
                             f"{len(kernel.value_args)} values, got {len(bufs)} and {len(vals)}")
        super().__init__(bufs, vals)
        self.kernel, self.dev = kernel, dev
        self.address, size = dev.kernargs.take(kernel.block_bytes)
        weakref.finalize(self, _release_kernargs, dev, self.address, size)
        ctypes.memset(self.address, 0, kernel.block_bytes)
        self.launch: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
        self.last_use = 0  # the timeline value of the latest submission that launches with this block
        for i, b in enumerate(bufs):
            self.update_buffer(i, b)
        for i, v in enumerate(vals):
            self.update_var(i, v)

    def _put(self, offset: int, size: int, value: int) -> None:
        ctypes.memmove(self.address + offset, (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), size)

    def update_buffer(self, index: int, buf: Any) -> None:
        if not 0 <= index < len(self.bufs):
            raise IndexError(f"kernel {self.kernel.name} has {len(self.bufs)} buffers, no buffer {index}")
        super().update_buffer(index, buf)
        if index < len(self.kernel.buffer_args):
            a = self.kernel.buffer_args[index]
            self._put(a.offset, a.size, buf.va)

    def update_var(self, index: int, value: int) -> None:
        if not 0 <= index < len(self.vals):
            raise IndexError(f"kernel {self.kernel.name} has {len(self.vals)} runtime values, no value {index}")
        super().update_var(index, value)
        a = self.kernel.value_args[index]
        self._put(a.offset, a.size, int(value))

    def set_launch(self, groups: tuple[int, int, int], local: tuple[int, int, int]) -> None:
        """Write the hidden arguments and the dispatch packet for this launch shape (once per shape)."""
        if self.launch == (groups, local):
            return
        if self.launch is not None and self.last_use:  # a queued launch of another shape may still read this block
            self.dev.timeline.signal.wait(self.last_use, timeout=self.dev.timeout)
        self.launch = (groups, local)
        values: dict[str, int] = {"hidden_grid_dims": 3}
        for i, axis in enumerate("xyz"):
            values[f"hidden_block_count_{axis}"] = groups[i]
            values[f"hidden_group_size_{axis}"] = local[i]
            values[f"hidden_remainder_{axis}"] = 0
            values[f"hidden_global_offset_{axis}"] = 0
        for a in self.kernel.info.args:
            if a.value_kind.startswith("hidden_"):  # those without a defined meaning here stay zero
                self._put(a.offset, a.size, values.get(a.value_kind, 0))
        # hsa_kernel_dispatch_packet_t, for kernels that read their sizes through the dispatch pointer
        k = self.kernel
        packet = struct.pack("<HHHHHHIIIIIQQQQ", 0, 3, *local, 0, *(g * n for g, n in zip(groups, local)),
                             k.info.private_segment_fixed_size, k.info.group_segment_fixed_size,
                             k.image_mem.va + k.info.descriptor_offset, self.address, 0, 0)
        ctypes.memmove(self.address + k.args_bytes, packet, len(packet))


def _release_kernargs(dev: AMDDevice, address: int, size: int) -> None:
    # a queued launch may still read the block: it is reused only once the timeline passed what was handed out
    dev.kernargs.give(address, size, dev.timeline.last)


# --- queues ------------------------------------------------------------------------------------------------
class HWRing:
    """One KFD user-mode queue: a ring in GTT, read/write pointers, and its doorbell."""

    def __init__(self, dev: AMDDevice, queue_type: int):
        self.dev, self.type = dev, queue_type
        self.unit = 4 if queue_type == kfd.QUEUE_TYPE_SDMA else 1  # SDMA pointers count bytes, PM4 dwords
        self.ring = dev.mem_alloc(RING_BYTES, vram=False, host=True, uncached=True)
        self.pointers = dev.mem_alloc(PAGE, vram=False, host=True, uncached=True)
        self.rptr = ctypes.c_uint64.from_address(self.pointers.va)
        self.wptr_mem = ctypes.c_uint64.from_address(self.pointers.va + 8)
        self.words = (ctypes.c_uint32 * (RING_BYTES // 4)).from_address(self.ring.va)
        extra: dict[str, int] = {}
        if queue_type == kfd.QUEUE_TYPE_COMPUTE:
            self.eop = dev.mem_alloc(PAGE, vram=True, host=False)
            ctl, ctx_size, total = dev.context_save_sizes()
            self.ctx = dev.mem_alloc(total, vram=True, host=False)
            extra = {"eop_buffer_address": self.eop.va, "eop_buffer_size": PAGE,
                     "ctx_save_restore_address": self.ctx.va, "ctx_save_restore_size": ctx_size,
                     "ctl_stack_size": ctl}
        q = dev.ioctl("CREATE_QUEUE", ring_base_address=self.ring.va, ring_size=RING_BYTES, gpu_id=dev.node.gpu_id,
                      queue_type=queue_type, queue_percentage=kfd.MAX_QUEUE_PERCENTAGE,
                      queue_priority=7, write_pointer_address=self.pointers.va + 8,
                      read_pointer_address=self.pointers.va, **extra)
        self.queue_id = q.queue_id
        self.doorbell = ctypes.c_uint64.from_address(dev.doorbell_address(q.doorbell_offset))
        self.wptr = 0  # in dwords, growing without wrap
        self.lock = threading.Lock()

    def submit(self, words: list[int]) -> None:
        """Copy ``words`` into the ring (waiting for room), publish the write pointer and ring the doorbell."""
        n, cap = len(words), RING_BYTES // 4
        if n > cap:
            raise ValueError(f"a submission of {n} dwords does not fit a ring of {cap}")
        with self.lock:
            deadline = time.monotonic() + self.dev.timeout
            while self.wptr + n - self.rptr.value // self.unit > cap:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.dev.device}: queue {self.queue_id} made no progress for "
                                       f"{self.dev.timeout} s (ring full): the GPU is hung")
                time.sleep(1e-5)
            start = self.wptr % cap
            first = min(n, cap - start)
            self.words[start:start + first] = words[:first]  # type: ignore[assignment]  # ctypes takes ints
            if first < n:
                self.words[0:n - first] = words[first:]  # type: ignore[assignment]
            self.wptr += n
            self.wptr_mem.value = self.wptr * self.unit
            self.doorbell.value = self.wptr * self.unit

    def destroy(self) -> None:
        self.dev.ioctl("DESTROY_QUEUE", queue_id=self.queue_id)


class AMDQueue(HWQueue):
    """A queue of the AMD device: ``engine`` "compute" encodes to PM4, "copy" to SDMA."""

    def __init__(self, engine: str = "compute"):
        super().__init__()
        self.engine = engine

    def _submit(self, device: Any) -> None:
        dev: AMDDevice = device
        words = dev.encode_pm4(self.cmds) if self.engine == "compute" else dev.encode_sdma(self.cmds)
        dev.rings[self.engine].submit(words)


# --- the device ---------------------------------------------------------------------------------------------
class AMDDevice(Compiled, HCQDevice):
    """``AMD`` (the first GPU of the KFD topology) or ``AMD:N``, driven through KFD ioctls and HCQ queues.

    ``osif`` is the OS interface to drive (default: :func:`os_interface`, the real OS or ``AMD_MOCK=1``'s mock);
    tests pass their own :class:`~ember_amd.mock_kfd.MockKFD`.
    """

    def __init__(self, device: str = "AMD", osif: kfd.OSInterface | None = None):
        from ember_amd.compiler import AMDCompiler
        from ember_amd.renderer import AMDRenderer

        self.ctx = kfd_context(osif if osif is not None else os_interface())
        self.os = self.ctx.os
        nodes = kfd.gpu_nodes(self.os)
        index = device_index(device)
        if index >= len(nodes):
            raise RuntimeError(f"{device}: KFD lists {len(nodes)} GPU(s)")
        self.node = nodes[index]
        self.arch = self.node.arch
        self.table: GfxTable = gfx.gfx_table(self.arch)
        self.device = device
        self.drm_fd = self.os.open(self.node.render_node, os.O_RDWR)
        self.ioctl("ACQUIRE_VM", drm_fd=self.drm_fd, gpu_id=self.node.gpu_id)
        self._memory: set[GPUMemory] = set()
        self._doorbells: dict[int, int] = {}
        self.signals = SignalPool(self)
        self._setup_event()
        self.kernargs = KernargPool(self)
        self._code: dict[bytes, GPUMemory] = {}
        self._encoded: weakref.WeakKeyDictionary[Exec, tuple[tuple[Any, ...], list[int]]] = weakref.WeakKeyDictionary()
        self.rings = {"compute": HWRing(self, kfd.QUEUE_TYPE_COMPUTE), "copy": HWRing(self, kfd.QUEUE_TYPE_SDMA)}
        self.timeline = Timeline(self.new_signal("timeline"))
        renderer = AMDRenderer(self.arch, lds_size=self.node.prop("lds_size_in_kb", 64) * 1024, device=device)
        super().__init__(device, AMDAllocator(self), renderer, AMDCompiler(self.arch), self._program, self._graph)

    # OS access
    def ioctl(self, name: str, **fields: int) -> Any:
        """AMDKFD_IOC_``name`` on /dev/kfd (errors name the call, errno and meaning)."""
        return kfd.ioctl(self.os, self.ctx.fd, name, **fields)

    def mem_alloc(self, nbytes: int, vram: bool, host: bool, uncached: bool = False,
                  executable: bool = False) -> GPUMemory:
        """Reserve an address range, allocate VRAM or GTT there, map it to the GPU and (``host``) into the process."""
        size = _round_up(max(nbytes, 1), PAGE)
        va = self.os.mmap(0, size, kfd.PROT_NONE, kfd.MAP_PRIVATE | kfd.MAP_ANONYMOUS | kfd.MAP_NORESERVE, -1, 0)
        flags = (kfd.MEM_VRAM if vram else kfd.MEM_GTT) | kfd.MEM_WRITABLE | kfd.MEM_NO_SUBSTITUTE
        flags |= (kfd.MEM_PUBLIC if vram and host else 0) | (kfd.MEM_EXECUTABLE if executable else 0)
        flags |= (kfd.MEM_COHERENT | kfd.MEM_UNCACHED) if uncached else 0
        try:
            a = self.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va, size=size, gpu_id=self.node.gpu_id, flags=flags)
        except kfd.KFDError as e:
            self.os.munmap(va, size)
            if e.errno == errno.ENOMEM:  # let the allocator free its cache and retry
                raise MemoryError(f"{self.device}: {e}") from e
            raise
        mem = GPUMemory(va, size, a.handle, flags, host)
        try:
            if host:
                self.os.mmap(va, size, kfd.PROT_READ | kfd.PROT_WRITE, kfd.MAP_SHARED | kfd.MAP_FIXED, self.drm_fd,
                             a.mmap_offset)
            ids = (ctypes.c_uint32 * 1)(self.node.gpu_id)
            m = self.ioctl("MAP_MEMORY_TO_GPU", handle=a.handle, device_ids_array_ptr=ctypes.addressof(ids),
                           n_devices=1)
            if m.n_success != 1:
                raise RuntimeError(f"{self.device}: AMDKFD_IOC_MAP_MEMORY_TO_GPU mapped {m.n_success} of 1 GPUs")
        except BaseException:
            self.ioctl("FREE_MEMORY_OF_GPU", handle=a.handle)
            self.os.munmap(va, size)
            raise
        self._memory.add(mem)
        return mem

    def mem_free(self, mem: GPUMemory) -> None:
        """Unmap from the GPU, free, and release the address range."""
        if mem not in self._memory:
            return
        self._memory.discard(mem)
        ids = (ctypes.c_uint32 * 1)(self.node.gpu_id)
        self.ioctl("UNMAP_MEMORY_FROM_GPU", handle=mem.handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1)
        self.ioctl("FREE_MEMORY_OF_GPU", handle=mem.handle)
        self.os.munmap(mem.va, mem.size)

    def doorbell_address(self, doorbell_offset: int) -> int:
        """The host address of a queue's doorbell (its 8 KiB doorbell page mapped from /dev/kfd once)."""
        page = doorbell_offset & ~0x1FFF
        if page not in self._doorbells:
            self._doorbells[page] = self.os.mmap(0, 0x2000, kfd.PROT_READ | kfd.PROT_WRITE, kfd.MAP_SHARED,
                                                 self.ctx.fd, page)
        return self._doorbells[page] + (doorbell_offset & 0x1FFF)

    def context_save_sizes(self) -> tuple[int, int, int]:
        """``(control stack, context-save area, allocation)`` bytes a compute queue needs for wave save/restore.

        The driver checks them against its own numbers: kernels that export ``ctl_stack_size`` and
        ``cwsr_size`` in the topology give them; otherwise they are computed the way amdkfd's
        ``kfd_queue.c`` sizes them (a control stack of 12 bytes per wave, 8 on gfx9, behind a 48-byte
        header; per-CU VGPR/SGPR/LDS/register save space; 32 bytes of debugger memory per wave).
        """
        return context_save_sizes(self.arch, self.node.properties)

    def _setup_event(self) -> None:
        with self.ctx.lock:
            first = self.ctx.event_page is None
            if first:  # the process's event page: allocated by the first device, named by its handle
                self.ctx.event_page = self.mem_alloc(kfd.SIGNAL_EVENT_LIMIT * 8, vram=False, host=True, uncached=True)
            page = self.ctx.event_page
            assert page is not None
            if not first:  # another GPU writes its mailbox slot too: map the page to it
                ids = (ctypes.c_uint32 * 1)(self.node.gpu_id)
                self.ioctl("MAP_MEMORY_TO_GPU", handle=page.handle, device_ids_array_ptr=ctypes.addressof(ids),
                           n_devices=1)
            e = self.ioctl("CREATE_EVENT", event_page_offset=page.handle if first else 0, event_type=kfd.EVENT_SIGNAL,
                           auto_reset=1, node_id=self.node.node)
        self.event_id = e.event_id
        self.mailbox = page.va + 8 * e.event_slot_index
        self._event_data = kfd.EventData(event_id=self.event_id)

    def wait_event(self, timeout_ms: int) -> bool:
        """Block until a queue of this device raises its event (or ``timeout_ms`` passes); True when it did."""
        r = self.ioctl("WAIT_EVENTS", events_ptr=ctypes.addressof(self._event_data), num_events=1, wait_for_all=1,
                       timeout=timeout_ms)
        return r.wait_result == kfd.WAIT_RESULT_COMPLETE

    # HCQ pieces
    def compute_queue(self) -> AMDQueue:
        return AMDQueue("compute")

    def copy_queue(self) -> AMDQueue:
        return AMDQueue("copy")

    def new_signal(self, name: str = "signal", value: int = 0) -> Signal:
        return AMDSignal(self, name, value)

    def _signal_address(self, signal: Signal) -> int:
        if not isinstance(signal, AMDSignal) or signal.dev is not self:
            raise TypeError(f"{self.device}: queues wait on and write this device's AMDSignal, got {signal!r}")
        return signal.address

    def encode_pm4(self, cmds: Sequence[Any]) -> list[int]:
        """The compute queue's packets for ``cmds`` (raises before anything is submitted)."""
        t = self.table
        out = pm4.acquire_mem(t)  # see what the host and the other queue wrote before this submission
        last = cmds[-1] if cmds else None
        use = last.value if isinstance(last, SignalCmd) and last.signal is self.timeline.signal else \
            self.timeline.last
        for cmd in cmds:
            if isinstance(cmd, Wait):
                out += pm4.wait_reg_mem_ge(self._signal_address(cmd.signal), cmd.value) + pm4.acquire_mem(t)
            elif isinstance(cmd, SignalCmd):
                out += pm4.release_mem(t, self._signal_address(cmd.signal), gfx.DATA_SEL_64, cmd.value)
                out += pm4.release_mem(t, self.mailbox, gfx.DATA_SEL_32, self.event_id,
                                       gfx.INT_SEL_AFTER_WRITE_CONFIRM, self.event_id if t.interrupt_ctxid else 0)
            elif isinstance(cmd, Timestamp):
                out += pm4.release_mem(t, self._signal_address(cmd.signal) + 8, gfx.DATA_SEL_GPU_CLOCK)
            elif isinstance(cmd, Exec):
                out += self._exec_words(cmd)
                if isinstance(cmd.args, AMDKernelArgs):
                    cmd.args.last_use = use
            elif isinstance(cmd, MemoryBarrier):
                out += pm4.acquire_mem(t)
            else:
                raise TypeError(f"{self.device}: the compute queue cannot run {type(cmd).__name__} (copies go to the "
                                f"copy queue)")
        return out

    def _exec_words(self, cmd: Exec) -> list[int]:
        # a graph submits the same Exec commands on every replay: their packets only change with the launch shape
        # (the argument block is patched in place, its address stays)
        key = (cmd.program, cmd.args, cmd.global_size, cmd.local_size)
        cached = self._encoded.get(cmd)
        if cached is None or any(a is not b for a, b in zip(cached[0], key)) or cached[0][2:] != key[2:]:
            cached = self._encoded[cmd] = (key, self._encode_exec(cmd))
        return cached[1]

    def _encode_exec(self, cmd: Exec) -> list[int]:
        kernel, args = cmd.program, cmd.args
        if not isinstance(kernel, AMDKernel) or not isinstance(args, AMDKernelArgs) or args.kernel is not kernel:
            raise TypeError(f"{self.device}: exec needs an AMDKernel and its AMDKernelArgs")
        if any(g == 0 for g in cmd.global_size):
            return []  # nothing to run
        groups, local = kernel.launch_dims(cmd.global_size, cmd.local_size)
        args.set_launch(groups, local)
        user: list[int] = []
        dispatch_ptr = args.address + kernel.args_bytes
        for bit, what, count in _USER_SGPRS:
            if kernel.properties & (1 << bit):
                value = {"dispatch_ptr": dispatch_ptr, "kernarg_segment_ptr": args.address}.get(what, 0)
                user += [value & 0xFFFFFFFF, value >> 32, 0, 0][:count]
        t = self.table
        out = pm4.set_sh_reg(t.compute_pgm_lo, kernel.entry >> 8, kernel.entry >> 40)
        out += pm4.set_sh_reg(t.compute_pgm_rsrc1, kernel.rsrc1, kernel.rsrc2)
        out += pm4.set_sh_reg(t.compute_pgm_rsrc3, kernel.rsrc3)
        out += pm4.set_sh_reg(t.compute_tmpring_size, 0)
        out += pm4.set_sh_reg(t.compute_resource_limits, 0)
        out += pm4.set_sh_reg(t.compute_static_thread_mgmt_se0, 0xFFFFFFFF, 0xFFFFFFFF)
        out += pm4.set_sh_reg(t.compute_static_thread_mgmt_se2, 0xFFFFFFFF, 0xFFFFFFFF)
        if user:
            out += pm4.set_sh_reg(t.compute_user_data_0, *user)
        out += pm4.set_sh_reg(t.compute_start_x, 0, 0, 0, *local)  # START_X..Z then NUM_THREAD_X..Z
        initiator = gfx.DISPATCH_COMPUTE_SHADER_EN | gfx.DISPATCH_FORCE_START_AT_000
        initiator |= gfx.DISPATCH_CS_W32_EN if kernel.wave32 else 0
        return out + pm4.dispatch_direct(groups, initiator) + pm4.cs_partial_flush()

    def encode_sdma(self, cmds: Sequence[Any]) -> list[int]:
        """The copy queue's packets for ``cmds``."""
        gcr = sdma.gcr_invalidate() if self.table.sdma_gcr else []
        out = list(gcr)
        for cmd in cmds:
            if isinstance(cmd, Wait):
                out += sdma.poll_regmem_ge(self._signal_address(cmd.signal), cmd.value) + gcr
            elif isinstance(cmd, SignalCmd):
                addr, flags = self._signal_address(cmd.signal), self.table.sdma_fence_flags
                out += sdma.fence(addr + 4, cmd.value >> 32, flags) + sdma.fence(addr, cmd.value, flags)
                out += sdma.fence(self.mailbox, self.event_id, flags) + sdma.trap(self.event_id)
            elif isinstance(cmd, Timestamp):
                out += sdma.timestamp(self._signal_address(cmd.signal) + 8)
            elif isinstance(cmd, Copy):
                if cmd.nbytes:
                    out += sdma.copy(cmd.dest.va, cmd.src.va, cmd.nbytes)
            elif isinstance(cmd, MemoryBarrier):
                out += gcr
            else:
                raise TypeError(f"{self.device}: the copy queue cannot run {type(cmd).__name__}")
        return out

    # programs and graphs
    def upload_code_object(self, lib: bytes, image: bytes) -> GPUMemory:
        """Copy a code object's image into executable VRAM (once per code object) and tell the OS interface."""
        key = hashlib.sha256(lib).digest()
        mem = self._code.get(key)
        if mem is None:
            mem = self.mem_alloc(len(image), vram=True, host=False, executable=True)
            self.allocator.copyin(AMDBuffer(mem, mem.va, len(image)), memoryview(image))
            self.os.register_code_object(mem.va, lib)
            self._code[key] = mem
        return mem

    def _program(self, name: str, binary: bytes) -> HCQProgram:
        kernel = AMDKernel(self, name, binary)
        return HCQProgram(self, name, kernel, functools.partial(AMDKernelArgs, kernel, self))

    def _graph(self, calls: Sequence[tuple[Any, ...]]) -> HCQGraph:
        return HCQGraph(self, calls)

    def synchronize(self) -> None:
        HCQDevice.synchronize(self)

    def finalize(self) -> None:
        """Destroy the queues, free every allocation, close the render node (each step on its own)."""
        steps: list[Callable[[], Any]] = [*(ring.destroy for ring in self.rings.values()),
                 lambda: self.ioctl("DESTROY_EVENT", event_id=self.event_id),
                 *(functools.partial(self.mem_free, m) for m in list(self._memory) if m is not self.ctx.event_page),
                 lambda: self.os.close(self.drm_fd)]
        for step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001, S112 - best effort at interpreter exit
                continue
