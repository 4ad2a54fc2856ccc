"""Render and compile a kernel corpus for AMD GPU targets without a GPU, and check each code object (what CI runs).

A corpus (:func:`ember.testing.load_corpus`) holds every kernel AST a workload lowered. For each target,
each AST is lowered by codegen for that target's renderer, the sources are joined into programs of
:data:`BATCH` kernels, each program is compiled and linked by clang (two at a time: clang is a
process), and every kernel's entry in the code object's metadata note is checked
(:func:`check_kernel`): the kernel is there, its argument block matches its signature, its register
counts are within the target's limits, its wave size and work-group limit are the renderer's. A
failure names the kernel, its source and the compiler's log or the broken check.

Run it on a recorded corpus::

    KERNEL_CORPUS=/tmp/corpus python -m pytest tests/backend   # record
    python -m ember_amd.corpus_check /tmp/corpus              # compile for gfx1100 and gfx942
"""
from __future__ import annotations

import functools
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ember.device import CompileError, compile_batches, corpus_main, corpus_sources, first_failure
from ember.ir import UOp
from ember_amd.compiler import KERNEL_PATTERN, clang_build
from ember_amd.elf import KernelInfo, read_code_object
from ember_amd.renderer import PRELUDE_END, AMDRenderer
from ember_amd.toolchain import find_toolchain

#: the targets CI compiles every kernel for: RDNA3 (wave32) and CDNA3 (wave64)
ARCHS = ("gfx1100", "gfx942")
#: kernels per clang call: each program also compiles the math helpers its kernels call (they are not inlined),
#: so larger programs cost less per kernel (measured: 200 kernels per call take a third of the time of 25)
BATCH = 200


@dataclass(frozen=True)
class ArchLimits:
    """Register limits of one wave on a target generation."""

    max_sgprs: int
    max_vgprs: int


def arch_limits(arch: str) -> ArchLimits:
    """Register limits of a target as the metadata counts them.

    SGPRs: 106 addressable on gfx10+ and 102 on gfx9, plus the ones the metadata adds (VCC on both, flat
    scratch and XNACK on gfx9): 108 in both cases. VGPRs per work-item: gfx90a/gfx94x have 512
    (architected and accumulation registers in one file), other GCN/CDNA and RDNA 256.
    """
    m = re.fullmatch(r"gfx(\d+?)([0-9a-f]{2})", arch)
    if m is None:
        raise ValueError(f"invalid AMD GPU target {arch!r}")
    unified = arch.startswith(("gfx90a", "gfx94", "gfx95"))
    return ArchLimits(max_sgprs=108, max_vgprs=512 if unified else 256)


def _signature_params(src: str, name: str) -> list[str]:
    """The parameter declarations of kernel ``name`` in ``src``."""
    m = re.search(r"EMBER_KERNEL\s+void\s+" + re.escape(name) + r"\s*\(([^)]*)\)", src)
    if m is None:
        raise ValueError(f"kernel {name} not found in its source")
    return [p.strip() for p in m.group(1).split(",") if p.strip()]


def check_kernel(info: KernelInfo, src: str, renderer: AMDRenderer) -> list[str]:
    """What is wrong with one kernel's metadata (empty when nothing is)."""
    problems: list[str] = []
    params = _signature_params(src, info.name)
    explicit = info.explicit_args
    if len(explicit) != len(params):
        problems.append(f"{len(explicit)} explicit arguments in the metadata, {len(params)} in the signature")
    end = 0
    for a, p in zip(explicit, params):
        want_kind = "global_buffer" if "*" in p else "by_value"
        if a.value_kind != want_kind or a.size != 8:
            problems.append(f"argument {p!r}: {a.value_kind} of {a.size} bytes, expected {want_kind} of 8")
        if a.offset < end or a.offset % 8:
            problems.append(f"argument {p!r} at offset {a.offset}: overlaps the one before or is misaligned")
        end = a.offset + a.size
    last = max((a.offset + a.size for a in info.args), default=0)
    if info.kernarg_size < last or info.kernarg_size < end:
        problems.append(f"kernarg size {info.kernarg_size} < end of the arguments ({max(last, end)})")
    if info.kernarg_align < 8 or info.kernarg_align & (info.kernarg_align - 1):
        problems.append(f"kernarg alignment {info.kernarg_align}: expected a power of two of at least 8")
    if "EMBER_GLOBAL_ID(" in src.split(PRELUDE_END)[-1] and info.arg("hidden_group_size_x") is None:
        problems.append("no hidden_group_size_x argument (code-object v5), but the kernel reads its group size")
    limits = arch_limits(renderer.arch)
    if not 0 < info.sgpr_count <= limits.max_sgprs:
        problems.append(f"{info.sgpr_count} SGPRs, limit {limits.max_sgprs}")
    if not 0 < info.vgpr_count <= limits.max_vgprs:
        problems.append(f"{info.vgpr_count} VGPRs, limit {limits.max_vgprs}")
    if info.wavefront_size != renderer.wave_size:
        problems.append(f"wave size {info.wavefront_size}, expected {renderer.wave_size}")
    if info.max_flat_workgroup_size != renderer.max_workgroup:
        problems.append(f"max work-group size {info.max_flat_workgroup_size}, expected {renderer.max_workgroup}")
    if info.group_segment_fixed_size > renderer.shared_max:
        problems.append(f"{info.group_segment_fixed_size} bytes of LDS, limit {renderer.shared_max}")
    return problems


@dataclass(frozen=True)
class ArchResult:
    """What compiling a corpus for one target did, and how long each stage took (seconds)."""

    arch: str
    #: distinct kernels compiled (the corpus's ASTs may render to the same source)
    kernels: int
    programs: int
    #: kernels whose code uses scratch memory (private segment > 0): slow on a GPU, worth a look
    with_scratch: int
    max_vgprs: int
    max_sgprs: int
    render_s: float
    compile_s: float


def render_corpus(asts: Sequence[UOp], renderer: AMDRenderer, first: int = 0) -> list[str]:
    """The source of every AST, lowered by codegen for ``renderer`` (kernel ``i`` is called ``k{first + i}``), but
    those whose launch is longer than the target's 32-bit hardware ids count (refused by design: recorded on a
    target with 64-bit loops)."""
    return corpus_sources(asts, renderer, first, skip_too_large=True)


def _distinct(srcs: Sequence[str]) -> list[str]:
    """``srcs`` without repeats of a kernel that differs only in its name (distinct ASTs often render alike)."""
    seen: dict[str, str] = {}
    for src in srcs:
        [name] = KERNEL_PATTERN.findall(src)
        seen.setdefault(re.sub(rf"\b{re.escape(name)}\b", "KERNEL", src), src)
    return list(seen.values())


def _compile_group(srcs: Sequence[str], renderer: AMDRenderer) -> list[KernelInfo]:
    """Build one program of ``srcs`` and check each kernel; ``CompileError`` names the source at fault."""
    toolchain = find_toolchain(renderer.arch)
    try:
        lib = clang_build(toolchain, renderer.arch, "\n".join(srcs))
    except CompileError:
        first_failure(srcs, lambda src: clang_build(toolchain, renderer.arch, src))
        raise
    code = read_code_object(lib)
    if code.arch.split(":")[0] != renderer.arch:
        raise CompileError("\n".join(srcs), f"amdhsa.target is {code.arch}", f"code object is not for {renderer.arch}")
    infos = []
    for src in srcs:
        [name] = KERNEL_PATTERN.findall(src)
        info = code.kernels.get(name)
        problems = ["missing from the code object's metadata"] if info is None else check_kernel(info, src, renderer)
        if problems:
            raise CompileError(src, "\n".join(problems), f"kernel {name} for {renderer.arch} fails the metadata checks")
        assert info is not None
        infos.append(info)
    return infos


def check_corpus(asts: Sequence[UOp], archs: Sequence[str] = ARCHS, batch: int = BATCH,
                 workers: int | None = None) -> list[ArchResult]:
    """Render every AST for each target, compile the kernels in programs of ``batch``, check every code object.

    Raises :class:`~ember.device.compiler.CompileError` for the first kernel that does not compile or fails
    a check, and :class:`~ember_amd.toolchain.ToolchainError` when no clang knows a target.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    workers = workers or max(1, min(2, os.cpu_count() or 1))
    results: list[ArchResult] = []
    for arch in archs:
        renderer = AMDRenderer(arch)
        find_toolchain(arch)
        start = time.perf_counter()
        srcs = _distinct(render_corpus(asts, renderer))
        rendered = time.perf_counter()
        built = compile_batches(srcs, batch, workers, functools.partial(_compile_group, renderer=renderer))
        infos = [k for group in built for k in group]
        done = time.perf_counter()
        results.append(ArchResult(arch, len(srcs), len(built),
                                  sum(1 for k in infos if k.private_segment_fixed_size > 0),
                                  max((k.vgpr_count for k in infos), default=0),
                                  max((k.sgpr_count for k in infos), default=0), rendered - start, done - rendered))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ember_amd.corpus_check DIR [--arch gfx1100 ...]``: compile a recorded corpus, print timings."""
    def describe(r: object) -> str:
        assert isinstance(r, ArchResult)
        return (f"{r.arch}: {r.kernels} kernels in {r.programs} programs, render {r.render_s:.1f} s, clang "
                f"{r.compile_s:.1f} s; {r.with_scratch} use scratch; max {r.max_vgprs} VGPRs, {r.max_sgprs} SGPRs")
    return corpus_main(argv, (__doc__ or "").split("\n")[0], ARCHS, BATCH, "clang", check_corpus, describe)


if __name__ == "__main__":
    sys.exit(main())
