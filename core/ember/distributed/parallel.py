"""Data-parallel training across ranks: gradient averaging for an optimizer, a sampler, checkpoints.

Every rank holds the whole model, takes its share of each global batch and computes gradients on it;
:class:`DataParallel` averages the gradients over the ranks before the update, so every rank makes the same
update and the replicas stay equal (they start equal: the parameters are broadcast from rank 0)::

    dist.init()
    opt = dist.DataParallel(Adam(get_parameters(model), lr=1e-3), bucket_mb=25)
    sampler = dist.DistributedSampler(len(dataset), shuffle=True, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)                    # this rank's indices, ~len/world of them
        for i in range(0, len(order) - b + 1, b):
            opt.zero_grad()
            loss = model(x[order[i:i + b]]).sparse_categorical_crossentropy(y[order[i:i + b]]).backward()
            opt.step(loss)                       # gradients averaged in buckets, then the update
    dist.save_checkpoint(get_state_dict(model), "model.safetensors")   # rank 0 writes, every rank waits

With a local batch of ``B / world`` per rank the run equals one process with the global batch ``B`` (up to the
order float32 sums are added in), as long as nothing mixes samples inside the model (BatchNorm's batch
statistics are per rank, as in torch's DDP without SyncBatchNorm).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator

from ember.distributed import Work, _backend, all_reduce, barrier, broadcast
from ember.tensor import Tensor

if TYPE_CHECKING:
    import numpy as np

    from ember.nn.optim import Optimizer
else:
    from ember.helpers import lazy_numpy as np


class DataParallel:
    """Wraps an optimizer: ``step()`` first averages every gradient over the ranks, in buckets.

    Gradients are packed into flat buckets of at most ``bucket_mb`` MiB (one dtype each, the last parameters
    first, as the backward pass produces them) and each bucket is one all-reduce: few large messages instead of
    one per parameter. ``bucket_mb=0`` sends every gradient on its own. With ``overlap=True`` each bucket is
    realized and its all-reduce started before the next bucket is computed, so the transfer of one overlaps the
    computation of the next (the backward work the buckets share is then computed once per bucket); by default
    all buckets are computed in one schedule and then sent together. ``average=False`` sums instead.

    The parameters and buffers (BatchNorm statistics ...) are broadcast from rank ``src`` when it is made.
    Everything else (``lr``, ``state_dict()``, schedules) is the wrapped optimizer's.
    """

    def __init__(self, opt: Optimizer, bucket_mb: float = 25.0, average: bool = True, overlap: bool = False,
                 src: int = 0):
        from ember.nn.optim import Optimizer

        if not isinstance(opt, Optimizer):
            raise TypeError(f"DataParallel wraps an ember optimizer, got {type(opt).__name__}")
        if not (isinstance(bucket_mb, (int, float)) and bucket_mb >= 0 and math.isfinite(bucket_mb)):
            raise ValueError(f"bucket_mb must be a size in MiB >= 0, got {bucket_mb!r}")
        self.opt, self.average, self.overlap = opt, average, overlap
        self.bucket_bytes = int(bucket_mb * 2 ** 20)
        self.world_size = _backend().world_size
        self.messages = 0  # all-reduces started so far (buckets), for tests and reports
        self.broadcast_parameters(src)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.opt, name)

    def broadcast_parameters(self, src: int = 0) -> None:
        """Give every rank rank ``src``'s parameters and buffers (in place)."""
        for t in (*self.opt.params, *self.opt.buffers):
            broadcast(t, src)

    def buckets(self, params: list[Tensor]) -> list[list[Tensor]]:
        """``params`` grouped into buckets: the last parameters first, one dtype per bucket, at most
        ``bucket_bytes`` each (a parameter larger than that is a bucket of its own)."""
        out: list[list[Tensor]] = []
        open_: dict[Any, tuple[list[Tensor], int]] = {}
        for p in reversed(params):
            size = p.numel() * p.dtype.itemsize
            cur, used = open_.get(p.dtype, ([], 0))
            if cur and (self.bucket_bytes == 0 or used + size > self.bucket_bytes):
                out.append(cur)
                cur, used = [], 0
            open_[p.dtype] = ([*cur, p], used + size)
        out.extend(cur for cur, _ in open_.values() if cur)
        return out

    def sync_gradients(self, *also: Tensor) -> None:
        """Average (or sum) every parameter's ``.grad`` over the ranks; ``also`` (e.g. the loss) is realized
        in the same schedule as the gradients."""
        params = [p for p in self.opt.params if p.grad is not None]
        if self.world_size == 1 or not params:
            if also:
                Tensor.realize_all(*also)
            return
        op = "avg" if self.average else "sum"
        buckets = self.buckets(params)
        flats = [_flat([_grad(p) for p in bucket]) for bucket in buckets]
        works: list[Work] = []
        if self.overlap:
            for i, flat in enumerate(flats):
                Tensor.realize_all(flat, *(also if i == 0 else ()))
                works.append(all_reduce(flat, op, async_op=True))
        else:
            Tensor.realize_all(*flats, *also)
            works = [all_reduce(flat, op, async_op=True) for flat in flats]
        self.messages += len(works)
        for bucket, work in zip(buckets, works):
            flat = work.wait()
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad = flat[offset:offset + n].reshape(p.shape) if len(bucket) > 1 else flat.reshape(p.shape)
                offset += n

    def zero_grad(self) -> None:
        """Forget the gradients (the wrapped optimizer's ``zero_grad``)."""
        self.opt.zero_grad()

    def step(self, *also: Tensor) -> None:
        """Average the gradients over the ranks, then update the parameters."""
        self.sync_gradients(*also)
        self.opt.step()

    def schedule_step(self, *also: Tensor) -> list[Tensor]:
        """Average the gradients now, then build the update (``Tensor.realize_all(loss, *dp.schedule_step(loss))``)."""
        self.sync_gradients(*also)
        return self.opt.schedule_step()


def _grad(p: Tensor) -> Tensor:
    assert p.grad is not None
    return p.grad


def _flat(grads: list[Tensor]) -> Tensor:
    if len(grads) == 1:
        return grads[0].flatten().contiguous()
    return Tensor.cat(*[g.flatten() for g in grads]).contiguous()


class DistributedSampler:
    """This rank's share of the indices ``0 .. n - 1``, reshuffled every epoch the same way on every rank.

    The (shuffled) order is cut round-robin: rank ``r`` gets positions ``r, r + world, r + 2 world ...``, so
    local batch ``i`` of every rank together is exactly batch ``i`` of the global order with the global
    batch size. Unless ``drop_last``, the order is padded with its first indices to a multiple of the world
    size (every rank takes the same number of steps); with ``drop_last`` the tail is dropped instead.
    """

    def __init__(self, n: int, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"DistributedSampler: n must be a number of samples >= 0, got {n!r}")
        if num_replicas is None or rank is None:
            b = _backend()
            num_replicas = b.world_size if num_replicas is None else num_replicas
            rank = b.rank if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: rank {rank} is not a rank of {num_replicas} replicas")
        self.n, self.num_replicas, self.rank = n, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (call it before each epoch: the shuffle depends on it)."""
        self.epoch = epoch

    def global_order(self) -> np.ndarray:
        """The epoch's order of every index, before it is cut into shares (the same on every rank)."""
        order = (np.random.default_rng((self.seed, self.epoch)).permutation(self.n) if self.shuffle
                 else np.arange(self.n))
        if self.drop_last:
            return order[:self.n - self.n % self.num_replicas]
        pad = -self.n % self.num_replicas
        return np.concatenate([order, np.resize(order, pad)]) if pad and self.n else order

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch."""
        return self.global_order()[self.rank::self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return len(self.global_order()) // self.num_replicas


def save_checkpoint(tensors: dict[str, Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Rank 0 writes ``tensors`` to the safetensors file ``path``; every rank returns once it is written (so
    each may load it right after)."""
    import pathlib

    from ember.nn.state import safe_save

    if _backend().rank == 0:
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        safe_save(tensors, path, metadata=metadata)
    barrier()


class ShardedOptimizer:
    """ZeRO stage 1: each rank keeps and updates the optimizer state of 1/N of the parameters.

    The parameters (one dtype) are laid end to end in one flat vector, padded to a multiple of the world size,
    and rank ``r`` owns slice ``r`` of it. A step reduce-scatters the gradients (averaged: each rank receives
    the mean gradient of its slice only), updates its slice with its own ``optimizer_class`` instance (so
    Adam's moments take 1/N of the memory), and all-gathers the updated slices into every parameter. The
    parameters start as rank 0's. The updates equal :class:`DataParallel`'s with the same optimizer, since
    every rule here is elementwise (LAMB/LARS' per-tensor norms would differ: they are refused)."""

    def __init__(self, params: list[Tensor], optimizer_class: type, **kwargs: Any):
        from ember.nn.optim import LAMB, LARS, Optimizer

        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(f"ShardedOptimizer needs an ember optimizer class, got {optimizer_class!r}")
        params = [p for p in params if p.requires_grad is not False]
        if not params:
            raise ValueError("ShardedOptimizer got an empty parameter list")
        if len({p.dtype for p in params}) != 1:
            raise TypeError(f"ShardedOptimizer needs parameters of one dtype, got "
                            f"{sorted({str(p.dtype) for p in params})}")
        for p in params:
            p.requires_grad = True
        b = _backend()
        self.params, self.world_size, self.rank = params, b.world_size, b.rank
        for p in params:
            broadcast(p, 0)
        self.numel = sum(p.numel() for p in params)
        self.chunk = -(-self.numel // self.world_size)
        flat = _flat_padded([p.detach() for p in params], self.chunk * self.world_size)
        lo = self.rank * self.chunk
        self.shard = flat[lo:lo + self.chunk].contiguous().realize()
        self.shard.requires_grad = True
        self.inner: Optimizer = optimizer_class([self.shard], **kwargs)
        if isinstance(self.inner, LARS) or (isinstance(self.inner, LAMB) and not self.inner.adam):
            raise ValueError(f"{optimizer_class.__name__} scales each tensor by its own norm: a slice of the flat "
                             f"parameters is not a tensor of the model (use DataParallel)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def zero_grad(self) -> None:
        """Forget the parameters' gradients."""
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (moments, step counters, hyperparameters)."""
        return sum(t.numel() * t.dtype.itemsize for t in self.inner.state_dict().values())

    def step(self, *also: Tensor) -> None:
        """Reduce-scatter the gradients, update this rank's slice, all-gather the parameters; ``also`` (the loss)
        is realized with the gradients."""
        from ember.distributed import all_gather, reduce_scatter
        from ember.tensor import no_grad

        if any(p.grad is None for p in self.params):
            missing = [i for i, p in enumerate(self.params) if p.grad is None]
            raise RuntimeError(f"ShardedOptimizer.step: parameters {missing} have no gradient (call backward first)")
        flat_grad = _flat_padded([_grad(p) for p in self.params], self.chunk * self.world_size)
        Tensor.realize_all(flat_grad, *also)
        self.shard.grad = reduce_scatter(flat_grad, "avg") if self.world_size > 1 else flat_grad
        self.inner.step()
        full = all_gather(self.shard.detach())
        offset = 0
        with no_grad():
            for p in self.params:
                n = p.numel()
                p.assign(full[offset:offset + n].reshape(p.shape))
                offset += n
        Tensor.realize_all(*self.params)


def _flat_padded(ts: list[Tensor], size: int) -> Tensor:
    flat = _flat(ts)
    return flat.pad(((0, size - flat.numel()),)) if size > flat.numel() else flat
