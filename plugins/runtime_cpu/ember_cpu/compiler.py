"""Compile C kernels to shared objects with the system C compiler.

The compiler is ``CC`` from the environment when set (it may carry arguments, e.g.
``CC="ccache gcc"``), else the best of gcc, clang and cc as probed by
:mod:`ember_cpu.toolchain` (OpenMP first, then native float16). Kernels are built with
``BASE_FLAGS`` (never ``-ffast-math``: kernels must keep IEEE inf/nan semantics) plus
``-fopenmp`` when the probe found that OpenMP builds, links and runs. ``CPU_OPENMP=0`` turns it off.

The new kernels of a schedule are compiled as one shared object (one compiler process instead
of one per kernel; see :mod:`ember.device.batch_compiler`).
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import tempfile

from ember.device import DEBUG, BatchCompiler, CompileError, getenv, sha256
from ember_cpu.toolchain import cc_version, is_clang, probe_toolchain, select_toolchain

# -fno-trapping-math: ember never reads floating-point exception flags, and gcc's default
# (-ftrapping-math) keeps a select feeding an exp out of vector code; values, inf and nan stay IEEE
# (this is not -ffast-math, and it is clang's default).
# -Werror=implicit-function-declaration: kernels include no system header (the renderer's preamble declares the C
# library functions they call); a call it forgot to declare fails the build instead of assuming an int result.
BASE_FLAGS: tuple[str, ...] = ("-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
                               "-Werror=implicit-function-declaration")
#: added for gcc (clang has neither pass): the scheduling pass after register allocation and global CSE cost 6% of
#: the build of an MLP step's kernels (326 -> 305 ms) and nothing measurable at run time (bench_kernels' matmuls,
#: reductions, convolutions and MLP kernels within the noise): out-of-order cores reorder instructions themselves,
#: and the kernels come with their common subexpressions and loop invariants already hoisted
GCC_FLAGS: tuple[str, ...] = ("-fno-schedule-insns2", "-fno-gcse")
#: the quick tier (``TIERED=1``): -O1 builds the first step's kernels in about a third of -O2's time (it
#: leaves out the vectorizer, which costs most on large register tiles)
QUICK_FLAGS: tuple[str, ...] = ("-O1", *BASE_FLAGS[1:])
LINK_FLAGS: tuple[str, ...] = ("-lm",)

__all__ = ["BASE_FLAGS", "GCC_FLAGS", "QUICK_FLAGS", "CPUCompiler", "cc_version", "find_cc", "host_cpu", "host_machine",
           "host_identity"]


def find_cc() -> list[str] | None:
    """The C compiler command the CPU device uses, as an argument list, or ``None`` when none is found."""
    tc = select_toolchain()
    return list(tc.cc) if tc is not None else None


@functools.cache
def host_cpu() -> dict[str, str]:
    """The first processor's fields in ``/proc/cpuinfo`` (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():  # the first processor is enough
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


@functools.cache
def host_machine() -> str:
    """The machine type in lower case (``x86_64``, ``aarch64``), as ``platform.machine()`` gives it; from
    ``os.uname`` where there is one (importing :mod:`platform` costs 1.5-3.5 ms of every start)."""
    if hasattr(os, "uname"):
        return os.uname().machine.lower()
    import platform

    return platform.machine().lower()


@functools.cache
def host_identity() -> str:
    """What ``-march=native`` depends on: the machine type and the CPU model and feature flags (from
    ``/proc/cpuinfo``; where there is none, the processor name, which on Linux costs a ``uname`` process)."""
    cpu = host_cpu()
    fields = [f"{key}: {cpu[key]}" for key in ("model name", "flags", "Features", "CPU part") if key in cpu]
    if not fields:
        import platform

        fields = [platform.processor()]
    ident = [host_machine(), *fields]
    return sha256("\n".join(ident).encode()).hexdigest()[:16]


class CPUCompiler(BatchCompiler):
    """Compiles C source to a shared object (``.so``), returned as packed
    :class:`~ember.device.batch_compiler.KernelBinary` bytes."""

    #: a kernel: ``void NAME(void** bufs, const long long* vals)`` at the start of a line, after any
    #: attribute macros (the renderer marks fused tiles ``EMBER_FUSED_TILE void ...``)
    kernel_pattern = re.compile(r"^(?:[A-Z_][A-Z0-9_]*\s+)*void\s+(\w+)\s*\(\s*void\s*\*\*\s*bufs\b", re.MULTILINE)
    #: each build is its own compiler process: a batch is split across the cores
    parallel_builds = os.cpu_count() or 1
    #: a gcc -O2 process costs about 24 ms before its first kernel (start-up, the preamble, the back end's set-up
    #: on the first function, the assembler and the linker), about what 9,000 characters of kernel code cost (a
    #: matmul's 7,800-character register tile: 21 ms)
    build_overhead = 9000

    def __init__(self, cc: list[str] | None = None, openmp: bool | None = None, quick: bool = False):
        """``quick``: build with ``QUICK_FLAGS`` instead of ``BASE_FLAGS`` (the quick tier)."""
        found = cc if cc is not None else find_cc()
        if not found:
            raise RuntimeError("no C compiler found: install gcc or clang, or set CC to one")
        self.cc: tuple[str, ...] = tuple(found)
        if openmp is None:
            openmp = bool(getenv("CPU_OPENMP", 1)) and probe_toolchain(self.cc).openmp
            if not openmp and getenv("CPU_OPENMP", 1) and DEBUG >= 1:
                _warn_no_openmp(self.cc)
        self.openmp, self.quick = openmp, quick
        tier, family = QUICK_FLAGS if quick else BASE_FLAGS, () if is_clang(self.cc) else GCC_FLAGS
        self.flags: tuple[str, ...] = tier + family + (("-fopenmp",) if openmp else ())
        #: after the source: the probed lean link (libgomp only with OpenMP) or the default one
        lean = probe_toolchain(self.cc).link if getenv("CPU_LEAN_LINK", 1) else ()
        self.link: tuple[str, ...] = tuple(a for a in lean if openmp or a != "-lgomp") if lean else LINK_FLAGS
        # the flags are in the key: each tier has its own cache entries
        super().__init__(f"cpu-cc|{' '.join(self.cc)}|{cc_version(self.cc)}|{' '.join(self.flags)}|"
                         f"{' '.join(self.link)}|{host_identity()}")
        self._quick: CPUCompiler | None = None
        #: a prefix that runs each build at the lowest priority (for background builds; no effect on the binary)
        self.launcher: tuple[str, ...] = ()

    def quick_tier(self) -> CPUCompiler | None:
        """The same compiler with ``QUICK_FLAGS`` (``None`` for a quick compiler itself)."""
        if self.quick:
            return None
        if self._quick is None:
            self._quick = CPUCompiler(list(self.cc), self.openmp, quick=True)
        return self._quick

    def background(self) -> CPUCompiler:
        """A copy of this compiler (same flags and cache entries) whose builds run under ``nice -n 19``, one at
        a time: it leaves the cores to the program, and it starts no thread pool of its own, so the builds
        still under way when the program ends can finish (no new pool may start once the interpreter exits)."""
        low = CPUCompiler(list(self.cc), self.openmp, quick=self.quick)
        nice = shutil.which("nice")
        low.launcher = (nice, "-n", "19") if nice else ()
        low.parallel_builds = 1
        return low

    def build(self, src: str) -> bytes:
        """Compile ``src`` to a shared object and return its bytes; raise ``CompileError`` on failure."""
        with tempfile.TemporaryDirectory(prefix="ember-cc-") as tmp:
            with open(os.path.join(tmp, "kernel.c"), "w") as f:
                f.write(src)
            # relative names (run inside tmp) keep the temporary folder out of error messages
            cmd = [*self.cc, *self.flags, "-o", "kernel.so", "kernel.c", *self.link]
            try:
                proc = subprocess.run([*self.launcher, *cmd], capture_output=True, text=True, errors="replace",
                                      check=False, cwd=tmp)
            except OSError as e:
                raise CompileError(src, str(e), f"cannot run the C compiler {self.cc[0]}") from e
            out_path = os.path.join(tmp, "kernel.so")
            if proc.returncode != 0 or not os.path.exists(out_path):
                raise CompileError(src, proc.stderr + proc.stdout,
                                   f"C compile failed (exit {proc.returncode}): {shlex.join(cmd)}")
            with open(out_path, "rb") as f:
                return f.read()


@functools.cache
def _warn_no_openmp(cc: tuple[str, ...]) -> None:
    print(f"CPU: no OpenMP with {cc[0]}, kernels run on one thread: {probe_toolchain(cc).openmp_reason}")
