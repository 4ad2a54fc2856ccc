"""Compile the AMD renderer's OpenCL C to a code object (hsaco) with clang, in memory.

``clang -target amdgcn-amd-amdhsa -mcpu=gfxNNNN -x cl - -o -`` compiles and links in one call
(the driver runs ``ld.lld -shared``) and writes the linked code object (ELF ``ET_DYN``,
``EM_AMDGPU``) to stdout: no temporary files. The compiler is chosen by
:func:`ember_amd.toolchain.find_toolchain`.

Every code object gets a non-loaded section ``.ember.source`` with the kernel source
(:func:`ember_amd.elf.add_section`): a code object from the disk cache still tells what it was
built from (the mock GPU rebuilds it for the CPU from there, and errors can show it).

A clang process costs ~60-150 ms however small the kernel, so the new kernels of a schedule are
built as one program (:meth:`AMDCompiler.compile_batch`). Unlike the CUDA compiler, kernels keep
their own names: a program holds kernels with distinct names only (sources that share a kernel name
go to different programs), and each source's binary is the whole program's code object, which a
runtime should load once. Two builds run at once (clang is a process: it uses another core).
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
from collections.abc import Sequence

from ember.device import CompileError, Compiler
from ember_amd.elf import SOURCE_SECTION, add_section, undefined_symbols
from ember_amd.toolchain import Toolchain, find_toolchain

#: clang options after the target: OpenCL C 2.0, no device libraries, IEEE division and sqrt, no fused
#: multiply-add contraction (results match the other ember devices bit for bit where IEEE defines them)
OPTIONS: tuple[str, ...] = ("-x", "cl", "-cl-std=CL2.0", "-nogpulib", "-O2", "-cl-fp32-correctly-rounded-divide-sqrt",
                            "-ffp-contract=off")
#: the kernel name in a source the AMD renderer made
KERNEL_PATTERN = re.compile(r"EMBER_KERNEL\s+void\s+(\w+)\s*\(")


def clang_build(toolchain: Toolchain, arch: str, src: str, options: Sequence[str] = OPTIONS) -> bytes:
    """The linked code object clang makes of ``src`` for ``arch`` (no source section); ``CompileError`` with
    clang's log when it fails, or when the code object calls a function nothing defines."""
    cmd = [*toolchain.base_command(arch), *options, "-", "-o", "-"]
    try:
        proc = subprocess.run(cmd, input=src.encode(), capture_output=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise CompileError(src, f"{' '.join(cmd)} ran for more than 600 s", f"clang timed out building for {arch}") \
            from None
    if proc.returncode != 0 or not proc.stdout.startswith(b"\x7fELF"):
        log = proc.stderr.decode(errors="replace") or f"exit status {proc.returncode}, no code object written"
        raise CompileError(src, log, f"{toolchain.version} could not compile for {arch}")
    missing = undefined_symbols(proc.stdout)
    if missing:
        raise CompileError(src, f"undefined symbols: {', '.join(missing)}",
                           f"the code object for {arch} calls functions no GPU library provides (built with "
                           "-nogpulib: the renderer must not emit OpenCL library calls)")
    return proc.stdout


class AMDCompiler(Compiler):
    """OpenCL C to a code object for one gfx target; ``compile`` returns the code object's bytes."""

    #: the most kernels in one program
    max_batch: int = 32
    #: clang processes run at the same time
    parallel_builds: int = max(1, min(2, os.cpu_count() or 1))

    def __init__(self, arch: str):
        self.arch = arch
        self.toolchain = find_toolchain(arch)
        super().__init__("|".join(["amd-hsaco-1", self.toolchain.version, arch, " ".join(OPTIONS), SOURCE_SECTION]))

    def __repr__(self) -> str:
        return f"<AMDCompiler {self.arch} ({self.toolchain.version})>"

    def compile(self, src: str) -> bytes:
        """The code object of ``src`` with the source in its ``.ember.source`` section."""
        return add_section(clang_build(self.toolchain, self.arch, src), SOURCE_SECTION, src.encode())

    def compile_batch(self, srcs: Sequence[str]) -> list[bytes]:
        """One code object per program of up to :attr:`max_batch` sources with distinct kernel names; each
        source's binary is its program's code object. A failing program is rebuilt source by source, so the
        error names the kernel at fault."""
        if not srcs:
            return []
        groups = self.plan(srcs)
        if len(groups) == 1 or self.parallel_builds == 1:
            built = [self._build_group([srcs[i] for i in g]) for g in groups]
        else:
            with concurrent.futures.ThreadPoolExecutor(min(len(groups), self.parallel_builds)) as pool:
                built = list(pool.map(self._build_group, [[srcs[i] for i in g] for g in groups]))
        out: list[bytes] = [b""] * len(srcs)
        for g, binary in zip(groups, built):
            for i in g:
                out[i] = binary
        return out

    def plan(self, srcs: Sequence[str]) -> list[list[int]]:
        """Indices of ``srcs`` per program: distinct kernel names in each, at most :attr:`max_batch`, and at
        least :attr:`parallel_builds` programs when there are enough sources."""
        names = []
        for src in srcs:
            found = KERNEL_PATTERN.findall(src)
            if len(found) != 1:
                raise ValueError(f"an AMD kernel source holds exactly one EMBER_KERNEL, this one {len(found)}")
            names.append(found[0])
        count = max(-(-len(srcs) // self.max_batch), min(self.parallel_builds, len(srcs)))
        size = -(-len(srcs) // count)
        groups: list[list[int]] = []
        used: list[set[str]] = []
        for i, name in enumerate(names):
            for g, seen in zip(groups, used):
                if len(g) < size and name not in seen:
                    g.append(i)
                    seen.add(name)
                    break
            else:
                groups.append([i])
                used.append({name})
        return groups

    def _build_group(self, group: Sequence[str]) -> bytes:
        if len(group) == 1:
            return self.compile(group[0])
        joined = "\n".join(group)
        try:
            return self.compile(joined)
        except CompileError:
            for src in group:  # raises with the failing kernel's own source and log
                self.compile(src)
            raise
