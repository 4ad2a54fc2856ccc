"""A first look at ember: lazy tensors, fused kernels, and the device they run on."""
from __future__ import annotations

import time

import numpy as np

from ember import Device, GlobalCounters, Tensor


def main() -> None:
    print(f"default device: {Device.DEFAULT} (available: {', '.join(Device.available())})")
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((512, 256), dtype=np.float32)
    w_np = rng.standard_normal((256, 128), dtype=np.float32)
    x, w = Tensor(x_np).realize(), Tensor(w_np).realize()

    GlobalCounters.reset()
    st = time.perf_counter()
    y = ((x @ w).relu() * 0.5 + 1).sum(axis=1)  # nothing runs yet: this only builds a graph
    out = y.numpy()
    took = time.perf_counter() - st
    ref = (np.maximum(x_np @ w_np, 0) * 0.5 + 1).sum(axis=1)
    print(f"matmul + relu + scale + row sum: {GlobalCounters.kernel_count} kernels, {took * 1e3:.1f} ms "
          f"(compiled {GlobalCounters.kernels_compiled}), max abs error vs numpy {np.abs(out - ref).max():.2e}")
    assert np.allclose(out, ref, rtol=1e-4, atol=1e-3)


if __name__ == "__main__":
    main()
