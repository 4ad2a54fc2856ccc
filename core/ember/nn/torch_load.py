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
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.dtype import DType, dtypes, to_np_dtype
from ember.helpers import prod
from ember.ir.lazy import base_of
from ember.ir.shapetracker import ShapeTracker, View
from ember.ir.uop import Ops, UOp
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
    bad: str = ""        # why the reference is malformed: reported with the name of a tensor that uses it

    def itemsize(self) -> int:
        """Bytes per element of the stored bytes."""
        return 1 if self.stype.untyped or self.stype.dtype is None else self.stype.dtype.itemsize


@dataclass(frozen=True)
class _TensorRecord:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: _TorchDType | None


def _as_tuple(x: Any) -> Any:
    # a malformed size is kept as it is and refused, with the tensor's name, when the tensor is built
    return tuple(x) if isinstance(x, (tuple, list)) else x


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, *args: Any, **kwargs: Any) -> Any:
    return _TensorRecord(storage, storage_offset, _as_tuple(size), _as_tuple(stride), None)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any, dtype: Any, metadata: Any = None) -> Any:
    return _TensorRecord(storage, storage_offset, _as_tuple(size), _as_tuple(stride), dtype)


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
        # the tensors that use it are not built yet: their names go in the message later
        return _Storage(key, _StorageType("?", None, untyped=True), 0, bad=f"malformed storage reference {pid!r}")
    view = pid[5] if len(pid) > 5 else None
    if view is not None:  # legacy format: a storage that is a slice of another one
        if not (isinstance(view, tuple) and len(view) == 3 and _is_int(view[1]) and _is_int(view[2])
                and view[1] >= 0 and view[2] >= 0):
            return _Storage(key, stype, 0, bad=f"malformed storage view {view!r}")
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


#: the most elements a tensor may have (torch sizes are int64)
_MAX_NUMEL = 2 ** 63 - 1


@dataclass(frozen=True)
class _Layout:
    """A checked tensor record: where its elements are in the stored bytes of its storage."""

    name: str
    dtype: DType
    size: tuple[int, ...]
    stride: tuple[int, ...]
    first: int     # byte of element 0 in the stored bytes of the storage (legacy views included)
    span: int      # bytes from element 0 to the end of the last element (0 for an empty tensor)
    numel: int


def _walk_records(obj: Any) -> list[tuple[_TensorRecord, str]]:
    """Every distinct tensor record in ``obj`` with the path of its first occurrence, each container visited
    once: a pickle shares objects (``L[i] = [L[i-1], L[i-1]]`` is 2 objects per level, but 2**depth paths)."""
    found: dict[int, tuple[_TensorRecord, str]] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        x, path = stack.pop()
        if isinstance(x, _TensorRecord):
            found.setdefault(id(x), (x, path or "<root>"))
            continue
        if id(x) in seen or not (isinstance(x, (dict, list)) or (isinstance(x, tuple) and not hasattr(x, "_fields"))):
            continue
        seen.add(id(x))
        items = list(x.items()) if isinstance(x, dict) else list(enumerate(x))
        stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(items))
    return list(found.values())


class _TorchFile:
    """Where each storage's bytes are, and how to turn tensor records into ember tensors."""

    def __init__(self, src: _Source, little_endian: bool, records: list[tuple[_TensorRecord, str]]):
        self.src, self.little_endian = src, little_endian
        self.regions: dict[str, tuple[int, int] | memoryview] = {}
        self.records = [rec for rec, _ in records]
        self.layouts = {id(rec): self.layout(rec, name) for rec, name in records}
        self.memo: dict[int, Any] = {}

    def needs(self) -> dict[str, tuple[int, str]]:
        """Per storage key: the bytes its tensors read (from the start of its stored bytes), and a tensor's name."""
        out: dict[str, tuple[int, str]] = {}
        for rec in self.records:
            lay = self.layouts[id(rec)]
            if lay.numel and lay.first + lay.span > out.get(rec.storage.key, (0, ""))[0]:
                out[rec.storage.key] = (lay.first + lay.span, lay.name)
        return out

    def layout(self, rec: _TensorRecord, name: str) -> _Layout:
        """Check one record's dtype, size, stride and offset against its storage record."""
        where = f"{self.src.name}: tensor {name!r}"
        st = rec.storage
        if not isinstance(st, _Storage) or not (rec.dtype is None or isinstance(rec.dtype, _TorchDType)):
            raise TorchLoadError(f"{where}: malformed tensor record (storage {st!r}, dtype {rec.dtype!r})")
        if st.bad:
            raise TorchLoadError(f"{where}: its storage {st.key!r}: {st.bad}")
        if rec.dtype is not None:
            dtype, dname = rec.dtype.dtype, rec.dtype.name
        else:
            dtype, dname = st.stype.dtype, st.stype.name
        if dtype is None:
            raise TorchLoadError(f"{where}: dtype {dname} has no ember equivalent")
        size, stride, offset = rec.size, rec.stride, rec.offset
        if not (isinstance(size, tuple) and isinstance(stride, tuple) and all(_is_int(s) for s in size)
                and all(_is_int(s) for s in stride) and len(stride) == len(size) and _is_int(offset)):
            raise TorchLoadError(f"{where}: malformed size {size!r}, stride {stride!r} or offset {offset!r} "
                                 "(expected tuples of integers of the same length and an integer)")
        if any(s < 0 for s in size) or any(t < 0 for t in stride) or offset < 0:
            raise TorchLoadError(f"{where}: negative size, stride or offset: size {size}, stride {stride}, "
                                 f"offset {offset}")
        item = dtype.itemsize
        numel = prod(size)
        if numel > _MAX_NUMEL or any(s > _MAX_NUMEL for s in size):
            raise TorchLoadError(f"{where}: size {size} has {numel} elements, more than a tensor can have")
        span = (sum((s - 1) * t for s, t in zip(size, stride)) + 1) * item if numel else 0
        storage_bytes = st.numel * (1 if st.stype.untyped else item)
        if offset * item + span > storage_bytes:
            raise TorchLoadError(f"{where}: size {size} with stride {stride} at offset {offset} reads past the end "
                                 f"of its storage {st.key!r} ({storage_bytes} bytes)")
        return _Layout(name, dtype, size, stride, (st.base_offset + offset) * item, span, numel)

    def tensor(self, rec: _TensorRecord) -> Tensor:
        """The ember tensor for one record: a DISK view when contiguous, else built on the host from the bytes
        it spans, as a view (a stride-0 or overlapping tensor costs its span, not its size)."""
        lay = self.layouts[id(rec)]
        st, size, dtype = rec.storage, lay.size, lay.dtype
        where = f"{self.src.name}: tensor {lay.name!r}"
        region = self.regions.get(st.key)
        if region is None:
            raise TorchLoadError(f"{where}: its storage {st.key!r} is missing from the file (truncated file?)")
        avail = region[1] if isinstance(region, tuple) else region.nbytes
        if lay.first + lay.span > avail:
            raise TorchLoadError(f"{where}: storage {st.key!r} has {avail} bytes in the file, but the tensor needs "
                                 f"{lay.first + lay.span} (truncated file?)")
        if lay.numel == 0:
            return self.src.tensor(region[0], size, dtype) if isinstance(region, tuple) else \
                _host_tensor(b"", size, dtype, self.src.host_device())
        contiguous = all(t == c for s, t, c in zip(size, lay.stride, _row_major(size)) if s != 1)
        if contiguous and self.little_endian and isinstance(region, tuple):
            return self.src.tensor(region[0] + lay.first, size, dtype)
        start = region[0] if isinstance(region, tuple) else 0
        raw = (self.src.view if isinstance(region, tuple) else region)[start + lay.first:start + lay.first + lay.span]
        if not self.little_endian and dtype.itemsize > 1:
            npdt = np.dtype(to_np_dtype(dtype))
            raw = memoryview(np.frombuffer(raw, dtype=npdt.newbyteorder(">")).astype(npdt.newbyteorder("<")))
        n = lay.span // dtype.itemsize
        flat = _host_tensor(raw, (n,), dtype, self.src.host_device())
        if contiguous:
            return flat.reshape(size)
        base = base_of(flat.lazydata)
        view = View.create(size, lay.stride, 0)
        return Tensor(UOp(Ops.VIEW, dtype, (base,), ShapeTracker((view,))), device=flat.device)

    def materialize(self, obj: Any) -> Any:
        """Replace every tensor record in ``obj`` (dicts, lists, tuples) by a Tensor; shared objects stay shared
        (each is rebuilt once), and a container holding itself is rebuilt holding itself."""
        try:
            return self._materialize(obj)
        except RecursionError:
            raise TorchLoadError(f"{self.src.name}: the pickle nests containers too deeply to rebuild (a state "
                                 "dict nests a few levels)") from None

    def _materialize(self, obj: Any) -> Any:
        if id(obj) in self.memo:
            return self.memo[id(obj)]
        if isinstance(obj, _TensorRecord):
            out: Any = self.tensor(obj)
        elif isinstance(obj, dict):
            out = type(obj)() if isinstance(obj, collections.OrderedDict) else {}
            self.memo[id(obj)] = out
            for k, v in obj.items():
                out[k] = self._materialize(v)
        elif isinstance(obj, list):
            out = []
            self.memo[id(obj)] = out
            out.extend(self._materialize(v) for v in obj)
        elif isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            out = tuple(self._materialize(v) for v in obj)
        else:
            return obj
        self.memo[id(obj)] = out
        return out


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
        tf = _TorchFile(src, byteorder == "little", _walk_records(obj))
        needs = tf.needs()
        for key, st in storages.items():
            member = f"{prefix}data/{key}"
            if member not in names:
                continue  # reported with the tensor's name when a tensor uses it
            info = zf.getinfo(member)
            if info.compress_type == zipfile.ZIP_STORED:
                start = _zip_data_offset(src, info)  # a truncated member is reported with its tensor's name
                tf.regions[key] = (start, max(0, min(info.file_size, src.size - start)))
            else:  # only empty tensors use a storage no tensor needs bytes of: inflate nothing
                tf.regions[key] = _inflate(src, zf, info, st, *needs[key]) if key in needs else memoryview(b"")
    return tf.materialize(obj)


def _inflate(src: _Source, zf: zipfile.ZipFile, info: zipfile.ZipInfo, st: _Storage, need: int,
             name: str) -> memoryview:
    """The first ``need`` bytes of a compressed storage member (what its tensors read), never more.

    A member larger than its storage record says is refused before anything is inflated: deflate packs a
    gigabyte of zeros into a megabyte, and the record, not the archive, says how big a storage is.
    """
    item = st.itemsize()
    declared = st.numel * item
    where = f"{src.name}: storage {st.key!r} (member {info.filename}, used by tensor {name!r})"
    if info.file_size > declared:
        raise TorchLoadError(f"{where}: the member inflates to {info.file_size} bytes, but the storage record "
                             f"declares {declared} bytes ({st.numel} x {item}): refusing to inflate it")
    want = min(need, info.file_size)
    out = bytearray(want)
    try:
        with zf.open(info) as f:
            got = 0
            while got < want:
                chunk = f.read(min(want - got, 1 << 20))  # never asks the decompressor for more than is wanted
                if not chunk:
                    break
                out[got:got + len(chunk)] = chunk
                got += len(chunk)
    except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, RuntimeError, zlib.error) as e:
        raise TorchLoadError(f"{where}: cannot inflate it: {type(e).__name__}: {e}") from e
    return memoryview(out)[:got]


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
    tf = _TorchFile(src, little, _walk_records(obj))
    for key in keys if isinstance(keys, list) else []:
        st = storages.get(str(key))
        if st is None:
            raise TorchLoadError(f"{src.name}: the storage list names {key!r}, which no tensor uses")
        if pos + 8 > src.size:
            break  # truncated: the tensors of the storages left are reported by name
        count = int.from_bytes(src.view[pos:pos + 8], "little" if little else "big")
        item = st.itemsize()
        tf.regions[str(key)] = (pos + 8, max(0, min(count * item, src.size - pos - 8)))
        pos += 8 + count * item
    return tf.materialize(obj)


def torch_load(fn: Tensor | str | os.PathLike[str] | bytes) -> Any:
    """Load a file written by ``torch.save`` (usually a state dict) without importing torch.

    Reads the zip format (``data.pkl`` + ``data/N`` storages) and the legacy pickle format. The
    pickle is read by a restricted unpickler: only tensor rebuilds, storages, torch dtypes and plain
    containers are allowed, any other global raises :class:`TorchLoadError` before anything is
    imported. Tensors stored contiguously come back as zero-copy DISK views of the file (copy them
    with ``.to()`` or :func:`load_state_dict`); strided ones are views, on the default device, of a
    copy of the bytes they span (a stride-0 tensor costs one element). An object the pickle shares is
    rebuilt once and stays shared. A compressed storage member larger than its storage record is
    refused, and only the bytes tensors read are inflated. Returns the unpickled object with ember
    tensors in it.
    """
    src = _Source.open(fn)
    head = bytes(src.view[:4])
    if head[:4] == b"PK\x03\x04" or (src.size and zipfile.is_zipfile(io.BufferedReader(_ViewFile(src.view)))):
        return _torch_load_zip(src)
    if head[:1] == b"\x80":
        return _torch_load_legacy(src)
    raise TorchLoadError(f"{src.name}: not a PyTorch checkpoint (neither a zip archive nor a legacy torch.save "
                         f"pickle; it starts with {head!r})")
