"""The PYTHON device: a numpy interpreter of linear UOp programs, the reference every other device is checked against.

It is slow and complete. :class:`PythonRenderer` writes the linear program (the table in
``docs/contracts.md``) as versioned JSON text, :class:`PythonCompiler` keeps that text as bytes, and
:class:`PythonProgram` decodes it once into a flat instruction list and runs it:

* every "global" RANGE (and SPECIAL, if a program has one) becomes one axis of a numpy grid, so the
  parallel part of a kernel runs vectorized; values are numpy arrays broadcastable to the grid, or scalars;
* "reduce" and "loop" RANGEs are real Python loops over the instructions up to their ENDRANGE.
* DEFINE_LOCAL is an array per work-group: the call's ``local_size`` (launch dimension d is grid axis
  n-1-d of the n grid axes) cuts the grid into work-groups, and a LOAD or STORE of local memory reaches its
  own work-group's array. Every instruction runs for the whole grid before the next, so a BARRIER holds by
  construction; a BARRIER source of a LOAD only orders it.
* a vector register (a LOAD, STORE, VECTORIZE, CONST, ALU op or accumulator of ``dtype.vec(n)``) is a tuple of its
  lanes' values; a vector LOAD or STORE is one scalar access per lane, at an index checked to be a multiple of
  ``n``; GEP picks a lane; a vector ALU op is the scalar op on each lane.
* DEFINE_REG (a rolled epilogue's array, see :mod:`ember.codegen.epilogue`) is the tuple of its sources' lanes; a
  LOAD from it picks the lane at its index.
* WMMA (a tensor-core instruction, see :mod:`ember.codegen.tc`) gathers the lanes' elements of A and B along
  the last grid axis into tiles by the layout its arg carries, multiplies them in float32 and hands each lane
  its element of D.

Semantics (C renderers mirror these, so that results agree bit for bit where C defines them):

* integers wrap on overflow in their own width. IDIV truncates toward zero, MOD takes the sign of the
  dividend, and both give 0 for a zero divisor; ``INT_MIN / -1`` wraps to ``INT_MIN`` and ``INT_MIN % -1``
  is 0. IDIV of floats is ``trunc(a / b)``, MOD of floats is C ``fmod``, FDIV of integers is IDIV.
* ``MAX(a, b) = (a > b || a != a) ? a : b``: a NaN in either operand gives NaN, and on a tie (also
  ``0.0`` against ``-0.0``) the second operand is the result.
* comparisons follow IEEE (CMPNE with a NaN is true, the others false) and give bool.
* NEG of a bool is logical not; other arithmetic on bools is done on 0/1 and converted back with ``!= 0``.
* SHL/SHR work in the operand's width (SHR is arithmetic for signed types, logical for unsigned); a shift
  amount that is negative or not below the bit width gives 0 (-1 for SHR of a negative signed value).
* CAST float -> int truncates toward zero; NaN, and a value whose truncation does not fit the target
  (negative values cast to an unsigned type included), give 0. ``-> bool`` is ``x != 0`` (NaN is true);
  int -> int wraps; bool -> number gives 0 or 1.
* float16 results are rounded to float16 after every op (C code that keeps each result in a ``half``
  variable does the same). bfloat16 values live in float32 registers that always hold an exact bfloat16
  value: every op and cast producing bfloat16 rounds to nearest even once (a NaN keeps its top payload
  bits, made quiet when lower bits are dropped, as :func:`ember.dtype.f32_to_bf16` does); LOAD, STORE and
  BITCAST of bfloat16 values move the 16 bits unchanged. A LOAD or STORE whose value dtype differs from
  the buffer's converts like CAST (so a float32 value stored into a bfloat16 buffer rounds to nearest even).
* a gated LOAD never reads where the gate is false and gives 0 there; a gated STORE writes only where the
  gate is true; an index outside the buffer raises ``IndexError`` naming the kernel and the buffer.
* transcendental functions are numpy's; they may differ from a C libm in the last bit.

``global_size`` is ignored: the iteration space comes from the program's RANGEs. ``local_size`` only shapes
the work-groups of a program that uses local memory.
"""
from __future__ import annotations

import functools
import json
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ember.device.allocator import Allocator
from ember.device.compiled import Compiled
from ember.device.compiler import CompileError, Compiler
from ember.dtype import DTYPES_ALL, DType, PtrDType, dtypes, to_np_dtype, truncate
from ember.ir.uop import GroupOp, Ops, UOp
from ember.renderer import Renderer

FORMAT = "ember-python-linear/1"
"""Version tag written by :class:`PythonRenderer` and checked by :class:`PythonProgram`."""

_DTYPE_BY_NAME: dict[str, DType] = {d.name: d for d in DTYPES_ALL}

# ---------------------------------------------------------------------------------------------
# serialization
# ---------------------------------------------------------------------------------------------


def _encode_dtype(dt: DType | PtrDType | None) -> str | None:
    if dt is None:
        return None
    if isinstance(dt, PtrDType):
        return dt.base.name + "*"
    if isinstance(dt, DType):
        return dt.name if dt.count == 1 else f"{dt.scalar().name}:{dt.count}"
    raise TypeError(f"can't encode dtype {dt!r}")


def _decode_dtype(s: str | None) -> DType | PtrDType | None:
    if s is None:
        return None
    if s.endswith("*"):
        return _DTYPE_BY_NAME[s[:-1]].ptr()
    if ":" in s:  # a vector: the lane's dtype and the lane count
        name, count = s.split(":")
        return _DTYPE_BY_NAME[name].vec(int(count))
    return _DTYPE_BY_NAME[s]


def _encode_arg(a: Any) -> Any:
    """A JSON value that names its type, so that bools, ints and floats (inf, nan, -0.0) come back exactly."""
    if a is None:
        return None
    if isinstance(a, (bool, np.bool_)):
        return {"b": bool(a)}
    if isinstance(a, (int, np.integer)):
        return {"i": int(a)}
    if isinstance(a, (float, np.floating)):
        return {"f": float(a).hex()}
    if isinstance(a, str):
        return {"s": a}
    if isinstance(a, tuple):
        return {"t": [_encode_arg(x) for x in a]}
    if isinstance(a, Ops):
        return {"op": a.name}
    if isinstance(a, DType):
        return {"dt": a.name}
    raise TypeError(f"PYTHON renderer can't encode a UOp arg of type {type(a).__name__}: {a!r}")


def _decode_arg(a: Any) -> Any:
    if a is None:
        return None
    (tag, v), = a.items()
    if tag == "b":
        return bool(v)
    if tag == "i":
        return int(v)
    if tag == "f":
        return float.fromhex(v)
    if tag == "s":
        return str(v)
    if tag == "t":
        return tuple(_decode_arg(x) for x in v)
    if tag == "op":
        return Ops[v]
    if tag == "dt":
        return _DTYPE_BY_NAME[v]
    raise ValueError(f"unknown arg tag {tag!r} in a PYTHON program")


def encode_program(name: str, uops: Sequence[UOp]) -> str:
    """The text form of a linear program: a JSON object with one UOp per line, sources as indices."""
    index: dict[UOp, int] = {}
    lines: list[str] = []
    for i, u in enumerate(uops):
        try:
            srcs = [index[s] for s in u.src]
        except KeyError:
            raise ValueError(f"kernel {name}: uop {i} ({u.op.name}) uses a source that does not come "
                             "before it") from None
        index[u] = i
        lines.append(json.dumps([u.op.name, _encode_dtype(u.dtype), srcs, _encode_arg(u.arg)], allow_nan=False))
    head = json.dumps({"format": FORMAT, "name": name})[:-1]
    return head + ', "uops": [\n' + ",\n".join(lines) + "\n]}\n"


def decode_program(src: str) -> tuple[str, list[tuple[Ops, DType | PtrDType | None, tuple[int, ...], Any]]]:
    """Inverse of :func:`encode_program`: the kernel name and ``(op, dtype, src indices, arg)`` per uop."""
    obj = json.loads(src)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        got = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f"not a PYTHON program of format {FORMAT!r} (got {got!r})")
    out = []
    for op, dt, srcs, arg in obj["uops"]:
        out.append((Ops[op], _decode_dtype(dt), tuple(int(s) for s in srcs), _decode_arg(arg)))
    return obj["name"], out


# ---------------------------------------------------------------------------------------------
# value semantics
# ---------------------------------------------------------------------------------------------

_BOOL = np.dtype(np.bool_)


def round_to_bf16(x: Any) -> np.ndarray:
    """float32 values rounded to the nearest-even bfloat16 value, still as float32 (same shape)."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    nan_bits = np.where((bits & np.uint32(0xFFFF)) != 0, (bits | np.uint32(0x400000)) & np.uint32(0xFFFF0000),
                        bits)
    return np.where(np.isnan(x), nan_bits, rounded).astype(np.uint32).view(np.float32)


def _f64_to_f32_round_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd: a later rounding to fewer bits then rounds only once."""
    y = x.astype(np.float32)
    bits = y.view(np.uint32)
    y64 = y.astype(np.float64)
    inexact = (y64 != x) & np.isfinite(y)
    up = np.abs(x) > np.abs(y64)  # move one step away from zero, else toward it (sign-magnitude bits)
    nudged = np.where(up, bits + np.uint32(1), bits - np.uint32(1)).astype(np.uint32)
    return np.where(inexact & ((bits & np.uint32(1)) == 0), nudged, bits).astype(np.uint32).view(np.float32)


def _int64_to_f64_round_odd(x: Any) -> np.ndarray:
    """64-bit integers -> float64 rounding to odd (exact below 2**53), so that narrowing further rounds once."""
    x = np.asarray(x)
    hi = (x >> 32).astype(np.float64) * 4294967296.0  # both halves are exact in float64
    lo = (x & 0xFFFFFFFF).astype(np.float64)
    s = hi + lo
    b = s - hi
    err = (hi - (s - b)) + (lo - b)  # what the sum rounded off, exactly (TwoSum)
    bits = s.view(np.uint64)
    away = np.sign(err) == np.sign(s)  # the dropped part points away from zero: step out, else step in
    nudged = np.where(away, bits + np.uint64(1), bits - np.uint64(1)).astype(np.uint64)
    return np.where((err != 0) & ((bits & np.uint64(1)) == 0), nudged, bits).astype(np.uint64).view(np.float64)


def _bf16_bits(x: Any) -> np.ndarray:
    """The 16 bits of bfloat16 register values (which are exact, so this only drops zero bits)."""
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def _from_bf16_bits(bits: Any) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _reg_np(dt: DType) -> Any:
    """The numpy dtype a register of ``dt`` holds (bfloat16 computes in float32)."""
    return np.dtype(np.float32) if dt == dtypes.bfloat16 else np.dtype(to_np_dtype(dt))


def _as(x: Any, npdt: np.dtype) -> Any:
    return x if getattr(x, "dtype", None) == npdt else np.asarray(x).astype(npdt)


def cast_value(x: Any, src: DType, dst: DType) -> Any:
    """C value conversion of a register value of dtype ``src`` to dtype ``dst`` (see the module docstring)."""
    if dst == dtypes.bool:
        return np.not_equal(x, 0)
    if dst == dtypes.bfloat16:
        if src.kind == "b":
            return np.asarray(x).astype(np.float32)
        if src in (dtypes.float32, dtypes.bfloat16, dtypes.float16):
            return round_to_bf16(np.asarray(x).astype(np.float32))
        # float64 and integers: one rounding (ints up to 32 bits are exact in float64; 64-bit ones round to odd)
        wide = (_int64_to_f64_round_odd(x) if src.kind in "iu" and src.itemsize == 8
                else np.asarray(x).astype(np.float64))
        return round_to_bf16(_f64_to_f32_round_odd(wide))
    npdt = np.dtype(to_np_dtype(dst))
    if dst.kind in "iu" and src.kind == "f":
        t = np.trunc(np.asarray(x).astype(np.float64))
        bits = dst.bitsize
        lo, hi = (0.0, 2.0 ** bits) if dst.kind == "u" else (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1))
        ok = (t >= lo) & (t < hi)
        return np.where(ok, t, 0.0).astype(npdt)
    return np.asarray(x).astype(npdt)


def bitcast_value(x: Any, src: DType, dst: DType) -> Any:
    """Reinterpret the bits of a register value of ``src`` as ``dst`` (same item size)."""
    raw = _bf16_bits(x) if src == dtypes.bfloat16 else np.asarray(x).astype(to_np_dtype(src))
    if dst == dtypes.bfloat16:
        return _from_bf16_bits(raw.view(np.uint16))
    if dst == dtypes.bool:
        return np.not_equal(raw.view(np.uint8), 0)
    return raw.view(to_np_dtype(dst))


def _idiv_int(a: Any, b: Any) -> Any:
    zero = b == 0
    bs = np.where(zero, np.ones((), b.dtype), b)
    q = np.floor_divide(a, bs)
    if b.dtype.kind == "i":  # floor -> trunc: step back toward zero when the division was inexact
        r = a - q * bs
        q = q + ((r != 0) & ((a < 0) != (bs < 0))).astype(q.dtype)
    return np.where(zero, np.zeros((), q.dtype), q)


def _mod_int(a: Any, b: Any) -> Any:
    zero = b == 0
    r = np.fmod(a, np.where(zero, np.ones((), b.dtype), b))
    return np.where(zero, np.zeros((), r.dtype), r)


def _max(a: Any, b: Any) -> Any:
    take_a = a > b
    if a.dtype.kind == "f":
        take_a = take_a | (a != a)
    return np.where(take_a, a, b)


def _shift(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def shift(a: Any, b: Any) -> Any:
        bits = a.dtype.itemsize * 8
        bad = (b < 0) | (b >= bits)
        # numpy already gives 0 / sign fill for too large amounts; route negative ones there as well
        return fn(a, np.where(bad, np.asarray(bits, b.dtype), b))
    return shift


_FLOAT_FNS: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: np.negative, Ops.RECIP: lambda x: np.divide(np.ones((), x.dtype), x), Ops.SQRT: np.sqrt,
    Ops.EXP: np.exp, Ops.LOG: np.log, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.TRUNC: np.trunc,
    Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.divide,
    Ops.IDIV: lambda a, b: np.trunc(np.divide(a, b)), Ops.MOD: np.fmod, Ops.MAX: _max, Ops.POW: np.power,
}

_INT_FNS: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: np.negative, Ops.TRUNC: lambda x: x,
    Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: _idiv_int, Ops.IDIV: _idiv_int,
    Ops.MOD: _mod_int, Ops.MAX: _max, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
    Ops.SHL: _shift(np.left_shift), Ops.SHR: _shift(np.right_shift),
}

_CMP_FNS: dict[Ops, Callable[..., Any]] = {Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal}

_FLOAT_ONLY = frozenset({Ops.RECIP, Ops.SQRT, Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW})


def _converter(npdt: np.dtype) -> Callable[[Any], Any]:
    return lambda r: r if getattr(r, "dtype", None) == npdt else np.asarray(r).astype(npdt)


def _typed_call(fn: Callable[..., Any], in_np: np.dtype, post: Callable[[Any], Any], nargs: int) -> Callable[..., Any]:
    """``post(fn(*operands))`` with every operand converted to ``in_np`` (specialized by arity for speed)."""
    if nargs == 1:
        return lambda a: post(fn(_as(a, in_np)))
    if nargs == 2:
        return lambda a, b: post(fn(_as(a, in_np), _as(b, in_np)))
    return lambda *xs: post(fn(*(_as(x, in_np) for x in xs)))


def _make_alu(op: Ops, dt: DType, src_dts: tuple[DType, ...]) -> Callable[..., Any]:
    """A function computing ``op`` on register values, giving a register value of ``dt``."""
    out_np = _reg_np(dt)
    nargs = len(src_dts)
    if op in _CMP_FNS:
        return _CMP_FNS[op]
    if op is Ops.WHERE:
        def where(c: Any, a: Any, b: Any) -> Any:
            return _as(np.where(_as(c, _BOOL), _as(a, out_np), _as(b, out_np)), out_np)
        return where
    if dt == dtypes.bool:
        if op is Ops.NEG:
            return np.logical_not
        if op in (Ops.AND, Ops.OR, Ops.XOR):
            return _typed_call(_INT_FNS[op], out_np, _converter(out_np), nargs)
        # other arithmetic on bools: compute on 0/1 ints, then back to bool
        int_fn = _make_alu(op, dtypes.int32, tuple(dtypes.int32 for _ in src_dts))
        return _typed_call(int_fn, np.dtype(np.int32), lambda r: np.not_equal(r, 0), nargs)
    if dt.kind == "f":
        if op not in _FLOAT_FNS:
            raise TypeError(f"{op.name} is not defined for {dt.name}")
        post = round_to_bf16 if dt == dtypes.bfloat16 else _converter(out_np)
        return _typed_call(_FLOAT_FNS[op], out_np, post, nargs)
    # integers
    if op in _FLOAT_ONLY:  # as C would: compute in double, convert back
        return _typed_call(_FLOAT_FNS[op], np.dtype(np.float64),
                           functools.partial(cast_value, src=dtypes.float64, dst=dt), nargs)
    if op not in _INT_FNS:
        raise TypeError(f"{op.name} is not defined for {dt.name}")
    return _typed_call(_INT_FNS[op], out_np, _converter(out_np), nargs)


def _const_value(dt: DType, value: Any) -> Any:
    v = truncate(dt, value)
    return np.asarray(v, dtype=_reg_np(dt))[()]


# ---------------------------------------------------------------------------------------------
# the program
# ---------------------------------------------------------------------------------------------

# instruction kinds
(_K_ALU, _K_ALU1, _K_ALU2, _K_LOAD, _K_STORE, _K_ACC, _K_ASSIGN, _K_LOOP, _K_ENDLOOP, _K_GRID, _K_NOP,
 _K_SINK, _K_LOCAL, _K_LLOAD, _K_LSTORE, _K_WMMA, _K_VLOAD, _K_VSTORE) = range(18)

_NOP_OPS = frozenset({Ops.BARRIER})


class PythonProgram:
    """A linear program decoded once and run with numpy: ``PythonProgram(name, lib)(*bufs, vals=...)``.

    Construction checks the program (sources before users, matching RANGE/ENDRANGE, supported ops and
    dtypes) and raises ``ValueError`` naming the kernel and the offending uop.
    """

    def __init__(self, name: str, lib: bytes):
        self.name = name
        prog_name, uops = decode_program(lib.decode() if isinstance(lib, (bytes, bytearray, memoryview)) else lib)
        self.kernel_name = prog_name
        n = len(uops)
        reg = list(range(n))  # ASSIGN writes (and its users read) its accumulator's register
        self._init_regs: list[Any] = [None] * n
        self._globals: list[tuple[int, int, DType, int | None]] = []  # (register, param index, dtype, size)
        self._vars: list[tuple[int, DType, str, Any, Any]] = []  # (register, dtype, name, min, max)
        self._code: list[tuple[int, int, tuple[int, ...], Any, Any]] = []  # (kind, out register, srcs, fn, aux)
        self._grid_axes = 0
        self._uses_local = False
        open_ranges: list[tuple[int, int, bool]] = []  # (uop index, code position, is global)
        params: dict[int, int] = {}  # DEFINE_GLOBAL uop index -> parameter index, for error messages
        dts: list[Any] = [dt for _, dt, _, _ in uops]

        def fail(i: int, msg: str) -> ValueError:
            return ValueError(f"kernel {prog_name}: uop {i} ({uops[i][0].name}): {msg}")

        def value_dt(i: int, dt: DType | PtrDType | None) -> DType:
            if not isinstance(dt, DType):
                raise fail(i, f"needs a value dtype, got {dt!r}")
            return dt

        for i, (op, dt, srcs, arg) in enumerate(uops):
            if any(s >= i or s < 0 for s in srcs):
                raise fail(i, "a source does not come before its user")
            rs = tuple(reg[s] for s in srcs)
            if op is Ops.DEFINE_GLOBAL:
                if not isinstance(dt, PtrDType):
                    raise fail(i, f"DEFINE_GLOBAL needs a pointer dtype, got {dt!r}")
                idx, size = (arg, None) if isinstance(arg, int) else (arg[0], arg[1])
                self._globals.append((i, idx, dt.base, size))
                params[i] = idx
            elif op is Ops.DEFINE_VAR:
                self._vars.append((i, dt, *arg[:3]))
            elif op is Ops.CONST:
                cdt = value_dt(i, dt)
                lane_value = _const_value(cdt.scalar(), arg)
                self._init_regs[i] = lane_value if cdt.count == 1 else (lane_value,) * cdt.count
            elif op is Ops.SPECIAL:
                if open_ranges and not all(g for _, _, g in open_ranges):
                    raise fail(i, "SPECIAL inside a sequential loop")
                self._code.append((_K_GRID, i, (), None, (self._grid_axes, (int(arg[1]), _reg_np(value_dt(i, dt))),
                                                          None)))
                self._grid_axes += 1
            elif op is Ops.RANGE:
                kind = arg[1] if isinstance(arg, tuple) and len(arg) > 1 else "loop"
                if kind == "global":
                    if open_ranges and not all(g for _, _, g in open_ranges):
                        raise fail(i, "a global RANGE inside a sequential loop")
                    open_ranges.append((i, len(self._code), True))
                    self._code.append((_K_GRID, i, rs, None, [self._grid_axes, _reg_np(value_dt(i, dt)), None]))
                    self._grid_axes += 1
                else:
                    open_ranges.append((i, len(self._code), False))
                    self._code.append((_K_LOOP, i, rs, None, [None, _reg_np(value_dt(i, dt)).type]))
            elif op is Ops.ENDRANGE:
                if not open_ranges or open_ranges[-1][0] != srcs[0]:
                    raise fail(i, "ENDRANGE does not close the innermost open RANGE")
                _, start_pos, is_global = open_ranges.pop()
                end_pos = len(self._code)
                if is_global:  # an empty global range skips past its ENDRANGE
                    self._code[start_pos][4][2] = end_pos + 1
                    self._code.append((_K_NOP, i, (), None, None))
                else:
                    self._code[start_pos][4][0] = end_pos + 1
                    self._code.append((_K_ENDLOOP, reg[srcs[0]], (), None, (start_pos, _reg_np(dts[srcs[0]]).type)))
            elif op is Ops.DEFINE_ACC and value_dt(i, dt).count != 1:  # an accumulator vector: a tuple
                self._code.append((_K_ALU, i, rs, _lanes_as(_reg_np(cast(DType, dt).scalar())), None))
            elif op is Ops.DEFINE_ACC:
                self._code.append((_K_ACC, i, rs, None, _reg_np(value_dt(i, dt))))
            elif op is Ops.ASSIGN:
                reg[i] = rs[0]
                acc_dt = dts[srcs[0]]
                if acc_dt.count != 1:
                    self._code.append((_K_ALU, rs[0], rs[1:], _lanes_as(_reg_np(acc_dt.scalar())), None))
                else:
                    self._code.append((_K_ASSIGN, rs[0], rs[1:], None, _reg_np(acc_dt)))
            elif op is Ops.DEFINE_LOCAL:
                if not isinstance(dt, PtrDType) or not (isinstance(arg, tuple) and len(arg) == 2
                                                        and isinstance(arg[1], int) and arg[1] >= 0):
                    raise fail(i, f"DEFINE_LOCAL needs a pointer dtype and arg (id, size), got {dt!r}, {arg!r}; "
                                  "other forms are not supported")
                self._uses_local = True
                self._code.append((_K_LOCAL, i, (), None, (_reg_np(dt.base), arg[1], prog_name)))
            elif op is Ops.WMMA:
                self._code.append((_K_WMMA, i, rs[:-1], None, (*arg, _reg_np(value_dt(i, dt)))))
            elif op is Ops.DEFINE_REG:
                if not isinstance(dt, PtrDType) or not (isinstance(arg, tuple) and len(arg) == 2) or \
                        sum(value_dt(s, dts[s]).count for s in srcs) != arg[1] or \
                        any(dts[s].scalar() != dt.base for s in srcs):
                    raise fail(i, f"DEFINE_REG of {dt!r}, arg {arg!r} holds the lanes of {[dts[s] for s in srcs]}")
                self._code.append((_K_ALU, i, rs, _reg_lanes, None))
            elif op is Ops.LOAD and srcs and uops[srcs[0]][0] is Ops.DEFINE_REG:
                if len(srcs) != 2 or dt != cast(PtrDType, dts[srcs[0]]).base:
                    raise fail(i, f"a LOAD of {dt!r} from a DEFINE_REG needs (reg, idx) of its element dtype")
                self._code.append((_K_ALU, i, rs, functools.partial(_reg_load, kernel=prog_name), None))
            elif (op is Ops.LOAD or op is Ops.STORE) and srcs and uops[srcs[0]][0] is Ops.DEFINE_LOCAL:
                # local memory holds register values: nothing to convert
                kept = tuple(r for s, r in zip(srcs, rs) if uops[s][0] is not Ops.BARRIER)
                self._code.append((_K_LLOAD if op is Ops.LOAD else _K_LSTORE, i, kept, None, prog_name))
            elif op is Ops.LOAD or op is Ops.STORE:
                if not isinstance(dts[srcs[0]], PtrDType):
                    raise fail(i, f"{op.name} with something that is not a buffer")
                base: DType = dts[srcs[0]].base
                label = f"buffer {params[srcs[0]]}" if srcs[0] in params else "a buffer"
                conv: Callable[[Any], Any] | None
                vdt = dt if op is Ops.LOAD else dts[srcs[2]] if len(srcs) > 2 else None
                if isinstance(vdt, DType) and vdt.count != 1:
                    # a vector access: its lanes are the buffer's elements from the index on
                    if vdt.scalar() != base:
                        raise fail(i, f"a vector {op.name} of {vdt!r} on a buffer of {base!r}")
                    self._code.append((_K_VLOAD if op is Ops.LOAD else _K_VSTORE, i, rs, None,
                                       (vdt.count, base == dtypes.bfloat16, None, prog_name, label)))
                elif op is Ops.LOAD:
                    conv = None if dt == base else functools.partial(cast_value, src=base, dst=value_dt(i, dt))
                    self._code.append((_K_LOAD, i, rs, None, (base == dtypes.bfloat16, conv, prog_name, label)))
                else:
                    val_dt = dts[srcs[2]]
                    conv = None if val_dt == base else functools.partial(cast_value, src=val_dt, dst=base)
                    self._code.append((_K_STORE, i, rs, None, (base == dtypes.bfloat16, conv, prog_name, label)))
            elif op is Ops.CAST or op is Ops.BITCAST:
                sdt, ddt = dts[srcs[0]], value_dt(i, dt)
                if op is Ops.BITCAST and sdt.itemsize != ddt.itemsize:
                    raise fail(i, f"BITCAST between sizes {sdt.itemsize} and {ddt.itemsize}")
                convert = cast_value if op is Ops.CAST else bitcast_value
                self._code.append((_K_ALU, i, rs, functools.partial(convert, src=sdt, dst=ddt), None))
            elif op is Ops.VECTORIZE:
                if not isinstance(dt, DType) or dt.count != len(srcs) or any(dts[s] != dt.scalar() for s in srcs):
                    raise fail(i, f"VECTORIZE to {dt!r} of {[dts[s] for s in srcs]}")
                self._code.append((_K_ALU, i, rs, _lanes, None))
            elif op is Ops.GEP:
                vdt = dts[srcs[0]]
                if not (isinstance(vdt, DType) and isinstance(arg, int) and 0 <= arg < vdt.count
                        and dt == vdt.scalar()):
                    raise fail(i, f"GEP {arg!r} to {dt!r} of {vdt!r}")
                self._code.append((_K_ALU, i, rs, operator.itemgetter(arg), None))
            elif op in GroupOp.ALU and value_dt(i, dt).count != 1:  # lane by lane, each as the scalar op
                if any(not isinstance(dts[s], DType) or dts[s].count != cast(DType, dt).count for s in srcs):
                    raise fail(i, f"{op.name} to {dt!r} of {[dts[s] for s in srcs]}")
                try:
                    fn = _make_alu(op, cast(DType, dt).scalar(), tuple(dts[s].scalar() for s in srcs))
                except TypeError as e:
                    raise fail(i, str(e)) from None
                self._code.append((_K_ALU, i, rs, functools.partial(_lanewise, fn), None))
            elif op in GroupOp.ALU:
                try:
                    fn = _make_alu(op, value_dt(i, dt), tuple(dts[s] for s in srcs))
                except TypeError as e:
                    raise fail(i, str(e)) from None
                self._code.append((_K_ALU, i, rs, fn, None))
            elif op in _NOP_OPS:
                pass
            elif op is Ops.SINK:
                self._code.append((_K_SINK, i, (), None, None))
            else:
                raise fail(i, "not supported by the PYTHON device")
        if open_ranges:
            raise fail(open_ranges[-1][0], "RANGE without ENDRANGE")
        # one- and two-operand ALU ops get their own instruction kinds: they are most of every program
        arity_kind = {1: _K_ALU1, 2: _K_ALU2}
        self._code = [(arity_kind.get(len(c[2]), _K_ALU), *c[1:]) if c[0] == _K_ALU else c for c in self._code]

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
                 vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        """Run the program on ``bufs`` (opaque PYTHON buffers, contiguous numpy arrays or writable buffers).

        ``vals`` gives the DEFINE_VARs in program order. ``global_size`` and ``local_size`` are accepted for the
        common program interface and ignored: the RANGEs decide the iteration space. The run is synchronous;
        with ``wait`` the elapsed seconds are returned.
        """
        start = time.perf_counter()
        regs = list(self._init_regs)
        for r, idx, dt, size in self._globals:
            if idx >= len(bufs):
                raise ValueError(f"kernel {self.kernel_name}: buffer parameter {idx} missing, got {len(bufs)} buffers")
            regs[r] = _typed_view(bufs[idx], dt, size, self.kernel_name, idx)
        if len(vals) != len(self._vars):
            raise ValueError(f"kernel {self.kernel_name}: expected {len(self._vars)} vals "
                             f"({', '.join(v[2] for v in self._vars)}), got {len(vals)}")
        for (r, dt, vname, lo, hi), v in zip(self._vars, vals):
            if not lo <= int(v) <= hi:
                raise ValueError(f"kernel {self.kernel_name}: variable {vname}={v} is outside [{lo}, {hi}]")
            regs[r] = _const_value(dt, int(v))
        if self._uses_local and local_size is None:
            raise ValueError(f"kernel {self.kernel_name} uses local memory: it needs the local_size it was "
                             "planned with")
        with np.errstate(all="ignore"):
            self._run(regs, tuple(local_size) if local_size is not None else ())
        return time.perf_counter() - start if wait else None

    def _run(self, regs: list[Any], local_size: tuple[int, ...] = ()) -> None:
        code = self._code
        ndim = self._grid_axes
        extents = [1] * ndim
        loop_end: dict[int, int] = {}
        pc, n = 0, len(code)
        while pc < n:
            kind, out, srcs, fn, aux = code[pc]
            pc += 1
            if kind == _K_ALU2:
                regs[out] = fn(regs[srcs[0]], regs[srcs[1]])
            elif kind == _K_ALU1:
                regs[out] = fn(regs[srcs[0]])
            elif kind == _K_ALU:
                regs[out] = fn(*[regs[s] for s in srcs])
            elif kind == _K_LOAD:
                regs[out] = _load(regs, srcs, *aux)
            elif kind == _K_STORE:
                _store(regs, srcs, *aux)
            elif kind == _K_ACC:
                regs[out] = _as(regs[srcs[0]], aux)
            elif kind == _K_ASSIGN:
                regs[out] = _as(regs[srcs[0]], aux)
            elif kind == _K_ENDLOOP:
                start_pos, scalar_type = aux
                nxt = int(regs[out]) + 1
                if nxt < loop_end[out]:
                    regs[out] = scalar_type(nxt)
                    pc = start_pos + 1
            elif kind == _K_LOOP:
                lo, hi = (_scalar_bound(regs[s], self.kernel_name) for s in srcs)
                if lo >= hi:
                    pc = aux[0]
                else:
                    regs[out] = aux[1](lo)
                    loop_end[out] = hi
            elif kind == _K_GRID:
                axis, extra, skip_to = aux
                if srcs:
                    lo, hi = (_scalar_bound(regs[s], self.kernel_name) for s in srcs)
                    rng = np.arange(lo, max(lo, hi), dtype=extra)
                else:  # SPECIAL: 0 .. extent, in its own type
                    rng = np.arange(extra[0], dtype=extra[1])
                if rng.size == 0:
                    if skip_to is None:
                        return
                    pc = skip_to
                    continue
                shape = [1] * ndim
                shape[axis] = rng.size
                extents[axis] = rng.size
                regs[out] = rng.reshape(shape)
            elif kind == _K_LLOAD:
                mem, group = regs[srcs[0]]
                idx = regs[srcs[1]]
                if len(srcs) > 2:
                    idx = np.where(_as(regs[srcs[2]], _BOOL), idx, 0)
                _check_bounds(np.asarray(idx), mem.shape[1], "local LOAD", aux, "local memory")
                v = mem[group, idx]
                regs[out] = np.where(_as(regs[srcs[2]], _BOOL), v, np.zeros((), mem.dtype)) if len(srcs) > 2 else v
            elif kind == _K_LSTORE:
                mem, group = regs[srcs[0]]
                parts = np.broadcast_arrays(group, regs[srcs[1]], _as(regs[srcs[2]], mem.dtype),
                                            *([_as(regs[srcs[3]], _BOOL)] if len(srcs) > 3 else []))
                g, idx, val = (p.reshape(-1) for p in parts[:3])
                if len(srcs) > 3:
                    keep = parts[3].reshape(-1)
                    g, idx, val = g[keep], idx[keep], val[keep]
                _check_bounds(idx, mem.shape[1], "local STORE", aux, "local memory")
                mem[g, idx] = val
            elif kind == _K_LOCAL:
                regs[out] = _work_groups(extents, local_size, *aux)
            elif kind == _K_WMMA:
                regs[out] = _wmma([regs[s] for s in srcs], ndim, *aux)
            elif kind == _K_SINK:
                return
            elif kind == _K_VLOAD:
                regs[out] = _vload(regs, srcs, *aux)
            elif kind == _K_VSTORE:
                _vstore(regs, srcs, *aux)


def _wmma(vals: list[Any], ndim: int, _intrinsic: str, dims: tuple[int, int, int], threads: int,
          counts: tuple[int, int, int], _dtype_in: DType, element: int, maps: tuple, out_np: np.dtype) -> np.ndarray:
    """Element ``element`` of each lane's D = A @ B for a tensor-core instruction: the lanes are the last grid
    axis (``threads`` of them); each lane's elements of A and B are placed by the layout ``maps``, the tiles
    multiplied in float32 (products of 16-bit floats are exact there), and D read back the same way."""
    m, n, k = dims
    shape = list(np.broadcast_shapes(*(np.shape(v) for v in vals), (1,) * ndim))
    if shape[-1] not in (1, threads):
        raise ValueError(f"a tensor-core instruction needs {threads} lanes along the last grid axis, got {shape[-1]}")
    shape[-1] = threads
    tiles = []
    for operand, (rows, cols), start, count in (("A", (m, k), 0, counts[0]), ("B", (k, n), counts[0], counts[1])):
        mat = np.zeros((*shape[:-1], rows, cols), np.float32)
        layout = maps["AB".index(operand)]
        for i in range(count):
            r = np.array([layout[lane][i][0] for lane in range(threads)])
            c = np.array([layout[lane][i][1] for lane in range(threads)])
            mat[..., r, c] = np.broadcast_to(np.asarray(vals[start + i], np.float32), shape)
        tiles.append(mat)
    d = tiles[0] @ tiles[1]
    r = np.array([maps[2][lane][element][0] for lane in range(threads)])
    c = np.array([maps[2][lane][element][1] for lane in range(threads)])
    return d[..., r, c].astype(out_np)


def _work_groups(extents: list[int], local_size: tuple[int, ...], npdt: Any, size: int,
                 kernel: str) -> tuple[np.ndarray, np.ndarray]:
    """Local memory for a grid of ``extents``: one row of ``size`` values per work-group, and each grid
    point's row (broadcastable to the grid). Launch dimension d of ``local_size`` is grid axis n-1-d."""
    n = len(extents)
    group = np.zeros((1,) * n, np.int64)
    count = 1
    for axis in range(n):
        dim = n - 1 - axis
        local = int(local_size[dim]) if dim < len(local_size) else 1
        if local < 1 or extents[axis] % local:
            raise ValueError(f"kernel {kernel}: work-group size {local} does not divide the grid's {extents[axis]} "
                             f"along launch dimension {dim}")
        shape = [1] * n
        shape[axis] = extents[axis]
        group = group * (extents[axis] // local) + (np.arange(extents[axis]) // local).reshape(shape)
        count *= extents[axis] // local
    return np.zeros((count, size), npdt), group


def _scalar_bound(x: Any, kernel: str) -> int:
    if np.ndim(x) != 0:
        raise ValueError(f"kernel {kernel}: a RANGE bound differs between grid points; the PYTHON device "
                         "needs bounds that are the same for every global index")
    return int(x)


def _typed_view(buf: Any, dt: DType, size: int | None, kernel: str, idx: int) -> np.ndarray:
    """A 1-D numpy view of ``size`` elements of ``dt`` over an opaque buffer (bfloat16 as uint16 bits)."""
    raw = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if not raw.flags.c_contiguous:
        raise ValueError(f"kernel {kernel}: buffer {idx} is not contiguous")
    raw = raw.reshape(-1).view(np.uint8)
    npdt = np.dtype(to_np_dtype(dt))
    count = raw.size // npdt.itemsize
    if size is None:
        size = count
    if count < size:
        raise ValueError(f"kernel {kernel}: buffer {idx} holds {raw.size} bytes, needs {size} x {dt.name}")
    return raw[: size * npdt.itemsize].view(npdt)


def _check_bounds(idx: Any, size: int, what: str, kernel: str, label: str) -> None:
    if isinstance(idx, np.integer):  # the common scalar case, without numpy reductions
        if 0 <= idx < size:
            return
        lo = hi = idx
    else:
        if idx.size == 0:
            return
        lo, hi = idx.min(), idx.max()
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise IndexError(f"kernel {kernel}: {what} index {int(bad)} is outside {label} of size {size}")


def _load(regs: list[Any], srcs: tuple[int, ...], is_bf16: bool, conv: Callable[[Any], Any] | None,
          kernel: str, label: str) -> Any:
    buf, idx = regs[srcs[0]], regs[srcs[1]]
    if len(srcs) == 2:
        _check_bounds(idx, buf.size, "LOAD", kernel, label)
        v = buf[idx]
    else:
        gate = _as(regs[srcs[2]], _BOOL)
        zero = np.zeros((), buf.dtype)
        if buf.size == 0:
            v = np.broadcast_to(zero, np.broadcast_shapes(np.shape(idx), np.shape(gate)))
        else:
            safe = np.where(gate, idx, np.zeros((), np.asarray(idx).dtype))
            _check_bounds(safe, buf.size, "gated LOAD", kernel, label)
            v = np.where(gate, buf[safe], zero)
    if is_bf16:
        v = _from_bf16_bits(v)
    return v if conv is None else conv(v)


def _store(regs: list[Any], srcs: tuple[int, ...], is_bf16: bool, conv: Callable[[Any], Any] | None,
           kernel: str, label: str) -> None:
    buf, idx, val = regs[srcs[0]], regs[srcs[1]], regs[srcs[2]]
    if conv is not None:  # a store converts like a C assignment
        val = conv(val)
    val = _bf16_bits(val) if is_bf16 else _as(val, buf.dtype)
    if len(srcs) == 3:
        if isinstance(idx, np.generic) and np.ndim(val) == 0:
            _check_bounds(idx, buf.size, "STORE", kernel, label)
            buf[idx] = val
            return
        idx_b, val_b = np.broadcast_arrays(idx, val)
        idx_f, val_f = idx_b.reshape(-1), val_b.reshape(-1)
    else:
        gate = _as(regs[srcs[3]], _BOOL)
        idx_b, val_b, gate_b = np.broadcast_arrays(idx, val, gate)
        idx_f, val_f = idx_b[gate_b], val_b[gate_b]
    _check_bounds(idx_f, buf.size, "STORE", kernel, label)
    buf[idx_f] = val_f


def _reg_lanes(*vals: Any) -> tuple[Any, ...]:
    """A DEFINE_REG: the lanes of its sources (scalars and vectors), in order."""
    return tuple(x for v in vals for x in (v if isinstance(v, tuple) else (v,)))


def _reg_load(reg: tuple[Any, ...], idx: Any, kernel: str) -> Any:
    """Element ``idx`` of a DEFINE_REG (an index the same for every grid point, or one per point)."""
    if np.ndim(idx) == 0:
        _check_bounds(np.int64(idx), len(reg), "LOAD", kernel, "a DEFINE_REG")
        return reg[int(idx)]
    _check_bounds(np.asarray(idx), len(reg), "LOAD", kernel, "a DEFINE_REG")
    *lanes, where = np.broadcast_arrays(*reg, idx)
    return np.take_along_axis(np.stack(lanes), where[None].astype(np.int64), 0)[0]


def _lanes(*vals: Any) -> tuple[Any, ...]:
    """A vector register: its lanes' values, in order."""
    return vals


def _lanewise(fn: Callable[..., Any], *vecs: tuple[Any, ...]) -> tuple[Any, ...]:
    """A vector ALU op: the scalar op ``fn`` on each lane of its vector operands."""
    return tuple(fn(*lanes) for lanes in zip(*vecs))


def _lanes_as(npdt: np.dtype) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """A copy of a vector register with each lane held as ``npdt`` (an accumulator vector's start and update)."""
    return lambda v: tuple(_as(x, npdt) for x in v)


def _aligned_index(idx: Any, n: int, what: str, kernel: str, label: str) -> Any:
    """``idx`` of a vector access of ``n`` lanes, checked to be a multiple of ``n`` (the IR's promise)."""
    if np.any(np.asarray(idx) % n != 0):
        raise ValueError(f"kernel {kernel}: {what} of {n} lanes on {label} at an index that is not a multiple of "
                         f"{n}")
    return idx


def _vload(regs: list[Any], srcs: tuple[int, ...], n: int, is_bf16: bool, conv: Callable[[Any], Any] | None,
           kernel: str, label: str) -> tuple[Any, ...]:
    """A vector LOAD: each lane a LOAD of the next element (gated alike)."""
    idx = _aligned_index(regs[srcs[1]], n, "vector LOAD", kernel, label)
    lane_regs = [regs[srcs[0]], idx, regs[srcs[2]] if len(srcs) > 2 else None]
    out = []
    for k in range(n):
        lane_regs[1] = idx + k
        out.append(_load(lane_regs, (0, 1) if len(srcs) == 2 else (0, 1, 2), is_bf16, conv, kernel, label))
    return tuple(out)


def _vstore(regs: list[Any], srcs: tuple[int, ...], n: int, is_bf16: bool, conv: Callable[[Any], Any] | None,
            kernel: str, label: str) -> None:
    """A vector STORE: each lane a STORE to the next element (gated alike)."""
    idx = _aligned_index(regs[srcs[1]], n, "vector STORE", kernel, label)
    vals = regs[srcs[2]]
    if not isinstance(vals, tuple) or len(vals) != n:
        raise ValueError(f"kernel {kernel}: vector STORE of {n} lanes on {label} got a value that is not one")
    lane_regs = [regs[srcs[0]], idx, None, regs[srcs[3]] if len(srcs) > 3 else None]
    for k in range(n):
        lane_regs[1], lane_regs[2] = idx + k, vals[k]
        _store(lane_regs, (0, 1, 2) if len(srcs) == 3 else (0, 1, 2, 3), is_bf16, conv, kernel, label)


# ---------------------------------------------------------------------------------------------
# the device
# ---------------------------------------------------------------------------------------------


class PythonRenderer(Renderer):
    """Serializes linear programs for :class:`PythonProgram` (no source language: versioned JSON)."""

    device = "PYTHON"
    supports_float16 = True
    has_local = False
    #: local memory, so GROUP opts run here too (the work-groups come from the launch's local_size)
    has_shared = True
    shared_max = 1 << 20
    global_max = None
    local_max = None
    #: every dtype's vectors, so that the reference interprets the vector loads and stores GPU renderers get
    vector_widths = {dt: (2, 4, 8) for dt in DTYPES_ALL}

    def render(self, name: str, uops: list[UOp]) -> str:
        """The program text: :data:`FORMAT`, the kernel name and one ``[op, dtype, srcs, arg]`` per line."""
        return encode_program(name, uops)


class PythonCompiler(Compiler):
    """Nothing to compile: the binary is the program text as UTF-8."""

    def __init__(self) -> None:
        super().__init__(None)

    def compile(self, src: str) -> bytes:
        """``src`` encoded as UTF-8, after checking that it loads; a malformed program raises CompileError."""
        try:
            PythonProgram("check", src.encode())
        except (ValueError, KeyError, TypeError) as e:
            raise CompileError(src, f"{type(e).__name__}: {e}", "PYTHON program is malformed") from e
        return src.encode()


class PythonAllocator(Allocator):
    """Host memory as numpy ``uint8`` arrays; ``as_buffer`` and ``offset`` are zero-copy views."""

    def _alloc(self, size: int, options: Any = None) -> np.ndarray:
        return np.zeros(size, dtype=np.uint8)

    def _free(self, opaque: np.ndarray, size: int, options: Any = None) -> None:
        pass

    def as_buffer(self, opaque: np.ndarray) -> memoryview:
        """A writable memoryview of the whole buffer, sharing its memory."""
        return memoryview(opaque).cast("B")

    def copyin(self, dest: np.ndarray, src: memoryview) -> None:
        """Copy the bytes of host memory ``src`` into the start of buffer ``dest``."""
        data = np.frombuffer(memoryview(src).cast("B"), dtype=np.uint8)
        if data.size > dest.size:
            raise ValueError(f"copyin of {data.size} bytes into a buffer of {dest.size} bytes")
        dest[:data.size] = data

    def copyout(self, dest: memoryview, src: np.ndarray) -> None:
        """Fill the writable host memory ``dest`` from the start of buffer ``src``."""
        out = np.frombuffer(memoryview(dest).cast("B"), dtype=np.uint8)
        if out.size > src.size:
            raise ValueError(f"copyout of {out.size} bytes from a buffer of {src.size} bytes")
        out[:] = src[:out.size]

    def offset(self, opaque: np.ndarray, byte_offset: int, nbytes: int) -> np.ndarray:
        """A view of ``nbytes`` bytes of ``opaque`` starting at ``byte_offset`` (shares memory)."""
        if byte_offset < 0 or byte_offset + nbytes > opaque.size:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) outside a {opaque.size} byte buffer")
        return opaque[byte_offset:byte_offset + nbytes]


class PythonDevice(Compiled):
    """The built-in PYTHON device: complete, slow, and the oracle other devices are tested against."""

    def __init__(self, name: str = "PYTHON"):
        super().__init__(name, PythonAllocator(), PythonRenderer(), PythonCompiler(), PythonProgram, None)
