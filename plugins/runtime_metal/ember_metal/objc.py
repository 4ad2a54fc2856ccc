"""The thin layer between the METAL device and the Objective-C runtime.

Everything the device does with Metal is a message send (``objc_msgSend``) to an object, plus one C
function (``MTLCreateSystemDefaultDevice``). :class:`ObjC` is that interface; :class:`SystemObjC`
implements it with ``ctypes`` on the system's ``libobjc`` and ``Metal.framework``, and the tests
implement it with a recording fake, so the device's calls (selectors, argument order, buffer offsets,
encoder sequence) are checked on any system.

Why ``ctypes`` on ``libobjc`` rather than PyObjC's ``pyobjc-framework-Metal``: the plugin then needs
no platform-only dependency and installs the same everywhere (the renderer is checked on Linux CI);
the device sends about twenty documented messages, each typed here once; and a fake object layer is a
small class instead of a mock of PyObjC's bridged objects. The cost is that argument types are
declared by hand (each call passes ``ctypes`` values, whose types give the C signature).

Object references are plain integers (``id``), ``None`` for ``nil``. Objects made by ``new...`` /
``alloc`` are owned and must be sent ``release``; others are autoreleased (see :meth:`ObjC.pool`).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from typing import Any

#: MTLResourceStorageModeShared (0 << 4) | MTLResourceCPUCacheModeDefaultCache (0): memory the CPU and the
#: GPU both address (Apple silicon has one memory; copies are memmove)
STORAGE_MODE_SHARED = 0
#: MTLCommandBufferStatusError
COMMAND_BUFFER_ERROR = 5
#: MTLMathModeSafe (macOS 15): IEEE-conformant arithmetic; before macOS 15, fastMathEnabled = NO
MATH_MODE_SAFE = 0


#: MTLGPUFamily values: Apple4 and Mac2 have non-uniform threadgroup sizes (dispatchThreads), Apple7 and Mac2
#: have simdgroup_matrix
GPU_FAMILY_APPLE4, GPU_FAMILY_APPLE7, GPU_FAMILY_MAC2 = 1004, 1007, 2002


class ObjCError(RuntimeError):
    """A Metal call failed; the message carries Metal's own description."""


class MTLSize(ctypes.Structure):
    """``MTLSize``: three ``NSUInteger``s, passed by value."""

    _fields_ = [("width", ctypes.c_ulong), ("height", ctypes.c_ulong), ("depth", ctypes.c_ulong)]


def size3(sizes: tuple[int, ...]) -> MTLSize:
    """An ``MTLSize`` from one to three sizes (missing ones are 1)."""
    w, h, d = (tuple(int(s) for s in sizes) + (1, 1, 1))[:3]
    return MTLSize(w, h, d)


def obj(ref: int | None) -> ctypes.c_void_p:
    """An object argument."""
    return ctypes.c_void_p(ref)


def uint(value: int) -> ctypes.c_ulong:
    """An ``NSUInteger`` argument."""
    return ctypes.c_ulong(value)


_BYREF = type(ctypes.byref(ctypes.c_int()))


def arg_type(arg: Any) -> Any:
    """The C type of a message argument: its ctypes type, or a pointer type for ``ctypes.byref(x)``."""
    if isinstance(arg, _BYREF):
        return ctypes.POINTER(type(arg._obj))  # type: ignore[attr-defined]
    return type(arg)


def msgsend_prototype(restype: Any, args: tuple[Any, ...]) -> Any:
    """The C prototype ``objc_msgSend`` is called through for a message with these arguments.

    objc_msgSend has no type of its own: arm64 and x86-64 pass the arguments exactly as for a C function of
    the receiver, the selector and the message's arguments (no message here returns a struct).
    """
    return ctypes.CFUNCTYPE(restype, ctypes.c_void_p, ctypes.c_void_p, *(arg_type(a) for a in args))


class ObjC:
    """The Objective-C calls the METAL device makes. Subclasses implement :meth:`send`, :meth:`cls`,
    :meth:`selector` and :meth:`default_device`; the rest is built on them."""

    def send(self, receiver: int | None, selector: str, *args: Any, restype: Any = ctypes.c_void_p) -> Any:
        """Send ``selector`` with the ``ctypes`` values ``args``; the result is converted per ``restype``
        (``c_void_p``: an object or ``None``; ``None``: no result)."""
        raise NotImplementedError

    def cls(self, name: str) -> int:
        """The class object called ``name``."""
        raise NotImplementedError

    def selector(self, name: str) -> int:
        """The selector (``SEL``) called ``name``, as an argument of ``respondsToSelector:``."""
        raise NotImplementedError

    def default_device(self) -> int | None:
        """``MTLCreateSystemDefaultDevice()``: the system's default GPU, or ``None``."""
        raise NotImplementedError

    # --- built on the primitives ------------------------------------------------------------------
    def nsstring(self, text: str) -> int:
        """An autoreleased ``NSString`` holding ``text``."""
        return self.send(self.cls("NSString"), "stringWithUTF8String:", ctypes.c_char_p(text.encode()))

    def string(self, nsstring: int | None) -> str:
        """The text of an ``NSString`` (``""`` for nil)."""
        if not nsstring:
            return ""
        raw = self.send(nsstring, "UTF8String", restype=ctypes.c_char_p)
        return raw.decode(errors="replace") if raw else ""

    def error_text(self, error: int | None) -> str:
        """``[error localizedDescription]`` of an ``NSError`` (``""`` for nil)."""
        return self.string(self.send(error, "localizedDescription")) if error else ""

    def supports_family(self, mtl_device: int, family: int) -> bool:
        """``[device supportsFamily:family]``."""
        return bool(self.send(mtl_device, "supportsFamily:", ctypes.c_long(family), restype=ctypes.c_bool))

    def unusable_gpu(self, mtl_device: int) -> str | None:
        """Why ember cannot use this GPU (it launches exact grids with ``dispatchThreads``), or None."""
        if self.supports_family(mtl_device, GPU_FAMILY_APPLE4) or self.supports_family(mtl_device, GPU_FAMILY_MAC2):
            return None
        return "the GPU has no non-uniform threadgroup sizes (needs MTLGPUFamilyApple4 or MTLGPUFamilyMac2)"

    def release(self, ref: int | None) -> None:
        """Give up an owned reference."""
        if ref:
            self.send(ref, "release", restype=None)

    def retain(self, ref: int) -> int:
        """Keep an autoreleased object beyond its pool."""
        self.send(ref, "retain")
        return ref

    @contextlib.contextmanager
    def pool(self) -> Iterator[None]:
        """An ``NSAutoreleasePool`` around a block of calls: the block's autoreleased objects (command
        buffers, encoders, strings) are freed at its end, since no run loop drains them here."""
        pool = self.send(self.send(self.cls("NSAutoreleasePool"), "alloc"), "init")
        try:
            yield
        finally:
            self.send(pool, "drain", restype=None)


class SystemObjC(ObjC):
    """:class:`ObjC` on the system's ``libobjc`` and ``Metal.framework`` (macOS only)."""

    def __init__(self) -> None:
        objc_path = ctypes.util.find_library("objc")
        metal_path = ctypes.util.find_library("Metal")
        if objc_path is None or metal_path is None:
            raise ObjCError(f"libobjc ({objc_path or 'not found'}) or Metal.framework ({metal_path or 'not found'}) "
                            "is missing")
        self.libobjc = ctypes.CDLL(objc_path)
        self.metal = ctypes.CDLL(metal_path)
        foundation_path = ctypes.util.find_library("Foundation")  # NSString, NSAutoreleasePool (Metal links it too)
        if foundation_path is not None:
            self.foundation = ctypes.CDLL(foundation_path)
        self.libobjc.objc_getClass.restype = ctypes.c_void_p
        self.libobjc.objc_getClass.argtypes = [ctypes.c_char_p]
        self.libobjc.sel_registerName.restype = ctypes.c_void_p
        self.libobjc.sel_registerName.argtypes = [ctypes.c_char_p]
        self.metal.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
        self.metal.MTLCreateSystemDefaultDevice.argtypes = []
        msgsend = ctypes.cast(self.libobjc.objc_msgSend, ctypes.c_void_p).value
        if not msgsend:
            raise ObjCError("libobjc has no objc_msgSend")
        self._msgsend: int = msgsend
        self._selectors: dict[str, int] = {}
        self._functions: dict[tuple[Any, ...], Any] = {}

    def cls(self, name: str) -> int:
        ref = self.libobjc.objc_getClass(name.encode())
        if not ref:
            raise ObjCError(f"no Objective-C class {name}")
        return ref

    def default_device(self) -> int | None:
        return self.metal.MTLCreateSystemDefaultDevice() or None

    def selector(self, name: str) -> int:
        sel = self._selectors.get(name)
        if sel is None:
            sel = self._selectors[name] = self.libobjc.sel_registerName(name.encode())
        return sel

    def send(self, receiver: int | None, selector: str, *args: Any, restype: Any = ctypes.c_void_p) -> Any:
        sel = self.selector(selector)
        signature = (restype, *(arg_type(a) for a in args))
        fn = self._functions.get(signature)
        if fn is None:
            fn = self._functions[signature] = msgsend_prototype(restype, args)(self._msgsend)
        return fn(receiver, sel, *args)


@functools.cache
def system_objc() -> SystemObjC:
    """The process's one :class:`SystemObjC` (loading the frameworks once)."""
    return SystemObjC()
