"""Fixtures for the CL plugin tests: skip (with the reason) when pyopencl or an OpenCL platform is missing."""
from __future__ import annotations

import pytest

try:
    import pyopencl  # noqa: F401
    PYOPENCL_ERROR: str | None = None
except ImportError as e:  # not installed, or installed without a loadable OpenCL library
    PYOPENCL_ERROR = f"{type(e).__name__}: {e}"


@pytest.fixture(autouse=True)
def _needs_pyopencl() -> None:
    """Every test here needs pyopencl itself (even those that hide the OpenCL platforms)."""
    if PYOPENCL_ERROR is not None:
        pytest.skip(f"pyopencl cannot be imported ({PYOPENCL_ERROR}): pip install pyopencl pocl-binary-distribution")


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Keep the compile cache of these tests out of the user's cache folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("ember-cache")))
        yield


@pytest.fixture(scope="session")
def cl_available() -> None:
    """Skip unless at least one OpenCL device is visible."""
    from ember_opencl.plugin import probe

    reason = probe()
    if reason is not None:
        pytest.skip(f"CL is not usable here: {reason}")


@pytest.fixture(scope="session")
def dev(cl_available: None):
    """The ``CL`` device object."""
    from ember.device import Device

    return Device["CL"]
