"""A few seconds of real training: the digits example's model learns, and a checkpoint resumes it exactly."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from ember import Tensor
from ember.nn import get_parameters
from ember.nn.optim import Adam, OneCycleLR

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"
BATCH = 32


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_digits_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _data() -> tuple[np.ndarray, np.ndarray]:
    """A small fixed subset: the digits file when scikit-learn is there, else synthetic 8x8 blobs."""
    from ember.nn import datasets

    try:
        x, y, _, _ = datasets.digits()
        return x.numpy()[: BATCH * 4], y.numpy()[: BATCH * 4]
    except FileNotFoundError:
        rng = np.random.default_rng(0)
        y = rng.integers(0, 10, BATCH * 4)
        x = rng.random((BATCH * 4, 1, 8, 8), dtype=np.float32) * 0.3
        x[np.arange(len(y)), 0, y % 8, y // 2] += 1.0  # a class-dependent bright pixel
        return x, y


def _setup(mod: ModuleType, seed: int) -> tuple:
    Tensor.manual_seed(seed)
    model = mod.DigitsCNN()
    opt = Adam(get_parameters(model), lr=0.02)
    sched = OneCycleLR(opt, max_lr=0.02, total_steps=12, pct_start=0.25)
    return model, opt, sched


def _step(model, opt, sched, x: np.ndarray, y: np.ndarray, i: int) -> float:
    idx = np.arange(i * BATCH, (i + 1) * BATCH) % len(y)
    with Tensor.train():
        opt.zero_grad()
        loss = model(Tensor(x[idx])).sparse_categorical_crossentropy(Tensor(y[idx]))
        loss.backward()
        Tensor.realize_all(loss, *opt.schedule_step())
        sched.step()
    return float(loss.item())


def test_training_reduces_loss_and_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("ember.nn.state")
    mod = _example()
    x, y = _data()
    model, opt, sched = _setup(mod, seed=0)
    losses = [_step(model, opt, sched, x, y, i) for i in range(8)]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < 0.7 * np.mean(losses[:2]), losses

    ckpt = tmp_path / "ckpt.safetensors"
    mod.save_checkpoint(str(ckpt), model, opt, sched, epoch=1)
    want = [_step(model, opt, sched, x, y, i) for i in range(8, 10)]

    model2, opt2, sched2 = _setup(mod, seed=123)  # different initial weights, all overwritten by the checkpoint
    assert mod.load_checkpoint(str(ckpt), model2, opt2, sched2) == 1
    got = [_step(model2, opt2, sched2, x, y, i) for i in range(8, 10)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    from ember.nn.state import get_state_dict

    theirs = get_state_dict(model2)
    for name, t in get_state_dict(model).items():  # weights and BatchNorm statistics continued identically
        np.testing.assert_allclose(theirs[name].numpy(), t.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
