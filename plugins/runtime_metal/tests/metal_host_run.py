"""Run rendered MSL on the host CPU: the kernel compiled as C++ with ``shim/host/metal_stdlib`` and called
once per thread of the grid, so the tests can compare the renderer's arithmetic with the PYTHON device.

This executes ember's MSL text, not Metal: it shows the source computes the right values under C++
semantics (casts, rounding, integer division, bit patterns, the grid and variable conventions). Apple's
compiler, the GPU and threadgroup barriers are out of its reach.
"""
from __future__ import annotations

import ctypes
import pathlib
import re
import subprocess
import tempfile
from collections.abc import Sequence

import numpy as np
from metal_msl_check import find_clang

from ember.device import Device
from ember.renderer import UOp

HOST_SHIM = pathlib.Path(__file__).parent / "shim" / "host"
_PARAM = re.compile(r"(?:const )?device (\w+)\* data(\d+) \[\[buffer\(\d+\)\]\]|constant long\* ember_vals|"
                    r"uint3 (gid|lid|group) \[\[\w+\]\]")


def _wrapper(name: str, src: str) -> str:
    """``extern "C" run_NAME(bufs, vals, grid, group)``: every thread of the launch, one after another."""
    head = re.search(rf"kernel void {name}\((.*?)\) {{", src)
    assert head is not None, f"no kernel {name}"
    args: list[str] = []
    for m in _PARAM.finditer(head.group(1)):
        if m.group(1):
            args.append(f"({m.group(1)}*)bufs[{m.group(2)}]")
        elif m.group(3):
            args.append(m.group(3))
        else:
            args.append("vals")
    return f"""extern "C" void run_{name}(void** bufs, const long* vals, const uint* grid, const uint* local) {{
  for (uint z = 0; z < grid[2]; z++) for (uint y = 0; y < grid[1]; y++) for (uint x = 0; x < grid[0]; x++) {{
    uint3 gid = {{x, y, z}};
    uint3 lid = {{x % local[0], y % local[1], z % local[2]}};
    uint3 group = {{x / local[0], y / local[1], z / local[2]}};
    (void)gid; (void)lid; (void)group;
    {name}({", ".join(args)});
  }}
}}
"""


class HostKernels:
    """Compile several MSL sources (each with one kernel) into one shared library and run them."""

    def __init__(self, sources: dict[str, str], workdir: str | None = None):
        clang = find_clang()
        if clang is None:
            raise RuntimeError("no clang on PATH")
        clangxx = clang.replace("clang", "clang++") if "clang++" not in clang else clang
        self.names = list(sources)
        parts = []
        for name, src in sources.items():
            if "threadgroup_barrier" in src:
                raise ValueError(f"kernel {name} has barriers: its threads cannot run one after another")
            parts.append(src + _wrapper(name, src))
        self._tmp = tempfile.TemporaryDirectory() if workdir is None else None
        folder = pathlib.Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        cpp, lib = folder / "kernels.cpp", folder / "kernels.so"
        cpp.write_text("\n".join(parts))
        proc = subprocess.run([clangxx, "-std=c++17", "-O0", "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off",
                               "-Wno-unknown-attributes", "-I", str(HOST_SHIM), "-o", str(lib), str(cpp)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(f"host build failed:\n{proc.stderr[:6000]}")
        self.lib = ctypes.CDLL(str(lib))

    def run(self, name: str, bufs: Sequence[np.ndarray], grid: Sequence[int], local: Sequence[int] = (1, 1, 1),
            vals: Sequence[int] = ()) -> None:
        """Run kernel ``name`` over ``grid`` threads on the numpy arrays ``bufs`` (buffer i = ``bufs[i]``)."""
        ptrs = (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs])
        values = (ctypes.c_long * max(len(vals), 1))(*vals)
        fn = getattr(self.lib, f"run_{name}")
        fn(ptrs, values, (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*local))


def run_on_python(uops: list[UOp], arrays: Sequence[np.ndarray], grid: Sequence[int],
                  vals: Sequence[int] = ()) -> list[np.ndarray]:
    """Run the linear program ``uops`` on ember's PYTHON device (the oracle) with copies of ``arrays`` as its
    buffers; the buffers' contents afterwards."""
    dev = Device["PYTHON"]
    prg = dev.runtime("k", dev.compiler.compile_cached(dev.renderer.render("k", uops)))
    bufs = []
    for a in arrays:
        buf = dev.allocator.alloc(a.nbytes)
        dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(a)).cast("B"))
        bufs.append(buf)
    prg(*bufs, global_size=tuple(grid), vals=tuple(vals), wait=True)
    out = []
    for a, buf in zip(arrays, bufs):
        got = np.empty_like(a)
        dev.allocator.copyout(memoryview(got).cast("B"), buf)
        out.append(got)
    return out
