"""Conformance checks every ember device must pass (see the package docstring)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ember import Device, GlobalCounters, Tensor, dtypes
from ember.dtype import DType, to_np_dtype
from ember.testing.checks import Tol, name, same_as_reference_many

REFERENCE = "PYTHON"
RNG = np.random.default_rng(1234)


def _supported(device: str, dt: DType) -> bool:
    return dt in Device[device].renderer.supported_dtypes


def _sample(dt: DType, shape: tuple[int, ...]) -> np.ndarray:
    if dt.kind == "b":
        return RNG.random(shape) > 0.5
    if dt.kind in "iu":
        lo, hi = (0, 100) if dt.kind == "u" else (-50, 50)
        return RNG.integers(lo, hi, shape).astype(to_np_dtype(dt))
    return RNG.standard_normal(shape).astype(np.float32)


def _same(device: str, fn, *arrays: np.ndarray, dtype: DType | None = None, rtol: float = 1e-5,
          atol: float = 1e-6) -> None:
    """``fn`` on ``device`` equals ``fn`` on the PYTHON reference (and both have equal shape/dtype)."""
    ours = fn(*[Tensor(a, device=device, dtype=dtype) for a in arrays])
    ref = fn(*[Tensor(a, device=REFERENCE, dtype=dtype) for a in arrays])
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    got, want = ours.numpy(), ref.numpy()
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


BINARY: dict[str, Callable[..., Tensor]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "max": lambda a, b: a.maximum(b), "lt": lambda a, b: a < b, "eq": lambda a, b: a == b}
UNARY: dict[str, Callable[..., Tensor]] = {
    "exp": Tensor.exp, "log": lambda x: x.abs().add(1).log(), "sqrt": lambda x: x.abs().sqrt(),
    "sin": Tensor.sin, "neg": Tensor.neg, "relu": Tensor.relu, "recip": lambda x: (x.abs() + 1).reciprocal()}
NUMERIC = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.float16,
           dtypes.bfloat16, dtypes.float32, dtypes.float64)


@pytest.mark.parametrize("dt", NUMERIC, ids=name)
def test_binary_ops(device: str, dt: DType) -> None:
    """Each binary op with broadcasting, per dtype (all ops of a dtype compiled as one batch)."""
    if not _supported(device, dt):
        pytest.skip(f"{device} does not support {name(dt)}")
    tol: Tol = {"rtol": 1e-2, "atol": 1e-2} if dt in (dtypes.float16, dtypes.bfloat16) else {}
    same_as_reference_many(device, BINARY, _sample(dt, (3, 5)), _sample(dt, (1, 5)), dtypes_=(dt, dt), **tol)


def test_unary_float_ops(device: str) -> None:
    same_as_reference_many(device, UNARY, _sample(dtypes.float32, (4, 7)), rtol=2e-6)


def test_reductions(device: str) -> None:
    x = _sample(dtypes.float32, (6, 5, 4))
    for fn in (lambda t: t.sum(), lambda t: t.sum(1), lambda t: t.max(2, keepdim=True), lambda t: t.min(0),
               lambda t: t.mean((0, 2))):
        _same(device, fn, x, rtol=1e-5)


def test_movement_and_views(device: str) -> None:
    x = _sample(dtypes.float32, (4, 6))
    for fn in (lambda t: t.permute(1, 0) * 2, lambda t: t.flip(0) + 1, lambda t: t.pad(((1, 2), (0, 1))) - 1,
               lambda t: t.shrink(((1, 3), (2, 5))) * 3, lambda t: t.reshape(2, 12).expand(3, 2, 12) + 0,
               lambda t: t[::-1, 1::2] + 0):
        _same(device, fn, x)


def test_matmul(device: str) -> None:
    _same(device, lambda a, b: a @ b, _sample(dtypes.float32, (17, 24)), _sample(dtypes.float32, (24, 9)), rtol=1e-5,
          atol=1e-5)


def test_zero_d_and_size_zero(device: str) -> None:
    _same(device, lambda t: t * 2 + 1, np.array(3.5, np.float32))
    _same(device, lambda t: (t * 2).sum(0), np.zeros((0, 3), np.float32))
    assert Tensor.zeros(0, 4, device=device).numpy().shape == (0, 4)


def test_copies_between_devices(device: str) -> None:
    x = _sample(dtypes.float32, (5, 3))
    t = Tensor(x, device=device)
    for other in ("PYTHON", device):
        back = (t.to(other) * 2).to(device) + 1
        np.testing.assert_allclose(back.numpy(), x * 2 + 1, rtol=1e-6)


def test_autograd_matches_reference(device: str) -> None:
    x, w = _sample(dtypes.float32, (4, 6)), _sample(dtypes.float32, (6, 3))

    def grads(dev: str) -> list[np.ndarray]:
        tx, tw = Tensor(x, device=dev, requires_grad=True), Tensor(w, device=dev, requires_grad=True)
        ((tx @ tw).relu().exp() * 0.1).sum().backward()
        assert tx.grad is not None and tw.grad is not None, "backward() left a gradient unset"
        return [tx.grad.numpy(), tw.grad.numpy()]

    for got, want in zip(grads(device), grads(REFERENCE)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fusion_is_one_kernel(device: str) -> None:
    a = Tensor(_sample(dtypes.float32, (64,)), device=device).realize()
    GlobalCounters.reset()
    ((a * 2 + 1).relu().exp() - a).realize()
    assert GlobalCounters.kernel_count == 1
