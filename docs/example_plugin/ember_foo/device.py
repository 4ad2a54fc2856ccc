"""The FOO device: host memory, C kernels loaded with ctypes, and a replay loop as its graph."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from ember.device import BufferSpec, Compiled, GraphCall, KernelBinary, LRUAllocator, copyin_source, copyout_dest
from ember_foo.compiler import FooCompiler, has_float16
from ember_foo.plugin import find_cc
from ember_foo.renderer import FooRenderer


class FooBuffer:
    """An opaque FOO buffer: ``view`` is its memory (a writable byte memoryview), ``address`` where it starts."""

    def __init__(self, view: memoryview, address: int, base: Any):
        self.view, self.address, self.base = view, address, base  # ``base`` keeps the memory alive

    @property
    def nbytes(self) -> int:
        return self.view.nbytes


class FooAllocator(LRUAllocator):
    """Host memory from ctypes arrays: copies are slice assignments, offsets and ``as_buffer`` are zero-copy."""

    def _alloc(self, nbytes: int, options: BufferSpec | None) -> FooBuffer:
        mem = (ctypes.c_char * max(nbytes, 1))()  # host memory is host-visible: every BufferSpec is served alike
        return FooBuffer(memoryview(mem).cast("B")[:nbytes], ctypes.addressof(mem), mem)

    def _free(self, opaque: FooBuffer, nbytes: int, options: BufferSpec | None) -> None:
        pass  # ctypes frees the array with its last reference (an offset view may still hold it)

    def copyin(self, dest: FooBuffer, src: memoryview) -> None:
        src = copyin_source(src, dest.nbytes).cast("B")
        dest.view[:src.nbytes] = src

    def copyout(self, dest: memoryview, src: FooBuffer) -> None:
        dest = copyout_dest(dest, src.nbytes).cast("B")
        dest[:] = src.view[:dest.nbytes]

    def as_buffer(self, opaque: FooBuffer) -> memoryview:
        return opaque.view

    def offset(self, opaque: FooBuffer, byte_offset: int, nbytes: int) -> FooBuffer:
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a buffer of "
                             f"{opaque.nbytes} bytes")
        return FooBuffer(opaque.view[byte_offset:byte_offset + nbytes], opaque.address + byte_offset, opaque)

    def transfer(self, dest: FooBuffer, src: FooBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        # FOO:0 and FOO:1 share the host's memory: a direct copy, no staging
        dest.view[:nbytes] = src.view[:nbytes]


class FooProgram:
    """One kernel of a loaded library: ``prg(*bufs, global_size=..., vals=..., wait=...)``."""

    def __init__(self, device: FooDevice, name: str, binary: bytes):
        kb = KernelBinary.unpack(binary)
        self.name = name
        self.fn = device.load_library(kb.program)[kb.kernel_symbol(name)]
        self.fn.argtypes, self.fn.restype = [ctypes.c_void_p, ctypes.c_void_p], None

    def __call__(self, *bufs: FooBuffer, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        # a loop-based device: the kernel loops over its whole iteration space, launch sizes do not matter
        addresses = (ctypes.c_void_p * max(len(bufs), 1))(*[b.address for b in bufs])
        ints = (ctypes.c_longlong * max(len(vals), 1))(*vals)
        start = time.perf_counter()
        self.fn(addresses, ints)
        return time.perf_counter() - start if wait else None


class FooGraph:
    """Batch replay for FOO: the calls in a Python loop (a real device would prebuild a command buffer)."""

    def __init__(self, calls: Sequence[GraphCall]):
        self.programs = [call[0] for call in calls]
        self.bufs = [list(call[1]) for call in calls]
        self.vals = [tuple(call[2]) for call in calls]

    def __call__(self, wait: bool = False) -> float | None:
        start = time.perf_counter()
        for prg, bufs, vals in zip(self.programs, self.bufs, self.vals):
            prg(*bufs, vals=vals)
        return time.perf_counter() - start if wait else None

    def update_buffer(self, call_index: int, buf_index: int, opaque: Any) -> None:
        bufs = self.bufs[call_index]
        if not 0 <= buf_index < len(bufs):
            raise IndexError(f"call {call_index} has {len(bufs)} buffers, no buffer {buf_index}")
        bufs[buf_index] = opaque

    def update_vals(self, call_index: int, vals: Sequence[int]) -> None:
        if len(vals) != len(self.vals[call_index]):
            raise ValueError(f"call {call_index} takes {len(self.vals[call_index])} int variables, got {len(vals)}")
        self.vals[call_index] = tuple(vals)

    def __len__(self) -> int:
        return len(self.programs)


class FooDevice(Compiled):
    """``FOO`` and ``FOO:N`` (all the host; each has its own directory of loaded libraries)."""

    def __init__(self, device: str = "FOO"):
        cc = find_cc()
        if cc is None:
            raise RuntimeError("no C compiler found")
        self.libdir = tempfile.TemporaryDirectory(prefix="ember-foo-")
        self.libraries: dict[str, ctypes.CDLL] = {}
        super().__init__(device, FooAllocator(), FooRenderer(float16=has_float16(cc)), FooCompiler(cc),
                         functools.partial(FooProgram, self), FooGraph)

    def load_library(self, program: bytes) -> ctypes.CDLL:
        """The loaded shared object for ``program`` (loaded once: kernels of one batch share it)."""
        key = hashlib.sha256(program).hexdigest()
        if key not in self.libraries:
            path = os.path.join(self.libdir.name, f"{key}.so")
            with open(path, "wb") as f:
                f.write(program)
            self.libraries[key] = ctypes.CDLL(path)
        return self.libraries[key]

    def finalize(self) -> None:
        """At exit: delete the directory of library files (the loaded libraries stay mapped)."""
        self.libdir.cleanup()
