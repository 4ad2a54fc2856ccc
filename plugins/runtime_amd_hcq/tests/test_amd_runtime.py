"""The AMD runtime's queue and memory logic, run against the mock KFD.

The mock (``ember_amd.mock_kfd``) checks ioctls, memory maps, PM4/SDMA packets and the
synchronization between queues, events and the host, and runs each dispatch's kernel on the CPU
through PoCL. It checks packets and synchronization, not the GPU's instructions: nothing here runs
on an AMD GPU.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("pyopencl", reason="the mock runs kernels through PyOpenCL + PoCL")

from ember_amd import pm4  # noqa: E402
from ember_amd.device import AMDDevice  # noqa: E402
from ember_amd.mock_kfd import MockKFD  # noqa: E402
from ember_amd.renderer import PRELUDE_BEGIN, PRELUDE_END  # noqa: E402
from ember_amd.signals import AMDSignal  # noqa: E402
from ember_amd.toolchain import toolchain_problem  # noqa: E402

from ember.device import Exec, HCQTimeoutError  # noqa: E402

ARCH = "gfx1100"
# a kernel written the way the renderer writes them: ids through the prelude's macros, so the mock's host
# build (the prelude spelled with OpenCL built-ins) is the same kernel
KERNEL = f"""{PRELUDE_BEGIN}
#define EMBER_KERNEL __kernel
#define EMBER_GLOBAL_ID(d) (__builtin_amdgcn_workgroup_id_x() * __builtin_amdgcn_workgroup_size_x() + \\
                            __builtin_amdgcn_workitem_id_x())
{PRELUDE_END}
EMBER_KERNEL void scale_add(__global int* restrict out, __global const int* restrict a, int m) {{
  int i = (int)EMBER_GLOBAL_ID(0);
  out[i] = a[i] * m + i;
}}
"""


@pytest.fixture
def dev():
    d = AMDDevice("AMD", osif=MockKFD(ARCH))
    yield d
    d.finalize()


@pytest.fixture
def kernel_lib():
    problem = toolchain_problem(ARCH)
    if problem:
        pytest.skip(problem)
    from ember_amd.compiler import AMDCompiler

    return AMDCompiler(ARCH).compile(KERNEL)


def _upload(dev: AMDDevice, array: np.ndarray):
    buf = dev.allocator.alloc(array.nbytes)
    dev.allocator.copyin(buf, memoryview(array))
    return buf


def _download(dev: AMDDevice, buf, like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    dev.allocator.copyout(memoryview(out), buf)
    return out


def test_host_device_copies_go_through_sdma(dev):
    mock = dev.os
    for n in (1, 4095, 1 << 20):
        x = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
        before = mock.copied
        buf = _upload(dev, x)
        np.testing.assert_array_equal(_download(dev, buf, x), x)
        assert mock.copied - before == 2 * n  # in and out, both by SDMA COPY_LINEAR packets
    assert mock.errors == []


def test_transfer_on_one_gpu_is_one_sdma_copy(dev):
    x = np.arange(1000, dtype=np.float32)
    a, b = _upload(dev, x), dev.allocator.alloc(x.nbytes)
    dev.allocator.transfer(b, a, x.nbytes, dev, dev)
    np.testing.assert_array_equal(_download(dev, b, x), x)


def test_signal_orders_compute_after_copy(dev):
    """A compute queue waiting on a signal only runs once the copy queue wrote it, whatever the submit order."""
    ready, done = dev.new_signal("copy done"), dev.new_signal("compute done")
    x = np.arange(256, dtype=np.int32)
    src, dst = _upload(dev, x), dev.allocator.alloc(x.nbytes)
    dev.compute_queue().wait(ready, 1).signal(done, 7).submit(dev)
    time.sleep(0.05)
    assert done.value == 0  # still waiting for the copy queue
    q = dev.copy_queue()
    q.copy(dst, src, x.nbytes)
    q.signal(ready, 1).submit(dev)
    done.wait(7, timeout=10)
    assert ready.value == 1
    np.testing.assert_array_equal(_download(dev, dst, x), x)


def test_wait_that_never_completes_raises_naming_the_signal(dev):
    never, after = dev.new_signal("never written"), dev.new_signal("after it")
    with pytest.raises(HCQTimeoutError, match="never written did not reach 1"):
        never.wait(1, timeout=0.1)
    dev.compute_queue().wait(never, 1).signal(after, 1).submit(dev)
    with pytest.raises(HCQTimeoutError, match="after it did not reach 1 .* holds 0"):
        after.wait(1, timeout=0.2)
    never.set(1)  # the host releases the queue; the device goes on
    after.wait(1, timeout=10)


def test_timeline_grows_and_wraps(dev):
    values = [dev.submit_and_signal(dev.compute_queue() if i % 2 else dev.copy_queue()) for i in range(6)]
    assert values == sorted(values) and len(set(values)) == 6
    dev.synchronize()
    assert dev.timeline.signal.value == values[-1]
    dev.timeline.limit = dev.timeline.value + 1  # the next-but-one submission wraps the 32-bit signal
    v1, v2 = dev.submit_and_signal(dev.compute_queue()), dev.submit_and_signal(dev.compute_queue())
    assert v2 == 1 and v1 > v2
    dev.synchronize()
    assert dev.timeline.signal.value == 1


def test_timestamps_come_from_the_queues(dev):
    a, b = dev.new_signal("a"), dev.new_signal("b")
    dev.compute_queue().timestamp(a).memory_barrier().timestamp(b).signal(b, 1).submit(dev)
    b.wait(1, timeout=10)
    assert 0 < a.timestamp_ns <= b.timestamp_ns
    c = dev.new_signal("c")
    dev.copy_queue().timestamp(c).signal(c, 1).submit(dev)
    c.wait(1, timeout=10)
    assert c.timestamp_ns >= b.timestamp_ns


def test_dispatch_runs_the_kernel_with_hidden_args_checked(dev, kernel_lib):
    prg = dev._program("scale_add", kernel_lib)
    x = np.arange(1024, dtype=np.int32)
    a, out = _upload(dev, x), dev.allocator.alloc(x.nbytes)
    seconds = prg(out, a, global_size=(1024, 1, 1), local_size=(64, 1, 1), vals=(3,), wait=True)
    assert seconds is not None and seconds >= 0
    np.testing.assert_array_equal(_download(dev, out, x), x * 3 + np.arange(1024))
    prg(out, a, global_size=(1024, 1, 1), vals=(5,))  # the runtime picks the work-group size
    np.testing.assert_array_equal(_download(dev, out, x), x * 5 + np.arange(1024))
    # the same argument block in another launch shape: its hidden arguments are rewritten (the mock checks them)
    dev.allocator.copyin(out, memoryview(np.zeros_like(x)))
    prg(out, a, global_size=(512, 1, 1), local_size=(32, 1, 1), vals=(5,))
    np.testing.assert_array_equal(_download(dev, out, x)[:512], x[:512] * 5 + np.arange(512))
    assert (_download(dev, out, x)[512:] == 0).all()
    assert dev.os.dispatches == 3 and dev.os.errors == []


def test_graph_replay_with_patched_args(dev, kernel_lib):
    prg = dev._program("scale_add", kernel_lib)
    x, y = np.arange(512, dtype=np.int32), np.arange(512, dtype=np.int32)[::-1].copy()
    a, b = _upload(dev, x), _upload(dev, y)
    out1, out2 = dev.allocator.alloc(x.nbytes), dev.allocator.alloc(x.nbytes)
    graph = dev._graph([(prg, [out1, a], [2], (512, 1, 1), (128, 1, 1)),
                        (prg, [out2, out1], [1], (512, 1, 1), None)])
    assert graph(wait=True) is not None
    np.testing.assert_array_equal(_download(dev, out2, x), (x * 2 + np.arange(512)) + np.arange(512))
    graph.update_buffer(0, 1, b)
    graph.update_vals(1, [10])
    graph()
    dev.synchronize()
    np.testing.assert_array_equal(_download(dev, out2, x), (y * 2 + np.arange(512)) * 10 + np.arange(512))
    with pytest.raises(ValueError, match="takes 1 runtime values"):
        graph.update_vals(0, [1, 2])


def test_two_dispatches_without_a_flush_fault(dev, kernel_lib):
    """Dispatches of one queue may overlap on a GPU unless a flush separates them: the mock refuses that."""
    prg = dev._program("scale_add", kernel_lib)
    x = np.arange(64, dtype=np.int32)
    a, out = _upload(dev, x), dev.allocator.alloc(x.nbytes)
    words = dev._encode_exec(Exec(prg.kernel, prg.make_args([out, a], [3]), (64, 1, 1), (64, 1, 1)))
    assert words[-2:] == pm4.cs_partial_flush()
    dev.rings["compute"].submit(words[:-2] + words[:-2])
    deadline = time.monotonic() + 10
    while not dev.os.errors and time.monotonic() < deadline:
        time.sleep(0.005)
    assert dev.os.errors and "could overlap" in dev.os.errors[-1]
    assert dev.os.dispatches == 1


def test_signals_of_another_device_are_refused(dev):
    other_dev = AMDDevice("AMD", osif=MockKFD(ARCH))
    other = AMDSignal(other_dev, "foreign")
    with pytest.raises(TypeError, match="this device's AMDSignal"):
        dev.compute_queue().signal(other, 1).submit(dev)
    other_dev.finalize()


def test_context_save_sizes_follow_the_drivers_formula():
    """Without the sizes in the topology, the runtime computes what the driver requires (worked by hand in
    the mock: 96 CUs of 32 waves on gfx1100)."""
    from ember_amd.device import context_save_sizes
    from ember_amd.mock_kfd import MOCK_CTL_STACK, MOCK_CWSR, MOCK_PROPERTIES

    ctl, ctx, total = context_save_sizes("gfx1100", dict(MOCK_PROPERTIES["gfx1100"]))
    assert (ctl, ctx) == (MOCK_CTL_STACK, MOCK_CWSR)
    assert total == ctx + 96 * 32 * 32  # plus 32 bytes of debugger memory per wave


def test_wave64_target_dispatches():
    """gfx942 (wave64, gfx9 packets: 6-dword ACQUIRE_MEM, no SDMA GCR) through the same runtime."""
    problem = toolchain_problem("gfx942")
    if problem:
        pytest.skip(problem)
    from ember_amd.compiler import AMDCompiler

    d = AMDDevice("AMD", osif=MockKFD("gfx942"))
    try:
        prg = d._program("scale_add", AMDCompiler("gfx942").compile(KERNEL))
        assert not prg.kernel.wave32
        x = np.arange(300, dtype=np.int32)
        a, out = _upload(d, x), d.allocator.alloc(x.nbytes)
        prg(out, a, global_size=(300, 1, 1), vals=(-2,))
        np.testing.assert_array_equal(_download(d, out, x), x * -2 + np.arange(300))
        assert d.os.errors == []
    finally:
        d.finalize()


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_signal_writes_raise_the_kfd_event(arch):
    """Host waits sleep in WAIT_EVENTS: each signal write must raise the device's event (gfx9 interrupts carry
    no event id, so the driver finds it by its slot in the event page)."""
    d = AMDDevice("AMD", osif=MockKFD(arch))
    try:
        s = d.new_signal("s")
        assert not d.wait_event(20)  # nothing pending: the wait times out
        d.compute_queue().signal(s, 1).submit(d)
        assert d.wait_event(5000) and s.value == 1
        d.copy_queue().signal(s, 2).submit(d)
        assert d.wait_event(5000) and s.value == 2
        assert not d.wait_event(20)  # auto-reset: one interrupt, one wake-up
    finally:
        d.finalize()


def test_out_of_vram_is_a_memory_error_naming_the_ioctl(dev):
    too_big = dev.node.prop("local_mem_size") + (1 << 30)
    with pytest.raises(MemoryError, match="AMDKFD_IOC_ALLOC_MEMORY_OF_GPU failed: errno 12 ENOMEM.*out of VRAM"):
        dev.allocator.alloc(too_big)
    buf = dev.allocator.alloc(1 << 20)  # the failed attempt left nothing behind
    dev.allocator.free(buf, 1 << 20)


def test_a_dropped_signal_is_not_reused_while_queued_work_may_write_it(dev):
    gate = dev.new_signal("gate")
    doomed = dev.new_signal("doomed")
    address = doomed.address
    q = dev.compute_queue().wait(gate, 1).signal(doomed, 5)
    value = dev.submit_and_signal(q)
    del q, doomed
    import gc

    gc.collect()
    fresh = [dev.new_signal(f"fresh {i}") for i in range(4)]
    assert address not in {s.address for s in fresh}  # the queue may still write the old slot
    gate.set(1)
    dev.timeline.signal.wait(value, timeout=10)
    assert address in {dev.new_signal(f"later {i}").address for i in range(4)}  # reused once it passed
