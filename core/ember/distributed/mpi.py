"""The MPI backend: collectives on host memory through ``mpi4py`` (``pip install 'ember[mpi]'``).

With MPICH's wheel from PyPI nothing else is needed: ``mpi4py`` loads the wheel's ``libmpi`` and the wheel
puts ``mpiexec`` next to the interpreter. Every operation is MPI's nonblocking form (``Iallreduce`` ...)
on a private duplicate of ``COMM_WORLD``, so the front end can wait with a timeout and report a peer that
never arrives instead of blocking forever.
"""
from __future__ import annotations

from typing import Any

from ember.distributed.backend import Backend, Request

_INSTALL_HINT = "pip install 'ember[mpi]' (mpi4py and MPICH's wheel)"


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


class _MPIRequest(Request):
    def __init__(self, req: Any):
        self.req = req

    def test(self) -> bool:
        return bool(self.req.Test())

    def cancel(self) -> None:
        # MPI cannot cancel a collective; the job is aborted by the caller after a timeout
        pass


class MPIBackend(Backend):
    """Host-memory collectives over MPI. The rank and world size are MPI's (``COMM_WORLD``)."""

    name = "mpi"
    memory = "host"

    @classmethod
    def probe(cls) -> str | None:
        try:
            MPI = _mpi()
        except ImportError as e:
            return f"mpi4py is not installed ({e}); {_INSTALL_HINT}"
        except Exception as e:  # mpi4py present, but no MPI library it can load
            return f"mpi4py cannot load an MPI library ({type(e).__name__}: {e}); {_INSTALL_HINT}"
        try:
            MPI.Get_library_version()
        except Exception as e:
            return f"the MPI library does not answer ({type(e).__name__}: {e})"
        return None

    def __init__(self) -> None:
        MPI = _mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()  # a private communicator: the user's own MPI traffic cannot mix in
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)  # errors raise (mpi4py turns the codes into exceptions)
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
        # MPI defines only logical reductions on booleans: sum and max are "or", prod and min "and"
        self._bool_ops = {"sum": MPI.LOR, "prod": MPI.LAND, "max": MPI.LOR, "min": MPI.LAND}

    def _op(self, buf: Any, op: str) -> Any:
        return (self._bool_ops if buf.dtype.kind == "b" else self._ops)[op]

    def all_reduce(self, buf: Any, op: str) -> Request:
        return _MPIRequest(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self._op(buf, op)))

    def broadcast(self, buf: Any, src: int) -> Request:
        return _MPIRequest(self.comm.Ibcast(buf, root=src))

    def all_gather(self, send: Any, recv: Any) -> Request:
        return _MPIRequest(self.comm.Iallgather(send, recv))

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> Request:
        return _MPIRequest(self.comm.Ireduce_scatter_block(send, recv, op=self._op(send, op)))

    def barrier(self) -> Request:
        return _MPIRequest(self.comm.Ibarrier())

    def abort(self, code: int = 1) -> None:
        self.MPI.COMM_WORLD.Abort(code)

    def close(self) -> None:
        try:
            self.comm.Free()
        except Exception:  # MPI already finalized at interpreter exit
            pass
