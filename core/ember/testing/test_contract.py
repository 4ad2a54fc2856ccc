"""The raw device contract, below tensors: allocator, program and graph, through their public methods only.

These checks talk to the parts a plugin implements (``docs/contracts.md``) the way core does: opaque
buffers from ``device.allocator``, a linear program rendered by ``device.renderer``, compiled by
``device.compiler``, loaded by ``device.runtime`` and launched with sizes and runtime values, and a
batch of calls replayed by ``device.graph`` after swapping a buffer and a value. A failure here names
the part at fault, where the tensor-level suite only sees a wrong number.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember import Device
from ember.device import BufferSpec, Compiled
from ember.renderer import Ops, UOp, dtypes

RNG = np.random.default_rng(4321)
#: elements of the test kernel (not a power of two, so a grid device cannot get away with rounding)
N = 37


@pytest.fixture(scope="module")
def dev(device: str) -> Compiled:
    """The device object under test."""
    return Device[device]


def _read(dev: Compiled, opaque: Any, nbytes: int) -> bytes:
    dev.synchronize()
    out = bytearray(nbytes)
    dev.allocator.copyout(memoryview(out), opaque)
    return bytes(out)


def _buffer(dev: Compiled, data: bytes, options: BufferSpec | None = None) -> Any:
    opaque = dev.allocator.alloc(len(data), options)
    dev.allocator.copyin(opaque, memoryview(data))
    return opaque


@pytest.mark.parametrize("nbytes", [0, 1, 13, 4096, 65539])
def test_allocator_round_trip(dev: Compiled, nbytes: int) -> None:
    data = RNG.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    opaque = _buffer(dev, data)
    assert _read(dev, opaque, nbytes) == data
    # a shorter read takes the first bytes
    assert _read(dev, opaque, nbytes // 2) == data[:nbytes // 2]
    dev.allocator.free(opaque, nbytes)


def test_allocator_accepts_buffer_specs(dev: Compiled) -> None:
    """Every BufferSpec kind allocates and round-trips (a device without such memory serves it as ordinary memory)."""
    for spec in (BufferSpec(host_visible=True), BufferSpec(uncached=True), BufferSpec(cpu_access=True)):
        data = RNG.integers(0, 256, 100, dtype=np.uint8).tobytes()
        opaque = _buffer(dev, data, spec)
        assert _read(dev, opaque, 100) == data, spec
        dev.allocator.free(opaque, 100, spec)


def test_allocator_reaches_its_device(dev: Compiled) -> None:
    assert dev.allocator.device is dev


def test_allocator_offset_views(dev: Compiled) -> None:
    """A view from ``offset`` reads and writes the base buffer's bytes in place, at every offset the device allows."""
    size = 4096
    data = RNG.integers(0, 256, size, dtype=np.uint8).tobytes()
    base = _buffer(dev, data)
    tried = 0
    for start, length in ((0, 100), (256, 300), (1024, 1000), (3000, 96), (7, 5)):
        try:
            view = dev.allocator.offset(base, start, length)
        except NotImplementedError:  # offsets the device cannot address (e.g. OpenCL's sub-buffer alignment)
            continue
        tried += 1
        assert _read(dev, view, length) == data[start:start + length]
        patch = RNG.integers(0, 256, length, dtype=np.uint8).tobytes()
        dev.allocator.copyin(view, memoryview(patch))
        data = data[:start] + patch + data[start + length:]
        assert _read(dev, base, size) == data, f"writing through the view at {start} changed other bytes"
    if tried == 0:
        pytest.skip(f"{dev.device} has no offset views")
    with pytest.raises(ValueError):
        dev.allocator.offset(base, size - 10, 20)


def test_allocator_host_view_and_transfer(dev: Compiled) -> None:
    """``as_buffer`` shows the buffer's bytes; ``transfer`` between two buffers of the device copies them (optional)."""
    data = RNG.integers(0, 256, 512, dtype=np.uint8).tobytes()
    src = _buffer(dev, data)
    checked = 0
    try:
        view = dev.allocator.as_buffer(src)
    except NotImplementedError:
        pass
    else:
        dev.synchronize()
        assert bytes(view[:512]) == data
        checked += 1
    dest = dev.allocator.alloc(512)
    try:
        dev.allocator.transfer(dest, src, 512, dev, dev)
    except NotImplementedError:
        pass
    else:
        assert _read(dev, dest, 512) == data
        checked += 1
    if checked == 0:
        pytest.skip(f"{dev.device} has neither as_buffer nor transfer")


def scale_add_program(n: int = N) -> list[UOp]:
    """The linear program of ``out[i] = inp[i] * 2 + k`` over int32, ``k`` a runtime value (``DEFINE_VAR``)."""
    i32 = dtypes.int32
    out = UOp(Ops.DEFINE_GLOBAL, i32.ptr(), (), (0, n))
    inp = UOp(Ops.DEFINE_GLOBAL, i32.ptr(), (), (1, n))
    k = UOp(Ops.DEFINE_VAR, i32, (), ("k", -1000, 1000))
    zero, end, two = UOp(Ops.CONST, i32, (), 0), UOp(Ops.CONST, i32, (), n), UOp(Ops.CONST, i32, (), 2)
    i = UOp(Ops.RANGE, i32, (zero, end), (0, "global"))
    load = UOp(Ops.LOAD, i32, (inp, i))
    value = UOp(Ops.ADD, i32, (UOp(Ops.MUL, i32, (load, two)), k))
    store = UOp(Ops.STORE, None, (out, i, value))
    return [out, inp, k, zero, end, two, i, load, value.src[0], value, store,
            UOp(Ops.ENDRANGE, None, (i,)), UOp(Ops.SINK, None, ())]


@pytest.fixture(scope="module")
def program(dev: Compiled) -> Any:
    """The scale-add kernel rendered, compiled and loaded through the device's own parts."""
    if dtypes.int32 not in dev.renderer.supported_dtypes:
        pytest.skip(f"{dev.device} has no int32")
    src = dev.renderer.render("ember_scale_add", scale_add_program())
    return dev.runtime("ember_scale_add", dev.compiler.compile_cached(src))


def _ints(values: np.ndarray) -> bytes:
    return values.astype(np.int32).tobytes()


def _as_ints(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, np.int32)


def test_program_launch_with_sizes_and_runtime_values(dev: Compiled, program: Any) -> None:
    x = RNG.integers(-100, 100, N).astype(np.int32)
    inp, out = _buffer(dev, _ints(x)), dev.allocator.alloc(N * 4)
    elapsed = program(out, inp, global_size=(N, 1, 1), local_size=None, vals=(5,), wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    np.testing.assert_array_equal(_as_ints(_read(dev, out, N * 4)), x * 2 + 5)
    # a new runtime value, same binary; without wait the launch returns None and synchronize() waits
    assert program(out, inp, global_size=(N, 1, 1), vals=(-7,)) is None
    np.testing.assert_array_equal(_as_ints(_read(dev, out, N * 4)), x * 2 - 7)


def test_program_takes_offset_views(dev: Compiled, program: Any) -> None:
    """A kernel reading and writing views from ``offset`` sees only their bytes."""
    start = 1024  # elements: 4 KiB in, aligned for every sub-buffer rule we know (OpenCL's base address alignment)
    x = RNG.integers(-100, 100, start + 2 * N).astype(np.int32)
    base = _buffer(dev, _ints(x))
    try:  # out = elements [0, N), inp = elements [start, start + N): offsets a device may refuse
        out, inp = dev.allocator.offset(base, 0, N * 4), dev.allocator.offset(base, start * 4, N * 4)
    except NotImplementedError:
        pytest.skip(f"{dev.device} cannot make these offset views")
    program(out, inp, global_size=(N, 1, 1), vals=(1,))
    want = x.copy()
    want[:N] = x[start:start + N] * 2 + 1
    np.testing.assert_array_equal(_as_ints(_read(dev, base, x.nbytes)), want)


def test_graph_replays_with_updated_buffers_and_values(dev: Compiled, program: Any) -> None:
    if dev.graph is None:
        pytest.skip(f"{dev.device} has no graph (batched replay)")
    x = RNG.integers(-100, 100, N).astype(np.int32)
    y = RNG.integers(-100, 100, N).astype(np.int32)
    a, b = _buffer(dev, _ints(x)), _buffer(dev, _ints(y))
    mid, out = dev.allocator.alloc(N * 4), dev.allocator.alloc(N * 4)
    size = (N, 1, 1)
    graph = dev.graph([(program, [mid, a], (3,), size, None), (program, [out, mid], (-1,), size, None)])
    assert len(graph) == 2
    elapsed = graph(wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    np.testing.assert_array_equal(_as_ints(_read(dev, out, N * 4)), (x * 2 + 3) * 2 - 1)
    # swap the input buffer of the first call and the value of the second, replay
    graph.update_buffer(0, 1, b)
    graph.update_vals(1, (10,))
    assert graph() is None
    np.testing.assert_array_equal(_as_ints(_read(dev, out, N * 4)), (y * 2 + 3) * 2 + 10)
    with pytest.raises(ValueError):
        graph.update_vals(0, (1, 2))
