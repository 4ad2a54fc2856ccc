"""Helpers of the AMD plugin tests: skipping without a toolchain, running LLVM's binary tools."""
from __future__ import annotations

import functools
import shutil
import subprocess

import pytest
from ember_amd.toolchain import toolchain_problem


def require_clang(arch: str) -> None:
    """Skip unless some clang builds code objects for ``arch``."""
    problem = toolchain_problem(arch)
    if problem is not None:
        pytest.skip(problem)


@functools.cache
def find_llvm_tool(tool: str) -> str | None:
    """The newest ``llvm-objdump``/``llvm-readelf`` installed (``tool-N`` on PATH or in /usr/lib/llvm-N/bin)."""
    for v in (21, 20, 19, 18, 17, 16, 15):
        for path in (shutil.which(f"{tool}-{v}"), shutil.which(f"/usr/lib/llvm-{v}/bin/{tool}")):
            if path:
                return path
    return shutil.which(tool)


def llvm_tool_output(tool: str, *args: str) -> str:
    """The stdout of an LLVM tool; skips (naming what to install) when the tool is missing or does not know the
    target it was asked about."""
    path = find_llvm_tool(tool)
    if path is None:
        pytest.skip(f"no {tool}: apt install llvm-19")
    proc = subprocess.run([path, *args], capture_output=True, text=True)
    if proc.returncode != 0 or "not a recognized processor" in proc.stderr:
        pytest.skip(f"{path} cannot handle {' '.join(args)}: {proc.stderr.strip()[:200]} (apt install llvm-19)")
    return proc.stdout
