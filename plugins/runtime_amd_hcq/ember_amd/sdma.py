"""SDMA packet encoders for the copy queue: each function returns the packet as a list of dwords.

Opcodes: :mod:`ember_amd.gfx`. SDMA packets start with a header dword (opcode in bits 0-7,
sub-opcode in 8-15, packet-specific bits above).
"""
from __future__ import annotations

from ember_amd import gfx


def _lo_hi(addr: int) -> list[int]:
    return [addr & 0xFFFFFFFF, (addr >> 32) & 0xFFFFFFFF]


def copy_linear(dest: int, src: int, nbytes: int) -> list[int]:
    """Copy ``nbytes`` (1 .. SDMA_MAX_COPY) from ``src`` to ``dest``."""
    if not 0 < nbytes <= gfx.SDMA_MAX_COPY:
        raise ValueError(f"SDMA COPY_LINEAR of {nbytes} bytes: one packet moves 1 .. {gfx.SDMA_MAX_COPY}")
    return [gfx.SDMA_OP_COPY | (gfx.SDMA_SUBOP_COPY_LINEAR << 8), nbytes - 1, 0, *_lo_hi(src), *_lo_hi(dest)]


def copy(dest: int, src: int, nbytes: int) -> list[int]:
    """Any number of bytes, as as many COPY_LINEAR packets as it takes."""
    out: list[int] = []
    for off in range(0, nbytes, gfx.SDMA_MAX_COPY):
        out += copy_linear(dest + off, src + off, min(gfx.SDMA_MAX_COPY, nbytes - off))
    return out


def fence(addr: int, value: int) -> list[int]:
    """Write the 32-bit ``value`` to ``addr`` (4-byte aligned) after every earlier packet."""
    if addr % 4:
        raise ValueError(f"SDMA FENCE address 0x{addr:x} is not 4-byte aligned")
    return [gfx.SDMA_OP_FENCE, *_lo_hi(addr), value & 0xFFFFFFFF]


def poll_regmem_ge(addr: int, value: int) -> list[int]:
    """Stall until the 32-bit word at ``addr`` is >= ``value`` (retry forever, every 10 clocks)."""
    if addr % 4:
        raise ValueError(f"SDMA POLL_REGMEM address 0x{addr:x} is not 4-byte aligned")
    hdr = gfx.SDMA_OP_POLL_REGMEM | (gfx.FUNC_GE << 28) | (1 << 31)  # function >=, memory (not a register)
    return [hdr, *_lo_hi(addr), value & 0xFFFFFFFF, 0xFFFFFFFF, (0xFFF << 16) | 10]


def timestamp(addr: int) -> list[int]:
    """Write the 64-bit global timestamp to ``addr`` (8-byte aligned)."""
    if addr % 8:
        raise ValueError(f"SDMA TIMESTAMP address 0x{addr:x} is not 8-byte aligned")
    return [gfx.SDMA_OP_TIMESTAMP | (gfx.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL << 8), *_lo_hi(addr)]


def trap(ctxid: int) -> list[int]:
    """Raise the interrupt carrying ``ctxid`` (a KFD event id) after every earlier packet."""
    return [gfx.SDMA_OP_TRAP, ctxid & 0x0FFFFFFF]


def gcr_invalidate() -> list[int]:
    """(gfx10+) write back and invalidate the L2 over all memory, so the copy reads what other engines wrote."""
    # GCR_REQ: base and limit over the whole address space, GL2 invalidate + write back
    return [gfx.SDMA_OP_GCR, 0, (0xFFFF << 16) | 0, 0xFFFFFFFF, (1 << 14) | (1 << 15), 0]
