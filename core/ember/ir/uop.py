"""The UOp: one immutable, hash-consed DAG node used at every level of ember.

The same class describes the tensor graph (BUFFER, VIEW, ALU, REDUCE_AXIS, COPY ...), the
kernel AST the scheduler hands to codegen (DEFINE_GLOBAL, LOAD, STORE, SINK ...), and the
linear program a renderer turns into source (RANGE, ENDRANGE, DEFINE_ACC, ASSIGN ...).

Hash-consing means ``UOp(op, dtype, src, arg)`` returns the existing node when an identical
one is alive, so structural equality is identity: ``a is b`` iff they describe the same
computation. That makes every cache keyed by UOps cheap and exact.
"""
from __future__ import annotations

import functools
import math
import weakref
from enum import Enum, auto
from typing import Any, Callable, Sequence

from ember.dtype import DType, PtrDType, dtypes, truncate

try:
    from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]  # CPython: drops a dead entry only
except ImportError:  # pragma: no cover - other interpreters
    def _remove_dead_weakref(d: dict, key: Any) -> None:
        ref = d.get(key)
        if ref is not None and ref() is None:
            d.pop(key, None)


class Ops(Enum):
    """Every node kind. Groups below say where each kind appears."""

    # members are singletons: identity hashing is exact, and C-level (Enum's own hashes the name in Python, and
    # op sets and dicts are looked up on every node of every rewrite)
    __hash__ = object.__hash__

    # tensor graph
    BUFFER = auto()        # arg=(uid, device, size); a realized allocation, shape (size,)
    DEVICE = auto()        # arg=device name; a src of CONST and COPY in the tensor graph
    VIEW = auto()          # src=(x,), arg=ShapeTracker: a movement of x
    COPY = auto()          # src=(x, DEVICE): x moved to another device
    CONTIGUOUS = auto()    # src=(x,): force x into its own buffer
    REDUCE_AXIS = auto()   # src=(x,), arg=(Ops.ADD|MAX|MUL, axes): reduced axes keep size 1
    DETACH = auto()        # src=(x,): same value, no gradient flows through

    # kernel AST and linear program
    SINK = auto()          # src=stores (AST) or the end of a linear program
    DEFINE_GLOBAL = auto() # dtype=PtrDType, arg=(param index, element count[, "ramp": element i holds i])
    DEFINE_VAR = auto()    # arg=(name, min, max): a symbolic int passed at launch
    LOAD = auto()          # AST: src=(DEFINE_GLOBAL,), shape (size,); linear: src=(buf, idx[, gate])
    STORE = auto()         # AST: src=(DEFINE_GLOBAL, value), arg=ShapeTracker; linear: src=(buf, idx, value[, gate])
    CONST = auto()         # arg=python value (tensor graph: src=(DEVICE,))
    SPECIAL = auto()       # arg=(name, size): a hardware index such as gidx0 (GPU renderers)
    RANGE = auto()         # src=(start, end), arg=(id, kind) kind in ("global", "reduce", "loop")
    ENDRANGE = auto()      # src=(RANGE,)
    REDUCE = auto()        # lowered reduce: src=(value, *ranges), arg=Ops.ADD|MAX|MUL
    DEFINE_ACC = auto()    # src=(init CONST,), arg=id: an accumulator variable
    ASSIGN = auto()        # src=(acc, value): acc = value
    BARRIER = auto()       # src=(local STOREs...): the work-group waits; a LOAD after it lists it as a last source
    DEFINE_LOCAL = auto()  # dtype=PtrDType, arg=(id, size): work-group local memory

    # elementwise (shared by every level)
    CAST = auto()          # src=(x,), dtype=target: value conversion
    BITCAST = auto()       # src=(x,), dtype=target: reinterpret bits (same itemsize)
    NEG = auto()
    RECIP = auto()
    SQRT = auto()
    EXP = auto()
    LOG = auto()
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    TRUNC = auto()         # round toward zero (floats)
    ADD = auto()
    SUB = auto()
    MUL = auto()
    FDIV = auto()          # true division of floats
    IDIV = auto()          # integer division truncating toward zero (C semantics)
    MOD = auto()           # integer remainder with the sign of the dividend (C semantics)
    MAX = auto()
    CMPLT = auto()
    CMPNE = auto()
    CMPEQ = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()
    POW = auto()           # floats only
    WHERE = auto()         # src=(cond, a, b)

    # linear program, added last so the numbers of the ops above stay as they were
    WMMA = auto()          # src=(A elements..., B elements..., lane), arg: see ember.codegen.tc.wmma_arg; one
                           # element of this lane's D = A @ B of a tensor-core instruction
    MULTI = auto()         # tensor graph: src=one graph per device (its shard), arg=the sharded axis or None
                           # (replicated); see ember.ir.multi
    # vectors (linear program; see ember.codegen.vectorize): a value whose dtype has ``count`` n > 1 holds n lanes.
    # A LOAD of such a dtype reads elements idx .. idx+n-1 of its buffer and a STORE of such a value writes them;
    # idx is a multiple of n (aligned: the address is a multiple of the vector's size where the buffer's start is),
    # and a gate, if any, holds for every lane.
    VECTORIZE = auto()     # src=n scalars of one dtype, dtype=that dtype.vec(n): lane i is src[i]
    GEP = auto()           # src=(vector,), arg=lane, dtype=the lane's scalar dtype
    ALLREDUCE = auto()     # tensor graph: src=(partial on each device of a group..., DEVICE), arg=(op, i): the
                           # combined partials on device i, by the devices' native collective (ember.ir.multi)
    DEFINE_REG = auto()    # linear program: src=values (scalars or vectors of one scalar dtype), dtype=PtrDType(that
                           # dtype), arg=(id, size): a private array of ``size`` elements holding the lanes of its
                           # sources in order, read with LOAD(reg, idx) (a fused epilogue's loop, see
                           # ember.codegen.epilogue)


class GroupOp:
    """Sets of ops with a shared property."""

    Unary = frozenset({Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC})
    Binary = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE,
                        Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.POW})
    Ternary = frozenset({Ops.WHERE})
    ALU = Unary | Binary | Ternary
    Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
    Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})


def exec_alu(op: Ops, dtype: DType, srcs: tuple[Any, ...]) -> Any:
    """Evaluate one ALU op on Python scalars with the semantics of ``dtype`` (constant folding): the PYTHON
    device's (see ``ember.builtin_devices.python``), value for value, -0.0 and nan included; transcendental
    functions may differ from numpy's in the last bit."""
    kind = dtype.kind
    if kind == "b" and op not in _BOOL_NATIVE:
        # arithmetic on bools is done on 0/1 ints and converted back with != 0 (RECIP(False) is int 0: False)
        return exec_alu(op, dtypes.int32, tuple(int(s) for s in srcs)) != 0
    if kind != "f" and op in _INT_SPECIAL and op not in GroupOp.Comparison:
        return truncate(dtype, _INT_SPECIAL[op](dtype, *srcs))
    if kind == "f" and op is Ops.IDIV:
        # trunc of the quotient rounded to the register's dtype (bfloat16 computes in float32), as the device does
        q = truncate(dtypes.float32 if dtype == dtypes.bfloat16 else dtype, _fdiv(*srcs))
        return truncate(dtype, _trunc(q))
    fn = _PY_ALU[op]
    try:
        out = fn(*srcs)
    except (ZeroDivisionError, OverflowError, ValueError):
        if kind != "f":
            return 0
        a = srcs[0]
        if op is Ops.RECIP:
            out = math.copysign(math.inf, a)
        elif op is Ops.EXP or op is Ops.EXP2:
            out = math.inf
        else:
            out = math.nan
    return truncate(dtype, out)


def _c_idiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - _c_idiv(a, b) * b


def _shift(dtype: DType, a: int, b: int, left: bool) -> int:
    """C shifts in ``dtype``'s width; an amount that is negative or not below the width gives 0 (-1 for a right
    shift of a negative value)."""
    if b < 0 or b >= dtype.itemsize * 8:
        return -1 if (not left and a < 0) else 0
    return a << b if left else a >> b


#: ops whose integer semantics differ from Python's operators on ints: integer FDIV is IDIV (0 for a zero
#: divisor), TRUNC is the value itself, shifts follow C in the dtype's width
_INT_SPECIAL: dict[Ops, Callable[..., Any]] = {
    Ops.FDIV: lambda dt, a, b: _c_idiv(a, b) if b != 0 else 0,
    Ops.IDIV: lambda dt, a, b: _c_idiv(a, b) if b != 0 else 0,
    Ops.MOD: lambda dt, a, b: _c_mod(a, b) if b != 0 else 0,
    Ops.TRUNC: lambda dt, a: a,
    Ops.SHL: lambda dt, a, b: _shift(dt, a, b, True),
    Ops.SHR: lambda dt, a, b: _shift(dt, a, b, False),
}

#: ops a bool result computes on bools themselves (the rest compute on 0/1 ints)
_BOOL_NATIVE = frozenset({Ops.NEG, Ops.AND, Ops.OR, Ops.XOR, Ops.WHERE, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})


def _odd_int(x: float) -> bool:
    return math.isfinite(x) and x == math.floor(x) and math.fmod(x, 2.0) != 0


def _pow(a: float, b: float) -> float:
    """C's ``pow``: nan for a negative base to a non-integer power, a signed infinity for a zero base to a
    negative power and on overflow (negative only for a negative base and an odd integer power)."""
    a = float(a)
    try:
        return math.pow(a, b)
    except OverflowError:
        return -math.inf if a < 0 and _odd_int(b) else math.inf
    except ValueError:
        if a == 0:
            return math.copysign(math.inf, a) if _odd_int(b) else math.inf
        return math.nan


def _safe_sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


def _safe_log(x: float, f: Callable[[float], float]) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    return f(x)


def _safe_sin(x: float) -> float:
    return math.sin(x) if math.isfinite(x) else math.nan


def _fdiv(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _trunc(x: float) -> float:
    return math.copysign(float(math.trunc(x)), x) if math.isfinite(x) else x


_PY_ALU: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: lambda x: -x if not isinstance(x, bool) else not x,
    Ops.RECIP: lambda x: _fdiv(1.0, x), Ops.SQRT: _safe_sqrt,
    Ops.EXP: lambda x: math.exp(x) if not x >= 710 else math.inf,
    Ops.LOG: lambda x: _safe_log(x, math.log), Ops.EXP2: lambda x: 2.0 ** x if not x >= 1025 else math.inf,
    Ops.LOG2: lambda x: _safe_log(x, math.log2), Ops.SIN: _safe_sin,
    Ops.TRUNC: _trunc,
    Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b,
    Ops.FDIV: _fdiv, Ops.IDIV: _c_idiv,
    Ops.MOD: lambda a, b: _c_mod(a, b) if isinstance(a + b, int) else math.fmod(a, b),  # floats: C fmod
    Ops.MAX: lambda a, b: a if (a > b or a != a) else b,
    Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b, Ops.CMPEQ: lambda a, b: a == b,
    Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
    Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b, Ops.POW: _pow,
    Ops.WHERE: lambda c, a, b: a if c else b,
}


#: the live nodes by (op, dtype, src, arg, sign of a float arg): weak references, dropped when a node dies
_interned: dict[tuple, weakref.ref] = {}


def _forget(key: tuple, ref: weakref.ref) -> None:
    """Drop a dead node's entry from the intern table (unless a newer node took it): the weak reference's
    callback, bound to ``key`` with functools.partial (made in C: cheaper per node than a closure or KeyedRef)."""
    _remove_dead_weakref(_interned, key)


class UOpMeta(type):
    """Hash-conses UOp construction: identical (op, dtype, src, arg) give the same live object."""

    def __call__(cls, op: Ops, dtype: DType | PtrDType | None = None, src: tuple[UOp, ...] = (),
                 arg: Any = None) -> UOp:
        # -0.0 == 0.0 in Python, but they are different constants
        key = (op, dtype, src, arg, math.copysign(1.0, arg) if type(arg) is float else 0)
        try:
            ref = _interned.get(key)
        except TypeError as e:  # an unhashable arg is a bug in the caller: say which
            raise TypeError(f"UOp arg must be hashable, got {type(arg).__name__} for {op}") from e
        if ref is not None and (hit := ref()) is not None:
            return hit
        node = type.__call__(cls, op, dtype, src, arg)
        _interned[key] = weakref.ref(node, functools.partial(_forget, key))
        return node


class UOp(metaclass=UOpMeta):
    """One immutable DAG node. Build with ``UOp(op, dtype, src, arg)``; compare with ``is``."""

    __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")

    def __init__(self, op: Ops, dtype: DType | PtrDType | None, src: tuple[UOp, ...], arg: Any = None):
        self.op, self.dtype, self.src, self.arg = op, dtype, src, arg

    # identity semantics: hash-consing makes this structural
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __reduce__(self) -> tuple:
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def __repr__(self) -> str:
        return self.pretty(depth=3)

    def pretty(self, depth: int = 100, indent: int = 0) -> str:
        """A readable, indented dump of this node and ``depth`` levels of sources."""
        pad = "  " * indent
        head = f"{pad}UOp({self.op.name}, {self.dtype}, arg={self.arg!r}"
        if not self.src:
            return head + ")"
        if depth <= 0:
            return head + ", src=(...))"
        inner = ",\n".join(s.pretty(depth - 1, indent + 1) for s in self.src)
        return f"{head}, src=(\n{inner}))"

    # --- construction helpers -------------------------------------------------------------
    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        """A scalar constant converted to ``dtype``."""
        return UOp(Ops.CONST, dtype, (), truncate(dtype, value))

    def alu(self, op: Ops, *others: UOp) -> UOp:
        """Apply an ALU op; comparisons give bool, others keep ``self``'s dtype."""
        out_dtype = dtypes.bool if op in GroupOp.Comparison else (others[-1].dtype if op is Ops.WHERE else self.dtype)
        return UOp(op, out_dtype, (self, *others))

    @property
    def value_dtype(self) -> DType:
        """``dtype`` of a node that is a value (everything but pointers, STORE, ENDRANGE, SINK ...)."""
        if not isinstance(self.dtype, DType):
            raise TypeError(f"{self.op} is not a value (its dtype is {self.dtype})")
        return self.dtype

    @property
    def pointer_dtype(self) -> PtrDType:
        """``dtype`` of a buffer parameter (``DEFINE_GLOBAL``): a :class:`PtrDType`."""
        if not isinstance(self.dtype, PtrDType):
            raise TypeError(f"{self.op} is not a pointer (its dtype is {self.dtype})")
        return self.dtype

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def _other(self, x: UOp | int | float | bool) -> UOp:
        return x if isinstance(x, UOp) else UOp.const(self.value_dtype, x)

    def __add__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.ADD, self._other(x))

    def __radd__(self, x: int) -> UOp:
        return self._other(x).alu(Ops.ADD, self)

    def __mul__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.MUL, self._other(x))

    def __rmul__(self, x: int) -> UOp:
        return self._other(x).alu(Ops.MUL, self)

    def __sub__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.SUB, self._other(x))

    def __floordiv__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.IDIV, self._other(x))

    def __mod__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.MOD, self._other(x))

    def __neg__(self) -> UOp:
        return self.alu(Ops.NEG)

    def lt(self, x: UOp | int) -> UOp:
        return self.alu(Ops.CMPLT, self._other(x))

    def ne(self, x: UOp | int) -> UOp:
        return self.alu(Ops.CMPNE, self._other(x))

    def logical_and(self, x: UOp | bool) -> UOp:
        return self.alu(Ops.AND, self._other(x))

    def where(self, a: UOp, b: UOp) -> UOp:
        return self.alu(Ops.WHERE, a, b)

    def maximum(self, x: UOp | int) -> UOp:
        return self.alu(Ops.MAX, self._other(x))

    # --- graph walking ----------------------------------------------------------------------
    def toposort(self) -> list[UOp]:
        """All nodes reachable from self, sources before users (iterative, no recursion limit)."""
        return toposort([self])


    # --- integer bounds, used by symbolic simplification ----------------------------------
    @property
    def vmin(self) -> int | float:
        return self._bounds()[0]

    @property
    def vmax(self) -> int | float:
        return self._bounds()[1]

    def _bounds(self) -> tuple[Any, Any]:
        try:
            return self.__dict__["_b"]
        except KeyError:
            b = self.__dict__["_b"] = _bounds(self)
            return b


def toposort(roots: list[Any], stop: Callable[[Any], bool] | None = None,
             sources: Callable[[Any], Sequence[Any]] | None = None) -> list[Any]:
    """Nodes reachable from ``roots`` in dependency order (iterative: no recursion limit).

    ``stop(n)`` keeps n but not its sources; ``sources(n)`` overrides ``n.src`` (any DAG can be walked).
    The order is a depth-first post-order: each node's sources in their order, then the node.
    """
    if sources is not None:
        return _toposort_by_id(roots, stop, sources)
    # nodes with ``src`` (UOps) hash and compare by identity: the set holds them directly
    order: list[Any] = []
    seen: set[Any] = set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        # one (node, iterator over its sources) per open node: a node is appended once its iterator is spent
        stack = [(root, iter(() if stop is not None and stop(root) else root.src))]
        while stack:
            node, it = stack[-1]
            for s in it:
                if s not in seen:
                    seen.add(s)
                    stack.append((s, iter(() if stop is not None and stop(s) else s.src)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def _toposort_by_id(roots: list[Any], stop: Callable[[Any], bool] | None,
                    sources: Callable[[Any], Sequence[Any]]) -> list[Any]:
    """:func:`toposort` over any objects (their own ``==`` is never called)."""
    order: list[Any] = []
    seen: set[int] = set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(() if stop is not None and stop(root) else sources(root)))]
        while stack:
            node, it = stack[-1]
            for s in it:
                if id(s) not in seen:
                    seen.add(id(s))
                    stack.append((s, iter(() if stop is not None and stop(s) else sources(s))))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def serialize_uop(root: UOp) -> str:
    """A canonical text form of the DAG under ``root`` (equal strings iff equal graphs): a stable cache key."""
    index: dict[UOp, int] = {}
    lines = []
    for n in toposort([root]):
        index[n] = len(index)
        arg = n.arg.hex() if type(n.arg) is float else repr(n.arg)
        lines.append(f"{n.op.name} {n.dtype!r} {[index[s] for s in n.src]} {arg}")
    return "\n".join(lines)


def _isinf(x: Any) -> bool:
    return isinstance(x, float) and math.isinf(x)


def _bounds(u: UOp) -> tuple[Any, Any]:
    """Conservative [min, max] of an integer-valued node; (-inf, inf) when unknown."""
    dt = u.dtype
    # (bool: False, True; ints: dtypes.min, dtypes.max; anything else: -inf, inf)
    lo_hi: tuple[Any, Any] = dt._lo_hi if isinstance(dt, DType) else (-math.inf, math.inf)  # type: ignore[attr-defined]
    if u.op is Ops.CONST:
        return u.arg, u.arg
    if u.op is Ops.RANGE:
        return u.src[0].vmin, u.src[1].vmax - 1
    if u.op is Ops.SPECIAL:
        return 0, u.arg[1] - 1
    if u.op is Ops.DEFINE_VAR:
        return u.arg[1], u.arg[2]
    if not u.src or u.op not in GroupOp.ALU or (isinstance(dt, DType) and dt.kind == "f"):
        return lo_hi  # (float arithmetic rounds and makes nan: no bounds are claimed for it)
    out = _alu_bounds(u, lo_hi)
    if isinstance(dt, DType) and dt.kind in "iub" and (out[0] < lo_hi[0] or out[1] > lo_hi[1]):
        return lo_hi  # the result may wrap around (or a bool sum pass 1): only the dtype's range is known
    return out


def _alu_bounds(u: UOp, lo_hi: tuple[Any, Any]) -> tuple[Any, Any]:
    dt = u.dtype
    s0 = u.src[0]
    if u.op is Ops.ADD:
        return s0.vmin + u.src[1].vmin, s0.vmax + u.src[1].vmax
    if u.op is Ops.SUB:
        return s0.vmin - u.src[1].vmax, s0.vmax - u.src[1].vmin
    if u.op is Ops.NEG:
        if isinstance(dt, DType) and dt.kind == "b":  # NEG of a bool is logical not
            return not s0.vmax, not s0.vmin
        return -s0.vmax, -s0.vmin
    if u.op is Ops.MUL:
        vals = [a * b for a in (s0.vmin, s0.vmax) for b in (u.src[1].vmin, u.src[1].vmax)
                if not (_isinf(a) or _isinf(b)) or (a != 0 and b != 0)]
        return (min(vals), max(vals)) if vals else lo_hi
    if u.op is Ops.MAX:
        return max(s0.vmin, u.src[1].vmin), max(s0.vmax, u.src[1].vmax)
    if u.op in (Ops.IDIV, Ops.MOD) and u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int) and u.src[1].arg > 0:
        c = u.src[1].arg
        if u.op is Ops.MOD:
            return (0, min(c - 1, s0.vmax)) if s0.vmin >= 0 else (-(c - 1), c - 1)
        if s0.vmin >= 0 and not _isinf(s0.vmax):
            return s0.vmin // c, s0.vmax // c
        return lo_hi
    if u.op in GroupOp.Comparison:
        if u.op is Ops.CMPLT and getattr(s0.dtype, "kind", "f") != "f":  # (a float may be nan: no order is sure)
            if s0.vmax < u.src[1].vmin:
                return True, True
            if s0.vmin >= u.src[1].vmax:
                return False, False
        return False, True
    if u.op is Ops.AND and isinstance(dt, DType) and dt.kind == "b":
        return s0.vmin and u.src[1].vmin, s0.vmax and u.src[1].vmax
    if u.op is Ops.WHERE:
        return min(u.src[1].vmin, u.src[2].vmin), max(u.src[1].vmax, u.src[2].vmax)
    return lo_hi
