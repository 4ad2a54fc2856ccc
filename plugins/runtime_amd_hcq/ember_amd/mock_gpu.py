"""The mock GPU behind :class:`ember_amd.mock_kfd.MockKFD`: one worker per queue, packets parsed and executed.

Each queue's worker polls its doorbell like a command processor, parses the PM4 (compute) or SDMA
(copy) packets between its read pointer and the doorbell's write pointer, and executes them on the
mock's memory (GPU address == host address): copies, signal writes, waits, timestamps, interrupts.
A dispatch runs the same kernel built for the CPU by PoCL (:func:`run_on_cpu`). This checks
packets and synchronization, not the GPU's instructions: the kernel's machine code never runs.
"""
from __future__ import annotations

import ctypes
import functools
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ember_amd import gfx, kfd, pm4

if TYPE_CHECKING:
    from ember_amd.mock_kfd import MockKFD


class MockFault(RuntimeError):
    """A packet the mock GPU cannot execute (what a GPU would report as a fault or a hang)."""


@dataclass
class MockQueue:
    queue_id: int
    queue_type: int
    ring: int
    ring_size: int
    rptr_addr: int
    wptr_addr: int
    doorbell: int
    rptr: int = 0  # in dwords (PM4) or bytes (SDMA), growing without wrap like the write pointer
    stop: bool = False
    thread: threading.Thread | None = None
    regs: dict[int, int] = field(default_factory=dict)
    in_flight: bool = False  # a dispatch started and no flush since: the next one could overlap it
    stale: bool = False  # a wait returned and no cache invalidation since: reads may see stale cache lines


def read_u32(addr: int) -> int:
    """The 32-bit word at host address ``addr``."""
    return ctypes.c_uint32.from_address(addr).value


def read_u64(addr: int) -> int:
    """The 64-bit word at host address ``addr``."""
    return ctypes.c_uint64.from_address(addr).value


def write_u32(addr: int, value: int) -> None:
    """Store ``value`` as a 32-bit word at ``addr``."""
    ctypes.c_uint32.from_address(addr).value = value & 0xFFFFFFFF


def write_u64(addr: int, value: int) -> None:
    """Store ``value`` as a 64-bit word at ``addr``."""
    ctypes.c_uint64.from_address(addr).value = value & 0xFFFFFFFFFFFFFFFF


class MockGPU:
    """Executes the queues the mock driver (:class:`~ember_amd.mock_kfd.MockKFD`) created, faulting on what a GPU
    would; memory checks, interrupts and counters are the driver's."""

    def __init__(self, driver: MockKFD):
        self.driver = driver
        self.table = driver.table

    def run_queue(self, q: MockQueue) -> None:
        """A queue's worker thread: poll the doorbell, run what was published, stop at the first fault."""
        idle = 0.0
        while not q.stop:
            wptr = read_u64(q.doorbell)
            if wptr == q.rptr:
                time.sleep(idle)
                idle = min(idle * 2 or 2e-5, 2e-3)
                continue
            idle = 0.0
            try:
                if q.queue_type == kfd.QUEUE_TYPE_COMPUTE:
                    self._run_pm4(q, wptr)
                else:
                    self._run_sdma(q, wptr)
            except Exception as e:  # noqa: BLE001 - a faulting queue stops, as a hung GPU queue would
                self.driver.errors.append(f"queue {q.queue_id}: {type(e).__name__}: {e}")
                with self.driver.lock:  # wake host waits so they see the failure at their next check
                    self.driver.event_cond.notify_all()
                return

    def _ring_dwords(self, q: MockQueue, start: int, count: int, unit: int) -> list[int]:
        n = q.ring_size // 4
        first = start // unit if unit == 4 else start
        return [read_u32(q.ring + 4 * ((first + i) % n)) for i in range(count)]

    # PM4 (write pointer in dwords)
    def _run_pm4(self, q: MockQueue, wptr: int) -> None:
        while q.rptr < wptr and not q.stop:
            head = self._ring_dwords(q, q.rptr, 1, 1)[0]
            ptype, op, n = pm4.parse_header(head)
            if ptype != 3:
                raise MockFault(f"dword 0x{head:08x} at ring index {q.rptr} is not a PM4 type-3 packet header")
            if q.rptr + 1 + n > wptr:
                raise MockFault(f"PM4 packet 0x{op:x} of {n} dwords runs past the write pointer {wptr}")
            body = self._ring_dwords(q, q.rptr + 1, n, 1)
            self._pm4_packet(q, op, body)
            q.rptr += 1 + n
            write_u64(q.rptr_addr, q.rptr)

    def _pm4_packet(self, q: MockQueue, op: int, body: list[int]) -> None:
        t = self.table
        if op == gfx.PM4_NOP:
            return
        if op == gfx.PM4_SET_SH_REG:
            for i, v in enumerate(body[1:]):
                q.regs[gfx.SH_REG_BASE + body[0] + i] = v
        elif op == gfx.PM4_ACQUIRE_MEM:
            if len(body) != t.acquire_mem_dwords:
                raise MockFault(f"ACQUIRE_MEM of {len(body)} dwords, {t.generation} takes {t.acquire_mem_dwords}")
            q.stale = False
        elif op == gfx.PM4_EVENT_WRITE:
            if len(body) != 1 or body[0] & 0x3F != gfx.EVENT_CS_PARTIAL_FLUSH:
                raise MockFault(f"EVENT_WRITE {body}: the compute queue only needs CS_PARTIAL_FLUSH")
            q.in_flight = False
        elif op == gfx.PM4_WAIT_REG_MEM:
            if len(body) != 6 or body[0] & 0x7 != gfx.FUNC_GE or not body[0] & (1 << 4):
                raise MockFault(f"WAIT_REG_MEM {body}: expected 'memory >= reference' of 6 dwords")
            addr = body[1] | (body[2] << 32)
            self.driver.check(addr, 4, "WAIT_REG_MEM address")
            self._poll(q, addr, body[3], body[4])
            q.stale = True
        elif op == gfx.PM4_RELEASE_MEM:
            self._release_mem(q, body)
        elif op == gfx.PM4_DISPATCH_DIRECT:
            if len(body) != 4 or not body[3] & gfx.DISPATCH_COMPUTE_SHADER_EN:
                raise MockFault(f"DISPATCH_DIRECT {body}: expected 3 group counts and an initiator with "
                                f"COMPUTE_SHADER_EN")
            if q.stale:
                raise MockFault("DISPATCH_DIRECT after WAIT_REG_MEM with no ACQUIRE_MEM between them: the kernel may "
                                "read cache lines older than what the awaited signal announced")
            if q.in_flight:
                raise MockFault("DISPATCH_DIRECT right after another dispatch with no CS_PARTIAL_FLUSH or RELEASE_MEM "
                                "between them: the two could overlap, but commands of one queue must run in order")
            self._dispatch(q, (body[0], body[1], body[2]), body[3])
            q.in_flight = True
        else:
            raise MockFault(f"unknown PM4 opcode 0x{op:x}")

    def _poll(self, q: MockQueue, addr: int, ref: int, mask: int) -> None:
        delay = 0.0
        while (read_u32(addr) & mask) < ref:
            if q.stop:
                return
            time.sleep(delay)
            delay = min(delay * 2 or 1e-5, 1e-3)

    def _release_mem(self, q: MockQueue, body: list[int]) -> None:
        if len(body) != 7 or body[0] & 0x3F != gfx.EVENT_CACHE_FLUSH_AND_INV_TS or (body[0] >> 8) & 0xF != 5:
            raise MockFault(f"RELEASE_MEM {body}: expected the 7-dword end-of-pipe form (CACHE_FLUSH_AND_INV_TS, "
                            f"event index 5)")
        q.in_flight = False
        data_sel, int_sel = body[1] >> 29, (body[1] >> 24) & 0x7
        addr, value = body[2] | (body[3] << 32), body[4] | (body[5] << 32)
        if data_sel == gfx.DATA_SEL_32:
            self.driver.check(addr, 4, "RELEASE_MEM destination")
            write_u32(addr, value)
        elif data_sel in (gfx.DATA_SEL_64, gfx.DATA_SEL_GPU_CLOCK):
            self.driver.check(addr, 8, "RELEASE_MEM destination")
            if addr % 8:
                raise MockFault(f"RELEASE_MEM 64-bit write to 0x{addr:x}: not 8-byte aligned")
            write_u64(addr, value if data_sel == gfx.DATA_SEL_64 else self.clock())
        elif data_sel != gfx.DATA_SEL_NONE:
            raise MockFault(f"RELEASE_MEM data_sel {data_sel} is not used by this runtime")
        if int_sel == gfx.INT_SEL_AFTER_WRITE_CONFIRM:
            self.driver.interrupt(body[6])

    def clock(self) -> int:
        """The GPU timestamp counter (ticks of the table's frequency)."""
        return time.perf_counter_ns() * self.table.timestamp_hz // 1_000_000_000

    # SDMA (write pointer in bytes)
    _SDMA_LENGTHS = {gfx.SDMA_OP_NOP: 1, gfx.SDMA_OP_COPY: 7, gfx.SDMA_OP_FENCE: 4, gfx.SDMA_OP_TRAP: 2,
                     gfx.SDMA_OP_POLL_REGMEM: 6, gfx.SDMA_OP_TIMESTAMP: 3, gfx.SDMA_OP_GCR: 5}

    def _run_sdma(self, q: MockQueue, wptr: int) -> None:
        if wptr % 4:
            raise MockFault(f"SDMA write pointer {wptr} is not a whole number of dwords")
        while q.rptr < wptr and not q.stop:
            head = self._ring_dwords(q, q.rptr, 1, 4)[0]
            op, sub = head & 0xFF, (head >> 8) & 0xFF
            n = self._SDMA_LENGTHS.get(op)
            if n is None or (op == gfx.SDMA_OP_GCR and not self.table.sdma_gcr):
                raise MockFault(f"unknown SDMA opcode {op} (header 0x{head:08x}) for {self.driver.arch}")
            if q.rptr + 4 * n > wptr:
                raise MockFault(f"SDMA packet {op} of {n} dwords runs past the write pointer")
            p = self._ring_dwords(q, q.rptr, n, 4)
            if op == gfx.SDMA_OP_GCR:
                q.stale = False
            if op == gfx.SDMA_OP_COPY:
                if q.stale:
                    raise MockFault("SDMA copy after POLL_REGMEM with no GCR_REQ between them: it may read stale L2 "
                                    "lines")
                if sub != gfx.SDMA_SUBOP_COPY_LINEAR:
                    raise MockFault(f"SDMA copy sub-opcode {sub}: only COPY_LINEAR is used")
                count, src, dst = p[1] + 1, p[3] | (p[4] << 32), p[5] | (p[6] << 32)
                if count > gfx.SDMA_MAX_COPY:
                    raise MockFault(f"SDMA COPY_LINEAR of {count} bytes exceeds {gfx.SDMA_MAX_COPY}")
                self.driver.check(src, count, "SDMA copy source")
                self.driver.check(dst, count, "SDMA copy destination")
                ctypes.memmove(dst, src, count)
                self.driver.copied += count
            elif op == gfx.SDMA_OP_FENCE:
                addr = p[1] | (p[2] << 32)
                self.driver.check(addr, 4, "SDMA fence")
                write_u32(addr, p[3])
            elif op == gfx.SDMA_OP_POLL_REGMEM:
                addr = p[1] | (p[2] << 32)
                if not head >> 31 or (head >> 28) & 0x7 != gfx.FUNC_GE:
                    raise MockFault(f"SDMA POLL_REGMEM header 0x{head:08x}: expected 'memory >= reference'")
                self.driver.check(addr, 4, "SDMA poll")
                self._poll(q, addr, p[3], p[4])
                q.stale = self.table.sdma_gcr  # gfx9's SDMA has no GCR packet (and reads through memory)
            elif op == gfx.SDMA_OP_TIMESTAMP:
                addr = p[1] | (p[2] << 32)
                if sub != gfx.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL or addr % 8:
                    raise MockFault(f"SDMA TIMESTAMP sub-opcode {sub} to 0x{addr:x}: expected GET_GLOBAL, "
                                    f"8-byte aligned")
                self.driver.check(addr, 8, "SDMA timestamp")
                write_u64(addr, self.clock())
            elif op == gfx.SDMA_OP_TRAP:
                self.driver.interrupt(p[1] & 0x0FFFFFFF)
            q.rptr += 4 * n
            write_u64(q.rptr_addr, q.rptr)

    # --- dispatch: the same kernel, built for the CPU by PoCL --------------------------------------
    def _dispatch(self, q: MockQueue, groups: tuple[int, int, int], initiator: int) -> None:
        t, regs = self.table, q.regs
        entry = ((regs.get(t.compute_pgm_lo + 1, 0) << 32) | regs.get(t.compute_pgm_lo, 0)) << 8
        found = self.driver.code_objects.get(entry)
        if found is None:
            raise MockFault(f"DISPATCH_DIRECT: no kernel entry at 0x{entry:x} (COMPUTE_PGM_LO/HI)")
        co, info, base, desc = found
        if bytes((ctypes.c_char * len(co.image)).from_address(base)) != co.image:
            raise MockFault(f"kernel {info.name}: the memory at 0x{base:x} no longer holds its code object")
        rsrc1, rsrc2 = struct.unpack_from("<II", desc, 48)
        if (regs.get(t.compute_pgm_rsrc1), regs.get(t.compute_pgm_rsrc1 + 1)) != (rsrc1, rsrc2):
            raise MockFault(f"kernel {info.name}: COMPUTE_PGM_RSRC1/2 differ from its kernel descriptor")
        local = tuple(regs.get(t.compute_num_thread_x + i, 0) for i in range(3))
        if any(x < 1 for x in local) or local[0] * local[1] * local[2] > 1024 or any(g < 1 for g in groups):
            raise MockFault(f"kernel {info.name}: work-group {local} and group counts {groups}")
        if bool(initiator & gfx.DISPATCH_CS_W32_EN) != (info.wavefront_size == 32):
            raise MockFault(f"kernel {info.name}: wave{info.wavefront_size} kernel dispatched with CS_W32_EN "
                            f"{'set' if initiator & gfx.DISPATCH_CS_W32_EN else 'clear'}")
        # the user SGPRs the descriptor enables come first, in this order; the kernarg pointer is one of them
        props = struct.unpack_from("<H", desc, 56)[0]
        index = sum(n for bit, n in ((0, 4), (1, 2), (2, 2)) if props & (1 << bit))
        if not props & (1 << 3):
            raise MockFault(f"kernel {info.name}: its descriptor does not enable the kernarg segment pointer")
        kernarg = regs.get(t.compute_user_data_0 + index, 0) | (regs.get(t.compute_user_data_0 + index + 1, 0) << 32)
        self.driver.check(kernarg, info.kernarg_size, f"kernel {info.name}'s argument block")
        block = bytes((ctypes.c_char * info.kernarg_size).from_address(kernarg))
        self._check_hidden(info, block, groups, local)
        run_on_cpu(self.driver, co, info, block, groups, local)
        self.driver.dispatches += 1

    @staticmethod
    def _check_hidden(info: Any, block: bytes, groups: tuple[int, ...], local: tuple[int, ...]) -> None:
        want: dict[str, int] = {}
        for i, axis in enumerate("xyz"):
            want[f"hidden_block_count_{axis}"] = groups[i]
            want[f"hidden_group_size_{axis}"] = local[i]
            want[f"hidden_remainder_{axis}"] = 0
        for a in info.args:
            if a.value_kind in want or a.value_kind == "hidden_grid_dims":
                got = int.from_bytes(block[a.offset:a.offset + a.size], "little")
                ok = 1 <= got <= 3 if a.value_kind == "hidden_grid_dims" else got == want[a.value_kind]
                if not ok:
                    raise MockFault(f"kernel {info.name}: {a.value_kind} is {got} in the argument block, the packet "
                                    f"dispatches {groups} groups of {local}")


@functools.cache
def _cl() -> tuple[Any, Any]:
    import pyopencl as cl

    platforms = [p for p in cl.get_platforms() if "portable" in p.name.lower()] or cl.get_platforms()
    ctx = cl.Context(platforms[0].get_devices())
    return ctx, cl.CommandQueue(ctx)


@functools.lru_cache(maxsize=256)
def _program(source: str) -> Any:
    import pyopencl as cl

    from ember_amd.renderer import host_opencl_source

    return cl.Program(_cl()[0], host_opencl_source(source)).build()


def run_on_cpu(mock: MockKFD, co: Any, info: Any, block: bytes, groups: tuple[int, ...],
               local: tuple[int, ...]) -> None:
    """Run ``info``'s kernel on the CPU through PoCL, with its pointer arguments over the mock's memory in place."""
    import pyopencl as cl

    if co.source is None:
        raise MockFault(f"kernel {info.name}: the code object has no .ember.source section to run on the CPU")
    ctx, queue = _cl()
    kernel = cl.Kernel(_program(co.source), info.name)
    buffers: dict[int, tuple[Any, int]] = {}
    for i, a in enumerate(info.explicit_args):
        raw = block[a.offset:a.offset + a.size]
        if a.value_kind == "global_buffer":
            ptr = int.from_bytes(raw, "little")
            if ptr not in buffers:
                alloc = mock.find(ptr)
                if alloc is None:
                    raise MockFault(f"kernel {info.name}: argument {a.name} = 0x{ptr:x} is not GPU-mapped memory")
                host = (ctypes.c_char * (alloc.end - ptr)).from_address(ptr)
                buffers[ptr] = (cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=host),
                                alloc.end - ptr)
            kernel.set_arg(i, buffers[ptr][0])
        elif a.value_kind == "by_value":
            kernel.set_arg(i, np.frombuffer(raw, dtype=np.uint8).copy())
        else:
            raise MockFault(f"kernel {info.name}: argument kind {a.value_kind} is not supported by the mock")
    gsize = tuple(g * n for g, n in zip(groups, local))
    cl.enqueue_nd_range_kernel(queue, kernel, gsize, local)
    for ptr, (buf, size) in buffers.items():  # the kernel must have written the mock's memory itself
        view, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ, 0, (size,), np.dtype(np.uint8))
        mapped = view.__array_interface__["data"][0]
        view.base.release(queue)
        if mapped != ptr:
            raise MockFault(f"kernel {info.name}: PoCL copied buffer 0x{ptr:x} instead of using it in place")
    queue.finish()
