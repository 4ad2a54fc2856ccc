"""Float ``%`` and ``//`` match torch bit for bit at any quotient, and integer -> float casts give +0.0.

ember's float remainder builds on the device's exact ``fmod`` (the primitive ``MOD`` on floats): the
former ``a - floor(a / b) * b`` lost every digit once ``a / b`` passed 2**24 (``70000. % 0.001`` gave 0).
"""
from __future__ import annotations

import operator

import numpy as np
import pytest

from ember import Tensor, dtypes

torch = pytest.importorskip("torch")

_SPECIAL = [-4.0, 4.0, -0.0, 0.0, 5.0, -5.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 3.0, 2.5, 7e4, 1e6, 1e10, -7.3, 1e-30]
_DIVISORS = [2.0, -2.0, np.inf, -np.inf, 0.0, -0.0, 0.1, 0.001, 3.3, -3.3, 1e-20, 7.0]


def _grid() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a = np.array(_SPECIAL + list(rng.standard_normal(30) * 10.0 ** rng.integers(-3, 8, 30)), dtype=np.float32)
    b = np.array(_DIVISORS + list(rng.standard_normal(8) * 10.0 ** rng.integers(-3, 3, 8)), dtype=np.float32)
    return np.repeat(a, len(b)), np.tile(b, len(a))


def _assert_same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal values, nan where torch has nan, and the sign of every zero."""
    both_nan = np.isnan(ours) & np.isnan(theirs)
    same = (ours == theirs) & (np.signbit(ours) == np.signbit(theirs))
    bad = np.flatnonzero(~(same | both_nan))
    assert bad.size == 0, f"{bad.size} mismatches, first: {[(ours[i], theirs[i]) for i in bad[:5]]}"


@pytest.mark.parametrize("op", ["%", "//"])
def test_float_divmod_matches_torch(device: str, op: str):
    a, b = _grid()
    ours = eval(f"Tensor(a, device=device) {op} Tensor(b, device=device)").numpy()  # noqa: S307
    theirs = eval(f"torch.tensor(a) {op} torch.tensor(b)").numpy()  # noqa: S307
    _assert_same_bits(ours, theirs)


@pytest.mark.parametrize("expr, want", [("Tensor([70000.], device=d) % 0.001", 6.751786e-4),
                                        ("Tensor([1e6], device=d) % 3.3", 1.0144496),
                                        ("Tensor([2.5], device=d) // 0.1", 24.0),
                                        ("Tensor([-2.5], device=d) // 0.1", -25.0)])
def test_large_quotient_repros(device: str, expr: str, want: float):
    got = eval(expr, {"Tensor": Tensor, "d": device}).numpy()  # noqa: S307
    theirs = eval(expr.replace(", device=d", "").replace("Tensor", "torch.tensor"), {"torch": torch}).numpy()  # noqa: S307
    _assert_same_bits(got, theirs)
    np.testing.assert_allclose(got, [want], rtol=1e-6)


def test_remainder_gradient_matches_torch(device: str):
    a, b = np.array([7.5, -7.5, 70000.0], np.float32), np.array([2.0, 2.0, 0.001], np.float32)
    x, y = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    (x % y).sum().backward()
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    (tx % ty).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_array_equal(y.grad.numpy(), ty.grad.numpy())


def test_float16_remainder_matches_torch(device: str):
    a, b = _grid()
    keep = (np.abs(a) < 6e4) & (np.abs(b) < 6e4) & (np.abs(b) > 1e-3)
    a16, b16 = a[keep].astype(np.float16), b[keep].astype(np.float16)
    ours = (Tensor(a16, device=device) % Tensor(b16, device=device)).numpy()
    _assert_same_bits(ours, (torch.tensor(a16) % torch.tensor(b16)).numpy())


def test_int_to_float_cast_of_negative_fraction_is_positive_zero(device: str):
    """(float)(int)-0.5 is +0.0 (gcc folds the pair into truncf under -fno-trapping-math, giving -0.0)."""
    x = Tensor([-0.5, -0.0, 2.7, -3.2], device=device)
    for it, ft in (("int32", "float32"), ("int64", "float64")):
        got = (1 / x.cast(getattr(dtypes, it)).cast(getattr(dtypes, ft))).numpy()
        want = 1 / torch.tensor([-0.5, -0.0, 2.7, -3.2]).to(getattr(torch, it)).to(getattr(torch, ft))
        np.testing.assert_array_equal(got, want.numpy())
        assert np.isposinf(got[0]) and got.dtype == np.dtype(ft)


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_int_to_float_cast_keeps_zero_positive_with_each_c_compiler(cc: str, tmp_path):
    """The CPU device built by gcc and by clang (whichever CI picks by default) gives +0.0 for (float)(int)-0.5."""
    import os
    import shutil
    import subprocess
    import sys

    from ember import Device
    if shutil.which(cc) is None or "CPU" not in Device.available():
        pytest.skip(f"needs {cc} and the CPU device")
    code = ("from ember import Tensor, dtypes\n"
            "x = Tensor([-0.5, -0.25, 0.75])\n"
            "print((1 / x.cast(dtypes.int32).cast(dtypes.float32)).tolist())\n")
    env = {**os.environ, "CC": cc, "DEV": "CPU", "EMBER_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[inf, inf, inf]"


@pytest.mark.parametrize("k", [1, 1.0, 2, 0.5, -1])
def test_float_divmod_by_small_constants(device: str, k: float):
    """``x // k`` and ``x % k`` of floats by constants: ``// 1`` is floor, ``% 1`` the fraction (once folded as
    if the floats were integers: ``[6.75, -2.25] // 1`` gave ``[7, -2]`` and ``% 1`` gave 0)."""
    a = np.array([6.75, -2.25, 0.5, -0.5, -0.0, 3.0, np.inf, -np.inf, np.nan, 1e10 + 0.5], np.float32)
    for op in (operator.mod, operator.floordiv):
        _assert_same_bits(op(Tensor(a, device=device), k).numpy(), op(torch.tensor(a), k).numpy())
