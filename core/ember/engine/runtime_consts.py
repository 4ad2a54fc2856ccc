"""Float constants that change between runs become kernel inputs, so a changing Python float never recompiles.

``x * lr`` with a Python float puts ``lr`` into the kernel as a constant: fast, and folded where it can
be, but a loop whose ``lr`` changes every step would build a new kernel every step (more compile time,
memory and disk cache each time). The engine notices this before lowering: kernels are grouped by their
*skeleton*, the AST with every float constant blanked out. The first kernel of a skeleton keeps its
constants. When another kernel with the same skeleton arrives with different values, the constants
that differ are marked *varying* for that skeleton, and from then on each of them is read from a
one-element input buffer instead (a ``LOAD`` through the constant's own broadcast view, or through a scalar
view where the constant is bare). Such kernels share one AST whatever the values, so they are compiled once;
each run only fills the small buffers. What is built depends only on the values seen, never on what else
the process compiled or on the garbage collector: each kernel is built at most twice.

Only float32/float64/float16 constants are turned into inputs; ``RUNTIME_CONSTS=0`` turns this off.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.device.buffer import Buffer
from ember.device.contracts import BufferSpec
from ember.dtype import dtypes, scalar_bytes
from ember.helpers import ContextVar
from ember.ir.shapetracker import ShapeTracker
from ember.ir.uop import Ops, UOp

if TYPE_CHECKING:
    from ember.schedule import ScheduleItem

#: ``RUNTIME_CONSTS=0`` keeps every float constant in the kernel source (one kernel per value).
RUNTIME_CONSTS = ContextVar("RUNTIME_CONSTS", 1)

_PARAM_DTYPES = (dtypes.float32, dtypes.float64, dtypes.float16)
_BLANK = "runtime-const"

# skeleton (device, AST with blanked constants) -> the constant values first seen, and the varying positions
_first_values: dict[tuple[str, UOp], tuple[float, ...]] = {}
_varying: dict[tuple[str, UOp], frozenset[int]] = {}


def _float_consts(ast: UOp) -> list[UOp]:
    """The distinct float constants of ``ast``, in a fixed (topological) order: those under a view (a Python
    float broadcast to a tensor's shape) and bare scalar ones (a float applied to a reduced scalar, and what
    autograd makes of it: ``(w * w).sum() * decay`` gives ``decay`` bare in the weight's gradient)."""
    seen: dict[UOp, None] = {}
    for u in ast.toposort():
        if u.op is Ops.CONST and u.dtype in _PARAM_DTYPES:
            seen.setdefault(u, None)
    return list(seen)


def _rebuild(ast: UOp, replace: dict[UOp, UOp], bare: dict[UOp, UOp] | None = None) -> UOp:
    """``ast`` with the nodes of ``replace`` swapped in (iteratively: kernel ASTs can be deep). Where a replaced
    node is a source of anything but a view, ``bare`` (when given) has what takes its place there."""
    new: dict[UOp, UOp] = {}
    for u in ast.toposort():
        if u in replace:
            new[u] = replace[u]
        else:
            src = tuple(bare[s] if bare is not None and s in bare and u.op is not Ops.VIEW else new[s] for s in u.src)
            new[u] = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
    return new[ast]


def parameterize(si: ScheduleItem) -> ScheduleItem:
    """``si`` (a ScheduleItem) as is, or with its varying float constants read from new one-element input
    buffers when kernels of the same skeleton have been seen with other values.

    The choice depends only on the values this process has seen for the skeleton, never on which kernels happen
    to be compiled (or still cached) or on when the garbage collector ran: the skeleton is a hash-consed UOp held
    by this module's tables (so the same structure is always the same key), and a skeleton's first values are
    recorded whatever else is cached. So a kernel whose float constants change is built at most twice: once with
    its first values in the source, once with the varying ones as inputs."""
    ast, bufs = si.ast, si.bufs
    if not RUNTIME_CONSTS.value or ast.op is not Ops.SINK:
        return si
    consts = _float_consts(ast)
    if not consts:
        return si
    device = bufs[0].device
    skeleton = (device, _rebuild(ast, {c: UOp(Ops.CONST, c.dtype, c.src, (_BLANK, i)) for i, c in enumerate(consts)}))
    values = tuple(float(c.arg) for c in consts)
    first = _first_values.setdefault(skeleton, values)
    varying = _varying.get(skeleton, frozenset()) | {i for i, (a, b) in enumerate(zip(first, values))
                                                      if not _same_float(a, b)}
    if not varying:
        return si
    _varying[skeleton] = frozenset(varying)
    replace: dict[UOp, UOp] = {}
    bare: dict[UOp, UOp] = {}  # a bare scalar constant becomes a scalar view of its buffer
    extra: list[Buffer] = []
    for i in sorted(varying):
        c = consts[i]
        dt = c.value_dtype
        index = len(bufs) + len(extra)
        replace[c] = UOp(Ops.LOAD, dt, (UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (index, 1)),))
        bare[c] = UOp(Ops.VIEW, dt, (replace[c],), ShapeTracker.from_shape(()))
        # written by the host for every run and read once by the kernel: memory the host reaches cheaply
        buf = Buffer(device, 1, dt, options=BufferSpec(cpu_access=True)).allocate()
        buf.copyin(memoryview(scalar_bytes(dt, c.arg)))
        extra.append(buf)
    return type(si)(_rebuild(ast, replace, bare), tuple(bufs) + tuple(extra), si.var_vals)


def _same_float(a: float, b: float) -> bool:
    """Whether two constants are the same value: nan is nan, and -0.0 is not 0.0 (it changes ``1 / x``)."""
    if a != a or b != b:
        return a != a and b != b
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def skeletons() -> int:
    """How many kernel skeletons have varying constants (for tests and benchmarks)."""
    return len(_varying)
