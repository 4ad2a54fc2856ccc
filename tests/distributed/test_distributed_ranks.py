"""ember.distributed across processes on loopback: the launcher starts 2 or 4 ranks of MPICH's wheel.

Each launch is bounded in time (``LAUNCH_TIMEOUT``) and collectives inside by ``EMBER_DIST_TIMEOUT``, so a
bug shows up as a failure, never as a hung suite. Skipped with the reason when mpi4py or MPICH is missing.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ember.distributed.mpi import MPIBackend

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent
LAUNCH_TIMEOUT = 240

_reason = MPIBackend.probe()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"the MPI backend is unusable: {_reason}")


def launch(n: int, *args: str, timeout: float = LAUNCH_TIMEOUT, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ember.distributed.run -n N args...`` to completion (failing the test past ``timeout``)."""
    full_env = dict(os.environ, DEV="CPU", EMBER_DIST_TIMEOUT="60", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ember.distributed.run", "-n", str(n), *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def base(shape: tuple[int, ...], r: int, dtype: type = np.float32) -> np.ndarray:
    """What collectives_worker.py gives rank ``r``."""
    return (np.arange(np.prod(shape)).reshape(shape) % 7 + r * 3 - 2).astype(dtype)


def reference_training(n: int, opt_name: str, steps: int = 3) -> list[np.ndarray]:
    """collectives_worker.train in one process: rank 0's initial weights, each step the mean of the ranks'
    gradients (computed one rank's data at a time) given to the optimizer."""
    from ember import Tensor
    from ember.nn import Linear, get_parameters
    from ember.nn.optim import SGD, Adam

    Tensor.manual_seed(100)
    l1, l2 = Linear(6, 40), Linear(40, 3)
    params = get_parameters([l1, l2])
    opt = (SGD if opt_name == "SGD" else Adam)(params, lr=0.05)
    rngs = [np.random.default_rng(r) for r in range(n)]
    for _ in range(steps):
        grads = []
        for r in range(n):
            x, y = rngs[r].standard_normal((5, 6)).astype(np.float32), rngs[r].integers(0, 3, 5)
            opt.zero_grad()
            l2(l1(Tensor(x)).relu()).sparse_categorical_crossentropy(Tensor(y)).backward()
            grads.append([p.grad.numpy() for p in params])
        for i, p in enumerate(params):
            p.grad = Tensor(np.mean([g[i] for g in grads], axis=0, dtype=np.float32))
        opt.step()
    return [p.numpy() for p in params]


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_and_data_parallel(n: int, tmp_path: pathlib.Path) -> None:
    start = time.monotonic()
    p = launch(n, str(HERE / "collectives_worker.py"), str(tmp_path))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    for r in range(n):  # every line of a rank's output carries its rank
        assert f"[rank {r}] rank {r} of {n}: done" in p.stdout
    res = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(n)]
    x = np.stack([base((3, 5), r) for r in range(n)])
    want = {"sum": x.sum(0), "prod": x.prod(0), "max": x.max(0), "min": x.min(0), "avg": x.mean(0)}
    for r in range(n):
        got = res[r]
        for op, w in want.items():
            np.testing.assert_allclose(got[f"all_reduce_{op}"], w, rtol=1e-6, err_msg=op)
        ints = np.stack([base((6,), q) for q in range(n)])
        np.testing.assert_array_equal(got["all_reduce_sum_int32"], ints.sum(0).astype(np.int32))
        np.testing.assert_array_equal(got["all_reduce_sum_int64"], ints.sum(0))
        np.testing.assert_array_equal(got["all_reduce_sum_float16"], ints.sum(0).astype(np.float16))
        np.testing.assert_array_equal(got["all_reduce_sum_bfloat16"], ints.sum(0))  # small integers: exact
        np.testing.assert_array_equal(got["all_reduce_sum_bool"], (ints > 2).any(0))  # MPI: logical or
        views = np.stack([base((4, 3), q).T[1:] for q in range(n)])
        np.testing.assert_array_equal(got["all_reduce_view"], views.max(0))
        big = np.stack([base((1000,), q) for q in range(n)]).sum(0)
        np.testing.assert_allclose(got["async_results"], np.stack([big * (k + 1) for k in range(3)]), rtol=1e-6)
        for src in range(n):
            np.testing.assert_array_equal(got[f"broadcast_{src}"], base((2, 2), src, np.int32))
        np.testing.assert_array_equal(got["all_gather"], np.concatenate([base((2, 3), q) for q in range(n)]))
        np.testing.assert_array_equal(got["all_gather_0d"], np.arange(n, dtype=np.float32))
        rs = np.stack([base((2 * n, 3), q) for q in range(n)]).sum(0)
        np.testing.assert_array_equal(got["reduce_scatter"], rs[2 * r:2 * r + 2])
        rsa = np.stack([base((n, 2), q) for q in range(n)]).mean(0)
        np.testing.assert_allclose(got["reduce_scatter_avg"], rsa[r:r + 1], rtol=1e-6)
        np.testing.assert_array_equal(got["multi_sharded"], np.stack([base((4, 2), q) for q in range(n)]).sum(0))
        assert got["multi_sharded_device"][0] == "('CPU', 'CPU:1')"
        maxes = np.stack([base((3,), q) for q in range(n)]).max(0)
        np.testing.assert_array_equal(got["multi_replicated"], np.stack([maxes, maxes]))  # both replicas
    # data parallel: replicas equal on every rank, equal with and without buckets, equal to one process that
    # averages the ranks' gradients itself
    for opt in ("SGD", "Adam"):
        ref, ref4 = reference_training(n, opt), reference_training(n, opt, steps=4)
        for key in ("bucket0", "bucket_small", "bucket_big", "overlap", "jit", "zero"):
            for i, w in enumerate(ref if key != "jit" else ref4):  # the jitted run: 2 eager steps, 2 replays
                for r in range(n):
                    got = res[r][f"dp_{opt}_{key}_{i}"]
                    np.testing.assert_array_equal(got, res[0][f"dp_{opt}_{key}_{i}"], err_msg=f"{opt} {key} {r}")
                    if key not in ("jit", "zero"):
                        np.testing.assert_array_equal(got, res[0][f"dp_{opt}_bucket0_{i}"], err_msg=f"{opt} {key}")
                    if key == "zero":  # ZeRO-1 averages with a reduce-scatter: the same sums, maybe reassociated
                        np.testing.assert_allclose(got, res[0][f"dp_{opt}_bucket0_{i}"], rtol=1e-6, atol=1e-7)
                    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=f"{opt} {key} vs one process")
        # 4 parameters: one message each per step; 1 KiB buckets: 2 per step; 25 MiB: 1 per step (3 steps); the
        # jitted step sends from Python in its first two calls only: its replays run the recorded collectives
        assert [int(res[0][f"messages_{mb}_{ov}_{opt}_{jit}"][0]) for mb, ov, jit in
                ((0.0, False, False), (0.001, False, False), (25.0, False, False), (0.001, True, False),
                 (0.001, False, True))] == [12, 6, 3, 6, 4]
        # ZeRO-1: each rank holds 1/n of the per-element state (SGD without momentum has none), plus the scalars
        mine, whole = res[0][f"zero_state_bytes_{opt}"]
        numel = 6 * 40 + 40 + 40 * 3 + 3
        per_element = 0 if opt == "SGD" else 2 * 4  # Adam: m and v, float32
        assert whole - mine == per_element * (numel - -(-numel // n)), (mine, whole)
    assert time.monotonic() - start < LAUNCH_TIMEOUT


def test_a_killed_rank_stops_the_job_with_its_name(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal, time\nimport ember.distributed as dist\nfrom ember import Tensor\n"
        "dist.init()\nt = Tensor([1.0]); dist.all_reduce(t)\nprint('reduced', t.numpy()[0], flush=True)\n"
        "if dist.rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "for _ in range(600):\n    dist.all_reduce(t); time.sleep(0.1)\n")
    start = time.monotonic()
    p = launch(2, str(script), timeout=120)
    took = time.monotonic() - start
    assert "[rank 0] reduced 2.0" in p.stdout and "[rank 1] reduced 2.0" in p.stdout, p.stdout + p.stderr
    assert p.returncode != 0
    assert "rank 1 (pid" in p.stderr and "was killed by SIGKILL" in p.stderr, p.stderr
    assert took < 30, f"the job took {took:.1f} s to stop after rank 1 was killed"


def test_a_rank_that_hangs_makes_the_others_fail_with_a_timeout(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(
        "import time\nimport ember.distributed as dist\nfrom ember import Tensor\n"
        "dist.init(timeout=2)\nif dist.rank() == 1:\n    time.sleep(120)\ndist.all_reduce(Tensor([1.0]))\n")
    start = time.monotonic()
    p = launch(2, str(script), timeout=120)
    assert p.returncode != 0
    assert "rank 0 failed: DistributedTimeout: all_reduce(sum)" in p.stderr, p.stderr
    assert time.monotonic() - start < 30


def test_ctrl_c_stops_every_rank(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text("import os, time\nimport ember.distributed as dist\ndist.init()\n"
                      "print('pid', os.getpid(), flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-m", "ember.distributed.run", "-n", "2", str(script)],
                            env=dict(os.environ, DEV="CPU"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = []
    deadline = time.monotonic() + 90
    while len(pids) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "] pid " in line:
            pids.append(int(line.split()[-1]))
    assert len(pids) == 2, "the ranks did not start"
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 130
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if _running(pid)], "a rank outlived the launcher"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent to reap it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_example_two_ranks_equal_one_process(tmp_path: pathlib.Path) -> None:
    """examples/train_distributed.py: 2 ranks of 16 images per step end where one process of 32 does."""
    from ember.nn.state import safe_load

    example = str(ROOT / "examples" / "train_distributed.py")
    args = ["--steps", "6", "--batch-size", "32"]
    one = subprocess.run([sys.executable, example, *args, "--save", str(tmp_path / "one.safetensors")],
                         env=dict(os.environ, DEV="CPU"), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch(2, example, *args, "--save", str(tmp_path / "two.safetensors"))
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert "(6 gradient all-reduces)" in two.stdout
    a, b = safe_load(str(tmp_path / "one.safetensors")), safe_load(str(tmp_path / "two.safetensors"))
    assert sorted(a) == sorted(b) == ["l1.bias", "l1.weight", "l2.bias", "l2.weight"]
    for k in a:
        np.testing.assert_allclose(b[k].numpy(), a[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert not np.array_equal(a["l1.weight"].numpy(), np.zeros(a["l1.weight"].shape))
