"""Deferred validity checks: torch's errors for bad index values and integer division by zero, without a
host round trip per op.

An index *tensor* is lazy, so an op cannot look at its values when it builds the graph. Instead, an op
that takes one (``t[idx]``, ``t[idx] = v``, ``gather``, ``scatter``, ``index_select``, ``Embedding``,
``one_hot``, ``nll_loss``/``cross_entropy``, integer ``//`` and ``%`` by a tensor) registers a check: the
tensor's node, how to summarize its values (their minimum and maximum, or "any divisor is zero") and the
message to raise. At the next read to the host (``numpy``, ``item``, ``tolist``) the pending checks'
summaries are built and realized in one schedule together with nothing else, their few bytes are read,
and the first that failed raises.
So a bad index never gives a silent wrong answer: the error comes at the latest with the first value the
program looks at, and a program that reads nothing runs at full speed.

Pending checks belong to the thread (and asyncio task) whose op registered them: a read runs that thread's
checks, so a bad index in one thread raises there, not in an unrelated read of another. A read also runs the
pending checks of other threads whose checked tensor its value was computed from (a lazy tensor handed to
another thread to read). Not covered: a tensor one thread realized (``realize()``, which runs no checks) and
another reads, while the first has not read anything since; the first thread's next read raises.

The cost is one small reduction kernel per checked op, run with the next read (measured in
``bench/bench_index_checks.py``). A checked tensor that is already in a buffer by then (labels a training
step computed from) and small (``HOST_CHECK_MAX``) is instead copied to the host and summarized there:
a copy of a few kilobytes costs less than a kernel, whose first build in a process with an empty cache
takes 50-100 ms. ``INDEX_CHECK=0`` turns the checks off; more than ``MAX_PENDING``
unread checks are flushed early so a loop that never reads keeps bounded memory.

Weights given to ``multinomial`` are checked the same way (no negative, nan or inf value, no row of zeros),
raising :class:`InvalidDistribution`, a ``RuntimeError`` as in torch.

Errors raise :class:`IndexOutOfRange`, which is both an ``IndexError`` and a ``RuntimeError``: torch raises
``IndexError`` for ``t[idx]``, ``Embedding`` and the losses but ``RuntimeError`` for ``gather``,
``scatter`` and ``one_hot``, and an ``except`` written for either catches ember's error.
"""
from __future__ import annotations

import contextvars
import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ember.dtype import STRUCT_CODES, DType, dtypes, to_np_dtype
from ember.helpers import ContextVar, loaded_numpy
from ember.ir.lazy import buffers, realized
from ember.ir.uop import Ops, UOp

if TYPE_CHECKING:
    import numpy as np

    from ember.tensor import Tensor
else:
    from ember.helpers import lazy_numpy as np

#: ``INDEX_CHECK=0`` skips the deferred checks (out-of-range indices then select nothing).
INDEX_CHECK = ContextVar("INDEX_CHECK", 1)
#: Unread checks kept before they are flushed without waiting for a read.
MAX_PENDING = 256
#: The most elements of a checked tensor that is read to the host (when already in a buffer) and
#: summarized there instead of by a kernel.
HOST_CHECK_MAX = 1 << 18


class IndexOutOfRange(IndexError, RuntimeError):
    """An index tensor held a value outside the indexed dimension (both of torch's exception types)."""


class IntegerDivisionByZero(RuntimeError, ZeroDivisionError):
    """An integer tensor was divided by a tensor holding 0 (torch raises RuntimeError("ZeroDivisionError"))."""


class InvalidDistribution(RuntimeError):
    """The weights given to ``multinomial`` held a negative, nan or inf value, or a row of zeros."""


@dataclass(eq=False)  # by identity: kept in a WeakSet
class _Check:
    checked: UOp                                 # the checked tensor's node when the op was built
    summarize: Callable[[Tensor], Tensor]        # the checked tensor -> a few values, computed on the device
    on_host: Callable[[Any], list]               # its flat values (a list or an array) -> the same, on the host
    verdict: Callable[[list], str | None]        # the summary's values -> an error message, or None when fine
    error: type[Exception]
    outcome: list[str | None] = field(default_factory=list)  # [message or None] once run (run once, raised by all)


#: the running thread's (or task's) unread checks: a tuple, replaced on each change, because an asyncio task
#: starts from a copy of its creator's values and must not add to the creator's list
_pending: contextvars.ContextVar[tuple[_Check, ...]] = contextvars.ContextVar("ember.index_checks", default=())
#: the unread checks of every thread, for a read of a value built from another thread's checked tensor (a
#: check leaves when its thread flushes or discards it, or with the thread's context)
_unread: weakref.WeakSet[_Check] = weakref.WeakSet()
_unread_lock = threading.Lock()
#: set while the running thread computes checks (reading their summaries must not start another flush)
_running: contextvars.ContextVar[bool] = contextvars.ContextVar("ember.index_checks_running", default=False)


def index_in_range(index: Tensor, size: int, dim: int, *, negative_ok: bool = False,
                   message: str = "index {index} is out of bounds for dimension {dim} with size {size}",
                   ignore: int | None = None) -> None:
    """Check, at the next read, that every value of ``index`` lies in ``[0, size)`` (``[-size, size)`` when
    ``negative_ok``); values equal to ``ignore`` are skipped. ``message`` may name ``{index}``, ``{size}``
    and ``{dim}``."""
    if not INDEX_CHECK.value or index.numel() == 0:
        return
    lo = -size if negative_ok else 0
    wide = index.dtype.itemsize == 8 or (index.dtype.kind == "u" and index.dtype.itemsize == 4)  # uint32 > 2**31

    def summarize(t: Tensor) -> Tensor:
        vals = t if ignore is None else (t == ignore).where(lo, t)
        flat = vals.reshape(-1).cast(dtypes.int64 if wide else dtypes.int32)
        return type(t).cat(flat.min().reshape(1), flat.max().reshape(1))

    def verdict(v: list) -> str | None:
        low, high = int(v[0]), int(v[1])
        if high >= size:
            return message.format(index=high, size=size, dim=dim)
        if low < lo:
            return message.format(index=low, size=size, dim=dim)
        return None

    def on_host(a: Any) -> list:
        if isinstance(a, list):  # Python ints, as the summary's int64 cast sees them (uint64 above 2**63 wraps)
            vals = [x - (1 << 64) if x >= 1 << 63 else x for x in a]
            if ignore is not None:
                vals = [lo if x == ignore else x for x in vals]
            return [int(min(vals)), int(max(vals))]
        a = a.astype(np.int64)  # as the summary's cast: exact, but for uint64 above 2**63 (wraps, as there)
        if ignore is not None:
            a = np.where(a == ignore, lo, a)
        return [int(a.min()), int(a.max())]

    _add(_Check(index.lazydata, summarize, on_host, verdict, IndexOutOfRange))


def nonzero_divisor(divisor: Tensor) -> None:
    """Check, at the next read, that the integer ``divisor`` has no zero (torch raises for ``x // 0``)."""
    if not INDEX_CHECK.value or divisor.numel() == 0:
        return
    _add(_Check(divisor.lazydata, lambda t: (t == 0).reshape(-1).cast(dtypes.int32).max().reshape(1),
                lambda a: [int(0 in a if isinstance(a, list) else (a == 0).any())],
                lambda v: "ZeroDivisionError" if int(v[0]) else None, IntegerDivisionByZero))


def valid_distribution(weights: Tensor, what: str = "multinomial") -> None:
    """Check, at the next read, that the 1-D or 2-D ``weights`` hold no negative, nan or inf value and that no
    row is all zeros (torch raises for both; sampling them would give an arbitrary category)."""
    if not INDEX_CHECK.value or weights.numel() == 0:
        return
    k, shape = weights.shape[-1], weights.shape

    def summarize(t: Tensor) -> Tensor:
        x = t.reshape(-1, k)
        bad = ((x < 0) | (x != x) | (x == math.inf)).reshape(-1).cast(dtypes.int32).max()
        empty = ((x > 0).cast(dtypes.int32).max(1) == 0).cast(dtypes.int32).max()
        return type(t).cat(bad.reshape(1), empty.reshape(1))

    def on_host(a: Any) -> list:
        x = np.asarray(a, dtype=np.float64).reshape(-1, k)
        return [int(bool((~np.isfinite(x) | (x < 0)).any())), int(bool((x <= 0).all(axis=1).any()))]

    def verdict(v: list) -> str | None:
        if int(v[0]):
            return f"{what}: probability tensor of shape {shape} contains either inf, nan or element < 0"
        if int(v[1]):
            return f"{what}: invalid multinomial distribution (sum of probabilities <= 0) in a row of the " \
                   f"probability tensor of shape {shape}"
        return None

    _add(_Check(weights.lazydata, summarize, on_host, verdict, InvalidDistribution))


def _add(check: _Check) -> None:
    mine = _pending.get() + (check,)
    _pending.set(mine)
    with _unread_lock:
        _unread.add(check)
    if len(mine) >= MAX_PENDING:
        flush()


def pending() -> int:
    """How many checks wait for the running thread's next read."""
    return len(_pending.get())


def discard() -> None:
    """Drop the running thread's pending checks unread (tests, and a program that recovers from an error)."""
    mine = _pending.get()
    _pending.set(())
    _forget(mine)


def _forget(checks: tuple[_Check, ...]) -> None:
    if checks:
        with _unread_lock:
            for c in checks:
                _unread.discard(c)


def flush(read: Tensor | None = None) -> None:
    """Run the running thread's pending checks now (one schedule) and raise the first failure; with ``read``
    (the tensor about to be read), also other threads' pending checks of tensors ``read`` is computed from."""
    mine = _pending.get()
    theirs = _feeding(read, mine) if read is not None and len(_unread) and not _running.get() else []
    if not mine and not theirs:
        return
    _pending.set(())
    _forget(mine)  # another thread's checks stay: that thread raises their failures too, at its next read
    checks = [*mine, *theirs]
    _run([c for c in checks if not c.outcome])
    for c in checks:
        if c.outcome[0] is not None:
            raise c.error(c.outcome[0])


def _feeding(read: Tensor, mine: tuple[_Check, ...]) -> list[_Check]:
    """The other threads' pending checks whose checked node ``read``'s graph holds."""
    from ember.ir.uop import toposort

    with _unread_lock:
        own = set(map(id, mine))
        theirs = [c for c in list(_unread) if id(c) not in own]
    if not theirs:
        return []
    nodes = set(toposort([read.lazydata]))
    return [c for c in theirs if c.checked in nodes]


def _run(checks: list[_Check]) -> None:
    """Compute each check's outcome: on the host where it can, else by their summaries in one schedule."""
    token = _running.set(True)
    try:
        _run_unguarded(checks)
    finally:
        _running.reset(token)


def _run_unguarded(checks: list[_Check]) -> None:
    from ember.tensor import Tensor  # imported here: the tensor module imports this one

    values = [_on_host(c) for c in checks]
    # the summaries are built only now, for the checks the host cannot do (from the node seen at the op: the
    # tensor object may have been reassigned since)
    summaries = {i: c.summarize(Tensor(c.checked)) for i, (c, v) in enumerate(zip(checks, values)) if v is None}
    if summaries:
        Tensor.realize_all(*summaries.values())
    for i, c in enumerate(checks):
        msg = c.verdict(summaries[i].numpy().tolist() if i in summaries else values[i])
        if not c.outcome:  # (another thread may have run it meanwhile: the same values, the same outcome)
            c.outcome.append(msg)


def _on_host(check: _Check) -> list | None:
    """The summary's values computed on the host, when the checked tensor now lies whole in a buffer of an
    integer or bool dtype and is small; else ``None`` (its summary kernel runs)."""
    node = realized.get(check.checked, check.checked)
    base = node.src[0] if node.op is Ops.VIEW else node
    if base.op is not Ops.BUFFER or not isinstance(size := base.arg[2], int) or size > HOST_CHECK_MAX:
        return None
    if node.op is Ops.VIEW and not (node.arg.contiguous and node.arg.size == size):
        return None
    dtype = base.dtype
    if node.dtype != dtype or not isinstance(dtype, DType) or dtype.kind not in ("b", "i", "u"):
        return None
    if size == 0:
        return None
    raw = buffers[base].as_bytes()
    if loaded_numpy() is None and size <= HOST_LIST_MAX:  # a few values: not worth importing numpy (~37 ms)
        return check.on_host(memoryview(raw).cast("B").cast(STRUCT_CODES[dtype]).tolist())  # type: ignore[call-overload]
    return check.on_host(np.frombuffer(raw, dtype=to_np_dtype(dtype)))


#: the most values a host check reads as a Python list when numpy is not imported yet
HOST_LIST_MAX = 1 << 12
