"""Conformance on several devices of the plugin under test: sharding, copies between its devices, the allreduce
(its native collective when it offers one, and the ring of copies and kernels every device gets), resharding,
data- and tensor-parallel matmul with gradients, and a TinyJit replay, each against numpy.

Runs on any plugin that opens a second device (``FOO:1``); skips with the reason otherwise. A third device
(``FOO:2``), when there is one, runs the ring (three or more devices) as well."""
from __future__ import annotations

import numpy as np
import pytest

from ember import Context, Device, Tensor, TinyJit
from ember.device.collective import native_allreduce_of
from ember.ir.multi import lower
from ember.ir.uop import Ops


def _opens(name: str) -> str | None:
    """None when device ``name`` opens and round-trips a value, else why not."""
    try:
        Device[name]
        got = Tensor([1.5, -2.0]).to(name).numpy()
    except Exception as e:  # noqa: BLE001  (any failure means: no such device here)
        return f"{type(e).__name__}: {e}"
    return None if got.tolist() == [1.5, -2.0] else f"a value copied to {name} came back as {got.tolist()}"


@pytest.fixture(scope="module")
def group(device: str) -> tuple[str, ...]:
    """Two (or three, where the plugin has them) devices of the plugin under test."""
    base = device.split(":")[0]
    devices = [Device.canonicalize(f"{base}:0"), Device.canonicalize(f"{base}:1")]
    if (why := _opens(devices[1])) is not None:
        pytest.skip(f"{base} has no second device to run the multi-device section on ({why})")
    if _opens(f"{base}:2") is None:
        devices.append(Device.canonicalize(f"{base}:2"))
    return tuple(devices)


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _replicas(t: Tensor) -> list[np.ndarray]:
    t.realize()
    return [Tensor(s).numpy() for s in t.lazydata.src]


def test_shard_gather_and_copies_between_devices(group: tuple[str, ...]) -> None:
    n = len(group)
    a = _data(2 * n, 3 * n)
    for axis in (0, 1, None):
        s = Tensor(a).shard(group, axis=axis)
        where: object = s.device
        assert where == group and lower(s.lazydata).arg == axis
        np.testing.assert_array_equal(s.numpy(), a)
    np.testing.assert_array_equal(Tensor(a).to(group[0]).to(group[1]).numpy(), a)
    back = Tensor(a).shard(group, axis=0).to(tuple(reversed(group)))  # an allgather onto another tuple
    assert lower(back.lazydata).arg is None
    np.testing.assert_array_equal(back.numpy(), a)


@pytest.mark.parametrize("native", [True, False], ids=["native", "ring"])
def test_allreduce(group: tuple[str, ...], native: bool) -> None:
    """Sum, max and product along the sharded axis (uneven chunks of the ring too): every replica holds the same
    bits, equal to numpy's. ``native``: the plugin's collective, skipped when it offers none."""
    if native and native_allreduce_of(group) is None:
        pytest.skip(f"{group[0]} offers no native allreduce (the ring below covers it)")
    n = len(group)
    a = _data(2 * n, 5, seed=1)
    ints = np.arange(2 * n * 5, dtype=np.int32).reshape(2 * n, 5)
    with Context(NATIVE_ALLREDUCE=int(native)):
        s, si = Tensor(a).shard(group, axis=0), Tensor(ints).shard(group, axis=0)
        cases = [(s.sum(0), a.sum(0)), (s.max(0), a.max(0)), ((s * 0.5 + 1).prod(0), (a * 0.5 + 1).prod(0)),
                 (si.sum(0), ints.sum(0)), (s.sum(), a.sum())]
        ops = [si.ast.op for si in cases[0][0].schedule()]
        for got, _ in cases:
            lower(got.lazydata)  # (the collective is chosen when a node is lowered: here, under the context)
    assert (Ops.ALLREDUCE in ops) == native
    for got, want in cases:
        reps = _replicas(got)
        assert all(np.array_equal(reps[0], r) for r in reps[1:]), "every replica holds the same bits"
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_elementwise_resharding_and_movement(group: tuple[str, ...]) -> None:
    n = len(group)
    a, b = _data(2 * n, 2 * n, seed=2), _data(2 * n, 2 * n, seed=3)
    x0, x1, r = Tensor(a).shard(group, axis=0), Tensor(b).shard(group, axis=1), Tensor(b).to(group)
    np.testing.assert_allclose((x0 * r + 1).numpy(), a * b + 1, rtol=1e-6)
    got = x0 + x1  # resharded to axis 1, as tinygrad does
    assert lower(got.lazydata).arg == 1
    np.testing.assert_allclose(got.numpy(), a + b, rtol=1e-6)
    np.testing.assert_array_equal(x0.permute(1, 0).reshape(2 * n, n, 2).numpy(), a.T.reshape(2 * n, n, 2))
    np.testing.assert_array_equal(x0[1:3].numpy(), a[1:3])


def test_data_and_tensor_parallel_matmul_with_gradients(group: tuple[str, ...]) -> None:
    n = len(group)
    x, w1, w2 = _data(2 * n, 4, seed=4), _data(4, 2 * n, seed=5), _data(2 * n, 3, seed=6)
    results = []
    for place in (False, True):
        a, b = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
        xt = Tensor(x).to(group) if place else Tensor(x)
        h = (xt @ (a.shard(group, axis=1) if place else a)).relu()      # column parallel
        out = h @ (b.shard(group, axis=0) if place else b)              # row parallel: an allreduce
        (out * out).mean().backward()
        assert a.grad is not None and b.grad is not None
        results.append((out.numpy(), a.grad.numpy(), b.grad.numpy()))
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    xs = Tensor(x).shard(group, axis=0)  # data parallel
    np.testing.assert_allclose((xs @ Tensor(w1).to(group)).numpy(), x @ w1, rtol=1e-5, atol=1e-5)


def test_jit_replays_a_step_with_an_allreduce(group: tuple[str, ...]) -> None:
    n = len(group)
    a = _data(2 * n, 3, seed=7)
    w = Tensor(np.ones(3, dtype=np.float32)).to(group)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        w.assign(w + (x * w).sum(0) * 0.01)
        return w.realize()

    want = np.ones(3, dtype=np.float32)
    for _ in range(4):
        got = step(Tensor(a).shard(group, axis=0)).numpy()
        want = want + (a * want).sum(0) * 0.01
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert step.captured is not None
