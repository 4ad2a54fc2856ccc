"""The CPU device below the renderer: C compiler, loader, launches, allocator and batch graph.

Kernels here are hand-written C in the uniform signature ``void NAME(void **bufs, const long long *vals)``.
"""
from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ember.device.batch_compiler import KernelBinary
from ember.device.compiler import CompileError
from ember.helpers import GlobalCounters
from ember_cpu.allocator import ALIGNMENT, CPUAllocator, CPUBuffer
from ember_cpu.compiler import CPUCompiler, find_cc
from ember_cpu.device import CPUDevice
from ember_cpu.graph import CPUGraph
from ember_cpu.runtime import CPUProgram

pytestmark = [pytest.mark.skipif(find_cc() is None, reason="no C compiler found"),
              pytest.mark.usefixtures("private_cache_dir")]

ADD_SRC = """
void add(void **bufs, const long long *vals) {
  float *out = (float *)bufs[0];
  const float *a = (const float *)bufs[1];
  const float *b = (const float *)bufs[2];
  for (long long i = 0; i < vals[0]; i++) out[i] = a[i] + b[i];
}
"""

MUL_SRC = """
void mul(void **bufs, const long long *vals) {
  float *out = (float *)bufs[0];
  const float *a = (const float *)bufs[1];
  const float *b = (const float *)bufs[2];
  for (long long i = 0; i < vals[0]; i++) out[i] = a[i] * b[i];
}
"""

SUB_SRC = """
void sub(void **bufs, const long long *vals) {
  float *out = (float *)bufs[0];
  const float *a = (const float *)bufs[1];
  const float *b = (const float *)bufs[2];
  for (long long i = 0; i < vals[0]; i++) out[i] = a[i] - b[i];
}
"""

OMP_SRC = """
#include <math.h>
#include <omp.h>
void omp_sqrt(void **bufs, const long long *vals) {
  float *out = (float *)bufs[0];
  const float *a = (const float *)bufs[1];
  int *threads = (int *)bufs[2];
  #pragma omp parallel for
  for (long long i = 0; i < vals[0]; i++) {
    out[i] = sqrtf(a[i]) * 2.0f;
    if (i == 0) threads[0] = omp_get_num_threads();
  }
  threads[1] = omp_get_max_threads();
}
"""



@pytest.fixture(scope="module")
def dev() -> CPUDevice:
    return CPUDevice("CPU")


def build(dev: CPUDevice, name: str, src: str) -> CPUProgram:
    return dev.runtime(name, dev.compiler.compile_cached(src))


def to_device(dev: CPUDevice, arr: np.ndarray) -> CPUBuffer:
    buf = dev.allocator.alloc(arr.nbytes)
    dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(arr)))
    return buf


def from_device(dev: CPUDevice, buf: CPUBuffer, dtype, count: int) -> np.ndarray:
    out = np.empty(count, dtype)
    dev.allocator.copyout(memoryview(out), buf)
    return out


def random_floats(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# ---- device object ----

def test_device_object_contract(dev):
    assert dev.device == "CPU"
    assert isinstance(dev.allocator, CPUAllocator)
    assert isinstance(dev.compiler, CPUCompiler)
    assert dev.runtime is CPUProgram and dev.graph is CPUGraph
    dev.synchronize()


# ---- compile and run ----

def test_add_matches_numpy(dev):
    n = 1000
    a, b = random_floats(n, 0), random_floats(n, 1)
    prg = build(dev, "add", ADD_SRC)
    out, da, db = dev.allocator.alloc(n * 4), to_device(dev, a), to_device(dev, b)
    assert prg(out, da, db, global_size=(1, 1, 1), vals=(n,)) is None
    np.testing.assert_array_equal(from_device(dev, out, np.float32, n), a + b)


def test_vals_select_the_work(dev):
    n = 64
    a, b = random_floats(n, 2), random_floats(n, 3)
    prg = build(dev, "add", ADD_SRC)
    out, da, db = to_device(dev, np.zeros(n, np.float32)), to_device(dev, a), to_device(dev, b)
    prg(out, da, db, vals=(10,))
    expected = np.zeros(n, np.float32)
    expected[:10] = a[:10] + b[:10]
    np.testing.assert_array_equal(from_device(dev, out, np.float32, n), expected)
    prg(out, da, db, vals=[n])  # a list works too
    np.testing.assert_array_equal(from_device(dev, out, np.float32, n), a + b)


def test_wait_returns_seconds(dev):
    prg = build(dev, "add", ADD_SRC)
    bufs = [dev.allocator.alloc(16) for _ in range(3)]
    elapsed = prg(*bufs, vals=(4,), wait=True)
    assert isinstance(elapsed, float) and 0 <= elapsed < 5


def test_ieee_semantics_are_kept(dev):
    # -ffast-math would fold the NaN test away and break inf arithmetic
    src = """
    void ieee(void **bufs, const long long *vals) {
      float *out = (float *)bufs[0];
      const float *a = (const float *)bufs[1];
      for (long long i = 0; i < vals[0]; i++) {
        float x = a[i] / 0.0f;
        out[2 * i] = (x != x) ? 1.0f : 0.0f;
        out[2 * i + 1] = x;
      }
    }
    """
    a = np.array([1.0, -1.0, 0.0], np.float32)
    prg = build(dev, "ieee", src)
    out = dev.allocator.alloc(6 * 4)
    prg(out, to_device(dev, a), vals=(3,))
    got = from_device(dev, out, np.float32, 6)
    assert list(got[0::2]) == [0.0, 0.0, 1.0]
    assert got[1] == np.inf and got[3] == -np.inf and np.isnan(got[5])


def test_int_kernel_with_several_vars(dev):
    src = """
    void affine(void **bufs, const long long *vals) {
      int *out = (int *)bufs[0];
      for (long long i = 0; i < vals[0]; i++) out[i] = (int)(i * vals[1] + vals[2]);
    }
    """
    prg = build(dev, "affine", src)
    out = dev.allocator.alloc(8 * 4)
    prg(out, vals=(8, 3, -5))
    np.testing.assert_array_equal(from_device(dev, out, np.int32, 8), np.arange(8) * 3 - 5)


def test_openmp_kernel(dev):
    if not dev.compiler.openmp:
        pytest.skip(f"{dev.compiler.cc[0]} cannot build OpenMP code")
    assert "-fopenmp" in dev.compiler.flags
    n = 1 << 20
    a = np.abs(random_floats(n, 4))
    prg = build(dev, "omp_sqrt", OMP_SRC)
    out, threads = dev.allocator.alloc(n * 4), to_device(dev, np.zeros(2, np.int32))
    prg(out, to_device(dev, a), threads, vals=(n,))
    np.testing.assert_allclose(from_device(dev, out, np.float32, n), np.sqrt(a) * 2, rtol=1e-6)
    used, available = from_device(dev, threads, np.int32, 2)
    assert available >= 1 and used == available


def test_unloading_openmp_kernels_keeps_the_openmp_runtime(dev):
    # Unloading the last library that linked the OpenMP runtime used to unload the runtime under its
    # idle worker threads (a segfault), so this runs in a child process.
    if not dev.compiler.openmp:
        pytest.skip(f"{dev.compiler.cc[0]} cannot build OpenMP code")
    script = textwrap.dedent("""
        import gc
        from ember_cpu.device import CPUDevice
        dev = CPUDevice()
        src = "#include <omp.h>\\nvoid k(void **b, const long long *v) { int *o = (int *)b[0];\\n" \\
              "#pragma omp parallel for\\nfor (int i = 0; i < 1000; i++) o[i] = omp_get_thread_num() + 1; }"
        out = dev.allocator.alloc(4000)
        for i in range(8):
            prg = dev.runtime("k", dev.compiler.compile_cached(src + "// %d" % i))
            prg(out)
            del prg
            gc.collect()
        assert min(dev.allocator.as_buffer(out).cast("i")) >= 1
        print("done")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr


def test_openmp_off_still_compiles_pragmas(dev):
    plain = CPUCompiler(openmp=False)
    assert "-fopenmp" not in plain.flags
    assert (plain.cachekey != dev.compiler.cachekey) == dev.compiler.openmp
    src = OMP_SRC.replace("#include <omp.h>", "static int omp_get_num_threads(void) { return 1; }\n"
                                               "static int omp_get_max_threads(void) { return 1; }")
    prg = CPUProgram("omp_sqrt", plain.compile_cached(src))
    a = np.abs(random_floats(100, 5))
    out, threads = dev.allocator.alloc(400), to_device(dev, np.zeros(2, np.int32))
    prg(out, to_device(dev, a), threads, vals=(100,))
    np.testing.assert_allclose(from_device(dev, out, np.float32, 100), np.sqrt(a) * 2, rtol=1e-6)
    assert list(from_device(dev, threads, np.int32, 2)) == [1, 1]


def test_compiler_without_openmp_is_detected(tmp_path, dev):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    script = tmp_path / "no-omp-cc"
    script.write_text("#!/bin/sh\n"
                      'for a in "$@"; do [ "$a" = "-fopenmp" ] && { echo "no -fopenmp" >&2; exit 1; }; done\n'
                      f'exec {gcc} "$@"\n')
    script.chmod(0o755)
    before = GlobalCounters.kernels_compiled
    comp = CPUCompiler([str(script)])
    assert not comp.openmp and "-fopenmp" not in comp.flags
    assert GlobalCounters.kernels_compiled == before  # probing is not counted as a kernel compile
    prg = CPUProgram("add", comp.compile_cached("#pragma omp parallel for\n" + ADD_SRC))
    a, b = random_floats(8, 8), random_floats(8, 9)
    out = dev.allocator.alloc(32)
    prg(out, to_device(dev, a), to_device(dev, b), vals=(8,))
    np.testing.assert_array_equal(from_device(dev, out, np.float32, 8), a + b)


def test_compile_error_shows_source_and_compiler_output(dev):
    src = ("void broken(void **bufs, const long long *vals) {\n"
           "  float *o = (float *)bufs[0];\n"
           "  o[0] = undefined_thing;\n"
           "}\n")
    with pytest.raises(CompileError) as info:
        dev.compiler.compile_cached(src)
    text = str(info.value)
    assert "3 |   o[0] = undefined_thing;" in text  # numbered source
    assert "undefined_thing" in info.value.output and "error" in info.value.output.lower()  # compiler's message
    assert "kernel.c" in text and "ember-cc-" not in text  # no temporary folder names


def test_missing_function_name(dev):
    binary = dev.compiler.compile_cached(ADD_SRC)
    with pytest.raises(AttributeError, match="not_there"):
        CPUProgram("not_there", binary)


def test_compiled_binary_is_cached_on_disk(dev):
    src = ADD_SRC.replace("add(", "add_cached(")
    dev.compiler.compile_cached(src)
    before = GlobalCounters.kernels_compiled
    fresh = CPUCompiler()
    assert fresh.cachekey == dev.compiler.cachekey
    binary = fresh.compile_cached(src)
    assert GlobalCounters.kernels_compiled == before
    assert KernelBinary.unpack(binary).program[:4] == b"\x7fELF"


def test_same_name_different_code_loads_separately(dev):
    # a reused path (/proc/self/fd/N) must never hand back a previously loaded library
    def const_kernel(value: int) -> CPUProgram:
        src = f"void const_k(void **bufs, const long long *vals) {{ ((int *)bufs[0])[0] = {value}; }}"
        return build(dev, "const_k", src)

    out = dev.allocator.alloc(4)
    alive = []
    for value in range(6):
        prg = const_kernel(value)
        prg(out)
        assert from_device(dev, out, np.int32, 1)[0] == value
        if value % 2:
            alive.append(prg)
        del prg
        gc.collect()
    for value, prg in zip((1, 3, 5), alive):
        prg(out)
        assert from_device(dev, out, np.int32, 1)[0] == value


def test_loads_from_a_temporary_file_without_memfd(dev, monkeypatch):
    def no_memfd(*args, **kwargs):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    prg = build(dev, "add", ADD_SRC)
    assert prg.lib.fd is None
    a, b = random_floats(8, 6), random_floats(8, 7)
    out = dev.allocator.alloc(32)
    prg(out, to_device(dev, a), to_device(dev, b), vals=(8,))
    np.testing.assert_array_equal(from_device(dev, out, np.float32, 8), a + b)


def test_cc_override(monkeypatch):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    monkeypatch.setenv("CC", "gcc")
    assert find_cc() == [gcc]
    monkeypatch.setenv("CC", "no-such-compiler-ember")
    assert find_cc() is None
    with pytest.raises(RuntimeError, match="no C compiler"):
        CPUCompiler()


@pytest.mark.parametrize("name", ["gcc", "clang"])
def test_gcc_alone_gets_its_pass_flags_and_a_kernel_still_builds_and_runs(name, dev):
    """GCC_FLAGS (two gcc passes off) go to gcc builds only: clang has no such passes."""
    from ember_cpu.compiler import GCC_FLAGS

    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    comp = CPUCompiler([path], openmp=False)
    assert all((f in comp.flags) == (name == "gcc") for f in GCC_FLAGS)
    a, b = random_floats(100, 0), random_floats(100, 1)
    prg = dev.runtime("add", comp.compile_cached(ADD_SRC))
    out, da, db = dev.allocator.alloc(400), to_device(dev, a), to_device(dev, b)
    prg(out, da, db, global_size=(1, 1, 1), vals=(100,))
    np.testing.assert_array_equal(from_device(dev, out, np.float32, 100), a + b)


# ---- allocator ----

@pytest.mark.parametrize("nbytes", [0, 1, 3, 64, 100, 4096, 1 << 20])
def test_alignment_and_round_trip(nbytes):
    alloc = CPUAllocator()
    buf = alloc.alloc(nbytes)
    assert buf.address % ALIGNMENT == 0 and buf.nbytes == nbytes
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    alloc.copyin(buf, memoryview(data))
    out = np.zeros(nbytes, np.uint8)
    alloc.copyout(memoryview(out), buf)
    np.testing.assert_array_equal(out, data)
    assert len(alloc.as_buffer(buf)) == nbytes


def test_size_zero_buffer_in_a_kernel(dev):
    prg = build(dev, "add", ADD_SRC)
    empty = [dev.allocator.alloc(0) for _ in range(3)]
    prg(*empty, vals=(0,))
    dev.allocator.copyin(empty[0], memoryview(b""))
    dev.allocator.copyout(memoryview(bytearray()), empty[0])


def test_copy_size_checks():
    alloc = CPUAllocator()
    buf = alloc.alloc(8)
    with pytest.raises(ValueError, match="copyin"):
        alloc.copyin(buf, memoryview(bytes(9)))
    with pytest.raises(ValueError, match="copyout"):
        alloc.copyout(memoryview(bytearray(9)), buf)
    with pytest.raises(ValueError, match="writable"):
        alloc.copyout(memoryview(bytes(4)), buf)
    with pytest.raises(ValueError, match="contiguous"):
        alloc.copyin(buf, memoryview(np.zeros(4, np.int16))[::2])
    with pytest.raises(ValueError):
        alloc.alloc(-1)


def test_copies_of_typed_and_multidimensional_views():
    alloc = CPUAllocator()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = alloc.alloc(x.nbytes)
    alloc.copyin(buf, memoryview(x))
    y = np.zeros((3, 4), np.float32)
    alloc.copyout(memoryview(y), buf)
    np.testing.assert_array_equal(x, y)


def test_as_buffer_is_zero_copy():
    alloc = CPUAllocator()
    buf = alloc.alloc(16)
    view = alloc.as_buffer(buf)
    view[:4] = b"\x01\x02\x03\x04"
    out = bytearray(4)
    alloc.copyout(memoryview(out), buf)
    assert bytes(out) == b"\x01\x02\x03\x04"
    del buf
    gc.collect()
    view[4:8] = b"abcd"  # the view keeps the memory alive
    assert bytes(view[4:8]) == b"abcd"


def test_offset_views(dev):
    alloc = dev.allocator
    base = to_device(dev, np.arange(16, dtype=np.float32))
    sub = alloc.offset(base, 4 * 4, 8 * 4)
    assert sub.address == base.address + 16 and sub.nbytes == 32
    np.testing.assert_array_equal(from_device(dev, sub, np.float32, 8), np.arange(4, 12, dtype=np.float32))
    # a kernel writing through the view changes the base
    prg = build(dev, "add", ADD_SRC)
    prg(sub, sub, sub, vals=(8,))
    expected = np.arange(16, dtype=np.float32)
    expected[4:12] *= 2
    np.testing.assert_array_equal(from_device(dev, base, np.float32, 16), expected)
    nested = alloc.offset(sub, 4, 4)
    assert from_device(dev, nested, np.float32, 1)[0] == 10.0
    assert alloc.offset(base, 64, 0).nbytes == 0
    with pytest.raises(ValueError, match="outside"):
        alloc.offset(base, 60, 8)


def test_lru_reuses_freed_buffers_and_tracks_memory():
    alloc = CPUAllocator()
    used = GlobalCounters.mem_used
    a = alloc.alloc(256)
    assert GlobalCounters.mem_used == used + 256
    alloc.free(a, 256)
    assert GlobalCounters.mem_used == used and alloc.cached_bytes == 256
    assert alloc.alloc(256) is a
    assert alloc.alloc(256) is not a
    b = alloc.alloc(128)
    alloc.free(b, 128)
    alloc.free_cache()
    assert alloc.cached_bytes == 0 and alloc.alloc(128) is not b


def test_lru_frees_cache_and_retries_on_oom():
    class TightAllocator(CPUAllocator):
        """Fails every real allocation while the cache holds a buffer."""

        def __init__(self):
            super().__init__()
            self.freed = 0

        def _alloc(self, nbytes, options):
            if self.cached_bytes > 0:
                raise MemoryError("out of memory")
            return super()._alloc(nbytes, options)

        def _free(self, opaque, nbytes, options):
            self.freed += 1

    alloc = TightAllocator()
    alloc.free(alloc.alloc(32), 32)
    big = alloc.alloc(64)  # first try fails, the cache is emptied, the retry works
    assert big.nbytes == 64 and alloc.freed == 1 and alloc.cached_bytes == 0


def test_transfer():
    alloc = CPUAllocator()
    src = alloc.alloc(8)
    alloc.copyin(src, memoryview(b"12345678"))
    dest = alloc.alloc(8)
    alloc.transfer(dest, src, 8, "CPU", "CPU:1")
    assert bytes(alloc.as_buffer(dest)) == b"12345678"


# ---- graph ----

def test_graph_replays_three_kernels(dev):
    n = 257
    a, b, c = random_floats(n, 10), random_floats(n, 11), random_floats(n, 12)
    add, mul, sub = build(dev, "add", ADD_SRC), build(dev, "mul", MUL_SRC), build(dev, "sub", SUB_SRC)
    da, db, dc = to_device(dev, a), to_device(dev, b), to_device(dev, c)
    t, u, out = (dev.allocator.alloc(n * 4) for _ in range(3))
    calls = [(add, (t, da, db), (n,)), (mul, (u, t, dc), (n,)), (sub, (out, u, da), (n,))]

    for prg, bufs, vals in calls:
        prg(*bufs, vals=vals)
    sequential = from_device(dev, out, np.float32, n)
    np.testing.assert_allclose(sequential, (a + b) * c - a, rtol=1e-6)

    dev.allocator.copyin(out, memoryview(np.zeros(n, np.float32)))
    graph = CPUGraph(calls)
    assert len(graph) == 3
    assert graph() is None
    np.testing.assert_array_equal(from_device(dev, out, np.float32, n), sequential)
    assert isinstance(graph(wait=True), float)

    # swap the input `a` (used by calls 0 and 2) for another buffer
    a2 = random_floats(n, 13)
    da2 = to_device(dev, a2)
    graph.update_buffer(0, 1, da2)
    graph.update_buffer(2, 2, da2)
    graph()
    np.testing.assert_allclose(from_device(dev, out, np.float32, n), (a2 + b) * c - a2, rtol=1e-6)

    # run only the first half of every kernel
    for i in range(3):
        graph.update_vals(i, (n // 2,))
    dev.allocator.copyin(out, memoryview(np.zeros(n, np.float32)))
    graph()
    half = from_device(dev, out, np.float32, n)
    np.testing.assert_allclose(half[:n // 2], ((a2 + b) * c - a2)[:n // 2], rtol=1e-6)
    assert not half[n // 2:].any()

    with pytest.raises(IndexError):
        graph.update_buffer(0, 3, da2)
    with pytest.raises(ValueError):
        graph.update_vals(0, (1, 2))


def test_graph_without_vals_and_empty_graph(dev):
    src = "void inc(void **bufs, const long long *vals) { ((int *)bufs[0])[0] += 1; }"
    inc = build(dev, "inc", src)
    counter = to_device(dev, np.zeros(1, np.int32))
    graph = CPUGraph([(inc, (counter,), ())] * 5)
    graph()
    graph()
    assert from_device(dev, counter, np.int32, 1)[0] == 10
    CPUGraph([])()


def test_graph_rejects_foreign_programs(dev):
    with pytest.raises(TypeError, match="CPUProgram"):
        CPUGraph([(lambda *a, **k: None, (), ())])


# ---- plugin entry point ----

def test_plugin_hooks():
    plugin = pytest.importorskip("ember_cpu.plugin", exc_type=ImportError)
    (spec,) = plugin.ember_devices()
    assert spec.name == "CPU" and spec.factory == "ember_cpu.device:open_device" and spec.priority == 10
    assert spec.precheck() is None and spec.probe is None
    compiler, openmp, float16 = plugin.ember_report_header()
    assert compiler.startswith("CPU: compiler ") and openmp.startswith("CPU: OpenMP: ")
    assert float16.startswith("CPU: float16: ")


def test_a_batch_is_one_compiler_run_and_one_library(dev, monkeypatch):
    """Two kernels with the same name (and the C preamble each) build as one shared object; each runs."""
    from ember.renderer.cstyle import C_PREAMBLE

    plus = C_PREAMBLE + ADD_SRC.replace("add(", "same_name(")
    times = C_PREAMBLE + MUL_SRC.replace("mul(", "same_name(")
    runs = []
    real = CPUCompiler.build
    monkeypatch.setattr(CPUCompiler, "build", lambda self, src: runs.append(src) or real(self, src))
    monkeypatch.setattr(CPUCompiler, "parallel_builds", 1)
    binaries = dev.compiler.compile_batch([plus, times])
    assert len(runs) == 1
    progs = [dev.runtime("same_name", b) for b in binaries]
    assert progs[0].lib is progs[1].lib and progs[0].fn != progs[1].fn
    a, b = np.arange(5, dtype=np.float32), np.full(5, 3.0, np.float32)
    for prg, want in zip(progs, (a + b, a * b)):
        bufs = [to_device(dev, np.zeros(5, np.float32)), to_device(dev, a), to_device(dev, b)]
        prg(*bufs, vals=(5,))
        np.testing.assert_array_equal(from_device(dev, bufs[0], np.float32, 5), want)


def test_a_foreign_binary_is_refused(dev):
    with pytest.raises(ValueError, match="kernel add: not an ember kernel binary"):
        CPUProgram("add", b"\x7fELF\x02\x01\x01")


def test_kernels_with_attribute_macros_join_one_program(dev, monkeypatch):
    """The renderer marks fused register tiles ``EMBER_FUSED_TILE void NAME(...)``: such kernels are still
    found, so a batch holding one is built as one program instead of one compiler run per kernel."""
    from ember.renderer.cstyle import C_PREAMBLE

    macro = "#ifndef EMBER_FUSED_TILE\n#define EMBER_FUSED_TILE __attribute__((noinline))\n#endif\n"
    plus = C_PREAMBLE + macro + ADD_SRC.replace("\nvoid add(", "\nEMBER_FUSED_TILE void add(")
    times = C_PREAMBLE + MUL_SRC
    assert CPUCompiler.kernel_pattern.findall(plus) == ["add"]
    runs = []
    real = CPUCompiler.build
    monkeypatch.setattr(CPUCompiler, "build", lambda self, src: runs.append(src) or real(self, src))
    monkeypatch.setattr(CPUCompiler, "parallel_builds", 1)
    binaries = dev.compiler.compile_batch([plus, times])
    assert len(runs) == 1
    a, b = np.arange(5, dtype=np.float32), np.full(5, 3.0, np.float32)
    for name, binary, want in zip(("add", "mul"), binaries, (a + b, a * b)):
        bufs = [to_device(dev, np.zeros(5, np.float32)), to_device(dev, a), to_device(dev, b)]
        dev.runtime(name, binary)(*bufs, vals=(5,))
        np.testing.assert_array_equal(from_device(dev, bufs[0], np.float32, 5), want)


def test_prebuilt_declarations_match_the_cdef():
    # the runtime loads ember_cpu._ffi instead of parsing CDEF at start-up: it must say the same
    from ember_cpu import cdefs

    with open(cdefs.MODULE_PATH) as f:
        assert f.read() == cdefs.prebuilt_source(), "ember_cpu/_ffi.py is stale: run python -m ember_cpu.cdefs"


def test_loading_the_runtime_parses_no_declarations():
    # pycparser (what cffi's cdef needs) costs ~50 ms to import: a fresh process loading the runtime skips it
    code = "import sys, ember_cpu.runtime as r; r.CPUProgram; print('pycparser' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unavailable"


def _vma_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding ``address`` in this process."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds 0x{address:x}")


@pytest.mark.skipif(not sys.platform.startswith("linux") or _thp_mode() in ("never", "unavailable"),
                    reason="transparent huge pages are off or absent on this machine")
def test_large_buffers_ask_for_huge_pages():
    from ember_cpu.allocator import HUGE_PAGE_MIN

    alloc = CPUAllocator()
    big = alloc.alloc(HUGE_PAGE_MIN * 2)
    assert "hg" in _vma_flags(big.address + HUGE_PAGE_MIN)  # MADV_HUGEPAGE shows as the "hg" flag
    np.frombuffer(big.view, dtype=np.uint8)[:] = 7  # the advice changes nothing a program can see
    assert (np.frombuffer(alloc.as_buffer(big), dtype=np.uint8) == 7).all()


def test_only_large_buffers_are_advised(monkeypatch):
    import ember_cpu.allocator as allocator

    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(allocator, "_madvise", lambda addr, n, advice: calls.append((addr, n, advice)) or 0)
    alloc = CPUAllocator()
    alloc.alloc(allocator.HUGE_PAGE_MIN - 1)
    assert calls == []
    big = alloc.alloc(allocator.HUGE_PAGE_MIN + 100)
    (addr, n, advice), = calls
    # whole pages inside the buffer, nothing outside it
    assert addr % 4096 == 0 and n % 4096 == 0 and big.address <= addr and addr + n <= big.address + big.nbytes
    assert n >= big.nbytes - 2 * 4096
