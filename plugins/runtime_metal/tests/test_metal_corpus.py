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
from dataclasses import dataclass, field

import numpy as np
import pytest
from ember_metal.renderer import MetalRenderer
from metal_host_run import HostKernels, run_on_python
from metal_msl_check import check_msl

from ember.codegen import LaunchTooLarge, get_program
from ember.dtype import f32_to_bf16, to_np_dtype
from ember.renderer import Ops, PtrDType, dtypes
from ember.testing import load_corpus

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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bool]:
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


@dataclass
class Lowered:
    """The corpus lowered for the METAL renderer."""

    folder: str
    recorded_here: bool
    total: int  # distinct kernels in the corpus
    specs: list = field(default_factory=list)  # ProgramSpecs of the kernels Metal can run
    failures: list[str] = field(default_factory=list)  # kernels that could not be lowered or rendered
    seconds: float = 0.0


@pytest.fixture(scope="module")
def lowered(corpus: tuple[str, bool]) -> Lowered:
    folder, recorded_here = corpus
    start = time.perf_counter()
    renderer = MetalRenderer()
    asts = load_corpus(folder)
    out = Lowered(folder, recorded_here, len(asts))
    for ast in asts:
        if not metal_can_run(ast, renderer):
            continue
        try:
            out.specs.append(get_program(ast, renderer))
        except LaunchTooLarge:  # a kernel past Metal's 32-bit launch ids (recorded on the CPU): refused by design
            continue
        except Exception as e:  # noqa: BLE001 - collect every kernel that cannot be lowered, then fail once
            out.failures.append(f"{type(e).__name__}: {e}")
    out.seconds = time.perf_counter() - start
    return out


def test_corpus_renders_and_type_checks(clang: str, lowered: Lowered) -> None:
    kept = len(lowered.specs) + len(lowered.failures)
    sources = [spec.src for spec in lowered.specs]
    assert len(sources) >= (40 if lowered.recorded_here else 1), \
        f"only {len(sources)} kernels in the corpus at {lowered.folder}"
    start = time.perf_counter()
    runs = check_msl(sources)
    done = time.perf_counter()
    features = {name: sum(needle in s for s in sources) for name, needle in
                [("half", " half "), ("bfloat16", "ember_bf16_"), ("loops", "for ("), ("int variables", "ember_vals"),
                 ("threadgroup memory", "threadgroup "), ("barriers", "threadgroup_barrier"),
                 ("simdgroup matrices", "simdgroup_multiply_accumulate")]}
    print(f"\nMETAL corpus: {len(sources)} kernels checked ({lowered.total - kept} left out: float64) in {runs} "
          f"clang runs; lowering+render {lowered.seconds:.2f} s, clang {done - start:.2f} s; kernels with "
          + ", ".join(f"{k}: {v}" for k, v in features.items()))
    if lowered.recorded_here:  # the representative programs must reach the renderer's 16-bit float paths
        assert features["half"] and features["bfloat16"] and features["loops"]
    # after the check of everything that did lower, so one codegen failure does not hide the rest
    assert not lowered.failures, f"{len(lowered.failures)} of {kept} kernels could not be rendered for Metal:\n" + \
        "\n".join(sorted(set(lowered.failures))[:20])


#: kernels up to this many estimated ALU ops run on the host and on PYTHON (the interpreter is the slow side)
HOST_RUN_MAX_OPS = 200_000
TRANSCENDENTAL = frozenset({Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW})


def random_buffer(dt, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` stored values of ``dt`` in a range where float results do not overflow."""
    if dt == dtypes.bool:
        return rng.integers(0, 2, n).astype(np.bool_)
    if dt.kind in "iu":
        return rng.integers(0 if dt.kind == "u" else -8, 9, n).astype(to_np_dtype(dt))
    vals = rng.uniform(-3, 3, n).astype(np.float32)
    return f32_to_bf16(vals) if dt == dtypes.bfloat16 else vals.astype(to_np_dtype(dt))


def test_corpus_kernels_compute_like_python(host_clang: str, lowered: Lowered) -> None:
    """The MSL of every small corpus kernel, run on the host, gives the PYTHON device's results for the same
    lowered program (floats within a few ulp: transcendental functions come from different libraries)."""
    renderer = MetalRenderer()
    specs = []
    for spec in lowered.specs:
        indexed_by_data = any(u.op in (Ops.LOAD, Ops.STORE) and any(x.op is Ops.LOAD for x in u.src[1].toposort())
                              for u in spec.uops)
        if spec.estimated_ops <= HOST_RUN_MAX_OPS and not indexed_by_data and "threadgroup_barrier" not in spec.src:
            specs.append(spec)
    assert specs, f"no kernel of {lowered.folder} is small enough to run on the host"
    start = time.perf_counter()
    kernels = HostKernels({f"k{i}": renderer.render(f"k{i}", list(spec.uops)) for i, spec in enumerate(specs)})
    built = time.perf_counter()
    rng = np.random.default_rng(3)
    skipped = 0
    for i, spec in enumerate(specs):
        globals_ = {u.arg[0]: u for u in spec.uops if u.op is Ops.DEFINE_GLOBAL}
        arrays = [random_buffer(globals_[j].dtype.base, globals_[j].arg[1], rng) if j in globals_
                  else np.zeros(1, np.uint8) for j in range(max(globals_) + 1)]
        vals = tuple(u.arg[1] for u in spec.uops if u.op is Ops.DEFINE_VAR)
        want = run_on_python(list(spec.uops), arrays, spec.global_size, vals)
        got = [a.copy() for a in arrays]
        kernels.run(f"k{i}", got, spec.global_size, spec.local_size or (1, 1, 1), vals)
        # a transcendental result may differ in its last bit between libraries; an integer made from it (a
        # bitcast, a comparison) is then not comparable bit for bit
        inexact = any(u.op in TRANSCENDENTAL for u in spec.uops)
        for j in spec.outs:
            dt = globals_[j].dtype.base
            if inexact and dt.kind != "f":
                skipped += 1
                continue
            what = f"kernel {spec.name} (corpus #{i}), buffer {j} ({dt.name})\n{spec.src}"
            g, w = got[j], want[j]
            if dt == dtypes.bfloat16:
                g, w = (g.astype(np.uint32) << 16).view(np.float32), (w.astype(np.uint32) << 16).view(np.float32)
            if dt.kind == "f":
                tol = {dtypes.float32: 1e-5, dtypes.float16: 2e-3, dtypes.bfloat16: 1.6e-2}[dt]
                atol = tol
                if inexact:  # a last-bit difference of exp or sin, amplified by cancellation in a sum
                    finite = np.abs(w[np.isfinite(w)].astype(np.float64))
                    tol, atol = 10 * tol, 10 * tol * max(1.0, float(finite.max(initial=1.0)))
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=atol,
                                           equal_nan=True, err_msg=what)
            else:
                np.testing.assert_array_equal(g, w, err_msg=what)
    print(f"\nMETAL corpus on the host: {len(specs)} kernels run and compared with PYTHON ({skipped} integer "
          f"outputs of transcendental values not compared; build {built - start:.2f} s, "
          f"runs {time.perf_counter() - built:.2f} s)")
