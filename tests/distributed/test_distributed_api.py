"""ember.distributed in one process: the backend registry (a third-party backend through the entry-point
group), the tensor side of every collective against a backend that stands in for an identical peer, argument
errors, the sampler, and the NCCL backend's checks (its runtime needs two GPUs: skipped with the reason)."""
from __future__ import annotations

import ctypes
import pathlib
import re
import sys
import textwrap
import types
from typing import Any, Iterator

import numpy as np
import pytest

import ember.distributed as dist
from ember import Device, Tensor, dtypes
from ember.device import DeviceSpec, hookimpl
from ember.distributed import DistributedSampler, DistributedTimeout
from ember.distributed.backend import ENTRY_POINT_GROUP, backends, get_backend
from ember.distributed.nccl import NCCLBackend, nccl_devices, nccl_dtype, nccl_op
from ember_cpu.device import CPUDevice

# A backend as a third party would ship it: a world of two ranks whose peer always holds the same values as
# this rank (so a sum doubles, a gather repeats) and a "stuck" mode whose requests never finish.
MIRROR_BACKEND = """
import numpy as np
from ember.distributed import Backend, DoneRequest, Request


class Never(Request):
    def test(self):
        return False


class MirrorBackend(Backend):
    name = "mirror"
    memory = "host"
    stuck = False
    calls = []

    def __init__(self):
        self.rank, self.world_size = 0, 2

    def _done(self, what):
        self.calls.append(what)
        return Never() if self.stuck else DoneRequest()

    def all_reduce(self, buf, op):
        if op == "sum":
            buf += buf
        elif op == "prod":
            buf *= buf
        return self._done("all_reduce")

    def broadcast(self, buf, src):
        if src != self.rank:
            buf[...] = 7
        return self._done("broadcast")

    def all_gather(self, send, recv):
        recv[:send.size] = send
        recv[send.size:] = send
        return self._done("all_gather")

    def reduce_scatter(self, send, recv, op):
        recv[...] = send[:recv.size] * 2
        return self._done("reduce_scatter")

    def barrier(self):
        return self._done("barrier")
"""


@pytest.fixture
def mirror(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The mirror backend installed as a distribution with an ``ember.distributed.backends`` entry point, and
    ember.distributed initialized with it."""
    (tmp_path / "ember_mirror.py").write_text(MIRROR_BACKEND)
    info = tmp_path / "ember_mirror-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ember-mirror\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmirror = ember_mirror:MirrorBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("EMBER_RANK", "EMBER_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    dist.shutdown()
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # init() wraps it for a world > 1
    b = dist.init(backend="mirror", timeout=0.5)
    type(b).calls.clear()
    yield b
    dist.shutdown()
    sys.modules.pop("ember_mirror", None)


def test_third_party_backend_is_found_through_its_entry_point(mirror: Any) -> None:
    assert "mirror" in backends() and backends()["mirror"].origin.startswith("ember-mirror")
    assert {"mpi", "nccl"} <= set(backends())
    assert (dist.rank(), dist.world_size(), dist.is_initialized()) == (0, 2, True)


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_collectives_through_a_host_backend(mirror: Any, dev: str) -> None:
    if dev not in Device.available():
        pytest.skip(f"{dev}: {Device.probe(dev)}")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor(x, device=dev)
    assert dist.all_reduce(t) is t
    np.testing.assert_array_equal(t.numpy(), 2 * x)
    t = Tensor(x, device=dev)
    np.testing.assert_array_equal(dist.all_reduce(t, "avg").numpy(), x)  # (x + x) / 2
    h = Tensor(x, device=dev, dtype=dtypes.bfloat16)  # reduced as float32, written back as bfloat16
    dist.all_reduce(h)
    assert h.dtype == dtypes.bfloat16 and h.numpy().tolist() == (2 * x).tolist()
    v = Tensor(x, device=dev).permute(1, 0)  # a view is copied into a buffer of its own, which it becomes
    dist.all_reduce(v)
    np.testing.assert_array_equal(v.numpy(), 2 * x.T)
    b = Tensor([1, 2], device=dev, dtype=dtypes.int32)
    dist.broadcast(b, src=1)
    assert b.numpy().tolist() == [7, 7] and b.dtype == dtypes.int32
    g = dist.all_gather(Tensor(x, device=dev))
    assert g.shape == (4, 3) and g.device == Device.canonicalize(dev)
    np.testing.assert_array_equal(g.numpy(), np.concatenate([x, x]))
    rs = dist.reduce_scatter(Tensor(np.arange(4, dtype=np.float32), device=dev))
    assert rs.numpy().tolist() == [0.0, 2.0]
    assert dist.barrier() is None
    assert type(mirror).calls == ["all_reduce"] * 4 + ["broadcast", "all_gather", "reduce_scatter", "barrier"]


def test_empty_tensors_get_the_shapes_a_peer_would_give(mirror: Any) -> None:
    """Nothing is sent, but the result has the collective's shape (a world of two)."""
    assert dist.all_gather(Tensor.empty(0, 3)).shape == (0, 3)
    assert dist.reduce_scatter(Tensor.empty(4, 0)).shape == (2, 0)
    t = Tensor.empty(2, 0)
    assert dist.all_reduce(t) is t and dist.broadcast(t, src=1) is t
    assert type(mirror).calls == []


def test_collectives_of_a_tensor_on_several_devices(mirror: Any) -> None:
    """Through one device and back: in place keeps the placement, a new tensor comes back on the same devices."""
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    devs = ("CPU", "CPU:1")
    s = Tensor(x).shard(devs, axis=0)
    assert dist.all_reduce(s) is s and s.device == devs
    np.testing.assert_array_equal(s.numpy(), 2 * x)
    g = dist.all_gather(Tensor(x).to(devs))
    assert g.shape == (8, 2) and g.device == devs
    np.testing.assert_array_equal(g.numpy(), np.concatenate([x, x]))
    rs = dist.reduce_scatter(Tensor(x).to(devs))
    assert rs.device == devs
    np.testing.assert_array_equal(rs.numpy(), 2 * x[:2])
    assert type(mirror).calls == ["all_reduce", "all_gather", "reduce_scatter"]


def test_results_computed_from_the_old_values_are_not_reused(mirror: Any) -> None:
    t = Tensor([1.0, 2.0, 3.0])
    later, now = t * 2, t * 2  # one graph node: realizing `now` remembers its result for `later`
    now.realize()
    dist.all_reduce(t)
    assert now.numpy().tolist() == [2.0, 4.0, 6.0]  # realized before: keeps its value
    assert later.numpy().tolist() == [4.0, 8.0, 12.0]  # lazy until now: reads t's new contents (as after assign)


def test_async_handle_and_timeout(mirror: Any) -> None:
    t = Tensor([1.0, 2.0])
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, dist.Work) and work.is_completed()
    assert work.wait() is t and t.numpy().tolist() == [2.0, 4.0]
    type(mirror).stuck = True
    try:
        stuck = dist.all_reduce(Tensor([1.0]), async_op=True)
        assert not stuck.is_completed()
        with pytest.raises(DistributedTimeout, match=r"all_reduce\(sum\) of \(1,\).*did not complete within 0.05 s"):
            stuck.wait(timeout=0.05)
        with pytest.raises(DistributedTimeout, match="barrier on rank 0 did not complete within 0.5 s"):
            dist.barrier()
    finally:
        type(mirror).stuck = False


def test_bad_arguments_are_named(mirror: Any) -> None:
    with pytest.raises(ValueError, match="unknown op 'mean'; expected one of sum, prod, max, min, avg"):
        dist.all_reduce(Tensor([1.0]), "mean")
    with pytest.raises(TypeError, match="op 'avg' needs a floating-point tensor, got dtypes.int"):
        dist.all_reduce(Tensor([1, 2]), "avg")
    with pytest.raises(TypeError, match="all_reduce takes a Tensor, got ndarray"):
        dist.all_reduce(np.ones(2))
    with pytest.raises(ValueError, match="src=2 is not a rank of this world of 2"):
        dist.broadcast(Tensor([1.0]), src=2)
    with pytest.raises(ValueError, match=r"axis 0 of shape \(3, 2\) does not split evenly over 2 ranks"):
        dist.reduce_scatter(Tensor.ones(3, 2))
    with pytest.raises(dist.DistributedError, match="already initialized with the 'mirror' backend"):
        dist.init(backend="mpi")


def test_not_initialized_and_unknown_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    dist.shutdown()
    with pytest.raises(dist.DistributedError, match=r"not initialized: call ember.distributed.init\(\) first"):
        dist.rank()
    with pytest.raises(ValueError, match="unknown distributed backend 'ucx'; known: .*mpi, nccl"):
        get_backend("ucx")
    monkeypatch.setenv("EMBER_RANK", "3")
    monkeypatch.setenv("EMBER_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="EMBER_RANK=3 is not a rank of a world of EMBER_WORLD_SIZE=2"):
        dist.init()


def test_launcher_environment_must_match_the_backend(mirror: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dist.shutdown()
    monkeypatch.setenv("EMBER_RANK", "1")
    monkeypatch.setenv("EMBER_WORLD_SIZE", "4")
    with pytest.raises(dist.DistributedError, match="EMBER_RANK/EMBER_WORLD_SIZE says rank 1 of 4, but the mirror "
                                                    "backend sees rank 0 of 2"):
        dist.init(backend="mirror")


def test_data_parallel_buckets_and_averages(mirror: Any) -> None:
    from ember.nn import Linear, get_parameters
    from ember.nn.optim import SGD

    layers = [Linear(4, 300), Linear(300, 2)]  # weights 4800 and 2400 bytes, biases 1200 and 8
    params = get_parameters(layers)
    dp = dist.DataParallel(SGD(params, lr=0.1), bucket_mb=3000 / 2 ** 20)  # last first: 2408, 1200, 4800 bytes
    assert [[tuple(p.shape) for p in b] for b in dp.buckets(params)] == [[(2,), (2, 300)], [(300,)], [(300, 4)]]
    assert [len(b) for b in dist.DataParallel(SGD(params), bucket_mb=0).buckets(params)] == [1, 1, 1, 1]
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    layers[1](layers[0](x).relu()).sum().backward()
    grads = [p.grad.numpy() for p in params]
    dp.sync_gradients()
    for p, g in zip(params, grads):  # the mirror peer has the same gradients: their average is the gradient
        np.testing.assert_array_equal(p.grad.numpy(), g)
    assert dp.messages == 3
    with pytest.raises(TypeError, match="DataParallel wraps an ember optimizer, got list"):
        dist.DataParallel(params)
    with pytest.raises(ValueError, match="bucket_mb must be a size in MiB >= 0, got -1"):
        dist.DataParallel(SGD(params), bucket_mb=-1)


def test_sampler_shares_cover_the_global_order() -> None:
    shares = [DistributedSampler(10, num_replicas=3, rank=r, seed=4) for r in range(3)]
    order = shares[0].global_order()
    assert len(order) == 12 and sorted(order[:10].tolist()) == list(range(10))  # padded with its first two
    assert [len(s) for s in shares] == [4, 4, 4]
    # local batch i of every rank together is global batch i
    assert sorted(sum((s.indices()[:1].tolist() for s in shares), [])) == sorted(order[:3].tolist())
    dropped = DistributedSampler(10, num_replicas=3, rank=0, drop_last=True, shuffle=False)
    assert list(dropped) == [0, 3, 6]
    first = shares[1].indices().tolist()
    shares[1].set_epoch(1)
    assert shares[1].indices().tolist() != first
    with pytest.raises(ValueError, match="rank 3 is not a rank of 3 replicas"):
        DistributedSampler(10, num_replicas=3, rank=3)


def test_nccl_backend_checks_without_a_gpu() -> None:
    assert nccl_dtype(dtypes.bfloat16) == "BFLOAT16" and nccl_op("max") == "MAX"
    with pytest.raises(TypeError, match="the nccl backend cannot send dtypes.bool tensors"):
        nccl_dtype(dtypes.bool)
    with pytest.raises(ValueError, match="the nccl backend has no reduction 'mean'; expected one of sum, prod, max"):
        nccl_op("mean")
    reason = NCCLBackend.probe()
    assert reason is None or "nccl4py" in reason or "CUDA" in reason, reason
    if reason is not None:
        with pytest.raises(RuntimeError, match="distributed backend 'nccl' is unusable here: " + re.escape(reason)):
            get_backend("nccl")


def test_nccl_backend_rejects_a_host_tensor(mirror: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(mirror), "memory", "CUDA")
    with pytest.raises(ValueError, match="the mirror backend works on CUDA tensors; this one is on CPU"):
        dist.all_reduce(Tensor([1.0], device="CPU"))


# --- the NCCL backend over a plugin that declares buffers NCCL can address (ember.device.NCCLMemory) ----------
class NcclHostDevice(CPUDevice):
    """A host device standing in for a GPU: its "device pointer" is the host address of the buffer, so the fake
    NCCL below can reach the memory; ``count`` devices, stream handle 0x5EED."""

    count = 2

    @classmethod
    def nccl_device_count(cls) -> int:
        return cls.count

    def nccl_pointer(self, opaque: Any) -> int:
        return int(opaque.address)

    def nccl_stream(self) -> int:
        return 0x5EED


class NcclHostPlugin:
    @hookimpl
    def ember_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec("NCCLHOST", factory=f"{__name__}:NcclHostDevice", priority=-100)]


class _FakeComm:
    """nccl4py's communicator for a world of two whose peer holds the same values: a sum doubles in place."""

    calls: list[tuple[str, int, str, Any, int]] = []

    def allreduce(self, send: Any, recv: Any, op: Any, stream: int) -> None:
        ai = recv.__cuda_array_interface__
        self.calls.append(("allreduce", ai["data"][0], ai["typestr"], op, stream))
        ptr, (n,) = ai["data"][0], ai["shape"]
        arr = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))
        arr *= 2

    def destroy(self) -> None:
        pass


class _FakeMPI(dist.Backend):
    """The MPI bootstrap of rank 0 of 2, without MPI."""

    name, memory = "mpi", "host"

    def __init__(self) -> None:
        self.rank, self.world_size = 0, 2
        self.comm = types.SimpleNamespace(Bcast=lambda buf, root: None)

    def close(self) -> None:
        pass


@pytest.fixture
def fake_nccl(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in ``nccl.core`` and MPI bootstrap, the NCCLHOST plugin registered, no backend initialized."""
    import ember.distributed.mpi as mpi

    nc = types.ModuleType("nccl.core")
    nc.SUM, nc.MAX = "ncclSum", "ncclMax"  # type: ignore[attr-defined]
    nc.get_unique_id = lambda empty=False: b"\0" * 128  # type: ignore[attr-defined]
    nc.UniqueId = types.SimpleNamespace(from_bytes=bytes)  # type: ignore[attr-defined]
    nc.Communicator = types.SimpleNamespace(init=lambda n, rank, uid: _FakeComm())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nccl", types.ModuleType("nccl"))
    monkeypatch.setitem(sys.modules, "nccl.core", nc)
    monkeypatch.setattr(mpi, "MPIBackend", _FakeMPI)
    for var in ("EMBER_RANK", "EMBER_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # init() wraps it for a world > 1
    dist.shutdown()
    Device.register_plugin(NcclHostPlugin(), "nccl-host")
    _FakeComm.calls.clear()
    try:
        yield nc
    finally:
        dist.shutdown()
        NcclHostDevice.count = 2
        Device.unregister_plugin("nccl-host")


def test_nccl_backend_runs_on_the_buffers_a_plugin_declares(fake_nccl: types.ModuleType) -> None:
    assert nccl_devices() == ("NCCLHOST", 2, None)
    assert NCCLBackend.probe() is None
    b = dist.init(backend="nccl")
    assert (b.memory, b.device_name) == ("NCCLHOST", "NCCLHOST")  # local rank 0
    t = Tensor([1.0, 2.0, 3.0], device="NCCLHOST") * 1
    dist.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), [2.0, 4.0, 6.0])  # the fake NCCL wrote the tensor's own memory
    [(what, ptr, typestr, op, stream)] = _FakeComm.calls
    assert (what, typestr, op, stream) == ("allreduce", "<f4", "ncclSum", 0x5EED)
    assert ptr == t._buffer().opaque.address
    with pytest.raises(ValueError, match="the nccl backend works on NCCLHOST tensors; this one is on CPU"):
        dist.all_reduce(Tensor([1.0], device="CPU"))


def test_nccl_backend_names_why_no_device_fits(fake_nccl: types.ModuleType) -> None:
    NcclHostDevice.count = 0
    kind, count, reason = nccl_devices()
    assert (kind, count) == (None, 0) and "NCCLHOST: no device NCCL can address" in str(reason)
    assert "no device for NCCL: " in str(NCCLBackend.probe())
    with pytest.raises(RuntimeError, match="the nccl backend has no device: .*NCCLHOST: no device NCCL can addr"):
        NCCLBackend()


_NCCL_REASON = NCCLBackend.probe()
_GPUS = nccl_devices()[1] if _NCCL_REASON is None else 0


@pytest.mark.skipif(_GPUS < 2, reason=f"the NCCL runtime test needs two CUDA devices; here: "
                                      f"{_NCCL_REASON or f'{_GPUS} device(s)'}")
def test_nccl_two_gpus(tmp_path: pathlib.Path) -> None:
    import subprocess

    script = tmp_path / "nccl.py"
    script.write_text(textwrap.dedent("""
        import ember.distributed as dist
        from ember import Tensor
        dist.init(backend="nccl")
        t = Tensor([1.0 + dist.rank()], device=f"CUDA:{dist.local_rank()}")
        dist.all_reduce(t)
        assert t.numpy().tolist() == [3.0], t.numpy()
        print("nccl ok")
    """))
    p = subprocess.run([sys.executable, "-m", "ember.distributed.run", "-n", "2", str(script)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.count("nccl ok") == 2, p.stdout + p.stderr


def test_doctor_lists_the_backends() -> None:
    from ember.doctor import distributed_report

    lines = distributed_report()
    assert any(line.startswith("mpi ") for line in lines)
    nccl = next(line for line in lines if line.startswith("nccl "))
    assert "usable" in nccl


def test_sharded_optimizer_refuses_what_it_cannot_shard(mirror: Any) -> None:
    from ember.nn.optim import LAMB, Adam

    w, h = Tensor.ones(3, 4, requires_grad=True), Tensor.ones(5, requires_grad=True, dtype=dtypes.float16)
    with pytest.raises(ValueError, match="LAMB scales each tensor by its own norm"):
        dist.ShardedOptimizer([w], LAMB)
    with pytest.raises(TypeError, match=r"parameters of one dtype, got \['dtypes.float', 'dtypes.half'\]"):
        dist.ShardedOptimizer([w, h], Adam)
    with pytest.raises(TypeError, match="needs an ember optimizer class, got 3"):
        dist.ShardedOptimizer([w], 3)  # type: ignore[arg-type]
    z = dist.ShardedOptimizer([w, Tensor.ones(3, requires_grad=True)], Adam, lr=0.1)
    assert (z.numel, z.chunk, z.shard.shape) == (15, 8, (8,))  # padded to 16, rank 0 of 2 owns 8
    assert z.state_bytes() == 2 * 8 * 4 + 4 * 4  # m and v of 8 elements, lr, b1, b2 and the step count
    with pytest.raises(RuntimeError, match=r"parameters \[0, 1\] have no gradient"):
        z.step()
