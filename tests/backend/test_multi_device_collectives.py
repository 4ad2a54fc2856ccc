"""Collectives on several devices: the device-native allreduce (CPU's, and a fake plugin's), allgather to another
tuple of devices, resharding, each against the single-device result and under TinyJit."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember import Context, Tensor, TinyJit, dtypes
from ember.device import DeviceSpec, hookimpl, host_allreduce
from ember.device.registry import Device
from ember.ir.multi import lower
from ember.ir.uop import Ops
from ember_cpu.device import CPUDevice

D2 = ("CPU:0", "CPU:1")
D4 = ("CPU:0", "CPU:1", "CPU:2", "CPU:3")


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _replicas(t: Tensor) -> list[np.ndarray]:
    t.realize()
    return [Tensor(s).numpy() for s in t.lazydata.src]


# --- the CPU devices' native allreduce ------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis", [((4, 8), 0), ((3, 8), 1), ((8, 5), 0)], ids=["rows", "cols", "uneven-chunks"])
def test_cpu_allreduce_is_one_native_item(shape, axis):
    """Over CPU devices a reduction along the sharded axis is one ALLREDUCE item (no copies, no kernels for the
    combination), every replica holds the same bits, and sum, max and product equal one device's."""
    a = _data(*shape, seed=1)
    s = Tensor(a).shard(D4 if shape[axis] % 4 == 0 else D2, axis=axis).realize()
    total = s.sum(axis)
    items = total.schedule()
    ops = [si.ast.op for si in items]
    assert ops.count(Ops.ALLREDUCE) == 1 and Ops.COPY not in ops
    for got, want in [(total, a.sum(axis)), (s.max(axis), a.max(axis)), (s.prod(axis), a.prod(axis)),
                      (s.min(axis), a.min(axis))]:
        reps = _replicas(got)
        assert all(np.array_equal(reps[0], r) for r in reps[1:]), "every replica holds the same bits"
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_cpu_allreduce_of_integers_and_booleans():
    a = np.arange(24, dtype=np.int32).reshape(4, 6)
    s = Tensor(a).shard(D4, axis=0)
    np.testing.assert_array_equal(s.sum(0).numpy(), a.sum(0))
    np.testing.assert_array_equal((s > 10).any(0).numpy(), (a > 10).any(0))
    np.testing.assert_array_equal(s.max().numpy(), a.max())


def test_cpu_allreduce_in_a_jitted_training_step_keeps_replicas_identical():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    w0 = rng.standard_normal((5, 1)).astype(np.float32)
    ref = Tensor(w0)
    w = Tensor(w0).to(D4)

    def step(w: Tensor, xt: Tensor, yt: Tensor) -> Tensor:
        loss = (xt @ w - yt).square().mean()
        grad = (xt * (xt @ w - yt)).sum(0).reshape(5, 1) * (2 / 8)
        w.assign(w - grad * 0.1)
        Tensor.realize_all(loss, w)
        return loss

    jitted = TinyJit(lambda xt, yt: step(w, xt, yt))
    want = [step(ref, Tensor(x), Tensor(y)).item() for _ in range(4)]
    got = [jitted(Tensor(x).shard(D4, axis=0), Tensor(y).shard(D4, axis=0)).item() for _ in range(4)]
    assert jitted.captured is not None
    assert any(type(ei.prg).__name__ == "AllreduceRunner" for ei in jitted.captured.exec_items)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    reps = _replicas(w)
    assert all(np.array_equal(reps[0], r) for r in reps[1:])
    np.testing.assert_allclose(reps[0], ref.numpy(), rtol=1e-5, atol=1e-6)


# --- a plugin offering its own collective ---------------------------------------------------------------------
class CollectiveDevice(CPUDevice):
    """A CPU device from another plugin whose native allreduce records its calls (and can refuse)."""

    calls: list[tuple[int, str, Any]] = []
    refuse = False

    def allreduce(self, srcs: list[Any], dests: list[Any], devices: list[Any], dtype: Any, op: str) -> None:
        CollectiveDevice.calls.append((len(srcs), op, dtype))
        if CollectiveDevice.refuse:
            raise NotImplementedError("no collective for this dtype")
        host_allreduce(self, srcs, dests, devices, dtype, op)


class CollectivePlugin:
    @hookimpl
    def ember_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec("COLL", factory=f"{__name__}:CollectiveDevice", priority=-100)]  # never the default


@pytest.fixture
def coll() -> Any:
    Device.register_plugin(CollectivePlugin(), "fake-collective")
    CollectiveDevice.calls.clear()
    try:
        yield ("COLL:0", "COLL:1", "COLL:2")
    finally:
        CollectiveDevice.refuse = False
        Device.unregister_plugin("fake-collective")


def test_a_plugin_collective_is_used_when_every_device_offers_it(coll):
    a = _data(6, 4, seed=4)
    s = Tensor(a).shard(coll, axis=0)
    np.testing.assert_allclose(s.sum(0).numpy(), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(s.max(0).numpy(), a.max(0))
    assert [(n, op) for n, op, _ in CollectiveDevice.calls] == [(3, "add"), (3, "max")]


def test_a_group_mixing_plugins_gets_the_ring(coll):
    """COLL and CPU devices both offer an allreduce, but from different plugins: neither can reach the other's
    buffers, so the graph gets copies and kernels."""
    a = _data(6, 4, seed=5)
    s = Tensor(a).shard(("COLL:0", "CPU:1", "CPU:2"), axis=0)
    total = s.sum(0)
    ops = [si.ast.op for si in total.schedule()]
    assert Ops.ALLREDUCE not in ops and Ops.COPY in ops
    np.testing.assert_allclose(total.numpy(), a.sum(0), rtol=1e-5)
    assert CollectiveDevice.calls == []


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16])
def test_a_refusing_collective_falls_back_to_the_host(coll, dtype):
    CollectiveDevice.refuse = True
    a = (_data(6, 4, seed=6) * 4).astype(np.float32)
    s = Tensor(a).cast(dtype).shard(coll, axis=0)
    want = Tensor(a).cast(dtype).sum(0, dtype=dtype).numpy()
    np.testing.assert_allclose(s.sum(0, dtype=dtype).numpy(), want, rtol=2e-3)
    assert CollectiveDevice.calls and CollectiveDevice.calls[0][1] == "add"


def test_native_collectives_can_be_turned_off():
    s = Tensor(_data(4, 4)).shard(D2, axis=0)
    with Context(NATIVE_ALLREDUCE=0):
        ops = [si.ast.op for si in s.sum(0).schedule()]
    assert Ops.ALLREDUCE not in ops and Ops.COPY in ops


# --- allgather, resharding ------------------------------------------------------------------------------------
def test_to_another_tuple_gathers_and_to_the_same_is_a_no_op():
    """tinygrad 0.14: x.to(same devices) is x (still sharded); to another tuple gives a replicated tensor there,
    from a sharded or a replicated one."""
    a = _data(6, 4, seed=7)
    x = Tensor(a).shard(D2, axis=0)
    assert x.to(D2) is x
    for src in (x, Tensor(a).shard(("CPU:0", "CPU:1", "CPU:2"), axis=0), Tensor(a).to(D2)):
        y = src.to(("CPU:2", "CPU:3"))
        assert y.device == ("CPU:2", "CPU:3") and lower(y.lazydata).arg is None
        np.testing.assert_array_equal(y.numpy(), a)


def test_gradient_flows_back_through_a_gather():
    a = _data(4, 3, seed=8)
    w = Tensor(a, requires_grad=True)
    x = w.shard(D2, axis=0)
    (x.to(("CPU:2", "CPU:3")) * 3).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full((4, 3), 3.0))


@pytest.mark.parametrize("src_axis, dst_axis", [(0, 1), (2, 0)])
def test_resharding_on_four_devices(src_axis, dst_axis):
    a, b = _data(4, 8, 4, seed=9), _data(4, 8, 4, seed=10)
    x, y = Tensor(a).shard(D4, axis=src_axis), Tensor(b).shard(D4, axis=dst_axis)
    got = x * y
    assert lower(got.lazydata).arg == dst_axis
    np.testing.assert_allclose(got.numpy(), a * b, rtol=1e-6)
    np.testing.assert_allclose((x + y).sum(src_axis).numpy(), (a + b).sum(src_axis), rtol=1e-5, atol=1e-5)


def test_operands_on_different_device_tuples_are_refused():
    # tinygrad 0.14 gives RuntimeError "all buffers must have the same device" for the same
    x, y = Tensor(_data(4, 8)).shard(D4, axis=0), Tensor(_data(4, 8)).shard(D2, axis=1)
    with pytest.raises(RuntimeError, match=r"same device.*\('CPU', 'CPU:1', 'CPU:2', 'CPU:3'\) and \('CPU', 'CPU:1'\)"):
        x + y


def test_resharding_under_jit():
    a, b = _data(4, 8, seed=11), _data(4, 8, seed=12)

    @TinyJit
    def f(x: Tensor, y: Tensor) -> Tensor:
        return ((x + y) * 2).sum(0).realize()

    for _ in range(3):
        got = f(Tensor(a).shard(D2, axis=0), Tensor(b).shard(D2, axis=1))
        np.testing.assert_allclose(got.numpy(), ((a + b) * 2).sum(0), rtol=1e-5)
    assert f.captured is not None


@pytest.fixture(params=[("CPU:0", "CPU:1"), ("CPU", "CL")], ids=["cpu-cpu", "cpu-cl"])
def devs(request: pytest.FixtureRequest) -> tuple[str, ...]:
    for d in request.param:
        if d.split(":")[0] not in Device.available():
            pytest.skip(f"device {d} is not usable here: {Device.probe(d.split(':')[0])}")
    return request.param


def test_a_summed_gradient_meeting_a_sharded_parameter_is_a_reduce_scatter(devs):
    """A parameter sharded on axis 0 updated with a gradient summed over a sharded batch (ZeRO's optimizer
    sharding): each device needs only its slice of the sum, so it fetches only that slice of every other
    device's partial (a reduce-scatter): no allreduce, and each device computes only its slice of the update."""
    x, p = _data(8, 6, seed=13), _data(6, seed=14)
    xs, ps = Tensor(x).shard(devs, axis=0).realize(), Tensor(p).shard(devs, axis=0).realize()
    new = ps - (xs * 2).sum(0) * 0.1
    items = new.schedule()
    copies = [si for si in items if si.ast.op is Ops.COPY]
    assert Ops.ALLREDUCE not in [si.ast.op for si in items]
    assert len(copies) == 2 and all(si.bufs[0].size == 3 for si in copies)  # half of the sum each way
    np.testing.assert_allclose(new.numpy(), p - (x * 2).sum(0) * 0.1, rtol=1e-5, atol=1e-6)
    g = (xs * 2).sum(0)  # used whole, it stays an allreduce
    assert lower(g.lazydata).arg is None
    np.testing.assert_allclose((g + 1).numpy(), (x * 2).sum(0) + 1, rtol=1e-5, atol=1e-6)


def test_resharding_and_gathering_across_device_kinds(devs):
    a, b = _data(4, 6, seed=15), _data(4, 6, seed=16)
    x0, x1 = Tensor(a).shard(devs, axis=0), Tensor(b).shard(devs, axis=1)
    np.testing.assert_allclose((x0 * x1).numpy(), a * b, rtol=1e-6)
    np.testing.assert_allclose((x1 - x0).sum(1).numpy(), (b - a).sum(1), rtol=1e-5, atol=1e-5)
    back = x0.to(tuple(reversed(devs)))
    np.testing.assert_array_equal(back.numpy(), a)


@pytest.mark.parametrize("devs, axis", [(D2, 0), (D2, 1), (D2, None), (("CPU", "CL"), 0)],
                         ids=["cpu-cpu-axis0", "cpu-cpu-axis1", "cpu-cpu-replicated", "cpu-cl-axis0"])
def test_op_families_under_jit(devs, axis):
    """Elementwise, a reduction along each axis, movement, matmul and a resharded operand in one jitted function
    of a tensor sharded on ``axis`` (or replicated): each replay equals numpy on new values."""
    if "CL" in devs and "CL" not in Device.available():
        pytest.skip(f"device CL is not usable here: {Device.probe('CL')}")
    w = _data(6, 4, seed=17)
    wt = Tensor(w).to(devs)

    @TinyJit
    def f(x: Tensor, y: Tensor) -> tuple[Tensor, ...]:
        e = (x * 2 - y).relu() + x.exp() * 0.5
        return tuple(t.realize() for t in (e, e.sum(0), e.max(1), e.permute(1, 0)[1:5].sum(1), x @ wt, x[1:3] + 1))

    for seed in range(3):
        a, b = _data(4, 6, seed=20 + seed), _data(4, 6, seed=30 + seed)
        x = Tensor(a).shard(devs, axis=axis)
        y = Tensor(b).shard(devs, axis=1 - axis if axis is not None else 0)  # a different sharding: resharded
        e = np.maximum(a * 2 - b, 0) + np.exp(a) * 0.5
        want = (e, e.sum(0), e.max(1), e.T[1:5].sum(1), a @ w, a[1:3] + 1)
        for got, ref in zip(f(x, y), want):
            np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert f.captured is not None
