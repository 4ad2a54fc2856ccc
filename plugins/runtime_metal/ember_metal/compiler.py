"""Build MSL with the device's own compiler (``newLibraryWithSource:options:error:``).

The library is built at compile time so a bad kernel fails there with Metal's log, and the bytes
kept (in the compile cache, and handed to the runtime) are the checked source: Metal has no
documented in-process way to serialize a built library (a ``.metallib`` needs Xcode's ``metal``
tool), and its own shader cache makes the runtime's second build of the same source cheap.

Kernels of a schedule are built as one library (:class:`~ember.device.BatchCompiler`); the renderer
puts its helper functions under include guards so sources can be joined.
"""
from __future__ import annotations

import ctypes
import re
from typing import Any

from ember.device import BatchCompiler, CompileError
from ember_metal.objc import MATH_MODE_SAFE, ObjC, ObjCError, obj


def compile_options(objc: ObjC) -> int:
    """An owned ``MTLCompileOptions`` with IEEE-conformant math (fast math changes nan and inf results)."""
    options = objc.send(objc.send(objc.cls("MTLCompileOptions"), "alloc"), "init")
    if objc.send(options, "respondsToSelector:", ctypes.c_void_p(objc.selector("setMathMode:")),
                 restype=ctypes.c_bool):
        objc.send(options, "setMathMode:", ctypes.c_long(MATH_MODE_SAFE), restype=None)
    else:  # before macOS 15
        objc.send(options, "setFastMathEnabled:", ctypes.c_bool(False), restype=None)
    return options


def build_library(objc: ObjC, mtl_device: int, options: int, src: str) -> int:
    """An owned ``MTLLibrary`` built from ``src``; ``CompileError`` with Metal's log when it fails."""
    error = ctypes.c_void_p(None)
    library = objc.send(mtl_device, "newLibraryWithSource:options:error:", obj(objc.nsstring(src)), obj(options),
                        ctypes.byref(error))
    if not library:
        raise CompileError(src, objc.error_text(error.value) or "newLibraryWithSource returned nil",
                           "Metal library build failed")
    return library


class MetalCompiler(BatchCompiler):
    """Compiles MSL for one Metal device; returns packed :class:`~ember.device.KernelBinary` bytes whose
    program is the checked source (kernels of a schedule share one)."""

    kernel_pattern = re.compile(r"kernel\s+void\s+(\w+)\s*\(")

    def __init__(self, objc: ObjC, mtl_device: int, device_name: str, os_version: str):
        self.objc, self.mtl_device = objc, mtl_device
        self.options = compile_options(objc)
        # the source is what is stored, but a source that built on one GPU and system may not on another
        super().__init__(f"metal|{device_name}|{os_version}")

    def build(self, src: str) -> bytes:
        """``src`` as bytes, once Metal built it; ``CompileError`` with Metal's log otherwise."""
        with self.objc.pool():
            try:
                library = build_library(self.objc, self.mtl_device, self.options, src)
            except ObjCError as e:
                raise CompileError(src, str(e), "Metal library build failed") from None
            self.objc.release(library)
        return src.encode()

    def __del__(self) -> None:
        objc: Any = getattr(self, "objc", None)
        if objc is not None:
            objc.release(self.options)
