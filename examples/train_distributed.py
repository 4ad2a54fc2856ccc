"""Data-parallel training of an MLP on the 8x8 digits, on one process or many.

    python examples/train_distributed.py                                    # one process, global batch 64
    python -m ember.distributed.run -n 2 examples/train_distributed.py      # 2 ranks, 32 images each per step

``--batch-size`` is the global batch: each of the N ranks takes ``batch / N`` images of every step (a
:class:`~ember.distributed.DistributedSampler` cuts the same shuffled order on every rank) and the gradients
are averaged over the ranks, so N ranks make the same updates as one process with the whole batch, up to
the order float32 sums are added in. ``--save`` writes the final parameters (rank 0 writes, all wait), which
is how the tests compare a 2-rank run with a 1-process run.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ember.distributed as dist
from ember import Tensor, dtypes, no_grad
from ember.nn import Linear, get_parameters, get_state_dict
from ember.nn.datasets import digits
from ember.nn.optim import Adam


class MLP:
    """64 -> 128 -> 10 with ReLU: nothing mixes the samples of a batch, so the split over ranks is exact."""

    def __init__(self) -> None:
        self.l1, self.l2 = Linear(64, 128), Linear(128, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x.flatten(1)).relu())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=4, help="epochs (default 4)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps in all")
    p.add_argument("--batch-size", type=int, default=64, help="global batch size, split over the ranks (default 64)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate (default 3e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialization and the shuffle (default 0)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket size in MiB (0: one per tensor)")
    p.add_argument("--save", default=None, help="write the final parameters to this safetensors file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    """Train; returns the final test accuracy."""
    args = parse_args(argv)
    dist.init()
    rank, world = dist.rank(), dist.world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {world} ranks")
    local = args.batch_size // world
    Tensor.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = digits()
    x_np, y_np = x_train.numpy(), y_train.numpy()
    model = MLP()
    opt = dist.DataParallel(Adam(get_parameters(model), lr=args.lr), bucket_mb=args.bucket_mb)
    sampler = dist.DistributedSampler(len(y_np), shuffle=True, seed=args.seed, drop_last=True)
    steps_per_epoch = len(sampler) // local
    step, acc = 0, 0.0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        mine = sampler.indices()
        losses = []
        with Tensor.train():
            for i in range(steps_per_epoch):
                idx = mine[i * local:(i + 1) * local]
                opt.zero_grad()
                loss = model(Tensor(x_np[idx])).sparse_categorical_crossentropy(Tensor(y_np[idx])).backward()
                opt.step(loss)
                losses.append(float(loss.item()))
                step += 1
                if args.steps is not None and step >= args.steps:
                    break
        with no_grad():
            acc = float((model(x_test).argmax(axis=1) == y_test).cast(dtypes.float32).mean().item())
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {np.mean(losses):.4f} (rank 0's share), test accuracy {acc * 100:.2f}%, "
                  f"{world} rank(s) x {local} images per step, {time.perf_counter() - start:.1f} s")
        if args.steps is not None and step >= args.steps:
            break
    if args.save:
        dist.save_checkpoint(get_state_dict(model), args.save)
    if rank == 0:
        print(f"final test accuracy: {acc * 100:.2f}% after {step} steps ({opt.messages} gradient all-reduces)")
    return acc


if __name__ == "__main__":
    main()
