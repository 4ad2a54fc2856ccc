"""Train a small CNN on the 8x8 handwritten digits and report test accuracy, time per epoch and kernels compiled.

    python examples/train_digits.py                      # train, save a checkpoint
    python examples/train_digits.py --epochs 12 --resume # continue from the checkpoint up to epoch 12
    python -m ember.distributed.run -n 2 examples/train_digits.py --distributed   # 2 ranks, batch 32 each

The data are scikit-learn's bundled digits (read straight from its package data; 1,437 train
and 360 test images). Everything runs on the default device. Given ``--seed`` the run is
deterministic: initialization, batch order and the kernels' arithmetic are fixed, so a run
resumed from a checkpoint continues exactly as an uninterrupted one would.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from typing import Any

import numpy as np

from ember import Device, GlobalCounters, Tensor, TinyJit, dtypes, no_grad
from ember.helpers import cache_dir
from ember.nn import BatchNorm2d, Conv2d, Linear, get_parameters, get_state_dict, load_state_dict
from ember.nn.datasets import digits
from ember.nn.optim import Adam, OneCycleLR
from ember.nn.state import safe_load, safe_save
from ember.progress import progress


class DigitsCNN:
    """conv 3x3 (1 -> 16 channels) -> batch norm -> relu -> 2x2 max pool -> linear (256 -> 10).

    One convolution is enough for 8x8 images: with batch norm it reaches about 98% test accuracy
    in four or five epochs, and a second convolution would triple the work per step for a fraction of a point.
    """

    def __init__(self) -> None:
        self.conv, self.bn = Conv2d(1, 16, 3, padding=1), BatchNorm2d(16)
        self.fc = Linear(16 * 4 * 4, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn(self.conv(x)).relu().max_pool2d(2)  # (N, 16, 4, 4)
        return self.fc(x.flatten(1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=5, help="total number of epochs (default 5)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch size (default 64)")
    p.add_argument("--lr", type=float, default=0.02, help="peak learning rate of the one-cycle schedule (default 0.02)")
    p.add_argument("--seed", type=int, default=0, help="seed for initialization and batch order (default 0)")
    default_ckpt = cache_dir() / "checkpoints" / "digits.safetensors"
    p.add_argument("--checkpoint", default=str(default_ckpt),
                   help=f"where to save the model and optimizer state (default {default_ckpt})")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="stop after epoch N of --epochs (the checkpoint lets --resume finish the same run)")
    p.add_argument("--no-save", action="store_true", help="do not write a checkpoint")
    p.add_argument("--profile", action="store_true", help="print a cProfile summary of the training loop")
    p.add_argument("--distributed", action="store_true",
                   help="data parallel over the launcher's ranks: --batch-size is split over them, gradients are "
                        "averaged (ember.distributed); rank 0 prints and saves")
    return p.parse_args(argv)


def evaluate(model: DigitsCNN, x: Tensor, y: Tensor) -> float:
    """Test accuracy (eval mode: BatchNorm uses its running statistics)."""
    with Tensor.test(), no_grad():
        pred = model(x).argmax(axis=1)
        return float((pred == y).cast(dtypes.float32).mean().item())


def save_checkpoint(path: str, model: DigitsCNN, opt: Adam, sched: OneCycleLR, epoch: int) -> None:
    """Model weights, optimizer state and progress in one safetensors file."""
    tensors = {f"model.{k}": v for k, v in get_state_dict(model).items()}
    tensors.update({f"optim.{k}": v for k, v in opt.state_dict().items()})
    tensors["epoch"] = Tensor([epoch], dtype=dtypes.int64)
    tensors["sched.total_steps"] = Tensor([sched.total_steps], dtype=dtypes.int64)
    tensors["sched.last_epoch"] = Tensor([sched.last_epoch], dtype=dtypes.int64)
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    safe_save(tensors, path, metadata={"format": "ember-train-digits"})


def load_checkpoint(path: str, model: DigitsCNN, opt: Adam, sched: OneCycleLR) -> int:
    """Restore what :func:`save_checkpoint` wrote; returns the number of epochs already done."""
    state = safe_load(path)
    load_state_dict(model, {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    opt.load_state_dict({k[len("optim."):]: v for k, v in state.items() if k.startswith("optim.")})
    planned = int(state["sched.total_steps"].item())
    if planned != sched.total_steps:
        print(f"note: the checkpoint's schedule spans {planned} steps and this run's {sched.total_steps}; continuing "
              f"on the new schedule (pass the same --epochs to continue the original run exactly)")
    sched.last_epoch = int(state["sched.last_epoch"].item()) - 1
    sched.step()  # puts the schedule's lr and momentum for that step back into the optimizer
    return int(state["epoch"].item())


def train(args: argparse.Namespace) -> float:
    """Train (or resume) as ``args`` say; returns the final test accuracy."""
    Tensor.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = digits()
    x_np, y_np = x_train.numpy(), y_train.numpy()
    steps_per_epoch = len(y_np) // args.batch_size  # drop the ragged last batch: every step has the same shapes
    model = DigitsCNN()
    opt = Adam(get_parameters(model), lr=args.lr)  # BatchNorm statistics become buffers, not trained
    sched = OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch, pct_start=0.25)
    step_opt: Any = opt
    rank, world, local_batch = 0, 1, args.batch_size
    if args.distributed:
        import ember.distributed as dist

        dist.init()
        rank, world = dist.rank(), dist.world_size()
        if args.batch_size % world:
            sys.exit(f"--batch-size {args.batch_size} does not split over {world} ranks")
        local_batch = args.batch_size // world
        # rank 0's weights everywhere; each step averages the ranks' gradients (BatchNorm statistics stay per rank)
        step_opt = dist.DataParallel(opt)
        args.no_save = args.no_save or rank != 0

    start_epoch = 0
    if args.resume:
        if not os.path.exists(args.checkpoint):
            sys.exit(f"--resume: no checkpoint at {args.checkpoint}")
        start_epoch = load_checkpoint(args.checkpoint, model, opt, sched)
        print(f"resumed from {args.checkpoint} after epoch {start_epoch}")

    @TinyJit
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        """Forward, backward and update as one schedule; from the third call on, a replay of its kernels."""
        step_opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        Tensor.realize_all(loss, *step_opt.schedule_step())
        return loss

    print(f"device {Device.DEFAULT}: {len(y_np)} train / {y_test.shape[0]} test images, batch {args.batch_size}, "
          f"{steps_per_epoch} steps per epoch")
    GlobalCounters.reset()
    end_epoch = args.epochs if args.stop_after is None else min(args.epochs, args.stop_after)
    acc = evaluate(model, x_test, y_test) if start_epoch >= end_epoch else 0.0
    step_times: list[float] = []
    run_start, cpu_start = time.perf_counter(), time.process_time()
    for epoch in range(start_epoch, end_epoch):
        order = np.random.default_rng((args.seed, epoch)).permutation(len(y_np))  # batch order depends on epoch only
        epoch_start = time.perf_counter()
        losses: list[float] = []
        with Tensor.train():
            bar = progress(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{args.epochs}", unit="step", leave=True)
            for i in bar:
                st = time.perf_counter()
                idx = order[i * args.batch_size:(i + 1) * args.batch_size][rank * local_batch:(rank + 1) * local_batch]
                loss = train_step(Tensor(x_np[idx]), Tensor(y_np[idx]))
                sched.step()
                losses.append(float(loss.item()))  # already computed: a copy, not a sync point
                step_times.append(time.perf_counter() - st)
                if i % 5 == 4 or i == steps_per_epoch - 1:
                    bar.set_postfix(loss=losses[-1])
        epoch_time = time.perf_counter() - epoch_start
        acc = evaluate(model, x_test, y_test)
        print(f"epoch {epoch + 1}: train loss {np.mean(losses):.4f}, test accuracy {acc * 100:.2f}%, "
              f"{epoch_time:.2f} s ({epoch_time / steps_per_epoch * 1e3:.1f} ms/step), kernels compiled so far "
              f"{GlobalCounters.kernels_compiled}")
        if not args.no_save:
            save_checkpoint(args.checkpoint, model, opt, sched, epoch + 1)
    if step_times:
        steady = sorted(step_times)[len(step_times) // 2]
        print(f"median step time {steady * 1e3:.1f} ms (first step {step_times[0] * 1e3:.0f} ms, includes compiling); "
              f"training took {time.perf_counter() - run_start:.1f} s ({time.process_time() - cpu_start:.1f} s of "
              f"CPU in this process)")
    print(f"final test accuracy: {acc * 100:.2f}%  (kernels compiled: {GlobalCounters.kernels_compiled}, "
          f"kernels run: {GlobalCounters.kernel_count})")
    if not args.no_save:
        print(f"checkpoint: {args.checkpoint}")
    return acc


def main(argv: list[str] | None = None) -> None:
    """Run training, under cProfile with ``--profile``."""
    args = parse_args(argv)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        train(args)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    else:
        train(args)


if __name__ == "__main__":
    main()
