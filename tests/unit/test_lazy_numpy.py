"""ember imports numpy only when something needs it (``import numpy`` costs ~37 ms, as much as ember's own import).

A training step that never passes or asks for a numpy array runs without it; the host-side paths that replaced
numpy there (array-module uploads, struct scalars, the float16 probe's exact arithmetic) must give numpy's values.
"""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.dtype import DTYPES_ALL, scalar_bytes, scalar_from_bytes, to_np_dtype, truncate
from ember.frontend import creation

STEP = r"""
import sys
from ember import Tensor, nn
from ember.nn.optim import SGD
Tensor.manual_seed(0)
layers = [nn.Linear(12, 8), nn.Linear(8, 3)]
opt = SGD([t for lin in layers for t in (lin.weight, lin.bias)], lr=0.1)
x, y = Tensor.randn(5, 12), Tensor.randint(5, high=3)
with Tensor.train():
    opt.zero_grad()
    loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize_all(loss, *opt.schedule_step())
    value = loss.item()
print(value, "numpy" in sys.modules)
"""


def test_a_training_step_does_not_import_numpy(tmp_path: object) -> None:
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path), DEV="CPU")
    proc = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    value, imported = proc.stdout.split()
    assert math.isfinite(float(value))
    assert imported == "False", "a step that never touches numpy arrays imported numpy"


def test_the_same_step_gives_the_same_loss_with_numpy_imported(tmp_path: object) -> None:
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path), DEV="CPU")
    without = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, env=env, check=True)
    with_np = subprocess.run([sys.executable, "-c", "import numpy\n" + STEP], capture_output=True, text=True,
                             env=env, check=True)
    assert without.stdout.split()[0] == with_np.stdout.split()[0]
    assert with_np.stdout.split()[1] == "True"


@pytest.mark.parametrize("dt", [d for d in DTYPES_ALL if d != dtypes.bfloat16], ids=str)
def test_scalar_bytes_match_numpy(dt: object) -> None:
    rng = random.Random(3)
    for _ in range(200):
        v = truncate(dt, rng.uniform(-1e5, 1e5) if dt.kind == "f" else rng.randint(-(1 << 40), 1 << 40))
        want = np.array([v], dtype=to_np_dtype(dt))
        assert scalar_bytes(dt, v) == want.tobytes()
        back = scalar_from_bytes(dt, want.tobytes())
        assert back == want[0].item() and type(back) is type(want[0].item())


def test_bfloat16_scalar_bytes_are_the_top_half_of_float32() -> None:
    for v in (1.0, -2.5, 3.140625, float("inf"), 0.0):
        raw = scalar_bytes(dtypes.bfloat16, truncate(dtypes.bfloat16, v))
        assert len(raw) == 2 and scalar_from_bytes(dtypes.bfloat16, raw) == truncate(dtypes.bfloat16, v)


def test_float16_truncation_matches_numpy() -> None:
    rng = random.Random(0)
    vals = [65504.0, 65519.99, 65520.0, -65536.0, 1e10, 5.96e-8, 2.98e-8, 2.99e-8, 1e-9, float("nan"), -0.0]
    vals += [rng.uniform(-7e4, 7e4) for _ in range(3000)] + [rng.uniform(-1e-4, 1e-4) for _ in range(3000)]
    for v in vals:
        got = truncate(dtypes.float16, v)
        with np.errstate(all="ignore"):
            want = float(np.array([v]).astype(np.float16)[0])
        same_sign = math.copysign(1, got) == math.copysign(1, want)
        assert (math.isnan(got) and math.isnan(want)) or (got == want and same_sign), v


@pytest.mark.parametrize("args", [(0, 10), (3, -7, -2), (0.5, 4.0, 0.25), (-1.0, 1.0, 0.1), (5,), (0, 0)])
@pytest.mark.parametrize("dtype", [None, "int64", "float64", "int16", "uint8"])
def test_arange_without_numpy_matches_the_numpy_path(args: tuple, dtype: str | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if dtype == "uint8" and min(args) < 0:
        pytest.skip("a negative range in uint8 wraps: not what this compares")
    kw = {} if dtype is None else {"dtype": dtype}
    monkeypatch.setattr(creation, "loaded_numpy", lambda: np)
    try:
        slow = Tensor.arange(*args, **kw)
    except RuntimeError as e:  # e.g. a float step that truncates to an integer step of 0
        monkeypatch.setattr(creation, "loaded_numpy", lambda: None)
        with pytest.raises(RuntimeError, match=str(e)):
            Tensor.arange(*args, **kw)
        return
    monkeypatch.setattr(creation, "loaded_numpy", lambda: None)
    fast = Tensor.arange(*args, **kw)
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    np.testing.assert_array_equal(fast.numpy(), slow.numpy())


def test_the_float16_probe_expects_what_numpy_computes() -> None:
    toolchain = pytest.importorskip("ember_cpu.toolchain")
    for v in [*toolchain._HALF_VALUES, 1e-3, 7.0, -3.3, 123.456, 60000.0, -65504.0]:
        d = np.float64(v)
        with np.errstate(all="ignore"):
            a, b = d.astype(np.float16), np.float32(d).astype(np.float16)
            a32, b32 = a.astype(np.float32), b.astype(np.float32)
            per_op = ((a32 * b32).astype(np.float16).astype(np.float32) + b32).astype(np.float16)
            once32 = (a32 * b32 + b32).astype(np.float16)
            once64 = (a.astype(np.float64) * b.astype(np.float64) + b.astype(np.float64)).astype(np.float16)
        ha, hb = toolchain._to_half(v), toolchain._to_half(float(np.float32(d)))
        mul32 = toolchain._exact(ha, hb, "*", toolchain._to_f32)
        ours = [ha, hb, toolchain._to_half(toolchain._exact(toolchain._to_half(mul32), hb, "+", toolchain._to_f32)),
                toolchain._to_half(toolchain._exact(mul32, hb, "+", toolchain._to_f32)),
                toolchain._to_half(toolchain._exact(toolchain._exact(ha, hb, "*", float), hb, "+", float))]
        for got, want in zip(ours, (a, b, per_op, once32, once64)):
            assert toolchain._same(got, float(want)), (v, got, want)
