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


def fence(addr: int, value: int, flags: int = 0) -> list[int]:
    """Write the 32-bit ``value`` to ``addr`` (4-byte aligned) after every earlier packet (``flags``: header
    bits such as the memory type, :attr:`ember_amd.gfx.GfxTable.sdma_fence_flags`)."""
    if addr % 4:
        raise ValueError(f"SDMA FENCE address 0x{addr:x} is not 4-byte aligned")
    return [gfx.SDMA_OP_FENCE | flags, *_lo_hi(addr), value & 0xFFFFFFFF]


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


#: GCR_REQ control: GLI_INV, GLM_WB/INV, GLK_INV, GLV_INV, GL1_INV, GL2_INV/WB (the GCR_CNTL bits of ACQUIRE_MEM)
GCR_CONTROL = 1 | (1 << 4) | (1 << 5) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 14) | (1 << 15)


def gcr_invalidate() -> list[int]:
    """(gfx10+) write back and invalidate the caches over all memory, so the copy reads what others wrote.

    GCR_REQ: base address bits 31:7 and 47:32 (here 0), the 19 control bits split 15:0 / 18:16 around
    them, the limit's bits 31:7 and 47:32 (here the top of the 48-bit space).
    """
    return [gfx.SDMA_OP_GCR, 0, (GCR_CONTROL & 0xFFFF) << 16, 0xFFFFFF80 | (GCR_CONTROL >> 16), 0xFFFF]
