"""The NCCL backend: collectives on CUDA buffers through ``nccl4py`` (``pip install 'ember[nccl]'``).

Each rank drives one GPU (``CUDA:<local rank>``). MPI is the bootstrap: rank 0 makes NCCL's unique id and
broadcasts it over MPI, then every rank joins the NCCL communicator. A collective takes the device pointer
of the tensor's buffer straight from the CUDA plugin's allocator and runs on that device's stream, after the
kernels that wrote it; ``wait()`` waits for the stream.
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


def _gpu_count() -> tuple[int, str | None]:
    """(number of CUDA devices, why none) through ember's CUDA plugin."""
    from ember.device.registry import Device

    reason = Device.probe("CUDA")
    if reason is not None:
        return 0, reason
    try:
        driver = importlib.import_module("ember_cuda.driver")
        return int(driver.gpu_count()), None
    except Exception as e:  # a CUDA device from another plugin: at least the one it probed
        return 1, f"{type(e).__name__}: {e}"


class _CudaArray:
    """A CUDA array interface (version 3) over an ember CUDA buffer, which nccl4py resolves to a pointer."""

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
    """CUDA-buffer collectives over NCCL; MPI gives the rank, the world size and the bootstrap."""

    name = "nccl"
    memory = "CUDA"

    @classmethod
    def probe(cls) -> str | None:
        try:
            importlib.import_module("nccl.core")
        except ImportError as e:
            return f"nccl4py is not installed ({e}); {_INSTALL_HINT}"
        except Exception as e:  # nccl4py present, but NCCL or the CUDA runtime it needs is not
            return f"nccl4py cannot load NCCL ({type(e).__name__}: {e})"
        count, reason = _gpu_count()
        if count == 0:
            return f"no CUDA device: {reason}"
        from ember.distributed.mpi import MPIBackend

        mpi = MPIBackend.probe()
        return None if mpi is None else f"needs MPI to start: {mpi}"

    def __init__(self) -> None:
        nc = importlib.import_module("nccl.core")

        from ember.device.registry import Device
        from ember.distributed import local_rank
        from ember.distributed.mpi import MPIBackend

        self.nc = nc
        self.boot = MPIBackend()
        self.rank, self.world_size = self.boot.rank, self.boot.world_size
        count, _ = _gpu_count()
        lr = local_rank()
        if lr >= count:
            raise RuntimeError(f"rank {self.rank} is local rank {lr} on {os.uname().nodename}, which has only {count} "
                               f"CUDA device(s): start at most one rank per GPU")
        self.device_name = f"CUDA:{lr}" if lr else "CUDA"
        self.device = Device[self.device_name]
        uid = nc.get_unique_id() if self.rank == 0 else nc.get_unique_id(empty=True)
        uid_bytes = bytearray(bytes(uid))
        self.boot.comm.Bcast(uid_bytes, root=0)
        self.comm = nc.Communicator.init(self.world_size, self.rank, nc.UniqueId.from_bytes(bytes(uid_bytes)))

    def _check(self, buf: Any) -> _CudaArray:
        from ember.device.registry import Device

        if Device.canonicalize(buf.device) != Device.canonicalize(self.device_name):
            raise ValueError(f"the nccl backend of rank {self.rank} works on {self.device_name}; the tensor is on "
                             f"{buf.device}")
        nccl_dtype(buf.dtype)
        return _CudaArray(buf.opaque.ptr, buf.size, buf.dtype)

    def _stream(self) -> Any:
        stream = getattr(self.device, "stream", None)  # the CUDA plugin's CUstream: NCCL takes its handle
        return None if stream is None else int(stream)

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
