"""Run rendered MSL on the host CPU: the kernel compiled as C++ with ``shim/host/metal_stdlib`` and called
once per thread of the grid, so the tests can compare the renderer's arithmetic with the PYTHON device.

This executes ember's MSL text, not Metal: it shows the source computes the right values under C++
semantics (casts, rounding, integer division, bit patterns, the grid and variable conventions). A kernel with
threadgroup barriers runs each threadgroup's threads as OS threads meeting at a pthread barrier. Apple's
compiler and GPU are out of its reach.
"""
from __future__ import annotations

import concurrent.futures
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
                    r"uint3 (gid|lid|group) \[\[\w+\]\]|ushort (lane|sg) \[\[\w+\]\]")


def _arguments(params: str) -> list[str]:
    """The call arguments of a kernel with parameter list ``params``, in the wrappers' names."""
    args: list[str] = []
    for m in _PARAM.finditer(params):
        if m.group(1):
            args.append(f"({m.group(1)}*)bufs[{m.group(2)}]")
        elif m.group(3):
            args.append(m.group(3))
        elif m.group(4):  # one SIMD group per threadgroup: the lane is the thread's index in it
            args.append("(ushort)(lid.x + local[0] * (lid.y + local[1] * lid.z))" if m.group(4) == "lane" else "0")
        else:
            args.append("vals")
    return args


def _group_wrapper(symbol: str, params: str) -> str:
    """``run_SYMBOL`` for a kernel with barriers: threadgroup after threadgroup, the threads of one as OS
    threads meeting at the barrier. The grid must be a whole number of threadgroups."""
    return f"""extern "C" void run_{symbol}(void** bufs, const long* vals, const uint* grid, const uint* local) {{
  const uint threads = local[0] * local[1] * local[2];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, nullptr, threads);
  ember_host_group_barrier() = &barrier;
  for (uint gz = 0; gz < grid[2] / local[2]; gz++) for (uint gy = 0; gy < grid[1] / local[1]; gy++)
  for (uint gx = 0; gx < grid[0] / local[0]; gx++) {{
    std::vector<std::thread> lanes;
    for (uint lz = 0; lz < local[2]; lz++) for (uint ly = 0; ly < local[1]; ly++)
    for (uint lx = 0; lx < local[0]; lx++) {{
      const uint3 group = {{gx, gy, gz}}, lid = {{lx, ly, lz}};
      const uint3 gid = {{gx * local[0] + lx, gy * local[1] + ly, gz * local[2] + lz}};
      lanes.emplace_back([=] {{ (void)gid; (void)lid; (void)group; {symbol}({", ".join(_arguments(params))}); }});
    }}
    for (std::thread& t : lanes) t.join();
  }}
  ember_host_group_barrier() = nullptr;
  pthread_barrier_destroy(&barrier);
}}
"""


def _wrapper(symbol: str, params: str) -> str:
    """``extern "C" run_SYMBOL(bufs, vals, grid, local)``: every thread of the launch, one after another.
    ``params`` is the text of the kernel's parameter list."""
    args = _arguments(params)
    return f"""extern "C" void run_{symbol}(void** bufs, const long* vals, const uint* grid, const uint* local) {{
  for (uint z = 0; z < grid[2]; z++) for (uint y = 0; y < grid[1]; y++) for (uint x = 0; x < grid[0]; x++) {{
    uint3 gid = {{x, y, z}};
    uint3 lid = {{x % local[0], y % local[1], z % local[2]}};
    uint3 group = {{x / local[0], y / local[1], z / local[2]}};
    (void)gid; (void)lid; (void)group;
    {symbol}({", ".join(args)});
  }}
}}
"""


def library_kernels(source: str) -> list[tuple[str, str]]:
    """(symbol, parameter text) of every kernel in an MSL library source, also one the batch compiler joined
    (each kernel renamed by ``#define NAME SYMBOL`` ... ``#undef NAME``)."""
    found: list[tuple[str, str]] = []
    renames = list(re.finditer(r"^#define (\w+) (ember_b\d+_\w+)$", source, re.M))
    if not renames:
        return [(m.group(1), m.group(2)) for m in re.finditer(r"kernel void (\w+)\((.*?)\) {", source, re.S)]
    for m in renames:
        name, symbol = m.group(1), m.group(2)
        head = re.compile(rf"kernel void {name}\((.*?)\) {{", re.S).search(source, m.end())
        assert head is not None, f"no kernel {name} after its #define"
        found.append((symbol, head.group(1)))
    return found


def uses_barriers(text: str, symbol: str) -> bool:
    """Whether the kernel ``symbol`` of library ``text`` has a threadgroup barrier (a kernel's body runs from
    its name to the next kernel or the end)."""
    names = [symbol]
    rename = re.search(rf"^#define (\w+) {symbol}$", text, re.M)
    if rename:
        names.append(rename.group(1))
    start = min((m.start() for n in names for m in re.finditer(rf"kernel void {n}\(", text)), default=-1)
    if start < 0:
        return False
    end = text.find("kernel void", start + 1)
    body = text[start:end if end >= 0 else len(text)]
    return "threadgroup_barrier" in body or "ember_wmma_" in body  # the tensor-core helper syncs its SIMD group


def build_host_library(text: str, folder: pathlib.Path) -> ctypes.CDLL:
    """Compile MSL ``text`` plus a ``run_SYMBOL`` wrapper per kernel into a shared library for this CPU."""
    clang = find_clang()
    if clang is None:
        raise RuntimeError("no clang on PATH")
    clangxx = clang.replace("clang", "clang++") if "clang++" not in clang else clang
    cpp, lib = folder / "kernels.cpp", folder / "kernels.so"
    # `threadgroup` is `static` for the shim (one threadgroup runs at a time); on a pointer parameter it is
    # only an address space, dropped here
    text = re.sub(r"([(,]\s*)threadgroup ", r"\1", text)
    wrappers = [(_group_wrapper if uses_barriers(text, sym) else _wrapper)(sym, params)
                for sym, params in library_kernels(text)]
    # MSL's `thread` address space is a macro of the shim: the wrappers need std::thread back
    cpp.write_text("#include <thread>\n#include <vector>\n" + text + "\n#undef thread\n" + "".join(wrappers))
    proc = subprocess.run([clangxx, "-std=c++17", "-O0", "-pthread", "-shared", "-fPIC", "-fno-fast-math",
                           "-ffp-contract=off",
                           "-Wno-unknown-attributes", "-I", str(HOST_SHIM), "-o", str(lib), str(cpp)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"host build failed:\n{proc.stderr[:6000]}")
    return ctypes.CDLL(str(lib))


def run_host_kernel(lib: ctypes.CDLL, symbol: str, addresses: Sequence[int], vals: Sequence[int],
                    grid: Sequence[int], local: Sequence[int] = (1, 1, 1)) -> None:
    """Run kernel ``symbol`` of ``lib`` with buffer i at host address ``addresses[i]``."""
    ptrs = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
    values = (ctypes.c_long * max(len(vals), 1))(*vals)
    getattr(lib, f"run_{symbol}")(ptrs, values, (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*local))


class HostKernels:
    """Compile several MSL sources (each with one kernel, named as in ``sources``) into shared libraries of at
    most ``per_library`` kernels, built two at a time."""

    def __init__(self, sources: dict[str, str], per_library: int = 600):
        self._tmp = tempfile.TemporaryDirectory()
        names = list(sources)
        groups = [names[i:i + per_library] for i in range(0, len(names), per_library)]
        folders = [pathlib.Path(self._tmp.name) / str(i) for i in range(len(groups))]
        for folder in folders:
            folder.mkdir()
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            libs = list(pool.map(lambda g, f: build_host_library("\n".join(sources[n] for n in g), f), groups, folders))
        self.libs = {name: lib for group, lib in zip(groups, libs) for name in group}

    def run(self, name: str, bufs: Sequence[np.ndarray], grid: Sequence[int], local: Sequence[int] = (1, 1, 1),
            vals: Sequence[int] = ()) -> None:
        """Run kernel ``name`` over ``grid`` threads on the numpy arrays ``bufs`` (buffer i = ``bufs[i]``)."""
        run_host_kernel(self.libs[name], name, [b.ctypes.data for b in bufs], vals, grid, local)


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
