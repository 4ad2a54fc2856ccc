"""``torch_load``: ``.pt``/``.pth`` files written by ``torch.save`` (zip and legacy formats), read without torch.

A restricted unpickler rebuilds only tensors and plain containers and refuses any other global.
"""
from __future__ import annotations

import codecs
import collections
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.dtype import DType, dtypes, to_np_dtype
from ember.helpers import prod
from ember.nn.weights import (
    TorchLoadError,
    _host_tensor,
    _is_int,
    _Source,
    _ViewFile,
)
from ember.tensor import Tensor

# =============================================================================================
# torch_load: .pt / .pth files without torch
# =============================================================================================

_TORCH_STORAGES: dict[str, DType] = {
    "FloatStorage": dtypes.float32, "DoubleStorage": dtypes.float64, "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16, "ByteStorage": dtypes.uint8, "CharStorage": dtypes.int8,
    "ShortStorage": dtypes.int16, "IntStorage": dtypes.int32, "LongStorage": dtypes.int64,
    "BoolStorage": dtypes.bool,
}
_TORCH_DTYPES: dict[str, DType] = {
    "float32": dtypes.float32, "float": dtypes.float32, "float64": dtypes.float64, "double": dtypes.float64,
    "float16": dtypes.float16, "half": dtypes.float16, "bfloat16": dtypes.bfloat16, "uint8": dtypes.uint8,
    "int8": dtypes.int8, "int16": dtypes.int16, "short": dtypes.int16, "int32": dtypes.int32, "int": dtypes.int32,
    "int64": dtypes.int64, "long": dtypes.int64, "bool": dtypes.bool, "uint16": dtypes.uint16,
    "uint32": dtypes.uint32, "uint64": dtypes.uint64,
}
#: torch dtypes ember has no equivalent for: named so the error can say so
_TORCH_OTHER_DTYPES = ("complex32", "complex64", "complex128", "cfloat", "cdouble", "chalf", "qint8", "quint8",
                       "qint32", "quint4x2", "quint2x4", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                       "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16", "uint1",
                       "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "int1", "int2", "int3", "int4")
_TORCH_MAGIC = 0x1950A86A20F9469CFC6C
_TORCH_LEGACY_PROTOCOL = 1001


@dataclass(frozen=True)
class _StorageType:
    name: str
    dtype: DType | None  # None: untyped bytes (UntypedStorage) or a type ember cannot hold
    untyped: bool = False


@dataclass(frozen=True)
class _TorchDType:
    name: str
    dtype: DType | None


@dataclass(frozen=True)
class _Storage:
    key: str
    stype: _StorageType
    numel: int           # elements of stype (bytes when untyped)
    base_offset: int = 0  # elements into the root storage (legacy storage views)


@dataclass(frozen=True)
class _TensorRecord:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: _TorchDType | None


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, *args: Any, **kwargs: Any) -> Any:
    return _TensorRecord(storage, storage_offset, tuple(size), tuple(stride), None)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any, dtype: Any, metadata: Any = None) -> Any:
    return _TensorRecord(storage, storage_offset, tuple(size), tuple(stride), dtype)


def _rebuild_parameter(data: Any, requires_grad: Any = False, backward_hooks: Any = None, *args: Any) -> Any:
    return data


def _torch_global(module: str, name: str) -> Any:
    """The stand-in for an allowed global of a torch checkpoint, or None when it is refused."""
    if module == "torch._utils":
        return {"_rebuild_tensor": _rebuild_tensor, "_rebuild_tensor_v2": _rebuild_tensor,
                "_rebuild_tensor_v3": _rebuild_tensor_v3, "_rebuild_parameter": _rebuild_parameter,
                "_rebuild_parameter_with_state": _rebuild_parameter}.get(name)
    if module in ("torch", "torch.storage") and name in ("UntypedStorage", "_UntypedStorage"):
        return _StorageType(name, None, untyped=True)
    if module == "torch":
        if name.endswith("Storage"):
            return _StorageType(name, _TORCH_STORAGES.get(name))
        if name in _TORCH_DTYPES or name in _TORCH_OTHER_DTYPES:
            return _TorchDType(name, _TORCH_DTYPES.get(name))
        if name == "Size":
            return tuple
        if name == "device":
            return lambda *a: ":".join(str(x) for x in a)
    if module == "collections" and name == "OrderedDict":
        return collections.OrderedDict
    if module in ("builtins", "__builtin__") and name in ("set", "frozenset", "slice", "complex"):
        return {"set": set, "frozenset": frozenset, "slice": slice, "complex": complex}[name]
    if module == "_codecs" and name == "encode":
        return codecs.encode  # how protocol-2 pickles store bytes
    return None


class _TorchUnpickler(pickle.Unpickler):
    """Rebuilds tensors and plain containers only; any other global is refused before it is imported."""

    def __init__(self, file: Any, where: str, persistent: Callable[[Any], Any] | None = None):
        super().__init__(file)
        self._where, self._persistent = where, persistent

    def find_class(self, module: str, name: str) -> Any:
        """The stand-in for an allowed global; raises :class:`TorchLoadError` for any other."""
        obj = _torch_global(module, name)
        if obj is None:
            raise TorchLoadError(
                f"{self._where}: refusing to unpickle the global {module}.{name}: torch_load rebuilds only tensors "
                "and plain containers (save model.state_dict(), not the model object, or load this file with torch)")
        return obj

    def persistent_load(self, pid: Any) -> Any:
        """Resolve a storage reference through the loader's callback."""
        if self._persistent is None:
            raise TorchLoadError(f"{self._where}: unexpected persistent id {pid!r} in a header pickle")
        return self._persistent(pid)


def _storage_from_pid(where: str, pid: Any) -> _Storage:
    if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
        raise TorchLoadError(f"{where}: unsupported persistent id {pid!r} (only tensor storages can be loaded)")
    stype, key, numel = pid[1], str(pid[2]), pid[4]
    if not isinstance(stype, _StorageType) or not _is_int(numel) or numel < 0:
        raise TorchLoadError(f"{where}: malformed storage reference {pid!r}")
    view = pid[5] if len(pid) > 5 else None
    if view is not None:  # legacy format: a storage that is a slice of another one
        if not (isinstance(view, tuple) and len(view) == 3 and _is_int(view[1]) and _is_int(view[2])):
            raise TorchLoadError(f"{where}: malformed storage view {view!r}")
        return _Storage(key, stype, view[2], base_offset=view[1])
    return _Storage(key, stype, numel)


class _StorageTable(dict):
    """The storages a pickle references, by key; called as the unpickler's persistent-id loader."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where

    def __call__(self, pid: Any) -> _Storage:
        st = _storage_from_pid(self.where, pid)
        return self.setdefault(st.key, st)


class _TorchFile:
    """Where each storage's bytes are, and how to turn tensor records into ember tensors."""

    def __init__(self, src: _Source, regions: dict[str, tuple[int, int] | memoryview], little_endian: bool):
        self.src, self.regions, self.little_endian = src, regions, little_endian

    def tensor(self, rec: _TensorRecord, name: str) -> Tensor:
        """The ember tensor for one record: a DISK view when contiguous, else rebuilt on the host."""
        where = f"{self.src.name}: tensor {name!r}"
        st = rec.storage
        if not isinstance(st, _Storage) or not (rec.dtype is None or isinstance(rec.dtype, _TorchDType)):
            raise TorchLoadError(f"{where}: malformed tensor record (storage {st!r}, dtype {rec.dtype!r})")
        if rec.dtype is not None:
            dtype, dname = rec.dtype.dtype, rec.dtype.name
        else:
            dtype, dname = st.stype.dtype, st.stype.name
        if dtype is None:
            raise TorchLoadError(f"{where}: dtype {dname} has no ember equivalent")
        size, stride, offset = rec.size, rec.stride, rec.offset
        if not (all(_is_int(s) and s >= 0 for s in size) and len(stride) == len(size)
                and all(_is_int(s) and s >= 0 for s in stride) and _is_int(offset) and offset >= 0):
            raise TorchLoadError(f"{where}: malformed size {size}, stride {stride} or offset {offset}")
        item = dtype.itemsize
        numel = prod(size)
        span = (sum((s - 1) * t for s, t in zip(size, stride)) + 1) * item if numel else 0
        storage_bytes = st.numel * (1 if st.stype.untyped else item)
        if offset * item + span > storage_bytes:
            raise TorchLoadError(f"{where}: size {size} with stride {stride} at offset {offset} reads past the end "
                                 f"of its storage {st.key!r} ({storage_bytes} bytes)")
        region = self.regions.get(st.key)
        if region is None:
            raise TorchLoadError(f"{where}: its storage {st.key!r} is missing from the file (truncated file?)")
        avail = region[1] if isinstance(region, tuple) else region.nbytes
        first = (st.base_offset + offset) * item  # where element 0 is in the stored bytes
        if first + span > avail:
            raise TorchLoadError(f"{where}: storage {st.key!r} has {avail} bytes in the file, but the tensor needs "
                                 f"{first + span} (truncated file?)")
        contiguous = all(t == c for s, t, c in zip(size, stride, _row_major(size)) if s != 1)
        if numel == 0:
            return self.src.tensor(region[0], size, dtype) if isinstance(region, tuple) else \
                _host_tensor(b"", size, dtype, self.src.host_device())
        if contiguous and self.little_endian and isinstance(region, tuple):
            return self.src.tensor(region[0] + first, size, dtype)
        raw = self.src.view[region[0]:region[0] + region[1]] if isinstance(region, tuple) else region
        npdt = np.dtype(to_np_dtype(dtype)).newbyteorder("<" if self.little_endian else ">")
        arr = np.ndarray(size, dtype=npdt, buffer=raw, offset=first, strides=tuple(t * item for t in stride))
        arr = np.ascontiguousarray(arr.astype(npdt.newbyteorder("=")))
        return _host_tensor(arr.view(np.uint8).reshape(-1), size, dtype, self.src.host_device())

    def materialize(self, obj: Any, path: str = "") -> Any:
        """Replace every tensor record in ``obj`` (dicts, lists, tuples) by a Tensor, naming it by its path."""
        if isinstance(obj, _TensorRecord):
            return self.tensor(obj, path or "<root>")
        if isinstance(obj, dict):
            out = type(obj)() if isinstance(obj, collections.OrderedDict) else {}
            for k, v in obj.items():
                out[k] = self.materialize(v, f"{path}.{k}" if path else str(k))
            return out
        if isinstance(obj, list):
            return [self.materialize(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(self.materialize(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj))
        return obj


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _zip_data_offset(src: _Source, info: zipfile.ZipInfo) -> int:
    """Where the bytes of a stored (uncompressed) zip member start in the file."""
    h = info.header_offset
    local = bytes(src.view[h:h + 30])
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise TorchLoadError(f"{src.name}: corrupt zip: no local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return h + 30 + name_len + extra_len


def _torch_load_zip(src: _Source) -> Any:
    try:
        zf = zipfile.ZipFile(io.BufferedReader(_ViewFile(src.view)))
    except zipfile.BadZipFile as e:
        raise TorchLoadError(f"{src.name}: corrupt zip archive: {e}") from e
    with zf:
        pickles = [n for n in zf.namelist() if n == "data.pkl" or (n.endswith("/data.pkl") and n.count("/") == 1)]
        if len(pickles) != 1:
            raise TorchLoadError(f"{src.name}: a zip archive, but not a torch checkpoint (no single data.pkl found)")
        prefix = pickles[0][:-len("data.pkl")]
        names = set(zf.namelist())
        byteorder = zf.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
        if byteorder not in ("little", "big"):
            raise TorchLoadError(f"{src.name}: unknown byteorder {byteorder!r}")
        storages = _StorageTable(src.name)
        try:
            obj = _TorchUnpickler(zf.open(pickles[0]), src.name, storages).load()
        except TorchLoadError:
            raise
        except Exception as e:
            raise TorchLoadError(f"{src.name}: cannot unpickle {pickles[0]}: {type(e).__name__}: {e}") from e
        regions: dict[str, tuple[int, int] | memoryview] = {}
        for key in storages:
            member = f"{prefix}data/{key}"
            if member not in names:
                continue  # reported with the tensor's name when a tensor uses it
            info = zf.getinfo(member)
            if info.compress_type == zipfile.ZIP_STORED:
                start = _zip_data_offset(src, info)  # a truncated member is reported with its tensor's name
                regions[key] = (start, max(0, min(info.file_size, src.size - start)))
            else:
                regions[key] = memoryview(zf.read(member))
    return _TorchFile(src, regions, byteorder == "little").materialize(obj)


def _torch_load_legacy(src: _Source) -> Any:
    f = io.BufferedReader(_ViewFile(src.view))

    def load(persistent: Callable[[Any], Any] | None = None) -> Any:
        return _TorchUnpickler(f, src.name, persistent).load()

    not_torch = f"{src.name}: not a PyTorch checkpoint (neither a zip archive nor a legacy torch.save pickle)"
    try:
        magic = load()
    except TorchLoadError:
        raise
    except Exception as e:
        raise TorchLoadError(not_torch) from e
    if magic != _TORCH_MAGIC:
        raise TorchLoadError(not_torch)
    storages = _StorageTable(src.name)
    try:
        protocol = load()
        if protocol != _TORCH_LEGACY_PROTOCOL:
            raise TorchLoadError(f"{src.name}: unsupported legacy torch protocol {protocol!r}")
        sys_info = load()
        little = bool(sys_info.get("little_endian", True)) if isinstance(sys_info, dict) else True
        obj = load(storages)
        keys = load()
    except TorchLoadError:
        raise
    except Exception as e:
        raise TorchLoadError(f"{src.name}: corrupt legacy torch checkpoint: {type(e).__name__}: {e}") from e
    pos = f.tell()
    regions: dict[str, tuple[int, int] | memoryview] = {}
    for key in keys if isinstance(keys, list) else []:
        st = storages.get(str(key))
        if st is None:
            raise TorchLoadError(f"{src.name}: the storage list names {key!r}, which no tensor uses")
        if pos + 8 > src.size:
            break  # truncated: the tensors of the storages left are reported by name
        count = int.from_bytes(src.view[pos:pos + 8], "little" if little else "big")
        item = 1 if st.stype.untyped or st.stype.dtype is None else st.stype.dtype.itemsize
        regions[str(key)] = (pos + 8, max(0, min(count * item, src.size - pos - 8)))
        pos += 8 + count * item
    return _TorchFile(src, regions, little).materialize(obj)


def torch_load(fn: Tensor | str | os.PathLike[str] | bytes) -> Any:
    """Load a file written by ``torch.save`` (usually a state dict) without importing torch.

    Reads the zip format (``data.pkl`` + ``data/N`` storages) and the legacy pickle format. The
    pickle is read by a restricted unpickler: only tensor rebuilds, storages, torch dtypes and plain
    containers are allowed, any other global raises :class:`TorchLoadError` before anything is
    imported. Tensors stored contiguously come back as zero-copy DISK views of the file (copy them
    with ``.to()`` or :func:`load_state_dict`); strided ones are rebuilt on the host on the default
    device. Returns the unpickled object with ember tensors in it.
    """
    src = _Source.open(fn)
    head = bytes(src.view[:4])
    if head[:4] == b"PK\x03\x04" or (src.size and zipfile.is_zipfile(io.BufferedReader(_ViewFile(src.view)))):
        return _torch_load_zip(src)
    if head[:1] == b"\x80":
        return _torch_load_legacy(src)
    raise TorchLoadError(f"{src.name}: not a PyTorch checkpoint (neither a zip archive nor a legacy torch.save "
                         f"pickle; it starts with {head!r})")
