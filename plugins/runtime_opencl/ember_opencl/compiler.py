"""Build OpenCL C with the device's driver (``clBuildProgram``) and keep the program binary.

The binary is what the compile cache stores and what :class:`~ember_opencl.runtime.CLProgram`
loads, so a second process skips the source build. A binary only fits the driver that made
it, so the cache key names the platform, the device and the driver version.

Every build has a large fixed cost (PoCL parses its whole built-in header, ~18 000 lines, for each
program: 100-200 ms whether the program holds one kernel or ten). :meth:`CLCompiler.compile_batch`
therefore builds the new kernels of a schedule as one program (see :mod:`ember.device.batch_compiler`;
the renderer puts its helper functions under include guards so sources can be joined).
"""
from __future__ import annotations

import re
import warnings
from typing import Any

from ember.device import BatchCompiler, CompileError
from ember_opencl.platforms import import_pyopencl


def build_options(device: Any) -> tuple[str, ...]:
    """Options for ``clBuildProgram`` on ``device``: no warnings, and IEEE-exact float32 division and sqrt where
    offered.

    ``-w`` because some drivers (PoCL) print their compiler's warning count straight to the process's stderr
    ("1 warning generated.") for harmless constructs in generated code, such as an integer compared with
    itself; a failed build still raises with the driver's full log."""
    cl = import_pyopencl()
    options: list[str] = ["-w"]
    if device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
        options.append("-cl-fp32-correctly-rounded-divide-sqrt")
    return tuple(options)


class CLCompiler(BatchCompiler):
    """Compiles OpenCL C source for one device; returns packed
    :class:`~ember.device.batch_compiler.KernelBinary` bytes (kernels of a schedule share a program).

    Builds run in a context holding only that device: a program's binary list then has exactly
    one entry, whatever a driver reports for the other devices of a shared context. The binary
    loads into any context that contains the device.
    """

    kernel_pattern = re.compile(r"__kernel\s+void\s+(\w+)\s*\(")

    def __init__(self, device: Any):
        self.cl = import_pyopencl()
        self.cl_device = device
        self.context = self.cl.Context([device])
        self.options = build_options(device)
        platform = device.platform
        super().__init__("|".join(["opencl", platform.name.strip(), platform.version.strip(),
                                   device.name.strip(), device.version.strip(), device.driver_version.strip(),
                                   " ".join(self.options)]))

    def build(self, src: str) -> bytes:
        """The driver's binary for ``src``; ``CompileError`` with the build log on failure."""
        cl = self.cl
        program = cl.Program(self.context, src)
        try:
            with warnings.catch_warnings():
                # a non-empty build log on success is only a warning (e.g. PoCL's notes); failures raise below
                warnings.simplefilter("ignore", cl.CompilerWarning)
                program.build(options=list(self.options), devices=[self.cl_device], cache_dir=False)
        except cl.Error as e:
            raise CompileError(src, self._build_log(program, e),
                               f"OpenCL build failed on {self.cl_device.name.strip()}") from None
        return bytes(program.binaries[0])

    def _build_log(self, program: Any, error: Exception) -> str:
        """The driver's build log for this device, or the error text when the log cannot be read."""
        try:
            log = program.get_build_info(self.cl_device, self.cl.program_build_info.LOG)
        except Exception:  # noqa: BLE001 - the program object may not exist after a failed build
            log = ""
        return log.strip() or str(error)
