"""The CL device below the renderer: probe, compiler, program launches, allocator and graph replay.

Kernels here are hand-written OpenCL C; rendered kernels are covered in test_cl_kernels.py.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ember.device.compiler import CompileError
from ember.helpers import GlobalCounters

SCALE_SRC = """
__kernel void scale(__global float* restrict out, __global const float* restrict a, const long n, const long k) {
  const long i = get_global_id(0);
  if (i < n) out[i] = a[i] * (float)k;
}
"""

ADD_SRC = """
__kernel void add(__global float* restrict out, __global const float* restrict a, __global const float* restrict b) {
  const int i = get_global_id(0);
  out[i] = a[i] + b[i];
}
"""

GRID_SRC = """
__kernel void grid(__global int* restrict out) {
  const int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  const int sx = get_global_size(0), sy = get_global_size(1);
  out[(z * sy + y) * sx + x] = x + 10 * y + 100 * z;
}
"""

NO_PLATFORM_ENV = {"OCL_ICD_VENDORS": "/nonexistent", "OCL_ICD_FILENAMES": ""}


def upload(dev, a: np.ndarray):
    buf = dev.allocator.alloc(a.nbytes)
    dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(a)).cast("B"))
    return buf


def download(dev, buf, shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    dev.allocator.copyout(memoryview(out).cast("B"), buf)
    return out


def program(dev, name: str, src: str):
    return dev.runtime(name, dev.compiler.compile_cached(src))


# --------------------------------------------------------------------------------------------
# probe and doctor
# --------------------------------------------------------------------------------------------

def _run(code: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **extra_env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_probe_gives_a_reason_when_no_platform_is_visible():
    proc = _run("from ember_opencl.plugin import probe; print(repr(probe()))", NO_PLATFORM_ENV)
    assert proc.returncode == 0, proc.stderr
    reason = eval(proc.stdout.strip())
    assert reason is not None and "no OpenCL platform found" in reason
    assert "pip install pocl-binary-distribution" in reason


def test_doctor_reports_cl_unusable_with_the_reason():
    proc = _run("import runpy, sys; sys.argv = ['doctor']; runpy.run_module('ember.doctor', run_name='__main__')",
                NO_PLATFORM_ENV)
    cl_lines = [line for line in proc.stdout.splitlines() if line.strip().startswith("CL ")]
    assert cl_lines, proc.stdout + proc.stderr
    assert "unusable: no OpenCL platform found" in cl_lines[0]
    assert "ember-opencl==" in cl_lines[0]


def test_requesting_cl_without_platform_raises_with_the_reason():
    code = ("from ember.device import Device, DeviceUnavailableError\n"
            "try:\n    Device['CL']\nexcept DeviceUnavailableError as e:\n    print('unavailable:', e)\n")
    proc = _run(code, NO_PLATFORM_ENV)
    assert "unavailable:" in proc.stdout and "no OpenCL platform found" in proc.stdout, proc.stdout + proc.stderr


def test_doctor_shows_cl_usable(cl_available):
    proc = _run("import runpy, sys; sys.argv = ['doctor']; runpy.run_module('ember.doctor', run_name='__main__')", {})
    lines = proc.stdout.splitlines()
    assert any(line.strip().startswith("CL ") and line.rstrip().endswith("usable") for line in lines), proc.stdout
    smoke = [line for line in lines if line.strip().startswith("CL ") and ("ok" in line or "FAILED" in line)]
    assert smoke and smoke[-1].split()[-1] == "ok", proc.stdout


def test_missing_device_index_is_a_clear_error(cl_available):
    from ember_opencl.platforms import enumerate_devices

    from ember.device import Device, DevicePluginError

    n = len(enumerate_devices())
    with pytest.raises(DevicePluginError, match=f"there is no OpenCL device CL:{n}"):
        Device[f"CL:{n}"]


# --------------------------------------------------------------------------------------------
# compiler
# --------------------------------------------------------------------------------------------

def test_compile_returns_a_binary_and_caches(dev):
    before = GlobalCounters.kernels_compiled
    binary = dev.compiler.compile_cached(ADD_SRC)
    assert isinstance(binary, bytes) and len(binary) > 0
    assert dev.compiler.compile_cached(ADD_SRC) is binary
    assert GlobalCounters.kernels_compiled <= before + 1


def test_cachekey_names_platform_device_and_driver(dev):
    key = dev.compiler.cachekey
    assert dev.cl_device.name.strip() in key
    assert dev.cl_device.driver_version.strip() in key
    assert dev.cl_device.platform.name.strip() in key


def test_compile_error_contains_the_build_log(dev):
    bad = "__kernel void broken(__global float* a) { a[0] = undeclared_name_42; }"
    with pytest.raises(CompileError) as info:
        dev.compiler.compile(bad)
    text = str(info.value)
    assert "undeclared_name_42" in info.value.output  # the driver's log names the bad identifier
    assert "OpenCL build failed" in text and "1 | __kernel void broken" in text


def test_compile_error_is_not_cached(dev):
    bad = "__kernel void broken2(__global float* a) { a[0] = ; }"
    for _ in range(2):
        with pytest.raises(CompileError):
            dev.compiler.compile_cached(bad)


def test_binary_from_disk_cache_runs_in_a_new_process(dev, tmp_path):
    code = f"""
import numpy as np
from ember.device import Device
from ember.helpers import GlobalCounters
dev = Device["CL"]
src = {ADD_SRC!r}
prg = dev.runtime("add", dev.compiler.compile_cached(src))
a = np.arange(8, dtype=np.float32)
bufs = [dev.allocator.alloc(32) for _ in range(3)]
dev.allocator.copyin(bufs[1], memoryview(a).cast("B"))
dev.allocator.copyin(bufs[2], memoryview(a).cast("B"))
prg(*bufs, global_size=(8, 1, 1))
out = np.empty(8, np.float32)
dev.allocator.copyout(memoryview(out).cast("B"), bufs[0])
print(GlobalCounters.kernels_compiled, out.tolist() == (a * 2).tolist())
"""
    env = {"EMBER_CACHE_DIR": str(tmp_path)}
    first, second = _run(code, env), _run(code, env)
    assert first.stdout.split() == ["1", "True"], first.stdout + first.stderr
    assert second.stdout.split() == ["0", "True"], second.stdout + second.stderr


# --------------------------------------------------------------------------------------------
# programs
# --------------------------------------------------------------------------------------------

def test_program_with_int_vals_and_timing(dev):
    prg = program(dev, "scale", SCALE_SRC)
    a = np.arange(100, dtype=np.float32)
    src, out = upload(dev, a), dev.allocator.alloc(a.nbytes)
    seconds = prg(out, src, global_size=(128, 1, 1), vals=(100, 3), wait=True)
    assert isinstance(seconds, float) and 0 <= seconds < 10
    np.testing.assert_array_equal(download(dev, out, 100, np.float32), a * 3)
    assert prg(out, src, global_size=(100, 1, 1), vals=(100, -2)) is None  # without wait: queued only
    np.testing.assert_array_equal(download(dev, out, 100, np.float32), a * -2)


def test_program_launch_grid_dimensions(dev):
    prg = program(dev, "grid", GRID_SRC)
    shape = (3, 4, 5)  # z, y, x
    out = dev.allocator.alloc(int(np.prod(shape)) * 4)
    prg(out, global_size=(5, 4, 3), wait=True)
    z, y, x = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
    np.testing.assert_array_equal(download(dev, out, shape, np.int32), x + 10 * y + 100 * z)


def test_program_with_explicit_local_size(dev):
    prg = program(dev, "add", ADD_SRC)
    a = np.arange(64, dtype=np.float32)
    bufs = [dev.allocator.alloc(a.nbytes), upload(dev, a), upload(dev, a)]
    prg(*bufs, global_size=(64, 1, 1), local_size=(16, 1, 1), wait=True)
    np.testing.assert_array_equal(download(dev, bufs[0], 64, np.float32), a * 2)


def test_program_empty_grid_runs_nothing(dev):
    prg = program(dev, "add", ADD_SRC)
    bufs = [dev.allocator.alloc(0) for _ in range(3)]
    assert prg(*bufs, global_size=(0, 1, 1), wait=True) == 0.0


def test_program_rejects_too_few_buffers(dev):
    prg = program(dev, "add", ADD_SRC)
    with pytest.raises(ValueError, match="takes 3 arguments"):
        prg(dev.allocator.alloc(4), global_size=(1, 1, 1))


# --------------------------------------------------------------------------------------------
# allocator
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [0, 1, 7, 4096, 1 << 20])
def test_allocator_round_trip(dev, nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    buf = dev.allocator.alloc(nbytes)
    dev.allocator.copyin(buf, memoryview(data))
    out = np.zeros(nbytes, np.uint8)
    dev.allocator.copyout(memoryview(out), buf)
    np.testing.assert_array_equal(out, data)
    dev.allocator.free(buf, nbytes)


def test_allocator_checks_sizes(dev):
    buf = dev.allocator.alloc(8)
    with pytest.raises(ValueError, match="copyin of 16 bytes"):
        dev.allocator.copyin(buf, memoryview(bytearray(16)))
    with pytest.raises(ValueError, match="copyout of 16 bytes"):
        dev.allocator.copyout(memoryview(bytearray(16)), buf)
    with pytest.raises(ValueError, match="writable"):
        dev.allocator.copyout(memoryview(bytes(4)), buf)
    with pytest.raises(MemoryError, match="largest allocation"):
        dev.allocator._alloc(dev.allocator.max_alloc + 1, None)


def test_allocator_reuses_freed_buffers(dev):
    alloc = dev.allocator
    buf = alloc.alloc(12345)
    alloc.free(buf, 12345)
    assert alloc.alloc(12345) is buf


def test_allocator_free_cache_drops_every_cached_buffer(dev):
    from ember_opencl.allocator import CLAllocator

    alloc = CLAllocator(dev)
    buf = alloc.alloc(256)
    refs = sys.getrefcount(buf.mem)
    alloc.free(buf, 256)
    assert alloc.cached_bytes == 256
    alloc.free_cache()
    assert alloc.cached_bytes == 0 and not any(alloc.cache.values())
    refs_after = sys.getrefcount(buf.mem)
    assert refs_after == refs  # only this test still holds the memory: released when it lets go
    alloc.copyin(buf, memoryview(bytearray(4)))  # still valid while referenced


def test_offset_views_share_memory(dev):
    align = dev.allocator.offset_alignment
    n = 4 * align
    base = upload(dev, np.arange(n, dtype=np.uint8))
    view = dev.allocator.offset(base, align, 2 * align)
    got = np.empty(2 * align, np.uint8)
    dev.allocator.copyout(memoryview(got), view)
    np.testing.assert_array_equal(got, np.arange(align, 3 * align, dtype=np.uint8))
    # writing through the view changes the base
    dev.allocator.copyin(view, memoryview(np.full(align, 255, np.uint8)))
    whole = download(dev, base, n, np.uint8)
    assert (whole[align:2 * align] == 255).all() and whole[0] == 0 and whole[2 * align] == (2 * align) % 256
    # a view of a view is a sub-buffer of the root at the summed offset
    inner = dev.allocator.offset(view, align, align)
    assert inner.root is base and inner.offset == 2 * align
    np.testing.assert_array_equal(download(dev, inner, align, np.uint8), whole[2 * align:3 * align])
    # a kernel writes through a view
    prg = program(dev, "scale", SCALE_SRC)
    floats = upload(dev, np.arange(3 * align, dtype=np.float32))
    out_base = upload(dev, np.zeros(3 * align, np.float32))
    out_view = dev.allocator.offset(out_base, align * 4, align * 4)
    prg(out_view, floats, global_size=(align, 1, 1), vals=(align, 2), wait=True)
    expected = np.zeros(3 * align, np.float32)
    expected[align:2 * align] = np.arange(align) * 2
    np.testing.assert_array_equal(download(dev, out_base, 3 * align, np.float32), expected)


def test_offset_rejects_unaligned_and_out_of_range(dev):
    align = dev.allocator.offset_alignment
    base = dev.allocator.alloc(4 * align)
    if align > 1:
        with pytest.raises(NotImplementedError, match="CL_DEVICE_MEM_BASE_ADDR_ALIGN"):
            dev.allocator.offset(base, 1, 8)
    with pytest.raises(ValueError, match="outside"):
        dev.allocator.offset(base, 2 * align, 4 * align)
    assert dev.allocator.offset(base, 4 * align, 0).nbytes == 0
    assert dev.allocator.offset(base, 3, 0).nbytes == 0  # an empty view needs no alignment


@pytest.mark.parametrize("how", ["objects", "names"])
def test_transfer_on_the_device(dev, how):
    data = np.arange(1000, dtype=np.float32)
    src, dest = upload(dev, data), dev.allocator.alloc(data.nbytes)
    devs = (dev, dev) if how == "objects" else ("CL", "CL")
    dev.allocator.transfer(dest, src, data.nbytes, *devs)
    np.testing.assert_array_equal(download(dev, dest, 1000, np.float32), data)


TWO_DEVICE_SCRIPT = """
import numpy as np
from ember.device import Device
from ember_opencl import device as cl_device_module, platforms
from ember_opencl.device import CLDevice

a, b = Device["CL"], Device["CL:1"]
assert a.context == b.context and a.cl_device != b.cl_device
data = np.arange(256, dtype=np.int32)
src, dest = a.allocator.alloc(data.nbytes), b.allocator.alloc(data.nbytes)
a.allocator.copyin(src, memoryview(data).cast("B"))
b.allocator.transfer(dest, src, data.nbytes, a, b)
out = np.empty_like(data)
b.allocator.copyout(memoryview(out).cast("B"), dest)
print("same context", (out == data).all())

# a device in a context of its own: the copy goes through host memory
cl_device_module.platform_context = lambda platform: platforms.import_pyopencl().Context([b.cl_device])
c = CLDevice("CL:1")
assert c.context != a.context
dest2 = c.allocator.alloc(data.nbytes)
c.allocator.transfer(dest2, src, data.nbytes, a, c)
out[:] = 0
c.allocator.copyout(memoryview(out).cast("B"), dest2)
print("other context", (out == data).all())
"""


def test_transfer_between_two_cl_devices(cl_available):
    from ember_opencl.platforms import enumerate_devices

    env = {}
    if len(enumerate_devices()) < 2:
        if "Portable Computing Language" not in enumerate_devices()[0].platform.name:
            pytest.skip("needs two OpenCL devices")
        env["POCL_DEVICES"] = "pthread pthread"  # PoCL can show two CPU devices in one platform
    proc = _run(TWO_DEVICE_SCRIPT, env)
    assert proc.stdout.splitlines()[:2] == ["same context True", "other context True"], proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------------
# graph
# --------------------------------------------------------------------------------------------

def test_graph_replays_in_order_and_updates(dev):
    from ember_opencl.graph import CLGraph

    add, scale = program(dev, "add", ADD_SRC), program(dev, "scale", SCALE_SRC)
    n = 256
    a, b = np.arange(n, dtype=np.float32), np.ones(n, np.float32)
    ba, bb, tmp, out = upload(dev, a), upload(dev, b), dev.allocator.alloc(n * 4), dev.allocator.alloc(n * 4)
    graph = CLGraph([(add, [tmp, ba, bb], (), (n, 1, 1)), (scale, [out, tmp], (n, 3), (n, 1, 1), None)])
    assert len(graph) == 2
    seconds = graph(wait=True)
    assert isinstance(seconds, float) and seconds >= 0
    np.testing.assert_array_equal(download(dev, out, n, np.float32), (a + b) * 3)
    # replay with a new input buffer and a new int variable
    bc = upload(dev, np.full(n, 10, np.float32))
    graph.update_buffer(0, 2, bc)
    graph.update_vals(1, (n, 5))
    assert graph() is None
    np.testing.assert_array_equal(download(dev, out, n, np.float32), (a + 10) * 5)
    # the program objects themselves are unaffected by the graph's bound arguments
    add(tmp, ba, ba, global_size=(n, 1, 1), wait=True)
    np.testing.assert_array_equal(download(dev, tmp, n, np.float32), a * 2)
    # the same replays with and without holding the kernels until all are queued (GPU and CPU devices)
    for gated in (False, True):
        graph.gated = gated
        graph.update_vals(1, (n, 2 + gated))
        assert graph(wait=True) >= 0
        np.testing.assert_array_equal(download(dev, out, n, np.float32), (a + 10) * (2 + gated))


def test_graph_checks_its_calls(dev):
    from ember_opencl.graph import CLGraph

    add = program(dev, "add", ADD_SRC)
    with pytest.raises(ValueError, match="expected \\(program, bufs, vals, global_size"):
        CLGraph([(add, [], ())])
    with pytest.raises(TypeError, match="expected a CLProgram"):
        CLGraph([(object(), [], (), (1, 1, 1))])
    graph = CLGraph([(add, [dev.allocator.alloc(4)] * 3, (), (1, 1, 1))])
    with pytest.raises(IndexError):
        graph.update_buffer(0, 5, dev.allocator.alloc(4))
    with pytest.raises(ValueError, match="takes 0 int variables"):
        graph.update_vals(0, (1,))
    assert CLGraph([])(wait=True) == 0.0


def test_device_synchronize_and_capabilities(dev):
    dev.synchronize()
    r = dev.renderer
    assert r.device == "CL" and r.has_local
    assert len(r.global_max) == 3 and len(r.local_max) == 3
    assert tuple(r.local_max) == tuple(int(s) for s in dev.cl_device.max_work_item_sizes[:3])
    assert r.shared_max == dev.cl_device.local_mem_size
    from ember.dtype import dtypes

    assert (dtypes.float64 in r.supported_dtypes) == ("cl_khr_fp64" in dev.cl_device.extensions.split())
    assert r.fp16 == ("cl_khr_fp16" in dev.cl_device.extensions.split())


def test_graph_update_vals_binds_64_bit_values(dev):
    """Only the int parameters change on update_vals (the buffers stay bound), as full 64-bit values."""
    from ember_opencl.graph import CLGraph

    scale = program(dev, "scale", SCALE_SRC)
    n = 8
    a = np.arange(n, dtype=np.float32)
    ba, out = upload(dev, a), dev.allocator.alloc(n * 4)
    graph = CLGraph([(scale, [out, ba], (n, 2), (n, 1, 1))])
    graph()
    np.testing.assert_array_equal(download(dev, out, n, np.float32), a * 2)
    # n = 2**32 + 4 as a 32-bit value would be 4: the kernel would write only the first 4 elements
    graph.update_vals(0, (2 ** 32 + 4, 7))
    graph()
    np.testing.assert_array_equal(download(dev, out, n, np.float32), a * 7)
    graph.update_vals(0, (3, 7))  # the same k again, a smaller n: elements past 3 keep the last values
    graph.update_buffer(0, 1, upload(dev, np.ones(n, np.float32)))
    graph()
    np.testing.assert_array_equal(download(dev, out, n, np.float32), [7, 7, 7, *(a[3:] * 7)])
    with pytest.raises(Exception, match="format requires|out of range|too large"):
        graph.update_vals(0, (2 ** 64, 1))


def test_small_copyin_is_queued_and_keeps_its_bytes(dev):
    """A small copyin returns before the copy runs: the source may change at once, and work queued after it
    (kernels, copies out) sees the copied bytes; a large one still blocks."""
    from ember_opencl.allocator import QUEUED_COPYIN_MAX
    from ember_opencl.device import MAX_PENDING

    add = program(dev, "add", ADD_SRC)
    n = 16
    src = np.arange(n, dtype=np.float32)
    a, out = dev.allocator.alloc(n * 4), dev.allocator.alloc(n * 4)
    dev.allocator.copyin(a, memoryview(src).cast("B"))
    assert dev._pending, "a small copyin is queued, its event held by the device"
    src[:] = -1  # the copy was taken from a private copy of the bytes
    add(out, a, a, global_size=(n, 1, 1))
    np.testing.assert_array_equal(download(dev, out, n, np.float32), np.arange(n) * 2)
    dev.synchronize()
    assert not dev._pending
    # many queued copies into one buffer land in order; the device waits for them before holding too many
    for i in range(MAX_PENDING + 3):
        dev.allocator.copyin(a, memoryview(np.full(n, i, np.float32)).cast("B"))
    assert len(dev._pending) < MAX_PENDING
    np.testing.assert_array_equal(download(dev, a, n, np.float32), np.full(n, MAX_PENDING + 2))
    big = np.arange(QUEUED_COPYIN_MAX // 4 + 1, dtype=np.float32)
    b = dev.allocator.alloc(big.nbytes)
    dev.synchronize()
    dev.allocator.copyin(b, memoryview(big).cast("B"))
    assert not dev._pending, "a copy larger than QUEUED_COPYIN_MAX blocks"
    np.testing.assert_array_equal(download(dev, b, big.size, np.float32), big)


def test_graph_replay_releases_its_gate_when_an_enqueue_fails(dev, monkeypatch: pytest.MonkeyPatch):
    """A replay queues its kernels behind a user event; a failed enqueue must still release it, or the queue
    would wait forever."""
    import threading

    import pyopencl as cl
    from ember_opencl.graph import CLGraph

    add = program(dev, "add", ADD_SRC)
    n = 4
    a, out = upload(dev, np.arange(n, dtype=np.float32)), dev.allocator.alloc(n * 4)
    graph = CLGraph([(add, [out, a, a], (), (n, 1, 1)), (add, [out, out, a], (), (n, 1, 1))])
    assert graph.gated == bool(dev.cl_device.type & cl.device_type.CPU)
    graph.gated = True  # what a CPU device (PoCL) does; the ungated replay is test_graph_replays_in_order_and_updates
    real, calls = cl.enqueue_nd_range_kernel, []

    def failing(*args, **kwargs):
        calls.append(kwargs.get("wait_for"))
        if len(calls) == 2:
            raise cl.Error("enqueue failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", failing)
    with pytest.raises(cl.Error, match="enqueue failed"):
        graph()
    assert calls[0] and isinstance(calls[0][0], cl.UserEvent), "the first kernel waits on the gate"
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", real)
    done = threading.Thread(target=dev.synchronize, daemon=True)
    done.start()
    done.join(timeout=30)
    assert not done.is_alive(), "the queue still waits on the replay's gate"
    np.testing.assert_array_equal(download(dev, out, n, np.float32), np.arange(n) * 2)  # the first kernel ran


def test_reading_a_result_waits_once(dev, monkeypatch: pytest.MonkeyPatch):
    """Buffer.copyout on CL queues its blocking read behind the kernels instead of waiting for the queue first:
    the result is complete all the same."""
    from ember.device import Device
    from ember.device.buffer import Buffer
    from ember.dtype import dtypes

    add = program(dev, "add", ADD_SRC)
    n = 1 << 16
    a = Buffer("CL", n, dtypes.float32).copyin(memoryview(np.ones(n, np.float32)).cast("B"))
    out = Buffer("CL", n, dtypes.float32).allocate()
    for _ in range(20):  # a queue of work the read must wait for
        add(out._buf, a._buf, a._buf, global_size=(n, 1, 1))
        add(a._buf, out._buf, a._buf, global_size=(n, 1, 1))
    waits = []
    monkeypatch.setattr(Device["CL"], "synchronize", lambda: waits.append(1))
    got = np.frombuffer(a.as_bytes(), np.float32)
    assert not waits, "the read itself waits for the queue"
    np.testing.assert_array_equal(got, np.full(n, 3.0 ** 20, np.float32))
