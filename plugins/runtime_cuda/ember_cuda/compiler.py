"""Compile CUDA C with NVRTC (``cuda.bindings.nvrtc``) to a CUBIN for the GPU's architecture.

An architecture NVRTC does not know (a GPU newer than the NVRTC installed) gets PTX for the newest
architecture below it that NVRTC knows; the driver compiles that PTX when the module is loaded.
Binaries are cached on disk by core (:class:`ember.device.compiler.Compiler`), keyed by the source,
the target, NVRTC's version, the options and the CUDA headers used.

Every NVRTC call has a fixed cost (~15 ms: it sets up a whole C++ front end), so the new kernels of
a schedule are built as one program (:class:`~ember.device.batch_compiler.BatchCompiler`). NVRTC
releases the GIL while it compiles, so several programs build at once on a machine with cores to
spare.
"""
from __future__ import annotations

import functools
import os
import pathlib
import re
from dataclasses import dataclass
from typing import Any

from ember.device import BatchCompiler, CompileError
from ember_cuda.renderer import parse_arch

#: what to install for NVRTC (pinned to the CUDA 13.0 toolchain: newer NVRTC writes PTX that ptxas 13.0 rejects)
NVRTC_HINT = 'pip install "ember[cuda]" (cuda-bindings and nvidia-cuda-nvrtc)'


def import_nvrtc() -> Any:
    """The ``cuda.bindings.nvrtc`` module; ``ImportError`` when cuda-python is not installed."""
    from cuda.bindings import nvrtc

    return nvrtc


def check(result: Any, what: str) -> Any:
    """The values of a cuda-python call's ``(status, *values)`` result; ``RuntimeError`` unless it succeeded."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise RuntimeError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor) version; ``RuntimeError`` when libnvrtc cannot be loaded."""
    nvrtc = import_nvrtc()
    try:
        major, minor = check(nvrtc.nvrtcVersion(), "nvrtcVersion")
        return int(major), int(minor)
    except RuntimeError:
        raise
    except Exception as e:  # cuda.pathfinder raises its own error when libnvrtc.so is missing
        raise RuntimeError(f"NVRTC cannot be loaded ({type(e).__name__}: {e}): {NVRTC_HINT}") from None


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The architectures NVRTC compiles for, as numbers (75, 80, 86, ...)."""
    nvrtc = import_nvrtc()
    return tuple(int(a) for a in check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
    """Folders holding ``cuda_fp16.h`` and ``cuda_bf16.h`` (NVRTC has no default include path).

    Looked up through ``cuda.pathfinder`` (the ``nvidia-cuda-runtime`` wheel the plugin depends on, or
    a CUDA toolkit), then ``CUDA_PATH``/``CUDA_HOME`` and ``/usr/local/cuda``. Empty when none has
    them: kernels without 16-bit floats still compile, the others fail naming the missing header.
    """
    found: list[str] = []
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        d = find_nvidia_header_directory("cudart")
        if d:
            found.append(str(d))
    except Exception:  # noqa: BLE001 - an old cuda-pathfinder, or nothing found: try the usual places
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            found.append(os.path.join(os.environ[env], "include"))
    found.append("/usr/local/cuda/include")
    return tuple(dict.fromkeys(d for d in found if (pathlib.Path(d) / "cuda_fp16.h").is_file()))


@dataclass(frozen=True)
class NVRTCOutput:
    """What one NVRTC compile produced: PTX text (NUL-terminated), a CUBIN when the target was real, the log."""

    ptx: bytes
    cubin: bytes | None
    log: str


def nvrtc_compile(src: str, target: str, options: tuple[str, ...] = (), name: str = "kernel.cu") -> NVRTCOutput:
    """Compile ``src`` for ``target`` (``"sm_80"`` gives PTX and a CUBIN, ``"compute_80"`` PTX only).

    Raises :class:`~ember.device.compiler.CompileError` with NVRTC's log when the source does not compile.
    """
    nvrtc = import_nvrtc()
    prog = check(nvrtc.nvrtcCreateProgram(src.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={target}", *options, *(f"-I{d}" for d in cuda_include_dirs())]
        status = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])[0]
        log = _program_log(nvrtc, prog)
        if int(status) != 0:
            if "could not open source file" in log and ("cuda_fp16.h" in log or "cuda_bf16.h" in log):
                log += ("\n(NVRTC found no CUDA headers for float16/bfloat16: "
                        'pip install "nvidia-cuda-runtime==13.0.*", or set CUDA_PATH to a CUDA toolkit)')
            raise CompileError(src, log or repr(status), f"NVRTC {'.'.join(map(str, nvrtc_version()))} "
                                                         f"could not compile for {target}")
        ptx = _read(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "PTX")
        cubin = _read(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, "CUBIN") \
            if target.startswith("sm_") else None
        return NVRTCOutput(ptx, cubin, log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _program_log(nvrtc: Any, prog: Any) -> str:
    size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = _out_buffer(size)
    check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\0").decode(errors="replace").strip()


def _read(nvrtc: Any, prog: Any, get_size: Any, get: Any, what: str) -> bytes:
    size = check(get_size(prog), f"nvrtcGet{what}Size")
    buf = _out_buffer(size)
    check(get(prog, buf), f"nvrtcGet{what}")
    return bytes(buf)


def _out_buffer(size: int) -> bytearray:
    """A fresh writable buffer for NVRTC to fill. Never ``bytes``: NVRTC writes into the memory it is given,
    and a 1-byte ``b" " * 1`` is the interpreter's shared ``b" "`` object (an empty log has size 1), so
    writing into it would turn every ``b" "`` of the process into ``b"\\0"``."""
    return bytearray(size)


def compile_target(arch: str) -> str:
    """What to ask NVRTC for on a GPU of ``arch``: ``sm_XY`` when NVRTC knows it, else PTX (``compute_XY``)
    for the newest architecture below it that NVRTC knows (the driver compiles that PTX at load time)."""
    major, minor = parse_arch(arch)
    number = major * 10 + minor
    known = supported_archs()
    if number in known:
        return f"sm_{number}{'a' if arch.endswith('a') else ''}"
    older = [a for a in known if a <= number]
    if not older:
        raise RuntimeError(f"NVRTC {'.'.join(map(str, nvrtc_version()))} cannot compile for {arch}: it knows "
                           f"{', '.join(f'sm_{a}' for a in known)}")
    return f"compute_{max(older)}"


class CUDACompiler(BatchCompiler):
    """Compiles CUDA C for one architecture; returns packed
    :class:`~ember.device.batch_compiler.KernelBinary` bytes holding a CUBIN (or PTX, see
    :func:`compile_target`) that ``cuModuleLoadData`` loads.

    Float math stays IEEE (no ``--use_fast_math``): division and sqrt are correctly rounded, as on
    every other ember device.
    """

    kernel_pattern = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')
    parallel_builds = max(1, min(4, os.cpu_count() or 1))
    options: tuple[str, ...] = ("--std=c++17",)

    def __init__(self, arch: str):
        self.arch = arch
        self.target = compile_target(arch)
        headers = ",".join(cuda_include_dirs())
        super().__init__("|".join(["nvrtc", ".".join(map(str, nvrtc_version())), self.target, " ".join(self.options),
                                   headers]))

    def build(self, src: str) -> bytes:
        """The CUBIN (or NUL-terminated PTX) for ``src``; ``CompileError`` with NVRTC's log on failure."""
        out = nvrtc_compile(src, self.target, self.options)
        return out.cubin if out.cubin is not None else out.ptx

    def __repr__(self) -> str:
        return f"<CUDACompiler {self.target}>"
