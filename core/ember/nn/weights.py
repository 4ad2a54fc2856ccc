"""Shared pieces of ember's weight-file readers: errors, memory-mapped sources, tensor views.

A file is memory-mapped through the built-in DISK device (:mod:`ember.builtin_devices.disk`); each stored
tensor becomes a zero-copy DISK view of its own bytes, so loading never reads a file whole.
"""
from __future__ import annotations

import io
import os
import pickle
from typing import Any

from ember.builtin_devices.disk import READ_ONLY, DiskBuffer
from ember.device.buffer import Buffer
from ember.device.registry import Device
from ember.dtype import DType, dtypes
from ember.helpers import prod
from ember.ir.lazy import base_of, buffer_view, buffers, new_buffer
from ember.ir.uop import Ops
from ember.tensor import Tensor

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


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
