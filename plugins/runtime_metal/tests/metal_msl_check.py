"""Syntax and type check of Metal Shading Language with clang, without Apple's compiler.

clang's C++ for OpenCL mode (``-x clcpp -target spir64``) parses the C++ that MSL is built on, and with
the stand-in header ``shim/metal_stdlib`` (MSL's ``device``/``constant``/``threadgroup`` mapped to
OpenCL's address spaces, ``double`` switched off) it rejects undeclared names, type errors, pointers
into the wrong address space and any use of double. It generates no code and cannot tell whether a
construct exists in real MSL beyond what the shim declares; attributes are checked against a list here
because clang ignores unknown ones.

Many kernels go into one translation unit (renamed per source by ``#define``, as the batch compiler
does), so checking hundreds of kernels takes a few clang runs.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from ember.device.batch_compiler import join_sources

SHIM = pathlib.Path(__file__).parent / "shim"
KERNEL_PATTERN = re.compile(r"kernel\s+void\s+(\w+)\s*\(")
#: the MSL attributes ember's kernels may use (clang only warns about attributes it does not know)
KNOWN_ATTRIBUTES = re.compile(r"buffer\(\d+\)|thread_position_in_grid|thread_position_in_threadgroup|"
                              r"threadgroup_position_in_grid|thread_index_in_simdgroup|"
                              r"simdgroup_index_in_threadgroup|threads_per_threadgroup")


def find_clang() -> str | None:
    """A clang able to run the check, or None."""
    for name in ("clang", "clang-14", "clang-19", "clang-17", "clang-15"):
        path = shutil.which(name)
        if path:
            return path
    return None


def clang_command(clang: str, path: str) -> list[str]:
    """The clang command line that checks the file ``path``."""
    # -Werror turns the "double constant" warning into an error (Metal has no double); the self-comparisons
    # of nan tests (x != x) are intended
    return [clang, "-x", "clcpp", "-target", "spir64", "-cl-no-stdinc", "-fsyntax-only", "-Werror",
            "-Wno-tautological-compare", "-Wno-unknown-attributes", "-Xclang", "-cl-ext=-cl_khr_fp64",
            "-I", str(SHIM), path]


def check_attributes(name: str, src: str) -> None:
    """Raise AssertionError naming any ``[[attribute]]`` of ``src`` that is not a known MSL attribute."""
    for attr in re.findall(r"\[\[\s*([^\]]*?)\s*\]\]", src):
        if not KNOWN_ATTRIBUTES.fullmatch(attr):
            raise AssertionError(f"kernel {name}: unknown MSL attribute [[{attr}]]\n{src}")


def check_msl(sources: Sequence[str], per_unit: int = 400) -> int:
    """Check every MSL source in ``sources``; raise AssertionError with clang's output and the failing
    kernels' sources on the first translation unit with an error. Returns the number of clang runs."""
    clang = find_clang()
    if clang is None:
        raise RuntimeError("no clang on PATH")
    runs = 0
    for start in range(0, len(sources), per_unit):
        group = list(sources[start:start + per_unit])
        for src in group:
            names = KERNEL_PATTERN.findall(src)
            assert len(names) == 1, f"expected one kernel per source, found {names}:\n{src}"
            check_attributes(names[0], src)
        joined = join_sources(group, KERNEL_PATTERN) if len(group) > 1 else (group[0], [])
        assert joined is not None, "the sources could not be joined into one translation unit"
        text = joined[0]
        with tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/kernels.metal"
            pathlib.Path(path).write_text(text)
            proc = subprocess.run(clang_command(clang, path), capture_output=True, text=True)
        runs += 1
        if proc.returncode != 0:
            raise AssertionError(_explain(text, proc.stderr))
    return runs


def _explain(text: str, output: str) -> str:
    """clang's first errors, each with the source of the kernel it is in (found by line number)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("#define ") and " ember_b" in line] or [0]
    report = [output[:4000]]
    for lineno in sorted({int(m) for m in re.findall(r"kernels\.metal:(\d+):\d+: error", output)})[:3]:
        begin = max((s for s in starts if s < lineno), default=0)
        end = min((s for s in starts if s >= lineno), default=len(lines))
        report.append(f"--- the kernel around line {lineno} ---\n" + "\n".join(lines[begin:end]))
    return "\n".join(report)
