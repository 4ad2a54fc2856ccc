"""Replay a captured list of CPU kernel calls with one foreign call.

A tiny C runner loops over arrays of function pointers and argument arrays that are
built once, when the graph is captured. Replaying costs one cffi call plus a C loop,
instead of one Python-level launch per kernel.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from ember.device import KernelBinary
from ember_cpu.compiler import CPUCompiler
from ember_cpu.runtime import CPUProgram, SharedObject, ffi, load_shared_object

RUNNER_NAME = "ember_run_batch"
RUNNER_SRC = """typedef void (*ember_kernel_fn)(void **bufs, const long long *vals);

void ember_run_batch(int n, ember_kernel_fn *fns, void ***bufs, const long long **vals) {
  for (int i = 0; i < n; i++) fns[i](bufs[i], vals[i]);
}
"""


@functools.cache
def batch_runner() -> tuple[SharedObject, Any]:
    """The compiled runner (built once per process, through the compile cache) and its function pointer."""
    lib = load_shared_object(KernelBinary.unpack(CPUCompiler(openmp=False).compile_cached(RUNNER_SRC)).program)
    return lib, lib.function(RUNNER_NAME, "ember_batch_fn")


class CPUGraph:
    """A batch of kernel calls ``[(program, bufs, vals[, global_size, local_size]), ...]`` replayed in order.

    Launch sizes (part of the graph contract for grid devices) do not matter to loop-based CPU kernels.

    Every program must be a :class:`~ember_cpu.runtime.CPUProgram`. The graph keeps the
    programs and buffers alive; :meth:`update_buffer` and :meth:`update_vals` change one
    call's arguments in place (for replaying with new inputs).
    """

    def __init__(self, calls: Sequence[tuple[Any, ...]]):
        _, self._runner = batch_runner()
        self.programs: list[CPUProgram] = []
        self.bufs: list[list[Any]] = []
        self._buf_arrays: list[Any] = []
        self._val_arrays: list[Any] = []
        for i, (prg, bufs, vals, *_sizes) in enumerate(calls):
            if not isinstance(prg, CPUProgram):
                raise TypeError(f"CPUGraph call {i}: expected a CPUProgram, got {type(prg).__name__}")
            self.programs.append(prg)
            self.bufs.append(list(bufs))
            self._buf_arrays.append(ffi.new("void*[]", [b.ptr for b in bufs]) if bufs else ffi.NULL)
            self._val_arrays.append(ffi.new("long long[]", list(vals)) if vals else ffi.NULL)
        self.n = len(self.programs)
        self._fns = ffi.new("ember_kernel_fn[]", [p.fn for p in self.programs]) if self.n else ffi.NULL
        self._bufs_ptrs = ffi.new("void**[]", self._buf_arrays) if self.n else ffi.NULL
        self._vals_ptrs = ffi.new("const long long*[]", self._val_arrays) if self.n else ffi.NULL

    def __call__(self, wait: bool = False) -> float | None:
        """Run every call in order; return the elapsed seconds when ``wait``."""
        start = time.perf_counter()
        self._runner(self.n, self._fns, self._bufs_ptrs, self._vals_ptrs)
        return time.perf_counter() - start if wait else None

    def update_buffer(self, call_index: int, buf_index: int, opaque: Any) -> None:
        """Make argument ``buf_index`` of call ``call_index`` point at the buffer ``opaque``."""
        bufs = self.bufs[call_index]
        if not 0 <= buf_index < len(bufs):
            raise IndexError(f"call {call_index} has {len(bufs)} buffers, no buffer {buf_index}")
        bufs[buf_index] = opaque
        self._buf_arrays[call_index][buf_index] = opaque.ptr

    def update_vals(self, call_index: int, vals: Sequence[int]) -> None:
        """Replace the int variables of call ``call_index`` (same count as at capture)."""
        array = self._val_arrays[call_index]
        count = 0 if array == ffi.NULL else len(array)
        if len(vals) != count:
            raise ValueError(f"call {call_index} takes {count} int variables, got {len(vals)}")
        for j, v in enumerate(vals):
            array[j] = v

    def __len__(self) -> int:
        return self.n
