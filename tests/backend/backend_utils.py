"""What the backend test modules share: reading many results through one kernel, and comparing ember with torch.

The test modules import it as ``backend_utils``: pytest (in its default "prepend" import mode) puts this folder,
which has no ``__init__.py``, on ``sys.path`` before it imports a test module from it.

torch is optional here: a module that compares with torch skips itself (``pytest.importorskip``) before it calls
anything that needs torch, and the other modules still import the torch-free parts.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pytest

from ember import Device, Tensor, dtypes
from ember.dtype import DType, from_np_dtype, to_np_dtype

try:
    import torch
except ImportError:
    torch = None

#: default tolerances of forward values and of gradients compared with torch
FWD = {"rtol": 1e-3, "atol": 1e-6}
BWD = {"rtol": 1e-3, "atol": 1e-4}

#: ember dtype -> the torch dtype of the same name, and back
TORCH_DTYPES: dict[DType, Any] = {} if torch is None else {dt: getattr(torch, n) for n, dt in dtypes.fields().items()}
FROM_TORCH: dict[Any, DType] = {v: k for k, v in TORCH_DTYPES.items()}

_UINT = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


# --- dtypes and devices ------------------------------------------------------------------------------
def dtype_name(dt: DType) -> str:
    """The numpy-style name of ``dt`` ("int8", "float32", ...), which is also torch's name for it."""
    return next(n for n, d in dtypes.fields().items() if d == dt)


def torch_dtype_name(t: Any) -> str:
    """The name of a torch tensor's dtype without the ``torch.`` prefix."""
    return str(t.dtype).removeprefix("torch.")


def other_device(device: str) -> str:
    """A second usable device (PYTHON for CPU, CPU otherwise); skips the test when there is none."""
    other = "PYTHON" if device == "CPU" else "CPU"
    if other not in Device.available():
        pytest.skip(f"needs device {other} too: {Device.probe(other)}")
    return other


# --- many results through one kernel -----------------------------------------------------------------
def packed_numpy(tensors: list[Tensor]) -> list[np.ndarray]:
    """The values of ``tensors`` (bfloat16 as float32), all computed by one kernel, bit for bit.

    Each result is bitcast to an unsigned integer of its size (bool: cast to uint8), widened to uint64 and
    padded into its own row; the rows are summed, so one compile covers dozens of results (compiling is the
    slow part of a compiled device). Size-0 tensors take no row.
    """
    live = [t for t in tensors if t.numel() > 0]
    rows: list[np.ndarray] = []
    if live:
        n, k = max(t.numel() for t in live), len(live)
        parts = []
        for i, t in enumerate(live):
            bits = t.cast(dtypes.uint8) if t.dtype == dtypes.bool else t.bitcast(_UINT[t.dtype.itemsize])
            parts.append(bits.reshape(1, -1).cast(dtypes.uint64).pad(((i, k - 1 - i), (0, n - t.numel()))))
        while len(parts) > 1:  # a balanced sum keeps the graph shallow
            parts = [parts[j] + parts[j + 1] if j + 1 < len(parts) else parts[j] for j in range(0, len(parts), 2)]
        raw = parts[0].numpy()
        rows = [raw[i] for i in range(k)]
    it = iter(rows)
    out = []
    for t in tensors:
        if t.numel() == 0:
            out.append(np.zeros(t.shape, np.float32 if t.dtype == dtypes.bfloat16 else to_np_dtype(t.dtype)))
            continue
        bits = next(it)[: t.numel()].astype(np.dtype(f"u{t.dtype.itemsize}"))
        if t.dtype == dtypes.bool:
            vals = bits.astype(bool)
        elif t.dtype == dtypes.bfloat16:
            vals = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
        else:
            vals = bits.view(to_np_dtype(t.dtype))
        out.append(vals.reshape(t.shape))
    return out


# --- inputs ------------------------------------------------------------------------------------------
def rand(*shape: int, seed: int = 0, low: float | None = None) -> np.ndarray:
    """Standard normal float32 values from a generator seeded with ``seed``; with ``low``, magnitudes in
    [low, low + 1) with random signs (keeps products moderate)."""
    rng = np.random.default_rng(seed)
    if low is not None:
        return ((rng.random(shape) + low) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def laid_out(a: np.ndarray, kind: str) -> tuple[np.ndarray, Callable, Callable]:
    """A contiguous base array and the view ops (ember, torch) that turn it into ``a``.

    ``kind`` is "contiguous", "permuted" (all axes reversed), "flipped" (every axis) or "shrunk" (``a`` cut
    out of a bigger array whose border holds other values).
    """
    nd = a.ndim
    if kind == "contiguous":
        return a, (lambda t: t), (lambda t: t)
    if kind == "permuted":
        order = tuple(reversed(range(nd)))
        return np.ascontiguousarray(a.transpose(order)), (lambda t: t.permute(order)), (lambda t: t.permute(order))
    if kind == "flipped":
        axes = tuple(range(nd))
        return np.ascontiguousarray(np.flip(a, axes)), (lambda t: t.flip(axes)), (lambda t: t.flip(axes))
    if kind != "shrunk":
        raise ValueError(f"unknown layout {kind!r}")
    big = np.pad(a, [(1, 2)] * nd, mode="wrap") if a.size else np.pad(a, [(1, 2)] * nd)
    box = tuple((1, 1 + s) for s in a.shape)
    return big, (lambda t: t.shrink(box)), (lambda t: t[tuple(slice(lo, hi) for lo, hi in box)])


def torch_pair(a: np.ndarray | None, device: str, layout: str = "contiguous",
               grad: bool = True) -> tuple[Tensor, Tensor, Any, Any] | None:
    """(ember leaf, ember input, torch leaf, torch input) holding ``a`` (None for None).

    The input is ``layout`` (see :func:`laid_out`) of the leaf; float leaves require a gradient unless ``grad``
    is False.
    """
    if a is None:
        return None
    grad = grad and a.dtype.kind == "f"
    base, ours, theirs = laid_out(a, layout)
    e, t = Tensor(base, device=device, requires_grad=grad), torch.tensor(base, requires_grad=grad)
    return e, ours(e), t, theirs(t)


# --- comparing with torch ----------------------------------------------------------------------------
def compare_with_torch(device: str, fn: Callable, tfn: Callable, arrays: Sequence[np.ndarray | None],
                       layouts: Sequence[str] | None = None, backward: bool = True, const: tuple[int, ...] = (), *,
                       upstream: Callable[..., np.ndarray]) -> Any:
    """Run ``fn`` on ember tensors and ``tfn`` on torch tensors made from ``arrays`` (None passes through) and
    check the same shape, dtype and values (each of a tuple of results), then the same input gradients.

    ``layouts`` gives each input's layout (default contiguous). The gradients are those of the first result's
    projection onto ``upstream(*shape)``; they are checked when ``backward`` is set and the result is a float.
    Inputs whose index is in ``const`` get no gradient (torch refuses gradients for class weights).
    Returns the ember result.
    """
    layouts = layouts or ["contiguous"] * len(arrays)
    built = [torch_pair(a, device, lay, i not in const) for i, (a, lay) in enumerate(zip(arrays, layouts))]
    out = fn(*[None if b is None else b[1] for b in built])
    tout = tfn(*[None if b is None else b[3] for b in built])
    outs, touts = (out, tout) if isinstance(out, tuple) else ((out,), (tout,))
    for o, t in zip(outs, touts):
        expected = t.detach().numpy()
        assert o.shape == expected.shape, f"shape {o.shape} != torch {expected.shape}"
        assert o.dtype == from_np_dtype(expected.dtype), f"dtype {o.dtype} != torch {expected.dtype}"
        np.testing.assert_allclose(o.numpy(), expected, **FWD)
    if not backward or outs[0].dtype.kind != "f":
        return out
    g = upstream(*outs[0].shape)
    (outs[0] * Tensor(g, device=device)).sum().backward()
    (touts[0] * torch.tensor(g)).sum().backward()
    for b in built:
        if b is None or b[2].grad is None:
            continue
        assert b[0].grad is not None and b[0].grad.shape == tuple(b[2].grad.shape)
        np.testing.assert_allclose(b[0].grad.numpy(), b[2].grad.numpy(), **BWD)
    return out


def tg_index(ref: Any) -> Any:
    """torch's int64 index result (argmax, sort, topk, cummax, nonzero, one_hot ...) in tinygrad's dtype, the
    default int (int32), which ember follows."""
    return ref.to(TORCH_DTYPES[dtypes.default_int]) if ref.dtype == torch.int64 else ref


def tg_acc(ref: Any, src: Any) -> Any:
    """torch's sum/prod/cumsum of an input of torch dtype ``src`` in the dtype tinygrad (and ember) give it:
    bool and signed ints narrower than 64 bits accumulate in int32, unsigned ones in uint32 (torch: int64)."""
    if ref.dtype != torch.int64 or src == torch.int64:
        return ref
    return ref.to(torch.uint32 if src in (torch.uint8, torch.uint16, torch.uint32) else torch.int32)


def assert_like(ours: Tensor, theirs: Any, exact: bool = False, atol: float = 1e-6, rtol: float = 1e-3) -> None:
    """``ours`` has the shape, dtype and values of the torch tensor ``theirs``.

    Integers and bools, and everything when ``exact`` is set, must be equal; floats close (nan matches nan).
    """
    assert ours.shape == tuple(theirs.shape), f"shape {ours.shape} != torch {tuple(theirs.shape)}"
    assert ours.dtype == FROM_TORCH[theirs.dtype], f"dtype {ours.dtype} != torch {theirs.dtype}"
    exp = theirs.detach()
    exp = exp.float().numpy() if exp.dtype == torch.bfloat16 else exp.numpy()
    got = ours.numpy()
    if exact or ours.dtype.kind in "biu":
        np.testing.assert_array_equal(got, exp)
    else:
        np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True)


def check_grad(device: str, ours: Callable[..., Tensor], theirs: Callable[..., Any], *arrays: np.ndarray,
               fwd: dict | None = None, bwd: dict | None = None, seed: int = 0) -> None:
    """Forward and backward of ``ours`` on ember against ``theirs`` on torch: the result as :func:`assert_like`
    (tolerances ``fwd``), then the inputs' gradients of a random projection (``seed``; tolerances ``bwd``)."""
    ts = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, ref = ours(*ts), theirs(*tt)
    assert_like(out, ref, **(fwd or FWD))
    w = np.random.default_rng(seed).standard_normal(tuple(ref.shape)).astype(np.float32)
    (out * Tensor(w, device=device, dtype=out.dtype)).sum().backward()
    (ref * torch.tensor(w, dtype=ref.dtype)).sum().backward()
    for t, r, a in zip(ts, tt, arrays):
        want = np.zeros_like(a) if r.grad is None else r.grad.numpy()
        assert t.grad is not None, "no gradient reached an input"
        assert t.grad.shape == a.shape and t.grad.dtype == FROM_TORCH[r.dtype]
        np.testing.assert_allclose(t.grad.numpy(), want, equal_nan=True, **(bwd or BWD))


# --- errors like torch's -----------------------------------------------------------------------------
def raises_like(fn: Callable, tfn: Callable) -> None:
    """``fn`` raises the exception type torch's ``tfn`` raises."""
    with pytest.raises(Exception) as want:
        tfn()
    with pytest.raises(want.type):
        fn()


def builtin_error(e: BaseException) -> type[BaseException]:
    """The builtin exception class a torch error is (torch raises subclasses such as torch.AcceleratorError)."""
    return next(c for c in type(e).__mro__ if c.__module__ == "builtins")


def same_error(ours: Callable[[], Any], theirs: Callable[[], Any]) -> BaseException:
    """torch raises, and ember raises the same builtin exception type; returns ember's exception."""
    try:
        theirs()
    except Exception as e:  # noqa: BLE001
        with pytest.raises(builtin_error(e)) as info:
            ours()
        return info.value
    raise AssertionError("torch did not raise")
