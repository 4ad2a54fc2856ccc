"""C source to a shared object, with the system C compiler; several kernels build as one library."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

from ember.device import BatchCompiler, CompileError

FLAGS = ("-shared", "-fPIC", "-O2", "-fno-math-errno", "-x", "c")


class FooCompiler(BatchCompiler):
    """Runs ``cc -shared`` on a source; returns the library's bytes (packed as a ``KernelBinary``).

    The base class adds the memory and disk caches and joins a schedule's kernels into one build.
    """

    #: a kernel definition in FOO's C (its name is the first group)
    kernel_pattern = re.compile(r"^void (\w+)\(void\*\* bufs, const long long\* vals\)", re.M)

    def __init__(self, cc: str):
        self.cc = cc
        version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.partition("\n")[0]
        # everything besides the source that decides the binary: the compiler, its version, the flags
        super().__init__(f"foo|{cc}|{version}|{' '.join(FLAGS)}")

    def build(self, src: str) -> bytes:
        """The shared object for ``src``; :class:`CompileError` with the compiler's output on failure."""
        with tempfile.TemporaryDirectory(prefix="ember-foo-") as tmp:
            out = os.path.join(tmp, "kernel.so")
            run = subprocess.run([self.cc, *FLAGS, "-", "-o", out, "-lm"], input=src, capture_output=True, text=True)
            if run.returncode != 0:
                raise CompileError(src, run.stderr, f"{self.cc} failed with exit code {run.returncode}")
            with open(out, "rb") as f:
                return f.read()


def has_float16(cc: str) -> bool:
    """Whether ``cc`` knows C's ``_Float16`` for this machine (gcc 12+ and clang 15+ on x86-64 and arm64)."""
    run = subprocess.run([cc, "-x", "c", "-c", "-", "-o", os.devnull], input="_Float16 h(double x) { return x; }\n",
                         capture_output=True, text=True)
    return run.returncode == 0
