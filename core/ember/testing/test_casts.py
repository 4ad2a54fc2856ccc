"""Casts between every pair of dtypes, checked value by value against numpy and the PYTHON device.

The source values include the hard cases: NaN and infinities, signed zeros, denormals of every
float width, values that round differently when a float64 is narrowed in two steps (through
float32) instead of one, halfway cases, the largest finite values, and integers at the edges of
every width. Float to integer conversion truncates toward zero; a value the integer dtype cannot
hold (NaN and infinities included) converts to 0 on every ember device.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.dtype import DType, bf16_to_f32, f32_to_bf16
from ember.testing.checks import ALL_DTYPES, REFERENCE, assert_same, name, need, np_dtype, supported

# floats whose narrowing is easy to get wrong (some halfway cases only look halfway after a first rounding)
FLOAT_VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, 0.9999999, 127.9, 128.0, -128.5, -129.0,
                255.5, 256.0, 300.7, -300.7, 32767.5, -32768.9, 65504.0, 65519.99, 65520.0, 70000.0, 2147483520.0,
                2147483648.0, -2147483648.0, -2147483904.0, 4294967040.0, 4294967296.0, 9.2233715e18, 1.9e19, 1e10,
                -1e10, 3.3e38, 1e39, -1e300, 6e-8, 2.9e-8, 1e-5, 1e-40, -1e-42, 1e-310, 5e-324,
                1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -8 + 2 ** -30, -(1 + 2 ** -11 + 2 ** -40), 2049.0 + 2 ** -30,
                math.pi, -math.e, math.inf, -math.inf, math.nan]


def _int_values(dt: DType) -> list[int]:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    edges = [0, 1, -1, 2, 127, 128, -128, -129, 255, 256, 2049, 32767, 32768, -32769, 65535, 65536, 16777217,
             2 ** 24 + 2 ** 16 + 1, -(2 ** 24 + 2 ** 16 + 1), 2 ** 31 - 1, -2 ** 31, 2 ** 32 - 1, 2 ** 53 + 1,
             2 ** 62 + 2 ** 40 + 1, 2 ** 62 + 2 ** 54 + 1, -(2 ** 62 + 2 ** 54 + 1), 2 ** 63 + 2 ** 55 + 1, lo, hi,
             lo + 1, hi - 1]
    return [v for v in edges if lo <= v <= hi]


def source_values(dt: DType) -> np.ndarray:
    """The source array for casts from ``dt``, exactly representable in ``dt`` (bfloat16 as float32 values)."""
    if dt.kind == "b":
        return np.array([False, True, True, False])
    if dt.kind in "iu":
        return np.array(_int_values(dt), dtype=np_dtype(dt))
    x = np.array(FLOAT_VALUES, dtype=np.float64)
    with np.errstate(all="ignore"):
        if dt == dtypes.bfloat16:
            return bf16_to_f32(f32_to_bf16(round_to_odd_f32(x)))
        return x.astype(np_dtype(dt))


def round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 values narrowed to float32 with round-to-odd, so that a second rounding to any float with
    at least two fewer significand bits (bfloat16) gives the correctly rounded result."""
    with np.errstate(all="ignore"):
        f = x.astype(np.float32)
    bits = f.view(np.uint32).copy()
    inexact = np.isfinite(x) & (f.astype(np.float64) != x)
    away = inexact & (np.abs(f.astype(np.float64)) > np.abs(x))
    bits[away] -= 1  # step back toward zero (for an overflow to inf this lands on the largest float)
    bits[inexact] |= 1
    return bits.view(np.float32)


def _int_to_bf16(v: int) -> float:
    """Exact round-to-nearest-even of a Python int to bfloat16 (8 significant bits)."""
    mag = abs(v)
    shift = max(mag.bit_length() - 8, 0)
    q, r = divmod(mag, 1 << shift)
    half = (1 << shift) >> 1
    if shift and (r > half or (r == half and q & 1)):
        q += 1
    return math.copysign(float(q << shift), v) if v else 0.0


def expected(src: np.ndarray, sdt: DType, ddt: DType) -> np.ndarray:
    """What casting ``src`` (values of ``sdt``) to ``ddt`` must give, from numpy and exact integer arithmetic."""
    with np.errstate(all="ignore"):
        if ddt.kind == "b":
            return src != 0
        if ddt.kind in "iu":
            if sdt.kind != "f":
                return src.astype(np_dtype(ddt))  # integers wrap, as in C, numpy and torch
            # compared as exact Python ints: float64(2**63 - 1) is 2**63, which does not fit int64
            ints = [int(v) if math.isfinite(v) else None for v in src.astype(np.float64).tolist()]
            fit = [v if v is not None and dtypes.min(ddt) <= v <= dtypes.max(ddt) else 0 for v in ints]
            return np.array(fit, dtype=np_dtype(ddt))
        if ddt == dtypes.bfloat16:
            if sdt.kind in "iu":
                return np.array([_int_to_bf16(int(v)) for v in src], np.float32)
            return bf16_to_f32(f32_to_bf16(round_to_odd_f32(src.astype(np.float64))))
        if sdt.kind in "iu" and ddt == dtypes.float16:
            # numpy goes through float64 here; float64 holds every int64 value that does not overflow float16
            return np.array([float(v) for v in src]).astype(np.float16)
        return src.astype(np_dtype(ddt))


PAIRS = list(itertools.product(ALL_DTYPES, ALL_DTYPES))
_RESULTS: dict[tuple[str, DType], dict[DType, np.ndarray]] = {}


def _casts_from(device: str, src_dt: DType) -> dict[DType, np.ndarray]:
    """The source values of ``src_dt`` cast to every supported dtype on ``device``, computed once and
    together (one batched compile instead of one per pair)."""
    key = (device, src_dt)
    if key not in _RESULTS:
        t = Tensor(source_values(src_dt), dtype=src_dt, device=device)
        outs = {dt: t.cast(dt) for dt in ALL_DTYPES if supported(device, dt)}
        Tensor.realize_all(*outs.values())
        _RESULTS[key] = {dt: o.numpy() for dt, o in outs.items()}
    return _RESULTS[key]


@pytest.mark.parametrize("src_dt,dst_dt", PAIRS, ids=[f"{name(s)}-{name(d)}" for s, d in PAIRS])
def test_cast(device: str, src_dt: DType, dst_dt: DType) -> None:
    """Every value of the hard-case table casts exactly as numpy (and the PYTHON device) says."""
    need(device, src_dt, dst_dt)
    src = source_values(src_dt)
    want = expected(src, src_dt, dst_dt)
    got = _casts_from(device, src_dt)[dst_dt]
    assert got.dtype == np_dtype(dst_dt), f"numpy() of a {name(dst_dt)} tensor gave {got.dtype}"
    assert_same(got, want.astype(np_dtype(dst_dt)), exact=True, inputs=src,
                what=f"{name(src_dt)} -> {name(dst_dt)} on {device}")


def test_reference_agrees_on_casts(device: str) -> None:
    """The PYTHON device gives the same bits as the device under test for a cast chain through every dtype."""
    src = source_values(dtypes.float64)
    chain = [dt for dt in ALL_DTYPES if dt.kind == "f"] + [dtypes.int32, dtypes.float32]
    for dev in (device, REFERENCE):
        need(dev, *chain)

    def run(dev: str) -> list[np.ndarray]:
        t = Tensor(src, dtype=dtypes.float64, device=dev)
        outs = [t.cast(dt) for dt in chain]
        Tensor.realize_all(*outs)
        return [o.numpy() for o in outs]

    for dt, got, want in zip(chain, run(device), run(REFERENCE)):
        assert_same(got, want, exact=True, what=f"float64 -> {name(dt)}, {device} vs {REFERENCE}")


def test_cast_after_arithmetic_rounds_once(device: str) -> None:
    """A float64 result narrowed inside a fused kernel rounds like a stored one (no double rounding)."""
    need(device, dtypes.float64, dtypes.float16, dtypes.bfloat16)
    x = np.array([1 + 2 ** -11, 1 + 2 ** -8, 65519.0], np.float64)
    t = Tensor(x, dtype=dtypes.float64, device=device)
    bump = t + 2 ** -40  # pushes the halfway values just above half: the correct result rounds up
    want16 = (x + 2 ** -40).astype(np.float16)
    want_bf = bf16_to_f32(f32_to_bf16(round_to_odd_f32(x + 2 ** -40)))
    assert_same(bump.cast(dtypes.float16).numpy(), want16, exact=True, what="float64 -> float16 in a kernel")
    assert_same(bump.cast(dtypes.bfloat16).numpy(), want_bf, exact=True, what="float64 -> bfloat16 in a kernel")
