"""Training across processes and machines: ranks, a world, and collectives on tensors.

Start the processes with the launcher (``python -m ember.distributed.run -n 4 train.py``), ``mpiexec`` or
Slurm's ``srun``; in each, ``init()`` joins the job::

    import ember.distributed as dist
    dist.init()                                  # rank and world size from the launcher
    t = Tensor([float(dist.rank())])
    dist.all_reduce(t)                           # in place: t is the sum over the ranks
    work = dist.all_reduce(g, op="avg", async_op=True)
    ...                                          # other work while the bytes move
    work.wait()

Collectives change the tensor given to them (``all_reduce``, ``broadcast``) or return a new tensor
(``all_gather``, ``reduce_scatter``); the tensor is realized first. On a backend for host memory (MPI) a tensor
in host memory (CPU, PYTHON devices) is reduced in its own buffer; one on another device is copied to the
host and back. A tensor on several devices of this process (``shard``/``to(devices)``) is gathered, reduced
across the ranks and put back with the same placement.

Every wait is bounded (``EMBER_DIST_TIMEOUT`` seconds, default 300): a peer that died or never reaches the
collective raises :class:`DistributedTimeout` naming the operation instead of hanging the job.
"""
from __future__ import annotations

import atexit
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from ember.distributed.backend import (
    ENTRY_POINT_GROUP,
    REDUCE_OPS,
    Backend,
    BackendInfo,
    DoneRequest,
    Request,
    backends,
    get_backend,
)
from ember.dtype import dtypes, to_np_dtype
from ember.engine import realize
from ember.engine.realize import ExecItem, Runner
from ember.helpers import getenv
from ember.ir.lazy import base_of
from ember.schedule import forget_readers
from ember.tensor import Tensor

if TYPE_CHECKING:
    import numpy as np
else:
    from ember.helpers import lazy_numpy as np

__all__ = ["ENTRY_POINT_GROUP", "Backend", "BackendInfo", "DataParallel", "DistributedError", "DistributedSampler",
           "DistributedTimeout", "Request", "ShardedOptimizer", "Work", "all_gather", "all_reduce", "backends",
           "barrier", "broadcast", "get_backend", "init", "is_initialized", "local_rank", "rank", "reduce_scatter",
           "shutdown", "world_size"]

#: Every op ``all_reduce`` and ``reduce_scatter`` take.
OPS = (*REDUCE_OPS, "avg")

#: (rank variable, size variable, what sets them), in the order they are looked for.
_LAUNCH_ENV = (
    ("EMBER_RANK", "EMBER_WORLD_SIZE", "EMBER_RANK/EMBER_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPICH's mpiexec"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMIX_RANK", "PMIX_SIZE", "a PMIx launcher"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm's srun"),
)
_LOCAL_RANK_ENV = ("EMBER_LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


class DistributedError(RuntimeError):
    """A collective could not be done (not initialized, a peer failed ...)."""


class DistributedTimeout(DistributedError):
    """A collective did not complete in time: a peer died, hangs, or called a different collective."""


class _State:
    backend: Backend | None = None
    timeout: float = 300.0


_state = _State()


def launch_env() -> tuple[int, int, str] | None:
    """(rank, world size, source) as the launcher's environment gives them, or None outside a launcher."""
    for rank_var, size_var, source in _LAUNCH_ENV:
        if rank_var in os.environ and size_var in os.environ:
            try:
                r, n = int(os.environ[rank_var]), int(os.environ[size_var])
            except ValueError as e:
                raise ValueError(f"{rank_var}={os.environ[rank_var]!r} / {size_var}={os.environ[size_var]!r} "
                                 f"(set by {source}) are not integers") from e
            if n < 1 or not 0 <= r < n:
                raise ValueError(f"{rank_var}={r} is not a rank of a world of {size_var}={n} (set by {source})")
            return r, n, source
    return None


def init(backend: str | None = None, timeout: float | None = None) -> Backend:
    """Join the job: pick the backend (``backend``, else ``EMBER_DIST_BACKEND``, else ``"mpi"``) and check that
    its rank and world size agree with the launcher's environment. Calling it again returns the same backend.

    ``timeout`` (seconds; default ``EMBER_DIST_TIMEOUT`` or 300) bounds every wait on a collective.
    """
    name = (backend or os.environ.get("EMBER_DIST_BACKEND") or "mpi").lower()
    if _state.backend is not None:
        if _state.backend.name != name:
            raise DistributedError(f"ember.distributed is already initialized with the {_state.backend.name!r} "
                                   f"backend; cannot switch to {name!r} (call shutdown() first)")
        return _state.backend
    t = getenv("EMBER_DIST_TIMEOUT", 300.0) if timeout is None else timeout
    if not t > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {t!r}")
    env = launch_env()
    b = get_backend(name)()
    if env is not None and (env[0], env[1]) != (b.rank, b.world_size):
        b.close()
        raise DistributedError(
            f"{env[2]} says rank {env[0]} of {env[1]}, but the {name} backend sees rank {b.rank} of {b.world_size}: "
            f"start every rank with the launcher (python -m ember.distributed.run -n {env[1]} ...), mpiexec or srun")
    _state.backend, _state.timeout = b, float(t)
    _write_rundir(f"rank{b.rank}.pid", f"{os.getpid()} {socket.gethostname()}\n")
    if b.world_size > 1 and not isinstance(sys.excepthook, _AbortOnError):
        sys.excepthook = _AbortOnError(sys.excepthook)
    return b


def _write_rundir(name: str, text: str) -> None:
    """A file for the launcher (EMBER_DIST_RUNDIR): it maps a process that died back to its rank with these."""
    rundir = os.environ.get("EMBER_DIST_RUNDIR")
    if rundir:
        try:
            with open(os.path.join(rundir, name), "w") as f:
                f.write(text)
        except OSError:
            pass


class _AbortOnError:
    """``sys.excepthook`` while a job runs: an uncaught exception on one rank stops every rank (MPI_Abort) instead
    of leaving the others waiting in their next collective; the launcher is told which rank failed and why."""

    def __init__(self, previous: Callable[..., Any]):
        self.previous = previous

    def __call__(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        self.previous(exc_type, exc, tb)
        b = _state.backend
        if b is None or b.world_size == 1:
            return
        _write_rundir(f"rank{b.rank}.error", f"{exc_type.__name__}: {exc}".splitlines()[0][:500])
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        b.abort(1)


def shutdown() -> None:
    """Leave the job (the backend is closed); ``init()`` may be called again."""
    if _state.backend is not None:
        _state.backend.close()
        _state.backend = None


atexit.register(shutdown)


def is_initialized() -> bool:
    """Whether :func:`init` was called (and :func:`shutdown` was not)."""
    return _state.backend is not None


def _backend() -> Backend:
    if _state.backend is None:
        raise DistributedError("ember.distributed is not initialized: call ember.distributed.init() first")
    return _state.backend


def rank() -> int:
    """This process's rank, 0 .. world_size() - 1."""
    return _backend().rank


def world_size() -> int:
    """The number of processes in the job."""
    return _backend().world_size


def local_rank() -> int:
    """This process's index among the ranks on its machine (from the launcher; 0 when it does not say)."""
    for var in _LOCAL_RANK_ENV:
        if var in os.environ:
            return int(os.environ[var])
    return 0


# --- waiting -------------------------------------------------------------------------------------------------


class Work:
    """A collective in flight. ``wait()`` blocks until it is done (bounded by the timeout) and returns its
    result tensor; ``is_completed()`` checks without blocking."""

    def __init__(self, what: str, request: Request, finish: Callable[[], Any], timeout: float):
        self.what, self._request, self._finish, self.timeout = what, request, finish, timeout
        self._result: Any = None
        self._done = False
        self._started = time.monotonic()

    def is_completed(self) -> bool:
        """True once the data has arrived (the result is then written back by ``wait()``)."""
        return self._done or self._request.test()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the collective is done and return its result (the tensor itself for in-place ops, None
        for a barrier)."""
        if self._done:
            return self._result
        limit = self.timeout if timeout is None else timeout
        req = self._request
        start = time.monotonic()
        pause = 0.0
        while not req.test():
            now = time.monotonic()
            if now - start > limit:
                req.cancel()
                raise DistributedTimeout(
                    f"{self.what} on rank {_state.backend.rank if _state.backend else '?'} did not complete within "
                    f"{limit:g} s (EMBER_DIST_TIMEOUT): another rank died, hangs, or called a different collective")
            # spin (MPI makes progress only inside its calls, so a sleeping rank stalls every peer's transfer)
            # for as long as a large collective takes; only a wait past that backs off, up to 1 ms
            if now - start > 2.0:
                pause = min(max(pause * 2, 2e-5), 1e-3)
                time.sleep(pause)
            else:  # let a peer rank sharing this core run (more ranks than cores)
                os.sched_yield()
        self._result, self._done = self._finish(), True
        return self._result


def _run(what: str, request: Request, finish: Callable[[], Any], async_op: bool) -> Any:
    work = Work(what, request, finish, _state.timeout)
    return work if async_op else work.wait()


# --- staging buffers for a backend ---------------------------------------------------------------------------

_UPCAST = (dtypes.float16, dtypes.bfloat16)  # no MPI reduction type: reduced as float32


def _own_buffer(t: Tensor) -> Any:
    """The realized buffer holding exactly ``t``'s elements, made ``t``'s own (a view is copied first)."""
    t.realize()
    c = t.contiguous()
    if c is not t:
        t.lazydata = c.realize().lazydata
    return t._buffer()


class _HostStage:
    """A buffer's elements as a writable numpy array for a host backend, and how to put a result back.

    Host memory is used in place (a view of the buffer); other devices get a host copy, written back by
    ``commit()``. float16 and bfloat16 are reduced as float32 when ``reduce`` is set."""

    def __init__(self, buf: Any, reduce: bool):
        from ember.device.registry import Device

        self.buf, self.dtype = buf, buf.dtype
        Device[buf.device].synchronize()  # the kernels that wrote it have finished
        npdt = to_np_dtype(buf.dtype)
        self.copy = True
        arr: Any = None
        try:
            arr = np.frombuffer(buf.allocator.as_buffer(buf.opaque), dtype=npdt)
            self.copy = False
        except NotImplementedError:
            arr = np.frombuffer(buf.as_bytes(), dtype=npdt)
        self.upcast = reduce and buf.dtype in _UPCAST
        if self.upcast:
            from ember.dtype import bf16_to_f32

            arr = bf16_to_f32(arr) if buf.dtype == dtypes.bfloat16 else arr.astype(np.float32)
            arr = np.ascontiguousarray(arr, dtype=np.float32)
        self.arr: Any = arr

    def divide(self, n: int) -> None:
        self.arr /= n

    def commit(self) -> None:
        """Write ``self.arr`` back into the buffer when it is not the buffer's own memory."""
        if self.upcast:
            from ember.dtype import f32_to_bf16

            out = f32_to_bf16(self.arr) if self.dtype == dtypes.bfloat16 else self.arr.astype(np.float16)
            self.buf.copyin(memoryview(np.ascontiguousarray(out)).cast("B"))
        elif self.copy:
            self.buf.copyin(memoryview(self.arr).cast("B"))


class _DeviceStage:
    """A buffer handed as it is to a backend that works on its device's memory (NCCL on CUDA)."""

    def __init__(self, buf: Any, b: Backend, what: str):
        from ember.device.registry import Device

        if str(buf.device).partition(":")[0] != b.memory:
            raise ValueError(f"{what}: the {b.name} backend works on {b.memory} tensors; this one is on {buf.device} "
                             f"(move it with .to(...) or use a host backend such as mpi)")
        self.arr: Any = buf
        Device[buf.device].synchronize()

    def divide(self, n: int) -> None:
        raise NotImplementedError("device backends are given op 'avg' itself (see Backend)")

    def commit(self) -> None:
        pass


def _start(b: Backend, kind: str, bufs: list[Any], op: str | None, src: int) -> tuple[Request, Callable[[], None]]:
    """Start collective ``kind`` on realized buffers (the output is the last); returns the request and what
    completes it once the request is done (the average's division, the copy back)."""
    reduce = kind in ("all_reduce", "reduce_scatter")
    stages = [_HostStage(buf, reduce) if b.memory == "host" else _DeviceStage(buf, b, kind) for buf in bufs]
    native = op != "avg" or b.memory != "host"  # device backends average themselves (NCCL's ncclAvg)
    base_op = op if native or op is None else "sum"
    arrs = [s.arr for s in stages]
    if kind == "all_reduce":
        req = b.all_reduce(arrs[0], base_op or "sum")
    elif kind == "broadcast":
        req = b.broadcast(arrs[0], src)
    elif kind == "all_gather":
        req = b.all_gather(arrs[0], arrs[1])
    else:
        req = b.reduce_scatter(arrs[0], arrs[1], base_op or "sum")

    def finish() -> None:
        if not native:
            stages[-1].divide(b.world_size)
        stages[-1].commit()
    return req, finish


class CollectiveRunner(Runner):
    """A collective as a step of a captured :class:`~ember.TinyJit` graph: a replay runs it (blocking) on the
    buffers it was recorded with, between the kernels that write them and those that read them."""

    def __init__(self, kind: str, op: str | None, src: int, device: str, what: str):
        self.kind, self.op, self.src, self.what, self.device = kind, op, src, what, device
        self.display_name = f"<{kind}{'(' + op + ')' if op else ''}>"
        self.estimated_ops = self.estimated_mem = 0

    def __call__(self, bufs: list[Any], wait: bool = False, var_vals: dict[str, int] | None = None) -> float | None:
        st = time.perf_counter()
        req, finish = _start(_backend(), self.kind, bufs, self.op, self.src)
        Work(self.what, req, finish, _state.timeout).wait()
        return time.perf_counter() - st


def _collective(kind: str, src_t: Tensor, out: Tensor | None, op: str | None, src: int, what: str,
                async_op: bool) -> Any:
    """Run ``kind`` from ``src_t`` into ``out`` (``src_t`` itself when None) and return the output tensor."""
    b = _backend()
    bufs = [_own_buffer(src_t)] + ([_own_buffer(out)] if out is not None else [])
    result = src_t if out is None else out
    req, finish_start = _start(b, kind, bufs, op, src)
    written = base_of(result.lazydata)

    def finish() -> Tensor:
        finish_start()
        # results computed earlier from the buffer's old contents must not be reused (as after an assign)
        forget_readers({written})
        return result
    if realize.capturing:  # inside TinyJit's capture: the replay runs the collective too
        item = ExecItem(CollectiveRunner(kind, op, src, bufs[-1].device, what), bufs)
        for capture in realize.capturing:
            capture(item)
    return _run(what, req, finish, async_op)


def _check_tensor(t: Any, what: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} takes a Tensor, got {type(t).__name__}")
    if not all(isinstance(s, int) for s in t.shape):
        raise ValueError(f"{what}: a tensor with symbolic shape {t.shape} cannot be sent (bind its variables first)")
    return t


def _check_op(op: str, t: Tensor, what: str) -> str:
    if op not in OPS:
        raise ValueError(f"{what}: unknown op {op!r}; expected one of {', '.join(OPS)}")
    if op == "avg" and not dtypes.is_float(t.dtype):
        raise TypeError(f"{what}: op 'avg' needs a floating-point tensor, got {t.dtype} (use 'sum')")
    return op


def _multi(t: Tensor) -> bool:
    return isinstance(t.device, tuple)


def _from_multi(t: Tensor) -> Tensor:
    """A one-device tensor holding a multi-device tensor's (gathered) value, on its first device."""
    if realize.capturing:
        raise NotImplementedError("a collective on a tensor on several devices cannot be captured by TinyJit yet")
    return t.to(t.device[0]).contiguous().realize()


def _to_multi(t: Tensor, value: Tensor) -> Tensor:
    """Give the multi-device tensor ``t`` the value ``value`` (one device), with ``t``'s placement; returns ``t``."""
    t.lazydata = value.shard_like(t).realize().lazydata
    return t


# --- collectives ---------------------------------------------------------------------------------------------


def _dispatch(kind: str, t: Tensor, what: str, async_op: bool, again: Callable[[Tensor], Any],
              local: Callable[[], Tensor], shape: tuple[int, ...] | None = None, op: str | None = None,
              src: int = 0) -> Any:
    """Run the checked collective ``kind`` on ``t``, in place (``shape`` None) or into a new tensor of ``shape``.

    A tensor on several devices of this process is hierarchical: its value inside the process (replicas agree;
    shards are gathered) goes through ``again`` across the ranks, and the result is put back with ``t``'s
    placement (in place) or returned on ``t``'s devices. With no element to send or no peer, ``local()`` is the
    result."""
    if _multi(t):
        one = _from_multi(t)
        inner = again(one)
        done = (lambda: (inner.wait(), _to_multi(t, one))[1]) if shape is None else (lambda: inner.wait().to(t.device))
        return _run(what, inner._request, done, async_op)
    if t.numel() == 0 or _backend().world_size == 1:
        return _run(what, DoneRequest(), local, async_op)
    return _collective(kind, t, None if shape is None else _new_like(t, shape), op, src, what, async_op)


def all_reduce(t: Tensor, op: str = "sum", async_op: bool = False) -> Any:
    """Reduce ``t`` over every rank with ``op`` (sum, prod, max, min, avg) and leave the result in ``t``.

    Returns ``t``, or a :class:`Work` whose ``wait()`` returns it when ``async_op``."""
    t = _check_tensor(t, "all_reduce")
    op = _check_op(op, t, "all_reduce")
    return _dispatch("all_reduce", t, f"all_reduce({op}) of {t.shape} {t.dtype}", async_op,
                     lambda one: all_reduce(one, op, async_op=True), lambda: t, op=op)


def broadcast(t: Tensor, src: int = 0, async_op: bool = False) -> Any:
    """Give ``t`` on every rank the value it has on rank ``src`` (in place); returns ``t`` (or a :class:`Work`)."""
    t = _check_tensor(t, "broadcast")
    n = _backend().world_size
    if not isinstance(src, int) or not 0 <= src < n:
        raise ValueError(f"broadcast: src={src!r} is not a rank of this world of {n}")
    return _dispatch("broadcast", t, f"broadcast from rank {src} of {t.shape} {t.dtype}", async_op,
                     lambda one: broadcast(one, src, async_op=True), lambda: t, src=src)


def _new_like(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    return Tensor.empty(*shape, dtype=t.dtype, device=t.device).contiguous().realize()


def all_gather(t: Tensor, async_op: bool = False) -> Any:
    """Every rank's ``t`` concatenated along axis 0 in rank order (shape ``(world * n, ...)``; a 0-d ``t``
    gives shape ``(world,)``); a new tensor on ``t``'s device (or a :class:`Work` returning it)."""
    t = _check_tensor(t, "all_gather")
    n = _backend().world_size
    shape = (n,) if t.ndim == 0 else (n * t.shape[0], *t.shape[1:])
    return _dispatch("all_gather", t, f"all_gather of {t.shape} {t.dtype}", async_op,
                     lambda one: all_gather(one, async_op=True), lambda: t.reshape(shape).contiguous().realize(),
                     shape)


def reduce_scatter(t: Tensor, op: str = "sum", async_op: bool = False) -> Any:
    """Reduce ``t`` over the ranks and return this rank's part: axis 0 split into ``world_size`` equal chunks,
    chunk ``rank()`` (shape ``(n // world, ...)``); a new tensor (or a :class:`Work` returning it)."""
    t = _check_tensor(t, "reduce_scatter")
    op = _check_op(op, t, "reduce_scatter")
    n = _backend().world_size
    if t.ndim == 0 or t.shape[0] % n:
        raise ValueError(f"reduce_scatter: axis 0 of shape {t.shape} does not split evenly over {n} ranks")
    shape = (t.shape[0] // n, *t.shape[1:])
    # with no element the part has the part's shape (a world of one: all of t)
    return _dispatch("reduce_scatter", t, f"reduce_scatter({op}) of {t.shape} {t.dtype}", async_op,
                     lambda one: reduce_scatter(one, op, async_op=True), lambda: t[:shape[0]].contiguous().realize(),
                     shape, op)


def barrier(async_op: bool = False) -> Any:
    """Wait until every rank has reached this call (returns None, or a :class:`Work`)."""
    b = _backend()
    return _run("barrier", b.barrier() if b.world_size > 1 else DoneRequest(), lambda: None, async_op)


def __getattr__(name: str) -> Any:
    # the training helpers import the optimizer and state modules: loaded on first use
    if name in ("DataParallel", "DistributedSampler", "ShardedOptimizer", "save_checkpoint"):
        from ember.distributed import parallel

        return getattr(parallel, name)
    raise AttributeError(f"module 'ember.distributed' has no attribute {name!r}")
