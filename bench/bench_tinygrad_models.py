"""ember against tinygrad on the same model source: a conv net trained with Adam, ResNet18 and a BERT-shaped encoder.

The models below are written once, in the public API ember shares with tinygrad (``Tensor``, ``nn.Conv2d``,
``nn.BatchNorm``, ``nn.Linear``, ``nn.optim.Adam``, ``TinyJit``, ``Context(TRAINING=1)``); each run imports the
framework by name and hands it to them, so only the import differs.

1. ``convnet``: two conv + BatchNorm + relu + max-pool blocks and a linear head on 28x28 inputs, one Adam
   training step under ``TinyJit`` (batch 128 of random data).
2. ``resnet18``: ResNet18 (basic blocks, BatchNorm in eval mode) forward at 32x32, batch 8, under ``TinyJit``.
3. ``bert``: a BERT-base-shaped encoder cut to 2 layers (hidden 768, 12 heads, seq 128, batch 2) forward.

Every framework runs in its own child process on its CPU device, each with an empty kernel cache (so the first
call includes compiling); tinygrad with the interpreter given by ``--tinygrad-python`` (ember never imports
tinygrad). Rows alternate between frameworks (``--repeat`` passes) so a loaded machine hurts both alike; a row
gives the median warm step (after warm-up, synced with ``.numpy()``) and the first call. The conv net also checks
that both give the same first loss from the same weights and data (copied as numpy files).

Run: ``python bench/bench_tinygrad_models.py [--quick] [--models convnet,resnet18,bert] [--repeat 2]``;
``DEBUG=2`` in the environment passes to the children and prints their kernels.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------------------------
# the models: tinygrad's public API, framework passed in


def framework(name: str) -> SimpleNamespace:
    """The public names the models use, from the package ``name`` (``ember`` or ``tinygrad``)."""
    mod = importlib.import_module(name)
    nn = importlib.import_module(f"{name}.nn")
    importlib.import_module(f"{name}.nn.optim")
    state = importlib.import_module(f"{name}.nn.state")
    helpers = importlib.import_module(f"{name}.helpers")
    return SimpleNamespace(name=name, Tensor=mod.Tensor, TinyJit=mod.TinyJit, Context=helpers.Context, nn=nn,
                           get_parameters=state.get_parameters, get_state_dict=state.get_state_dict, Device=mod.Device)


def convnet(fw: SimpleNamespace) -> Any:
    """Two conv blocks (conv, BatchNorm, relu, 2x2 max-pool) and a linear head for 1x28x28 images."""
    nn = fw.nn

    class ConvNet:
        def __init__(self) -> None:
            self.c1, self.n1 = nn.Conv2d(1, 32, 5), nn.BatchNorm(32)
            self.c2, self.n2 = nn.Conv2d(32, 64, 3), nn.BatchNorm(64)
            self.head = nn.Linear(64 * 5 * 5, 10)

        def __call__(self, x: Any) -> Any:
            x = self.n1(self.c1(x)).relu().max_pool2d(2)
            x = self.n2(self.c2(x)).relu().max_pool2d(2)
            return self.head(x.flatten(1))

    return ConvNet()


def resnet18(fw: SimpleNamespace, classes: int = 10) -> Any:
    """ResNet18 for small images: a 3x3 stem, four stages of two basic blocks, average pool, linear head."""
    nn = fw.nn

    class Block:
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            self.c1, self.n1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm(cout)
            self.c2, self.n2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm(cout)
            self.down = [nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm(cout)] \
                if stride != 1 or cin != cout else []

        def __call__(self, x: Any) -> Any:
            out = self.n2(self.c2(self.n1(self.c1(x)).relu()))
            return (out + x.sequential(self.down)).relu()

    class ResNet18:
        def __init__(self) -> None:
            self.stem, self.norm = nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm(64)
            widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
            self.blocks = [b for cin, cout, s in widths for b in (Block(cin, cout, s), Block(cout, cout, 1))]
            self.fc = nn.Linear(512, classes)

        def __call__(self, x: Any) -> Any:
            x = self.norm(self.stem(x)).relu().sequential(self.blocks)
            return self.fc(x.mean((2, 3)))

    return ResNet18()


def bert(fw: SimpleNamespace, layers: int = 2, hidden: int = 768, heads: int = 12, vocab: int = 30522) -> Any:
    """A BERT-base-shaped encoder: embeddings, ``layers`` post-norm transformer layers (GELU MLP of 4x hidden)."""
    nn = fw.nn

    class Layer:
        def __init__(self) -> None:
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def __call__(self, x: Any, mask: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = (lin(x).reshape(b, t, heads, hidden // heads).transpose(1, 2) for lin in (self.q, self.k, self.v))
            att = q.scaled_dot_product_attention(k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, hidden)
            x = self.ln1(x + self.o(att))
            return self.ln2(x + self.down(self.up(x).gelu()))

    class Bert:
        def __init__(self) -> None:
            self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(512, hidden)
            self.typ = nn.Embedding(2, hidden)
            self.ln = nn.LayerNorm(hidden)
            self.layers = [Layer() for _ in range(layers)]

        def __call__(self, ids: Any, types: Any, mask: Any) -> Any:
            positions = fw.Tensor.arange(ids.shape[1]).reshape(1, -1).expand(ids.shape)
            x = self.ln(self.tok(ids) + self.pos(positions) + self.typ(types))
            att_mask = mask.reshape(mask.shape[0], 1, 1, mask.shape[1]) > 0
            for layer in self.layers:
                x = layer(x, att_mask)
            return x

    return Bert()


# ---------------------------------------------------------------------------------------------------------------
# one framework, one model: runs in a child process


def _timed(fn: Any, rounds: int, warmup: int) -> tuple[float, list[float], Any]:
    start = time.perf_counter()
    first = fn().numpy()
    first_s = time.perf_counter() - start
    for _ in range(warmup):
        fn().numpy()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn().numpy()
        times.append(time.perf_counter() - start)
    return first_s, times, first


def run_convnet(fw: SimpleNamespace, rounds: int, warmup: int, data_dir: Path) -> dict:
    """Adam training steps of :func:`convnet` under TinyJit and ``Context(TRAINING=1)``."""
    Tensor = fw.Tensor
    model = convnet(fw)
    # same weights and data on both frameworks: the first run writes them, the others load them
    weights = data_dir / "convnet_weights.npz"
    sd = fw.get_state_dict(model)
    if weights.exists():
        saved = np.load(weights)
        for k, t in sd.items():
            t.assign(Tensor(saved[k])).realize()
    else:
        np.savez(weights, **{k: t.numpy() for k, t in sd.items()})
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((128, 1, 28, 28), dtype=np.float32))
    y = Tensor(rng.integers(0, 10, 128).astype(np.int32))
    opt = fw.nn.optim.Adam(fw.get_parameters(model), lr=1e-3)

    @fw.TinyJit
    @fw.Context(TRAINING=1)
    def step() -> Any:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    first_s, times, first = _timed(step, rounds, warmup)
    return {"first_s": first_s, "times": times, "check": float(first)}


def run_resnet18(fw: SimpleNamespace, rounds: int, warmup: int, data_dir: Path) -> dict:
    """ResNet18 forward (eval-mode BatchNorm) of 8 32x32 images under TinyJit."""
    model = resnet18(fw)
    x = fw.Tensor(np.random.default_rng(0).standard_normal((8, 3, 32, 32), dtype=np.float32))
    fwd = fw.TinyJit(lambda: model(x).realize())
    first_s, times, first = _timed(fwd, rounds, warmup)
    return {"first_s": first_s, "times": times, "check": float(np.abs(first).mean())}


def run_bert(fw: SimpleNamespace, rounds: int, warmup: int, data_dir: Path) -> dict:
    """Forward of the 2-layer BERT-base-shaped encoder, batch 2 x 128 tokens, under TinyJit."""
    model = bert(fw)
    rng = np.random.default_rng(0)
    ids = fw.Tensor(rng.integers(0, 30522, (2, 128)).astype(np.int32))
    types = fw.Tensor(np.zeros((2, 128), np.int32))
    mask = fw.Tensor(np.ones((2, 128), np.int32))
    fwd = fw.TinyJit(lambda: model(ids, types, mask).realize())
    first_s, times, first = _timed(fwd, rounds, warmup)
    return {"first_s": first_s, "times": times, "check": float(np.abs(first).mean())}


MODELS = {"convnet": run_convnet, "resnet18": run_resnet18, "bert": run_bert}


def child(name: str, model: str, rounds: int, warmup: int, data_dir: str) -> None:
    """Run one model on one framework's CPU device and print one JSON line."""
    fw = framework(name)
    fw.Tensor.manual_seed(0)
    if name == "ember":
        with fw.Context(TRAINING=1):
            honoured = fw.Tensor.training
        if not honoured:  # an ember without Context(TRAINING=1) would time eval-mode BatchNorm in the conv net
            fw.Tensor.training = True
    device = fw.Device.DEFAULT
    renderer = type(fw.Device[device].renderer).__name__
    out = MODELS[model](fw, rounds, warmup, Path(data_dir))
    print("RESULT " + json.dumps({"framework": name, "model": model, "device": device, "renderer": renderer, **out}))


# ---------------------------------------------------------------------------------------------------------------
# the driver


def _spawn(python: str, name: str, model: str, args: argparse.Namespace, data_dir: str, cache: str) -> dict | None:
    env = dict(os.environ)
    if name == "ember":
        env["EMBER_CACHE_DIR"] = os.path.join(cache, "ember")
        env.setdefault("DEV", "CPU")
    else:
        env["CACHEDB"] = os.path.join(cache, "tinygrad.db")
        env["DEV"] = "CPU"
        env.pop("PYTHONPATH", None)
    cmd = [python, os.path.abspath(__file__), "--child", name, "--models", model, "--rounds", str(args.rounds),
           "--warmup", str(args.warmup), "--data-dir", data_dir]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if os.environ.get("DEBUG"):
        sys.stderr.write(f"===== {name} {model}\n{proc.stdout}{proc.stderr}\n")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"{name} {model} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return None


def _tinygrad_python(arg: str | None) -> tuple[str | None, str]:
    if arg == "":
        return None, "skipped (--tinygrad-python '')"
    candidates = [arg] if arg else ["/tmp/tgvenv/bin/python"]
    for python in candidates:
        if not os.path.exists(python):
            continue
        probe = subprocess.run([python, "-c", "import tinygrad"], capture_output=True, text=True)
        if probe.returncode == 0:
            return python, ""
        return None, f"skipped: {python} cannot import tinygrad ({probe.stderr.strip().splitlines()[-1:]})"
    return None, f"skipped: no interpreter at {', '.join(candidates)} (pass --tinygrad-python)"


def main() -> None:
    """Parse the flags; as a child run one model, as the driver run them all and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2, help="alternating passes over the frameworks")
    parser.add_argument("--quick", action="store_true", help="conv net only, few rounds (a ~30 s smoke run)")
    parser.add_argument("--tinygrad-python", default=None)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.models, args.rounds, args.warmup, args.data_dir)
        return
    if args.quick:
        args.models, args.rounds, args.warmup, args.repeat = "convnet", 4, 2, 1
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    tg_python, why = _tinygrad_python(args.tinygrad_python)
    frameworks = [("ember", sys.executable)] + ([("tinygrad", tg_python)] if tg_python else [])
    if why:
        print(f"tinygrad {why}")
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            for rep in range(args.repeat):
                order = frameworks if rep % 2 == 0 else frameworks[::-1]
                for name, python in order:
                    cache = tempfile.mkdtemp(dir=tmp)
                    r = _spawn(python, name, model, args, tmp, cache)
                    if r is not None:
                        results.setdefault((model, name), []).append(r)
    devices = sorted({f"{r[0]['framework']}: {r[0]['device']} ({r[0]['renderer']})" for r in results.values()})
    print("devices: " + "; ".join(devices) + f"; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'model':<10} {'framework':<9} {'warm ms':>9} {'first s':>8} {'check':>10}   ratio warm / first")
    for model in models:
        rows = {}
        for name, _ in frameworks:
            runs = results.get((model, name))
            if not runs:
                continue
            warm = statistics.median(statistics.median(r["times"]) for r in runs) * 1e3
            first = statistics.median(r["first_s"] for r in runs)
            rows[name] = (warm, first)
            print(f"{model:<10} {name:<9} {warm:9.2f} {first:8.2f} {runs[0]['check']:10.5g}")
        if "ember" in rows and "tinygrad" in rows:
            (ew, ef), (tw, tf) = rows["ember"], rows["tinygrad"]
            print(f"{model:<10} {'ratio':<9} {'':>9} {'':>8} {'':>10}   {ew / tw:.2f} / {ef / tf:.2f}")


if __name__ == "__main__":
    main()
