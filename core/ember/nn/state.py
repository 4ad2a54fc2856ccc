"""Weights I/O and model state: safetensors, PyTorch checkpoints, GGUF, and state dicts.

Loading never reads a file whole. A file is memory-mapped through the built-in DISK device
(:mod:`ember.runtime.disk`) and each stored tensor becomes a zero-copy DISK view of its own bytes:
``safe_load(fn)["w"].to("CPU")`` (or :func:`load_state_dict`) reads only that tensor's pages.
DISK tensors cannot be computed on; move them to a compute device first.

* :func:`safe_load`, :func:`safe_save`, :func:`safe_load_metadata`: the safetensors format, checked
  as strictly as the reference implementation (header, dtypes, offsets, sizes, no holes).
* :func:`torch_load`: ``.pt``/``.pth`` files written by ``torch.save`` (zip and legacy formats),
  read without torch by a restricted unpickler that only rebuilds tensors and plain containers.
* :func:`gguf_load`: GGUF v2/v3 metadata and tensors. Quantized tensors (Q4_0, Q4_1, Q5_0, Q5_1,
  Q8_0, Q2_K ... Q8_K, IQ4_NL) are dequantized to float32 with numpy on the host.
* :func:`get_state_dict`, :func:`get_parameters`, :func:`load_state_dict`: name a model's tensors by
  walking its attributes, lists and dicts; load a state dict all-or-nothing.

A malformed file raises a :class:`WeightsFormatError` (a ``ValueError``) whose message names the file
and the tensor, and says what is wrong.
"""
from __future__ import annotations

import codecs
import collections
import io
import json
import os
import pickle
import struct
import time
import types
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.device.buffer import Buffer
from ember.device.registry import Device
from ember.dtype import DType, dtypes, to_dtype, to_np_dtype
from ember.graph.lazy import base_of, buffer_view, buffers, new_buffer
from ember.graph.uop import Ops
from ember.helpers import DEBUG, prod
from ember.runtime.disk import READ_ONLY, DiskBuffer
from ember.tensor import Tensor, no_grad

# =============================================================================================
# errors
# =============================================================================================


class WeightsFormatError(ValueError):
    """A weights file is malformed, or uses a feature ember does not read. The message names the file."""


class SafetensorsError(WeightsFormatError):
    """A malformed safetensors file (or bad arguments to :func:`safe_save`)."""


class TorchLoadError(WeightsFormatError, pickle.UnpicklingError):
    """A file :func:`torch_load` cannot read: not a torch checkpoint, malformed, or with a refused global."""


class GGUFError(WeightsFormatError):
    """A malformed or unsupported GGUF file."""


class StateDictError(RuntimeError, ValueError):
    """A state dict does not fit a model: lists every missing, unexpected and mis-shaped key."""


# =============================================================================================
# byte sources: a file mapped through DISK, a DISK tensor, or host bytes
# =============================================================================================


def _host_tensor(data: Any, shape: tuple[int, ...], dtype: DType, device: str) -> Tensor:
    """A tensor on ``device`` holding exactly the bytes ``data`` (no value conversion)."""
    numel = prod(shape)
    node = new_buffer(device, numel, dtype)
    if numel:
        buffers[node].copyin(memoryview(data).cast("B"))
    return Tensor(buffer_view(node, shape), device=device)


def _disk_view(device: str, base: DiskBuffer, offset: int, shape: tuple[int, ...], dtype: DType) -> Tensor:
    """A DISK tensor of ``shape`` whose bytes are ``base``'s, from ``offset`` on (zero-copy)."""
    numel = prod(shape)
    handle = Device[device].allocator.offset(base, offset, numel * dtype.itemsize)
    node = new_buffer(device, numel, dtype, Buffer(device, numel, dtype, opaque=handle))
    return Tensor(buffer_view(node, shape), device=device)


def _map_file(fn: str | os.PathLike[str]) -> tuple[str, DiskBuffer]:
    """Map a whole file read-only through its DISK device; returns the device name and the handle."""
    path = os.path.abspath(os.fspath(fn))
    size = os.path.getsize(path)
    device = f"DISK:{path}"
    return device, Device[device].allocator.alloc(size, READ_ONLY)


class _Source:
    """The bytes of a weights file, and a way to turn a range of them into a tensor."""

    def __init__(self, name: str, view: memoryview, disk: tuple[str, DiskBuffer] | None, device: str | None):
        self.name, self.view, self.disk, self.device = name, view, disk, device
        self.size = view.nbytes

    @staticmethod
    def open(fn: Any) -> _Source:
        """A path (mapped read-only), a uint8 tensor of the file's bytes, or bytes."""
        if isinstance(fn, Tensor):
            x = fn.lazydata
            base = base_of(x)
            whole = base.op is Ops.BUFFER and (x is base or (x.arg.contiguous and x.arg.size == base.arg[2]))
            if whole and fn.device.partition(":")[0] == "DISK":
                buf = buffers[base].allocate()
                handle: DiskBuffer = buf._buf
                return _Source(handle.path, handle.view(), (fn.device, handle), None)
            if fn.dtype != dtypes.uint8:
                raise TypeError(f"expected the file's bytes as a uint8 tensor, got a {fn.dtype} tensor")
            device = Device.DEFAULT if fn.device.partition(":")[0] == "DISK" else fn.device
            return _Source(f"<uint8 tensor on {fn.device}>", memoryview(fn.numpy().tobytes()), None, device)
        if isinstance(fn, (bytes, bytearray, memoryview)):
            return _Source("<bytes>", memoryview(fn).cast("B"), None, Device.DEFAULT)
        if not isinstance(fn, (str, os.PathLike)):
            raise TypeError(f"expected a file name, a uint8 Tensor or bytes, got {type(fn).__name__}")
        device, handle = _map_file(fn)
        return _Source(handle.path, handle.view(), (device, handle), None)

    def tensor(self, offset: int, shape: tuple[int, ...], dtype: DType) -> Tensor:
        """The tensor stored at byte ``offset``: a DISK view for files, a host copy otherwise."""
        if self.disk is not None:
            return _disk_view(self.disk[0], self.disk[1], offset, shape, dtype)
        assert self.device is not None
        return _host_tensor(self.view[offset:offset + prod(shape) * dtype.itemsize], shape, dtype, self.device)

    def host_device(self) -> str:
        """The device for tensors rebuilt on the host (dequantized, strided ...)."""
        return self.device if self.device is not None else Device.DEFAULT


class _ViewFile(io.RawIOBase):
    """A read-only, seekable file over a memoryview (zipfile and pickle read through it without copies)."""

    def __init__(self, view: memoryview):
        super().__init__()
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        """Always readable."""
        return True

    def seekable(self) -> bool:
        """Always seekable."""
        return True

    def tell(self) -> int:
        """The current position."""
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` relative to ``whence``; returns the new position."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        if base + offset < 0:
            raise OSError("seek before the start of the file")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        """Copy the next bytes into ``b``; returns how many (0 at the end)."""
        out = memoryview(b).cast("B")
        n = max(0, min(out.nbytes, self._view.nbytes - self._pos))
        out[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n


def _tensor_bytes(t: Tensor) -> tuple[Any, memoryview]:
    """The raw bytes of ``t``'s elements in row-major order (computed on its device when it is a view).

    Returns ``(owner, bytes)``: the bytes may be a zero-copy view of ``owner``'s memory, so keep
    ``owner`` alive until they are used.
    """
    if t.numel() == 0:
        return None, memoryview(b"")
    buf = t._buffer()
    try:
        Device[buf.device].synchronize()
        return buf, memoryview(buf.allocator.as_buffer(buf._buf)).cast("B")[:buf.nbytes]
    except (NotImplementedError, AttributeError):
        return buf, memoryview(buf.as_bytes())


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


@dataclass(frozen=True)
class _SafeEntry:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int


def _no_duplicate_keys(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise SafetensorsError(f"{where}: the header lists {k!r} twice")
            out[k] = v
        return out
    return hook


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _safe_entry(where: str, name: str, info: Any, data_size: int) -> _SafeEntry:
    what = f"{where}: tensor {name!r}"
    if not isinstance(info, dict):
        raise SafetensorsError(f"{what}: expected an object with dtype, shape and data_offsets, got {info!r}")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise SafetensorsError(f"{what}: the header entry has no {key!r}")
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str):
        raise SafetensorsError(f"{what}: dtype must be a string, got {dtype_name!r}")
    if dtype_name not in _SAFE_DTYPES:
        if dtype_name in _SAFE_UNSUPPORTED:
            raise SafetensorsError(f"{what}: dtype {dtype_name} is valid safetensors but ember has no such dtype")
        raise SafetensorsError(f"{what}: unknown dtype {dtype_name!r} (known: {', '.join(_SAFE_DTYPES)})")
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise SafetensorsError(f"{what}: shape must be a list of integers >= 0, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsError(f"{what}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
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


def _safe_header(src: _Source) -> tuple[int, dict[str, Any], list[_SafeEntry]]:
    """Parse and check the header: (data start, raw header dict, entries in header order)."""
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
    raw = bytes(src.view[8:8 + n])
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys(where))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{where}: the {n}-byte header is not valid JSON ({e}): not a safetensors "
                               "file, or a corrupt one") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}: the header must be a JSON object, got {type(header).__name__}")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise SafetensorsError(f"{where}: __metadata__ must map strings to strings, got {meta!r}")
    data_start = 8 + n
    data_size = src.size - data_start
    entries = [_safe_entry(where, k, v, data_size) for k, v in header.items() if k != "__metadata__"]
    pos, prev = 0, None
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.begin < pos and prev is not None:
            raise SafetensorsError(f"{where}: tensors {prev.name!r} [{prev.begin}, {prev.end}] and {e.name!r} "
                                   f"[{e.begin}, {e.end}] overlap")
        if e.begin > pos:
            raise SafetensorsError(f"{where}: tensor {e.name!r} starts at data offset {e.begin}, leaving "
                                   f"{e.begin - pos} bytes before it that belong to no tensor")
        pos, prev = e.end, e
    if pos != data_size:
        raise SafetensorsError(f"{where}: {data_size - pos} bytes after the last tensor belong to no tensor")
    return data_start, header, entries


def safe_load_metadata(fn: Tensor | str | os.PathLike[str] | bytes) -> tuple[Tensor, int, dict[str, Any]]:
    """The raw parts of a safetensors file: (its bytes as a uint8 tensor, where the data starts, the header).

    The header is the JSON object of the file, ``__metadata__`` included; it is checked like
    :func:`safe_load` checks it. For a file name the tensor is a zero-copy DISK view.
    """
    src = _Source.open(fn)
    data_start, header, _ = _safe_header(src)
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


# =============================================================================================
# state dicts
# =============================================================================================

_LEAF_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), np.ndarray, np.generic, type,
               types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _walk_state(obj: Any, prefix: str, tensor_type: type, out: dict[str, Any], active: set[int]) -> None:
    if isinstance(obj, tensor_type):
        out[prefix.strip(".")] = obj
        return
    if isinstance(obj, _LEAF_TYPES) or id(obj) in active:
        return  # plain values, and cycles (a layer that points back at its parent)
    active.add(id(obj))
    try:
        items: Iterable[tuple[Any, Any]]
        if hasattr(obj, "_asdict") and isinstance(obj, tuple):  # namedtuple
            items = obj._asdict().items()
        elif isinstance(obj, Mapping):
            items = obj.items()
        elif isinstance(obj, (list, tuple)):
            items = enumerate(obj)
        elif hasattr(obj, "__dict__"):
            items = vars(obj).items()
        else:
            return
        for k, v in list(items):
            _walk_state(v, f"{prefix}{k}.", tensor_type, out, active)
    finally:
        active.discard(id(obj))


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every tensor reachable from ``obj`` by a dotted name: attributes, list/tuple indices, dict keys.

    ``model.l1.weight`` is ``"l1.weight"``, ``model.layers[0].bias`` is ``"layers.0.bias"``. A tensor
    reachable under two names (tied weights) appears under both.
    """
    out: dict[str, Tensor] = {}
    _walk_state(obj, prefix, tensor_type, out, set())
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of :func:`get_state_dict`, each once (tied weights are not repeated)."""
    seen: set[int] = set()
    out: list[Tensor] = []
    for t in get_state_dict(obj).values():
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _describe_problems(model: Any, missing: list[str], unexpected: list[str], bad: list[str], strict: bool) -> str:
    lines = [f"the state dict does not fit {type(model).__name__}; nothing was loaded:"]
    if strict and missing:
        lines.append(f"  missing keys (in the model, not in the state dict): {', '.join(missing)}")
    if strict and unexpected:
        lines.append(f"  unexpected keys (in the state dict, not in the model): {', '.join(unexpected)}")
    if bad:
        lines.append("  shape mismatches:")
        lines.extend(f"    {b}" for b in bad)
    if strict and (missing or unexpected):
        lines.append("  (load_state_dict(..., strict=False) skips missing and unexpected keys)")
    return "\n".join(lines)


def load_state_dict(model: Any, state_dict: Mapping[str, Tensor], strict: bool = True, verbose: bool = False,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:
    """Copy ``state_dict`` into the tensors of ``model`` (named as :func:`get_state_dict` names them).

    Values are moved to each parameter's device and cast to its dtype. Nothing is applied unless
    everything fits: every shape mismatch (both shapes), and with ``strict`` every missing and
    unexpected key, is listed in one :class:`StateDictError`. With ``realize`` the new values are
    computed (copied off the disk) before any parameter changes, so a failure leaves the model as it
    was. ``consume`` deletes loaded entries from ``state_dict``. Returns the updated tensors.
    """
    start = time.perf_counter()
    model_state = get_state_dict(model)
    missing = [k for k in model_state if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_state]
    bad: list[str] = []
    for k, v in model_state.items():
        if k not in state_dict:
            continue
        new = state_dict[k]
        if not isinstance(new, Tensor):
            bad.append(f"{k}: model {v.shape}, state dict has a {type(new).__name__}, not a Tensor")
        elif new.shape != v.shape:
            bad.append(f"{k}: model {v.shape}, state dict {new.shape}")
    if bad or (strict and (missing or unexpected)):
        raise StateDictError(_describe_problems(model, missing, unexpected, bad, strict))
    if unexpected and (verbose or DEBUG >= 1):
        print(f"load_state_dict: ignoring {len(unexpected)} unused keys: {', '.join(unexpected)}")
    if missing and verbose:
        print(f"load_state_dict: {len(missing)} model tensors are not in the state dict: {', '.join(missing)}")
    with no_grad():
        pairs = [(v, state_dict[k].detach().to(v.device).cast(v.dtype)) for k, v in model_state.items()
                 if k in state_dict]
        if realize and pairs:
            Tensor.realize_all(*[new for _, new in pairs])
        for param, new in pairs:
            param.assign(new)
    if consume:
        for k in model_state:
            if k in state_dict:
                del state_dict[k]  # type: ignore[attr-defined]
    if verbose:
        nbytes = sum(p.nbytes() for p, _ in pairs)
        print(f"load_state_dict: loaded {len(pairs)} tensors ({nbytes / 1e6:.2f} MB) into {type(model).__name__} "
              f"in {time.perf_counter() - start:.3f} s")
    return [p for p, _ in pairs]


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
        storages: dict[str, _Storage] = {}

        def persistent(pid: Any) -> _Storage:
            st = _storage_from_pid(src.name, pid)
            storages.setdefault(st.key, st)
            return st

        try:
            obj = _TorchUnpickler(zf.open(pickles[0]), src.name, persistent).load()
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
    storages: dict[str, _Storage] = {}

    def persistent(pid: Any) -> _Storage:
        st = _storage_from_pid(src.name, pid)
        storages.setdefault(st.key, st)
        return st

    try:
        protocol = load()
        if protocol != _TORCH_LEGACY_PROTOCOL:
            raise TorchLoadError(f"{src.name}: unsupported legacy torch protocol {protocol!r}")
        sys_info = load()
        little = bool(sys_info.get("little_endian", True)) if isinstance(sys_info, dict) else True
        obj = load(persistent)
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


# =============================================================================================
# GGUF
# =============================================================================================

#: ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
#: ggml types stored as plain elements: loaded as zero-copy views in their own dtype
_GGML_PLAIN: dict[int, DType] = {0: dtypes.float32, 1: dtypes.float16, 24: dtypes.int8, 25: dtypes.int16,
                                 26: dtypes.int32, 27: dtypes.int64, 28: dtypes.float64, 30: dtypes.bfloat16}

_IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _f16(col: np.ndarray) -> np.ndarray:
    """(blocks, 2) uint8 little-endian float16 bytes -> (blocks, 1) float32."""
    return np.ascontiguousarray(col).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles of every byte, then high nibbles (the 32-element layout of Q4_0/Q4_1/Q5_x)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray, n: int = 32) -> np.ndarray:
    """(blocks, 4) uint8 little-endian uint32 -> (blocks, n) of its bits 0..n-1."""
    word = np.ascontiguousarray(qh).view("<u4")
    return ((word >> np.arange(n, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scale_min(sc: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit scale and min of sub-block ``j`` packed in the 12 scale bytes of Q4_K/Q5_K."""
    if j < 4:
        return (sc[:, j] & 63).astype(np.float32)[:, None], (sc[:, j + 4] & 63).astype(np.float32)[:, None]
    scale = (sc[:, j + 4] & 0x0F) | ((sc[:, j - 4] >> 6) << 4)
    mn = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
    return scale.astype(np.float32)[:, None], mn.astype(np.float32)[:, None]


def _dq_q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * (_nibbles(b[:, 2:18]).astype(np.float32) - 8)


def _dq_q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * _nibbles(b[:, 4:20]).astype(np.float32) + _f16(b[:, 2:4])


def _dq_q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)
    return _f16(b[:, 0:2]) * (q.astype(np.float32) - 16)


def _dq_q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return _f16(b[:, 0:2]) * q.astype(np.float32) + _f16(b[:, 2:4])


def _dq_q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32)


def _dq_q8_k(b: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4").astype(np.float32)
    return d * np.ascontiguousarray(b[:, 4:260]).view(np.int8).astype(np.float32)


def _dq_q2_k(b: np.ndarray) -> np.ndarray:
    scales, qs, d, dmin = b[:, 0:16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    out = np.empty((b.shape[0], 256), np.float32)
    for half in range(2):
        q = qs[:, 32 * half:32 * half + 32]
        for j in range(4):
            for sub in range(2):
                sc = scales[:, 8 * half + 2 * j + sub][:, None]
                vals = ((q[:, 16 * sub:16 * sub + 16] >> (2 * j)) & 3).astype(np.float32)
                at = 128 * half + 32 * j + 16 * sub
                out[:, at:at + 16] = d * (sc & 0x0F) * vals - dmin * (sc >> 4)
    return out


def _dq_q3_k(b: np.ndarray) -> np.ndarray:
    hmask, qs, d = b[:, 0:32], b[:, 32:96], _f16(b[:, 108:110])
    a = np.ascontiguousarray(b[:, 96:108]).view("<u4")  # (blocks, 3)
    lo4, hi2 = np.uint32(0x0F0F0F0F), np.uint32(0x03030303)
    packed = [(a[:, 0] & lo4) | (((a[:, 2] >> 0) & hi2) << 4), (a[:, 1] & lo4) | (((a[:, 2] >> 2) & hi2) << 4),
              ((a[:, 0] >> 4) & lo4) | (((a[:, 2] >> 4) & hi2) << 4),
              ((a[:, 1] >> 4) & lo4) | (((a[:, 2] >> 6) & hi2) << 4)]
    scales = np.ascontiguousarray(np.stack(packed, axis=1).astype("<u4")).view(np.int8).astype(np.float32) - 32
    out = np.empty((b.shape[0], 256), np.float32)
    for half in range(2):
        q = qs[:, 32 * half:32 * half + 32]
        for j in range(4):
            bit = 4 * half + j
            for sub in range(2):
                low = ((q[:, 16 * sub:16 * sub + 16] >> (2 * j)) & 3).astype(np.float32)
                high = (hmask[:, 16 * sub:16 * sub + 16] >> bit) & 1
                vals = low - np.where(high == 1, 0, 4).astype(np.float32)
                at = 128 * half + 32 * j + 16 * sub
                out[:, at:at + 16] = d * scales[:, 8 * half + 2 * j + sub][:, None] * vals
    return out


def _dq_q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin, sc, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:16], b[:, 16:144]
    out = np.empty((b.shape[0], 256), np.float32)
    for c in range(4):
        q = qs[:, 32 * c:32 * c + 32]
        s1, m1 = _k_scale_min(sc, 2 * c)
        s2, m2 = _k_scale_min(sc, 2 * c + 1)
        out[:, 64 * c:64 * c + 32] = d * s1 * (q & 0x0F).astype(np.float32) - dmin * m1
        out[:, 64 * c + 32:64 * c + 64] = d * s2 * (q >> 4).astype(np.float32) - dmin * m2
    return out


def _dq_q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin, sc, qh, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:16], b[:, 16:48], b[:, 48:176]
    out = np.empty((b.shape[0], 256), np.float32)
    for c in range(4):
        q = qs[:, 32 * c:32 * c + 32]
        s1, m1 = _k_scale_min(sc, 2 * c)
        s2, m2 = _k_scale_min(sc, 2 * c + 1)
        lo = (q & 0x0F) + 16 * ((qh >> (2 * c)) & 1)
        hi = (q >> 4) + 16 * ((qh >> (2 * c + 1)) & 1)
        out[:, 64 * c:64 * c + 32] = d * s1 * lo.astype(np.float32) - dmin * m1
        out[:, 64 * c + 32:64 * c + 64] = d * s2 * hi.astype(np.float32) - dmin * m2
    return out


def _dq_q6_k(b: np.ndarray) -> np.ndarray:
    ql, qh, d = b[:, 0:128], b[:, 128:192], _f16(b[:, 208:210])
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    out = np.empty((b.shape[0], 256), np.float32)
    for half in range(2):
        lq, hq, s = ql[:, 64 * half:64 * half + 64], qh[:, 32 * half:32 * half + 32], sc[:, 8 * half:8 * half + 8]
        parts = [(lq[:, 0:32] & 0x0F) | (((hq >> 0) & 3) << 4), (lq[:, 32:64] & 0x0F) | (((hq >> 2) & 3) << 4),
                 (lq[:, 0:32] >> 4) | (((hq >> 4) & 3) << 4), (lq[:, 32:64] >> 4) | (((hq >> 6) & 3) << 4)]
        for i, q in enumerate(parts):
            scale = np.repeat(s[:, 2 * i:2 * i + 2], 16, axis=1)
            at = 128 * half + 32 * i
            out[:, at:at + 32] = d * scale * (q.astype(np.float32) - 32)
    return out


def _dq_iq4_nl(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * _IQ4NL_VALUES[_nibbles(b[:, 2:18])]


_DEQUANT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: _dq_q4_0, 3: _dq_q4_1, 6: _dq_q5_0, 7: _dq_q5_1, 8: _dq_q8_0, 10: _dq_q2_k, 11: _dq_q3_k,
    12: _dq_q4_k, 13: _dq_q5_k, 14: _dq_q6_k, 15: _dq_q8_k, 20: _dq_iq4_nl,
}


def ggml_dequantize(data: Any, ggml_type: int, n: int) -> np.ndarray:
    """Dequantize ``n`` elements of ggml type ``ggml_type`` from the raw block bytes ``data`` to float32 (numpy)."""
    if ggml_type not in GGML_TYPES:
        raise GGUFError(f"unknown ggml type {ggml_type}")
    name, block, size = GGML_TYPES[ggml_type]
    if ggml_type not in _DEQUANT:
        raise GGUFError(f"ggml type {name} cannot be dequantized by ember (supported: "
                        f"{', '.join(GGML_TYPES[t][0] for t in _DEQUANT)})")
    if n % block:
        raise GGUFError(f"{n} elements are not a whole number of {name} blocks of {block}")
    raw = np.frombuffer(data, dtype=np.uint8, count=n // block * size)
    return _DEQUANT[ggml_type](raw.reshape(-1, size)).reshape(-1)


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
    """``n`` elements of ggml type ``ggml_type`` from the uint8 tensor ``t`` of raw blocks.

    Plain types are reinterpreted; quantized ones are dequantized to float32 on the host (numpy).
    """
    src = _Source.open(t)
    if ggml_type in _GGML_PLAIN:
        dt = _GGML_PLAIN[ggml_type]
        if n * dt.itemsize > src.size:
            raise GGUFError(f"{src.name}: {n} {GGML_TYPES[ggml_type][0]} elements need {n * dt.itemsize} bytes, "
                            f"the tensor has {src.size}")
        return src.tensor(0, (n,), dt)
    name, block, size = GGML_TYPES.get(ggml_type, (str(ggml_type), 1, 1))
    if n // max(block, 1) * size > src.size:
        raise GGUFError(f"{src.name}: {n} {name} elements need {n // block * size} bytes, the tensor has {src.size}")
    return Tensor(ggml_dequantize(src.view, ggml_type, n), device=src.host_device())


_GGUF_SCALARS: dict[int, tuple[str, str]] = {  # value type -> (struct format, name)
    0: ("<B", "UINT8"), 1: ("<b", "INT8"), 2: ("<H", "UINT16"), 3: ("<h", "INT16"), 4: ("<I", "UINT32"),
    5: ("<i", "INT32"), 6: ("<f", "FLOAT32"), 7: ("<?", "BOOL"), 10: ("<Q", "UINT64"), 11: ("<q", "INT64"),
    12: ("<d", "FLOAT64"),
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_MAX_DIMS = 4


class _GGUFReader:
    def __init__(self, src: _Source):
        self.src, self.pos = src, 0

    def take(self, n: int, what: str) -> memoryview:
        """The next ``n`` bytes; ``what`` names the field in the error when the file ends first."""
        if n < 0 or self.pos + n > self.src.size:
            raise GGUFError(f"{self.src.name}: the file ends while reading {what} (truncated or corrupt file)")
        out = self.src.view[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        """The next value of struct format ``fmt``."""
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        """The next GGUF string (u64 length, UTF-8 bytes)."""
        n = self.scalar("<Q", what)
        raw = self.take(n, what)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.src.name}: {what} is not valid UTF-8 ({e})") from e

    def value(self, vtype: int, what: str) -> Any:
        """The next metadata value of GGUF value type ``vtype`` (arrays become lists)."""
        if vtype in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[vtype][0], what)
        if vtype == _GGUF_STRING:
            return self.string(what)
        if vtype == _GGUF_ARRAY:
            itype, count = self.scalar("<I", what), self.scalar("<Q", what)
            if itype in _GGUF_SCALARS:
                fmt = _GGUF_SCALARS[itype][0]
                raw = self.take(count * struct.calcsize(fmt), what)
                return np.frombuffer(raw, dtype=np.dtype(fmt)).tolist()
            return [self.value(itype, what) for _ in range(count)]
        raise GGUFError(f"{self.src.name}: {what} has unknown value type {vtype}")


def gguf_load(fn: Tensor | str | os.PathLike[str] | bytes) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Read a GGUF (v2 or v3) file: ``(metadata, {name: tensor})``.

    Tensor shapes are numpy order (GGUF lists dimensions fastest first, so they are reversed).
    Plain tensors (F32, F16, BF16, F64, I8 ... I64) keep their dtype and are zero-copy DISK views
    of the file; quantized ones (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    Q8_K, IQ4_NL) are dequantized to float32 by numpy on the host, at load time, on the default device.
    """
    src = _Source.open(fn)
    r = _GGUFReader(src)
    where = src.name
    magic = bytes(r.take(4, "the magic number")) if src.size >= 4 else bytes(src.view)
    if magic != b"GGUF":
        raise GGUFError(f"{where}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = r.scalar("<I", "the version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version >> 16:
            raise GGUFError(f"{where}: a big-endian GGUF file; ember reads little-endian GGUF only")
        raise GGUFError(f"{where}: unsupported GGUF version {version} (ember reads versions 2 and 3)")
    n_tensors, n_kv = r.scalar("<Q", "the tensor count"), r.scalar("<Q", "the metadata count")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}")
        vtype = r.scalar("<I", f"the type of metadata {key!r}")
        metadata[key] = r.value(vtype, f"metadata {key!r}")
    alignment = metadata.get("general.alignment", 32)
    if not _is_int(alignment) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{where}: general.alignment must be a power of two, got {alignment!r}")
    infos = []
    for i in range(n_tensors):
        name = r.string(f"the name of tensor #{i}")
        what = f"tensor {name!r}"
        n_dims = r.scalar("<I", what)
        if n_dims > _GGUF_MAX_DIMS:
            raise GGUFError(f"{where}: {what} has {n_dims} dimensions, more than the {_GGUF_MAX_DIMS} GGUF allows")
        dims = [r.scalar("<Q", what) for _ in range(n_dims)]
        ggml_type, offset = r.scalar("<I", what), r.scalar("<Q", what)
        infos.append((name, tuple(reversed(dims)), ggml_type, offset))
    data_start = -(-r.pos // alignment) * alignment
    data_size = max(0, src.size - data_start)
    tensors: dict[str, Tensor] = {}
    for name, shape, ggml_type, offset in infos:
        what = f"{where}: tensor {name!r}"
        if ggml_type not in GGML_TYPES:
            raise GGUFError(f"{what} has unknown ggml type {ggml_type}")
        tname, block, size = GGML_TYPES[ggml_type]
        if ggml_type not in _GGML_PLAIN and ggml_type not in _DEQUANT:
            raise GGUFError(f"{what} uses quantization {tname}, which ember cannot dequantize (supported: "
                            f"{', '.join(GGML_TYPES[t][0] for t in _DEQUANT)})")
        numel = prod(shape)
        if numel % block or (shape and shape[-1] % block):
            raise GGUFError(f"{what}: its rows of {shape[-1]} elements are not whole {tname} blocks of {block}")
        nbytes = numel // block * size
        if offset % alignment:
            raise GGUFError(f"{what}: data offset {offset} is not a multiple of the alignment {alignment}")
        if offset + nbytes > data_size:
            raise GGUFError(f"{what}: its {nbytes} bytes at data offset {offset} run past the end of the file "
                            f"({data_size} bytes of tensor data; truncated file?)")
        if name in tensors:
            raise GGUFError(f"{what} is listed twice")
        start = data_start + offset
        if ggml_type in _GGML_PLAIN:
            tensors[name] = src.tensor(start, shape, _GGML_PLAIN[ggml_type])
        else:
            values = ggml_dequantize(src.view[start:start + nbytes], ggml_type, numel).reshape(shape)
            tensors[name] = Tensor(values, device=src.host_device())
    return metadata, tensors


__all__ = [
    "GGML_TYPES", "GGUFError", "SafetensorsError", "StateDictError", "TorchLoadError", "WeightsFormatError",
    "from_file", "get_parameters", "get_state_dict", "ggml_data_to_tensor", "ggml_dequantize", "gguf_load",
    "load_state_dict", "safe_load", "safe_load_metadata", "safe_save", "torch_load",
]
