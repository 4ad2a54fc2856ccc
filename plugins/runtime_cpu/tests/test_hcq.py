"""The HCQ layer (ember.device.hcq) on the CPU device's command queues (``CPU_HCQ=1``).

These check queue semantics — ordering through signals, blocking waits, the timeline wrapping,
timeouts, copy/compute overlap on separate engines, graph replay with patched arguments — on
the CPU implementation, where the "hardware" is two worker threads.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ember.device.hcq import HCQCommandError, HCQTimeoutError, HostSignal, Timeline
from ember_cpu.hcq import CPUHCQDevice, CPUKernelArgs
from ember_cpu.toolchain import find_compilers

pytestmark = pytest.mark.skipif(not find_compilers(), reason="no C compiler found")

N = 1024
SCALE_SRC = """void scale(void **bufs, const long long *vals) {
  int *out = (int *)bufs[0]; const int *in = (const int *)bufs[1];
  for (long long i = 0; i < vals[0]; i++) out[i] = in[i] * 2 + (int)vals[1];
}
"""
SLOW_SRC = """void slow(void **bufs, const long long *vals) {
  volatile double *acc = (volatile double *)bufs[0];
  for (long long i = 0; i < vals[0]; i++) acc[0] += 1.0;
}
"""


@pytest.fixture(scope="module")
def dev():
    d = CPUHCQDevice("CPU:9")
    yield d
    d.finalize()


def program(dev, name, src):
    return dev.runtime(name, dev.compiler.compile_cached(src))


def buffer_of(dev, array: np.ndarray):
    buf = dev.allocator.alloc(array.nbytes)
    dev.allocator.copyin(buf, memoryview(array).cast("B"))
    return buf


def read(dev, buf, dtype, n):
    out = np.empty(n, dtype)
    dev.allocator.copyout(memoryview(out).cast("B"), buf)
    return out


def test_kernel_runs_through_the_compute_queue(dev):
    x = np.arange(N, dtype=np.int32)
    prg = program(dev, "scale", SCALE_SRC)
    out = dev.allocator.alloc(N * 4)
    elapsed = prg(out, buffer_of(dev, x), vals=(N, 5), wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    np.testing.assert_array_equal(read(dev, out, np.int32, N), x * 2 + 5)


def test_signal_orders_work_across_two_queues(dev):
    """The copy engine waits for a signal the compute engine writes after its kernel."""
    x = np.arange(N, dtype=np.int32)
    prg = program(dev, "scale", SCALE_SRC)
    src, mid, dst = buffer_of(dev, x), dev.allocator.alloc(N * 4), dev.allocator.alloc(N * 4)
    done, copied = dev.new_signal("kernel done"), dev.new_signal("copied")
    # submitted copy-first: without the wait it would copy stale memory
    dev.copy_queue().wait(done, 1).copy(dst, mid, N * 4).signal(copied, 1).submit(dev)
    time.sleep(0.01)
    assert copied.value == 0  # still blocked on the kernel's signal
    dev.compute_queue().exec(prg.kernel, CPUKernelArgs([mid, src], [N, 1]), (1, 1, 1)).signal(done, 1).submit(dev)
    copied.wait(1, timeout=10)
    np.testing.assert_array_equal(np.frombuffer(dev.allocator.as_buffer(dst), np.int32), x * 2 + 1)


@pytest.mark.parametrize("native", [False, True])
def test_wait_blocks_until_a_later_signal(dev, native):
    sig = dev.new_signal("late") if native else HostSignal("TEST", "late")
    released = threading.Event()

    def waiter():
        sig.wait(3, timeout=10)
        released.set()

    t = threading.Thread(target=waiter)
    t.start()
    sig.set(2)
    assert not released.wait(0.05)
    sig.set(3)
    assert released.wait(5)
    t.join()


@pytest.mark.parametrize("native", [False, True])
def test_timeout_raises_naming_device_signal_and_values(dev, native):
    sig = dev.new_signal("stuck", 4) if native else HostSignal("CPU:9", "stuck", value=4)
    start = time.monotonic()
    with pytest.raises(HCQTimeoutError, match=r"CPU:9: stuck did not reach 7 .* holds 4"):
        sig.wait(7, timeout=0.05)
    assert time.monotonic() - start < 30  # (it ends at its limit, it does not hang; slack for a loaded machine)


def test_hung_queue_does_not_hang_synchronize(dev):
    never = dev.new_signal("never")
    dev.submit_and_signal(dev.compute_queue().wait(never, 1))
    saved = dev.timeout
    dev.timeout = 0.1
    try:
        with pytest.raises(HCQTimeoutError, match="timeline"):
            dev.synchronize()
    finally:
        dev.timeout = saved
        never.set(1)  # release the engine
    dev.synchronize()


def test_a_command_the_engine_cannot_run_is_refused_at_submit(dev):
    sig = dev.new_signal("after bad exec")
    with pytest.raises(TypeError, match="compiled CPU kernel"):
        dev.compute_queue().exec(object(), CPUKernelArgs([]), (1, 1, 1)).signal(sig, 1).submit(dev)
    assert sig.value == 0  # nothing of the queue was published


def test_failed_signal_raises_at_the_next_wait():
    sig = HostSignal("TEST", "after failure")
    sig.fail(ValueError("bad launch"))
    with pytest.raises(HCQCommandError, match="after failure.*bad launch"):
        sig.wait(1, timeout=1)


def test_timeline_wraps_around(dev):
    x = np.arange(N, dtype=np.int32)
    prg = program(dev, "scale", SCALE_SRC)
    out, inp = dev.allocator.alloc(N * 4), buffer_of(dev, x)
    dev.synchronize()
    saved = dev.timeline
    dev.timeline = Timeline(dev.new_signal("small timeline"), limit=5)
    try:
        for k in range(12):
            prg(out, inp, vals=(N, k))
            assert dev.timeline.value <= 5
        dev.synchronize()
        np.testing.assert_array_equal(read(dev, out, np.int32, N), x * 2 + 11)
    finally:
        dev.synchronize()
        dev.timeline = saved


def test_copies_overlap_with_compute(dev):
    """A long kernel on the compute engine does not hold back the copy engine."""
    slow = program(dev, "slow", SLOW_SRC)
    acc = buffer_of(dev, np.zeros(1, np.float64))
    kernel_done, copy_done = dev.new_signal("slow done"), dev.new_signal("copy done")
    dev.compute_queue().timestamp(kernel_done).exec(slow.kernel, CPUKernelArgs([acc], [30_000_000]), (1, 1, 1)) \
        .timestamp(kernel_done).signal(kernel_done, 1).submit(dev)
    x = np.arange(N, dtype=np.int32)
    a, b = buffer_of(dev, x), dev.allocator.alloc(N * 4)
    dev.copy_queue().copy(b, a, N * 4).timestamp(copy_done).signal(copy_done, 1).submit(dev)
    copy_done.wait(1, timeout=30)
    kernel_done.wait(1, timeout=60)
    assert copy_done.timestamp_ns < kernel_done.timestamp_ns  # the copy finished while the kernel ran
    np.testing.assert_array_equal(np.frombuffer(dev.allocator.as_buffer(b), np.int32), x)


def test_graph_replays_with_patched_buffers_and_values(dev):
    x, y = np.arange(N, dtype=np.int32), np.arange(N, dtype=np.int32)[::-1].copy()
    prg = program(dev, "scale", SCALE_SRC)
    a, b = buffer_of(dev, x), buffer_of(dev, y)
    mid, out = dev.allocator.alloc(N * 4), dev.allocator.alloc(N * 4)
    graph = dev.graph([(prg, [mid, a], (N, 3)), (prg, [out, mid], (N, -1))])
    assert graph(wait=True) >= 0
    np.testing.assert_array_equal(read(dev, out, np.int32, N), (x * 2 + 3) * 2 - 1)
    for k in range(5):
        graph.update_buffer(0, 1, b if k % 2 == 0 else a)
        graph.update_vals(1, (N, k))
        graph()
        want = ((y if k % 2 == 0 else x) * 2 + 3) * 2 + k
        np.testing.assert_array_equal(read(dev, out, np.int32, N), want)
    with pytest.raises(ValueError, match="runtime values"):
        graph.update_vals(0, (1,))


def test_profile_trace_is_valid_trace_event_json(tmp_path):
    """PROFILE=1 on the main job's first epoch (make demo's script) in HCQ mode: valid trace-event JSON with kernel
    names and the device, and no overlapping spans on either engine."""
    path = tmp_path / "trace.json"
    script = pathlib.Path(__file__).resolve().parents[3] / "examples" / "train_digits.py"
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("the digits data come with scikit-learn (pip install scikit-learn)")
    env = dict(os.environ, CPU_HCQ="1", PROFILE="1", PROFILE_PATH=str(path), DEV="CPU",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, str(script), "--epochs", "1", "--no-save"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    kernels = [e for e in events if e["tid"] == "compute"]
    assert kernels and all(e["ph"] == "X" and e["pid"] == "CPU" and e["dur"] >= 0 for e in events)
    assert any(e["name"].startswith("r_") for e in kernels) and any(e["name"].startswith("E_") for e in kernels)
    assert any(e["tid"] == "copy" and e["name"].startswith("copy") for e in events)
    for engine in ("compute", "copy"):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == engine)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-3, f"overlapping spans on the {engine} queue"
