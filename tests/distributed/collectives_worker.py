"""One rank of the multi-process tests (started by ``python -m ember.distributed.run``): every collective on
rank-dependent inputs, async handles, and DataParallel with and without buckets, under TinyJit
and with sharded optimizer state (ZeRO-1). Each rank
saves what it got to ``OUT/rank<R>.npz``; the test compares it with numpy. ``OUT`` is the first argument."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

import ember.distributed as dist
from ember import Tensor, TinyJit, dtypes
from ember.nn import Linear, get_parameters
from ember.nn.optim import SGD, Adam

out_dir = sys.argv[1]
dist.init()
r, n = dist.rank(), dist.world_size()
res: dict[str, np.ndarray] = {}


def base(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """Rank-dependent values (the test rebuilds them for every rank)."""
    return (np.arange(np.prod(shape)).reshape(shape) % 7 + r * 3 - 2).astype(dtype)


for op in ("sum", "prod", "max", "min", "avg"):
    t = Tensor(base((3, 5)))
    assert dist.all_reduce(t, op) is t
    res[f"all_reduce_{op}"] = t.numpy()
for name, dt in (("int32", dtypes.int32), ("int64", dtypes.int64), ("float16", dtypes.float16),
                 ("bfloat16", dtypes.bfloat16), ("bool", dtypes.bool)):
    t = Tensor(base((6,)), dtype=dt) if dt != dtypes.bool else Tensor(base((6,)) > 2)
    dist.all_reduce(t)
    res[f"all_reduce_sum_{name}"] = t.numpy()
v = Tensor(base((4, 3))).permute(1, 0)[1:]  # a view: reduced through a copy that becomes the tensor
dist.all_reduce(v, "max")
res["all_reduce_view"] = v.numpy()
pending = [dist.all_reduce(Tensor(base((1000,)) * (k + 1)), async_op=True) for k in range(3)]
res["async_before_wait"] = np.array([w.is_completed() in (True, False) for w in pending])
res["async_results"] = np.stack([w.wait().numpy() for w in pending])
for src in range(n):
    t = Tensor(base((2, 2), np.int32))
    dist.broadcast(t, src)
    res[f"broadcast_{src}"] = t.numpy()
res["all_gather"] = dist.all_gather(Tensor(base((2, 3)))).numpy()
res["all_gather_0d"] = dist.all_gather(Tensor(float(r))).numpy()
res["reduce_scatter"] = dist.reduce_scatter(Tensor(base((2 * n, 3)))).numpy()
res["reduce_scatter_avg"] = dist.reduce_scatter(Tensor(base((n, 2))), op="avg", async_op=True).wait().numpy()
dist.barrier()
dist.barrier(async_op=True).wait()

# tensors on two devices of this process: reduced inside, across the ranks, and put back as they were
sharded = Tensor(base((4, 2))).shard(("CPU:0", "CPU:1"), axis=0)
dist.all_reduce(sharded)
res["multi_sharded"] = sharded.numpy()
res["multi_sharded_device"] = np.array([str(sharded.device)])
replicated = Tensor(base((3,))).to(("CPU:0", "CPU:1"))
dist.all_reduce(replicated, "max")
res["multi_replicated"] = np.stack([replicated.to(d).numpy() for d in ("CPU:0", "CPU:1")])


def train(bucket_mb: float, overlap: bool, opt_cls: type, jit: bool = False, steps: int = 3,
          zero: bool = False) -> list[np.ndarray]:
    """A few steps of a small MLP; each rank sees different data; the parameters start different per rank."""
    Tensor.manual_seed(100 + r)  # different initial weights on each rank: DataParallel broadcasts rank 0's
    l1, l2 = Linear(6, 40), Linear(40, 3)
    params = get_parameters([l1, l2])
    opt: Any = (dist.ShardedOptimizer(params, opt_cls, lr=0.05) if zero else
                dist.DataParallel(opt_cls(params, lr=0.05), bucket_mb=bucket_mb, overlap=overlap))

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y).backward()
        if zero:
            opt.step(loss)
        else:
            Tensor.realize_all(loss, *opt.schedule_step(loss))
        return loss

    run = TinyJit(step) if jit else step
    rng = np.random.default_rng(r)
    for _ in range(steps):
        x, y = rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)
        run(Tensor(x), Tensor(y))
    if zero:
        full = opt_cls(get_parameters([Linear(6, 40), Linear(40, 3)]), lr=0.05)
        res[f"zero_state_bytes_{opt_cls.__name__}"] = np.array(
            [opt.state_bytes(), sum(t.numel() * t.dtype.itemsize for t in full.state_dict().values())])
    else:
        res[f"messages_{bucket_mb}_{overlap}_{opt_cls.__name__}_{jit}"] = np.array([opt.messages])
    return [p.numpy() for p in params]


for opt_cls in (SGD, Adam):
    for key, (mb, ov, jit) in {"bucket0": (0.0, False, False), "bucket_small": (0.001, False, False),
                               "bucket_big": (25.0, False, False), "overlap": (0.001, True, False),
                               "jit": (0.001, False, True)}.items():
        for i, p in enumerate(train(mb, ov, opt_cls, jit, steps=4 if jit else 3)):
            res[f"dp_{opt_cls.__name__}_{key}_{i}"] = p
    for i, p in enumerate(train(0, False, opt_cls, zero=True)):
        res[f"dp_{opt_cls.__name__}_zero_{i}"] = p

np.savez(f"{out_dir}/rank{r}.npz", **res)
print(f"rank {r} of {n}: done")
