"""Deeply nested weights-file headers raise the format's clear error (not RecursionError), and an allocation that
does not fit raises MemoryError naming the size and the device."""
from __future__ import annotations

import json
import struct

import pytest

from ember import Device, Tensor
from ember.nn.gguf import gguf_load
from ember.nn.safetensors import safe_load
from ember.nn.weights import GGUFError, SafetensorsError


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
