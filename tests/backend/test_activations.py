"""Activation functions against torch: values, gradients (kinks included), dtypes, layouts, errors.

The inputs put a point exactly on every kink (0, +-1, +-3, 6, softplus' threshold ...) where
torch defines a one-sided derivative, so ``relu'(0) = 0``, hardtanh's gradient vanishes on the
boundary, and so on. Many results are checked with one kernel: each result gets its own row of a
uint64 tensor (bitcast, widened), so one compile covers every activation.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import packed_numpy

from ember import Tensor, dtypes
from ember.dtype import to_np_dtype

torch = pytest.importorskip("torch")
F = torch.nn.functional

ACTS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Any], Any]]] = {
    "relu": (lambda x: x.relu(), F.relu),
    "relu6": (lambda x: x.relu6(), F.relu6),
    "leaky_relu": (lambda x: x.leaky_relu(), F.leaky_relu),
    "leaky_relu_0.2": (lambda x: x.leaky_relu(0.2), lambda x: F.leaky_relu(x, 0.2)),
    "elu": (lambda x: x.elu(), F.elu),
    "elu_0.5": (lambda x: x.elu(0.5), lambda x: F.elu(x, 0.5)),
    "celu": (lambda x: x.celu(), F.celu),
    "celu_2": (lambda x: x.celu(2.0), lambda x: F.celu(x, 2.0)),
    "selu": (lambda x: x.selu(), F.selu),
    "gelu": (lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh")),
    "gelu_exact": (lambda x: x.gelu(approximate="none"), F.gelu),
    "quick_gelu": (lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x)),
    "silu": (lambda x: x.silu(), F.silu),
    "swish": (lambda x: x.swish(), F.silu),
    "mish": (lambda x: x.mish(), F.mish),
    "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid),
    "hardsigmoid": (lambda x: x.hardsigmoid(), F.hardsigmoid),
    "hardsigmoid_args": (lambda x: x.hardsigmoid(0.25, 0.4),
                         lambda x: torch.clamp(0.25 * x + 0.4, 0, 1) if x.is_floating_point() else F.hardsigmoid(x)),
    "hardswish": (lambda x: x.hardswish(), F.hardswish),
    "hardtanh": (lambda x: x.hardtanh(), F.hardtanh),
    "hardtanh_-2_3": (lambda x: x.hardtanh(-2, 3), lambda x: F.hardtanh(x, -2, 3)),
    "softplus": (lambda x: x.softplus(), F.softplus),
    "softplus_2_5": (lambda x: x.softplus(2.0, 5.0), lambda x: F.softplus(x, 2.0, 5.0)),
    "softsign": (lambda x: x.softsign(), F.softsign),
    "logsigmoid": (lambda x: x.logsigmoid(), F.logsigmoid),
    "tanh": (lambda x: x.tanh(), torch.tanh),
}
KINKS = np.array([-25.0, -20.5, -6.0, -3.5, -3.0, -2.9, -2.0, -1.0, -0.5, -1e-3, -0.0, 0.0, 1e-3, 0.5, 1.0, 2.0,
                  2.5, 2.9, 3.0, 3.5, 5.9, 6.0, 6.5, 10.0, 20.0, 20.5, 25.0])


def grid() -> np.ndarray:
    rng = np.random.default_rng(11)
    return np.concatenate([KINKS, rng.normal(0, 4, 40)]).astype(np.float32)


def torch_ref(name: str, x: np.ndarray, dtype: Any = torch.float32) -> np.ndarray:
    out = ACTS[name][1](torch.from_numpy(x).to(dtype))
    return out.float().numpy() if out.dtype == torch.bfloat16 else out.numpy()


def test_forward_float32(device):
    x = grid()
    t = Tensor(x, device=device)
    outs = {name: fn(t) for name, (fn, _) in ACTS.items()}
    problems = []
    for (name, out), got in zip(outs.items(), packed_numpy(list(outs.values()))):
        assert out.dtype == dtypes.float32 and out.shape == x.shape, name
        want = torch_ref(name, x)
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True):
            i = int(np.argmax(np.abs(got - want)))
            problems.append(f"{name}: x={x[i]!r} got {got[i]!r} want {want[i]!r}")
    assert not problems, "\n".join(problems)


def test_backward_float32(device):
    """Gradients against torch's, at the kinks too (relu'(0) = 0, hardtanh' = 0 on its boundary ...)."""
    x = grid()
    w = np.random.default_rng(3).normal(size=x.shape).astype(np.float32)
    grads = {}
    for name, (fn, _) in ACTS.items():
        t = Tensor(x, device=device, requires_grad=True)
        (fn(t) * Tensor(w, device=device)).sum().backward()
        assert t.grad is not None and t.grad.shape == x.shape and t.grad.dtype == dtypes.float32, name
        grads[name] = t.grad
    problems = []
    for (name, _), got in zip(grads.items(), packed_numpy(list(grads.values()))):
        tx = torch.from_numpy(x).requires_grad_(True)
        (ACTS[name][1](tx) * torch.from_numpy(w)).sum().backward()
        want = tx.grad.numpy()
        if not np.allclose(got, want, rtol=1e-3, atol=1e-4, equal_nan=True):
            i = int(np.argmax(np.abs(got - want)))
            problems.append(f"{name}: x={x[i]!r} grad {got[i]!r}, torch {want[i]!r}")
    assert not problems, "\n".join(problems)


def test_gradient_at_kinks(device):
    """The one-sided derivatives torch picks, spelled out."""
    x = Tensor([0.0, 6.0, -1.0, 1.0, -3.0, 3.0], device=device, requires_grad=True)
    outs = [x.relu(), x.relu6(), x.hardtanh(), x.hardsigmoid(), x.leaky_relu(0.1), x.elu(0.7)]
    grads = [o.sum().gradient(x)[0] for o in outs]
    relu, relu6, hardtanh, hardsig, leaky, elu = packed_numpy(grads)
    np.testing.assert_array_equal(relu, [0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(relu6, [0, 0, 0, 1, 0, 1])
    np.testing.assert_array_equal(hardtanh, [1, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(hardsig, [1 / 6, 0, 1 / 6, 1 / 6, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(leaky, [0.1, 1, 0.1, 1, 0.1, 1], rtol=1e-6)
    np.testing.assert_allclose(elu[:1], [0.7], rtol=1e-6)


def test_special_values(device):
    x = np.array([-math.inf, math.inf, math.nan, -100.0, 100.0, -0.0], np.float32)
    t = Tensor(x, device=device)
    outs = {name: fn(t) for name, (fn, _) in ACTS.items()}
    problems = []
    for (name, _), got in zip(outs.items(), packed_numpy(list(outs.values()))):
        want = torch_ref(name, x)
        if name == "gelu_exact":
            want[1] = math.inf  # torch gives nan for gelu(+inf); the limit is +inf
        if not np.allclose(got, want, rtol=1e-5, atol=1e-30, equal_nan=True):
            problems.append(f"{name}: got {got.tolist()} want {want.tolist()}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=["float16", "bfloat16",
                                                                                        "float64"])
def test_other_float_dtypes(device, dt):
    tdt = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16, dtypes.float64: torch.float64}[dt]
    x32 = torch.from_numpy(grid()).to(tdt).float().numpy()  # values representable in dt
    t = Tensor(x32, device=device, dtype=dt)
    outs = {name: fn(t) for name, (fn, _) in ACTS.items()}
    tol = {dtypes.float16: (2e-3, 1e-3), dtypes.bfloat16: (1.6e-2, 1e-2), dtypes.float64: (1e-12, 1e-14)}[dt]
    problems = []
    for (name, out), got in zip(outs.items(), packed_numpy(list(outs.values()))):
        assert out.dtype == dt, f"{name}: {out.dtype}"
        want = torch_ref(name, x32 if dt != dtypes.float64 else x32.astype(np.float64), tdt)
        if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol[0], atol=tol[1], equal_nan=True):
            i = int(np.argmax(np.abs(got.astype(np.float64) - want)))
            problems.append(f"{name}: x={x32[i]!r} got {got[i]!r} want {want[i]!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.views("permuted", "flipped", "shrunk", "expanded")
def test_views(make):
    rng = np.random.default_rng(5)
    t, expected = make(rng.normal(0, 3, (3, 4)).astype(np.float32))
    names = ["relu", "gelu", "gelu_exact", "silu", "softplus", "hardswish", "mish", "logsigmoid"]
    outs = [ACTS[n][0](t) for n in names]
    for name, got in zip(names, packed_numpy(outs)):
        np.testing.assert_allclose(got, torch_ref(name, expected), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (2, 1, 3)], ids=str)
def test_shapes(device, shape):
    x = np.random.default_rng(9).normal(0, 3, shape).astype(np.float32)
    t = Tensor(x, device=device)
    names = ["relu", "gelu", "sigmoid", "softplus", "tanh", "leaky_relu"]
    outs = [ACTS[n][0](t) for n in names]
    for name, out, got in zip(names, outs, packed_numpy(outs)):
        assert out.shape == shape and out.dtype == dtypes.float32
        np.testing.assert_allclose(got, torch_ref(name, x), rtol=1e-5, atol=1e-6, err_msg=name)


def test_gelu_defaults_and_modes(device):
    x = np.array([-2.0, -0.5, 0.0, 0.7, 3.0], np.float32)
    t = Tensor(x, device=device)
    a, b = packed_numpy([t.gelu(), t.gelu(approximate="none")])
    np.testing.assert_allclose(a, F.gelu(torch.from_numpy(x), approximate="tanh").numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b, F.gelu(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(RuntimeError):
        F.gelu(torch.from_numpy(x), approximate="erf")
    with pytest.raises(RuntimeError):
        t.gelu(approximate="erf")


# (ember call, torch call) on integer / bool inputs: the same exception type, or the same dtype
INT_CALLS = [(n, fn, ref) for n, (fn, ref) in ACTS.items()]


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.uint8, dtypes.bool], ids=["int32", "uint8", "bool"])
def test_integer_and_bool_inputs(device, dt):
    a = np.array([-2, 0, 3, 7]) if dt != dtypes.bool else np.array([True, False, True, True])
    if dt == dtypes.uint8:
        a = np.abs(a)
    a = a.astype(to_np_dtype(dt))
    t, tt = Tensor(a, device=device), torch.from_numpy(a)
    pending = []
    for name, fn, ref in INT_CALLS:
        try:
            want = ref(tt)
        except Exception as e:
            with pytest.raises(type(e)):
                fn(t)
            continue
        out = fn(t)
        assert out.dtype.name == {torch.float32: "float", torch.int32: "int", torch.uint8: "uchar",
                                  torch.bool: "bool", torch.int64: "long"}[want.dtype], name
        pending.append((name, out, want))
    for (name, _, want), got in zip(pending, packed_numpy([p[1] for p in pending])):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, err_msg=name)


def test_second_derivatives(device):
    """The gradient rules are differentiable themselves: d2/dx2 against torch."""
    x = np.array([-2.5, -0.7, -0.05, 0.3, 1.9], np.float32)  # away from kinks
    names = ["tanh", "sigmoid", "softplus", "gelu", "gelu_exact", "silu", "mish", "elu", "selu", "logsigmoid"]
    outs = []
    for name in names:
        t = Tensor(x, device=device, requires_grad=True)
        g, = ACTS[name][0](t).sum().gradient(t)
        outs.append(g.sum().gradient(t)[0])
    for name, got in zip(names, packed_numpy(outs)):
        tx = torch.from_numpy(x).requires_grad_(True)
        g, = torch.autograd.grad(ACTS[name][1](tx).sum(), tx, create_graph=True)
        want, = torch.autograd.grad(g.sum(), tx)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-3, atol=1e-4, err_msg=name)
