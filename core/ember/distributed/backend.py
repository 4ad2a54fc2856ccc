"""Communication backends: what a backend implements, and how one is found (built in or by entry point).

A backend moves bytes between the processes of one job; it knows nothing of tensors. Host backends
(``memory = "host"``) are handed C-contiguous numpy arrays, device backends (``memory`` = a device kind such as
``"CUDA"``) the realized :class:`~ember.device.buffer.Buffer` of a tensor. Every operation returns a
:class:`Request`; the front end (:mod:`ember.distributed`) waits on it with a timeout, so a peer that died or
never arrives is reported instead of hanging the process.

Third-party backends (UCC, Gloo ...) register under the entry-point group ``ember.distributed.backends``::

    [options.entry_points]
    ember.distributed.backends =
        ucc = ember_ucc:UCCBackend

The object named is a :class:`Backend` subclass; ``EMBER_DIST_BACKEND=ucc`` (or ``init(backend="ucc")``) picks it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

#: The entry-point group third-party backends register under.
ENTRY_POINT_GROUP = "ember.distributed.backends"

#: Reductions every backend offers. "avg" is one more: for host backends the front end sums and divides; device
#: backends (``memory`` other than "host") are given "avg" itself (NCCL has it).
REDUCE_OPS = ("sum", "prod", "max", "min")


class Request:
    """A started operation. ``test()`` says whether it finished (making progress); backends subclass it."""

    def test(self) -> bool:
        """True once the operation is complete (the output buffer holds the result)."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Give up on the operation (after a timeout); the default does nothing."""


class DoneRequest(Request):
    """An operation that completed when it was started (a blocking call, or nothing to send)."""

    def test(self) -> bool:
        return True


class Backend:
    """One process's endpoint of a job. Subclasses set ``name`` and ``memory`` and implement the operations.

    Arrays passed to the operations are C-contiguous and stay alive (and untouched) until the request
    completes. ``all_gather`` fills ``recv`` (``world_size`` times ``send``'s bytes) in rank order;
    ``reduce_scatter`` reduces ``send`` (``world_size`` equal chunks) and leaves chunk ``rank`` in ``recv``.
    """

    name = "?"
    #: "host" (numpy arrays in host memory) or the device kind whose buffers the backend takes ("CUDA").
    memory = "host"

    rank: int
    world_size: int

    @classmethod
    def probe(cls) -> str | None:
        """Why this backend cannot run here (a missing package, no devices ...), or None when it can."""
        return None

    def all_reduce(self, buf: Any, op: str) -> Request:
        raise NotImplementedError

    def broadcast(self, buf: Any, src: int) -> Request:
        raise NotImplementedError

    def all_gather(self, send: Any, recv: Any) -> Request:
        raise NotImplementedError

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> Request:
        raise NotImplementedError

    def barrier(self) -> Request:
        raise NotImplementedError

    def abort(self, code: int = 1) -> None:
        """Stop every process of the job (after an unrecoverable error on this one); the default only exits."""
        raise SystemExit(code)

    def close(self) -> None:
        """Release what the backend holds (called by :func:`ember.distributed.shutdown`)."""


@dataclass(frozen=True)
class BackendInfo:
    """A backend the registry knows: its name, where it comes from, and how to load its class."""

    name: str
    origin: str
    load: Callable[[], type[Backend]]

    def probe(self) -> str | None:
        """Why the backend is unusable here, or None; a backend that fails to import says why."""
        try:
            cls = self.load()
        except Exception as e:
            return f"cannot load {self.origin}: {type(e).__name__}: {e}"
        try:
            return cls.probe()
        except Exception as e:
            return f"probe failed: {type(e).__name__}: {e}"


def _builtin(module: str, attr: str) -> Callable[[], type[Backend]]:
    return lambda: getattr(importlib.import_module(module), attr)


_BUILTIN = {
    "mpi": BackendInfo("mpi", "ember (mpi4py)", _builtin("ember.distributed.mpi", "MPIBackend")),
    "nccl": BackendInfo("nccl", "ember (nccl4py)", _builtin("ember.distributed.nccl", "NCCLBackend")),
}


def backends() -> dict[str, BackendInfo]:
    """Every known backend by name: the built-in ones, then those of installed distributions' entry points.

    A distribution may not take a built-in name (it is listed under ``name@distribution`` instead)."""
    from ember.device.entry_points import entry_points

    out = dict(_BUILTIN)
    for ep in entry_points(ENTRY_POINT_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        name = ep.name.lower() if ep.name.lower() not in out else f"{ep.name.lower()}@{dist}"
        out[name] = BackendInfo(name, f"{dist} ({ep.value})", _entry_point_loader(ep))
    return out


def _entry_point_loader(ep: Any) -> Callable[[], type[Backend]]:
    def load() -> type[Backend]:
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a subclass of ember.distributed.Backend")
        return cls
    return load


def get_backend(name: str) -> type[Backend]:
    """The backend class called ``name``; a clear error when it is unknown or unusable here."""
    known = backends()
    info = known.get(name.lower())
    if info is None:
        raise ValueError(f"unknown distributed backend {name!r}; known: {', '.join(sorted(known))}")
    reason = info.probe()
    if reason is not None:
        raise RuntimeError(f"distributed backend {name!r} is unusable here: {reason}")
    return info.load()
