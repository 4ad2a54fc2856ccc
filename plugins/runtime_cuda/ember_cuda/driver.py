"""The CUDA driver API through cuda-python (``cuda.bindings.driver``): loading it, checking results,
and finding GPUs.

``CUDA`` is the first GPU the driver lists, ``CUDA:1`` the second and so on. Every failure to get
that far has its own reason (:func:`driver_problem`), which the probe reports and the device raises.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

#: the pip extra that installs cuda-python and NVRTC
INSTALL_HINT = 'pip install "ember[cuda]"'
#: the driver library cuda-python loads
LIBCUDA = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


class CUDAError(RuntimeError):
    """A CUDA driver call failed; ``status`` is the ``CUresult``."""

    def __init__(self, what: str, status: Any):
        self.status = status
        name = getattr(status, "name", str(status))
        super().__init__(f"{what} failed: {name} ({int(status)}){_error_string(status)}")


def _error_string(status: Any) -> str:
    """The driver's own description of ``status`` (``": out of memory"``), or ``""``."""
    try:
        err, text = import_driver().cuGetErrorString(status)
        return f": {text.decode()}" if int(err) == 0 and text else ""
    except Exception:  # noqa: BLE001 - only decoration for an error message
        return ""


def import_driver() -> Any:
    """The ``cuda.bindings.driver`` module; ``ImportError`` when cuda-python is not installed."""
    from cuda.bindings import driver

    return driver


def check(result: Any, what: str) -> Any:
    """The values of a driver call's ``(CUresult, *values)`` result; :class:`CUDAError` unless it succeeded."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise CUDAError(what, status)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def init_driver() -> Any:
    """``cuInit(0)`` once per process; the driver module. Raises ``RuntimeError`` with the reason when no
    driver or GPU can be used (see :func:`driver_problem`)."""
    problem = driver_problem()
    if problem is not None:
        raise RuntimeError(problem)
    return import_driver()


def cuda_python_missing() -> str | None:
    """Why cuda-python cannot be imported, found without importing it (that costs 20-50 ms), or ``None``."""
    try:
        found = importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError) as e:
        return str(e)
    return None if found else "No module named 'cuda.bindings'"


def libcuda_problem() -> str | None:
    """Why the driver library cannot be loaded (a ~2 ms ``dlopen``), or ``None``."""
    try:
        ctypes.CDLL(LIBCUDA)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


#: glibc's loader cache (``ldconfig``), and where the loader looks for a library not in it (besides LD_LIBRARY_PATH)
LD_CACHE = "/etc/ld.so.cache"
LOADER_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


def libcuda_absent() -> str | None:
    """Why the dynamic loader certainly cannot find the driver library, read from its cache and search path
    without loading anything; ``None`` when it may be there, or where only ``dlopen`` can tell (no
    ``/etc/ld.so.cache``: not glibc Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(LD_CACHE, "rb") as f:
            if LIBCUDA.encode() in f.read():
                return None
    except OSError:
        return None
    # an interpreter's own library folder (conda, a relocated Python) can be on its run path
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [*LOADER_DIRS, os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")]
    if any(os.path.exists(os.path.join(d, LIBCUDA)) for d in dirs) or LIBCUDA in os.environ.get("LD_PRELOAD", ""):
        return None
    return f"{LIBCUDA} is not in the dynamic loader's cache, LD_LIBRARY_PATH or {', '.join(LOADER_DIRS)}"


def no_driver_problem() -> str | None:
    """:func:`driver_problem`'s answer on a machine without the driver library, found without loading native
    code (the device's precheck), or ``None`` when the library may be there."""
    if (absent := libcuda_absent()) is None:
        return None
    missing = cuda_python_missing()
    return _no_driver(absent) if missing is None else f"cuda-python is not installed ({missing}): {INSTALL_HINT}"


def _no_driver(why: str) -> str:
    return (f"no NVIDIA driver: {LIBCUDA} cannot be loaded ({why}); install the NVIDIA display driver on a machine "
            f"with an NVIDIA GPU")


@functools.cache
def driver_problem() -> str | None:
    """``None`` when the CUDA driver initializes and sees a GPU, else why not (with what to install).

    A machine without the driver is told so before cuda-python is imported (the import costs more than
    every other check together): each device probe runs in every process that picks a default device."""
    if (no_driver := libcuda_problem()) is not None:
        missing = cuda_python_missing()
        return _no_driver(no_driver) if missing is None else f"cuda-python is not installed ({missing}): {INSTALL_HINT}"
    try:
        driver = import_driver()
    except ImportError as e:
        return f"cuda-python is not installed ({e}): {INSTALL_HINT}"
    try:
        status = driver.cuInit(0)[0]
    except Exception as e:  # noqa: BLE001 - cuda-python raises (not returns) when it cannot load the driver
        return _no_driver(f"{type(e).__name__}: {e}")
    name = getattr(status, "name", str(status))
    if name == "CUDA_ERROR_NO_DEVICE":
        return "no CUDA GPU found (cuInit: CUDA_ERROR_NO_DEVICE; check CUDA_VISIBLE_DEVICES)"
    if name in ("CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"):
        return f"the NVIDIA driver is too old for this cuda-python (cuInit: {name}); update the driver"
    if int(status) != 0:
        return f"the CUDA driver failed to initialize (cuInit: {name} {int(status)})"
    count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if count == 0:
        return "no CUDA GPU found (the driver lists none; check CUDA_VISIBLE_DEVICES)"
    return toolkit_problem(driver)


def toolkit_problem(driver: Any) -> str | None:
    """Why NVRTC cannot build for this driver, or ``None``: the driver must support NVRTC's CUDA version."""
    from ember_cuda.compiler import nvrtc_version

    try:
        nvrtc = nvrtc_version()
    except ImportError as e:
        return f"NVRTC is not installed ({e}): {INSTALL_HINT}"
    except RuntimeError as e:
        return str(e)
    version = check(driver.cuDriverGetVersion(), "cuDriverGetVersion")  # 13000 for CUDA 13.0
    supported = (version // 1000, version % 1000 // 10)
    if supported < nvrtc:
        return (f"the NVIDIA driver supports CUDA {supported[0]}.{supported[1]}, older than NVRTC "
                f"{nvrtc[0]}.{nvrtc[1]} (its binaries would not load): update the driver, or install an "
                f"NVRTC of CUDA {supported[0]}.x")
    return None


@dataclass(frozen=True)
class GPUInfo:
    """One GPU: its index N in ``CUDA:N``, driver handle, name and the attributes ember uses."""

    index: int
    handle: Any  # CUdevice
    name: str
    compute_capability: tuple[int, int]
    shared_max: int
    max_threads_per_block: int
    max_block_dims: tuple[int, int, int]
    max_grid_dims: tuple[int, int, int]
    warp_size: int
    total_memory: int

    @property
    def arch(self) -> str:
        """``"sm_90"``."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


def device_index(name: str) -> int:
    """The N of a device name: ``"CUDA"`` -> 0, ``"CUDA:2"`` -> 2."""
    _, sep, rest = name.partition(":")
    if not sep:
        return 0
    if not rest.isdigit():
        raise ValueError(f"invalid CUDA device name {name!r}: expected CUDA or CUDA:N with N a number")
    return int(rest)


def device_name(index: int) -> str:
    """The ember name of the ``index``-th GPU."""
    return "CUDA" if index == 0 else f"CUDA:{index}"


@functools.cache
def gpu_info(index: int) -> GPUInfo:
    """The attributes of GPU ``index``; ``RuntimeError`` naming the GPUs there are when it does not exist."""
    driver = init_driver()
    count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if index >= count:
        listing = ", ".join(f"{device_name(i)} = {gpu_info(i).name}" for i in range(count))
        raise RuntimeError(f"there is no CUDA device {device_name(index)}: {count} found ({listing})")
    dev = check(driver.cuDeviceGet(index), "cuDeviceGet")
    attr = driver.CUdevice_attribute

    def get(name: str) -> int:
        return int(check(driver.cuDeviceGetAttribute(getattr(attr, f"CU_DEVICE_ATTRIBUTE_{name}"), dev),
                         f"cuDeviceGetAttribute({name})"))

    raw_name = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return GPUInfo(
        index=index, handle=dev, name=raw_name.split(b"\0")[0].decode(errors="replace").strip(),
        compute_capability=(get("COMPUTE_CAPABILITY_MAJOR"), get("COMPUTE_CAPABILITY_MINOR")),
        shared_max=get("MAX_SHARED_MEMORY_PER_BLOCK"), max_threads_per_block=get("MAX_THREADS_PER_BLOCK"),
        max_block_dims=(get("MAX_BLOCK_DIM_X"), get("MAX_BLOCK_DIM_Y"), get("MAX_BLOCK_DIM_Z")),
        max_grid_dims=(get("MAX_GRID_DIM_X"), get("MAX_GRID_DIM_Y"), get("MAX_GRID_DIM_Z")),
        warp_size=get("WARP_SIZE"), total_memory=int(check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")))


def gpu_count() -> int:
    """How many GPUs the driver lists (0 when the driver cannot be used)."""
    if driver_problem() is not None:
        return 0
    return int(check(import_driver().cuDeviceGetCount(), "cuDeviceGetCount"))
