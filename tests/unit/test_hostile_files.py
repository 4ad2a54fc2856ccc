"""Hostile files: deeply nested weights-file headers raise the format's clear error (not RecursionError), an
allocation that does not fit raises MemoryError naming the size and the device, torch checkpoints of shared
references, deflate bombs and stride-0 views load quickly in little memory or are refused, hostile shapes in every
weights format name the file and the tensor, and a kernel corpus file cannot run code."""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ember import Device, Tensor
from ember.engine.corpus import load_corpus
from ember.ir.uop import Ops
from ember.nn.gguf import gguf_load
from ember.nn.safetensors import safe_load, safe_load_metadata
from ember.nn.torch_load import torch_load
from ember.nn.weights import GGUFError, SafetensorsError, TorchLoadError


def _safetensors(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize("opener, closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_deeply_nested_safetensors_header(opener: bytes, closer: bytes):
    deep = b'{"x": ' + opener * 200_000 + b"0" + closer * 200_000 + b"}"
    with pytest.raises(SafetensorsError, match="nests JSON .* too deeply"):
        safe_load(_safetensors(deep))


def test_shallow_safetensors_header_still_loads():
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    out = safe_load(_safetensors(header) + struct.pack("<2f", 1.5, -2.0))
    assert out["w"].to(Device.DEFAULT).tolist() == [1.5, -2.0]


def _gguf_with_value(value: bytes) -> bytes:
    key = b"deep.key"
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<I", 9) + value)


def test_deeply_nested_gguf_arrays():
    depth = 100_000
    nested = struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)  # arrays of one array ... of no uint32
    with pytest.raises(GGUFError, match="nests arrays more than 16 deep"):
        gguf_load(_gguf_with_value(nested))


def test_gguf_claiming_more_arrays_than_bytes():
    with pytest.raises(GGUFError, match="claims 1000000000000 arrays"):
        gguf_load(_gguf_with_value(struct.pack("<IQ", 9, 10 ** 12)))


def test_shallow_gguf_arrays_still_load():
    value = struct.pack("<IQ", 9, 2) + (struct.pack("<IQ", 4, 2) + struct.pack("<2I", 7, 8)) * 2
    metadata, tensors = gguf_load(_gguf_with_value(value))
    assert metadata["deep.key"] == [[7, 8], [7, 8]] and tensors == {}


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_huge_allocation_names_size_and_device(dev: str):
    if dev not in Device.available():
        pytest.skip(f"{dev} is not usable here: {Device.probe(dev)}")
    with pytest.raises(MemoryError, match=rf"cannot allocate 4398046511104 bytes \(4096.00 GiB\) on {dev}"):
        (Tensor.empty(2 ** 40, device=dev) + 1).realize()


# ---------------------------------------------------------------------------------------------------------------
# torch checkpoints built by hand (torch need not be installed): a pickle names torch's globals as text
# ---------------------------------------------------------------------------------------------------------------


class _Global:
    """A global of a checkpoint's pickle, written by name."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *args: Any) -> Any:  # the pickler checks that a reduce function is callable
        raise NotImplementedError


class _Pid:
    def __init__(self, pid: tuple):
        self.pid = pid


class _Rec:
    """A tensor of a torch checkpoint: its storage (key, element count) and its size, stride and offset."""

    def __init__(self, key: str, numel: Any, offset: Any, size: Any, stride: Any, storage: str = "FloatStorage"):
        self.st = _Pid(("storage", _Global("torch", storage), key, "cpu", numel))
        self.offset, self.size, self.stride = offset, size, stride

    def __reduce__(self) -> Any:
        return _Global("torch._utils", "_rebuild_tensor_v2"), (self.st, self.offset, self.size, self.stride, False,
                                                               None)


class _CheckpointPickler(pickle._Pickler):  # type: ignore[misc,name-defined]
    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def _save_global(self, obj: _Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    dispatch[_Global] = _save_global

    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, _Pid) else None


def _checkpoint(obj: Any, storages: dict[str, bytes], compress: bool = False, byteorder: str = "little") -> bytes:
    f = io.BytesIO()
    _CheckpointPickler(f, protocol=2).dump(obj)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", f.getvalue(), zipfile.ZIP_STORED)
        zf.writestr("archive/byteorder", byteorder, zipfile.ZIP_STORED)
        for key, data in storages.items():
            zf.writestr(f"archive/data/{key}", data)
    return out.getvalue()


def _write(tmp_path: Any, name: str, data: bytes) -> Any:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_torch_shared_references_load_once(tmp_path):
    # L[i] = [L[i-1], L[i-1]], 40 deep: a few hundred bytes, 2**40 paths to the one tensor
    level: Any = [_Rec("0", 2, 0, (2,), (1,))]
    for _ in range(40):
        level = [level, level]
    path = _write(tmp_path, "dag.pth", _checkpoint(level, {"0": struct.pack("<2f", 1.5, -2.0)}))
    assert path.stat().st_size < 1000
    start = time.perf_counter()
    out = torch_load(path)
    assert time.perf_counter() - start < 30  # 2**40 paths never end; a DAG loaded once is instant
    node = out
    for _ in range(40):  # shared in the file, shared in the result
        assert node[0] is node[1]
        node = node[0]
    assert node[0].to(Device.DEFAULT).tolist() == [1.5, -2.0]


def test_torch_container_holding_itself(tmp_path):
    box: list = [_Rec("0", 1, 0, (1,), (1,))]
    box.append(box)
    out = torch_load(_write(tmp_path, "cycle.pth", _checkpoint(box, {"0": struct.pack("<f", 3.0)})))
    assert out[1] is out and out[0].to(Device.DEFAULT).tolist() == [3.0]


def test_torch_deflate_bomb_is_refused_before_inflating(tmp_path):
    # 64 MiB of zeros deflate to 64 KiB; the storage record says the storage holds 4 floats
    data = _checkpoint({"w": _Rec("0", 4, 0, (4,), (1,))}, {"0": bytes(64 << 20)}, compress=True)
    path = _write(tmp_path, "bomb.pth", data)
    assert len(data) < 200_000
    with pytest.raises(TorchLoadError, match=r"bomb\.pth: storage '0' \(member archive/data/0, used by tensor 'w'\): "
                                             r"the member inflates to 67108864 bytes, but the storage record "
                                             r"declares 16 bytes"):
        _peak_bytes(lambda: torch_load(path))


def test_torch_compressed_storage_inflates_only_what_its_tensors_read(tmp_path):
    # a 16 MiB storage (record and member agree) of which the one tensor reads 3 floats
    storage = np.zeros(4 << 20, dtype="<f4")
    storage[:4] = [0.0, 1.0, 2.0, 3.0]
    data = _checkpoint({"w": _Rec("0", 4 << 20, 1, (3,), (1,))}, {"0": storage.tobytes()}, compress=True)
    out, peak = _peak_bytes(lambda: torch_load(_write(tmp_path, "big.pth", data)))
    assert out["w"].to(Device.DEFAULT).tolist() == [1.0, 2.0, 3.0]
    assert peak < 1 << 20, f"{peak} bytes allocated to read 16 bytes"


def test_torch_compressed_member_that_lies_about_its_size(tmp_path):
    # the zip directory says 16 bytes, the deflate stream holds 64 MiB: never more than 16 bytes are inflated
    data = bytearray(_checkpoint({"w": _Rec("0", 4, 0, (4,), (1,))}, {"0": bytes(64 << 20)}, compress=True))
    for sig, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local header and central directory sizes
        pos = data.rfind(sig)  # the storage member is the last one written
        assert struct.unpack_from("<I", data, pos + at)[0] == 64 << 20
        struct.pack_into("<I", data, pos + at, 16)
    path = _write(tmp_path, "liar.pth", bytes(data))
    try:
        out, peak = _peak_bytes(lambda: torch_load(path))
    except TorchLoadError as e:  # a CRC mismatch is fine too, as long as it names the file and storage
        assert "liar.pth: storage '0'" in str(e)
    else:
        assert out["w"].to(Device.DEFAULT).tolist() == [0.0] * 4 and peak < 1 << 20


def test_torch_stride_zero_tensor_stays_a_view(tmp_path):
    path = _write(tmp_path, "expand.pth", _checkpoint({"w": _Rec("0", 1, 0, (2 ** 28,), (0,))},
                                                      {"0": struct.pack("<f", 2.5)}))
    out, peak = _peak_bytes(lambda: torch_load(path))
    w = out["w"]
    assert w.shape == (2 ** 28,) and peak < 1 << 20, f"{peak} bytes allocated for a 4-byte storage"
    assert w[:3].numpy().tolist() == [2.5] * 3 and w[-2:].numpy().tolist() == [2.5] * 2


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_torch_overlapping_and_transposed_tensors(tmp_path, byteorder: str):
    base = np.arange(12, dtype=np.float32)
    raw = base.astype(">f4" if byteorder == "big" else "<f4").tobytes()
    recs = {"windows": _Rec("0", 12, 2, (3, 4), (1, 1)), "t": _Rec("0", 12, 0, (4, 3), (1, 4)),
            "rows": _Rec("0", 12, 1, (2, 3, 2), (0, 4, 1))}
    out = torch_load(_write(tmp_path, "views.pth", _checkpoint(recs, {"0": raw}, byteorder=byteorder)))
    for name, rec in recs.items():
        want = np.lib.stride_tricks.as_strided(base[rec.offset:], rec.size, tuple(4 * s for s in rec.stride))
        np.testing.assert_array_equal(out[name].numpy(), want, err_msg=name)


def test_torch_tensors_saved_by_torch_as_views(tmp_path):
    torch = pytest.importorskip("torch")
    src = {"expand": torch.tensor([1.5]).expand(1 << 16), "windows": torch.arange(6.0).as_strided((3, 4), (1, 1)),
           "t": torch.arange(12.0).reshape(3, 4).t()}
    src["same"] = src["t"]
    path = tmp_path / "views.pth"
    torch.save(src, path)
    out = torch_load(path)
    ref = torch.load(path)
    for name in src:
        np.testing.assert_array_equal(out[name].numpy(), ref[name].numpy(), err_msg=name)
    assert out["same"] is out["t"]


_BAD_TORCH = {
    "negative size": (_Rec("0", 4, 0, (-1,), (1,)), r"negative size"),
    "huge size": (_Rec("0", 1, 0, (2 ** 62, 2 ** 62), (0, 0)), r"more than a tensor can have"),
    "size not integers": (_Rec("0", 4, 0, ("a",), (1,)), r"malformed size"),
    "size not a tuple": (_Rec("0", 4, 0, None, (1,)), r"malformed size"),
    "stride of another rank": (_Rec("0", 4, 0, (2, 2), (1,)), r"malformed size"),
    "reads past the storage": (_Rec("0", 4, 0, (5,), (1,)), r"reads past the end of its storage '0' \(16 bytes\)"),
    "negative storage": (_Rec("0", -4, 0, (1,), (1,)), r"malformed storage reference"),
}


@pytest.mark.parametrize("case", list(_BAD_TORCH))
def test_torch_hostile_shapes_name_file_and_tensor(tmp_path, case: str):
    rec, message = _BAD_TORCH[case]
    path = _write(tmp_path, "shapes.pth", _checkpoint({"layer": {"w": rec}}, {"0": bytes(16)}))
    with pytest.raises(TorchLoadError, match=rf"shapes\.pth: tensor 'layer\.w': .*{message}"):
        torch_load(path)


# ---------------------------------------------------------------------------------------------------------------
# safetensors and GGUF shapes
# ---------------------------------------------------------------------------------------------------------------


def _safetensors_file(entry: Any, data: bytes) -> bytes:
    return _safetensors(json.dumps({"w": entry}).encode()) + data


_BAD_SAFE = {
    "negative": ([-1], "shape must be a list of integers >= 0"),
    "not integers": (["4"], "shape must be a list of integers >= 0"),
    "an object for a shape": ({}, r"shape must be a list of integers >= 0, got \{\}"),
    "huge": ([0, 2 ** 64], "has a dimension larger than"),
    "not matching the data": ([5], r"needs 20 bytes, but data_offsets \[0, 16\] span 16 bytes"),
    "huge, not matching": ([2 ** 40, 2 ** 40], r"needs \d+ bytes, but data_offsets \[0, 16\] span 16 bytes"),
}


@pytest.mark.parametrize("case", list(_BAD_SAFE))
def test_safetensors_hostile_shapes_name_file_and_tensor(tmp_path, case: str):
    shape, message = _BAD_SAFE[case]
    path = _write(tmp_path, "shapes.safetensors",
                  _safetensors_file({"dtype": "F32", "shape": shape, "data_offsets": [0, 16]}, bytes(16)))
    with pytest.raises(SafetensorsError, match=rf"shapes\.safetensors: tensor 'w': .*{message}"):
        safe_load(path)


@pytest.mark.parametrize("header", [b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                                    b'"w": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}',
                                    b'{"w": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}'])
def test_safetensors_duplicate_keys_are_refused(header: bytes):
    with pytest.raises(SafetensorsError, match="lists 'w' twice|lists 'dtype' twice"):
        safe_load(_safetensors(header) + bytes(4))


def test_safetensors_entries_in_any_key_order_and_metadata():
    header = (b'{"__metadata__": {"format": "pt"}, "b": {"shape": [2], "data_offsets": [8, 16], "dtype": "I32"}, '
              b'"a": {"data_offsets": [0, 8], "dtype": "F32", "shape": [2], "extra": 1}}')
    data = struct.pack("<2f2i", 1.0, 2.0, 3, 4)
    out = safe_load(_safetensors(header) + data)
    assert list(out) == ["b", "a"]
    assert out["a"].to(Device.DEFAULT).tolist() == [1.0, 2.0] and out["b"].to(Device.DEFAULT).tolist() == [3, 4]
    _, start, raw = safe_load_metadata(_safetensors(header) + data)
    assert raw == json.loads(header) and start == 8 + len(header)


def test_safetensors_many_tensors_check_every_entry():
    n = 20_000
    header = {f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n)}
    _, _, raw = safe_load_metadata(_safetensors(json.dumps(header).encode()) + bytes(n))
    assert raw == header
    for i, bad in ((n - 1, {"shape": [2]}), (n // 2, {"data_offsets": [n // 2, n // 2 + 1, 0]}), (7, {"dtype": 8})):
        broken = {**header, f"t{i}": {**header[f"t{i}"], **bad}}  # one bad entry among many is found, by name
        with pytest.raises(SafetensorsError, match=rf"tensor 't{i}': "):
            safe_load_metadata(_safetensors(json.dumps(broken).encode()) + bytes(n))


def _gguf_tensor(dims: list[int], ggml_type: int, data: bytes) -> bytes:
    name = b"w"
    out = (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", len(name)) + name
           + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
           + struct.pack("<IQ", ggml_type, 0))
    return out + bytes(-len(out) % 32) + data


_BAD_GGUF = {
    "huge": ([2 ** 32, 2 ** 32], 0, "is larger than a tensor can be"),
    "huge, with a zero": ([2 ** 64 - 1, 0], 0, "is larger than a tensor can be"),
    "quantized huge, with a zero": ([0, 2 ** 64 - 1], 2, "is larger than a tensor can be"),
    "quantized scalar": ([], 2, "rows of 1 elements are not whole Q4_0 blocks of 32"),
    "not matching the data": ([64], 0, "its 256 bytes at data offset 0 run past the end of the file"),
}


@pytest.mark.parametrize("case", list(_BAD_GGUF))
def test_gguf_hostile_shapes_name_file_and_tensor(tmp_path, case: str):
    dims, ggml_type, message = _BAD_GGUF[case]
    path = _write(tmp_path, "shapes.gguf", _gguf_tensor(dims, ggml_type, bytes(64)))
    with pytest.raises(GGUFError, match=rf"shapes\.gguf: tensor 'w'.*{message}"):
        gguf_load(path)


# ---------------------------------------------------------------------------------------------------------------
# kernel corpus files
# ---------------------------------------------------------------------------------------------------------------


class _Planted:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_corpus_file_cannot_run_code(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "1.pkl").write_bytes(pickle.dumps(_Planted(str(marker))))
    with pytest.raises(ValueError, match=r"1\.pkl: a record names (posix|nt|os)\.system.*refusing"):
        load_corpus(folder)
    assert not marker.exists()


def test_corpus_record_cannot_rewrite_live_objects(tmp_path):
    # NEWOBJ + BUILD on a class the corpus does allow: the state lands in an inert stand-in, never on Ops.ADD
    folder = tmp_path / "corpus"
    folder.mkdir()
    evil = (b"\x80\x02cember.ir.uop\nOps\n" + pickle.dumps(Ops.ADD.value, protocol=2)[2:-1] + b"\x85R"
            + b"}U\x06_name_U\x06HACKED\x73b.")
    (folder / "1.pkl").write_bytes(evil)
    assert load_corpus(folder) == []  # a record that is no UOp is skipped, as before
    assert Ops.ADD.name == "ADD"


def test_corpus_malformed_records_are_refused(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    # a UOp whose sources are not UOps
    bad = b"\x80\x02cember.ir.uop\nUOp\n(cember.ir.uop\nOps\nK\x01\x85RNK\x05\x85Ntb."
    (folder / "1.pkl").write_bytes(bad.replace(b"tb.", b"tR."))
    with pytest.raises(ValueError, match=r"1\.pkl: malformed record: the sources of a node"):
        load_corpus(folder)


def test_corpus_record_nesting_views_deeply_is_refused(tmp_path):
    # a node whose arg is a view whose size is a node whose arg is a view ... 5000 deep
    def name(module: str, attr: str) -> bytes:
        return f"c{module}\n{attr}\n".encode()

    const = name("ember.ir.uop", "Ops") + b"K" + bytes([Ops.CONST.value]) + b"\x85R"
    body = b"K\x01"
    for _ in range(5000):
        view = (name("ember.ir.shapetracker", "View") + b")\x81}(U\x05shape" + body + b"\x85U\x07stridesK\x00\x85"
                b"U\x06offsetK\x00U\x04maskNU\x0acontiguous\x89ub")
        tracker = name("ember.ir.shapetracker", "ShapeTracker") + b")\x81}U\x05views" + view + b"\x85sb"
        body = name("ember.ir.uop", "UOp") + b"(" + const + b"N)" + tracker + b"tR"
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "1.pkl").write_bytes(b"\x80\x02" + body + b".")
    with pytest.raises(ValueError, match=r"1\.pkl: malformed record: its args nest too deeply"):
        load_corpus(folder)
