"""Render and compile a kernel corpus for CUDA architectures without a GPU (what CI runs).

A corpus (:func:`ember.testing.load_corpus`) holds every kernel AST a workload lowered. For each
architecture, each AST is lowered by codegen for that architecture's renderer, the sources are
joined into programs of :data:`BATCH` kernels (as the device's compiler joins a schedule), each
program is compiled to PTX by NVRTC, and ``ptxas`` (the CUDA toolkit's, when there is one) assembles
the PTX for the real architecture. Without ``ptxas`` NVRTC builds the CUBIN itself (its built-in
assembler). A failure names the kernel, its source and the compiler's log.

Run it on a recorded corpus::

    KERNEL_CORPUS=/tmp/corpus python -m pytest tests/backend   # record
    python -m ember_cuda.corpus_check /tmp/corpus              # compile for sm_75, sm_80, sm_90
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ember.device import CompileError, compile_batches, corpus_main, corpus_sources, first_failure, join_sources
from ember.ir import UOp
from ember_cuda.compiler import CUDACompiler, nvrtc_compile
from ember_cuda.renderer import CUDARenderer, parse_arch

#: the architectures CI compiles every kernel for: Turing, Ampere, Hopper
ARCHS = ("sm_75", "sm_80", "sm_90")
#: kernels per NVRTC program (NVRTC's cost is mostly per kernel; a few large programs keep both
#: the fixed cost per call and the time to find a failing kernel small)
BATCH = 128


def find_ptxas() -> str | None:
    """The CUDA toolkit's ``ptxas``, or ``None`` when there is none."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        found = find_nvidia_binary_utility("ptxas")
        if found:
            return str(found)
    except Exception:  # noqa: BLE001 - an old cuda-pathfinder: look on PATH
        pass
    return shutil.which("ptxas")


@dataclass(frozen=True)
class ArchResult:
    """What compiling a corpus for one architecture did, and how long each stage took (seconds)."""

    arch: str
    kernels: int
    programs: int
    assembler: str  # "ptxas" or "nvrtc"
    render_s: float
    nvrtc_s: float
    ptxas_s: float


def render_corpus(asts: Sequence[UOp], arch: str, first: int = 0) -> list[str]:
    """The CUDA source of every AST, lowered by codegen for ``arch`` (kernel ``i`` is called ``k{first + i}``)."""
    return corpus_sources(asts, CUDARenderer(arch), first)


def _compile_group(srcs: Sequence[str], arch: str, ptxas: str | None, workdir: str) -> float:
    """Compile one program of ``srcs`` (PTX, then ``ptxas``); on failure, find the source at fault.

    Returns the seconds spent in ``ptxas``.
    """
    joined = join_sources(srcs, CUDACompiler.kernel_pattern)
    if joined is None:
        raise ValueError("a corpus source does not hold exactly one kernel")
    target = arch.replace("sm_", "compute_") if ptxas else arch
    try:
        out = nvrtc_compile(joined[0], target, CUDACompiler.options)
    except CompileError:
        first_failure(srcs, lambda src: nvrtc_compile(src, target, CUDACompiler.options))
        raise
    if ptxas is None:
        return 0.0
    start = time.perf_counter()
    fd, path = tempfile.mkstemp(suffix=".ptx", dir=workdir)
    with os.fdopen(fd, "wb") as f:
        f.write(out.ptx.rstrip(b"\0"))
    # -O0: whether ptxas accepts the PTX does not depend on how hard it optimizes, and -O0 takes half the time
    proc = subprocess.run([ptxas, f"-arch={arch}", "-O0", path, "-o", os.devnull], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CompileError(out.ptx.rstrip(b"\0").decode(), proc.stderr + proc.stdout,
                           f"ptxas -arch={arch} rejected NVRTC's PTX")
    return time.perf_counter() - start


def check_corpus(asts: Sequence[UOp], archs: Sequence[str] = ARCHS, batch: int = BATCH,
                 workers: int | None = None, ptxas: str | None = "auto") -> list[ArchResult]:
    """Render every AST for each architecture and compile it (NVRTC, then ``ptxas`` when found).

    ``ptxas="auto"`` looks the assembler up (:func:`find_ptxas`); ``None`` lets NVRTC build CUBINs instead.
    Raises :class:`~ember.device.compiler.CompileError` for the first kernel that does not compile.
    """
    for arch in archs:
        parse_arch(arch)
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    assembler = find_ptxas() if ptxas == "auto" else ptxas
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    results: list[ArchResult] = []
    with tempfile.TemporaryDirectory(prefix="ember-cuda-corpus-") as workdir:
        for arch in archs:
            start = time.perf_counter()
            srcs = render_corpus(asts, arch)
            rendered = time.perf_counter()
            render_s = rendered - start
            # NVRTC releases the GIL and ptxas is a process: programs compile in parallel
            build = functools.partial(_compile_group, arch=arch, ptxas=assembler, workdir=workdir)
            ptxas_s = sum(compile_batches(srcs, batch, workers, build))
            done = time.perf_counter()
            results.append(ArchResult(arch, len(srcs), -(-len(srcs) // batch), "ptxas" if assembler else "nvrtc",
                                      render_s, done - rendered - ptxas_s / workers, ptxas_s / workers))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ember_cuda.corpus_check DIR [--arch sm_80 ...]``: compile a recorded corpus, print timings."""
    def describe(r: object) -> str:
        assert isinstance(r, ArchResult)
        return (f"{r.arch}: {r.kernels} kernels in {r.programs} programs, render {r.render_s:.1f} s, "
                f"NVRTC {r.nvrtc_s:.1f} s, {r.assembler} {r.ptxas_s:.1f} s")
    return corpus_main(argv, (__doc__ or "").split("\n")[0], ARCHS, BATCH, "NVRTC", check_corpus, describe)


if __name__ == "__main__":
    sys.exit(main())
