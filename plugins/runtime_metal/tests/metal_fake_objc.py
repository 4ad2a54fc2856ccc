"""A recording stand-in for the Objective-C runtime and Metal, for testing the METAL device without a Mac.

:class:`FakeObjC` implements :class:`ember_metal.objc.ObjC`: it answers the messages the device sends
with fake objects, logs every call with its decoded arguments, and enforces the rules of the real
API that a wrong call sequence would break (an encoder is used only before ``endEncoding``, a command
buffer is committed once after its encoder ended, a buffer offset lies inside the buffer, an object
is not used after its last ``release``). Buffers are real host memory, so copies can be checked.
It runs no kernel, unless ``run_kernels=True``: then a dispatch runs the kernel's MSL on the host CPU
(metal_host_run), which checks ember's side of a launch end to end but still says nothing about Metal.
"""
from __future__ import annotations

import ctypes
import pathlib
import re
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ember_metal.objc import ObjC, msgsend_prototype
from metal_host_run import build_host_library, run_host_kernel


class FakeMetalError(AssertionError):
    """The device broke a rule the real Metal API has."""


@dataclass
class FakeObject:
    kind: str
    refs: int = 1
    data: dict[str, Any] = field(default_factory=dict)


def _value(arg: Any) -> Any:
    """A logged, comparable form of one ctypes argument."""
    if hasattr(arg, "_obj"):  # byref(...)
        return "out-pointer"
    if isinstance(arg, ctypes.Structure):
        return tuple(getattr(arg, name) for name, _ in arg._fields_)
    if isinstance(arg, ctypes.c_char_p):
        return arg.value.decode() if arg.value is not None else None
    return arg.value if hasattr(arg, "value") else arg


class FakeObjC(ObjC):
    """The fake runtime. ``has_device=False`` makes ``MTLCreateSystemDefaultDevice`` return nil; the GPU
    supports the MTLGPUFamily values in ``families``;
    ``math_mode=False`` answers ``respondsToSelector:setMathMode:`` with NO (a system before macOS 15);
    a source containing ``compile_error_marker`` fails to build; ``fail_command_buffers`` makes every
    command buffer end in the error status."""

    def __init__(self, has_device: bool = True, math_mode: bool = True, compile_error_marker: str = "#error",
                 fail_command_buffers: bool = False, families: tuple[int, ...] = (1004, 1007, 2002),
                 run_kernels: bool = False):
        self.objects: dict[int, FakeObject] = {}
        self.log: list[tuple[str, str, tuple[Any, ...]]] = []
        self.has_device, self.math_mode = has_device, math_mode
        self.compile_error_marker = compile_error_marker
        self.fail_command_buffers = fail_command_buffers
        self.families = families
        self.run_kernels = run_kernels
        self._host_libraries: dict[str, Any] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._next = 0x1000
        self._classes: dict[str, int] = {}
        self._device: int | None = None

    # --- bookkeeping ----------------------------------------------------------------------------
    def new(self, kind: str, **data: Any) -> int:
        ref = self._next
        self._next += 0x10
        self.objects[ref] = FakeObject(kind, 1, dict(data))
        return ref

    def get(self, ref: int | None, selector: str) -> FakeObject:
        if not ref or ref not in self.objects:
            raise FakeMetalError(f"{selector} sent to an unknown object {ref!r}")
        o = self.objects[ref]
        if o.refs <= 0:
            raise FakeMetalError(f"{selector} sent to a released {o.kind}")
        return o

    def calls(self, kind: str | None = None) -> list[tuple[str, str, tuple[Any, ...]]]:
        """The log, optionally only the messages sent to objects of ``kind``."""
        return [c for c in self.log if kind is None or c[0] == kind]

    def live(self, kind: str) -> list[FakeObject]:
        """Objects of ``kind`` still referenced."""
        return [o for o in self.objects.values() if o.kind == kind and o.refs > 0]

    # --- ObjC -------------------------------------------------------------------------------------
    def cls(self, name: str) -> int:
        if name not in self._classes:
            self._classes[name] = self.new(f"class {name}")
            self.objects[self._classes[name]].refs = 1 << 30
        return self._classes[name]

    def selector(self, name: str) -> int:
        return hash(name) & 0xFFFFFFFF

    def default_device(self) -> int | None:
        if not self.has_device:
            return None
        if self._device is None:
            self._device = self.new("MTLDevice")
        return self._device

    def send(self, receiver: int | None, selector: str, *args: Any, restype: Any = ctypes.c_void_p) -> Any:
        # the system layer would build this C prototype for the call: it must exist for every call made
        msgsend_prototype(restype, args)
        o = self.get(receiver, selector)
        self.log.append((o.kind, selector, tuple(_value(a) for a in args)))
        handler = getattr(self, "_" + re.sub(r"\W", "_", selector).rstrip("_"), None)
        if handler is None:
            raise FakeMetalError(f"the fake does not know {o.kind} {selector}")
        return handler(receiver, o, *args)

    # --- NSObject / Foundation ----------------------------------------------------------------------
    def _alloc(self, ref: int, o: FakeObject) -> int:
        return self.new(o.kind.removeprefix("class "))

    def _init(self, ref: int, o: FakeObject) -> int:
        return ref

    def _retain(self, ref: int, o: FakeObject) -> int:
        o.refs += 1
        return ref

    def _release(self, ref: int, o: FakeObject) -> None:
        o.refs -= 1

    def _drain(self, ref: int, o: FakeObject) -> None:
        # objects autoreleased into this pool lose the pool's reference
        for obj in self.objects.values():
            if obj.data.get("autoreleased_into") == ref:
                obj.refs -= 1
                obj.data["autoreleased_into"] = None
        o.refs -= 1

    def _autoreleased(self, kind: str, **data: Any) -> int:
        pools = [r for r, x in self.objects.items() if x.kind == "NSAutoreleasePool" and x.refs > 0]
        if not pools:
            raise FakeMetalError(f"a {kind} was autoreleased with no pool in place (it would leak)")
        return self.new(kind, autoreleased_into=pools[-1], **data)

    def _stringWithUTF8String(self, ref: int, o: FakeObject, text: ctypes.c_char_p) -> int:
        return self._autoreleased("NSString", text=text.value)

    def _UTF8String(self, ref: int, o: FakeObject) -> bytes:
        return o.data["text"]

    def _localizedDescription(self, ref: int, o: FakeObject) -> int:
        return self._autoreleased("NSString", text=o.data["text"])

    def _respondsToSelector(self, ref: int, o: FakeObject, sel: ctypes.c_void_p) -> bool:
        return self.math_mode and sel.value == self.selector("setMathMode:")

    # --- MTLDevice -----------------------------------------------------------------------------------
    def _name(self, ref: int, o: FakeObject) -> int:
        return self._autoreleased("NSString", text=b"Fake Apple GPU")

    def _supportsFamily(self, ref: int, o: FakeObject, family: ctypes.c_long) -> bool:
        return family.value in self.families

    def _maxBufferLength(self, ref: int, o: FakeObject) -> int:
        return 1 << 30

    def _maxThreadgroupMemoryLength(self, ref: int, o: FakeObject) -> int:
        return 32768

    def _newCommandQueue(self, ref: int, o: FakeObject) -> int:
        return self.new("MTLCommandQueue")

    def _setMathMode(self, ref: int, o: FakeObject, mode: ctypes.c_long) -> None:
        o.data["math_mode"] = mode.value

    def _setFastMathEnabled(self, ref: int, o: FakeObject, enabled: ctypes.c_bool) -> None:
        o.data["fast_math"] = enabled.value

    def _newLibraryWithSource_options_error(self, ref: int, o: FakeObject, src: ctypes.c_void_p,
                                            options: ctypes.c_void_p, error: Any) -> int | None:
        text = self.get(src.value, "newLibraryWithSource:").data["text"].decode()
        self.get(options.value, "newLibraryWithSource:")
        if self.compile_error_marker in text:
            error._obj.value = self._autoreleased("NSError", text=b"program_source:3:1: error: fake failure")
            return None
        return self.new("MTLLibrary", source=text)

    def _newFunctionWithName(self, ref: int, o: FakeObject, name: ctypes.c_void_p) -> int | None:
        fname = self.get(name.value, "newFunctionWithName:").data["text"].decode()
        # a joined batch renames kernels with #define NAME SYMBOL
        defined = set(re.findall(r"kernel\s+void\s+(\w+)\s*\(", o.data["source"]))
        renamed = {sym for name_, sym in re.findall(r"#define (\w+) (\w+)", o.data["source"]) if name_ in defined}
        if fname not in (renamed or defined):
            return None
        return self.new("MTLFunction", name=fname, source=o.data["source"])

    def _newComputePipelineStateWithFunction_error(self, ref: int, o: FakeObject, function: ctypes.c_void_p,
                                                   error: Any) -> int:
        fn = self.get(function.value, "newComputePipelineStateWithFunction:")
        return self.new("MTLComputePipelineState", function=fn.data["name"], source=fn.data["source"])

    def _maxTotalThreadsPerThreadgroup(self, ref: int, o: FakeObject) -> int:
        return 1024

    def _newBufferWithLength_options(self, ref: int, o: FakeObject, length: ctypes.c_ulong,
                                     options: ctypes.c_ulong) -> int:
        memory = ctypes.create_string_buffer(length.value)
        return self.new("MTLBuffer", memory=memory, length=length.value, options=options.value)

    def _contents(self, ref: int, o: FakeObject) -> int:
        return ctypes.addressof(o.data["memory"])

    # --- command buffers and encoders ---------------------------------------------------------------------
    def _commandBuffer(self, ref: int, o: FakeObject) -> int:
        return self._autoreleased("MTLCommandBuffer", state="open", encoders=[])

    def _computeCommandEncoder(self, ref: int, o: FakeObject) -> int:
        if o.data["state"] != "open":
            raise FakeMetalError("computeCommandEncoder on a committed command buffer")
        enc = self._autoreleased("MTLComputeCommandEncoder", ended=False, pipeline=None, bound={}, command_buffer=ref)
        o.data["encoders"].append(enc)
        return enc

    def _encoder(self, o: FakeObject, selector: str) -> None:
        if o.data["ended"]:
            raise FakeMetalError(f"{selector} after endEncoding")

    def _setComputePipelineState(self, ref: int, o: FakeObject, pipeline: ctypes.c_void_p) -> None:
        self._encoder(o, "setComputePipelineState:")
        o.data["pipeline"] = self.get(pipeline.value, "setComputePipelineState:").data["function"]
        o.data["pipeline_ref"] = pipeline.value

    def _setBuffer_offset_atIndex(self, ref: int, o: FakeObject, buf: ctypes.c_void_p, offset: ctypes.c_ulong,
                                  index: ctypes.c_ulong) -> None:
        self._encoder(o, "setBuffer:offset:atIndex:")
        b = self.get(buf.value, "setBuffer:")
        if offset.value >= max(b.data["length"], 1):
            raise FakeMetalError(f"setBuffer offset {offset.value} outside a buffer of {b.data['length']} bytes")
        if index.value > 30:
            raise FakeMetalError(f"buffer index {index.value} > 30")
        o.data["bound"][index.value] = (buf.value, offset.value)

    def _setBytes_length_atIndex(self, ref: int, o: FakeObject, ptr: ctypes.c_void_p, length: ctypes.c_ulong,
                                 index: ctypes.c_ulong) -> None:
        self._encoder(o, "setBytes:length:atIndex:")
        if length.value > 4096:
            raise FakeMetalError("setBytes is for at most 4 KB")
        o.data["bound"][index.value] = ("bytes", ctypes.string_at(ptr.value, length.value))

    def _dispatchThreads_threadsPerThreadgroup(self, ref: int, o: FakeObject, grid: Any, group: Any) -> None:
        self._encoder(o, "dispatchThreads:")
        if o.data["pipeline"] is None:
            raise FakeMetalError("dispatch before setComputePipelineState:")
        if group.width * group.height * group.depth > 1024:
            raise FakeMetalError("threadgroup larger than maxTotalThreadsPerThreadgroup")
        o.data.setdefault("dispatches", []).append(
            (o.data["pipeline"], dict(o.data["bound"]), _value(grid), _value(group)))
        if self.run_kernels:
            self._run_on_host(o, _value(grid), _value(group))

    def _endEncoding(self, ref: int, o: FakeObject) -> None:
        self._encoder(o, "endEncoding")
        o.data["ended"] = True

    def _commit(self, ref: int, o: FakeObject) -> None:
        if o.data["state"] != "open":
            raise FakeMetalError("commit of a command buffer twice")
        if not all(self.objects[e].data["ended"] for e in o.data["encoders"]):
            raise FakeMetalError("commit before endEncoding")
        o.data["state"] = "committed"

    def _waitUntilCompleted(self, ref: int, o: FakeObject) -> None:
        if o.data["state"] == "open":
            raise FakeMetalError("waitUntilCompleted on an uncommitted command buffer (it would never return)")
        o.data["state"] = "completed"

    def _status(self, ref: int, o: FakeObject) -> int:
        return 5 if self.fail_command_buffers else 4  # MTLCommandBufferStatusError / Completed

    def _error(self, ref: int, o: FakeObject) -> int:
        return self._autoreleased("NSError", text=b"Internal Error (0000000e:Internal Error)")

    def _GPUStartTime(self, ref: int, o: FakeObject) -> float:
        return 100.0

    def _GPUEndTime(self, ref: int, o: FakeObject) -> float:
        return 100.25

    def _run_on_host(self, encoder: FakeObject, grid: tuple[int, ...], group: tuple[int, ...]) -> None:
        """Run the dispatched kernel now, on the host CPU (see metal_host_run), on the bound buffers' memory.

        Running at encoding time instead of after commit gives the same results: one in-order queue, and
        every copy waits for the committed work first."""
        pipeline = self.objects[encoder.data["pipeline_ref"]]
        source = pipeline.data["source"]
        lib = self._host_libraries.get(source)
        if lib is None:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory()
            folder = pathlib.Path(self._tmp.name) / str(len(self._host_libraries))
            folder.mkdir()
            lib = self._host_libraries[source] = build_host_library(source, folder)
        addresses, vals = [], []
        for index, binding in sorted(encoder.data["bound"].items()):
            if binding[0] == "bytes":
                raw = binding[1]
                vals = list(struct.unpack(f"<{len(raw) // 8}q", raw))
                continue
            while len(addresses) < index:
                addresses.append(0)
            buf, offset = binding
            addresses.append(ctypes.addressof(self.objects[buf].data["memory"]) + offset)
        run_host_kernel(lib, pipeline.data["function"], addresses, vals, grid, group)

    # --- helpers for tests ---------------------------------------------------------------------------------
    def dispatches(self) -> list[tuple[str, dict[int, Any], tuple[int, ...], tuple[int, ...]]]:
        """Every dispatch encoded so far: (kernel function, bound arguments by index, grid, threadgroup)."""
        found: list[Any] = []
        for o in self.objects.values():
            if o.kind == "MTLComputeCommandEncoder":
                found += o.data.get("dispatches", [])
        return found
