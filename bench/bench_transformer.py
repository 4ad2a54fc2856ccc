"""A transformer training step on ember (jitted, eager, first step with an empty cache) against torch eager.

The model is a small GPT written once in the tinygrad-style Tensor API (``Tensor``, ``nn.Embedding``,
``nn.Linear``, ``nn.LayerNorm``, ``scaled_dot_product_attention``, ``nn.optim.AdamW``, ``TinyJit``): token and
position embeddings, pre-norm blocks (LayerNorm, causal attention, GELU MLP of 4x width), a final LayerNorm and
an untied linear head (with bias), trained with ``sparse_categorical_crossentropy``. torch runs the same model (its own
modules, the same weights loaded from numpy, ``gelu(approximate="tanh")`` as tinygrad's default) on 2 threads.

Configs: ``char`` (default): vocab 65, width 64, 4 heads, 2 blocks, batch 16 x 64 tokens. ``gpt2`` (``--gpt2``):
GPT-2-small-shaped cut to 2 blocks: vocab 50257, width 768, 12 heads, batch 4 x 256 tokens (slow: minutes).

Each framework runs in its own child process with an empty kernel cache: ember's first step is the first call in
that process (compiling included), then eager steps, then steps under ``TinyJit`` (its kernel count and, timed
one by one, its top kernels with GFLOPS); torch gives eager steps. Both start from the same weights and data and
the first losses must agree. Rows give the median warm step (synced: the loss is read back each step).

``--baseline DIR`` adds ember rows from another checkout (its ``core`` and ``plugins/runtime_cpu`` on the path):
before and after a change in one run.

Run: ``python bench/bench_transformer.py [--gpt2] [--rounds 10] [--top 12] [--repeat 1] [--baseline DIR]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CONFIGS = {
    "char": {"vocab": 65, "dim": 64, "heads": 4, "layers": 2, "batch": 16, "seq": 64},
    "gpt2": {"vocab": 50257, "dim": 768, "heads": 12, "layers": 2, "batch": 4, "seq": 256},
}
LR = 1e-3


def init_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """The model's weights by name (torch's layouts: Linear weights are ``(out, in)``), drawn with numpy."""
    rng = np.random.default_rng(seed)
    d, v = cfg["dim"], cfg["vocab"]

    def lin(name: str, fan_in: int, fan_out: int) -> dict[str, np.ndarray]:
        b = 1 / np.sqrt(fan_in)
        return {f"{name}.weight": rng.uniform(-b, b, (fan_out, fan_in)).astype(np.float32),
                f"{name}.bias": rng.uniform(-b, b, (fan_out,)).astype(np.float32)}

    w: dict[str, np.ndarray] = {"tok.weight": rng.standard_normal((v, d)).astype(np.float32) * 0.02,
                                "pos.weight": rng.standard_normal((cfg["seq"], d)).astype(np.float32) * 0.02}
    for i in range(cfg["layers"]):
        for ln in ("ln1", "ln2"):
            w[f"blocks.{i}.{ln}.weight"] = np.ones(d, np.float32)
            w[f"blocks.{i}.{ln}.bias"] = np.zeros(d, np.float32)
        w |= lin(f"blocks.{i}.qkv", d, 3 * d) | lin(f"blocks.{i}.proj", d, d)
        w |= lin(f"blocks.{i}.fc1", d, 4 * d) | lin(f"blocks.{i}.fc2", 4 * d, d)
    w["ln_f.weight"], w["ln_f.bias"] = np.ones(d, np.float32), np.zeros(d, np.float32)
    w |= lin("head", d, v)
    return w


def batch(cfg: dict, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Random tokens and their next-token labels, ``(batch, seq)`` int32 each."""
    toks = np.random.default_rng(seed).integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1)).astype(np.int32)
    return toks[:, :-1].copy(), toks[:, 1:].copy()


# ---------------------------------------------------------------------------------------------------------------
# the model in the tinygrad-style API (ember; tinygrad would run it unchanged but for the import)


def gpt(Tensor: Any, nn: Any, cfg: dict) -> Any:
    """The GPT of ``cfg`` built from ``Tensor`` and ``nn`` of a tinygrad-style framework."""
    d, h = cfg["dim"], cfg["heads"]

    class Block:
        def __init__(self) -> None:
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def __call__(self, x: Any) -> Any:
            b, t, _ = x.shape
            qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            att = qkv[0].scaled_dot_product_attention(qkv[1], qkv[2], is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(self.fc1(self.ln2(x)).gelu())

    class GPT:
        def __init__(self) -> None:
            self.tok, self.pos = nn.Embedding(cfg["vocab"], d), nn.Embedding(cfg["seq"], d)
            self.blocks = [Block() for _ in range(cfg["layers"])]
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, cfg["vocab"])

        def __call__(self, idx: Any) -> Any:
            positions = Tensor.arange(idx.shape[1]).reshape(1, -1)
            x = self.tok(idx) + self.pos(positions)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    return GPT()


def _timed(step: Any, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def child_ember(cfg: dict, rounds: int, top: int, data_dir: Path) -> dict:
    """First step, eager steps and jitted steps on ember, with the jitted step's kernels."""
    from ember import Tensor, TinyJit, nn
    from ember.helpers import Context
    from ember.nn.state import get_parameters, get_state_dict

    model = gpt(Tensor, nn, cfg)
    saved = np.load(data_dir / "weights.npz")
    for k, t in get_state_dict(model).items():
        t.assign(Tensor(saved[k])).realize()
    xs, ys = batch(cfg)
    x, y = Tensor(xs), Tensor(ys)
    opt = nn.optim.AdamW(get_parameters(model), lr=LR)

    @Context(TRAINING=1)
    def step() -> Any:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    start = time.perf_counter()
    losses = [float(step().numpy())]
    first_s = time.perf_counter() - start
    losses.append(float(step().numpy()))
    eager = _timed(lambda: losses.append(float(step().numpy())), max(2, rounds // 2))
    jstep = TinyJit(step)
    for _ in range(3):  # run, capture, first replay
        losses.append(float(jstep().numpy()))
    jit = _timed(lambda: losses.append(float(jstep().numpy())), rounds)
    cap = jstep.captured
    assert cap is not None
    kernels: dict[str, list[float]] = {}
    for _ in range(3):  # each kernel alone, the best of 3
        for ei in cap.exec_items:
            if type(ei.prg).__name__ != "CompiledRunner":
                continue
            t0 = time.perf_counter()
            et = ei.run(wait=True) or (time.perf_counter() - t0)
            kernels.setdefault(f"{id(ei)}", [ei.prg.display_name, ei.prg.estimated_ops, et])
            kernels[f"{id(ei)}"][2] = min(kernels[f"{id(ei)}"][2], et)
    ranked = sorted(kernels.values(), key=lambda k: -k[2])
    return {"first_s": first_s, "eager": eager, "jit": jit, "losses": losses, "kernels": cap.kernel_count,
            "launches": len(cap.runs), "kernel_sum_s": sum(k[2] for k in ranked), "top": ranked[:top]}


def child_torch(cfg: dict, rounds: int, top: int, data_dir: Path) -> dict:
    """Eager training steps of the same model in torch on 2 threads."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    d, h = cfg["dim"], cfg["heads"]

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(cfg["vocab"], d), torch.nn.Embedding(cfg["seq"], d)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(cfg["layers"])])
            self.ln_f = torch.nn.LayerNorm(d)
            self.head = torch.nn.Linear(d, cfg["vocab"])

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]).reshape(1, -1))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    model = GPT()
    saved = np.load(data_dir / "weights.npz")
    model.load_state_dict({k: torch.from_numpy(saved[k]) for k in model.state_dict()})
    xs, ys = batch(cfg)
    x, y = torch.from_numpy(xs).long(), torch.from_numpy(ys).long()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)

    def step() -> float:
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        return float(loss.item())

    start = time.perf_counter()
    losses = [step()]
    first_s = time.perf_counter() - start
    losses.append(step())
    warm = _timed(lambda: losses.append(step()), rounds)
    return {"first_s": first_s, "eager": warm, "losses": losses, "version": torch.__version__}


def _spawn(name: str, args: argparse.Namespace, data_dir: str, cache: str, root: str | None = None) -> dict | None:
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join(os.path.join(root, p) for p in ("core", "plugins/runtime_cpu"))
    env["EMBER_CACHE_DIR"] = cache
    env.setdefault("DEV", "CPU")
    if name == "torch":
        env["OMP_NUM_THREADS"] = "2"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--rounds", str(args.rounds),
           "--top", str(args.top), "--data-dir", data_dir] + (["--gpt2"] if args.gpt2 else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return None


def main() -> None:
    """Parse the flags; as a child run one framework, as the driver run both and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2", action="store_true", help="the GPT-2-small-shaped 2-block config (slow)")
    parser.add_argument("--rounds", type=int, default=None, help="warm steps timed (default 10, 3 with --gpt2)")
    parser.add_argument("--top", type=int, default=12, help="kernels listed")
    parser.add_argument("--repeat", type=int, default=1, help="alternating passes over the frameworks")
    parser.add_argument("--baseline", default=None, help="another checkout whose ember runs too (rows 'baseline')")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg_name = "gpt2" if args.gpt2 else "char"
    cfg = CONFIGS[cfg_name]
    if args.rounds is None:
        args.rounds = 3 if args.gpt2 else 10
    if args.child:
        run = child_ember if args.child == "ember" else child_torch
        out = run(cfg, args.rounds, args.top, Path(args.data_dir))
        print("RESULT " + json.dumps(out))
        return
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "weights.npz", **init_weights(cfg))
        names = ["ember", "torch"] + (["baseline"] if args.baseline else [])
        for rep in range(args.repeat):
            for name in (names if rep % 2 == 0 else names[::-1]):
                root = args.baseline if name == "baseline" else None
                r = _spawn("ember" if root else name, args, tmp, tempfile.mkdtemp(dir=tmp), root)
                if r is not None:
                    results.setdefault(name, []).append(r)
    print(f"config {cfg_name}: {cfg}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")

    def med(name: str, key: str) -> float:
        return statistics.median(statistics.median(r[key]) for r in results[name]) * 1e3

    def first(name: str) -> float:
        return statistics.median(r["first_s"] for r in results[name])

    rows = []
    if "torch" in results:
        rows.append((f"torch {results['torch'][0]['version']} eager, 2 threads", med("torch", "eager"),
                     first("torch")))
    for name, label in (("baseline", "baseline ember"), ("ember", "ember")):
        if name in results:
            rows.append((f"{label}, step under TinyJit", med(name, "jit"), first(name)))
            rows.append((f"{label} eager", med(name, "eager"), first(name)))
    print(f"{'':<40} {'step ms':>9} {'first s':>8} {'x torch':>8}")
    base = med("torch", "eager") if "torch" in results else None
    for label, ms, fs in rows:
        print(f"{label:<40} {ms:9.2f} {fs:8.2f} {ms / base if base else float('nan'):8.2f}")
    if "ember" in results and "torch" in results:
        le, lt = results["ember"][0]["losses"], results["torch"][0]["losses"]
        print(f"losses: ember first {le[0]:.5f} last {le[-1]:.5f} ({len(le)} steps); torch first {lt[0]:.5f} last "
              f"{lt[-1]:.5f} ({len(lt)} steps); first losses differ by {abs(le[0] - lt[0]):.2e}")
    for which in ("baseline", "ember"):
        if which not in results:
            continue
        e = results[which][0]
        print(f"{which} jitted step: {e['kernels']} kernels in {e['launches']} launches; kernels alone sum to "
              f"{e['kernel_sum_s'] * 1e3:.2f} ms; losses first {e['losses'][0]:.5f} last {e['losses'][-1]:.5f}")
        if which == "baseline":
            continue
        print(f"{'kernel':<40} {'us':>9} {'GFLOPS':>8}")
        for name, ops, t in e["top"]:
            print(f"{name:<40} {t * 1e6:9.1f} {ops / t / 1e9:8.2f}")


if __name__ == "__main__":
    main()
