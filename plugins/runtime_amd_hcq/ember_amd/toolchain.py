"""Finding a clang that compiles OpenCL C to an AMD code object for a gfx target.

ember does not ship LLVM: it uses a Debian/Ubuntu clang (``apt install clang-19 lld-19``). clang-19
knows gfx1100 (RDNA3), gfx942 (CDNA3) and gfx1201 (RDNA4); clang-15 (pulled in by PoCL) knows
gfx1100 but not gfx942; clang-14 knows neither.

Kernels read their work-group size from the hidden kernel arguments of code-object version 5
(``__builtin_amdgcn_workgroup_size_x``), so every code object is built as version 5. clang-15's
driver links with the first ``ld.lld`` on its search path, and lld 14 (Debian's default
``ld.lld``) rejects version-5 objects ("unknown abi version"): a clang older than 19 is paired
with the newest lld installed (``ld.lld-N``, N >= 15) through a private ``-B`` folder holding an
``ld.lld`` link to it; the probe build checks that the pair links a version-5 code object.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

#: what to install when no clang knows a target
INSTALL_HINT = "apt install clang-19 lld-19 (Debian 12 / Ubuntu 24.04), or set EMBER_AMD_CLANG to a clang that does"
#: clang versions tried, newest first (each as ``clang-N`` on PATH and ``/usr/lib/llvm-N/bin/clang``)
CLANG_VERSIONS = (21, 20, 19, 18, 17, 16, 15)
#: the code-object version kernels are built for (see the module docstring)
CODE_OBJECT_VERSION = 5
#: a tiny kernel that every usable toolchain compiles and links (version 5 needs a matching lld)
_PROBE_SOURCE = "__kernel void ember_probe(__global int* p) { p[__builtin_amdgcn_workitem_id_x()] = 1; }\n"


class ToolchainError(RuntimeError):
    """No usable clang for a gfx target; the message says what was tried and what to install."""


@dataclass(frozen=True)
class Toolchain:
    """A clang that compiles and links code objects for one gfx target."""

    clang: str
    version: str
    #: extra driver options (``-B DIR`` to pick a newer ``ld.lld``); empty for a complete LLVM install
    link_options: tuple[str, ...] = ()

    def base_command(self, arch: str) -> list[str]:
        """The clang command line, up to the input, that builds OpenCL C for ``arch`` into a code object."""
        return [self.clang, "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}",
                f"-mcode-object-version={CODE_OBJECT_VERSION}", *self.link_options]


def _candidates() -> list[str]:
    """Paths of clang executables to try, in order (``EMBER_AMD_CLANG`` first when set)."""
    found: list[str] = []
    if env := os.environ.get("EMBER_AMD_CLANG"):
        found.append(env)
    for v in CLANG_VERSIONS:
        for name in (shutil.which(f"clang-{v}"), f"/usr/lib/llvm-{v}/bin/clang"):
            if name and os.path.isfile(name) and os.path.realpath(name) not in map(os.path.realpath, found):
                found.append(name)
    if (plain := shutil.which("clang")) and os.path.realpath(plain) not in map(os.path.realpath, found):
        found.append(plain)
    return found


def _major(version_text: str) -> int:
    m = re.search(r"clang version (\d+)", version_text)
    return int(m.group(1)) if m else 0


def _lld_dir(min_major: int) -> str | None:
    """A private folder whose ``ld.lld`` is an lld of version ``min_major`` or newer (None when there is none)."""
    for v in CLANG_VERSIONS:
        if v < min_major:
            break
        for lld in (shutil.which(f"ld.lld-{v}"), f"/usr/lib/llvm-{v}/bin/ld.lld"):
            if lld and os.path.isfile(lld):
                folder = os.path.join(tempfile.gettempdir(), f"ember-amd-lld-{v}-{os.getuid()}")
                os.makedirs(folder, exist_ok=True)
                link = os.path.join(folder, "ld.lld")
                if not os.path.islink(link) or os.readlink(link) != lld:
                    tmp = f"{link}.{os.getpid()}"
                    os.symlink(lld, tmp)
                    os.replace(tmp, link)
                return folder
    return None


def _try(clang: str, arch: str, link_options: tuple[str, ...]) -> str | None:
    """``None`` when ``clang`` builds the probe kernel for ``arch``; else clang's complaint (one line)."""
    cmd = [clang, "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}", f"-mcode-object-version={CODE_OBJECT_VERSION}",
           *link_options, "-x", "cl", "-cl-std=CL2.0", "-nogpulib", "-O1", "-", "-o", os.devnull]
    try:
        proc = subprocess.run(cmd, input=_PROBE_SOURCE.encode(), capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if "error" in ln]
    return (lines[0] if lines else proc.stderr.decode(errors="replace").strip()[:200]) or f"exit {proc.returncode}"


@functools.cache
def find_toolchain(arch: str) -> Toolchain:
    """The newest clang that compiles and links a code object for ``arch`` (cached per target).

    Raises :class:`ToolchainError` naming each clang tried and why it failed, and what to install.
    """
    if not re.fullmatch(r"gfx[0-9a-f]{3,4}", arch):
        raise ToolchainError(f"invalid AMD GPU target {arch!r}: expected a gfx name such as gfx1100 or gfx942")
    tried: list[str] = []
    for clang in _candidates():
        try:
            version = subprocess.run([clang, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            tried.append(f"{clang}: {e}")
            continue
        major = _major(version)
        options: tuple[str, ...] = ()
        if 0 < major < 19:
            # the newest lld there is; whether it links version 5 is what the probe build below finds out
            lld = _lld_dir(15)
            if lld is None:
                tried.append(f"{clang} (clang {major}): no ld.lld 15 or newer (Debian's ld.lld 14 cannot link "
                             "code-object v5; apt install lld-19)")
                continue
            options = ("-B", lld)
        error = _try(clang, arch, options)
        if error is None:
            return Toolchain(clang, version.splitlines()[0] if version else f"clang {major}", options)
        tried.append(f"{clang} (clang {major or '?'}): {error}")
    detail = "; ".join(tried) if tried else "no clang found on PATH or in /usr/lib/llvm-*/bin"
    raise ToolchainError(f"no clang can build code objects for {arch} ({detail}): {INSTALL_HINT}")


def toolchain_problem(arch: str) -> str | None:
    """``None`` when some clang builds code objects for ``arch``, else the reason (for probes and doctor)."""
    try:
        find_toolchain(arch)
    except ToolchainError as e:
        return str(e)
    return None
