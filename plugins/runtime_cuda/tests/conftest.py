"""Fixtures for the CUDA plugin tests.

Rendering and compiling (NVRTC) run on any machine with cuda-python and NVRTC installed; tests that
launch kernels need an NVIDIA GPU and skip with "no CUDA device: <the probe's reason>" without one.
"""
from __future__ import annotations

import pytest

try:
    from cuda.bindings import nvrtc  # noqa: F401
    NVRTC_ERROR: str | None = None
except ImportError as e:
    NVRTC_ERROR = f"{type(e).__name__}: {e}"


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Keep the compile cache of these tests out of the user's cache folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("ember-cache")))
        yield


@pytest.fixture
def nvrtc_available() -> None:
    """Skip unless cuda-python and NVRTC are installed (they come with the plugin)."""
    if NVRTC_ERROR is not None:
        pytest.skip(f'cuda-python is not installed ({NVRTC_ERROR}): pip install "ember[cuda]"')


@pytest.fixture(scope="session")
def cuda_device():
    """The ``CUDA`` device object; skips with the probe's reason on a machine without a usable GPU."""
    from ember_cuda.plugin import probe

    reason = probe()
    if reason is not None:
        pytest.skip(f"no CUDA device: {reason}")
    from ember.device import Device

    return Device["CUDA"]
