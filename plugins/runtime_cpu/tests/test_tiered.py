"""Tiered compilation on the CPU (``TIERED=1``): new kernels run from a quick -O1 build, then the optimized one.

Each test makes kernels no other test makes (odd constants), so they are new to the process and the cache.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from ember import Device, Tensor, TinyJit
from ember.engine import realize, tiers
from ember.engine.realize import CompiledRunner
from ember_cpu.compiler import BASE_FLAGS, QUICK_FLAGS, CPUCompiler, find_cc

pytestmark = pytest.mark.skipif(find_cc() is None, reason="no C compiler found")


@pytest.fixture
def tiered(tmp_path, monkeypatch):
    """TIERED=1 with an empty cache; yields the runners sent to be upgraded (as they are sent)."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TIERED", "1")
    sent: list[CompiledRunner] = []
    real = tiers.upgrade_later
    monkeypatch.setattr(tiers, "upgrade_later", lambda compiler, runners: sent.extend(runners) or real(compiler,
                                                                                                      runners))
    yield sent
    tiers.apply(wait=True)  # leave nothing under way for the next test


def test_the_quick_tier_is_another_build_with_its_own_cache_key():
    c = CPUCompiler()
    quick = c.quick_tier()
    assert quick is not None and quick.quick_tier() is None and c.quick_tier() is quick
    assert quick.flags[:len(QUICK_FLAGS)] == QUICK_FLAGS and c.flags[:len(BASE_FLAGS)] == BASE_FLAGS
    assert quick.cachekey != c.cachekey and "-O1" in quick.cachekey
    low = c.background()  # same binaries, so the same entries: only the priority differs
    assert low.cachekey == c.cachekey and low.flags == c.flags and low.launcher[1:] in ((), ("-n", "19"))


def test_new_kernels_start_quick_and_switch_to_the_optimized_build(tiered):
    compiler = Device["CPU"].compiler
    x_np = np.linspace(-2, 2, 35, dtype=np.float32).reshape(5, 7)
    want = np.exp(x_np * np.float32(1.4140625) + np.float32(0.28125)).sum(1)
    x = Tensor(x_np, device="CPU")
    out = (x * 1.4140625 + 0.28125).exp().sum(1)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)
    (runner,) = [r for r in tiered if "1.4140625" in r.spec.src]
    quick = compiler.quick_tier()
    assert quick is not None and runner.binary == quick.cached(runner.spec.src)  # ran from the -O1 build
    assert tiers.apply(wait=True) >= 1 and not tiers.pending
    optimized = compiler.cached(runner.spec.src)  # the background build filled the cache (for later processes)
    # (the two builds of so small a kernel may be the same bytes: clang 14 makes the same code at -O1 and -O2)
    assert optimized is not None and runner.binary == optimized
    again = (x * 1.4140625 + 0.28125).exp().sum(1)
    np.testing.assert_allclose(again.numpy(), want, rtol=1e-5)


def test_a_kernel_already_optimized_in_the_cache_never_runs_quick(tiered):
    x = Tensor(np.arange(13, dtype=np.float32), device="CPU")
    (x * 2.0546875).sin().realize()
    assert len(tiered) == 1
    tiers.apply(wait=True)
    # as in a new process: the kernel is looked up again and its optimized binary found in the cache
    for key in [k for k, r in realize.method_cache.items() if "2.0546875" in r.spec.src]:
        del realize.method_cache[key]
    out = (x * 2.0546875).sin().numpy()
    assert len(tiered) == 1
    np.testing.assert_allclose(out, np.sin(np.arange(13, dtype=np.float32) * np.float32(2.0546875)), atol=1e-6)


def test_a_jit_captured_on_quick_builds_replays_the_optimized_ones(tiered):
    w_np = np.linspace(-1, 1, 45, dtype=np.float32).reshape(5, 9)
    w = Tensor(w_np, device="CPU").realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return ((x @ w) * 1.7890625).relu().realize()

    xs = [np.linspace(-3 + i, 3, 15, dtype=np.float32).reshape(3, 5) for i in range(5)]
    for x_np in xs[:3]:  # run, capture, replay: all on the quick builds
        np.testing.assert_allclose(f(Tensor(x_np, device="CPU")).numpy(),
                                   np.maximum(x_np @ w_np * np.float32(1.7890625), 0), rtol=1e-5, atol=1e-6)
    captured = f.captured
    assert captured is not None and any("1.7890625" in r.spec.src for r in tiered)
    # the engine swaps ready builds in between launches, so some may already be in: wait for the rest
    tiers.apply(wait=True)
    assert not tiers.pending
    for x_np in xs[3:]:
        np.testing.assert_allclose(f(Tensor(x_np, device="CPU")).numpy(),
                                   np.maximum(x_np @ w_np * np.float32(1.7890625), 0), rtol=1e-5, atol=1e-6)
    assert captured._generation == tiers.generation  # its graphs were rebuilt from the optimized programs
    compiler = Device["CPU"].compiler
    for ei in captured.exec_items:
        if isinstance(ei.prg, CompiledRunner):
            assert ei.prg.binary == compiler.cached(ei.prg.spec.src)


def test_without_tiered_nothing_is_built_twice(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TIERED", raising=False)
    x = Tensor(np.arange(6, dtype=np.float32), device="CPU")
    (x * 3.0703125).realize()
    assert not tiers.pending


_EXITING_SCRIPT = """
import sys, time
import numpy as np
from ember import Tensor
from ember.engine import realize, tiers
if sys.argv[1] == "stuck":  # the optimized builds never end (as on a machine far too slow for the exit wait)
    from ember_cpu.compiler import CPUCompiler
    real = CPUCompiler.compile_cached_many
    CPUCompiler.compile_cached_many = lambda self, srcs: time.sleep(600) if self.launcher else real(self, srcs)
sent = []
real_upgrade = tiers.upgrade_later
tiers.upgrade_later = lambda compiler, runners: sent.extend(r.spec.src for r in runners) or real_upgrade(compiler,
                                                                                                         runners)
x = Tensor(np.arange(40, dtype=np.float32).reshape(5, 8), device="CPU")
Tensor.realize_all(((x * 1.1328125).exp() + 1).sum(1), (x - 0.6015625).relu().max(0), (x @ x.T).sqrt())
print("\\0".join(sent), end="")
"""


def _run_and_exit(tmp_path, mode: str, exit_wait: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run :data:`_EXITING_SCRIPT` (TIERED=1, an empty cache) in a new process that ends as soon as its kernels
    ran; returns the process and the sources it sent to be upgraded in the background."""
    env = dict(os.environ, TIERED="1", TIERED_EXIT_WAIT=exit_wait, EMBER_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _EXITING_SCRIPT, mode], capture_output=True,
                          text=True, env=env, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc, [s for s in proc.stdout.split("\0") if s]


def test_a_process_that_ends_at_once_still_leaves_the_optimized_builds(tmp_path, monkeypatch):
    """The exit waits for the background builds (up to TIERED_EXIT_WAIT, far more than they need here): a later
    process finds the optimized binary of every kernel the first one ran from a quick build, however slow the
    machine (the wait is for the builds, not for a time)."""
    proc, sent = _run_and_exit(tmp_path, "normal", "300")
    assert len(sent) >= 3, proc.stderr
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    compiler = CPUCompiler()
    quick = compiler.quick_tier()
    assert quick is not None
    missing = [src for src in sent if compiler.cached(src) is None]
    assert not missing, (f"{len(missing)} of {len(sent)} kernels have no optimized build cached", proc.stderr)
    assert all(quick.cached(src) is not None for src in sent)  # each of them ran from its quick build first
    assert "abandoned" not in proc.stderr


def test_the_exit_waits_for_background_builds_no_longer_than_tiered_exit_wait(tmp_path):
    """Builds that cannot end in time are abandoned after TIERED_EXIT_WAIT, with a message, and the process ends
    with its own status (here the builds sleep for 10 minutes; the process must not)."""
    start = time.monotonic()
    proc, sent = _run_and_exit(tmp_path, "stuck", "0.2")
    assert sent and time.monotonic() - start < 240  # (start-up and the quick builds; far below the builds' 600 s)
    assert "still under way after TIERED_EXIT_WAIT=0.2 s at exit: abandoned" in proc.stderr
