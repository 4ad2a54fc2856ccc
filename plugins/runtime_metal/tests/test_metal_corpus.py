"""Every kernel of the corpus renders as MSL that passes clang's syntax and type check (see metal_msl_check).

``KERNEL_CORPUS=<folder>`` names a corpus recorded by a test run (``make test`` records the main suite's);
without it this test records a small one itself from a representative set of tensor programs, so it
never passes on nothing. Kernels using a dtype Metal lacks (float64) are left out and counted.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from ember_metal.renderer import MetalRenderer
from metal_msl_check import check_msl

from ember.codegen import get_program
from ember.engine.corpus import load_corpus
from ember.renderer import PtrDType

pytestmark = pytest.mark.corpus

#: tensor programs whose kernels stand for a workload when no corpus is given: every dtype Metal has,
#: elementwise and transcendental ops, casts, reductions along each axis, matmul, convolution, softmax,
#: indexing, cumulative sums and movement ops
REPRESENTATIVE = textwrap.dedent("""
    import numpy as np
    from ember import Tensor, dtypes
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((6, 10)).astype(np.float32))
    w = Tensor(rng.standard_normal((10, 7)).astype(np.float32))
    outs = [x @ w, x.T @ x, x.sum(), x.sum(0), x.max(1), x.mean(1), x.softmax(1), x.argmax(1), x.cumsum(1),
            x.exp().log1p(), x.sin() * x.sqrt(), x.relu().pow(2.5), x.where(x > 0, -x), (x * 3) // 2, x % 0.7,
            x.pad(((1, 1), (2, 0))), x.flip(0)[1:4, ::2], x.reshape(2, 3, 10).permute(2, 0, 1).contiguous()]
    for dt in (dtypes.float16, dtypes.bfloat16, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32,
               dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.bool):
        y = x.cast(dt)
        outs += [y + y, y.max(1), y.cast(dtypes.float32) * 2]
        if dt.name not in ("bool",):
            outs += [y * y, y.sum(0)]
    h = x.cast(dtypes.float16)
    outs += [h @ w.cast(dtypes.float16), h.exp(), h.softmax(0), x.cast(dtypes.bfloat16).sin()]
    i = Tensor(rng.integers(-50, 50, (6, 10)).astype(np.int32))
    outs += [i // 7, i % 5, i << 3, i >> 2, i & 12, i ^ 5, i.bitcast(dtypes.float32), i.cast(dtypes.float16)]
    img = Tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    k = Tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    outs += [img.conv2d(k, padding=1), img.max_pool2d(), img.avg_pool2d()]
    for o in outs:
        o.realize()
""")


def corpus_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bool]:
    """The corpus to check, and whether it was recorded here."""
    folder = os.environ.get("KERNEL_CORPUS", "")
    if folder:
        return folder, False
    folder = str(tmp_path_factory.mktemp("metal-corpus"))
    # the PYTHON device runs every kernel without a compiler; a fresh process records from its first kernel
    env = {**os.environ, "KERNEL_CORPUS": folder, "DEV": "PYTHON"}
    subprocess.run([sys.executable, "-c", REPRESENTATIVE], env=env, check=True, timeout=600)
    return folder, True


def metal_can_run(ast, renderer: MetalRenderer) -> bool:
    """True when every dtype in the kernel exists on Metal."""
    for u in ast.toposort():
        dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
        if dt is not None and dt not in renderer.supported_dtypes:
            return False
    return True


def test_corpus_renders_and_type_checks(clang: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    folder, recorded_here = corpus_folder(tmp_path_factory)
    start = time.perf_counter()
    renderer = MetalRenderer()
    asts = load_corpus(folder)
    kept = [ast for ast in asts if metal_can_run(ast, renderer)]
    sources, failures = [], []
    for ast in kept:
        try:
            sources.append(get_program(ast, renderer).src)
        except Exception as e:  # noqa: BLE001 - collect every kernel that cannot be lowered, then fail once
            failures.append(f"{type(e).__name__}: {e}")
    lowered = time.perf_counter()
    assert not failures, f"{len(failures)} of {len(kept)} kernels could not be rendered for Metal:\n" + \
        "\n".join(sorted(set(failures))[:20])
    assert len(sources) >= (40 if recorded_here else 1), f"only {len(sources)} kernels in the corpus at {folder}"
    runs = check_msl(sources)
    done = time.perf_counter()
    features = {name: sum(needle in s for s in sources) for name, needle in
                [("half", " half "), ("bfloat16", "ember_bf16_"), ("loops", "for ("), ("int variables", "ember_vals"),
                 ("threadgroup memory", "threadgroup "), ("barriers", "threadgroup_barrier"),
                 ("simdgroup matrices", "simdgroup_multiply_accumulate")]}
    print(f"\nMETAL corpus: {len(sources)} kernels checked ({len(asts) - len(kept)} left out: float64) in {runs} "
          f"clang runs; lowering+render {lowered - start:.2f} s, clang {done - lowered:.2f} s; kernels with "
          + ", ".join(f"{k}: {v}" for k, v in features.items()))
    if recorded_here:  # the representative programs must reach the renderer's 16-bit float paths
        assert features["half"] and features["bfloat16"] and features["loops"]
