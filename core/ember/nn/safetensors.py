"""The safetensors format: :func:`safe_load`, :func:`safe_save`, :func:`safe_load_metadata`, :func:`from_file`.

Files are checked as strictly as the reference implementation (header, dtypes, offsets, sizes,
no holes); a malformed file raises :class:`ember.nn.weights.SafetensorsError` naming the file and tensor.
"""
from __future__ import annotations

import json
import operator
import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ember.dtype import DType, dtypes, to_dtype
from ember.helpers import gc_paused, prod
from ember.nn.weights import (
    SafetensorsError,
    _disk_view,
    _is_int,
    _map_file,
    _Source,
    _tensor_bytes,
)
from ember.tensor import Tensor

# =============================================================================================
# safetensors
# =============================================================================================

#: safetensors dtype names, in the reference implementation's order (used to order tensors on save)
_SAFE_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "I16": dtypes.int16, "U16": dtypes.uint16,
    "F16": dtypes.float16, "BF16": dtypes.bfloat16, "I32": dtypes.int32, "U32": dtypes.uint32,
    "F32": dtypes.float32, "F64": dtypes.float64, "I64": dtypes.int64, "U64": dtypes.uint64,
}
_SAFE_NAMES: dict[DType, str] = {v: k for k, v in _SAFE_DTYPES.items()}
_SAFE_RANK: dict[str, int] = {name: i for i, name in enumerate(_SAFE_DTYPES)}
#: valid in the format, but with no ember dtype
_SAFE_UNSUPPORTED = ("F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0", "C64")
#: the reference implementation refuses larger headers
_SAFE_MAX_HEADER = 100_000_000


#: the largest dimension a header may give (tensor sizes are int64 everywhere else)
_SAFE_MAX_DIM = 2 ** 63 - 1


class _SafeEntry(NamedTuple):
    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int


class _Pairs(list):
    """A JSON object as the parser read it: its (key, value) pairs in order, duplicates kept (a list subclass,
    so ``{}`` is not mistaken for the empty list ``[]``). Made by the C parser without a Python call."""

    __slots__ = ()


def _object(where: str, pairs: Any, what: str) -> dict[str, Any]:
    """``pairs`` as a dict, refusing a key listed twice (readers that keep the first or the last one differ)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise SafetensorsError(f"{where}: {what} lists {k!r} twice")
            seen.add(k)
    return out


def _plain(x: Any) -> Any:
    """A parsed JSON value with every object as a dict (for callers that want the raw header)."""
    if type(x) is _Pairs:
        return {k: _plain(v) for k, v in x}
    if type(x) is list:
        return [_plain(v) for v in x]
    return x


def _safe_entry(where: str, name: str, info: Any, data_size: int) -> _SafeEntry:
    """Check one header entry in full, raising the precise error (the slow path of :func:`_safe_header`)."""
    what = f"{where}: tensor {name!r}"
    if type(info) is not _Pairs:
        raise SafetensorsError(f"{what}: expected an object with dtype, shape and data_offsets, got {_plain(info)!r}")
    info = _object(where, info, f"the entry of tensor {name!r}")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise SafetensorsError(f"{what}: the header entry has no {key!r}")
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str):
        raise SafetensorsError(f"{what}: dtype must be a string, got {_plain(dtype_name)!r}")
    if dtype_name not in _SAFE_DTYPES:
        if dtype_name in _SAFE_UNSUPPORTED:
            raise SafetensorsError(f"{what}: dtype {dtype_name} is valid safetensors but ember has no such dtype")
        raise SafetensorsError(f"{what}: unknown dtype {dtype_name!r} (known: {', '.join(_SAFE_DTYPES)})")
    if type(shape) is not list or not all(_is_int(s) and s >= 0 for s in shape):
        raise SafetensorsError(f"{what}: shape must be a list of integers >= 0, got {_plain(shape)!r}")
    if any(s > _SAFE_MAX_DIM for s in shape):
        raise SafetensorsError(f"{what}: shape {tuple(shape)} has a dimension larger than {_SAFE_MAX_DIM}")
    if not (type(offsets) is list and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsError(f"{what}: data_offsets must be [begin, end] with 0 <= begin <= end, got "
                               f"{_plain(offsets)!r}")
    dtype = _SAFE_DTYPES[dtype_name]
    begin, end = offsets
    if end > data_size:
        raise SafetensorsError(f"{what}: data_offsets [{begin}, {end}] run past the end of the file, which holds "
                               f"only {data_size} bytes of tensor data after the header (truncated file?)")
    need = prod(shape) * dtype.itemsize
    if need != end - begin:
        raise SafetensorsError(f"{what}: shape {tuple(shape)} of {dtype_name} needs {need} bytes, but data_offsets "
                               f"[{begin}, {end}] span {end - begin} bytes")
    return _SafeEntry(name, dtype, tuple(shape), begin, end)


_BY_RANGE = operator.attrgetter("begin", "end")


def _safe_entries(where: str, pairs: list[Any], data_size: int, keep: bool) -> tuple[list[_SafeEntry], Any]:
    """The checked entries of the header's (name, value) pairs and the value of ``__metadata__`` (None when absent).

    A header can list a million tensors, so the common entry ({"dtype", "shape", "data_offsets"} in that order,
    as every writer puts them) is checked inline; anything else goes through :func:`_safe_entry`, which checks
    the same things more slowly and says what is wrong. Unless ``keep``, each parsed pair is dropped once
    checked: the parsed header and the entries are not both held whole.
    """
    entries: list[_SafeEntry] = []
    dtypes_, max_dim, make = _SAFE_DTYPES, _SAFE_MAX_DIM, _SafeEntry._make
    add, meta = entries.append, None
    for i in range(len(pairs)):
        name, info = pairs[i]
        if not keep:
            pairs[i] = None
        if name == "__metadata__":
            if meta is not None:
                raise SafetensorsError(f"{where}: the header lists '__metadata__' twice")
            meta = info
            continue
        if type(info) is _Pairs and len(info) == 3:
            (k0, dname), (k1, shape), (k2, offsets) = info
            dtype = dtypes_.get(dname) if type(dname) is str else None
            if (dtype is not None and k0 == "dtype" and k1 == "shape" and k2 == "data_offsets"
                    and type(shape) is list and type(offsets) is list and len(offsets) == 2):
                begin, end = offsets
                if type(begin) is int and type(end) is int and 0 <= begin <= end <= data_size:
                    n = dtype.itemsize
                    for d in shape:
                        if type(d) is not int or not 0 <= d <= max_dim:
                            break
                        n *= d
                    else:
                        if n == end - begin:
                            add(make((name, dtype, tuple(shape), begin, end)))
                            continue
        add(_safe_entry(where, name, info, data_size))
    return entries, meta


def _safe_header(src: _Source, raw_header: bool = False) -> tuple[int, dict[str, Any] | None, list[_SafeEntry]]:
    """Parse and check the header: (data start, the header as a dict when ``raw_header``, entries in header
    order)."""
    where = src.name
    if src.size < 8:
        raise SafetensorsError(f"{where}: not a safetensors file: it has {src.size} bytes, fewer than the 8-byte "
                               "header length that starts the format")
    n = int.from_bytes(src.view[:8], "little")
    if n > src.size - 8:
        raise SafetensorsError(f"{where}: the header length field says {n} bytes, but only {src.size - 8} bytes "
                               "follow it: the file is truncated or not a safetensors file")
    if n > _SAFE_MAX_HEADER:
        raise SafetensorsError(f"{where}: a {n}-byte header is larger than the {_SAFE_MAX_HEADER} bytes allowed")
    try:
        # the parse makes two objects per tensor, none of them in a cycle: the collector would walk the growing
        # heap again and again
        with gc_paused():
            text = str(src.view[8:8 + n], "utf-8")  # decoded from the mapping: no copy of the bytes first
            parsed = json.loads(text, object_pairs_hook=_Pairs)
            del text
            return _check_header(src, n, parsed, raw_header)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{where}: the {n}-byte header is not valid JSON ({e}): not a safetensors "
                               "file, or a corrupt one") from e
    except RecursionError:  # a safetensors header nests three levels; thousands are an attack or garbage
        raise SafetensorsError(f"{where}: the {n}-byte header nests JSON arrays or objects too deeply to read: "
                               "not a safetensors file, or a corrupt one") from None


def _check_header(src: _Source, n: int, parsed: Any,
                  raw_header: bool) -> tuple[int, dict[str, Any] | None, list[_SafeEntry]]:
    where = src.name
    if type(parsed) is not _Pairs:
        raise SafetensorsError(f"{where}: the header must be a JSON object, got {type(_plain(parsed)).__name__}")
    data_start = 8 + n
    data_size = src.size - data_start
    header = {k: _plain(v) for k, v in _object(where, parsed, "the header").items()} if raw_header else None
    entries, meta = _safe_entries(where, parsed, data_size, keep=False)
    del parsed
    if len({e.name for e in entries}) != len(entries):
        _object(where, [(e.name, None) for e in entries], "the header")  # raises, naming the name
    if meta is not None:
        meta = _object(where, meta, "__metadata__") if type(meta) is _Pairs else meta
        if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise SafetensorsError(f"{where}: __metadata__ must map strings to strings, got {_plain(meta)!r}")
    pos, prev = 0, None
    for ent in sorted(entries, key=_BY_RANGE):
        if ent.begin < pos and prev is not None:
            raise SafetensorsError(f"{where}: tensors {prev.name!r} [{prev.begin}, {prev.end}] and {ent.name!r} "
                                   f"[{ent.begin}, {ent.end}] overlap")
        if ent.begin > pos:
            raise SafetensorsError(f"{where}: tensor {ent.name!r} starts at data offset {ent.begin}, leaving "
                                   f"{ent.begin - pos} bytes before it that belong to no tensor")
        pos, prev = ent.end, ent
    if pos != data_size:
        raise SafetensorsError(f"{where}: {data_size - pos} bytes after the last tensor belong to no tensor")
    return data_start, header, entries


def safe_load_metadata(fn: Tensor | str | os.PathLike[str] | bytes) -> tuple[Tensor, int, dict[str, Any]]:
    """The raw parts of a safetensors file: (its bytes as a uint8 tensor, where the data starts, the header).

    The header is the JSON object of the file, ``__metadata__`` included; it is checked like
    :func:`safe_load` checks it. For a file name the tensor is a zero-copy DISK view.
    """
    src = _Source.open(fn)
    data_start, header, _ = _safe_header(src, raw_header=True)
    assert header is not None
    return src.tensor(0, (src.size,), dtypes.uint8), data_start, header


def safe_load(fn: Tensor | str | os.PathLike[str] | bytes) -> dict[str, Tensor]:
    """Load a safetensors file: ``{name: tensor}`` in header order.

    For a file name each tensor is a zero-copy view of the memory-mapped file on its DISK device:
    nothing is read until a tensor is copied (``.to(device)``, :func:`load_state_dict`, ``.numpy()``).
    A malformed file raises :class:`SafetensorsError` naming the file and the tensor.
    """
    src = _Source.open(fn)
    data_start, _, entries = _safe_header(src)
    return {e.name: src.tensor(data_start + e.begin, e.shape, e.dtype) for e in entries}


def _atomic_write(fn: str | os.PathLike[str], chunks: Iterable[Any]) -> None:
    """Write the chunks to a new file next to ``fn`` and rename it over ``fn``.

    Readers that mapped the old file keep seeing its old bytes instead of crashing on a
    truncated mapping, and a failed save leaves the old file untouched.
    """
    path = os.path.abspath(os.fspath(fn))
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def safe_save(tensors: Mapping[str, Tensor], fn: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (any devices, any layouts) to the safetensors file ``fn``; ``metadata`` is str -> str.

    The layout is the reference implementation's (tensors ordered by dtype, widest first, then by
    name; header padded to 8 bytes), so every tensor is aligned to its item size. The file is replaced
    atomically: readers of the old file are not disturbed.
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(f"safe_save expects a dict of name -> Tensor, got {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"safe_save: tensor names must be strings, got {name!r}")
        if name == "__metadata__":
            raise SafetensorsError("safe_save: '__metadata__' is reserved and cannot name a tensor")
        if not isinstance(t, Tensor):
            raise TypeError(f"safe_save: {name!r} is a {type(t).__name__}, not a Tensor")
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in metadata.items()):
            raise TypeError(f"safe_save: metadata must map strings to strings, got {metadata!r}")
    order = sorted(tensors, key=lambda k: (-_SAFE_RANK[_SAFE_NAMES[tensors[k].dtype]], k))
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.dtype.itemsize
        header[name] = {"dtype": _SAFE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-len(blob) % 8)

    def chunks() -> Iterable[Any]:
        yield len(blob).to_bytes(8, "little")
        yield blob
        for name in order:
            owner, data = _tensor_bytes(tensors[name])
            yield data
            del owner, data

    _atomic_write(fn, chunks())


def from_file(fn: str | os.PathLike[str], dtype: DType | str = dtypes.uint8, shape: tuple[int, ...] | None = None,
              offset: int = 0) -> Tensor:
    """A zero-copy DISK tensor of ``shape`` and ``dtype`` over the bytes of ``fn`` from ``offset`` on.

    Without ``shape`` it is 1-D and runs to the end of the file. The file is mapped read-only;
    copy the tensor to a compute device (``.to("CPU")``) before computing with it.
    """
    dt = to_dtype(dtype)
    device, base = _map_file(fn)
    if offset < 0 or offset > base.nbytes:
        raise ValueError(f"offset {offset} is outside {base.path} ({base.nbytes} bytes)")
    if shape is None:
        if (base.nbytes - offset) % dt.itemsize:
            raise ValueError(f"the {base.nbytes - offset} bytes of {base.path} after offset {offset} are not a "
                             f"whole number of {dt} elements")
        shape = ((base.nbytes - offset) // dt.itemsize,)
    shape = tuple(int(s) for s in shape)
    need = prod(shape) * dt.itemsize
    if offset + need > base.nbytes:
        raise ValueError(f"a {shape} {dt} tensor at offset {offset} needs {need} bytes, but {base.path} has only "
                         f"{base.nbytes - offset} bytes there")
    return _disk_view(device, base, offset, shape, dt)
