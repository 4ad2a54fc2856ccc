"""``@function``: a callable of tensors made one reusable call (tinygrad's ``from tinygrad import function``).

``@function`` on a model's ``__call__`` (or any function of tensors) finds the call's inputs in its arguments:
tensors passed directly and tensors inside lists, tuples, dicts and objects' attributes (``self.l1.weight``). The
first call with a given *structure* (the arguments' layout and non-tensor values, each input's shape, dtype and
device, training and no-grad mode) runs the Python function once, on stand-in buffers instead of the inputs, and
keeps the graph it builds, with the graphs of its gradients. Every later call with that structure runs no Python
of the function: it puts the call's tensors in place of the stand-ins. The graph, and so the schedule and every
kernel, is the one an undecorated call builds, so the kernels are compiled once and reused by every call.

Rules, as in tinygrad:

* Tensors the function reads without getting them through its arguments (a closure's or a global's realized
  tensor) are *implicit* inputs: they are refused with a ``RuntimeError`` naming them unless
  ``allow_implicit=True`` (then the function is run again on every call, so it reads whatever they hold).
* The function returns a tensor or a tuple of tensors; it may not realize anything while it runs (its inputs
  are stand-ins then).
* Gradients flow through the call: a backward pass gives the same gradients as without the decorator.
* ``precompile=True`` makes the call a boundary: its inputs and outputs are whole buffers, so its kernels are
  the same wherever it is called from (not fused with the caller's); ``precompile_backward=True`` does the same
  for the gradient call.

Where ember differs: the function's Python runs once per structure (like :class:`~ember.TinyJit`, host side
effects are not repeated); it runs again on every call when it draws random numbers, reads implicit inputs
(allowed), or puts new tensors into its arguments, so those stay right. Assigning into an argument
(``self.cache.assign(...)``) is replayed on every call. A function that computes with symbolic shapes, or whose
arguments hold values that cannot be compared (numpy arrays), runs its Python on every call.
"""
from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ember.autograd import run_backward
from ember.engine import jit as jit_module
from ember.engine import realize
from ember.engine.jit import input_buffer
from ember.ir import lazy
from ember.ir.lazy import base_of, buffer_view, buffers, new_buffer, shape_of
from ember.ir.shapetracker import ShapeTracker
from ember.ir.symbolic import Variable
from ember.ir.uop import Ops, UOp, toposort
from ember.tensor import Tensor, _assign_ids

R = TypeVar("R")

_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_BY_IDENTITY = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, UOp)


class _Uncomparable(Exception):
    """An argument holds a value the structure key cannot compare (a numpy array, an unhashable object)."""


# --- the arguments' structure ---------------------------------------------------------------------------------

def _walk(obj: Any, tensors: list[Tensor], slots: dict[int, int], names: list[str], path: str,
          active: set[int]) -> Any:
    """A hashable picture of ``obj`` with each tensor replaced by its input slot; fills ``tensors`` (each once)."""
    if isinstance(obj, Tensor):
        if id(obj) not in slots:
            slots[id(obj)] = len(tensors)
            tensors.append(obj)
            names.append(path)
        return ("T", slots[id(obj)])
    if isinstance(obj, _PLAIN):
        return (type(obj), obj)
    if isinstance(obj, Variable):
        return ("V", obj.name, obj.min, obj.max, obj.val)
    if isinstance(obj, _BY_IDENTITY):
        return obj
    if id(obj) in active:
        return ("cycle",)
    active.add(id(obj))
    try:
        if isinstance(obj, (list, tuple)):
            return (type(obj), tuple(_walk(v, tensors, slots, names, f"{path}[{i}]", active)
                                     for i, v in enumerate(obj)))
        if isinstance(obj, Mapping):
            return (type(obj), tuple((k, _walk(v, tensors, slots, names, f"{path}[{k!r}]", active))
                                     for k, v in obj.items()))
        if hasattr(obj, "__dict__"):
            return (type(obj), tuple((k, _walk(v, tensors, slots, names, f"{path}.{k}", active))
                                     for k, v in vars(obj).items()))
    finally:
        active.discard(id(obj))
    try:
        hash(obj)
    except TypeError:
        raise _Uncomparable(path) from None
    return (type(obj), obj)


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Tensor], list[str], Any]:
    """(the tensors found in the arguments, where each was found, the structure key or None when uncomparable)."""
    tensors: list[Tensor] = []
    names: list[str] = []
    slots: dict[int, int] = {}
    try:
        skeleton = (_walk(args, tensors, slots, names, "args", set()),
                    _walk(kwargs, tensors, slots, names, "kwargs", set()))
    except _Uncomparable:
        tensors, names, slots = [], [], {}
        _walk_tensors_only(args, tensors, slots, names)
        _walk_tensors_only(kwargs, tensors, slots, names)
        return tensors, names, None
    if any(not isinstance(s, int) for t in tensors for s in t.shape):
        return tensors, names, None
    layout = tuple((t.shape, t.dtype, t.device, t.requires_grad) for t in tensors)
    return tensors, names, (skeleton, layout, bool(Tensor.training), bool(Tensor.no_grad))


def _walk_tensors_only(obj: Any, tensors: list[Tensor], slots: dict[int, int], names: list[str]) -> None:
    from ember.nn.state import get_state_dict

    for name, t in get_state_dict(obj).items():
        if id(t) not in slots:
            slots[id(t)] = len(tensors)
            tensors.append(t)
            names.append(name)


# --- putting the call's tensors in place of the stand-ins ------------------------------------------------------

def _flat(x: UOp, size: int) -> UOp:
    """``x``'s elements, row-major, as a node of shape ``(size,)``."""
    base, st = (x.src[0], x.arg) if x.op is Ops.VIEW else (x, ShapeTracker.from_shape(shape_of(x)))
    st = st.reshape((size,))
    return base if st.contiguous and shape_of(base) == (size,) else UOp(Ops.VIEW, x.dtype, (base,), st)


def _substitute(roots: list[UOp], mapping: dict[UOp, UOp]) -> list[UOp]:
    """``roots`` with each stand-in BUFFER node in ``mapping`` replaced by its tensor's node.

    A view of a stand-in becomes the same view of the tensor's elements (views compose: a VIEW never has a
    VIEW as its source). An ASSIGN that is rebuilt gets a fresh id: every call's write is a write of its own.
    """
    flats = {b: _flat(x, b.arg[2]) for b, x in mapping.items()}
    memo: dict[UOp, UOp] = {}
    for n in toposort(roots, stop=lambda u: u.op is Ops.BUFFER):
        if n in flats:
            memo[n] = flats[n]
        elif n.op is Ops.VIEW and n.src[0] in flats:
            flat = flats[n.src[0]]
            base, st = (flat.src[0], flat.arg) if flat.op is Ops.VIEW else (flat, ShapeTracker.from_shape(
                shape_of(flat)))
            st = st + n.arg
            memo[n] = base if st.contiguous and st.shape == shape_of(base) else UOp(Ops.VIEW, n.dtype, (base,), st)
        else:
            src = tuple(memo[s] for s in n.src)
            if all(a is b for a, b in zip(src, n.src)):
                memo[n] = n
            else:
                memo[n] = UOp(n.op, n.dtype, src, next(_assign_ids) if n.op is Ops.ASSIGN else n.arg)
    return [memo[r] for r in roots]


def _stand_in(device: str, shape: tuple[int, ...], dtype: Any) -> UOp:
    size = 1
    for s in shape:
        size *= s
    return buffer_view(new_buffer(device, size, dtype), shape)


def _whole_buffer(x: UOp) -> bool:
    return x.op is Ops.BUFFER or (x.op is Ops.VIEW and x.src[0].op is Ops.BUFFER and x.arg.contiguous
                                  and x.arg.size == x.src[0].arg[2])


def _boundary(x: UOp) -> UOp:
    """``x`` in a buffer of its own (a precompiled call's input or output)."""
    return x if _whole_buffer(x) else UOp(Ops.CONTIGUOUS, x.dtype, (x,))


# --- one traced call ---------------------------------------------------------------------------------------------

@dataclass
class _Trace:
    """What the function built on stand-ins: output graphs, the new value of each argument it assigned into,
    each output's gradient graphs (input slot -> graph over the stand-ins and the output's gradient stand-in)."""

    stand_ins: list[UOp]
    outputs: list[UOp]
    is_tuple: bool
    assigned: list[tuple[int, UOp]]
    grads: list[dict[int, UOp]]
    grad_stand_ins: list[UOp | None]
    new_tensors: list[tuple[Tensor, UOp]]
    reusable: bool


def _returned(ret: Any) -> tuple[list[Tensor], bool]:
    if isinstance(ret, Tensor):
        return [ret], False
    if isinstance(ret, tuple) and all(isinstance(x, Tensor) for x in ret):
        return list(ret), True
    raise RuntimeError(f"function return type {type(ret)} not supported")


class _NoRealize:
    """Refuse kernels while a function is traced: its inputs are stand-ins with no data."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, item: Any) -> None:
        raise RuntimeError(f"function {self.name} realized a tensor while it was traced (its inputs are stand-ins "
                           "then): compute lazily inside it and realize its result outside (an assign whose value "
                           "reads the tensor it writes and has a gradient history keeps the old value by realizing "
                           "it: assign a detached value)")


def _implicit_buffers(nodes: list[UOp], known: set[UOp], first_new: int) -> list[UOp]:
    """BUFFER nodes the graphs read that are not inputs and existed before the call (the function's own
    constants, ranges and random words are made during the call)."""
    ramps = {base_of(r) for r in getattr(Tensor, "_ramps", {}).values() if isinstance(r, UOp)}
    return [b for b in toposort(nodes, stop=lambda u: u.op is Ops.BUFFER)
            if b.op is Ops.BUFFER and b not in known and b not in ramps and b.arg[0] < first_new]


def _describe_implicit(fxn: Any, bufs: list[UOp]) -> list[str]:
    """A line per implicit buffer, naming the closure variable or global that holds it where one does."""
    where: dict[UOp, str] = {}
    code = getattr(fxn, "__code__", None) or getattr(getattr(fxn, "__func__", None), "__code__", None)
    func = fxn if code is getattr(fxn, "__code__", None) else getattr(fxn, "__func__", fxn)
    places: list[tuple[str, Any]] = []
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
            try:
                places.append((f"{name} (closure)", cell.cell_contents))
            except ValueError:
                continue
        glb = getattr(func, "__globals__", {})
        places += [(f"{name} (global)", glb[name]) for name in code.co_names if name in glb]
    from ember.nn.state import get_state_dict

    for label, obj in places:
        if isinstance(obj, _BY_IDENTITY) and not isinstance(obj, type):
            continue
        try:
            found = {"": obj} if isinstance(obj, Tensor) else get_state_dict(obj)
        except Exception:  # noqa: BLE001 - an object the walk cannot read names nothing
            continue
        for key, t in found.items():
            for b in toposort([t.lazydata], stop=lambda u: u.op is Ops.BUFFER):
                if b.op is Ops.BUFFER and b not in where:
                    where[b] = label.replace(" (", f".{key} (", 1) if key else label
    return [f"{i}: {where.get(b, 'a tensor')} dtype={b.dtype}, size={b.arg[2]}, device={b.arg[1]}"
            for i, b in enumerate(bufs)]


class _function(Generic[R]):
    """A callable of tensors made one reusable call; see :mod:`ember.function`."""

    def __init__(self, fxn: Callable[..., R], *, precompile: bool, precompile_backward: bool, allow_implicit: bool):
        if not callable(fxn):
            raise TypeError(f"function needs a callable, got {type(fxn).__name__}")
        self.fxn, self.precompile, self.precompile_backward = fxn, precompile, precompile_backward
        self.allow_implicit = allow_implicit
        self.name = getattr(fxn, "__qualname__", None) or type(fxn).__qualname__
        #: structure key -> the trace every call with that structure reuses
        self.traces: dict[Any, _Trace] = {}
        #: structure keys whose function must run on every call (it draws random numbers, reads implicit inputs)
        self.rerun: set[Any] = set()
        #: how many times the function's Python ran (traces and direct runs)
        self.runs = 0
        functools.update_wrapper(self, fxn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """As a method decorator: bind the instance, which becomes an argument (its tensors are inputs)."""
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        tensors, names, key = _arguments(args, kwargs)
        if key is None:
            return self._direct(args, kwargs, tensors)
        trace = self.traces.get(key)
        if trace is None:
            trace = self._trace(args, kwargs, tensors)
            if trace.reusable and key not in self.rerun:
                self.traces[key] = trace
            else:
                self.rerun.add(key)
        return self._apply(trace, tensors)

    # --- tracing on stand-ins -----------------------------------------------------------------------------------
    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[Tensor]) -> _Trace:
        first_new = next(lazy._buffer_ids)
        stand_ins = [_stand_in(t.device, t.shape, t.dtype) for t in tensors]
        saved = [(t.lazydata, t._ctx) for t in tensors]
        guard = _NoRealize(self.name)
        outer_uploads = jit_module._uploads
        draws: list[Any] = []
        for t, s in zip(tensors, stand_ins):
            t.lazydata, t._ctx = s, None
        realize.capturing.append(guard)
        jit_module._uploads = draws
        try:
            self.runs += 1
            outs, is_tuple = _returned(self.fxn(*args, **kwargs))
            assigned = [(i, t.lazydata) for i, (t, s) in enumerate(zip(tensors, stand_ins)) if t.lazydata is not s]
            grads, grad_stand_ins = self._trace_gradients(outs, tensors)
            after: list[Tensor] = []
            _walk_tensors_only((args, kwargs), after, {}, [])
            known = {id(t) for t in tensors}
            new_tensors = [(t, t.lazydata) for t in after if id(t) not in known]
        finally:
            realize.capturing.remove(guard)
            jit_module._uploads = outer_uploads
            if outer_uploads is not None:
                outer_uploads.extend(draws)
            for t, (node, ctx) in zip(tensors, saved):
                t.lazydata, t._ctx = node, ctx
        if any(buffers[base_of(s)].is_allocated() for s in stand_ins):
            _NoRealize(self.name)(None)
        out_nodes = [o.lazydata for o in outs]
        graphs = out_nodes + [n for _, n in assigned] + [n for _, n in new_tensors]
        implicit = _implicit_buffers(graphs, {base_of(s) for s in stand_ins}, first_new)
        if implicit and not self.allow_implicit:
            lines = "\n  ".join(_describe_implicit(self.fxn, implicit))
            raise RuntimeError(f"function {self.name} has {len(implicit)} implicit buffer(s), but allow_implicit=False "
                               f"(pass them as arguments, or use allow_implicit=True)\n  {lines}")
        reusable = not implicit and not draws and not new_tensors
        return _Trace(stand_ins, out_nodes, is_tuple, assigned, grads, grad_stand_ins, new_tensors, reusable)

    def _trace_gradients(self, outs: list[Tensor], tensors: list[Tensor]) -> tuple[list[dict[int, UOp]],
                                                                                    list[UOp | None]]:
        """Each output's gradient graphs toward the float inputs that may take one (built now, while the inputs
        are stand-ins; nothing when no-grad mode is on or no input can take a gradient)."""
        targets = [t for t in tensors if t.requires_grad is not False and t.dtype.kind == "f"]
        grads: list[dict[int, UOp]] = []
        seeds: list[UOp | None] = []
        slot = {id(t): i for i, t in enumerate(tensors)}
        for o in outs:
            if Tensor.no_grad or not targets or o._ctx is None or o.dtype.kind != "f":
                grads.append({})
                seeds.append(None)
                continue
            seed = _stand_in(o.device, o.shape, o.dtype)
            got = run_backward(o, Tensor(seed), targets)
            grads.append({slot[tid]: g.lazydata for tid, g in got.items()})
            seeds.append(seed)
        return grads, seeds

    # --- one call ---------------------------------------------------------------------------------------------------
    def _apply(self, trace: _Trace, tensors: list[Tensor]) -> Any:
        for i, _ in trace.assigned:  # a write lands in the argument's buffer: it needs one
            input_buffer(tensors[i])
        inputs = [_boundary(t.lazydata) if self.precompile else t.lazydata for t in tensors]
        mapping = {base_of(s): x for s, x in zip(trace.stand_ins, inputs)}
        graphs = trace.outputs + [n for _, n in trace.assigned] + [n for _, n in trace.new_tensors]
        new = _substitute(graphs, mapping)
        outs = new[:len(trace.outputs)]
        if self.precompile:
            outs = [_boundary(x) for x in outs]
        rest = new[len(trace.outputs):]
        for (i, _), node in zip(trace.assigned, rest):
            tensors[i].lazydata, tensors[i]._ctx = node, None
        for (t, _), node in zip(trace.new_tensors, rest[len(trace.assigned):]):
            t.lazydata = node
        results = [Tensor(x) for x in outs]
        parents = tuple(tensors)
        for k, r in enumerate(results):
            if trace.grads[k]:
                r._record(parents, self._gradient_rule(trace, k, mapping), f"function {self.name}")
        return tuple(results) if trace.is_tuple else results[0]

    def _gradient_rule(self, trace: _Trace, k: int, mapping: dict[UOp, UOp]) -> Callable[..., tuple[Any, ...]]:
        grads, seed = trace.grads[k], trace.grad_stand_ins[k]
        assert seed is not None
        slots = sorted(grads)
        boundary = self.precompile_backward

        def rule(g: Tensor, out: Tensor, parents: Any) -> tuple[Any, ...]:
            g_node = _boundary(g.lazydata) if boundary else g.lazydata
            new = _substitute([grads[i] for i in slots], {**mapping, base_of(seed): g_node})
            by_slot = dict(zip(slots, (_boundary(x) if boundary else x for x in new)))
            return tuple(Tensor(by_slot[i]) if i in by_slot else None for i in range(len(parents)))

        return rule

    # --- running the function on the tensors themselves ---------------------------------------------------------
    def _direct(self, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[Tensor]) -> Any:
        """Run the function on the call's own tensors (symbolic shapes, uncomparable arguments)."""
        first_new = next(lazy._buffer_ids)
        guard = _NoRealize(self.name)
        realize.capturing.append(guard)
        try:
            self.runs += 1
            outs, is_tuple = _returned(self.fxn(*args, **kwargs))
        finally:
            realize.capturing.remove(guard)
        known = {b for b in toposort([t.lazydata for t in tensors], stop=lambda u: u.op is Ops.BUFFER)
                 if b.op is Ops.BUFFER}
        implicit = _implicit_buffers([o.lazydata for o in outs], known, first_new)
        if implicit and not self.allow_implicit:
            lines = "\n  ".join(_describe_implicit(self.fxn, implicit))
            raise RuntimeError(f"function {self.name} has {len(implicit)} implicit buffer(s), but allow_implicit=False "
                               f"(pass them as arguments, or use allow_implicit=True)\n  {lines}")
        if self.precompile:
            outs = [o.contiguous() for o in outs]
        return tuple(outs) if is_tuple else outs[0]


def function(fxn: Callable[..., R] | None = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = False, grad_fxn: Callable[..., Any] | None = None) -> Any:
    """Make ``fxn`` one reusable call: ``@function`` or ``@function(precompile=True, allow_implicit=True)``.

    See :mod:`ember.function` for what it does. ``grad_fxn`` (a gradient written on tinygrad's UOp graph) has no
    ember equivalent: gradients come from the function's own graph.
    """
    if grad_fxn is not None:
        raise NotImplementedError("function(grad_fxn=...) takes a gradient over tinygrad's UOp graph; ember "
                                  "differentiates the function's own graph (leave grad_fxn out)")
    if fxn is None:
        return lambda f: _function(f, precompile=precompile, precompile_backward=precompile_backward,
                                   allow_implicit=allow_implicit)
    return _function(fxn, precompile=precompile, precompile_backward=precompile_backward,
                     allow_implicit=allow_implicit)


__all__ = ["function"]
