"""Shared fixtures for the core test suite.

- every test session gets its own empty ``EMBER_CACHE_DIR``, so results never depend on ``~/.cache``;
- ``device`` runs a test once per device among CPU and PYTHON, skipping (with the reason) a device
  that is not usable here;
- a test that takes a ``view`` argument runs once per kind of input layout (contiguous, permuted,
  flipped, shrunk, padded, expanded; ``@pytest.mark.views("contiguous", "permuted")`` picks a subset),
  and the ``make`` fixture builds a tensor of that layout from a numpy array together with the numpy
  array it must equal;
- ``check`` compares a tensor with its numpy oracle: shape, dtype and values.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from ember import Device, Tensor, dtypes
from ember.dtype import DType, from_np_dtype, to_np_dtype

#: the devices the backend suite runs on: CPU and PYTHON, or exactly DEV when it is set (``DEV=CL pytest tests``)
BACKEND_DEVICES = (os.environ["DEV"].upper(),) if os.environ.get("DEV") else ("CPU", "PYTHON")

#: Layouts a tensor given to an op may have. Every one but "contiguous" is a non-contiguous view.
VIEW_KINDS = ("contiguous", "permuted", "flipped", "shrunk", "padded", "expanded")


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Point the kernel cache at a fresh folder for this session (each xdist worker has its own)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("ember-cache")))
        yield


@pytest.fixture(params=BACKEND_DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """The name of a usable device; the test is skipped with the reason on a device that is not usable
    (unless the device was asked for with ``DEV``: then the run stops, see :func:`pytest_sessionstart`)."""
    name = request.param
    if name not in Device.available():
        pytest.skip(f"device {name} is not usable here: {Device.probe(name)}")
    return name


def pytest_sessionstart(session: pytest.Session) -> None:
    """``DEV=X`` asks for the suite on X: an unusable X is an error, not a run of skipped tests."""
    if os.environ.get("DEV") and BACKEND_DEVICES[0] not in Device.available():
        raise pytest.UsageError(f"DEV={os.environ['DEV']}: device {BACKEND_DEVICES[0]} is not usable here: "
                                f"{Device.probe(BACKEND_DEVICES[0])}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "views(*kinds): run a test that takes `view` only for these layout kinds")


def _argnames(names: str | Sequence[str]) -> list[str]:
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    explicit = any("view" in _argnames(m.args[0]) for m in metafunc.definition.iter_markers("parametrize"))
    if "view" in metafunc.fixturenames and not explicit:
        marker = metafunc.definition.get_closest_marker("views")
        kinds = marker.args if marker is not None else VIEW_KINDS
        unknown = set(kinds) - set(VIEW_KINDS)
        if unknown:
            raise ValueError(f"unknown view kinds {sorted(unknown)}; known: {VIEW_KINDS}")
        metafunc.parametrize("view", kinds)


def _c_order(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy that stays 0-d for 0-d input (np.ascontiguousarray would make it 1-d)."""
    return np.array(a, order="C")


def build_view(a: np.ndarray, view: str, device: str, dtype: DType | str | None = None,
               pad_value: float = 0.0) -> tuple[Tensor, np.ndarray]:
    """A tensor laid out as ``view`` and the numpy array with the values it holds (same shape as ``a``).

    The "padded" kind fills its border with ``pad_value``.

    A 0-d or size-0 array gets the same movement ops where they apply, so every kind is valid for any input.
    """
    nd = a.ndim
    if view == "contiguous":
        return Tensor(a, device=device, dtype=dtype), a
    if view == "permuted":
        order = tuple(reversed(range(nd)))
        return Tensor(_c_order(a.transpose(order)), device=device, dtype=dtype).permute(order), a
    if view == "flipped":
        axes = tuple(range(nd))
        return Tensor(_c_order(np.flip(a, axes)), device=device, dtype=dtype).flip(axes), a
    if view == "shrunk":
        # ``a`` sits inside a bigger array whose border holds other values
        if nd == 0:
            return Tensor(a, device=device, dtype=dtype).shrink(()), a
        big = np.pad(a, [(1, 2)] * nd, mode="wrap") if a.size else np.pad(a, [(1, 2)] * nd)
        return Tensor(big, device=device, dtype=dtype).shrink(tuple((1, 1 + s) for s in a.shape)), a
    if view == "padded":
        # the inside of ``a`` padded back to full size with ``pad_value``
        if nd == 0:
            return Tensor(a, device=device, dtype=dtype).pad((), value=pad_value), a
        pads = [(1, 1) if s >= 2 else (0, 0) for s in a.shape]
        inner = a[tuple(slice(lo, s - hi) for (lo, hi), s in zip(pads, a.shape))]
        t = Tensor(_c_order(inner), device=device, dtype=dtype).pad(tuple(pads), value=pad_value)
        return t, np.pad(inner, pads, constant_values=np.asarray(pad_value).astype(a.dtype))
    if view == "expanded":
        # the first entry of every axis broadcast over that axis
        first = a[tuple(slice(0, min(1, s)) for s in a.shape)]
        t = Tensor(_c_order(first), device=device, dtype=dtype).expand(a.shape)
        return t, np.broadcast_to(first, a.shape).copy()
    raise ValueError(f"unknown view kind {view!r}")


@pytest.fixture
def make(device: str, view: str) -> Callable[..., tuple[Tensor, np.ndarray]]:
    """``make(a, dtype=None, pad_value=0.0) -> (tensor, expected)`` for this test's device and view kind."""
    return lambda a, dtype=None, pad_value=0.0: build_view(np.asarray(a), view, device, dtype, pad_value)


def assert_tensor(t: Tensor, expected: Any, dtype: DType | None = None, rtol: float = 1e-5, atol: float = 1e-6,
                  exact: bool = False) -> None:
    """``t`` has the shape of ``expected``, the dtype ``dtype`` (default: that of ``expected``), and its values."""
    exp = np.asarray(expected)
    want = dtype if dtype is not None else from_np_dtype(exp.dtype)
    assert t.shape == exp.shape, f"shape {t.shape} != expected {exp.shape}"
    assert t.dtype == want, f"dtype {t.dtype} != expected {want}"
    got = t.numpy()
    assert got.shape == exp.shape
    if want != dtypes.bfloat16:
        assert got.dtype == np.dtype(to_np_dtype(want)), f"numpy dtype {got.dtype} for a {want} tensor"
    if exact or want.kind in "biu":
        np.testing.assert_array_equal(got, exp)
    else:
        np.testing.assert_allclose(got, exp.astype(got.dtype) if exp.dtype.kind in "biuf" else exp, rtol=rtol,
                                   atol=atol, equal_nan=True)


@pytest.fixture
def check() -> Callable[..., None]:
    """The :func:`assert_tensor` comparison: ``check(tensor, expected, dtype=None, rtol=..., atol=..., exact=...)``."""
    return assert_tensor
