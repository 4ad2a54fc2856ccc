"""Offset views (data that starts in the middle of an allocation), odd and large sizes, and graph replay.

Large tensors are checked against numpy only (the PYTHON device is an interpreter); small ones
against both.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Device, Tensor, dtypes
from ember.testing.checks import REFERENCE, assert_same, same_as_reference_many, supported

RNG = np.random.default_rng(7)
VIEWS = {
    "tail": lambda t: t[37:], "strided": lambda t: t[37:500:3], "reversed": lambda t: t[900:100:-7],
    "last": lambda t: t[999:], "empty": lambda t: t[5:5], "box": lambda t: t.reshape(10, 100)[3:7, 11:97],
    "column": lambda t: t.reshape(40, 25)[:, 13], "broadcast_row": lambda t: t.reshape(10, 100)[4:5].expand(3, 100),
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_offset_views(device: str, view: str) -> None:
    """A view into the middle of a realized buffer reads, computes, copies and casts from the right place."""
    data = np.arange(1000, dtype=np.float32) * 0.5 - 100
    base = Tensor(data, device=device).realize()
    v = VIEWS[view](base)
    want = VIEWS[view](Tensor(data, device=REFERENCE)).numpy()
    np.testing.assert_array_equal(VIEWS[view](data.copy()) if view != "broadcast_row" else want, want)
    outs = {"read": v, "arith": v * 2 + 1, "contiguous": v.contiguous(), "to_reference": v.to(REFERENCE),
            "roundtrip": v.to(REFERENCE).to(device) - 1, "sum": v.sum()}
    if supported(device, dtypes.float16):  # (a device may offer no float16: a C compiler without _Float16)
        outs["cast"] = v.cast(dtypes.float16)
    for label, out in outs.items():
        exp = {"arith": want * 2 + 1, "roundtrip": want - 1, "cast": want.astype(np.float16),
               "sum": np.array(want.sum(dtype=np.float64), np.float32)}.get(label, want)
        assert_same(out.numpy(), exp.astype(out.numpy().dtype), what=f"{view} view, {label}", rtol=1e-6)


def test_view_of_realized_view(device: str) -> None:
    """A view realized into its own buffer, then viewed again with an offset, keeps both offsets right."""
    data = RNG.standard_normal(4096).astype(np.float32)
    t = Tensor(data, device=device)[1000:3000].contiguous().realize()
    u = t.reshape(40, 50)[7:, 3:41].T
    np.testing.assert_array_equal(u.numpy(), data[1000:3000].reshape(40, 50)[7:, 3:41].T)
    np.testing.assert_allclose((u * u).sum(0).numpy(), (data[1000:3000].reshape(40, 50)[7:, 3:41].T ** 2).sum(0),
                               rtol=1e-5)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 31, 257, 4099])
def test_small_and_prime_sizes(device: str, n: int) -> None:
    """Elementwise, reductions, scans and a matmul at sizes 0, 1 and primes, against the reference."""
    x = RNG.standard_normal(n).astype(np.float32)
    fns = {"arith": lambda t: (t * 3 - 1).exp(), "sum": lambda t: t.sum(), "cumsum": lambda t: t.cumsum(0),
           "outer": lambda t: t.reshape(n, 1) @ t[:min(n, 5)].reshape(1, min(n, 5))}
    if supported(device, dtypes.float16):
        fns["cast"] = lambda t: t.half()
    if n:
        fns.update({"max": lambda t: t.max(), "argmin": lambda t: t.argmin(), "mean": lambda t: t.mean()})
    got = same_as_reference_many(device, fns, x, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got["sum"], x.astype(np.float64).sum(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [65537, 100003])
def test_sizes_past_2_16(device: str, n: int) -> None:
    """More than 2**16 elements (primes and odd sizes): elementwise, reductions and a wide matmul vs numpy."""
    x = RNG.standard_normal(n).astype(np.float32)
    t = Tensor(x, device=device)
    outs = {"arith": (t * 2 + 1).relu(), "sum": t.sum(), "max": t.max(), "argmax": t.argmax(),
            "int": (t * 100).cast(dtypes.int32) % 7, "dot": t @ t}
    Tensor.realize_all(*outs.values())
    np.testing.assert_array_equal(outs["arith"].numpy(), np.maximum(x * 2 + 1, 0))
    np.testing.assert_allclose(outs["sum"].numpy(), x.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    assert outs["max"].numpy() == x.max() and outs["argmax"].numpy() == np.argmax(x)
    np.testing.assert_array_equal(outs["int"].numpy(), np.fmod((x * 100).astype(np.int32), 7) % 7)
    np.testing.assert_allclose(outs["dot"].numpy(), np.dot(x.astype(np.float64), x), rtol=1e-4)
    # a 2-d case with prime sides past 2**16 elements, reduced along each axis
    m = RNG.standard_normal((257, 263)).astype(np.float32)
    tm = Tensor(m, device=device)
    np.testing.assert_allclose(tm.sum(0).numpy(), m.sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tm.max(1).numpy(), m.max(1))


def test_graph_replay(device: str) -> None:
    """A device with a batched graph replays a list of kernels like running them one by one, and replays
    again with new input contents (what a JIT does)."""
    from ember.engine.realize import program_for

    dev = Device[device]
    if getattr(dev, "graph", None) is None:
        pytest.skip(f"{device} has no graph (batched replay) API")
    x = RNG.standard_normal(97).astype(np.float32)
    a = Tensor(x, device=device).realize()
    b = (a * 3 + 1).exp()
    c = (b - 2) * a  # depends on b: the replay must keep the order
    items = c.schedule(b)
    # one opaque buffer per ember Buffer, allocated through the allocator contract
    opaque: dict[int, tuple[object, object]] = {}
    for ei in items:
        for buf in ei.bufs:
            if id(buf) not in opaque:
                handle = dev.allocator.alloc(buf.nbytes)
                if buf.is_allocated():
                    dev.allocator.copyin(handle, memoryview(buf.as_bytes()))
                opaque[id(buf)] = (buf, handle)
    calls = []
    for ei in items:  # each kernel built through the device's own compiler and runtime
        spec = program_for(device, ei.ast)
        program = dev.runtime(spec.name, dev.compiler.compile_cached(spec.src))
        calls.append((program, [opaque[id(buf)][1] for buf in ei.bufs], (), spec.global_size, spec.local_size))
    graph = dev.graph(calls)
    assert len(graph) == len(items)
    outputs = [opaque[id(ei.bufs[0])][1] for ei in items]
    inputs = [handle for key, (buf, handle) in opaque.items() if handle not in outputs]
    assert len(inputs) == 1, f"expected one input buffer, found {len(inputs)}"

    def read(handle: object) -> np.ndarray:
        out = np.empty(x.size, np.float32)
        dev.synchronize()
        dev.allocator.copyout(memoryview(out).cast("B"), handle)
        return out

    for data in (x, x[::-1].copy() * 0.5):  # the second replay sees new input contents, as a JIT's does
        dev.allocator.copyin(inputs[0], memoryview(data).cast("B"))
        graph(wait=True)
        graph(wait=True)  # replaying again changes nothing: each kernel overwrites its output
        np.testing.assert_allclose(read(outputs[0]), np.exp(data * 3 + 1), rtol=1e-5)
        np.testing.assert_allclose(read(outputs[-1]), (np.exp(data * 3 + 1) - 2) * data, rtol=1e-5)
