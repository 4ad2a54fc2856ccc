"""ember.distributed against torch's DDP (Gloo) and raw mpi4py, 2 ranks on this machine, in one run.

    python bench/bench_distributed.py                 # both, 2 ranks, prints a table
    python bench/bench_distributed.py --steps 50 --hidden 1024

1. all_reduce of a 64 MiB float32 tensor: ``ember.distributed.all_reduce`` (a CPU tensor, reduced in its own
   buffer) vs ``mpi4py``'s ``Allreduce(IN_PLACE)`` on a numpy array, in the same ranks, and torch's Gloo.
2. one training step of the same MLP (64 -> hidden -> hidden -> 10, SGD, a batch per rank): ember's
   ``DataParallel`` step under TinyJit vs torch's ``DistributedDataParallel`` on Gloo.

Each rank runs single-threaded (OMP_NUM_THREADS=1) so two ranks share the cores the same way for both. The
timings are medians over the steps after a warm-up. torch is only a comparison here: ember never imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.abspath(__file__)


def median_ms(fn, reps: int) -> float:
    """The median wall time of ``fn()`` over ``reps`` calls, in ms."""
    times = []
    for _ in range(reps):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return float(np.median(times) * 1e3)


def ember_worker(args: argparse.Namespace) -> dict[str, float]:
    import ember.distributed as dist
    from ember import Tensor, TinyJit
    from ember.nn import Linear, get_parameters
    from ember.nn.optim import SGD

    dist.init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out: dict[str, float] = {}
    n = args.mib * 2 ** 20 // 4
    arr = np.ones(n, dtype=np.float32)
    comm.Allreduce(MPI.IN_PLACE, arr)
    out["mpi4py_allreduce_ms"] = median_ms(lambda: comm.Allreduce(MPI.IN_PLACE, arr), args.reps)
    t = Tensor.ones(n).contiguous().realize()
    dist.all_reduce(t)
    out["ember_allreduce_ms"] = median_ms(lambda: dist.all_reduce(t), args.reps)

    Tensor.manual_seed(0)
    layers = [Linear(64, args.hidden), Linear(args.hidden, args.hidden), Linear(args.hidden, 10)]
    opt = dist.DataParallel(SGD(get_parameters(layers), lr=0.01), bucket_mb=25)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        h = x
        for i, layer in enumerate(layers):
            h = layer(h) if i == len(layers) - 1 else layer(h).relu()
        loss = h.sparse_categorical_crossentropy(y).backward()
        Tensor.realize_all(loss, *opt.schedule_step(loss))
        return loss

    rng = np.random.default_rng(dist.rank())
    xs = [Tensor(rng.standard_normal((args.batch, 64)).astype(np.float32)) for _ in range(4)]
    ys = [Tensor(rng.integers(0, 10, args.batch)) for _ in range(4)]
    for i in range(5):
        step(xs[i % 4], ys[i % 4])
    it = iter(range(10 ** 9))

    def one() -> None:
        i = next(it)
        step(xs[i % 4], ys[i % 4])
    out["ember_step_ms"] = median_ms(one, args.steps)
    out["ember_loss"] = float(step(xs[0], ys[0]).item())
    return out


def torch_worker(args: argparse.Namespace) -> dict[str, float]:
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    out: dict[str, float] = {}
    t = torch.ones(args.mib * 2 ** 20 // 4)
    tdist.all_reduce(t)
    out["torch_gloo_allreduce_ms"] = median_ms(lambda: tdist.all_reduce(t), args.reps)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden,
                                args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    xs = [torch.randn(args.batch, 64, generator=g) for _ in range(4)]
    ys = [torch.randint(0, 10, (args.batch,), generator=g) for _ in range(4)]
    it = iter(range(10 ** 9))

    def one() -> None:
        i = next(it)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(xs[i % 4]), ys[i % 4])
        loss.backward()
        opt.step()
    for _ in range(5):
        one()
    out["torch_ddp_step_ms"] = median_ms(one, args.steps)
    tdist.destroy_process_group()
    return out


def launch(kind: str, args: argparse.Namespace, out_path: str) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ember.distributed.run", "-n", "2", HERE, "--worker", kind, "--out", out_path,
           "--mib", str(args.mib), "--reps", str(args.reps), "--steps", str(args.steps), "--hidden",
           str(args.hidden), "--batch", str(args.batch), "--port", str(args.port)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{kind} ranks failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(out_path) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, default=64, help="all_reduce size in MiB (default 64)")
    p.add_argument("--reps", type=int, default=7, help="all_reduce repetitions (default 7)")
    p.add_argument("--steps", type=int, default=30, help="timed training steps (default 30)")
    p.add_argument("--hidden", type=int, default=512, help="MLP hidden width (default 512)")
    p.add_argument("--batch", type=int, default=64, help="batch per rank (default 64)")
    p.add_argument("--worker", choices=["ember", "torch"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        res = ember_worker(args) if args.worker == "ember" else torch_worker(args)
        if int(os.environ.get("PMI_RANK", "0")) == 0:
            with open(args.out, "w") as f:
                json.dump(res, f)
        return
    with socket.socket() as s:  # a free port for torch's rendezvous
        s.bind(("127.0.0.1", 0))
        args.port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        res = launch("ember", args, os.path.join(tmp, "ember.json"))
        res.update(launch("torch", args, os.path.join(tmp, "torch.json")))
    print(f"2 ranks on loopback, 1 thread each; MLP 64-{args.hidden}-{args.hidden}-10, batch {args.batch} per rank")
    print(f"all_reduce {args.mib} MiB float32:  ember {res['ember_allreduce_ms']:8.2f} ms   mpi4py Allreduce "
          f"{res['mpi4py_allreduce_ms']:8.2f} ms   torch gloo {res['torch_gloo_allreduce_ms']:8.2f} ms   "
          f"(ember / mpi4py = {res['ember_allreduce_ms'] / res['mpi4py_allreduce_ms']:.2f})")
    ratio = res["ember_step_ms"] / res["torch_ddp_step_ms"]
    print(f"training step:             ember {res['ember_step_ms']:8.2f} ms   torch DDP (gloo) "
          f"{res['torch_ddp_step_ms']:8.2f} ms   (ember / torch = {ratio:.2f})")


if __name__ == "__main__":
    main()
