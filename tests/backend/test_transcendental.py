"""Accuracy of the transcendental functions, measured in units in the last place (ulp).

A float32 result is compared with the float64 reference rounded to float32; the distance is the
number of float32 values between them. The inputs cover wide ranges (|x| up to 1e4 where the
function is defined that far), [-10, 10], [-1, 1], magnitudes down to the denormals, and the
specials (+-0, +-inf, nan, the largest and smallest floats).

Bounds, and why some exceed the 2 ulp target:

* functions that are a single device primitive inherit the device's accuracy. CPU calls the C
  library (<= 1 ulp here), and other compiled devices are held to the same bounds. The PYTHON
  device uses numpy's float32 loops, which are up to 2 ulp (exp, exp2, log2) and 3 ulp (log) off;
  everything built on them carries that (sigmoid, softplus, logsigmoid: 3 ulp on PYTHON, 2 on CPU).
* the math-library functions computed in float64 and rounded once are within 1 ulp everywhere.
* without float64 on the device (``PREFER_WIDE_MATH = False`` simulates that) they compute in
  float32 and stay within 3 ulp (asin, acos, atanh, tan: one more rounding than the others).
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import packed_numpy

import ember.frontend.elementwise as elementwise
from ember import Tensor, dtypes

torch = pytest.importorskip("torch")

N = 20000
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)
F32_DENORM = float(np.finfo(np.float32).smallest_subnormal)
SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, F32_MAX, -F32_MAX, F32_TINY, -F32_TINY, F32_DENORM,
            -F32_DENORM, 1.0, -1.0, 0.5, -0.5, 2.0]


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Float32 steps between ``got`` and ``want``; nan matches nan, a wrong inf or nan counts as 2**40."""
    g = np.ascontiguousarray(got, np.float32)
    w = np.ascontiguousarray(want, np.float32)

    def ordered(a: np.ndarray) -> np.ndarray:
        i = a.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    d = np.abs(ordered(g) - ordered(w))
    gn, wn = np.isnan(g), np.isnan(w)
    bad = (gn != wn) | ((np.isinf(g) | np.isinf(w)) & (g != w))
    return np.where(gn & wn, 0, np.where(bad, 1 << 40, d))


def rng_for(name: str) -> np.random.Generator:
    """A generator seeded by ``name``, so inputs do not depend on which tests ran before."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def inputs(lo: float, hi: float, rng: np.random.Generator) -> np.ndarray:
    """Uniform samples over [lo, hi], a narrower core, tiny magnitudes down to denormals, and the specials."""
    parts = [rng.uniform(lo, hi, N)]
    for w in (10.0, 1.0):
        if hi - lo > 2 * w:
            a, b = max(lo, -w), min(hi, w)
            parts.append(rng.uniform(a, b, N))
    mags = 10.0 ** rng.uniform(-45, -1, N)
    tiny = mags * np.where(rng.random(N) < 0.5, -1, 1) if lo < 0 else mags
    parts += [tiny[(tiny >= lo) & (tiny <= hi)], np.array(SPECIALS)]
    return np.concatenate(parts).astype(np.float32)


def t64(name: str) -> Callable[[np.ndarray], np.ndarray]:
    fn = getattr(torch, name) if hasattr(torch, name) else getattr(torch.nn.functional, name)
    return lambda x: fn(torch.from_numpy(x.astype(np.float64))).numpy()


def f64(fn: Callable[[Any], Any]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: fn(torch.from_numpy(x.astype(np.float64))).numpy()


# name: (ember fn, float64 reference, domain, {device: max ulp}, odd: sign of a zero result must match)
CASES: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], tuple[float, float],
                       dict[str, int], bool]] = {
    "exp": (lambda t: t.exp(), t64("exp"), (-110.0, 90.0), {"CPU": 1, "PYTHON": 2}, False),
    "exp2": (lambda t: t.exp2(), t64("exp2"), (-160.0, 130.0), {"CPU": 1, "PYTHON": 2}, False),
    "expm1": (lambda t: t.expm1(), t64("expm1"), (-110.0, 90.0), {"CPU": 1, "PYTHON": 1}, True),
    "log": (lambda t: t.log(), t64("log"), (0.0, 1e4), {"CPU": 1, "PYTHON": 3}, False),
    "log2": (lambda t: t.log2(), t64("log2"), (0.0, 1e4), {"CPU": 1, "PYTHON": 2}, False),
    "log10": (lambda t: t.log10(), t64("log10"), (0.0, 1e4), {"CPU": 1, "PYTHON": 1}, False),
    "log1p": (lambda t: t.log1p(), t64("log1p"), (-1.0, 1e4), {"CPU": 1, "PYTHON": 1}, True),
    "sqrt": (lambda t: t.sqrt(), t64("sqrt"), (0.0, 1e4), {"CPU": 0, "PYTHON": 0}, True),
    "rsqrt": (lambda t: t.rsqrt(), t64("rsqrt"), (0.0, 1e4), {"CPU": 1, "PYTHON": 1}, False),
    "sin": (lambda t: t.sin(), t64("sin"), (-1e4, 1e4), {"CPU": 1, "PYTHON": 1}, True),
    "cos": (lambda t: t.cos(), t64("cos"), (-1e4, 1e4), {"CPU": 1, "PYTHON": 1}, False),
    "tan": (lambda t: t.tan(), t64("tan"), (-1e4, 1e4), {"CPU": 1, "PYTHON": 1}, True),
    "asin": (lambda t: t.asin(), t64("asin"), (-1.0, 1.0), {"CPU": 1, "PYTHON": 1}, True),
    "acos": (lambda t: t.acos(), t64("acos"), (-1.0, 1.0), {"CPU": 1, "PYTHON": 1}, False),
    "atan": (lambda t: t.atan(), t64("atan"), (-1e4, 1e4), {"CPU": 1, "PYTHON": 1}, True),
    "sinh": (lambda t: t.sinh(), t64("sinh"), (-90.0, 90.0), {"CPU": 1, "PYTHON": 1}, True),
    "cosh": (lambda t: t.cosh(), t64("cosh"), (-90.0, 90.0), {"CPU": 1, "PYTHON": 1}, False),
    "tanh": (lambda t: t.tanh(), t64("tanh"), (-20.0, 20.0), {"CPU": 1, "PYTHON": 1}, True),
    "asinh": (lambda t: t.asinh(), t64("asinh"), (-1e4, 1e4), {"CPU": 1, "PYTHON": 1}, True),
    "acosh": (lambda t: t.acosh(), t64("acosh"), (1.0, 1e4), {"CPU": 1, "PYTHON": 1}, False),
    "atanh": (lambda t: t.atanh(), t64("atanh"), (-1.0, 1.0), {"CPU": 1, "PYTHON": 1}, True),
    "erf": (lambda t: t.erf(), t64("erf"), (-6.0, 6.0), {"CPU": 1, "PYTHON": 1}, True),
    "sigmoid": (lambda t: t.sigmoid(), t64("sigmoid"), (-110.0, 110.0), {"CPU": 2, "PYTHON": 3}, False),
    "softplus": (lambda t: t.softplus(), f64(torch.nn.functional.softplus), (-110.0, 110.0), {"CPU": 2, "PYTHON": 3},
                 False),
    "logsigmoid": (lambda t: t.logsigmoid(), f64(torch.nn.functional.logsigmoid), (-110.0, 110.0),
                   {"CPU": 2, "PYTHON": 3}, False),
    "elu": (lambda t: t.elu(), f64(torch.nn.functional.elu), (-110.0, 110.0), {"CPU": 1, "PYTHON": 2}, False),
}


def bound_for(device: str, bounds: dict[str, int]) -> int:
    """The bound for ``device``: PYTHON has numpy's, every compiled device is held to the C library's."""
    return bounds["PYTHON"] if device == "PYTHON" else bounds["CPU"]


@pytest.mark.parametrize("name", CASES)
def test_float32_ulp(device, name):
    fn, ref, (lo, hi), bounds, odd = CASES[name]
    x = inputs(lo, hi, rng_for(name))
    got = fn(Tensor(x, device=device)).numpy()
    assert got.dtype == np.float32 and got.shape == x.shape
    with np.errstate(all="ignore"):
        want = ref(x).astype(np.float32)
    d = ulp_distance(got, want)
    worst = int(np.argmax(d))
    assert d.max() <= bound_for(device, bounds), (f"{name}: {d.max()} ulp at x={x[worst]!r}: got {got[worst]!r}, "
                                       f"want {want[worst]!r}")
    if odd:  # a zero result keeps the sign of the input
        zero = want == 0
        np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))


# Without float64 on the device, the math-library functions run in float32: measured worst cases.
FALLBACK_BOUNDS = {"cos": 3, "tan": 3, "asin": 3, "acos": 3, "atan": 2, "sinh": 2, "cosh": 2, "asinh": 2,
                   "acosh": 2, "atanh": 3, "erf": 2, "expm1": 1, "log1p": 2, "log10": 2}
# numpy's float32 exp/log/sin on the PYTHON device add up to two more
FALLBACK_PYTHON_EXTRA = {"log10": 2, "log1p": 2, "asinh": 2, "acosh": 2, "atanh": 2, "cosh": 2, "sinh": 1, "cos": 1,
                         "tan": 1, "erf": 1, "expm1": 3}


def test_float32_without_float64(device, monkeypatch):
    monkeypatch.setattr(elementwise, "PREFER_WIDE_MATH", False)
    xs = {name: inputs(*CASES[name][2], rng_for(name))[::4] for name in FALLBACK_BOUNDS}
    outs = packed_numpy([CASES[name][0](Tensor(x, device=device)) for name, x in xs.items()])
    problems = []
    for (name, x), got in zip(xs.items(), outs):
        with np.errstate(all="ignore"):
            want = CASES[name][1](x).astype(np.float32)
        limit = FALLBACK_BOUNDS[name] + (FALLBACK_PYTHON_EXTRA.get(name, 0) if device == "PYTHON" else 0)
        d = ulp_distance(got, want)
        if d.max() > limit:
            i = int(np.argmax(d))
            problems.append(f"{name}: {d.max()} ulp > {limit} at x={x[i]!r} (got {got[i]!r}, want {want[i]!r})")
    assert not problems, "\n".join(problems)


def test_float64_accuracy(device):
    """float64 inputs: within a few float64 ulp of torch's float64 results (relative 1e-14)."""
    names = [n for n in CASES if n not in ("exp", "exp2", "log", "log2", "sqrt", "sin")]
    xs = {name: rng_for(name).uniform(max(CASES[name][2][0], -700), min(CASES[name][2][1], 700), 2000)
          for name in names}
    outs = [CASES[name][0](Tensor(x, device=device)) for name, x in xs.items()]
    assert all(o.dtype == dtypes.float64 for o in outs)
    problems = []
    for (name, x), got in zip(xs.items(), packed_numpy(outs)):
        want = CASES[name][1](x)
        err = np.abs(got - want) / np.maximum(np.abs(want), 1e-300)
        if not np.all(err <= 1e-14):
            i = int(np.nanargmax(err))
            problems.append(f"{name}: relative error {err[i]:.3g} at x={x[i]!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision(device, dt):
    """float16 and bfloat16 compute in float32 and round once, like torch: at most one step apart."""
    tdt = torch.float16 if dt == dtypes.float16 else torch.bfloat16
    top = 60000.0 if dt == dtypes.float16 else 1e30
    xs = {name: torch.from_numpy(rng_for(name).uniform(max(lo, -top), min(hi, top), 300)).to(tdt)
          for name, (_, _, (lo, hi), _, _) in CASES.items()}
    outs = [CASES[name][0](Tensor(x.float().numpy(), device=device, dtype=dt)) for name, x in xs.items()]
    assert all(o.dtype == dt for o in outs)
    problems = []
    for (name, x), got in zip(xs.items(), packed_numpy(outs)):
        want = torch.from_numpy(CASES[name][1](x.double().numpy())).to(tdt)  # the exact result rounded once
        g = torch.from_numpy(got).to(tdt)
        steps = (g.view(torch.int16).int() - want.view(torch.int16).int()).abs()
        same = (g == want) | (g.isnan() & want.isnan())
        if not bool(((steps <= 1) | same).all()):
            problems.append(f"{name}: {int(steps[~same].max())} steps")
    assert not problems, "\n".join(problems)


def test_special_values(device):
    """Overflow to inf, log(0) = -inf, domain errors give nan, saturation is exact."""
    inf, nan = math.inf, math.nan
    t = Tensor([0.0, 1000.0, -1000.0, inf, -inf, -1.0], device=device)
    u = Tensor([1.0, -1.0, 1.5, -1.5, 0.5, -2.0], device=device)
    cases = [
        (t.exp(), [1.0, inf, 0.0, inf, 0.0, None]),
        (t.log(), [-inf, None, nan, inf, nan, nan]),
        (t.sqrt(), [0.0, None, nan, inf, nan, nan]),
        (t.tanh(), [0.0, 1.0, -1.0, 1.0, -1.0, None]),
        (t.sigmoid(), [0.5, 1.0, 0.0, 1.0, 0.0, None]),
        (t.erf(), [0.0, 1.0, -1.0, 1.0, -1.0, None]),
        (t.softplus(), [None, 1000.0, 0.0, inf, 0.0, None]),
        (t.logsigmoid(), [None, 0.0, -1000.0, 0.0, -inf, None]),
        (t.cosh(), [1.0, inf, inf, inf, inf, None]),
        (t.sinh(), [0.0, inf, -inf, inf, -inf, None]),
        (t.atan(), [0.0, None, None, np.float32(np.pi / 2), -np.float32(np.pi / 2), None]),
        (t.sin(), [0.0, None, None, nan, nan, None]),
        (t.cos(), [1.0, None, None, nan, nan, None]),
        (t.tan(), [0.0, None, None, nan, nan, None]),
        (t.expm1(), [0.0, inf, -1.0, inf, -1.0, None]),
        (u.atanh(), [inf, -inf, nan, nan, None, nan]),
        (u.asin(), [np.float32(np.pi / 2), -np.float32(np.pi / 2), nan, nan, None, nan]),
        (u.acos(), [0.0, np.float32(np.pi), nan, nan, None, nan]),
        (u.acosh(), [0.0, nan, None, nan, nan, nan]),
        (u.log1p(), [None, -inf, None, nan, None, nan]),
    ]
    for (_, want), got in zip(cases, packed_numpy([c[0] for c in cases])):
        keep = [i for i, w in enumerate(want) if w is not None]
        np.testing.assert_array_equal(got[keep], np.array([want[i] for i in keep], np.float32))
