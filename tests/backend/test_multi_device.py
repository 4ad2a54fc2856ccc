"""Tensors on several devices (``shard``, ``to(devices)``): every op family against the single-device result.

The pairs are two CPU devices and, where OpenCL is usable, a CPU and a CL device (copies between device kinds).
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Context, Device, Tensor, TinyJit, nn
from ember.engine.realize import run_schedule
from ember.ir.lazy import buffers, device_of
from ember.ir.multi import ShardingError, lower
from ember.ir.uop import Ops
from ember.nn.optim import SGD, Adam


@pytest.fixture(params=[("CPU:0", "CPU:1"), ("CPU", "CL")], ids=["cpu-cpu", "cpu-cl"])
def devs(request: pytest.FixtureRequest) -> tuple[str, ...]:
    for d in request.param:
        if d.split(":")[0] not in Device.available():
            pytest.skip(f"device {d} is not usable here: {Device.probe(d.split(':')[0])}")
    return request.param


D2 = ("CPU:0", "CPU:1")


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _axis(t: Tensor) -> int | None:
    return lower(t.lazydata).arg


# --- making multi-device tensors ---------------------------------------------------------------------------
def test_shard_splits_along_the_axis_and_gathers(devs):
    a = _data(4, 6)
    for axis in (0, 1, -1):
        s = Tensor(a).shard(devs, axis=axis)
        assert s.device == tuple(Device.canonicalize(d) for d in devs)
        assert s.shape == (4, 6) and _axis(s) == axis % 2
        np.testing.assert_array_equal(s.numpy(), a)
        assert s.tolist() == a.tolist()


def test_each_device_holds_only_its_shard():
    s = Tensor(_data(8, 3)).shard(D2, axis=0).realize()
    shards = s.lazydata.src
    assert [device_of(x) for x in shards] == ["CPU", "CPU:1"]
    assert [buffers[x.src[0]].size for x in shards] == [12, 12]


def test_uneven_split_is_refused():
    # tinygrad 0.14 gives RuntimeError "multi axis uneven" for Tensor.ones(5, 3).shard(("CPU:0", "CPU:1"), axis=0)
    with pytest.raises(RuntimeError, match=r"axis 0 of shape \(5, 3\).*evenly over 2 devices"):
        Tensor.ones(5, 3).contiguous().shard(D2, axis=0)


def test_replicate_with_to_and_in_place_forms(devs):
    a = _data(3, 2)
    t = Tensor(a).to(devs)
    assert isinstance(t.device, tuple) and _axis(t) is None
    np.testing.assert_array_equal(t.numpy(), a)
    u = Tensor(a)
    assert u.to_(devs) is u and u.device == t.device
    v = Tensor(a)
    v.shard_(devs, axis=1)
    assert _axis(v) == 1 and v.shard_like(v) is v
    np.testing.assert_array_equal(Tensor(a).shard_like(v).numpy(), a)
    g = v.to("CPU")
    assert g.device == "CPU"
    np.testing.assert_array_equal(g.numpy(), a)
    with pytest.raises(RuntimeError, match="already on several devices"):
        v.shard(devs, axis=0)


def test_constants_on_several_devices():
    t = Tensor.full((4, 2), 3.0, device=D2)
    assert t.device == ("CPU", "CPU:1")
    np.testing.assert_array_equal((t + 1).numpy(), np.full((4, 2), 4.0))


# --- elementwise -------------------------------------------------------------------------------------------
def test_elementwise_matching_shardings(devs):
    a, b = _data(4, 6, seed=1), _data(4, 6, seed=2)
    sa, sb, rb = Tensor(a).shard(devs, axis=0), Tensor(b).shard(devs, axis=0), Tensor(b).to(devs)
    np.testing.assert_allclose((sa * sb + 1).numpy(), a * b + 1, rtol=1e-6)
    np.testing.assert_allclose((sa - rb).numpy(), a - b, rtol=1e-6)      # sharded with replicated
    np.testing.assert_allclose((rb - sa).exp().numpy(), np.exp(b - a), rtol=1e-5)
    np.testing.assert_allclose((2.0 / (sa.abs() + 1)).numpy(), 2 / (np.abs(a) + 1), rtol=1e-6)
    assert _axis(sa + rb) == 0 and _axis(rb * 2) is None
    row = Tensor(b[0]).to(devs)  # a broadcast replicated row
    np.testing.assert_allclose((sa + row).numpy(), a + b[0], rtol=1e-6)
    np.testing.assert_array_equal((sa > 0).where(sa, 0.0).numpy(), np.where(a > 0, a, 0))


def test_differently_sharded_operands_are_resharded():
    """tinygrad 0.14 reshards rather than refuses: x0 + x1 is sharded on axis 1, x1 + x0 on axis 0 (the last of the
    distinct axes in operand order), and the values are the single-device ones."""
    a, b = _data(4, 6, seed=1), _data(4, 6, seed=2)
    x0, x1 = Tensor(a).shard(D2, axis=0), Tensor(b).shard(D2, axis=1)
    for got, axis, want in [(x0 + x1, 1, a + b), (x1 + x0, 0, b + a), (x0 + x1 + x0, 0, a + b + a),
                            ((x0 > 0).where(x1, x0), 1, np.where(a > 0, b, a))]:
        assert _axis(got) == axis
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    with pytest.raises(RuntimeError, match=r"same device.*\('CPU', 'CPU:1'\) and \('CPU:2', 'CPU:3'\)"):
        x0 + Tensor(b).shard(("CPU:2", "CPU:3"), axis=0)  # tinygrad 0.14: RuntimeError "must have the same device"
    with pytest.raises(RuntimeError, match="same device"):
        x0 + Tensor(_data(4, 6))


# --- reductions --------------------------------------------------------------------------------------------
def test_reduce_along_other_axis_stays_sharded(devs):
    a = _data(4, 6)
    s = Tensor(a).shard(devs, axis=0)
    r = s.sum(1)
    assert _axis(r) == 0
    np.testing.assert_allclose(r.numpy(), a.sum(1), rtol=1e-5)
    np.testing.assert_allclose(s.max(1).numpy(), a.max(1))


@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_along_sharded_axis_allreduces(devs, axis):
    a = _data(4, 6)
    s = Tensor(a).shard(devs, axis=axis)
    for got, want in [(s.sum(axis), a.sum(axis)), (s.max(axis), a.max(axis)), (s.sum(), a.sum()),
                      (s.mean(), a.mean()), (s.max(), a.max()), (s.min(axis), a.min(axis))]:
        assert _axis(got) is None
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_allreduce_is_copies_and_kernels_and_replicas_match():
    s = Tensor(_data(8, 3)).shard(D2, axis=0).realize()
    with Context(NATIVE_ALLREDUCE=0):  # (CPU devices would use their native collective)
        total = s.sum(0)
        items = total.schedule()
    copies = [si for si in items if si.ast.op is Ops.COPY]
    assert len(copies) == 2  # the partial sum to the first device, the total back to the second
    assert {b.device for si in items for b in si.bufs} == {"CPU", "CPU:1"}
    run_schedule(items)
    total.realize()
    a, b = (Tensor(x).numpy() for x in total.lazydata.src)
    np.testing.assert_array_equal(a, b)


# --- movement ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("move", [
    lambda t: t.reshape(2, 2, 6),       # splits the sharded axis into an outer part divisible by 2
    lambda t: t.reshape(4, 2, 3),       # splits another axis
    lambda t: t.reshape(24),            # merges the sharded axis with the ones after it
    lambda t: t.permute(1, 0),
    lambda t: t.T.T,
    lambda t: t.reshape(4, 1, 6).expand(4, 3, 6),
    lambda t: t.pad((None, (1, 2))),
    lambda t: t.shrink((None, (1, 4))),
    lambda t: t.flip(1),
    lambda t: t[:, 2:5],
    lambda t: t.unsqueeze(0),
], ids=["split-sharded", "split-other", "merge-after", "permute", "TT", "expand", "pad", "shrink", "flip", "slice",
        "unsqueeze"])
def test_movement_keeping_the_sharded_axis(devs, move):
    a = _data(4, 6)
    got = move(Tensor(a).shard(devs, axis=0))
    want = move(Tensor(a)).numpy()
    assert got.shape == want.shape and _axis(got) is not None
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_allclose((got * 2).sum().numpy(), want.sum() * 2, rtol=1e-5)


@pytest.mark.parametrize("move, name", [
    (lambda t: t.pad(((1, 0), None)), "pad"),
    (lambda t: t.flip(0), "flip"),
    (lambda t: t.reshape(3, 8), "reshape"),
    (lambda t: t[::-1], "flip"),
])
def test_movement_across_the_sharded_axis_is_refused(move, name):
    # tinygrad 0.14 refuses these too: RuntimeError "reshape (4, 6) -> (3, 8) moved items between shards",
    # "flipping not supported on sharded axis 0", AssertionError "padding not supported"
    s = Tensor(_data(4, 6)).shard(D2, axis=0)
    with pytest.raises(ShardingError, match=rf"{name}.*shape \(4, 6\) sharded on axis 0 over \(CPU, CPU:1\)"):
        move(s)


@pytest.mark.parametrize("move", [
    lambda t: t.shrink(((1, 3), None)),  # a row from each device
    lambda t: t[0],                      # from the first device only
    lambda t: t[3:, 1:],                 # from the second only
    lambda t: t[1:4],
], ids=["across", "first", "second", "uneven"])
def test_shrink_across_the_sharded_axis_gives_a_replicated_slice(devs, move):
    a = _data(4, 6)
    s = Tensor(a).shard(devs, axis=0)
    got = move(s)
    assert _axis(got) is None
    np.testing.assert_array_equal(got.numpy(), move(Tensor(a)).numpy())
    np.testing.assert_allclose((s.sum(0) + got.sum()).numpy(), a.sum(0) + move(Tensor(a)).numpy().sum(), rtol=1e-5)


def test_batchnorm_statistics_over_the_whole_sharded_batch():
    """A sharded batch normalizes with the mean and variance of the whole batch (an allreduce), as on one device,
    and the running statistics are the same."""
    x = _data(4, 3, 5, 5, seed=11)
    outs = []
    for devices in (None, D2):
        bn = nn.BatchNorm(3)
        xt = Tensor(x)
        if devices:
            for p in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
                p.to_(devices)
            xt = xt.shard(devices, axis=0)
        with Tensor.train():
            y = bn(xt)
            outs.append((y.numpy(), bn.running_mean.numpy(), bn.running_var.numpy()))
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_replicated_tensors_move_freely():
    a = _data(4, 6)
    r = Tensor(a).to(D2)
    np.testing.assert_array_equal(r[1:3, ::-1].reshape(3, 4).numpy(), a[1:3, ::-1].reshape(3, 4))


# --- matmul, autograd, optimizer -----------------------------------------------------------------------------
def test_data_parallel_matmul_and_gradients(devs):
    x, w = _data(6, 5, seed=3), _data(5, 4, seed=4)
    grads = []
    for place in (False, True):
        xt, wt = Tensor(x), Tensor(w, requires_grad=True)
        wd = wt.to(devs) if place else wt
        xd = xt.shard(devs, axis=0) if place else xt
        out = xd @ wd
        if place:
            assert _axis(out) == 0
        np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-6)
        loss = (out.relu() * 3 - 1).square().mean()
        loss.backward()
        grads.append(wt.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_gradient_of_replicated_parameter_is_replicated():
    w = Tensor(_data(5, 4), requires_grad=True)
    w.to_(D2)
    x = Tensor(_data(6, 5)).shard(D2, axis=0)
    (x @ w).sum().backward()
    assert w.grad.device == ("CPU", "CPU:1") and _axis(w.grad) is None
    np.testing.assert_allclose(w.grad.numpy(), _data(6, 5).sum(0)[:, None].repeat(4, 1), rtol=1e-5)


def test_assign_into_sharded_and_replicated(devs):
    a, b = _data(4, 2, seed=5), _data(4, 2, seed=6)
    s = Tensor(a).shard(devs, axis=0).realize()
    buf = s.lazydata.src[1].src[0]
    s.assign(s * 2 + Tensor(b).shard(devs, axis=0)).realize()
    assert s.lazydata.src[1].src[0] is buf, "written in place"
    np.testing.assert_allclose(s.numpy(), a * 2 + b, rtol=1e-6)
    s.assign(Tensor(b).to(devs)).realize()  # a replicated value: each shard takes its slice
    np.testing.assert_array_equal(s.numpy(), b)
    with pytest.raises(ShardingError, match="assign"):
        s.assign(Tensor(b).shard(devs, axis=1))


def _train(devices: tuple[str, ...] | None, steps: int = 10) -> tuple[list[float], list[Tensor]]:
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
    params = [Tensor(rng.standard_normal(s).astype(np.float32) * 0.5) for s in ((5, 6), (6,), (6, 2), (2,))]
    xt, yt = Tensor(x), Tensor(y)
    if devices:
        for p in params:
            p.to_(devices)
        xt, yt = xt.shard(devices, axis=0), yt.shard(devices, axis=0)
    opt = SGD(params, lr=0.1, momentum=0.9)
    w1, b1, w2, b2 = params
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((xt @ w1 + b1).relu() @ w2 + b2 - yt).square().mean()
        loss.backward()
        Tensor.realize_all(loss, *opt.schedule_step())
        losses.append(loss.item())
    return losses, params


def test_data_parallel_sgd_matches_one_device(devs):
    want, ref = _train(None)
    got, params = _train(devs)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for p, r in zip(params, ref):
        shards = [Tensor(s).numpy() for s in p.lazydata.src]
        if len({d.split(":")[0] for d in devs}) == 1:
            np.testing.assert_array_equal(shards[0], shards[1])  # the replicas stay identical
        else:  # each device runs the update with its own compiler: the last bit may differ (FMA contraction)
            np.testing.assert_allclose(shards[0], shards[1], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(shards[0], r.numpy(), rtol=1e-5, atol=1e-6)


def test_jit_replays_a_data_parallel_step():
    want, _ = _train(None, steps=5)
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
    params = [Tensor(rng.standard_normal(s).astype(np.float32) * 0.5) for s in ((5, 6), (6,), (6, 2), (2,))]
    for p in params:
        p.to_(D2)
    opt = SGD(params, lr=0.1, momentum=0.9)
    w1, b1, w2, b2 = params

    @TinyJit
    def step(xt: Tensor, yt: Tensor) -> Tensor:
        opt.zero_grad()
        loss = ((xt @ w1 + b1).relu() @ w2 + b2 - yt).square().mean()
        loss.backward()
        Tensor.realize_all(loss, *opt.schedule_step())
        return loss

    # a fresh sharded batch each call (the same values): replays swap each shard's buffer
    got = [step(Tensor(x).shard(D2, axis=0), Tensor(y).shard(D2, axis=0)).item() for _ in range(5)]
    assert step.captured is not None
    np.testing.assert_allclose(got, want, rtol=1e-5)


D4 = ("CPU:0", "CPU:1", "CPU:2", "CPU:3")


@pytest.mark.parametrize("shape, axis, n_copies", [
    ((8, 5), 0, 21),   # 5 results in chunks of 2, 2, 1: each goes 3 hops around the ring, then into place on all 4
    ((4, 12), 1, 28),  # 4 chunks of 1
    ((8, 2), 0, 6),    # fewer results than devices: reduced onto the first device (3 copies), broadcast (3)
])
def test_ring_allreduce_on_four_devices(shape, axis, n_copies):
    a = _data(*shape, seed=9)
    s = Tensor(a).shard(D4, axis=axis).realize()
    with Context(NATIVE_ALLREDUCE=0):
        total = s.sum(axis)
        copies = [si for si in total.schedule() if si.ast.op is Ops.COPY]
        assert len(copies) == n_copies
        maxes = (s.max(axis), (-s).max(axis))
        for m in maxes:
            lower(m.lazydata)  # lowered (the ring chosen) under the context
    for got, want in [(total, a.sum(axis)), (maxes[0], a.max(axis)), (maxes[1], (-a).max(axis))]:
        got.realize()
        shards = [Tensor(x).numpy() for x in got.lazydata.src]
        assert all(np.array_equal(shards[0], x) for x in shards[1:]), "every replica holds the same bits"
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_data_parallel_sgd_on_four_devices():
    want, _ = _train(None, steps=4)
    got, _ = _train(D4, steps=4)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("devices", [D2, D4], ids=["2", "4"])
def test_tensor_parallel_mlp_column_then_row(devices):
    """Megatron's pair: the first weight split along its outputs (each device computes its slice of the hidden
    layer, no communication), the second along its inputs (each device a partial product, then an allreduce)."""
    x, w1, w2 = _data(6, 8, seed=12), _data(8, 4, seed=13), _data(4, 3, seed=14)
    results = []
    for place in (False, True):
        a, b = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
        xt = Tensor(x).to(devices) if place else Tensor(x)
        h = (xt @ (a.shard(devices, axis=1) if place else a)).relu()
        out = h @ (b.shard(devices, axis=0) if place else b)
        if place:
            assert _axis(h) == 1 and _axis(out) is None
        (out * out).mean().backward()
        results.append((out.numpy(), a.grad.numpy(), b.grad.numpy()))
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_conv_batchnorm_adam_data_parallel_matches_one_device():
    """The shape of tinygrad's multi-GPU MNIST recipe: parameters replicated with ``to_``, the batch (and the
    labels) sharded along axis 0, training mode; the losses equal one device's."""
    x = _data(4, 3, 6, 6, seed=15)
    y = np.array([0, 1, 2, 1])
    runs = []
    for devices in (None, D2):
        rng = np.random.default_rng(16)
        conv, bn, lin = nn.Conv2d(3, 4, 3), nn.BatchNorm(4), nn.Linear(16, 3)
        for p in (conv.weight, conv.bias, lin.weight, lin.bias):
            p.replace(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.3))
        params = [conv.weight, conv.bias, bn.weight, bn.bias, lin.weight, lin.bias]
        xt, yt = Tensor(x), Tensor(y)
        if devices:
            for p in (*params, bn.running_mean, bn.running_var):
                p.to_(devices)
            xt, yt = xt.shard(devices, axis=0), yt.shard(devices, axis=0)
        opt = Adam(params, lr=0.01)
        losses = []
        with Tensor.train():
            for _ in range(2):
                opt.zero_grad()
                loss = lin(bn(conv(xt)).relu().max_pool2d().flatten(1)).sparse_categorical_crossentropy(yt)
                loss.backward()
                Tensor.realize_all(loss, *opt.schedule_step())
                losses.append(loss.item())
        runs.append(losses)
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-5)


def test_creation_on_a_tuple_of_devices():
    """zeros/full/empty on a tuple of devices are replicated (tinygrad); random numbers are drawn on one device
    (tinygrad raises ValueError too)."""
    devs = ("CPU:0", "CPU:1")
    z = Tensor.full((4, 2), 3.0, device=devs)
    assert isinstance(z.device, tuple) and len(z.device) == 2
    np.testing.assert_array_equal((z + Tensor.zeros(4, 2, device=devs)).numpy(), np.full((4, 2), 3.0))
    assert Tensor.empty(4, 2, device=devs).shape == (4, 2)
    with pytest.raises(ValueError, match="single device"):
        Tensor.rand(4, 2, device=devs)


# --- copies of a range of a buffer ---------------------------------------------------------------------------
@pytest.mark.parametrize("dest", ["CPU:1", "PYTHON"])
def test_copy_of_a_contiguous_range_reads_the_buffer_in_place(dest):
    """A slice that is a contiguous range of a realized buffer is copied straight out of it (one COPY that starts
    at the slice's offset, no kernel); a strided slice still gets a kernel first. PYTHON: through the host."""
    a = _data(6, 4, seed=21)
    x = Tensor(a).realize()
    part = x[2:4].to(dest)
    items = part.schedule()
    assert [(si.ast.op, si.ast.arg) for si in items] == [(Ops.COPY, (8, 8))]
    np.testing.assert_array_equal(part.numpy(), a[2:4])
    strided = x[:, 1].to(dest)
    assert [si.ast.op for si in strided.schedule()].count(Ops.COPY) == 1 and len(strided.schedule()) == 2
    np.testing.assert_array_equal(strided.numpy(), a[:, 1])


def test_ring_hops_copy_chunks_out_of_the_partials():
    """The ring's first hop of every chunk copies it straight from the partial result's buffer: no kernel
    stores a chunk only to be copied; the allgather copies every chunk into its place in each device's result
    (a gathering copy: no kernel joins them). So a sum of realized one-row shards is copies plus one add per
    hop."""
    a = _data(4, 8, seed=22)
    s = Tensor(a).shard(D4, axis=0).realize()
    with Context(NATIVE_ALLREDUCE=0):
        total = s.sum(0)
        items = total.schedule()
    copies = [si for si in items if si.ast.op is Ops.COPY]
    hops = [si for si in copies if len(si.ast.arg) == 2]
    assert sorted({si.ast.arg[1] for si in hops}) == [0, 2, 4, 6]  # the first hops start inside the partials
    placed = sorted((si.bufs[0].device, si.ast.arg[2]) for si in copies if len(si.ast.arg) == 3)
    assert placed == sorted((d, off) for d in ("CPU", "CPU:1", "CPU:2", "CPU:3") for off in (0, 2, 4, 6))
    assert len(items) - len(copies) == 4 * 3  # an add on each of the 3 later devices per chunk, no joins
    np.testing.assert_allclose(total.numpy(), a.sum(0), rtol=1e-5, atol=1e-6)


def test_a_copy_into_a_range_without_offset_views_patches_through_the_host():
    """A gathering copy's piece lands in a range of its destination through the allocator's offset view; an
    allocator that cannot make one for that range has the destination patched through host memory."""
    from ember.device.buffer import Buffer
    from ember.dtype import dtypes
    from ember.engine.realize import BufferCopy

    dest, src = Buffer("CPU:1", 6, dtypes.float32).allocate(), Buffer("CPU", 4, dtypes.float32).allocate()
    dest.copyin(memoryview(np.zeros(6, np.float32)).cast("B"))
    src.copyin(memoryview(np.arange(4, dtype=np.float32)).cast("B"))
    BufferCopy(8, "CPU:1", "CPU", 4, 12)([dest, src])
    np.testing.assert_array_equal(np.frombuffer(dest.as_bytes(), np.float32), [0, 0, 0, 1, 2, 0])
    real = dest.allocator.offset

    def refuse(*args):
        raise NotImplementedError("no views here")

    dest.allocator.offset = refuse
    try:
        BufferCopy(4, "CPU:1", "CPU", 12, 0)([dest, src])
    finally:
        dest.allocator.offset = real
    np.testing.assert_array_equal(np.frombuffer(dest.as_bytes(), np.float32), [3, 0, 0, 1, 2, 0])
    with pytest.raises(ValueError, match="to offset 16 of a 24-byte buffer"):
        BufferCopy(12, "CPU:1", "CPU", 0, 16)([dest, src])
