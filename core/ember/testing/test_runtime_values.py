"""Runtime values and replay: kernels that read a symbolic ``Variable`` at launch (one compile serves every
value), and ``TinyJit`` replays (through the device's Graph where it has one) with new inputs and values."""
from __future__ import annotations

import numpy as np

from ember import GlobalCounters, Tensor, TinyJit, Variable, dtypes

RNG = np.random.default_rng(99)


def test_symbolic_offsets_one_kernel_for_every_value(device: str) -> None:
    """shrink/pad at a bound Variable read the right window for each value, compiling nothing after the first."""
    a = RNG.standard_normal(40).astype(np.float32)
    x = Tensor(a, device=device).realize()
    v = Variable("start", 0, 30)
    first = v.bind(0)
    (x.shrink(((first, first + 9),)) * 2 + 1).realize()
    (Tensor(a[:9], device=device).pad(((first, 30 - first),)) + 0).realize()
    GlobalCounters.reset()
    for val in (30, 7, 0, 19):
        i = v.bind(val)
        np.testing.assert_allclose((x.shrink(((i, i + 9),)) * 2 + 1).numpy(), a[val:val + 9] * 2 + 1, rtol=1e-6)
        np.testing.assert_array_equal((Tensor(a[:9], device=device).pad(((i, 30 - i),)) + 0).numpy(),
                                      np.pad(a[:9], (val, 30 - val)))
    assert GlobalCounters.kernels_compiled == 0, "a new value of a Variable compiled a new kernel"



def test_symbolic_indexing_reads_the_window_at_run_time(device: str) -> None:
    """``x[:, pos:pos + 1]`` and ``x[pos]`` with a bound Variable (tinygrad's KV-cache idiom) select the right
    window for each value with one kernel."""
    a = RNG.standard_normal((4, 12)).astype(np.float32)
    x = Tensor(a, device=device).realize()
    v = Variable("pos", 0, 10)
    (x[:, v.bind(0):v.bind(0) + 2] * 2).realize()
    GlobalCounters.reset()
    for val in (10, 3, 0):
        p = v.bind(val)
        np.testing.assert_array_equal((x[:, p:p + 2] * 2).numpy(), a[:, val:val + 2] * 2)
    assert GlobalCounters.kernels_compiled == 0, "a new value of a Variable compiled a new kernel"
    r = Variable("row", 0, 3).bind(2)
    np.testing.assert_array_equal(x[r].numpy(), a[2])
    np.testing.assert_array_equal(x[r, 3:5].numpy(), a[2, 3:5])


def test_symbolic_sizes_one_kernel_for_every_value(device: str) -> None:
    """A size that is a bound Variable (``cache[:, :pos + 1]``, a softmax over it, a matmul with it as K) is
    read by the kernels at launch: each value gives numpy's result, a jit replays them compiling nothing."""
    k, v = (RNG.standard_normal((12, 8)).astype(np.float32) for _ in range(2))
    keys, values = Tensor(k, device=device).realize(), Tensor(v, device=device).realize()
    pos = Variable("pos", 0, 11)

    def attend(q: Tensor, p: Variable) -> Tensor:
        return (q @ keys[:p + 1].T).softmax(-1) @ values[:p + 1]

    f = TinyJit(attend)
    for i, val in enumerate((0, 5, 11, 2, 7)):
        if i == 2:
            GlobalCounters.reset()
        q = RNG.standard_normal((1, 8)).astype(np.float32)
        s = q @ k[:val + 1].T
        e = np.exp(s - s.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True) @ v[:val + 1]
        np.testing.assert_allclose(f(Tensor(q, device=device), pos.bind(val)).numpy(), want, rtol=1e-5, atol=1e-6)
        prefix = keys[:pos.bind(val) + 1]
        np.testing.assert_array_equal((prefix * 2).numpy(), k[:val + 1] * 2)
    assert GlobalCounters.kernels_compiled == 0, "a new value of a Variable compiled a new kernel"

def test_symbolic_reduction_window(device: str) -> None:
    """A reduction over a window that starts at a runtime value, on integers and floats."""
    a = RNG.integers(-100, 100, (12, 16)).astype(np.int32)
    x = Tensor(a, dtype=dtypes.int32, device=device).realize()
    v = Variable("row", 0, 8)
    for val in (0, 3, 8):
        r = v.bind(val)
        window = x.shrink(((r, r + 4), None))
        np.testing.assert_array_equal(window.sum(0).numpy(), a[val:val + 4].sum(0))
        np.testing.assert_array_equal(window.float().max(1).numpy(), a[val:val + 4].max(1).astype(np.float32))


def test_jit_replays_with_new_inputs(device: str) -> None:
    """A jitted function replays its captured kernels (through the device Graph where there is one) and gives
    what running it eagerly gives, for new input values, without compiling."""
    w = Tensor(RNG.standard_normal((6, 5)).astype(np.float32), device=device).realize()

    def step(x: Tensor) -> Tensor:
        h = (x @ w).relu()
        return (h * h).sum(1).sqrt() + x.max(1)

    f = TinyJit(step)
    inputs = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(5)]
    wn = w.numpy()
    for k, data in enumerate(inputs):
        if k == 2:
            GlobalCounters.reset()
        got = f(Tensor(data, device=device)).numpy()
        h = np.maximum(data @ wn, 0)
        np.testing.assert_allclose(got, np.sqrt((h * h).sum(1)) + data.max(1), rtol=1e-5, atol=1e-5)
    assert GlobalCounters.kernels_compiled == 0, "a replay compiled kernels"


def test_jit_replays_for_several_variable_values(device: str) -> None:
    """A jit captured with one value of a Variable replays correctly for others."""
    a = RNG.standard_normal(24).astype(np.float32)
    x = Tensor(a, device=device).realize()
    v = Variable("p", 0, 20)
    f = TinyJit(lambda t, p: (t.shrink(((p, p + 4),)) * 3).exp())
    for val in (0, 1):
        f(x, v.bind(val))
    for val in (20, 5, 13, 0):
        np.testing.assert_allclose(f(x, v.bind(val)).numpy(), np.exp(a[val:val + 4] * 3), rtol=1e-5)
