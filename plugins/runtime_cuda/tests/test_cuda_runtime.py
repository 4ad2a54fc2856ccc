"""The CUDA device on a GPU: memory, copies, launches, timing, graphs, and ops against numpy.

Every test here needs an NVIDIA GPU and skips with "no CUDA device: <reason>" without one.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from ember_cuda.allocator import STAGING_CHUNK, CUDABuffer

from ember import Tensor, dtypes
from ember.device.compiler import CompileError

SRC_SCALE = """extern "C" __global__ void scale(const long long n_arg, float* __restrict__ data0,
                                     float* __restrict__ data1) {
  const long long n = n_arg;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    data0[i] = data1[i] * 3.0f;
}
"""


def upload(dev, a: np.ndarray) -> CUDABuffer:
    buf = dev.allocator.alloc(a.nbytes)
    dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(a)).cast("B"))
    return buf


def download(dev, buf: CUDABuffer, like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    dev.allocator.copyout(memoryview(out).cast("B"), buf)
    return out


def test_device_reports_its_gpu(cuda_device):
    r = cuda_device.renderer
    assert r.compute_capability >= (7, 5) and r.warp_size == 32 and r.max_threads_per_block >= 1024
    # a CUBIN for the GPU's own architecture, or PTX when NVRTC is older than the GPU
    assert cuda_device.compiler.target == r.arch or cuda_device.compiler.target.startswith("compute_")


@pytest.mark.parametrize("nbytes", [0, 4, 1 << 20, 2 * STAGING_CHUNK + 12])
def test_copy_round_trip(cuda_device, nbytes):
    a = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    buf = upload(cuda_device, a)
    np.testing.assert_array_equal(download(cuda_device, buf, a), a)
    cuda_device.allocator.free(buf, nbytes)


def test_offset_views_share_memory(cuda_device):
    a = np.arange(64, dtype=np.float32)
    buf = upload(cuda_device, a)
    view = cuda_device.allocator.offset(buf, 40, 16)
    np.testing.assert_array_equal(download(cuda_device, view, a[10:14]), a[10:14])
    cuda_device.allocator.copyin(view, memoryview(np.full(4, -1, np.float32)).cast("B"))
    expect = a.copy()
    expect[10:14] = -1
    np.testing.assert_array_equal(download(cuda_device, buf, a), expect)
    with pytest.raises(ValueError, match="outside a buffer of 256 bytes"):
        cuda_device.allocator.offset(buf, 250, 16)


def test_device_to_device_transfer(cuda_device):
    a = np.arange(1000, dtype=np.float32)
    src, dst = upload(cuda_device, a), cuda_device.allocator.alloc(a.nbytes)
    cuda_device.allocator.transfer(dst, src, a.nbytes, cuda_device, cuda_device)
    np.testing.assert_array_equal(download(cuda_device, dst, a), a)


def test_peer_transfer_between_gpus(cuda_device):
    from ember_cuda.driver import gpu_count

    from ember.device import Device

    if gpu_count() < 2:
        pytest.skip("needs two GPUs")
    other = Device["CUDA:1"]
    a = np.arange(1 << 16, dtype=np.float32)
    src, dst = upload(cuda_device, a), other.allocator.alloc(a.nbytes)
    other.allocator.transfer(dst, src, a.nbytes, cuda_device, other)
    np.testing.assert_array_equal(download(other, dst, a), a)


def test_launch_with_int_variable_and_timing(cuda_device):
    binary = cuda_device.compiler.compile_cached(SRC_SCALE)
    prg = cuda_device.runtime("scale", binary)
    a = np.random.default_rng(1).standard_normal(100_000).astype(np.float32)
    src, dst = upload(cuda_device, a), cuda_device.allocator.alloc(a.nbytes)
    seconds = prg(dst, src, global_size=(a.size, 1, 1), vals=(a.size,), wait=True)
    assert isinstance(seconds, float) and 0 < seconds < 1
    np.testing.assert_array_equal(download(cuda_device, dst, a), a * 3)
    assert prg(dst, src, global_size=(0, 1, 1), vals=(0,), wait=True) == 0.0  # an empty grid runs nothing


def test_graph_replays_and_swaps_buffers(cuda_device):
    prg = cuda_device.runtime("scale", cuda_device.compiler.compile_cached(SRC_SCALE))
    a = np.arange(4096, dtype=np.float32)
    x, y, z = upload(cuda_device, a), cuda_device.allocator.alloc(a.nbytes), cuda_device.allocator.alloc(a.nbytes)
    graph = cuda_device.graph([(prg, [y, x], (a.size,), (a.size, 1, 1)), (prg, [z, y], (a.size,), (a.size, 1, 1))])
    assert graph(wait=True) > 0
    np.testing.assert_array_equal(download(cuda_device, z, a), a * 9)
    x2 = upload(cuda_device, a + 1)
    graph.update_buffer(0, 1, x2)
    graph.update_vals(1, (a.size // 2,))  # the second kernel now scales only the first half
    graph()
    cuda_device.synchronize()
    got = download(cuda_device, z, a)
    np.testing.assert_array_equal(got[: a.size // 2], (a[: a.size // 2] + 1) * 9)
    np.testing.assert_array_equal(got[a.size // 2:], a[a.size // 2:] * 9)


def test_compile_error_on_the_device(cuda_device):
    with pytest.raises(CompileError, match="could not compile"):
        cuda_device.compiler.compile(SRC_SCALE.replace("3.0f", "three"))


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32])
def test_ops_match_numpy(cuda_device, dt):
    rng = np.random.default_rng(2)
    a_np, b_np = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 32)).astype(np.float32)
    a, b = Tensor(a_np, device="CUDA").cast(dt), Tensor(b_np, device="CUDA").cast(dt)
    ref_a = Tensor(a_np, device="PYTHON").cast(dt)
    ref_b = Tensor(b_np, device="PYTHON").cast(dt)
    tol = {dtypes.float16: 2e-2, dtypes.bfloat16: 5e-2}.get(dt, 1e-5)
    for fn in (lambda x, y: (x @ y).cast(dtypes.float32), lambda x, y: (x * 2 + 1).sum(axis=0).cast(dtypes.float32),
               lambda x, y: x.max(axis=1).cast(dtypes.float32)):
        np.testing.assert_allclose(fn(a, b).numpy(), fn(ref_a, ref_b).numpy(), rtol=tol, atol=tol * 10)


def test_jit_replays_through_a_cuda_graph(cuda_device):
    from ember import TinyJit

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x * 2).relu() + 1).sum(axis=1).realize()

    for i in range(4):
        x_np = np.random.default_rng(i).standard_normal((128, 64)).astype(np.float32)
        np.testing.assert_allclose(step(Tensor(x_np, device="CUDA")).numpy(),
                                   (np.maximum(x_np * 2, 0) + 1).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_conformance_suite_passes_on_cuda(cuda_device):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "--pyargs", "ember.testing", "--device=CUDA"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
