"""Compile C kernels to shared objects with the system C compiler.

The compiler is ``CC`` from the environment when set (it may carry arguments, e.g.
``CC="ccache gcc"``), else ``clang``, else ``gcc``, else ``cc``. Kernels are built with
``BASE_FLAGS`` (never ``-ffast-math``: kernels must keep IEEE inf/nan semantics) plus
``-fopenmp`` when the compiler can build and link an OpenMP program. ``CPU_OPENMP=0`` turns OpenMP off.

The new kernels of a schedule are compiled as one shared object (one compiler process instead
of one per kernel; see :mod:`ember.device.batch_compiler`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile

from ember.device.batch_compiler import BatchCompiler
from ember.device.compiler import CompileError
from ember.helpers import DEBUG, GlobalCounters, getenv

# -fno-trapping-math: ember never reads floating-point exception flags, and gcc's default
# (-ftrapping-math) keeps a select feeding an exp out of vector code; values, inf and nan stay IEEE
# (this is not -ffast-math, and it is clang's default).
BASE_FLAGS: tuple[str, ...] = ("-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math")
LINK_FLAGS: tuple[str, ...] = ("-lm",)

_OPENMP_TEST = """#include <omp.h>
int ember_omp_probe(int n) {
  int total = 0;
  #pragma omp parallel for reduction(+:total)
  for (int i = 0; i < n; i++) total += i;
  return total + omp_get_max_threads();
}
"""


def find_cc() -> list[str] | None:
    """The C compiler command as an argument list (``CC``, clang, gcc or cc), or ``None`` when none is found."""
    env_cc = os.environ.get("CC", "").strip()
    if env_cc:
        cmd = shlex.split(env_cc)
        exe = shutil.which(cmd[0])
        return [exe, *cmd[1:]] if exe else None
    for name in ("clang", "gcc", "cc"):
        exe = shutil.which(name)
        if exe:
            return [exe]
    return None


@functools.cache
def cc_version(cc: tuple[str, ...]) -> str:
    """The first line of ``cc --version`` (memoized per process)."""
    try:
        out = subprocess.run([*cc, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError as e:
        return f"unknown ({e})"
    return out.splitlines()[0].strip() if out else "unknown"


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
def host_identity() -> str:
    """What ``-march=native`` depends on: the machine type and the CPU model and feature flags."""
    cpu = host_cpu()
    ident = [platform.machine(), platform.processor(),
             *(f"{key}: {cpu[key]}" for key in ("model name", "flags", "Features", "CPU part") if key in cpu)]
    return hashlib.sha256("\n".join(ident).encode()).hexdigest()[:16]


@functools.cache
def openmp_supported(cc: tuple[str, ...]) -> bool:
    """Whether ``cc -fopenmp`` builds and links a small OpenMP shared object.

    Memoized per process; a success is also kept in the compile cache (as the probe
    program's binary), so later processes skip the ~50 ms probe compile.
    """
    probe = CPUCompiler(list(cc), openmp=True)
    compiled_before = GlobalCounters.kernels_compiled
    try:
        probe.compile_cached(_OPENMP_TEST)
    except CompileError:
        return False
    finally:
        GlobalCounters.kernels_compiled = compiled_before  # the probe is not a kernel
    return True


class CPUCompiler(BatchCompiler):
    """Compiles C source to a shared object (``.so``), returned as packed
    :class:`~ember.device.batch_compiler.KernelBinary` bytes."""

    #: a kernel: ``void NAME(void** bufs, const long long* vals)`` at the start of a line
    kernel_pattern = re.compile(r"^void\s+(\w+)\s*\(\s*void\s*\*\*\s*bufs\b", re.MULTILINE)
    #: each build is its own compiler process: a batch is split across the cores
    parallel_builds = os.cpu_count() or 1

    def __init__(self, cc: list[str] | None = None, openmp: bool | None = None):
        found = cc if cc is not None else find_cc()
        if not found:
            raise RuntimeError("no C compiler found: install gcc or clang, or set CC to one")
        self.cc: tuple[str, ...] = tuple(found)
        if openmp is None:
            openmp = bool(getenv("CPU_OPENMP", 1)) and openmp_supported(self.cc)
            if not openmp and getenv("CPU_OPENMP", 1) and DEBUG >= 1:
                _warn_no_openmp(self.cc)
        self.openmp = openmp
        self.flags: tuple[str, ...] = BASE_FLAGS + (("-fopenmp",) if openmp else ())
        super().__init__(f"cpu-cc|{' '.join(self.cc)}|{cc_version(self.cc)}|{' '.join(self.flags)}|{host_identity()}")

    def build(self, src: str) -> bytes:
        """Compile ``src`` to a shared object and return its bytes; raise ``CompileError`` on failure."""
        with tempfile.TemporaryDirectory(prefix="ember-cc-") as tmp:
            with open(os.path.join(tmp, "kernel.c"), "w") as f:
                f.write(src)
            # relative names (run inside tmp) keep the temporary folder out of error messages
            cmd = [*self.cc, *self.flags, "-o", "kernel.so", "kernel.c", *LINK_FLAGS]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False,
                                      cwd=tmp)
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
    print(f"CPU: {cc[0]} cannot build OpenMP code; kernels run on one thread")
