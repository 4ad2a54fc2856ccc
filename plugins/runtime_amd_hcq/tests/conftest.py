"""Fixtures for the AMD plugin tests.

Rendering, compiling (clang) and reading code objects run on any machine with a clang that knows
the gfx target (``apt install clang-19 lld-19``); tests that need one skip with the toolchain's
reason. Disassembly checks need an ``llvm-objdump`` that knows the target, and the host-side checks
of the kernel text (built for the CPU) need pyopencl with an OpenCL CPU platform (PoCL).
"""
from __future__ import annotations

import functools

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Keep the compile cache of these tests out of the user's cache folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("ember-cache")))
        yield


@functools.cache
def _opencl_cpu() -> tuple[object | None, str]:
    try:
        import pyopencl as cl
    except ImportError as e:
        return None, f"pyopencl is not installed ({e})"
    try:
        for platform in cl.get_platforms():
            devices = platform.get_devices(device_type=cl.device_type.CPU)
            if devices:
                return cl.Context(devices[:1]), ""
    except Exception as e:  # noqa: BLE001 - no ICD loader or no platform: the reason is the skip message
        return None, f"no OpenCL platform ({type(e).__name__}: {e})"
    return None, "no OpenCL CPU device (apt install pocl-opencl-icd)"


@pytest.fixture(scope="session")
def cl_cpu_context():
    """A pyopencl context on a CPU device (PoCL); skips with the reason when there is none."""
    ctx, reason = _opencl_cpu()
    if ctx is None:
        pytest.skip(reason)
    return ctx
