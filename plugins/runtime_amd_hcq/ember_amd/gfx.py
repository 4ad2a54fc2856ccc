"""Per-generation hardware tables: compute register offsets, PM4 and SDMA opcodes, packet fields.

One table per gfx generation, looked up by :func:`gfx_table` from the gfx target name. Sources
(read to learn the values, none copied): the Linux amdgpu driver's register headers
``drivers/gpu/drm/amd/include/asic_reg/gc/gc_9_4_3_offset.h`` and ``gc_11_0_0_offset.h``
(``regCOMPUTE_*`` offsets plus the GC base 0x1260 for gfx11, 0x2000 for gfx9: the absolute dword
offsets below), the PM4 packet definitions ``drivers/gpu/drm/amd/amdgpu/soc15d.h`` and ``nvd.h``,
the SDMA packet headers ``sdma_v4_4_2`` / ``sdma_v6_0_0_pkt_open.h``, Mesa's ``src/amd/common/sid.h``
for field positions, ROCm's kfdtest (``Dispatch.cpp``) and AMD's PAL for COMPUTE_PGM_RSRC3. None of
this has been checked against a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

# --- PM4 type-3 packets (soc15d.h / nvd.h) ---
PM4_NOP = 0x10
PM4_DISPATCH_DIRECT = 0x15
PM4_WAIT_REG_MEM = 0x3C
PM4_EVENT_WRITE = 0x46
PM4_RELEASE_MEM = 0x49
PM4_ACQUIRE_MEM = 0x58
PM4_SET_SH_REG = 0x76
#: SET_SH_REG addresses a register by its dword offset minus this base
SH_REG_BASE = 0x2C00

# WAIT_REG_MEM / POLL_REGMEM compare functions (shared by PM4 and SDMA)
FUNC_ALWAYS, FUNC_GE = 0, 5
# RELEASE_MEM fields
EVENT_CACHE_FLUSH_AND_INV_TS = 0x14  # end of pipe: every earlier dispatch finished, caches written back
EVENT_CS_PARTIAL_FLUSH = 0x07  # wait until earlier dispatches finished before starting the next
DATA_SEL_NONE, DATA_SEL_32, DATA_SEL_64, DATA_SEL_GPU_CLOCK = 0, 1, 2, 3
INT_SEL_NONE, INT_SEL_AFTER_WRITE_CONFIRM = 0, 2
# DISPATCH_INITIATOR bits
DISPATCH_COMPUTE_SHADER_EN, DISPATCH_FORCE_START_AT_000, DISPATCH_CS_W32_EN = 1 << 0, 1 << 2, 1 << 15

# --- SDMA packets (sdma_v4/v5/v6 pkt headers): opcode in bits 0-7, sub-opcode in 8-15 ---
SDMA_OP_NOP, SDMA_OP_COPY, SDMA_OP_FENCE, SDMA_OP_TRAP = 0, 1, 5, 6
SDMA_OP_POLL_REGMEM, SDMA_OP_TIMESTAMP, SDMA_OP_GCR = 8, 13, 17
SDMA_SUBOP_COPY_LINEAR, SDMA_SUBOP_TIMESTAMP_GET_GLOBAL = 0, 2
#: bytes one COPY_LINEAR moves at most (its count field holds bytes - 1 in 22 bits on SDMA 4)
SDMA_MAX_COPY = 1 << 22


@dataclass(frozen=True)
class GfxTable:
    """The registers and packet variants of one gfx generation."""

    generation: str
    compute_pgm_lo: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc3: int  # at a different offset on gfx9 (gfx90a+ keep the accumulation-VGPR offset there)
    compute_num_thread_x: int
    compute_start_x: int
    compute_resource_limits: int
    compute_static_thread_mgmt_se0: int  # SE0, SE1 consecutive
    compute_static_thread_mgmt_se2: int  # SE2, SE3 consecutive
    compute_tmpring_size: int
    compute_user_data_0: int
    #: ACQUIRE_MEM body length (gfx10+ adds GCR_CNTL) and the cache-invalidate bits it carries
    acquire_mem_dwords: int
    acquire_mem_cntl: int
    #: RELEASE_MEM event_cntl cache bits (write back and invalidate the L2 at end of pipe)
    release_mem_cache: int
    #: SDMA has a GCR_REQ packet (gfx10+) to invalidate caches before reading memory another engine wrote
    sdma_gcr: bool
    #: SDMA FENCE header bits: MTYPE 3 (uncached) on gfx10+, so the host sees the write at once
    sdma_fence_flags: int
    #: RELEASE_MEM's last dword carries the interrupt context id (the KFD event id); gfx9 leaves it 0 and the
    #: driver scans the event page instead
    interrupt_ctxid: bool
    #: GPU timestamp counter frequency (RELEASE_MEM GPU clock / SDMA global timestamp)
    timestamp_hz: int
    #: compute wave size the compiler uses by default
    wave_size: int


_COMMON = {"compute_pgm_lo": 0x2E0C, "compute_pgm_rsrc1": 0x2E12, "compute_num_thread_x": 0x2E07,
           "compute_start_x": 0x2E04, "compute_resource_limits": 0x2E15, "compute_static_thread_mgmt_se0": 0x2E16,
           "compute_static_thread_mgmt_se2": 0x2E19, "compute_tmpring_size": 0x2E18, "compute_user_data_0": 0x2E40}

# COMPUTE_PGM_RSRC3: 0x2E2D on gfx9 (ROCm's kfdtest Dispatch.cpp), 0x2E28 on gfx10+ (GC base + 0x1bc8 in
# gc_11_0_0_offset.h; PAL's Gfx10Plus::mmCOMPUTE_PGM_RSRC3)
GFX9 = GfxTable("gfx9", compute_pgm_rsrc3=0x2E2D, acquire_mem_dwords=6,
                # COHER_CNTL: TC_ACTION_ENA | TC_WB_ACTION_ENA | TCL1_ACTION_ENA | SH_KCACHE/ICACHE_ACTION_ENA
                acquire_mem_cntl=(1 << 23) | (1 << 18) | (1 << 22) | (1 << 27) | (1 << 29),
                release_mem_cache=(1 << 15) | (1 << 17),  # TC_WB_ACTION_ENA | TC_ACTION_ENA
                sdma_gcr=False, sdma_fence_flags=0, interrupt_ctxid=False, timestamp_hz=100_000_000, wave_size=64,
                **_COMMON)
GFX11 = GfxTable("gfx11", compute_pgm_rsrc3=0x2E28, acquire_mem_dwords=7,
                 # GCR_CNTL: GLI_INV(all) | GLK_INV | GLV_INV | GL1_INV | GL2_INV | GL2_WB | GLM_INV | GLM_WB
                 acquire_mem_cntl=(1 << 0) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 14) | (1 << 15) | (1 << 5)
                 | (1 << 4),
                 # GCR_SEQ | GL2_WB | GLM_INV | GLM_WB, as amdgpu's gfx11 end-of-pipe fence
                 release_mem_cache=(1 << 22) | (1 << 21) | (1 << 13) | (1 << 12),
                 sdma_gcr=True, sdma_fence_flags=3 << 16, interrupt_ctxid=True, timestamp_hz=100_000_000,
                 wave_size=32, **_COMMON)

#: gfx targets this runtime has tables for (major version -> table)
_TABLES = {9: GFX9, 10: GFX11, 11: GFX11}
SUPPORTED = ("gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102")


def gfx_table(arch: str) -> GfxTable:
    """The table for gfx target ``arch``; ``ValueError`` for a generation without one."""
    digits = arch[3:]
    major = int(digits[:-2]) if arch.startswith("gfx") and len(digits) >= 3 and digits[:-2].isdigit() else -1
    if major not in _TABLES:
        raise ValueError(f"unsupported AMD GPU target {arch!r}: this runtime has register tables for "
                         f"{', '.join(SUPPORTED)} (gfx9, gfx10 and gfx11 generations)")
    return _TABLES[major]
