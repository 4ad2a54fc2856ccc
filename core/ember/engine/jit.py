"""TinyJit: run a function's kernels again without running the function.

A training or decoding step builds the same graph every call: scheduling, looking up kernels
and launching them one by one costs far more host time than the kernels themselves. The jit
runs the function normally on its first call, records every kernel it runs on the second
(:data:`ember.engine.realize.capturing`), and from the third call on replays the recorded
kernels with only the input buffers (and symbolic variable values) swapped, through the
device's Graph where it has one (one batched launch) and a plain loop elsewhere.

What the function does on the host is not replayed: it must compute with tensors, realize what
it returns (the jit realizes returned tensors for it), and take the same non-tensor arguments
every call. Random numbers drawn inside are the exception: their key and counter words are
uploaded again before every replay, so each replay draws what an eager call would have drawn.

Results remembered from the first call that no replay can change (weights initialized lazily, drawn
then) are read by the capture, not recorded: replays run only what a model with realized weights runs
(:meth:`TinyJit._capture` says when a result counts as unchangeable, and what happens when it is not).

A memory planner lets intermediate buffers whose lifetimes in the recorded sequence do not
overlap share one allocation (:func:`plan_memory`).

Tensors are recognised by their ``lazydata`` graph node, so this module stays below the
Tensor layer.
"""
from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ember.device.buffer import Buffer
from ember.device.registry import Device
from ember.engine import realize, tiers
from ember.engine.realize import CompiledRunner, ExecItem, Runner
from ember.helpers import DEBUG, GlobalCounters, is_np_array
from ember.ir import guards
from ember.ir.lazy import base_of, buffers, realized
from ember.ir.symbolic import Variable, bound_vals, sint_max, unbind_uop
from ember.ir.uop import Ops, UOp, toposort
from ember.schedule import forget_readers

if TYPE_CHECKING:
    import numpy as np
else:
    from ember.helpers import lazy_numpy as np

R = TypeVar("R")


class JitError(RuntimeError):
    """A jitted function was called in a way its captured kernels cannot serve."""


# --- host uploads that a replay must redo ---------------------------------------------------------

_uploads: list[tuple[Any, Callable[[], np.ndarray]]] | None = None


def record_upload(tensor: Any, fresh: Callable[[], Any]) -> None:
    """While a function is captured: ``tensor`` was uploaded from the host and must get ``fresh()`` again
    before every replay (random key and counter words)."""
    if _uploads is not None:
        _uploads.append((tensor, fresh))


# --- arguments ----------------------------------------------------------------------------------------

def _is_tensor(x: Any) -> bool:
    return isinstance(getattr(x, "lazydata", None), UOp)


def _whole_buffer(x: UOp) -> bool:
    """Whether ``x`` is a buffer's elements in order (a symbolic size: the buffer sized for its maximum)."""
    if x.op is Ops.BUFFER:
        return True
    if x.op is not Ops.VIEW or x.src[0].op is not Ops.BUFFER or not x.arg.contiguous:
        return False
    size = x.arg.size
    return size == x.src[0].arg[2] or (isinstance(size, UOp) and sint_max(size) == x.src[0].arg[2])


def _rebind_results(ret: Any, var_vals: dict[str, int]) -> None:
    """Give the returned tensors whose sizes depend on a variable the sizes of this call's values (their
    buffers were sized for the variables' maxima when captured)."""
    for t in _tensors_in(ret):
        x = t.lazydata
        if x.op is Ops.VIEW and x.arg.symbolic:
            t.lazydata = UOp(Ops.VIEW, x.dtype, x.src, x.arg.rebind(var_vals))


def _shape_key(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """A tensor input's shape as a signature compares it: symbolic sizes by their variables, not values."""
    return tuple(unbind_uop(s, {}) if isinstance(s, UOp) else s for s in shape)


def input_buffer(t: Any) -> Buffer:
    """The buffer holding exactly the elements of tensor ``t``, realizing it (and giving ``t`` that buffer)
    when it is lazy math or a view."""
    for _ in range(3):
        x = t.lazydata
        if _whole_buffer(x):
            return buffers[base_of(x)].allocate()
        if x.op is Ops.VIEW:  # a strided or masked view: its elements need their own buffer
            x = UOp(Ops.CONTIGUOUS, x.dtype, (x,))
        t.lazydata = type(t)(x).realize().lazydata
    raise JitError(f"cannot place a jit input of shape {t.shape} in its own buffer")


@dataclass(frozen=True)
class _Signature:
    """What a replay needs to match: each tensor input's name, shape, dtype and device, the other
    arguments, and the symbolic variables passed (by name and range, not value)."""

    tensors: tuple[tuple[str, tuple[int, ...], Any, str], ...]
    others: tuple[tuple[str, Any], ...]


def _split_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[tuple[str, Any]], _Signature,
                                                                        dict[str, int]]:
    """(named tensor inputs, signature, bound variable values) of one call."""
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"argument {k!r}", v) for k, v in
                                                                  sorted(kwargs.items())]
    tensors = [(name, a) for name, a in named if _is_tensor(a)]
    var_vals: dict[str, int] = {}
    others: list[tuple[str, Any]] = []
    for name, a in named:
        if _is_tensor(a):
            continue
        if _tensors_in(a):
            raise JitError(f"jit {name} holds tensors inside a {type(a).__name__}: pass each tensor as an argument "
                           f"of its own, so replays can swap it")
        if isinstance(a, Variable):
            if a.val is None:
                raise JitError(f"jit {name}: the Variable {a.name!r} is not bound to a value (use .bind(n))")
            var_vals[a.name] = a.val
            others.append((name, ("Variable", a.name, a.min, a.max)))
        else:
            others.append((name, a))
    for name, t in tensors:  # a tensor whose size is a bound variable passes that variable's value too
        for d in t.shape:
            for vname, val in (bound_vals(d) if isinstance(d, UOp) else {}).items():
                if var_vals.setdefault(vname, val) != val:
                    raise JitError(f"jit {name}: variable {vname!r} is bound to {val} there and to {var_vals[vname]} "
                                   "in another argument")
    sig = _Signature(tuple((name, _shape_key(tuple(t.shape)), t.dtype, t.device) for name, t in tensors),
                     tuple(others))
    return tensors, sig, var_vals


def _per_device(named: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``named`` tensors with each tensor on several devices replaced by its shards (one buffer per device, the
    unit a replay swaps); such a tensor is realized, and each shard given a whole buffer of its own."""
    out: list[tuple[str, Any]] = []
    for name, t in named:
        if not isinstance(t.device, tuple):
            out.append((name, t))
            continue
        m = t.realize().lazydata
        parts = [type(t)(s) for s in m.src]
        for p in parts:
            input_buffer(p)
        t.lazydata = UOp(Ops.MULTI, m.dtype, tuple(p.lazydata for p in parts), m.arg)
        out.extend((f"{name} on {p.device}", p) for p in parts)
    return out


def _check_signature(want: _Signature, got: _Signature) -> None:
    if len(want.tensors) != len(got.tensors) or [w[0] for w in want.tensors] != [g[0] for g in got.tensors]:
        raise JitError(f"jit was captured with tensor inputs {[w[0] for w in want.tensors]}, called with "
                       f"{[g[0] for g in got.tensors]}")
    for (name, shape, dtype, dev), (_, gshape, gdtype, gdev) in zip(want.tensors, got.tensors):
        if (shape, dtype, dev) != (gshape, gdtype, gdev):
            raise JitError(f"jit input {name} was captured with shape {shape}, dtype {dtype}, device {dev}; "
                           f"called with shape {gshape}, dtype {gdtype}, device {gdev}")
    names_differ = [n for n, _ in want.others] != [n for n, _ in got.others]
    diff = [] if names_differ else [(n, a, b) for (n, a), (_, b) in zip(want.others, got.others)
                                    if not _same_value(a, b)]
    if names_differ or diff:
        detail = "; ".join(f"{n}: captured {a!r}, now {b!r}" for n, a, b in diff) or \
            f"captured {[n for n, _ in want.others]}, now {[n for n, _ in got.others]}"
        raise JitError(f"jit non-tensor arguments changed since capture ({detail}): they are baked into the "
                       f"captured kernels; pass tensors or bound Variables for values that change")


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - objects whose == is not a bool (arrays): only identity counts
        return False


def _tensors_in(ret: Any) -> list[Any]:
    if _is_tensor(ret):
        return [ret]
    if isinstance(ret, (list, tuple)):
        return [t for r in ret for t in _tensors_in(r)]
    if isinstance(ret, dict):
        return [t for r in ret.values() for t in _tensors_in(r)]
    return []


# --- remembered results a capture may keep -----------------------------------------------------------

#: how many times jit replays wrote each buffer (by id): a replay runs no schedule, so it cannot make remembered
#: results computed from what it overwrote forgotten the way an eager assign does; captures that read remembered
#: results compare these counts instead
_replay_writes: dict[int, int] = {}


def _written_by(ei: ExecItem) -> list[Buffer]:
    """The buffers an item writes: its first (a collective: one per device)."""
    return ei.bufs[:getattr(ei.prg, "n_outputs", 1)]


def _read_buffers(node: UOp) -> list[Buffer]:
    """The buffers a tensor-graph node is computed from."""
    return [buffers[u] for u in toposort([node], stop=lambda n: n.op is Ops.BUFFER)
            if u.op is Ops.BUFFER and u in buffers]


def _buffer_ids_of(view: UOp) -> set[int]:
    """Ids of the buffers a remembered result lives in (one, or one per shard)."""
    return {id(buffers[u]) for u in toposort([view], stop=lambda n: n.op is Ops.BUFFER)
            if u.op is Ops.BUFFER and u in buffers}


def _varies(n: UOp) -> bool:
    """Whether a tensor-graph node depends on a symbolic variable's value (a replay may bind another)."""
    return isinstance(n.arg, UOp) or (n.op is Ops.VIEW and bool(getattr(n.arg, "symbolic", False)))


def _stale_results(entries: list[tuple[UOp, UOp]], volatile: set[int], swapped: set[int],
                   symbolic: bool) -> set[UOp]:
    """The remembered results among ``entries`` (node, buffer view) a replay cannot keep reading: those
    computed from a buffer in ``volatile`` (replays swap or write it) or from a symbolic variable's value
    (when ``symbolic``), and those living in a buffer in ``swapped`` (replays swap it).

    ASSIGN nodes are never stale: each stands for the buffer it wrote, whatever that holds now.
    """
    keys = [n for n, _ in entries if n.op is not Ops.ASSIGN]
    reads: dict[UOp, bool] = {}
    for n in toposort(keys, stop=lambda u: u.op is Ops.BUFFER):
        if n.op is Ops.BUFFER:
            reads[n] = n in buffers and id(buffers[n]) in volatile
        else:
            reads[n] = (symbolic and _varies(n)) or any(reads[s] for s in n.src)
    return {n for n, v in entries if n.op is not Ops.ASSIGN and (reads[n] or _buffer_ids_of(v) & swapped)}


# --- the memory planner -------------------------------------------------------------------------------

def _forget_results_in(candidates: set[int]) -> None:
    """Forget remembered results (``realized``) that live in the buffers with these ids: a graph that needs
    one again recomputes it rather than read a buffer the planner may share."""
    for node, view in list(realized.items()):
        if id(buffers.get(base_of(view))) in candidates:
            realized.pop(node, None)


def plan_memory(items: Sequence[ExecItem], pinned: set[int]) -> list[ExecItem]:
    """``items`` with intermediate buffers sharing memory where their lifetimes do not overlap.

    A buffer may be shared when its id is not in ``pinned`` (inputs, outputs, anything alive outside
    the captured sequence) and its first use writes it (output 0 of a kernel or copy). Its lifetime runs
    from that item to the last item using it; a later buffer on the same device whose lifetime starts
    after that takes over its memory: the smallest free one that is large enough when only kernels use
    the later buffer (a kernel touches the elements it was built for), one of the same size when a copy
    does (copies move whole buffers).
    """
    first: dict[int, tuple[int, int]] = {}
    last: dict[int, int] = {}
    copied: set[int] = set()  # buffers a copy (not a kernel) touches
    for i, ei in enumerate(items):
        for k, b in enumerate(ei.bufs):
            first.setdefault(id(b), (i, k))
            last[id(b)] = i
            if not isinstance(ei.prg, CompiledRunner):
                copied.add(id(b))
    free: dict[str, list[Buffer]] = {}
    assigned: dict[int, Buffer] = {}
    ends: dict[int, list[int]] = {}
    for i, ei in enumerate(items):
        for k, b in enumerate(ei.bufs):
            if id(b) in assigned or id(b) in pinned or first[id(b)] != (i, 0) or k != 0:
                continue
            pool = free.setdefault(b.device, [])
            fits = [s for s in pool if s.nbytes == b.nbytes or (s.nbytes > b.nbytes and id(b) not in copied)]
            slot = min(fits, key=lambda s: s.nbytes) if fits else b
            if fits:
                pool.remove(slot)
            assigned[id(b)] = slot
            ends.setdefault(last[id(b)], []).append(id(b))
        for bid in ends.pop(i, []):
            free[assigned[bid].device].append(assigned[bid])
    return [ExecItem(ei.prg, [assigned.get(id(b), b) for b in ei.bufs], list(ei.metadata), dict(ei.var_vals))
            for ei in items]


# --- replay ---------------------------------------------------------------------------------------------

class GraphRunner(Runner):
    """Consecutive kernels of one device replayed through the device's Graph (one batched launch)."""

    def __init__(self, device: str, items: Sequence[ExecItem]):
        self.device, self.items = device, list(items)
        self.display_name = f"<graph of {len(items)} kernels>"
        calls = []
        for ei in self.items:
            prg = ei.prg
            assert isinstance(prg, CompiledRunner)
            calls.append((prg.program, [b.allocate()._buf for b in ei.bufs], prg.vals(ei.var_vals),
                          prg.spec.global_size, prg.spec.local_size))
        self.graph = Device[device].graph(calls)
        self.estimated_ops = sum(ei.prg.estimated_ops for ei in self.items)
        self.estimated_mem = sum(ei.prg.estimated_mem for ei in self.items)

    def __call__(self, bufs: list[Buffer], wait: bool = False, var_vals: dict[str, int] | None = None) -> float | None:
        return self.graph(wait=wait)


@dataclass
class CapturedJit:
    """The recorded kernels of one jitted function, ready to replay.

    ``exec_items`` is the recorded sequence (after memory planning), ``runs`` what a replay runs (graph
    batches and single items), ``input_slots[i]`` where input ``i``'s buffer sits in ``exec_items``.
    """

    exec_items: list[ExecItem]
    input_buffers: list[Buffer]
    input_slots: list[list[tuple[int, int]]]
    uploads: list[tuple[Buffer, Callable[[], np.ndarray]]]
    ret: Any
    signature: _Signature
    buffers_before_planning: int = 0
    #: remembered results (node, buffer view) the recorded kernels read instead of computing them again
    kept: list[tuple[UOp, UOp]] = field(default_factory=list)
    #: (buffer id, replay writes seen at capture) of every buffer the ``kept`` results are computed from
    kept_reads: list[tuple[int, int]] = field(default_factory=list)
    runs: list[ExecItem] = field(default_factory=list)
    _graph_of: dict[int, tuple[GraphRunner, int]] = field(default_factory=dict)
    #: the tiered-compilation generation the graphs were built at (:mod:`ember.engine.tiers`)
    _generation: int = 0

    def __post_init__(self) -> None:
        #: ids of the buffers the recorded kernels write (besides the inputs')
        # (a collective writes its first n_outputs buffers, one per device)
        self.written = {id(b) for ei in self.exec_items for b in ei.bufs[:getattr(ei.prg, "n_outputs", 1)]} - \
            {id(b) for b in self.input_buffers}
        #: kernels (not copies) per replay
        self.kernel_count = sum(isinstance(ei.prg, CompiledRunner) for ei in self.exec_items)
        self._ops = sum(ei.prg.estimated_ops for ei in self.exec_items)
        self._mem = sum(ei.prg.estimated_mem for ei in self.exec_items)
        self._generation = tiers.generation
        self._build_runs()

    def results_still_remembered(self) -> bool:
        """Whether every remembered result the kernels read still holds its value: an eager assign into a buffer
        one was computed from makes it forgotten (an eager call computes it afresh), a replay of another jit
        writing that buffer counts in ``_replay_writes``."""
        return (all(realized.get(node) is view for node, view in self.kept)
                and all(_replay_writes.get(i, 0) == n for i, n in self.kept_reads))

    def distinct_buffers(self) -> int:
        """How many distinct buffers the recorded kernels use (after planning)."""
        return len({id(b) for ei in self.exec_items for b in ei.bufs})

    def _build_runs(self) -> None:
        """Batch runs of consecutive kernels on one device with a Graph; everything else runs alone."""
        batch: list[int] = []

        def flush() -> None:
            if len(batch) >= 2:
                g = GraphRunner(self.exec_items[batch[0]].prg.device, [self.exec_items[j] for j in batch])
                for c, j in enumerate(batch):
                    self._graph_of[j] = (g, c)
                self.runs.append(ExecItem(g, []))
            else:
                self.runs.extend(self.exec_items[j] for j in batch)
            batch.clear()

        for j, ei in enumerate(self.exec_items):
            graphable = isinstance(ei.prg, CompiledRunner) and getattr(Device[ei.prg.device], "graph", None) is not None
            if batch and (not graphable or ei.prg.device != self.exec_items[batch[0]].prg.device):
                flush()
            if graphable:
                batch.append(j)
            else:
                flush()
                self.runs.append(ei)
        flush()

    def set_input(self, i: int, buf: Buffer) -> None:
        """Make input ``i`` read (and write) ``buf`` from now on."""
        if buf is self.input_buffers[i]:
            return
        self.input_buffers[i] = buf
        for j, k in self.input_slots[i]:
            self.exec_items[j].bufs[k] = buf
            if j in self._graph_of:
                g, c = self._graph_of[j]
                g.graph.update_buffer(c, k, buf._buf)

    def set_vars(self, var_vals: dict[str, int]) -> None:
        """New values for the symbolic variables passed to the function."""
        for j, ei in enumerate(self.exec_items):
            prg = ei.prg
            if isinstance(prg, CompiledRunner) and prg.var_names and any(n in var_vals for n in prg.var_names):
                new = {**ei.var_vals, **{n: var_vals[n] for n in prg.var_names if n in var_vals}}
                if new != ei.var_vals:
                    ei.var_vals = new
                    if j in self._graph_of:
                        g, c = self._graph_of[j]
                        g.graph.update_vals(c, prg.vals(new))

    def replay(self, wait: bool = False) -> float:
        """Run every recorded kernel once (after fresh uploads); returns host seconds, or device time with wait."""
        st = time.perf_counter()
        if tiers.pending:
            tiers.apply()
        if self._generation != tiers.generation:  # kernels got their optimized builds: graph them anew
            self._generation = tiers.generation
            self.runs.clear()
            self._graph_of.clear()
            self._build_runs()
        for buf, fresh in self.uploads:
            data = fresh()  # a numpy array or any other object with the buffer protocol
            buf.copyin(memoryview(np.ascontiguousarray(data) if is_np_array(data) else data).cast("B"))
        total = 0.0
        for ei in self.runs:
            et = ei.prg(ei.bufs, wait=wait or DEBUG >= 2, var_vals=ei.var_vals)
            total += et or 0.0
        for b in [b for ei in self.exec_items for b in _written_by(ei)] + [b for b, _ in self.uploads]:
            _replay_writes[id(b)] = _replay_writes.get(id(b), 0) + 1
        GlobalCounters.kernel_count += self.kernel_count
        GlobalCounters.global_ops += self._ops
        GlobalCounters.global_mem += self._mem
        if DEBUG >= 2:
            print(f"jit replay: {self.kernel_count} kernels in {len(self.runs)} launches, "
                  f"{(time.perf_counter() - st) * 1e3:.3f} ms")
        return total if wait else time.perf_counter() - st


class TinyJit(Generic[R]):
    """Jit a function of tensors: ``step = TinyJit(step)`` or ``@TinyJit``.

    Call 1 runs the function; call 2 runs it and records its kernels; later calls replay those
    kernels with the new tensor inputs (by position and keyword) and bound :class:`Variable` values,
    and return what call 2 returned (its tensors now hold the new results). A call whose tensor
    inputs differ in shape, dtype or device, or whose other arguments differ, raises
    :class:`JitError`. ``plan_memory=False`` keeps every intermediate in its own buffer.

    ``capture_first=True`` records on call 1 and replays from call 2. The plain first call exists to
    initialize lazy state (weights realized on first use, optimizer buffers); a function whose state
    is all realized beforehand saves one eager run by skipping it. :meth:`reset` keeps the choice.
    """

    def __init__(self, fxn: Callable[..., R], plan_memory: bool = True, capture_first: bool = False):
        if not callable(fxn):
            raise TypeError(f"TinyJit needs a callable, got {type(fxn).__name__}")
        for name, value in (("plan_memory", plan_memory), ("capture_first", capture_first)):
            if not isinstance(value, bool):
                raise TypeError(f"TinyJit {name} must be True or False, got {value!r}")
        self.fxn, self.plan_memory, self.capture_first = fxn, plan_memory, capture_first
        self.reset()
        functools.update_wrapper(self, fxn)

    def reset(self) -> None:
        """Forget the capture: the next call runs the function normally again."""
        self.cnt = 0
        self.captured: CapturedJit | None = None
        #: whether the next capture may read results remembered from earlier calls (see :meth:`_capture`)
        self.keep_results = True

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """As a method decorator: bind the instance like a function would."""
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        tensors, sig, var_vals = _split_args(args, kwargs)
        tensors = _per_device(tensors)
        if self.captured is not None:
            if self.captured.results_still_remembered():
                return self._replay(tensors, sig, var_vals)
            self.captured, self.keep_results = None, False  # capture again, this call, computing everything
            _check_signature(self._signature, sig)
        in_bufs = [input_buffer(t) for _, t in tensors]
        if self.cnt == 0 and not self.capture_first:
            ret = self._run(args, kwargs)
        else:
            ret = self._capture(args, kwargs, tensors, in_bufs, sig, var_vals)
        self.cnt += 1
        return ret

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        ret = self.fxn(*args, **kwargs)
        outs = [t for t in _tensors_in(ret) if not _whole_buffer(t.lazydata)]
        if outs:
            type(outs[0]).realize_all(*outs)
        return ret

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[tuple[str, Any]],
                 in_bufs: list[Buffer], sig: _Signature, var_vals: dict[str, int]) -> R:
        """Run the function recording its kernels.

        A result remembered from an earlier call (``realized``: lazily initialized weights, computed in the
        first call) is read, not recorded, when no replay can change it: its graph reads no jit input, no
        buffer the recorded kernels write (an updated parameter), no re-uploaded random key and no symbolic
        variable, and it does not live in an input buffer. Inputs are known before the run, so results
        reading them are forgotten first; what the kernels write is known only after it. Should the run have
        read a result that turns out stale, this call's values are still right (it ran eagerly), but the
        recording is dropped and the next call captures again with every remembered result forgotten.
        """
        global _uploads
        recorded: list[ExecItem] = []
        uploads: list[tuple[Any, Callable[[], np.ndarray]]] = []
        self._signature = sig
        in_ids = {id(b) for b in in_bufs}
        if self.keep_results:
            forget_readers({u for u, b in list(buffers.items()) if id(b) in in_ids})
            before = list(realized.items())
        else:  # results remembered from earlier calls would be read instead of recomputed, and never recorded
            before = []
            for node in list(realized.keys()):
                if node.op is not Ops.ASSIGN:
                    realized.pop(node, None)
        realize.capturing.append(recorded.append)
        _uploads = uploads
        try:
            with guards.recording() as self._windows:
                ret = self._run(args, kwargs)
        finally:
            realize.capturing.remove(recorded.append)
            _uploads = None
        upload_bufs = [(input_buffer(t), fresh) for t, fresh in uploads]
        out_bufs = [input_buffer(t) for _, t in _per_device([("", t) for t in _tensors_in(ret)])]
        kept: list[tuple[UOp, UOp]] = []
        if before:
            swapped = in_ids | {id(b) for b, _ in upload_bufs}
            written = {id(b) for ei in recorded for b in _written_by(ei)}
            stale = _stale_results(before, swapped | written, swapped, bool(var_vals))
            for node, view in before:
                if node in stale and realized.get(node) is view:
                    realized.pop(node, None)
            used = {id(b) for ei in recorded for b in ei.bufs} | {id(b) for b in out_bufs}
            kept = [(n, v) for n, v in before if n.op is not Ops.ASSIGN and _buffer_ids_of(v) & used]
            del before
            # a result read and then forgotten (a buffer it reads was assigned into) was stale for later calls
            if any(n in stale or realized.get(n) is not v for n, v in kept) or (not recorded and kept):
                self.keep_results = False
                if DEBUG >= 1:
                    print("jit capture read remembered results a replay would change: capturing again next call")
                return ret
        if not recorded:
            raise JitError("the jitted function ran no kernels when captured: there is nothing to replay (it must "
                           "compute with tensors and return what it computed)")
        n_before = len({id(b) for ei in recorded for b in ei.bufs})
        items = recorded
        if self.plan_memory:
            del uploads
            pinned = {id(b) for b in in_bufs} | {id(b) for b in out_bufs} | {id(b) for b, _ in upload_bufs}
            pinned |= {i for _, v in kept for i in _buffer_ids_of(v)}
            _forget_results_in({id(ei.bufs[0]) for ei in recorded if ei.bufs} - pinned)
            gc.collect()  # drop the function's dead tensors: a buffer still reachable keeps its own memory
            pinned |= {id(b) for b in buffers.values()}
            items = plan_memory(recorded, pinned)
        slots: list[list[tuple[int, int]]] = [[] for _ in in_bufs]
        for j, ei in enumerate(items):
            for k, b in enumerate(ei.bufs):
                for i, ib in enumerate(in_bufs):
                    if b is ib:
                        slots[i].append((j, k))
        kept_reads = {id(b): _replay_writes.get(id(b), 0) for n, _ in kept for b in _read_buffers(n)}
        self.captured = CapturedJit(items, list(in_bufs), slots, upload_bufs, ret, sig, n_before, kept,
                                    list(kept_reads.items()))
        if DEBUG >= 1:
            print(f"jit captured {self.captured.kernel_count} kernels, {len(self.captured.runs)} launches, "
                  f"{self.captured.distinct_buffers()} buffers (of {n_before} before planning), "
                  f"{len(kept)} remembered results read")
        return ret

    def _replay(self, tensors: list[tuple[str, Any]], sig: _Signature, var_vals: dict[str, int]) -> R:
        cap = self.captured
        assert cap is not None
        _check_signature(cap.signature, sig)
        for i, (_, t) in enumerate(tensors):
            buf = input_buffer(t)
            if id(buf) in cap.written and buf is not cap.input_buffers[i]:
                # e.g. the last call's output passed back in: the kernels would overwrite what they read
                buf = input_buffer(type(t)(UOp(Ops.CONTIGUOUS, t.dtype, (t.lazydata,))).realize())
            cap.set_input(i, buf)
        if var_vals:
            if (bad := guards.first_violation(getattr(self, "_windows", []), var_vals)) is not None:
                raise JitError(f"jit {getattr(self.fxn, '__name__', 'function')}: {bad}")
            cap.set_vars(var_vals)
            _rebind_results(cap.ret, var_vals)
        cap.replay()
        self.cnt += 1
        return cap.ret


def jit(fxn: Callable[..., R]) -> TinyJit[R]:
    """``@ember.jit``: the same as ``@ember.TinyJit``."""
    return TinyJit(fxn)


__all__ = ["CapturedJit", "JitError", "TinyJit", "jit", "plan_memory", "record_upload"]
