"""The NCCL backend: collectives on device buffers through ``nccl4py`` (``pip install 'ember[nccl]'``).

Which devices hold buffers NCCL can address is the device plugin's word: its device class offers the optional
capability :class:`ember.device.NCCLMemory` (the CUDA plugin's does), and the first usable kind that offers it
is used. Each rank drives one device of that kind (``KIND:<local rank>``). MPI is the bootstrap: rank 0 makes
NCCL's unique id and broadcasts it over MPI, then every rank joins the NCCL communicator. A collective takes the
device pointer of the tensor's buffer from the plugin (``nccl_pointer``) and runs on the stream it names
(``nccl_stream``), after the kernels that wrote it; ``wait()`` waits for the device.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from ember.distributed.backend import Backend, Request
from ember.dtype import DType, dtypes

_INSTALL_HINT = "pip install 'ember[nccl]' (nccl4py with its cu12 or cu13 extra)"

#: ember dtype -> NCCL's data type name (nccl.core exports each as a constant of that name).
NCCL_DTYPES: dict[DType, str] = {
    dtypes.int8: "INT8", dtypes.uint8: "UINT8", dtypes.int32: "INT32", dtypes.uint32: "UINT32",
    dtypes.int64: "INT64", dtypes.uint64: "UINT64", dtypes.float16: "FLOAT16", dtypes.float32: "FLOAT32",
    dtypes.float64: "FLOAT64", dtypes.bfloat16: "BFLOAT16",
}
NCCL_OPS = {"sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN", "avg": "AVG"}


def nccl_dtype(dt: DType) -> str:
    """NCCL's name for ``dt``; a clear error for dtypes NCCL cannot send (bool, int16 ...)."""
    try:
        return NCCL_DTYPES[dt]
    except KeyError:
        raise TypeError(f"the nccl backend cannot send {dt} tensors; supported: "
                        f"{', '.join(sorted(d.name for d in NCCL_DTYPES))}") from None


def nccl_op(op: str) -> str:
    """NCCL's name for the reduction ``op``."""
    try:
        return NCCL_OPS[op]
    except KeyError:
        raise ValueError(f"the nccl backend has no reduction {op!r}; expected one of {', '.join(NCCL_OPS)}") from None


#: the methods of a device class whose buffers NCCL can address (:class:`ember.device.NCCLMemory`)
NCCL_METHODS = ("nccl_device_count", "nccl_pointer", "nccl_stream")


def nccl_devices() -> tuple[str | None, int, str | None]:
    """``(device kind, how many, None)`` for the first usable device kind whose plugin declares buffers NCCL can
    address (:class:`ember.device.NCCLMemory`), highest priority first; ``(None, 0, why none)`` otherwise."""
    from ember.device.collective import kinds_offering

    why = []
    for name, cls, reason in kinds_offering(*NCCL_METHODS):
        if reason is None:
            try:
                count = int(cls.nccl_device_count())
            except Exception as e:
                reason = f"counting its devices failed ({type(e).__name__}: {e})"
            else:
                if count > 0:
                    return name, count, None
                reason = "no device NCCL can address"
        why.append(f"{name}: {reason}")
    if not why:
        return None, 0, ("no installed device plugin declares buffers NCCL can address (the CUDA plugin does: "
                         "pip install 'ember[cuda]')")
    return None, 0, "; ".join(why)


class _ArrayInterface:
    """A CUDA array interface (version 3) over a device pointer, which nccl4py resolves to that pointer."""

    def __init__(self, ptr: int, count: int, dt: DType):
        typestr = {"f": "<f", "i": "<i", "u": "<u"}.get(dt.kind, "<u")
        if dt == dtypes.bfloat16:
            typestr = "<V"  # no array-interface code for bfloat16: the dtype is passed to NCCL separately
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": f"{typestr}{dt.itemsize}",
                                         "data": (ptr, False), "strides": None, "version": 3, "stream": None}


class _StreamRequest(Request):
    def __init__(self, device: Any):
        self.device = device

    def test(self) -> bool:
        self.device.synchronize()
        return True


class NCCLBackend(Backend):
    """Device-buffer collectives over NCCL; MPI gives the rank, the world size and the bootstrap. ``memory`` is
    the device kind found by :func:`nccl_devices` once the backend is made."""

    name = "nccl"
    memory = "device"

    @classmethod
    def probe(cls) -> str | None:
        try:
            importlib.import_module("nccl.core")
        except ImportError as e:
            return f"nccl4py is not installed ({e}); {_INSTALL_HINT}"
        except Exception as e:  # nccl4py present, but NCCL or the CUDA runtime it needs is not
            return f"nccl4py cannot load NCCL ({type(e).__name__}: {e})"
        kind, _, reason = nccl_devices()
        if kind is None:
            return f"no device for NCCL: {reason}"
        from ember.distributed.mpi import MPIBackend

        mpi = MPIBackend.probe()
        return None if mpi is None else f"needs MPI to start: {mpi}"

    def __init__(self) -> None:
        nc = importlib.import_module("nccl.core")

        from ember.device.registry import Device
        from ember.distributed import local_rank
        from ember.distributed.mpi import MPIBackend

        kind, count, reason = nccl_devices()
        if kind is None:
            raise RuntimeError(f"the nccl backend has no device: {reason}")
        self.nc = nc
        self.boot = MPIBackend()
        self.rank, self.world_size = self.boot.rank, self.boot.world_size
        lr = local_rank()
        if lr >= count:
            raise RuntimeError(f"rank {self.rank} is local rank {lr} on {os.uname().nodename}, which has only {count} "
                               f"{kind} device(s) NCCL can address: start at most one rank per device")
        self.memory = kind
        self.device_name = f"{kind}:{lr}" if lr else kind
        self.device = Device[self.device_name]
        uid = nc.get_unique_id() if self.rank == 0 else nc.get_unique_id(empty=True)
        uid_bytes = bytearray(bytes(uid))
        self.boot.comm.Bcast(uid_bytes, root=0)
        self.comm = nc.Communicator.init(self.world_size, self.rank, nc.UniqueId.from_bytes(bytes(uid_bytes)))

    def _check(self, buf: Any) -> _ArrayInterface:
        from ember.device.registry import Device

        if Device.canonicalize(buf.device) != Device.canonicalize(self.device_name):
            raise ValueError(f"the nccl backend of rank {self.rank} works on {self.device_name}; the tensor is on "
                             f"{buf.device}")
        nccl_dtype(buf.dtype)
        return _ArrayInterface(int(self.device.nccl_pointer(buf.opaque)), buf.size, buf.dtype)

    def _stream(self) -> int:
        return int(self.device.nccl_stream())

    def all_reduce(self, buf: Any, op: str) -> Request:
        x = self._check(buf)
        self.comm.allreduce(x, x, getattr(self.nc, nccl_op(op)), stream=self._stream())
        return _StreamRequest(self.device)

    def broadcast(self, buf: Any, src: int) -> Request:
        x = self._check(buf)
        self.comm.broadcast(x, x, src, stream=self._stream())
        return _StreamRequest(self.device)

    def all_gather(self, send: Any, recv: Any) -> Request:
        self.comm.allgather(self._check(send), self._check(recv), stream=self._stream())
        return _StreamRequest(self.device)

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> Request:
        self.comm.reduce_scatter(self._check(send), self._check(recv), getattr(self.nc, nccl_op(op)),
                                 stream=self._stream())
        return _StreamRequest(self.device)

    def barrier(self) -> Request:
        return self.boot.barrier()

    def abort(self, code: int = 1) -> None:
        try:
            self.comm.abort()
        finally:
            self.boot.abort(code)

    def close(self) -> None:
        try:
            self.comm.destroy()
        except Exception:
            pass
        self.boot.close()
