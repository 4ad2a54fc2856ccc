"""Every dtype through the pipeline: construction, arithmetic, comparisons, reductions and casts.

Promotion is compared with torch (where torch defines it); values with numpy.
"""
from __future__ import annotations

import numpy as np
import pytest
from backend_utils import dtype_name

from ember import Tensor, dtypes
from ember.dtype import DType, to_np_dtype

INT_DTYPES = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32,
              dtypes.uint64)
FLOAT_DTYPES = (dtypes.float16, dtypes.float32, dtypes.float64)
ALL_DTYPES = (dtypes.bool, *INT_DTYPES, *FLOAT_DTYPES, dtypes.bfloat16)


def np_of(dt: DType) -> np.dtype:
    return np.dtype(np.float32 if dt == dtypes.bfloat16 else to_np_dtype(dt))


def sample(dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """Two small (2, 3) arrays of ``dt`` whose sums and products stay in range (except where noted)."""
    if dt == dtypes.bool:
        return np.array([[True, False, True], [False, False, True]]), np.array([[True, True, False], [False, True, 1]],
                                                                              dtype=bool)
    if dt.kind in "iu":
        a = np.array([[1, 5, 9], [0, 3, 10]])
        b = np.array([[2, 5, 1], [7, 0, 3]])
        if dt.kind == "i":
            a = a - 4
        return a.astype(np_of(dt)), b.astype(np_of(dt))
    return (np.array([[1.5, -2.25, 0.5], [4.0, 0.0, -1.0]], np_of(dt)),
            np.array([[0.5, 2.0, -1.5], [3.0, 1.0, 0.25]], np_of(dt)))


# float16 is computed in float16 by numpy too; allow one ulp (2**-10) of difference from the device's rounding
def tol(dt: DType) -> dict[str, float]:
    return {"rtol": 1e-3, "atol": 1e-3} if dt in (dtypes.float16, dtypes.bfloat16) else {"rtol": 1e-6, "atol": 0}


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
def test_arithmetic_every_dtype(device, check, dt):
    a, b = sample(dt)
    x, y = Tensor(a, device=device, dtype=dt), Tensor(b, device=device, dtype=dt)
    if dt == dtypes.bool:
        check(x + y, a | b)
        check(x * y, a & b)
        return
    check(x + y, (a + b).astype(np_of(dt)), dtype=dt, **tol(dt))
    check(x * y, (a * b).astype(np_of(dt)), dtype=dt, **tol(dt))
    check(x.maximum(y), np.maximum(a, b), dtype=dt)
    check(x.minimum(y), np.minimum(a, b), dtype=dt)
    if dt.kind != "u":
        check(x - y, (a - b).astype(np_of(dt)), dtype=dt, **tol(dt))
        check(-x, (-a).astype(np_of(dt)), dtype=dt)
        check(x.abs(), np.abs(a), dtype=dt)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
def test_compare_every_dtype(device, check, dt):
    a, b = sample(dt)
    x, y = Tensor(a, device=device, dtype=dt), Tensor(b, device=device, dtype=dt)
    check(x < y, a < b)
    check(x == y, a == b)
    check(x.T >= y.T, a.T >= b.T)  # built from < and == (or a negation), on transposed inputs


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
def test_reduce_every_dtype(device, check, dt):
    a, _ = sample(dt)
    x = Tensor(a, device=device, dtype=dt)
    check(x.max(1), a.max(1), dtype=dt)
    check(x.min(), a.min(), dtype=dt)
    if dt.kind in "biu":  # like tinygrad: bool and narrow ints sum to int32, unsigned ones to uint32, 64-bit kept
        acc = {"b": dtypes.int32, "i": dtypes.int32, "u": dtypes.uint32}[dt.kind] if dt.itemsize < 8 else dt
        check(x.sum(0), a.sum(0, dtype=np.int64).astype(np_of(acc)), dtype=acc)
        check(x.mean(), np.array(a.astype(np.float64).mean(), np.float32), dtype=dtypes.float32, rtol=1e-6)
    else:
        check(x.sum(0), a.sum(0), dtype=dt, **tol(dt))
        check(x.mean(), a.astype(np.float64).mean().astype(np_of(dt)), dtype=dt, **tol(dt))


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
def test_cast_round_trip_every_dtype(device, check, dt):
    a, _ = sample(dt)
    x = Tensor(a, device=device, dtype=dt)
    check(x.cast(dtypes.float32), a.astype(np.float32))
    check(x.cast(dtypes.float64).cast(dt), a, dtype=dt)
    check(x.cast(dtypes.bool), a.astype(bool))
    check(Tensor(a.astype(np.float32), device=device).cast(dt), a, dtype=dt)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
def test_where_and_movement_every_dtype(device, check, dt):
    a, b = sample(dt)
    cond = np.array([[True, False, False], [True, True, False]])
    x, y = Tensor(a, device=device, dtype=dt), Tensor(b, device=device, dtype=dt)
    check(Tensor(cond, device=device).where(x, y), np.where(cond, a, b), dtype=dt)
    check(x.T.flip(0).pad(((1, 0), (0, 1)))[1:], np.pad(a.T[::-1], ((1, 0), (0, 1)))[1:], dtype=dt)
    check(x.reshape(3, 2).expand(2, 3, 2), np.broadcast_to(a.reshape(3, 2), (2, 3, 2)), dtype=dt)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
def test_zeros_ones_every_dtype(device, check, dt):
    check(Tensor.zeros(2, 2, device=device, dtype=dt), np.zeros((2, 2), np_of(dt)), dtype=dt)
    check(Tensor.ones(3, device=device, dtype=dt) + Tensor.zeros(3, device=device, dtype=dt), np.ones(3, np_of(dt)),
          dtype=dt)


def test_integer_wraparound(device, check):
    u8 = np.array([200, 255, 0], np.uint8)
    check(Tensor(u8, device=device) + Tensor(np.array([100, 1, 0], np.uint8), device=device),
          np.array([44, 0, 0], np.uint8))
    check(Tensor(u8, device=device) * Tensor(np.array([2, 2, 2], np.uint8), device=device),
          np.array([144, 254, 0], np.uint8))
    i8 = np.array([127, -128], np.int8)
    check(Tensor(i8, device=device) + Tensor(np.array([1, -1], np.int8), device=device), np.array([-128, 127], np.int8))
    i32 = np.array([2 ** 31 - 1], np.int32)
    check(Tensor(i32, device=device) + Tensor(np.array([1], np.int32), device=device), np.array([-2 ** 31], np.int32))


def test_wide_integers_exact(device, check):
    # values beyond 2**53 would lose bits if anything went through float64
    i64 = np.array([2 ** 62 + 1, -(2 ** 62) - 3, 2 ** 63 - 1], np.int64)
    x = Tensor(i64, device=device)
    check(x + Tensor(np.array([2, 2, 0], np.int64), device=device), i64 + np.array([2, 2, 0], np.int64))
    check(x == Tensor(i64, device=device), np.array([True, True, True]))
    check(x.max(), np.array(2 ** 63 - 1, np.int64))
    u64 = np.array([2 ** 64 - 1, 2 ** 63 + 5, 1], np.uint64)
    y = Tensor(u64, device=device)
    check(y.max(), np.array(2 ** 64 - 1, np.uint64))
    check(y.min(), np.array(1, np.uint64))
    check(y > Tensor(np.array([0, 2 ** 63, 2], np.uint64), device=device), np.array([True, True, False]))
    check(y.T.flip(0), u64[::-1])
    u32 = np.array([2 ** 32 - 1, 2 ** 31], np.uint32)
    check(Tensor(u32, device=device).cast(dtypes.int64), u32.astype(np.int64))
    check(Tensor(u32, device=device).cast(dtypes.float64), u32.astype(np.float64))


def test_float64_keeps_precision(device, check):
    a = np.array([1.0, 1e-12, 1e300], np.float64)
    x = Tensor(a, device=device)
    check(x + 1.0, a + 1.0, rtol=1e-15)
    check((x + 1.0) - 1.0, (a + 1.0) - 1.0, rtol=1e-15)
    check(x * 1e-300, a * 1e-300, rtol=1e-15)
    check(x.sqrt(), np.sqrt(a), rtol=1e-15)
    check(x.exp()[:2], np.exp(a[:2]), rtol=1e-14)


def test_float16_range_and_rounding(device, check):
    h = np.array([65504.0, 6.1e-5, 1.0 + 2 ** -10, -3.0], np.float16)
    x = Tensor(h, device=device)
    check(x, h, exact=True)
    with np.errstate(over="ignore"):
        check(x + x, (h + h).astype(np.float16), exact=True)  # 65504 * 2 overflows to inf
    check(x * Tensor(np.float16(0.5), device=device), h * np.float16(0.5), exact=True)
    check(x.cast(dtypes.float32), h.astype(np.float32), exact=True)


def test_float_division_by_zero(device, check):
    a = np.array([1.0, -1.0, 0.0], np.float32)
    with np.errstate(all="ignore"):
        check(Tensor(a, device=device) / 0.0, a / np.float32(0.0))
        d = a.astype(np.float64)
        check(Tensor(d, device=device) / Tensor(np.zeros(3), device=device), d / 0)


@pytest.mark.parametrize("dt", INT_DTYPES, ids=dtype_name)
def test_int_true_division_gives_float32(device, check, dt):
    a = np.array([7, 9, 0], np_of(dt))
    b = np.array([2, 4, 5], np_of(dt))
    check(Tensor(a, device=device) / Tensor(b, device=device), (a.astype(np.float64) / b).astype(np.float32))


def test_bfloat16_arithmetic(device, check):
    a = np.array([1.5, -2.0, 0.25, 100.0], np.float32)
    b = np.array([0.5, 3.0, -0.125, 0.5], np.float32)
    x, y = Tensor(a, device=device, dtype="bfloat16"), Tensor(b, device=device, dtype=dtypes.bfloat16)
    check(x + y, a + b, dtype=dtypes.bfloat16, exact=True)
    check(x * y, a * b, dtype=dtypes.bfloat16, exact=True)
    check(x.maximum(y), np.maximum(a, b), dtype=dtypes.bfloat16, exact=True)
    check(x < y, a < b)
    check(x.cast(dtypes.float32) + 1.0, a + 1, exact=True)
    # the sum (103.625) is rounded to bfloat16's 8 significant bits
    check((x + y).sum(), np.array(103.5, np.float32), dtype=dtypes.bfloat16, rtol=2 ** -8)


# --------------------------------------------------------------------------------------------
# promotion against torch (no kernels run: dtypes are known before realizing)
# --------------------------------------------------------------------------------------------

def torch_dtype(dt: DType):
    torch = pytest.importorskip("torch")
    return getattr(torch, dtype_name(dt))


@pytest.mark.parametrize("dt1", ALL_DTYPES, ids=dtype_name)
def test_tensor_tensor_promotion_matches_torch(device, dt1):
    torch = pytest.importorskip("torch")
    mismatches = []
    for dt2 in ALL_DTYPES:
        try:
            want = torch.promote_types(torch_dtype(dt1), torch_dtype(dt2))
        except RuntimeError:
            continue  # torch leaves e.g. uint16 with int8 undefined
        x, y = Tensor.zeros(2, dtype=dt1, device=device), Tensor.zeros(2, dtype=dt2, device=device)
        got = {"add": (x + y).dtype, "maximum": x.maximum(y).dtype, "where": (x < y).where(x, y).dtype}
        mismatches += [f"{op}({dtype_name(dt1)}, {dtype_name(dt2)}) = {dtype_name(d)}, torch: {want}"
                       for op, d in got.items() if torch_dtype(d) != want]
        assert (x < y).dtype == dtypes.bool
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("scalar", [3, 2.5, True], ids=["int", "float", "bool"])
def test_tensor_scalar_promotion_matches_torch(device, dt, scalar):
    torch = pytest.importorskip("torch")
    want = torch.result_type(torch.zeros(2, dtype=torch_dtype(dt)), scalar)
    if dt == dtypes.bool and isinstance(scalar, int) and not isinstance(scalar, bool):
        want = torch.int32  # bool tensor + Python int: the default int, int32 as in tinygrad (torch: int64)
    x = Tensor.zeros(2, dtype=dt, device=device)
    assert torch_dtype((x + scalar).dtype) == want
    assert torch_dtype((scalar * x).dtype) == want


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_name)
def test_true_division_dtype_matches_torch(device, dt):
    torch = pytest.importorskip("torch")
    tt = torch.ones(2, dtype=torch_dtype(dt))
    x = Tensor.ones(2, dtype=dt, device=device)
    assert torch_dtype((x / x).dtype) == (tt / tt).dtype
    assert torch_dtype((x / 2).dtype) == (tt / 2).dtype
