"""A Python float that changes between runs of the same kernel becomes a kernel input: compiled once, right values."""
from __future__ import annotations

import re

import numpy as np
import pytest

from ember import Context, GlobalCounters, Tensor, dtypes


@pytest.fixture(autouse=True)
def fresh_history(monkeypatch):
    """Each test starts with no kernel skeletons seen: earlier tests in the same process may have run kernels of
    the same shape with other constants (which decides what is parameterized)."""
    from ember.engine import runtime_consts

    monkeypatch.setattr(runtime_consts, "_first_values", {})
    monkeypatch.setattr(runtime_consts, "_varying", {})


def _compiled(fn) -> int:
    before = GlobalCounters.kernels_compiled
    fn()
    return GlobalCounters.kernels_compiled - before


def _skeleton_state() -> list[tuple]:
    """What the runtime-constant tables hold (for failure messages): each skeleton's first values and the
    positions found varying."""
    from ember.engine import runtime_consts

    return [(key[0], values, sorted(runtime_consts._varying.get(key, ()))) for key, values in
            runtime_consts._first_values.items()]


def _kernel_names(src: str) -> list[str]:
    return re.findall(r"\b[Er]_[0-9_]+\b", src)[:3]


class _Builds(list):
    """Sources built on the test's thread; ``elsewhere``: (thread, kernel names) of builds on other threads."""

    def __init__(self) -> None:
        super().__init__()
        self.elsewhere: list[tuple[str, list[str]]] = []


@pytest.fixture
def builds(monkeypatch) -> _Builds:
    """The sources every compiler of this process builds from now on on this thread, in order (a build another
    thread finishes meanwhile, say a background build an earlier test left, is not this test's: it goes to
    ``builds.elsewhere``, named in the failure messages)."""
    import threading

    from ember.device.compiler import Compiler

    built = _Builds()
    store = Compiler.store
    here = threading.current_thread()

    def recording_store(self, src: str, binary: bytes) -> bytes:
        if threading.current_thread() is here:
            built.append(src)
        else:
            built.elsewhere.append((threading.current_thread().name, _kernel_names(src)))
        return store(self, src, binary)

    monkeypatch.setattr(Compiler, "store", recording_store)
    return built


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_changing_float_compiles_once(device: str, dtype: str, builds: _Builds):
    a = np.linspace(-3, 3, 13).astype(dtype)
    x = Tensor(a, device=device).realize()
    counts = []
    for i, s in enumerate([0.25, 0.5, -1.75, 3.0, float("inf"), 1e-3, -0.0]):
        before = len(builds)
        got = (x * s + 1.5 + i * 0.125).exp2().numpy()
        # this expression's kernel (E_13); the names of every build are in the message when the count is off
        counts.append(sum(1 for src in builds[before:] if re.search(r"\bE_13\b", src)))
        with np.errstate(invalid="ignore"):  # 0 * inf
            want = np.exp2((a.astype(np.float32) * np.float32(s)).astype(dtype) + np.float32(1.5 + i * 0.125))
        np.testing.assert_allclose(got.astype(np.float32), want.astype(dtype).astype(np.float32),
                                   rtol=1e-2 if dtype == "float16" else 1e-6)
    # the 2nd value builds the kernel with inputs, then none
    assert counts[0] >= 1 and sum(counts[2:]) == 0, (counts, [_kernel_names(src) for src in builds],
                                                      builds.elsewhere, _skeleton_state())


def test_constants_that_do_not_change_stay_in_the_kernel(device: str):
    x = Tensor(np.arange(5, dtype=np.float32), device=device).realize()
    (x * 2.5 + 7.0).numpy()
    assert _compiled(lambda: (x * 2.5 + 7.0).numpy()) == 0  # the same values: the same kernel, no inputs added
    # another value builds the kernel with the constant as an input (unless this process built it already) ...
    n = _compiled(lambda: np.testing.assert_array_equal((x * 4.0 + 7.0).numpy(), np.arange(5) * 4.0 + 7.0))
    assert n <= 1
    # ... which every later value reuses
    n = _compiled(lambda: np.testing.assert_array_equal((x * -3.5 + 7.0).numpy(), np.arange(5) * -3.5 + 7.0))
    assert n == 0


def test_runtime_consts_can_be_turned_off(device: str):
    x = Tensor(np.ones(3, dtype=np.float32), device=device).realize()
    with Context(RUNTIME_CONSTS=0):
        counts = [_compiled(lambda s=s: (x * s - 0.5).numpy()) for s in (0.31, 0.32, 0.33)]
    assert counts == [1, 1, 1]


def test_integer_constants_keep_their_kernels(device: str):
    x = Tensor(np.arange(6), dtype=dtypes.int32, device=device).realize()
    for k in (3, 4):
        np.testing.assert_array_equal((x * k).numpy(), np.arange(6) * k)


def _values_sequence(x: Tensor, builds: _Builds, values: list[float], offset: float, between=None) -> list[int]:
    """Run ``(x * s + offset + i / 8).exp2()`` for each value; the builds of its kernel (E_13) at each step."""
    counts = []
    for i, s in enumerate(values):
        before = len(builds)
        (x * s + offset + i * 0.125).exp2().numpy()
        counts.append(sum(1 for src in builds[before:] if re.search(r"\bE_13\b", src)))
        if between is not None:
            between()
    return counts


@pytest.mark.parametrize("collector", ["collect-between", "disabled", "as-is"])
@pytest.mark.parametrize("history", ["fresh", "later-values-built-before", "earlier-run"])
def test_which_kernel_is_built_depends_on_values_only(device: str, builds: _Builds, collector: str, history: str):
    """The same values give the same builds whatever the collector does and whatever this process compiled
    before: kernels built earlier with some of the same constants (say by another test) or a whole earlier run
    of the loop change nothing but cache hits (a kernel is built on the 1st and 2nd value at most, never after)."""
    import gc

    from ember.engine import runtime_consts

    x = Tensor(np.linspace(-3, 3, 13).astype(np.float32), device=device).realize()
    values = [0.25, 0.5, -1.75, 3.0, 1e-3, -0.0, 0.25]
    # kernels no other test of this process builds (an offset of its own for each case)
    cases = [(h, c) for h in ("fresh", "later-values-built-before", "earlier-run")
             for c in ("collect-between", "disabled", "as-is")]
    offset = 2.0 + cases.index((history, collector)) / 64
    if history == "later-values-built-before":  # the exact kernels of values 2 and 3 are compiled already
        with Context(RUNTIME_CONSTS=0):
            for i in (1, 2):
                (x * values[i] + offset + i * 0.125).exp2().numpy()
    elif history == "earlier-run":
        _values_sequence(x, builds, values, offset)
    runtime_consts._first_values.clear()
    runtime_consts._varying.clear()
    was_on = gc.isenabled()
    if collector == "disabled":
        gc.disable()
    try:
        counts = _values_sequence(x, builds, values, offset, gc.collect if collector == "collect-between" else None)
    finally:
        if was_on:
            gc.enable()
    assert sum(counts[2:]) == 0 and sum(counts) <= 2, (counts, builds.elsewhere, _skeleton_state())
    if history == "fresh":
        assert counts[:2] == [1, 1], counts  # the first values' kernel, then the one with inputs


@pytest.mark.parametrize("collector", ["collect-every-step", "disabled"])
def test_a_training_loop_with_a_changing_scalar_builds_each_kernel_at_most_twice(device: str, builds: _Builds,
                                                                                  collector: str):
    """100 SGD steps whose learning rate and weight decay change every step (a schedule): each kernel of the step
    is built at most twice (with its first constants, then with them as inputs), whatever the collector does."""
    import gc

    rng = np.random.default_rng(3)
    features = 5 + ["collect-every-step", "disabled"].index(collector)  # kernels no other test builds
    xs, ys = rng.standard_normal((8, features)).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    w_np = rng.standard_normal((features, 1)).astype(np.float32)
    x, y = Tensor(xs, device=device), Tensor(ys, device=device)
    w = Tensor(w_np.copy(), device=device).realize()
    was_on = gc.isenabled()
    if collector == "disabled":
        gc.disable()
    try:
        for step in range(100):
            lr, decay = 0.05 / (1 + 0.1 * step), 1e-3 * (1 + step % 7)
            g = (2 / 8) * xs.T @ (xs @ w_np - ys) + decay * w_np
            w_np = w_np - np.float32(lr) * g
            w.requires_grad = True
            loss = ((x @ w - y) ** 2).mean() + (w * w).sum() * (decay / 2)
            loss.backward()
            assert w.grad is not None
            w = (w.detach() - w.grad.detach() * lr).realize()
            if collector == "collect-every-step":
                gc.collect()
    finally:
        if was_on:
            gc.enable()
    np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-4, atol=1e-5)
    per_kernel: dict[str, int] = {}
    for src in builds:
        for name in set(_kernel_names(src)):
            per_kernel[name] = per_kernel.get(name, 0) + 1
    assert per_kernel and max(per_kernel.values()) <= 2, per_kernel
