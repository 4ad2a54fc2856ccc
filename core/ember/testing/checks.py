"""Helpers the conformance tests share: which dtypes a device runs, sample data, and the comparison
of a device's result with the PYTHON reference device and with numpy."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import pytest

from ember import Device, Tensor, dtypes
from ember.dtype import DType, to_np_dtype

if TYPE_CHECKING:
    from typing import Unpack

REFERENCE = "PYTHON"

#: every dtype, in promotion order
ALL_DTYPES: tuple[DType, ...] = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
                                 dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16,
                                 dtypes.float32, dtypes.float64)


NAMES: dict[DType, str] = {dt: name for name, dt in dtypes.fields().items()}


def name(dt: DType) -> str:
    """The torch-style name of ``dt`` (``float64``, not C's ``double``), for test ids and messages."""
    return NAMES[dt]


def supported(device: str, dt: DType) -> bool:
    """True when ``device`` (and the reference) can run ``dt``."""
    return dt in Device[device].renderer.supported_dtypes and dt in Device[REFERENCE].renderer.supported_dtypes


def need(device: str, *dts: DType) -> None:
    """Skip the calling test, naming the dtype, when ``device`` cannot run one of ``dts``."""
    for dt in dts:
        if not supported(device, dt):
            pytest.skip(f"{device} does not support {name(dt)}")


def sample(rng: np.random.Generator, dt: DType, shape: tuple[int, ...], wide: bool = False) -> np.ndarray:
    """Random values for ``dt`` (float16/bfloat16 as float64, for the tensor to round); ``wide`` spans the range."""
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        lo, hi = (dtypes.min(dt), dtypes.max(dt)) if wide else (0 if dt.kind == "u" else -50, 50)
        return rng.integers(lo, hi, shape, endpoint=True, dtype=np.uint64 if dt == dtypes.uint64 else np.int64)
    out = rng.standard_normal(shape) * (100.0 if wide else 1.0)
    return out.astype(np.float32) if dt == dtypes.float32 else out


class Tol(TypedDict, total=False):
    """``assert_allclose`` tolerances, passed on as keyword arguments."""
    rtol: float
    atol: float


def tolerance(dt: DType) -> Tol:
    """``assert_allclose`` tolerances for results of dtype ``dt`` computed in a different order or library."""
    tols: dict[DType, Tol] = {dtypes.float16: {"rtol": 2e-3, "atol": 2e-3},
                              dtypes.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
                              dtypes.float64: {"rtol": 1e-12, "atol": 1e-12}}
    return tols.get(dt, {"rtol": 2e-5, "atol": 2e-6})


def assert_same(got: np.ndarray, want: np.ndarray, exact: bool = False, what: str = "",
                inputs: np.ndarray | None = None, **tol: Unpack[Tol]) -> None:
    """Equal shape, and equal values: bit-for-bit for integers or with ``exact``, else within ``tol``.

    NaN equals NaN; for exact float comparison the sign of zero counts too. ``inputs`` (same shape)
    are shown next to the values that differ.
    """
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if exact or not np.issubdtype(want.dtype, np.floating):
        if np.issubdtype(want.dtype, np.floating):
            g, w = got.astype(np.float64), want.astype(np.float64)
            same = (g == w) & (np.signbit(g) == np.signbit(w)) | (np.isnan(g) & np.isnan(w))
        else:
            same = got == want
        if not same.all():
            rows = [tuple(i) for i in np.argwhere(~same)[:8].tolist()]
            shown = "\n".join(f"  at {i}: " + (f"{inputs[i]!r} -> " if inputs is not None else "")
                              + f"got {got[i]!r}, want {want[i]!r}" for i in rows)
            raise AssertionError(f"{what}: {int((~same).sum())} of {same.size} values differ\n{shown}")
        return
    np.testing.assert_allclose(got, want, equal_nan=True, err_msg=what, **tol)


def same_as_reference(device: str, fn: Callable[..., Tensor], *arrays: Any, dtypes_: Sequence[DType | None] = (),
                      exact: bool = False, **tol: Unpack[Tol]) -> np.ndarray:
    """``fn`` on ``device`` equals ``fn`` on the PYTHON device (same shape, dtype and values); returns the values."""
    dts = list(dtypes_) + [None] * (len(arrays) - len(dtypes_))
    ours = fn(*[Tensor(a, device=device, dtype=d) for a, d in zip(arrays, dts)])
    ref = fn(*[Tensor(a, device=REFERENCE, dtype=d) for a, d in zip(arrays, dts)])
    assert ours.shape == ref.shape, f"shape {ours.shape} != reference {ref.shape}"
    assert ours.dtype == ref.dtype, f"dtype {ours.dtype} != reference {ref.dtype}"
    got = ours.numpy()
    assert_same(got, ref.numpy(), exact=exact, what=f"{device} vs {REFERENCE}", **tol)
    return got


def np_dtype(dt: DType) -> type:
    """The numpy dtype values of ``dt`` come back in from ``Tensor.numpy()`` (float32 for bfloat16)."""
    return np.float32 if dt == dtypes.bfloat16 else to_np_dtype(dt)


def realize_many(device: str, fns: dict[str, Callable[..., Tensor]], *arrays: Any,
                 dtypes_: Sequence[DType | None] = ()) -> dict[str, Tensor]:
    """Every ``fn`` applied to ``arrays`` on ``device``, realized together (one schedule, one batched compile)."""
    dts = list(dtypes_) + [None] * (len(arrays) - len(dtypes_))
    inputs = [Tensor(a, device=device, dtype=d) for a, d in zip(arrays, dts)]
    outs = {label: fn(*inputs) for label, fn in fns.items()}
    Tensor.realize_all(*outs.values())
    return outs


def same_as_reference_many(device: str, fns: dict[str, Callable[..., Tensor]], *arrays: Any,
                           dtypes_: Sequence[DType | None] = (), exact: bool = False,
                           **tol: Unpack[Tol]) -> dict[str, np.ndarray]:
    """:func:`same_as_reference` for many functions of the same inputs, compiled and run as one batch per
    device; a failure names every function that differs."""
    ours = realize_many(device, fns, *arrays, dtypes_=dtypes_)
    ref = realize_many(REFERENCE, fns, *arrays, dtypes_=dtypes_)
    errors, values = [], {}
    for label in fns:
        try:
            assert ours[label].shape == ref[label].shape, f"shape {ours[label].shape} != reference {ref[label].shape}"
            assert ours[label].dtype == ref[label].dtype, f"dtype {ours[label].dtype} != reference {ref[label].dtype}"
            values[label] = ours[label].numpy()
            assert_same(values[label], ref[label].numpy(), exact=exact, what=f"{device} vs {REFERENCE}", **tol)
        except AssertionError as e:
            errors.append(f"[{label}] {e}")
    if errors:
        raise AssertionError(f"{len(errors)} of {len(fns)} differ:\n" + "\n".join(errors))
    return values
