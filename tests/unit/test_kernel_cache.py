"""The process's compiled kernels are bounded: a long run that keeps building new kernels unloads the least
recently used ones (a CPU kernel is a shared library; a process can map only so many) and stays correct."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from ember import GlobalCounters, Tensor
from ember.engine import realize
from ember.engine.realize import KernelCache


def test_least_recently_used_goes_first():
    cache = KernelCache(maxsize=2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1  # a is now the most recently used
    cache["c"] = 3
    assert list(cache) == ["a", "c"]
    assert cache.get("b") is None and cache.get("b", 7) == 7
    unbounded = KernelCache(maxsize=0)
    for i in range(100):
        unbounded[i] = i
    assert len(unbounded) == 100


def test_bounded_cache_unloads_and_rebuilds(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(realize, "method_cache", KernelCache(maxsize=3))
    a = np.arange(12, dtype=np.float32)
    x = Tensor(a).realize()
    (x * 2.5 + 1).realize()
    first = next(iter(realize.method_cache.values()))
    gone = weakref.ref(first)
    del first
    for k in range(1, 8):  # kernels of new shapes push the first one out
        np.testing.assert_allclose((x[:k + 2] * 2.5 + 1).numpy(), a[:k + 2] * 2.5 + 1)
    assert len(realize.method_cache) <= 3
    gc.collect()
    assert gone() is None, "an evicted kernel that nothing uses is released (its library unloaded)"
    GlobalCounters.reset()
    np.testing.assert_allclose((x * 2.5 + 1).numpy(), a * 2.5 + 1)  # built again, from the disk cache


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="counts memory mappings (Linux)")
def test_many_kernels_keep_the_mapping_count_flat(monkeypatch: pytest.MonkeyPatch):
    """Each CPU kernel library costs the process about five memory mappings; with the bound, building 60 new
    kernels leaves only the bound's worth loaded (unbounded, the fuzzer's 30,000 kernels ran out of mappings)."""
    from ember import Device

    if Device.DEFAULT != "CPU":
        pytest.skip("the mapping count is a CPU-device property")
    monkeypatch.setattr(realize, "method_cache", KernelCache(maxsize=5))
    x = Tensor(np.arange(100, dtype=np.float32)).realize()
    (x * 1.5).realize()

    def maps() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    before = maps()
    for k in range(1, 61):
        (x[:k] * 1.5 + 2).realize()
    gc.collect()
    assert maps() - before < 5 * 10, "kernel libraries stay loaded after eviction"
