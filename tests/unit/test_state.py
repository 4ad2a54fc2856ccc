"""Weights I/O (ember.nn.state) and the DISK device: safetensors, torch checkpoints, GGUF, state dicts.

Every fixture file is built inside the test (tmp_path): by ember itself, by the reference libraries
when they are installed (safetensors, torch), or byte by byte from the format specifications.
"""
from __future__ import annotations

import collections
import json
import os
import pickle
import struct
import time
import zipfile
from typing import Any, NamedTuple

import numpy as np
import pytest

from ember import Device, GlobalCounters, Tensor, dtypes, no_grad
from ember.builtin_devices.disk import READ_ONLY, DiskComputeError
from ember.device.registry import DevicePluginError, _DeviceRegistry
from ember.dtype import DType, to_np_dtype
from ember.nn.state import (
    GGUFError,
    SafetensorsError,
    StateDictError,
    TorchLoadError,
    WeightsFormatError,
    from_file,
    get_parameters,
    get_state_dict,
    ggml_data_to_tensor,
    gguf_load,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
    torch_load,
)

ALL_DTYPES = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
              dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)


def random_bits(dt: DType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values of ``dt`` as stored (bfloat16 as uint16 bits), with NaN, inf and -0.0 among the floats."""
    if dt == dtypes.bool:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    npdt = np.dtype(to_np_dtype(dt))
    raw = rng.integers(0, 256, size=(*shape, npdt.itemsize), dtype=np.uint8)
    arr = np.ascontiguousarray(raw).view(npdt).reshape(shape)
    if dt.kind == "f" and arr.size >= 3:
        flat = arr.reshape(-1)
        if dt == dtypes.bfloat16:
            flat[:3] = [0x7FC0, 0xFF80, 0x8000]  # NaN, -inf, -0.0
        else:
            flat[:3] = np.array([np.nan, -np.inf, -0.0], dtype=npdt)
    return arr


def ember_tensor(bits: np.ndarray, dt: DType) -> Tensor:
    """A tensor on the default device holding exactly ``bits`` (bfloat16 given as uint16 bits)."""
    if dt == dtypes.bfloat16:
        return Tensor(bits).bitcast(dtypes.bfloat16)
    return Tensor(bits)


def stored_bits(t: Tensor) -> np.ndarray:
    """The stored values of ``t`` (bfloat16 back as uint16 bits), read without computing anything."""
    got = t.numpy()
    if t.dtype == dtypes.bfloat16:
        return (got.view(np.uint32) >> 16).astype(np.uint16)
    return got


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# =============================================================================================
# the DISK device
# =============================================================================================


def test_disk_name_keeps_the_path_case(tmp_path: Any) -> None:
    path = tmp_path / "MixedCase" / "Weights.BIN"
    path.parent.mkdir()
    path.write_bytes(bytes(range(8)))
    assert Device.canonicalize(f"disk:{path}") == f"DISK:{path}"
    t = Tensor.empty(8, dtype=dtypes.uint8, device=f"disk:{path}")
    assert t.device == f"DISK:{path}"
    np.testing.assert_array_equal(t.numpy(), np.arange(8, dtype=np.uint8))


def test_disk_is_never_the_default_device() -> None:
    assert Device.DEFAULT.partition(":")[0] != "DISK"
    specs = Device.specs()
    assert specs["DISK"].priority < specs["PYTHON"].priority
    only_builtins = _DeviceRegistry(entry_points=[])
    with pytest.warns(UserWarning, match="PYTHON"):
        assert only_builtins.DEFAULT == "PYTHON"


def test_disk_needs_a_path() -> None:
    with pytest.raises(DevicePluginError, match="DISK:/path"):
        Device["DISK"]


def test_disk_empty_views_a_file_and_copies_to_a_compute_device(tmp_path: Any) -> None:
    data = np.arange(24, dtype=np.float32)
    path = tmp_path / "raw.bin"
    path.write_bytes(data.tobytes())
    t = Tensor.empty(2, 12, dtype=dtypes.float32, device=f"DISK:{path}")
    np.testing.assert_array_equal(t.numpy(), data.reshape(2, 12))
    moved = t.reshape(4, 6).to(Device.DEFAULT)
    assert moved.device == Device.DEFAULT
    np.testing.assert_array_equal((moved * 2).numpy(), data.reshape(4, 6) * 2)


def test_disk_round_trip_through_a_compute_device(tmp_path: Any, device: str) -> None:
    path = tmp_path / "w.safetensors"
    safe_save({"w": Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)}, path)
    w = safe_load(path)["w"].to(device)
    assert w.device == device
    np.testing.assert_array_equal((w * 2).numpy(), np.arange(6).reshape(2, 3) * 2)
    out = tmp_path / f"out_{device}.bin"
    (w + 1).to(f"DISK:{out}").realize()
    assert out.read_bytes() == (np.arange(6, dtype=np.float32) + 1).tobytes()


def test_to_disk_writes_the_file(tmp_path: Any) -> None:
    path = tmp_path / "out.bin"
    data = np.arange(10, dtype=np.int16) - 5
    Tensor(data).to(f"DISK:{path}").realize()
    assert path.read_bytes() == data.tobytes()
    back = from_file(path, dtype=dtypes.int16)
    np.testing.assert_array_equal(back.numpy(), data)


def test_computing_on_disk_says_to_move_the_tensor_first(tmp_path: Any) -> None:
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(16))
    t = from_file(path, dtype=dtypes.float32)
    with pytest.raises(DiskComputeError, match=r"cannot compute.*\.to\("):
        (t + 1).realize()
    with pytest.raises(DiskComputeError, match=r"\.to\("):
        t[::2].to(Device.DEFAULT).realize()  # a strided slice needs a kernel on the disk


def test_a_contiguous_slice_of_a_file_is_copied_without_a_kernel(tmp_path: Any) -> None:
    path = tmp_path / "raw.bin"
    path.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    t = from_file(path, dtype=dtypes.float32)
    np.testing.assert_array_equal(t[1:3].to(Device.DEFAULT).numpy(), [1.0, 2.0])


def test_disk_allocator_views_are_zero_copy_and_read_only(tmp_path: Any) -> None:
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(range(100)))
    alloc = Device[f"DISK:{path}"].allocator
    base = alloc.alloc(100, READ_ONLY)
    sub = alloc.offset(base, 10, 20)
    inner = alloc.offset(sub, 5, 3)
    mv = alloc.as_buffer(inner)
    assert mv.readonly and bytes(mv) == bytes([15, 16, 17])
    assert sub.mapping is base.mapping  # one mapping, no copies
    out = bytearray(4)
    alloc.copyout(memoryview(out), sub)
    assert bytes(out) == bytes([10, 11, 12, 13])
    with pytest.raises(OSError, match="read-only"):
        alloc.copyin(sub, memoryview(b"xx"))
    with pytest.raises(ValueError, match="outside"):
        alloc.offset(sub, 15, 10)
    with pytest.raises(ValueError, match="has only 100 bytes"):
        alloc.alloc(101, READ_ONLY)
    assert bytes(alloc.as_buffer(alloc.alloc(0, READ_ONLY))) == b""


def test_disk_read_write_mapping_grows_the_file(tmp_path: Any) -> None:
    path = tmp_path / "grow.bin"
    path.write_bytes(b"abc")
    alloc = Device[f"DISK:{path}"].allocator
    buf = alloc.alloc(8)
    alloc.copyin(alloc.offset(buf, 3, 2), memoryview(b"XY"))
    del buf
    assert path.read_bytes() == b"abcXY\x00\x00\x00"


def test_from_file_dtype_shape_offset(tmp_path: Any) -> None:
    data = np.arange(12, dtype=np.int32)
    path = tmp_path / "ints.bin"
    path.write_bytes(b"head" + data.tobytes())
    t = from_file(path, dtype=dtypes.int32, shape=(3, 4), offset=4)
    assert t.shape == (3, 4) and t.dtype == dtypes.int32 and t.device == f"DISK:{path}"
    np.testing.assert_array_equal(t.to(Device.DEFAULT).realize().numpy(), data.reshape(3, 4))
    np.testing.assert_array_equal(from_file(path, dtype="int32", offset=4).numpy(), data)
    with pytest.raises(ValueError, match="needs 52 bytes"):
        from_file(path, dtype=dtypes.int32, shape=(13,), offset=4)
    with pytest.raises(ValueError, match="whole number"):
        from_file(path, dtype=dtypes.int32, offset=2)


def _mapping_rss_kib(path: str) -> int | None:
    """Resident kB of this process's mappings of ``path`` (None where /proc/self/smaps is missing)."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
            inside = line.endswith(" " + path) or line.endswith("\t" + path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_loading_is_lazy_and_copies_only_the_tensor_asked_for(tmp_path: Any) -> None:
    big = 50_000_000  # float32 elements: a 200 MB tensor, never read
    small = np.arange(1024, dtype=np.float32)
    header = {"big": {"dtype": "F32", "shape": [big], "data_offsets": [0, big * 4]},
              "small": {"dtype": "F32", "shape": [1024], "data_offsets": [big * 4, big * 4 + 4096]}}
    blob = json.dumps(header).encode()
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:  # a sparse file: the 200 MB hole costs no disk and no time
        f.write(len(blob).to_bytes(8, "little") + blob)
        f.seek(8 + len(blob) + big * 4)
        f.write(small.tobytes())
    start = time.perf_counter()
    loaded = safe_load(path)
    assert time.perf_counter() - start < 20, "safe_load must only read the header"  # (a hang, not a speed)
    assert loaded["big"].shape == (big,)
    GlobalCounters.reset()
    moved = loaded["small"].to(Device.DEFAULT).realize()
    assert GlobalCounters.global_mem == small.nbytes  # the copy moved only this tensor's bytes
    np.testing.assert_array_equal(moved.numpy(), small)
    rss = _mapping_rss_kib(str(path))
    if rss is not None:
        assert rss < 8 * 1024, f"{rss} kB of the 200 MB file are resident: the file was read, not mapped"


# =============================================================================================
# safetensors
# =============================================================================================

SHAPES = ((2, 3), (), (0, 4), (5,))


def test_safetensors_round_trip_every_dtype(tmp_path: Any) -> None:
    rng = np.random.default_rng(0)
    expected: dict[str, tuple[np.ndarray, DType]] = {}
    for i, dt in enumerate(ALL_DTYPES):
        expected[f"t_{dt.name}"] = (random_bits(dt, SHAPES[i % len(SHAPES)] if i < 4 else (3, 4), rng), dt)
    tensors = {k: ember_tensor(bits, dt) for k, (bits, dt) in expected.items()}
    path = tmp_path / "all.safetensors"
    safe_save(tensors, path)
    loaded = safe_load(path)
    assert set(loaded) == set(expected)
    for k, (bits, dt) in expected.items():
        t = loaded[k]
        assert t.device == f"DISK:{path}"
        assert t.dtype == dt and t.shape == bits.shape, k
        assert bits_equal(stored_bits(t), bits), k
        assert bits_equal(stored_bits(t.to(Device.DEFAULT).realize()), bits), k
    # a second save of the loaded (DISK) tensors writes the same bytes
    again = tmp_path / "again.safetensors"
    safe_save(loaded, again)
    assert again.read_bytes() == path.read_bytes()


def test_safetensors_keeps_nan_payloads_bit_for_bit(tmp_path: Any) -> None:
    bits = np.array([0x7FC1, 0x7F81, 0xFFFF, 0x0001], np.uint16)  # quiet and signalling NaNs with payloads
    raw = tmp_path / "raw.bin"
    raw.write_bytes(bits.tobytes() + np.array([np.nan], np.float32).view(np.uint32).__or__(5).tobytes())
    tensors = {"bf": from_file(raw, dtype=dtypes.bfloat16, shape=(4,)),
               "f": from_file(raw, dtype=dtypes.float32, shape=(1,), offset=8)}
    path = tmp_path / "nan.safetensors"
    safe_save(tensors, path)
    loaded = safe_load(path)
    assert bits_equal(stored_bits(loaded["bf"]), bits)
    assert loaded["f"].numpy().tobytes() == raw.read_bytes()[8:]


def test_cpu_bitcast_to_bfloat16_keeps_nan_payloads() -> None:
    if "CPU" not in Device.available():
        pytest.skip("no CPU device")
    bits = np.array([0x7FC1, 0x7F81, 1], np.uint16)
    t = Tensor(bits, device="CPU").bitcast(dtypes.bfloat16)
    assert bits_equal(stored_bits(t), bits)


def test_safetensors_saves_views_in_logical_order(tmp_path: Any) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a).permute(1, 0).flip(0)
    safe_save({"v": t}, tmp_path / "v.safetensors")
    np.testing.assert_array_equal(safe_load(tmp_path / "v.safetensors")["v"].numpy(), a.T[::-1])


def test_safetensors_metadata(tmp_path: Any) -> None:
    path = tmp_path / "m.safetensors"
    safe_save({"x": Tensor([1.0, 2.0])}, path, metadata={"format": "pt", "note": "héllo"})
    raw, data_start, header = safe_load_metadata(path)
    assert header["__metadata__"] == {"format": "pt", "note": "héllo"}
    assert header["x"] == {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    assert data_start % 8 == 0 and raw.dtype == dtypes.uint8 and raw.shape == (data_start + 8,)
    assert int.from_bytes(raw.numpy()[:8].tobytes(), "little") == data_start - 8
    assert list(safe_load(path)) == ["x"]


def test_safetensors_from_bytes_and_tensors(tmp_path: Any) -> None:
    path = tmp_path / "b.safetensors"
    safe_save({"x": Tensor(np.arange(6, dtype=np.int64).reshape(2, 3))}, path)
    blob = path.read_bytes()
    for src in (blob, Tensor(blob), Tensor.empty(len(blob), dtype=dtypes.uint8, device=f"DISK:{path}")):
        x = safe_load(src)["x"]
        np.testing.assert_array_equal(x.numpy(), np.arange(6).reshape(2, 3))


def test_safe_save_rejects_bad_arguments(tmp_path: Any) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(TypeError, match="metadata"):
        safe_save({"x": Tensor([1.0])}, path, metadata={"epoch": 3})  # type: ignore[dict-item]
    with pytest.raises(SafetensorsError, match="reserved"):
        safe_save({"__metadata__": Tensor([1.0])}, path)
    with pytest.raises(TypeError, match="not a Tensor"):
        safe_save({"x": np.zeros(2)}, path)  # type: ignore[dict-item]
    assert not path.exists()


def test_safe_save_replaces_the_file_without_disturbing_readers(tmp_path: Any) -> None:
    path = tmp_path / "w.safetensors"
    safe_save({"w": Tensor(np.full(1000, 1.0, np.float32))}, path)
    old = safe_load(path)["w"]
    safe_save({"w": Tensor(np.full(10, 2.0, np.float32))}, path)  # smaller: an in-place rewrite would truncate
    np.testing.assert_array_equal(old.numpy(), np.full(1000, 1.0, np.float32))
    np.testing.assert_array_equal(safe_load(path)["w"].numpy(), np.full(10, 2.0, np.float32))
    before = path.read_bytes()
    safe_save(safe_load(path), path)  # saving a file's own tensors over it reads the old file to the end
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary file left


def test_safetensors_matches_the_reference_implementation(tmp_path: Any) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(1)
    plain = [dt for dt in ALL_DTYPES if dt != dtypes.bfloat16]
    arrays = {f"k{i}_{dt.name}": random_bits(dt, ((2, 3), (4,), (), (0, 2))[i % 4], rng) for i, dt in enumerate(plain)}
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    safe_save({k: Tensor(v) for k, v in arrays.items()}, ours)
    st_numpy.save_file(arrays, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    back = st_numpy.load_file(str(ours))
    for k, v in arrays.items():
        assert bits_equal(back[k], v), k
        assert bits_equal(safe_load(theirs)[k].numpy(), v), k


def test_safetensors_bfloat16_matches_the_reference_implementation(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    bits = random_bits(dtypes.bfloat16, (3, 5), np.random.default_rng(2))
    ref = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    theirs = tmp_path / "theirs.safetensors"
    st_torch.save_file({"b": ref, "f": torch.ones(2)}, str(theirs))
    loaded = safe_load(theirs)
    assert loaded["b"].dtype == dtypes.bfloat16 and bits_equal(stored_bits(loaded["b"]), bits)
    ours = tmp_path / "ours.safetensors"
    safe_save(loaded, ours)
    assert ours.read_bytes() == theirs.read_bytes()
    back = st_torch.load_file(str(ours))["b"]
    assert back.dtype == torch.bfloat16 and bits_equal(back.view(torch.int16).numpy().view(np.uint16), bits)


def _safetensors_file(path: Any, header: Any, data: bytes = b"", header_len: int | None = None) -> Any:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(blob) if header_len is None else header_len
    path.write_bytes(n.to_bytes(8, "little") + blob + data)
    return path


F32x6 = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}

BAD_SAFETENSORS = {
    # name: (header, data, header_len, expected message parts)
    "truncated body": ({"a": F32x6, "b": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}}, bytes(35), None,
                       ("'b'", "run past the end", "truncated")),
    "header length larger than the file": ({"a": F32x6}, bytes(24), 10_000, ("header length", "truncated")),
    "non-JSON header": (b"{this is not json}", b"", None, ("not valid JSON",)),
    "header is not an object": (b"[1, 2, 3]", b"", None, ("JSON object",)),
    "offsets out of range": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(8), None,
                             ("'w'", "run past the end")),
    "negative offsets": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, bytes(8), None,
                         ("'w'", "data_offsets")),
    "overlapping tensors": ({"a": F32x6, "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}, bytes(24),
                            None, ("'a'", "'b'", "overlap")),
    "unknown dtype": ({"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}}, bytes(8), None,
                      ("'w'", "unknown dtype 'F7'")),
    "dtype ember lacks": ({"w": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}}, bytes(8), None,
                          ("'w'", "F8_E4M3")),
    "shape x dtype != byte range": ({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, bytes(20), None,
                                    ("'w'", "needs 24 bytes", "span 20 bytes")),
    "bad shape": ({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}}, bytes(8), None,
                  ("'w'", "shape")),
    "missing field": ({"w": {"dtype": "F32", "shape": [2]}}, bytes(8), None, ("'w'", "data_offsets")),
    "hole between tensors": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                              "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, bytes(12), None,
                             ("'b'", "belong to no tensor")),
    "trailing bytes": ({"a": F32x6}, bytes(30), None, ("6 bytes after the last tensor",)),
    "metadata not str -> str": ({"__metadata__": {"epoch": 3}, "a": F32x6}, bytes(24), None, ("__metadata__",)),
    "duplicate tensor": (b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                         b'"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', bytes(1), None,
                         ("'a'", "twice")),
}


@pytest.mark.parametrize("case", list(BAD_SAFETENSORS))
def test_malformed_safetensors_name_the_file_and_the_tensor(tmp_path: Any, case: str) -> None:
    header, data, header_len, parts = BAD_SAFETENSORS[case]
    path = _safetensors_file(tmp_path / "bad.safetensors", header, data, header_len)
    with pytest.raises(SafetensorsError) as info:
        safe_load(path)
    msg = str(info.value)
    assert str(path) in msg
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("content", [b"", b"tiny", b"GIF89a this is an image, not weights at all" * 3,
                                     b"\x89PNG\r\n\x1a\n" + bytes(100)])
def test_non_safetensors_files_are_refused(tmp_path: Any, content: bytes) -> None:
    path = tmp_path / "not.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorsError, match="not a safetensors file|truncated or not a safetensors"):
        safe_load(path)


def test_truncated_file_written_by_safe_save(tmp_path: Any) -> None:
    path = tmp_path / "cut.safetensors"
    safe_save({"first": Tensor(np.ones(8, np.float64)), "second": Tensor(np.ones(4, np.float32))}, path)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(SafetensorsError, match=r"cut\.safetensors: tensor 'second'.*truncated"):
        safe_load(path)


# =============================================================================================
# state dicts
# =============================================================================================


class Linear:
    def __init__(self, n_in: int, n_out: int, bias: bool = True):
        rng = np.random.default_rng(n_in * 100 + n_out)
        self.weight = Tensor(rng.normal(size=(n_out, n_in)).astype(np.float32), requires_grad=True)
        self.bias = Tensor(np.zeros(n_out, np.float32), requires_grad=True) if bias else None


class Pair(NamedTuple):
    left: Tensor
    right: Tensor


class Net:
    def __init__(self) -> None:
        self.l1 = Linear(3, 4)
        self.blocks = [Linear(4, 4, bias=False), {"norm": Tensor(np.ones(4, np.float32))}]
        self.pair = Pair(Tensor([1.0]), Tensor([2.0]))
        self.name = "net"
        self.parent = self  # a cycle must not hang the walk
        self.head = self.l1  # tied: the same layer under two names


def test_get_state_dict_names_and_get_parameters() -> None:
    net = Net()
    sd = get_state_dict(net)
    assert list(sd) == ["l1.weight", "l1.bias", "blocks.0.weight", "blocks.1.norm", "pair.left", "pair.right",
                        "head.weight", "head.bias"]
    assert sd["head.weight"] is sd["l1.weight"] is net.l1.weight
    params = get_parameters(net)
    assert len(params) == 6 and all(isinstance(p, Tensor) for p in params)
    assert get_state_dict(net.l1, prefix="enc.") == {"enc.weight": net.l1.weight, "enc.bias": net.l1.bias}
    assert get_state_dict({"a": [Tensor([1.0]), (Tensor([2.0]),)]}).keys() == {"a.0", "a.1.0"}


def _values(model: Any) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in get_state_dict(model).items()}


def test_load_state_dict_strict_report_lists_every_problem_and_applies_nothing() -> None:
    net = Linear(3, 2)
    before = _values(net)
    bad = {"weight": Tensor(np.ones((3, 2), np.float32)), "extra": Tensor([1.0]), "other": Tensor([0.0])}
    with pytest.raises(StateDictError) as info:
        load_state_dict(net, bad)
    msg = str(info.value)
    assert "nothing was loaded" in msg
    assert "missing keys (in the model, not in the state dict): bias" in msg
    assert "unexpected keys (in the state dict, not in the model): extra, other" in msg
    assert "weight: model (2, 3), state dict (3, 2)" in msg
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)
    for k, v in _values(net).items():
        np.testing.assert_array_equal(v, before[k])
    # non-strict still refuses a shape mismatch, naming both shapes
    with pytest.raises(StateDictError, match=r"weight: model \(2, 3\), state dict \(3, 2\)") as info:
        load_state_dict(net, bad, strict=False)
    assert "missing" not in str(info.value)


def test_load_state_dict_non_strict_skips_missing_and_unexpected(capsys: Any) -> None:
    net = Linear(3, 2)
    old_bias = net.bias.numpy()
    new_w = np.arange(6, dtype=np.float32).reshape(2, 3)
    updated = load_state_dict(net, {"weight": Tensor(new_w), "unused": Tensor([1.0])}, strict=False, verbose=True)
    assert updated == [net.weight]
    np.testing.assert_array_equal(net.weight.numpy(), new_w)
    np.testing.assert_array_equal(net.bias.numpy(), old_bias)
    out = capsys.readouterr().out
    assert "unused" in out and "bias" in out and "loaded 1 tensors" in out


def test_load_state_dict_from_a_safetensors_file(tmp_path: Any) -> None:
    src, dst = Net(), Net()
    with no_grad():
        for p in get_parameters(dst):
            p.assign(p * 0 + 7)
    path = tmp_path / "net.safetensors"
    safe_save(get_state_dict(src), path)
    sd = safe_load(path)
    load_state_dict(dst, sd, consume=True)
    assert sd == {}
    for k, v in get_state_dict(dst).items():
        assert v.device == Device.DEFAULT and not v.device.startswith("DISK"), k
        np.testing.assert_array_equal(v.numpy(), get_state_dict(src)[k].numpy(), err_msg=k)
    assert dst.l1.weight.requires_grad  # parameters stay parameters


def test_load_state_dict_casts_to_the_parameter_dtype(tmp_path: Any) -> None:
    net = Linear(2, 2)
    half = np.array([[0.5, 1.5], [-2.0, 3.25]], np.float16)
    path = tmp_path / "half.safetensors"
    safe_save({"weight": Tensor(half), "bias": Tensor(np.array([1, 2], np.int32))}, path)
    load_state_dict(net, safe_load(path))
    assert net.weight.dtype == dtypes.float32 and net.bias.dtype == dtypes.float32
    np.testing.assert_array_equal(net.weight.numpy(), half.astype(np.float32))
    np.testing.assert_array_equal(net.bias.numpy(), [1.0, 2.0])


def test_load_state_dict_failure_while_copying_changes_nothing(tmp_path: Any) -> None:
    net = Linear(2, 3)
    before = _values(net)
    path = tmp_path / "w.safetensors"
    safe_save({"weight": Tensor(np.ones((2, 3), np.float32)), "bias": Tensor(np.ones(3, np.float32))}, path)
    sd = safe_load(path)
    sd["weight"] = sd["weight"].T  # right shape, but a strided view of DISK: it cannot be copied off
    with pytest.raises(DiskComputeError):
        load_state_dict(net, sd)
    for k, v in _values(net).items():
        np.testing.assert_array_equal(v, before[k])


def test_malformed_file_leaves_the_model_untouched(tmp_path: Any) -> None:
    net = Linear(3, 2)
    before = _values(net)
    path = tmp_path / "net.safetensors"
    safe_save(get_state_dict(net), path)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(SafetensorsError, match="'weight'"):
        load_state_dict(net, safe_load(path))
    for k, v in _values(net).items():
        np.testing.assert_array_equal(v, before[k])


def test_mem_used_returns_to_its_start_after_dropping_loaded_tensors(tmp_path: Any) -> None:
    import gc

    path = tmp_path / "m.safetensors"
    safe_save({"a": Tensor(np.ones(1000, np.float32))}, path)
    gc.collect()
    start = GlobalCounters.mem_used
    loaded = safe_load(path)
    del loaded
    gc.collect()
    assert GlobalCounters.mem_used == start


def test_dropping_an_offset_view_buffer_does_not_recycle_its_memory() -> None:
    import gc

    from ember.device.buffer import Buffer

    if "CPU" not in Device.available():
        pytest.skip("no CPU device")
    base = Buffer("CPU", 16, dtypes.uint8).allocate()
    base.copyin(memoryview(bytes(16)))  # fresh memory is uninitialized; start from known zeros
    view = Buffer("CPU", 4, dtypes.uint8, opaque=Device["CPU"].allocator.offset(base._buf, 4, 4))
    del view
    gc.collect()
    fresh = Buffer("CPU", 4, dtypes.uint8).allocate()
    fresh.copyin(memoryview(b"XXXX"))
    assert bytes(base.as_bytes()) == bytes(16)


# =============================================================================================
# torch_load
# =============================================================================================


def _torch_reference(torch: Any) -> dict[str, Any]:
    base = torch.arange(12.0).reshape(3, 4)
    sd = collections.OrderedDict()
    sd["f32"] = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    sd["f64"] = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sd["f16"] = torch.tensor([0.5, -1.25, float("inf")], dtype=torch.float16)
    sd["bf16"] = torch.tensor([1.5, -2.0, float("nan")], dtype=torch.bfloat16)
    sd["i8"] = torch.tensor([-128, 127], dtype=torch.int8)
    sd["u8"] = torch.tensor([0, 255], dtype=torch.uint8)
    sd["i16"] = torch.tensor([-3, 4], dtype=torch.int16)
    sd["i32"] = torch.tensor([[1, -2]], dtype=torch.int32)
    sd["i64"] = torch.tensor(2**40)
    sd["u16"] = torch.tensor([1, 65535], dtype=torch.uint16)
    sd["u32"] = torch.tensor([7], dtype=torch.uint32)
    sd["bool"] = torch.tensor([True, False, True])
    sd["param"] = torch.nn.Parameter(torch.ones(2, 2))
    sd["transposed"] = base.T
    sd["rows"] = base[1:]
    sd["expanded"] = torch.ones(1, 3).expand(2, 3)
    sd["empty"] = torch.zeros(0, 2)
    return {"model": sd, "epoch": 3, "names": ["a", "b"], "nested": (1, {"t": torch.ones(2, dtype=torch.float16)})}


TORCH_TO_EMBER: dict[Any, DType] = {}


def _torch_bits(t: Any) -> np.ndarray:
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_load_matches_torch_save(tmp_path: Any, zip_format: bool) -> None:
    torch = pytest.importorskip("torch")
    TORCH_TO_EMBER.update({torch.float32: dtypes.float32, torch.float64: dtypes.float64, torch.float16: dtypes.float16,
                           torch.bfloat16: dtypes.bfloat16, torch.int8: dtypes.int8, torch.uint8: dtypes.uint8,
                           torch.int16: dtypes.int16, torch.int32: dtypes.int32, torch.int64: dtypes.int64,
                           torch.uint16: dtypes.uint16, torch.uint32: dtypes.uint32, torch.bool: dtypes.bool})
    ref = _torch_reference(torch)
    path = tmp_path / "ckpt.pt"
    torch.save(ref, path, _use_new_zipfile_serialization=zip_format)
    out = torch_load(path)
    assert out["epoch"] == 3 and out["names"] == ["a", "b"] and out["nested"][0] == 1
    assert isinstance(out["model"], collections.OrderedDict) and list(out["model"]) == list(ref["model"])
    pairs = [*((k, v, ref["model"][k]) for k, v in out["model"].items()), ("nested", out["nested"][1]["t"],
                                                                          ref["nested"][1]["t"])]
    for k, got, want in pairs:
        assert got.shape == tuple(want.shape), k
        assert got.dtype == TORCH_TO_EMBER[want.dtype], k
        assert bits_equal(stored_bits(got.to(Device.DEFAULT).realize()), _torch_bits(want)), k
    # contiguous tensors are zero-copy views of the file; strided ones were rebuilt on the host
    assert out["model"]["f32"].device == f"DISK:{path}" and out["model"]["rows"].device == f"DISK:{path}"
    assert out["model"]["transposed"].device == Device.DEFAULT


def test_torch_load_into_a_model(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(3, 2)
    path = tmp_path / "linear.pth"
    torch.save(layer.state_dict(), path)
    net = Linear(3, 2)
    load_state_dict(net, torch_load(path))
    np.testing.assert_array_equal(net.weight.numpy(), layer.weight.detach().numpy())
    np.testing.assert_array_equal(net.bias.numpy(), layer.bias.detach().numpy())


def _zip_checkpoint(path: Any, pickled: bytes, storages: dict[str, bytes] | None = None) -> Any:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickled)
        zf.writestr("archive/byteorder", "little")
        for key, data in (storages or {}).items():
            zf.writestr(f"archive/data/{key}", data)
        zf.writestr("archive/version", "3\n")
    return path


class _Evil:
    def __reduce__(self) -> Any:
        return (os.system, ("echo pwned",))


def test_torch_load_refuses_arbitrary_globals(tmp_path: Any) -> None:
    path = _zip_checkpoint(tmp_path / "evil.pt", pickle.dumps({"w": _Evil()}, protocol=2))
    with pytest.raises(TorchLoadError, match=r"evil\.pt: refusing to unpickle the global (posix|nt|os)\.system"):
        torch_load(path)
    legacy = tmp_path / "evil_legacy.pt"
    legacy.write_bytes(b"".join(pickle.dumps(x, protocol=2) for x in (0x1950A86A20F9469CFC6C, 1001, {})) +
                       pickle.dumps(_Evil(), protocol=2))
    with pytest.raises(TorchLoadError, match="refusing to unpickle"):
        torch_load(legacy)


def test_torch_load_refuses_a_whole_module(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(TorchLoadError, match=r"torch\.nn\.modules\.linear\.Linear.*state_dict"):
        torch_load(path)


@pytest.mark.parametrize("content", [b"", b"hello, I am a text file", pickle.dumps({"a": 1}, protocol=2)])
def test_torch_load_refuses_files_that_are_not_checkpoints(tmp_path: Any, content: bytes) -> None:
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(TorchLoadError, match=r"x\.pt: not a PyTorch checkpoint"):
        torch_load(path)
    zipped = tmp_path / "y.pt"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("readme.txt", "no pickle here")
    with pytest.raises(TorchLoadError, match=r"y\.pt: a zip archive, but not a torch checkpoint"):
        torch_load(zipped)


def test_torch_load_truncated_or_missing_storage_names_the_tensor(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    sd = {"a": torch.ones(4), "b": torch.ones(1000)}
    full = tmp_path / "full.pt"
    torch.save(sd, full)
    with zipfile.ZipFile(full) as zf:
        pkl = zf.read("full/data.pkl")
        storages = {n.rsplit("/", 1)[1]: zf.read(n) for n in zf.namelist() if "/data/" in n}
    missing = _zip_checkpoint(tmp_path / "missing.pt", pkl, {k: v for k, v in storages.items() if len(v) == 16})
    with pytest.raises(TorchLoadError, match=r"missing\.pt: tensor 'b'.*missing from the file"):
        torch_load(missing)
    legacy = tmp_path / "legacy.pt"
    torch.save(sd, legacy, _use_new_zipfile_serialization=False)
    legacy.write_bytes(legacy.read_bytes()[:-100])
    with pytest.raises(TorchLoadError, match=r"legacy\.pt: tensor '[ab]'.*truncated"):
        torch_load(legacy)


# =============================================================================================
# GGUF
# =============================================================================================

GGUF_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _gguf_str(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf_value(vtype: int, value: Any) -> bytes:
    if vtype in GGUF_FMT:
        return struct.pack(GGUF_FMT[vtype], value)
    if vtype == 8:
        return _gguf_str(value)
    itype, items = value
    return struct.pack("<IQ", itype, len(items)) + b"".join(_gguf_value(itype, v) for v in items)


def gguf_file(kv: list[tuple[str, int, Any]], tensors: list[tuple[str, tuple[int, ...], int, bytes]],
              version: int = 3, alignment: int = 32, magic: bytes = b"GGUF") -> bytes:
    """A GGUF file from the format description: header, metadata, tensor infos, aligned data."""
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(kv)))
    for key, vtype, value in kv:
        out += _gguf_str(key) + struct.pack("<I", vtype) + _gguf_value(vtype, value)
    data, offsets = bytearray(), []
    for _, _, _, raw in tensors:
        data += bytes(-len(data) % alignment)
        offsets.append(len(data))
        data += raw
    for (name, shape, ggml_type, _), off in zip(tensors, offsets):
        out += _gguf_str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in reversed(shape))
        out += struct.pack("<IQ", ggml_type, off)
    out += bytes(-len(out) % alignment)
    return bytes(out + data)


def _f16(x: float) -> bytes:
    return np.float16(x).tobytes()


def _random_blocks(rng: np.random.Generator, n: int, size: int, scales: list[tuple[int, int]]) -> bytes:
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for a, b in scales:  # finite float16 scale fields
        raw[:, a:b] = np.ascontiguousarray(rng.normal(size=(n, 1)).astype(np.float16)).view(np.uint8)
    return raw.tobytes()


def _half(raw: bytes, at: int) -> np.float32:
    return np.float32(np.frombuffer(raw[at:at + 2], "<f2")[0])


def ref_q8_0(raw: bytes) -> np.ndarray:
    out = []
    for blk in range(len(raw) // 34):
        b = raw[34 * blk:34 * blk + 34]
        d = _half(b, 0)
        out += [d * np.float32(q) for q in struct.unpack("<32b", b[2:34])]
    return np.array(out, np.float32)


def ref_q4_0(raw: bytes) -> np.ndarray:
    out = []
    for blk in range(len(raw) // 18):
        b = raw[18 * blk:18 * blk + 18]
        d = _half(b, 0)
        out += [d * np.float32((b[2 + j] & 0xF) - 8) for j in range(16)]
        out += [d * np.float32((b[2 + j] >> 4) - 8) for j in range(16)]
    return np.array(out, np.float32)


def ref_q4_1(raw: bytes) -> np.ndarray:
    out = []
    for blk in range(len(raw) // 20):
        b = raw[20 * blk:20 * blk + 20]
        d, m = _half(b, 0), _half(b, 2)
        out += [d * np.float32(b[4 + j] & 0xF) + m for j in range(16)]
        out += [d * np.float32(b[4 + j] >> 4) + m for j in range(16)]
    return np.array(out, np.float32)


def ref_q6_k(raw: bytes) -> np.ndarray:
    out = np.zeros(len(raw) // 210 * 256, np.float32)
    for blk in range(len(raw) // 210):
        b = raw[210 * blk:210 * blk + 210]
        ql, qh, sc, d = b[0:128], b[128:192], struct.unpack("<16b", b[192:208]), _half(b, 208)
        y = 256 * blk
        for n in range(2):  # two halves of 128 values
            for ll in range(32):
                s = n * 8 + ll // 16
                q1 = ((ql[64 * n + ll] & 0xF) | (((qh[32 * n + ll] >> 0) & 3) << 4)) - 32
                q2 = ((ql[64 * n + ll + 32] & 0xF) | (((qh[32 * n + ll] >> 2) & 3) << 4)) - 32
                q3 = ((ql[64 * n + ll] >> 4) | (((qh[32 * n + ll] >> 4) & 3) << 4)) - 32
                q4 = ((ql[64 * n + ll + 32] >> 4) | (((qh[32 * n + ll] >> 6) & 3) << 4)) - 32
                for k, q in enumerate((q1, q2, q3, q4)):
                    out[y + 128 * n + 32 * k + ll] = d * np.float32(sc[s + 2 * k]) * np.float32(q)
    return out


def ref_q4_k(raw: bytes) -> np.ndarray:
    def scale_min(j: int, q: bytes) -> tuple[int, int]:
        if j < 4:
            return q[j] & 63, q[j + 4] & 63
        return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)

    out = []
    for blk in range(len(raw) // 144):
        b = raw[144 * blk:144 * blk + 144]
        d, dmin, scales, qs = _half(b, 0), _half(b, 2), b[4:16], b[16:144]
        for c in range(4):
            s1, m1 = scale_min(2 * c, scales)
            s2, m2 = scale_min(2 * c + 1, scales)
            chunk = qs[32 * c:32 * c + 32]
            out += [d * np.float32(s1) * np.float32(q & 0xF) - dmin * np.float32(m1) for q in chunk]
            out += [d * np.float32(s2) * np.float32(q >> 4) - dmin * np.float32(m2) for q in chunk]
    return np.array(out, np.float32)


@pytest.mark.parametrize("version, alignment", [(3, 32), (2, 64)])
def test_gguf_load_metadata_and_tensors(tmp_path: Any, version: int, alignment: int) -> None:
    rng = np.random.default_rng(version)
    f32 = rng.normal(size=(2, 3, 32)).astype(np.float32)
    f16 = rng.normal(size=(4, 8)).astype(np.float16)
    i32 = np.arange(5, dtype=np.int32) - 2
    q8 = _random_blocks(rng, 4, 34, [(0, 2)])
    q40 = _random_blocks(rng, 2, 18, [(0, 2)])
    q41 = _random_blocks(rng, 2, 20, [(0, 2), (2, 4)])
    q6k = _random_blocks(rng, 2, 210, [(208, 210)])
    q4k = _random_blocks(rng, 1, 144, [(0, 2), (2, 4)])
    kv = [("general.architecture", 8, "llama"), ("u8", 0, 200), ("i8", 1, -5), ("u16", 2, 60000), ("i16", 3, -300),
          ("u32", 4, 7), ("i32", 5, -7), ("f32", 6, 0.5), ("flag", 7, True), ("u64", 10, 2**40), ("i64", 11, -(2**40)),
          ("f64", 12, 0.125), ("ints", 9, (5, [1, 2, 3])), ("tokens", 9, (8, ["a", "bé", ""])),
          ("nested", 9, (9, [(4, [1]), (4, [2, 3])]))]
    if alignment != 32:
        kv.append(("general.alignment", 4, alignment))
    tensors = [("f32", f32.shape, 0, f32.tobytes()), ("f16", f16.shape, 1, f16.tobytes()),
               ("i32", i32.shape, 26, i32.tobytes()), ("q8_0", (2, 64), 8, q8), ("q4_0", (64,), 2, q40),
               ("q4_1", (1, 64), 3, q41), ("q6_k", (2, 256), 14, q6k), ("q4_k", (256,), 12, q4k)]
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_file(kv, tensors, version=version, alignment=alignment))
    meta, loaded = gguf_load(path)
    assert meta["general.architecture"] == "llama" and meta["u8"] == 200 and meta["i8"] == -5
    assert meta["u16"] == 60000 and meta["i16"] == -300 and meta["u32"] == 7 and meta["i32"] == -7
    assert meta["f32"] == 0.5 and meta["flag"] is True and meta["u64"] == 2**40 and meta["i64"] == -(2**40)
    assert meta["f64"] == 0.125 and meta["ints"] == [1, 2, 3] and meta["tokens"] == ["a", "bé", ""]
    assert meta["nested"] == [[1], [2, 3]]
    assert list(loaded) == [t[0] for t in tensors]
    for name, arr in (("f32", f32), ("f16", f16), ("i32", i32)):  # plain types: zero-copy, own dtype
        assert loaded[name].device == f"DISK:{path}"
        assert bits_equal(loaded[name].numpy(), arr), name
    expected = {"q8_0": ref_q8_0(q8).reshape(2, 64), "q4_0": ref_q4_0(q40), "q4_1": ref_q4_1(q41).reshape(1, 64),
                "q6_k": ref_q6_k(q6k).reshape(2, 256), "q4_k": ref_q4_k(q4k)}
    for name, want in expected.items():
        got = loaded[name]
        assert got.dtype == dtypes.float32 and got.shape == want.shape, name
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=0, err_msg=name)
    # tinygrad's helper: raw blocks in a uint8 tensor
    np.testing.assert_allclose(ggml_data_to_tensor(Tensor(np.frombuffer(q8, np.uint8)), 128, 8).numpy(),
                               ref_q8_0(q8), rtol=1e-6)


def test_gguf_dequantization_matches_the_reference_package() -> None:
    gguf = pytest.importorskip("gguf")
    from ember.nn.gguf import _DEQUANT, GGML_TYPES, ggml_dequantize

    rng = np.random.default_rng(3)
    scale_fields = {2: [(0, 2)], 3: [(0, 2), (2, 4)], 6: [(0, 2)], 7: [(0, 2), (2, 4)], 8: [(0, 2)],
                    10: [(80, 82), (82, 84)], 11: [(108, 110)], 12: [(0, 2), (2, 4)], 13: [(0, 2), (2, 4)],
                    14: [(208, 210)], 20: [(0, 2)]}
    for t, fields in scale_fields.items():
        assert t in _DEQUANT
        name, block, size = GGML_TYPES[t]
        raw = np.frombuffer(_random_blocks(rng, 5, size, fields), np.uint8).reshape(5, size)
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t)).reshape(-1)
        assert bits_equal(ggml_dequantize(raw.tobytes(), t, 5 * block), want), name


BAD_GGUF = {
    "bad magic": (dict(magic=b"GGML"), "not a GGUF file"),
    "version 1": (dict(version=1), "unsupported GGUF version 1"),
    "version 4": (dict(version=4), "unsupported GGUF version 4"),
    "unknown type": (dict(tensors=[("tok_embd", (32,), 99, bytes(128))]), "'tok_embd' has unknown ggml type 99"),
    "unsupported quant": (dict(tensors=[("attn_q", (256,), 16, bytes(66))]), "'attn_q' uses quantization IQ2_XXS"),
    "partial block": (dict(tensors=[("w", (2, 20), 8, bytes(68))]), "'w'"),
    "too many dims": (dict(tensors=[("w", (1, 1, 1, 1, 2), 0, bytes(8))]), "'w' has 5 dimensions"),
    "bad alignment": (dict(kv=[("general.alignment", 4, 24)]), "power of two"),
}


@pytest.mark.parametrize("case", list(BAD_GGUF))
def test_malformed_gguf_names_the_file_and_the_tensor(tmp_path: Any, case: str) -> None:
    args, part = BAD_GGUF[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(gguf_file(args.get("kv", []), args.get("tensors", [("w", (4,), 0, bytes(16))]),
                               **{k: v for k, v in args.items() if k in ("version", "magic")}))
    with pytest.raises(GGUFError) as info:
        gguf_load(path)
    assert str(path) in str(info.value) and part in str(info.value)
    assert isinstance(info.value, WeightsFormatError)


def test_truncated_gguf(tmp_path: Any) -> None:
    good = gguf_file([("name", 8, "x")], [("a", (8,), 0, bytes(32)), ("b", (64,), 0, bytes(256))])
    path = tmp_path / "cut.gguf"
    path.write_bytes(good[:-10])
    with pytest.raises(GGUFError, match=r"cut\.gguf: tensor 'b'.*truncated"):
        gguf_load(path)
    path.write_bytes(good[:30])
    with pytest.raises(GGUFError, match=r"cut\.gguf: the file ends while reading"):
        gguf_load(path)


def test_loaders_reject_what_they_cannot_open(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError):
        safe_load(tmp_path / "nope.safetensors")
    with pytest.raises(TypeError, match="file name"):
        safe_load(12)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="uint8"):
        torch_load(Tensor([1.0, 2.0]))


def test_weights_formats_load_on_first_use():
    # `from ember import nn` builds and trains models without the gguf / safetensors / torch readers; nn.state and
    # its names still resolve (then the readers are imported)
    import subprocess
    import sys

    code = ("import sys; from ember import nn; before = 'ember.nn.state' in sys.modules; "
            "from ember.nn import get_parameters; print(before, nn.state.get_parameters is get_parameters, "
            "'ember.nn.gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]
