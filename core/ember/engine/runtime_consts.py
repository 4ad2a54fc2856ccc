"""Float constants that change between runs become kernel inputs, so a changing Python float never recompiles.

``x * lr`` with a Python float puts ``lr`` into the kernel as a constant: fast, and folded where it can
be, but a loop whose ``lr`` changes every step would build a new kernel every step (more compile time,
memory and disk cache each time). The engine notices this before lowering: kernels are grouped by their
*skeleton*, the AST with every float constant blanked out. The first kernel of a skeleton keeps its
constants. When another kernel with the same skeleton arrives with different values, the constants
that differ are marked *varying* for that skeleton, and from then on each of them is read from a
one-element input buffer instead (a ``LOAD`` through the constant's own broadcast view). Such kernels
share one AST whatever the values, so they are compiled once; each run only fills the small buffers.

Only float32/float64/float16 constants are turned into inputs; ``RUNTIME_CONSTS=0`` turns this off.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ember.device.buffer import Buffer
from ember.device.contracts import BufferSpec
from ember.dtype import dtypes, scalar_bytes
from ember.helpers import ContextVar
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
    """The distinct float constants of ``ast`` that sit under a view, in a fixed (topological) order."""
    seen: dict[UOp, None] = {}
    for u in ast.toposort():
        if u.op is Ops.VIEW and u.src and u.src[0].op is Ops.CONST and u.src[0].dtype in _PARAM_DTYPES:
            seen.setdefault(u.src[0], None)
    return list(seen)


def _rebuild(ast: UOp, replace: dict[UOp, UOp]) -> UOp:
    """``ast`` with the nodes of ``replace`` swapped in (iteratively: kernel ASTs can be deep)."""
    new: dict[UOp, UOp] = {}
    for u in ast.toposort():
        if u in replace:
            new[u] = replace[u]
        else:
            src = tuple(new[s] for s in u.src)
            new[u] = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
    return new[ast]


def parameterize(si: ScheduleItem, compiled: dict) -> ScheduleItem:
    """``si`` (a ScheduleItem) as is, or with its varying float constants read from new one-element input
    buffers when kernels of the same skeleton have been seen with other values. ``compiled`` is the
    engine's kernel cache: a kernel already built for exactly these values is kept as it is."""
    ast, bufs = si.ast, si.bufs
    if not RUNTIME_CONSTS.value or ast.op is not Ops.SINK:
        return si
    consts = _float_consts(ast)
    device = bufs[0].device
    if not consts or (device, ast) in compiled:
        return si
    skeleton = (device, _rebuild(ast, {c: UOp(Ops.CONST, c.dtype, c.src, (_BLANK, i)) for i, c in enumerate(consts)}))
    values = tuple(float(c.arg) for c in consts)
    first = _first_values.setdefault(skeleton, values)
    varying = _varying.get(skeleton, frozenset()) | {i for i, (a, b) in enumerate(zip(first, values))
                                                      if a != b and not (a != a and b != b)}
    if not varying:
        return si
    _varying[skeleton] = frozenset(varying)
    replace: dict[UOp, UOp] = {}
    extra: list[Buffer] = []
    for i in sorted(varying):
        c = consts[i]
        dt = c.value_dtype
        index = len(bufs) + len(extra)
        replace[c] = UOp(Ops.LOAD, dt, (UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (index, 1)),))
        # written by the host for every run and read once by the kernel: memory the host reaches cheaply
        buf = Buffer(device, 1, dt, options=BufferSpec(cpu_access=True)).allocate()
        buf.copyin(memoryview(scalar_bytes(dt, c.arg)))
        extra.append(buf)
    return type(si)(_rebuild(ast, replace), tuple(bufs) + tuple(extra), si.var_vals)


def skeletons() -> int:
    """How many kernel skeletons have varying constants (for tests and benchmarks)."""
    return len(_varying)
