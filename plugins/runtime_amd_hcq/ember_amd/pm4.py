"""PM4 packet encoders for the compute queue: each function returns the packet as a list of dwords.

The compute queue is PM4 rather than AQL: with PM4 every step the HCQ layer needs is one packet
(RELEASE_MEM writes a signal value or a timestamp and raises the interrupt, WAIT_REG_MEM waits for
``signal >= value``, ACQUIRE_MEM invalidates caches, SET_SH_REG + DISPATCH_DIRECT launch), whereas
an AQL queue only carries dispatches and barriers, so waits on arbitrary values and timestamps would
need extra machinery. Opcodes and fields: :mod:`ember_amd.gfx`.
"""
from __future__ import annotations

from ember_amd import gfx
from ember_amd.gfx import GfxTable

#: PACKET3 header bit 1: the packet is for the compute shader pipe (SET_SH_REG, DISPATCH_DIRECT)
SHADER_COMPUTE = 1 << 1


def header(opcode: int, body_dwords: int, compute: bool = False) -> int:
    """PACKET3 header: type 3, body length - 1, opcode."""
    if not 1 <= body_dwords <= 0x3FFF:
        raise ValueError(f"PM4 packet 0x{opcode:x}: body of {body_dwords} dwords")
    return (3 << 30) | ((body_dwords - 1) << 16) | (opcode << 8) | (SHADER_COMPUTE if compute else 0)


def parse_header(word: int) -> tuple[int, int, int]:
    """``(type, opcode, body_dwords)`` of a PM4 header."""
    return word >> 30, (word >> 8) & 0xFF, ((word >> 16) & 0x3FFF) + 1


def _lo_hi(addr: int) -> list[int]:
    return [addr & 0xFFFFFFFF, (addr >> 32) & 0xFFFFFFFF]


def set_sh_reg(reg: int, *values: int) -> list[int]:
    """Write ``values`` to consecutive SH registers starting at dword offset ``reg``."""
    if reg < gfx.SH_REG_BASE:
        raise ValueError(f"register 0x{reg:x} is not an SH register (below 0x{gfx.SH_REG_BASE:x})")
    return [header(gfx.PM4_SET_SH_REG, len(values) + 1, compute=True), reg - gfx.SH_REG_BASE,
            *(v & 0xFFFFFFFF for v in values)]


def dispatch_direct(groups: tuple[int, int, int], initiator: int) -> list[int]:
    """Launch ``groups`` work-groups with the registers set so far."""
    return [header(gfx.PM4_DISPATCH_DIRECT, 4, compute=True), *groups, initiator]


def wait_reg_mem_ge(addr: int, value: int) -> list[int]:
    """Stall until the 32-bit word at ``addr`` (4-byte aligned) is >= ``value``."""
    if addr % 4:
        raise ValueError(f"WAIT_REG_MEM address 0x{addr:x} is not 4-byte aligned")
    # function >=, memory space (bit 4), wait (operation 0), micro engine
    return [header(gfx.PM4_WAIT_REG_MEM, 6), gfx.FUNC_GE | (1 << 4), *_lo_hi(addr), value & 0xFFFFFFFF,
            0xFFFFFFFF, 4]


def release_mem(t: GfxTable, addr: int, data_sel: int, value: int = 0, int_sel: int = gfx.INT_SEL_NONE,
                ctxid: int = 0) -> list[int]:
    """At end of pipe (every earlier dispatch done, caches written back) write ``value`` (or the GPU clock)
    to ``addr``; with ``int_sel`` also raise the interrupt carrying ``ctxid`` (a KFD event id)."""
    if addr % 8 and data_sel != gfx.DATA_SEL_32:
        raise ValueError(f"RELEASE_MEM 64-bit write to 0x{addr:x}: not 8-byte aligned")
    event_cntl = gfx.EVENT_CACHE_FLUSH_AND_INV_TS | (5 << 8) | t.release_mem_cache  # EVENT_INDEX 5: end of pipe
    data_cntl = (data_sel << 29) | (int_sel << 24)  # DST_SEL 0: memory
    return [header(gfx.PM4_RELEASE_MEM, 7), event_cntl, data_cntl, *_lo_hi(addr), *_lo_hi(value), ctxid]


def acquire_mem(t: GfxTable) -> list[int]:
    """Invalidate (and write back) the GPU caches over all memory, so later commands see writes of others."""
    if t.acquire_mem_dwords == 7:  # gfx10+: COHER_CNTL unused, GCR_CNTL last
        return [header(gfx.PM4_ACQUIRE_MEM, 7), 0, 0xFFFFFFFF, 0xFFFFFF, 0, 0, 0x0A, t.acquire_mem_cntl]
    return [header(gfx.PM4_ACQUIRE_MEM, 6), t.acquire_mem_cntl, 0xFFFFFFFF, 0xFF, 0, 0, 0x0A]


def cs_partial_flush() -> list[int]:
    """Wait for every earlier dispatch to finish before the next starts (commands of one queue run in order)."""
    return [header(gfx.PM4_EVENT_WRITE, 1), gfx.EVENT_CS_PARTIAL_FLUSH | (4 << 8)]


def nop(dwords: int) -> list[int]:
    """Padding of ``dwords`` dwords (>= 2)."""
    return [header(gfx.PM4_NOP, dwords - 1)] + [0] * (dwords - 1)
