"""Data types and PyTorch's type-promotion rules.

A :class:`DType` is a small immutable value. ``dtypes`` is the namespace users see
(``dtypes.float32``, ``dtypes.default_float`` ...). Promotion follows torch: categories
bool < integer < floating; within a category the wider type wins; mixing signed and
unsigned integers widens to a signed type that holds both; Python scalars are "weak" and
only move a result to a higher category.
"""
from __future__ import annotations

import builtins
import math
import struct
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ember.helpers import is_int_like, loaded_numpy

if TYPE_CHECKING:
    import numpy as np
else:
    from ember.helpers import lazy_numpy as np


@dataclass(frozen=True, eq=True)
class DType:
    """An element type. ``kind`` is one of ``b`` (bool), ``i``, ``u``, ``f``.

    A scalar type has ``count`` 1. ``dt.vec(n)`` is the type of ``n`` lanes of the scalar ``dt`` held together
    (a register of a vector load, store or VECTORIZE): its ``name`` is the scalar's with ``n`` appended
    (``float4``), ``itemsize`` covers all lanes, and ``scalar()`` gives the lane type back. ``kind``, ``fmt``
    and the value range (``min``/``max``) are those of one lane.
    """

    name: str
    itemsize: int
    kind: str
    fmt: str | None  # struct / memoryview format character; None where Python has none (bfloat16)
    count: int = 1

    # every UOp is interned by a key holding its dtype, and rewrite rules are looked up by it: hash once, and
    # compare the common case (the same object) without building tuples
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.itemsize, self.kind, self.fmt, self.count)))
        # the range of values a node of this dtype may hold before anything is known about it (symbolic bounds)
        object.__setattr__(self, "_lo_hi", _value_range(self.kind, self.itemsize // self.count))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, DType)
        return self.name == other.name and self.itemsize == other.itemsize and self.kind == other.kind and \
            self.fmt == other.fmt and self.count == other.count

    def __reduce__(self) -> tuple:
        # rebuilt through __init__: the cached hash of strings differs between processes
        if self.count != 1:
            return DType, (self.name, self.itemsize, self.kind, self.fmt, self.count)
        return DType, (self.name, self.itemsize, self.kind, self.fmt)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a pickle written before __reduce__ existed restores the fields only: hash them here
        state = {k: v for k, v in state.items() if k not in ("_hash", "_lo_hi")}
        state.setdefault("count", 1)
        self.__dict__.update(state)
        self.__post_init__()

    def __repr__(self) -> str:
        if self.count != 1:
            return f"dtypes.{self.scalar().name}.vec({self.count})"
        return f"dtypes.{self.name}"

    def __lt__(self, other: DType) -> bool:
        return (self.kind, self.itemsize, self.name) < (other.kind, other.itemsize, other.name)

    def vec(self, n: int) -> DType:
        """The vector of ``n`` lanes of this scalar type (``n == 1``: the type itself).

        Raises ``ValueError`` for a vector of vectors or a count below 1."""
        if self.count != 1:
            raise ValueError(f"vec({n}) of {self!r}: only a scalar dtype has vectors")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"vec() needs a lane count of at least 1, got {n!r}")
        if n == 1:
            return self
        return DType(f"{self.name}{n}", self.itemsize * n, self.kind, self.fmt, n)

    def scalar(self) -> DType:
        """The type of one lane (a scalar type is its own)."""
        if self.count == 1:
            return self
        return DType(self.name[:-len(str(self.count))], self.itemsize // self.count, self.kind, self.fmt)

    @property
    def bitsize(self) -> int:
        return self.itemsize * 8

    def ptr(self) -> PtrDType:
        """The pointer type to a buffer of this dtype (used by kernel parameters)."""
        return PtrDType(self)

    @property
    def min(self) -> Any:
        """Smallest value of this dtype (``-inf`` for floats, ``False`` for bool), as ``dtypes.min``."""
        return dtypes.min(self)

    @property
    def max(self) -> Any:
        """Largest value of this dtype (``inf`` for floats, ``True`` for bool), as ``dtypes.max``."""
        return dtypes.max(self)


def _value_range(kind: str, itemsize: int) -> tuple[Any, Any]:
    """The smallest and largest value of a dtype (``dtypes.min``/``max``): (False, True) for bool, the integer
    range for ints, (-inf, inf) for floats."""
    bits = itemsize * 8
    if kind == "b":
        return False, True
    if kind in "iu":
        return (0, 2 ** bits - 1) if kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return -math.inf, math.inf


@dataclass(frozen=True, eq=True)
class PtrDType:
    """A pointer to global memory holding elements of ``base``."""

    base: DType

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.base,)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, PtrDType)
        return self.base == other.base

    def __reduce__(self) -> tuple:
        return PtrDType, (self.base,)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k != "_hash"})
        self.__post_init__()

    @property
    def name(self) -> str:
        return f"{self.base.name}*"

    @property
    def itemsize(self) -> int:
        return 8

    def __repr__(self) -> str:
        return f"{self.base!r}.ptr()"


class dtypes:
    """The dtype namespace, named as in tinygrad and torch."""

    bool: Final[DType] = DType("bool", 1, "b", "?")
    int8: Final[DType] = DType("char", 1, "i", "b")
    uint8: Final[DType] = DType("uchar", 1, "u", "B")
    int16: Final[DType] = DType("short", 2, "i", "h")
    uint16: Final[DType] = DType("ushort", 2, "u", "H")
    int32: Final[DType] = DType("int", 4, "i", "i")
    uint32: Final[DType] = DType("uint", 4, "u", "I")
    int64: Final[DType] = DType("long", 8, "i", "q")
    uint64: Final[DType] = DType("ulong", 8, "u", "Q")
    float16: Final[DType] = DType("half", 2, "f", "e")
    bfloat16: Final[DType] = DType("bfloat16", 2, "f", None)
    float32: Final[DType] = DType("float", 4, "f", "f")
    float64: Final[DType] = DType("double", 8, "f", "d")

    # aliases
    char, uchar, short, ushort = int8, uint8, int16, uint16
    int, uint, long, ulong = int32, uint32, int64, uint64
    half, float, double = float16, float32, float64

    # tinygrad's defaults: Python floats become float32 and Python ints int32 (torch would use int64)
    default_float: DType = float32
    default_int: DType = int32

    @staticmethod
    def is_float(dt: DType) -> builtins.bool:  # builtins: the class attribute ``bool`` shadows the type
        """True for floating point dtypes."""
        return dt.kind == "f"

    @staticmethod
    def is_int(dt: DType) -> builtins.bool:
        """True for signed and unsigned integer dtypes (not bool)."""
        return dt.kind in "iu"

    @staticmethod
    def is_unsigned(dt: DType) -> builtins.bool:
        """True for unsigned integer dtypes."""
        return dt.kind == "u"

    @staticmethod
    def is_bool(dt: DType) -> builtins.bool:
        return dt.kind == "b"

    @staticmethod
    def from_py(x: Any) -> DType:
        """The dtype torch gives a Python value (nested lists use their widest element)."""
        if isinstance(x, (list, tuple)):
            if not x:
                return dtypes.default_float
            out = dtypes.from_py(x[0])
            for v in x[1:]:
                out = promote_types(out, dtypes.from_py(v))
            return out
        np = loaded_numpy()
        if np is not None and isinstance(x, np.generic) and not isinstance(x, np.bool_):
            return from_np_dtype(x.dtype)  # numpy scalars keep their own dtype, as in torch
        if isinstance(x, bool) or (np is not None and isinstance(x, np.bool_)):
            return dtypes.bool
        if is_int_like(x):
            # an int too large for the default int type gets int64 rather than wrapping silently
            lo, hi = dtypes.min(dtypes.default_int), dtypes.max(dtypes.default_int)
            return dtypes.default_int if lo <= int(x) <= hi else dtypes.int64
        return dtypes.default_float

    @staticmethod
    def min(dt: DType) -> Any:
        """Smallest value representable (``-inf`` for floats)."""
        return dt._lo_hi[0]  # type: ignore[attr-defined]

    @staticmethod
    def max(dt: DType) -> Any:
        """Largest value representable (``inf`` for floats)."""
        return dt._lo_hi[1]  # type: ignore[attr-defined]

    @staticmethod
    def fields() -> dict[str, DType]:
        """Every dtype by its canonical torch-style name."""
        return dict(_BY_NAME)


_BY_NAME: dict[str, DType] = {
    n: getattr(dtypes, n) for n in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                                    "uint64", "float16", "bfloat16", "float32", "float64")}
DTYPES_ALL: tuple[DType, ...] = tuple(_BY_NAME.values())
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}

# numpy's scalar type of each dtype, by name (numpy is imported when one is first asked for)
_NP_NAMES = {dtypes.bool: "bool_", dtypes.int8: "int8", dtypes.uint8: "uint8", dtypes.int16: "int16",
             dtypes.uint16: "uint16", dtypes.int32: "int32", dtypes.uint32: "uint32", dtypes.int64: "int64",
             dtypes.uint64: "uint64", dtypes.float16: "float16", dtypes.float32: "float32", dtypes.float64: "float64"}


def to_np_dtype(dt: DType) -> type:
    """The numpy scalar type for ``dt`` (bfloat16 has none: it is stored as uint16 bits)."""
    if dt == dtypes.bfloat16:
        return np.uint16
    return getattr(np, _NP_NAMES[dt])


def from_np_dtype(npdt: Any) -> DType:
    """The ember dtype for a numpy dtype; raises ``TypeError`` naming unsupported ones."""
    npdt = np.dtype(npdt)
    for k, name in _NP_NAMES.items():
        if np.dtype(getattr(np, name)) == npdt:
            return k
    raise TypeError(f"can't convert numpy dtype {npdt} to an ember dtype")


class UnknownDTypeName(TypeError, AttributeError):
    """A dtype given by a name no dtype has: the TypeError torch raises and the AttributeError tinygrad raises
    (it looks the name up on ``dtypes``), so code written for either catches it."""


def to_dtype(x: DType | str | Any) -> DType:
    """Accept a DType, a name ("float32", "half"), or a numpy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x in _BY_NAME:
            return _BY_NAME[x]
        if hasattr(dtypes, x) and isinstance(getattr(dtypes, x), DType):
            return getattr(dtypes, x)
        raise UnknownDTypeName(f"unknown dtype name {x!r}; known: {', '.join(_BY_NAME)}")
    return from_np_dtype(x)


def _promote_int(a: DType, b: DType) -> DType:
    if a.kind == b.kind:
        return a if a.itemsize >= b.itemsize else b
    s, u = (a, b) if a.kind == "i" else (b, a)
    if s.itemsize > u.itemsize:
        return s
    # a signed type wide enough for the unsigned one, capped at int64 (torch does the same)
    return {1: dtypes.int16, 2: dtypes.int32, 4: dtypes.int64}.get(u.itemsize, dtypes.int64)


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types for two tensor dtypes."""
    if a == b:
        return a
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca != cb:
        return a if ca > cb else b
    if a.kind == "b":
        return a
    if a.kind == "f":
        if {a, b} == {dtypes.float16, dtypes.bfloat16}:
            return dtypes.float32
        return a if a.itemsize >= b.itemsize else b
    return _promote_int(a, b)


def least_upper_dtype(*ds: DType) -> DType:
    """Promote several tensor dtypes pairwise."""
    out = ds[0]
    for d in ds[1:]:
        out = promote_types(out, d)
    return out


def result_type_scalar(tensor_dt: DType, scalar: Any) -> DType:
    """Dtype of ``tensor op python_scalar``: the scalar only lifts the category."""
    sdt = dtypes.from_py(scalar)
    if _CATEGORY[sdt.kind] > _CATEGORY[tensor_dt.kind]:
        return dtypes.default_float if sdt.kind == "f" else (dtypes.default_int if sdt.kind in "iu" else sdt)
    return tensor_dt


def truncate(dt: DType, x: Any) -> Any:
    """Convert a Python value to what storing it in ``dt`` gives (wraps ints, rounds floats)."""
    if dt.count != 1:  # a vector constant holds the value in every lane
        dt = dt.scalar()
    kind = dt.kind
    if kind == "b":
        return bool(x)
    if kind in "iu":
        if type(x) is int:  # the common case (index constants): an int in range stays as it is
            bits = dt.itemsize * 8
            if (0 <= x < (1 << bits)) if kind == "u" else (-(1 << (bits - 1)) <= x < (1 << (bits - 1))):
                return x
        if isinstance(x, float):
            # float -> int conversion: truncate; values that do not fit give 0 (as every ember device does)
            if not math.isfinite(x):
                return 0
            t = math.trunc(x)
            return t if dtypes.min(dt) <= t <= dtypes.max(dt) else 0
        v = int(x) & ((1 << dt.bitsize) - 1)
        if dt.kind == "i" and v >= 1 << (dt.bitsize - 1):
            v -= 1 << dt.bitsize
        return v
    x = float(x)
    if dt == dtypes.float64:
        return x
    if dt == dtypes.float32:
        # C's (float) rounding, as numpy's cast does; a value past float32's range overflows to inf below
        try:
            return _F32.unpack(_F32.pack(x))[0]
        except OverflowError:
            pass
    if dt == dtypes.float16:
        try:  # struct's half-precision packing rounds to nearest even, as numpy's cast does
            return _F16.unpack(_F16.pack(x))[0]
        except OverflowError:  # past float16's range after rounding: inf, as numpy's cast gives
            return math.copysign(math.inf, x)
    if dt == dtypes.bfloat16:
        return float(bf16_to_f32(f32_to_bf16(np.array([x], np.float32)))[0])
    with np.errstate(all="ignore"):
        return float(np.array([x]).astype(to_np_dtype(dt))[0])


_F32 = struct.Struct("f")
_F16 = struct.Struct("e")
#: each dtype's element code for ``struct`` (and ``array``, which shares the letters it has); bfloat16 has none
#: (it is the top half of a float32)
STRUCT_CODES: dict[DType, str] = {
    dtypes.bool: "?", dtypes.int8: "b", dtypes.uint8: "B", dtypes.int16: "h", dtypes.uint16: "H", dtypes.int32: "i",
    dtypes.uint32: "I", dtypes.int64: "q", dtypes.uint64: "Q", dtypes.float16: "e", dtypes.float32: "f",
    dtypes.float64: "d"}
# each element as a struct in native byte order, as buffers hold them
_STRUCTS = {dt: struct.Struct("=" + code) for dt, code in STRUCT_CODES.items()}
_BF16_HIGH = slice(2, 4) if sys.byteorder == "little" else slice(0, 2)


def scalar_bytes(dt: DType, x: Any) -> bytes:
    """One element of ``dt`` holding ``x`` (a value :func:`truncate` gave for ``dt``), as a buffer stores it."""
    if dt == dtypes.bfloat16:
        return _STRUCTS[dtypes.float32].pack(x)[_BF16_HIGH]
    return _STRUCTS[dt].pack(x)


def scalar_from_bytes(dt: DType, raw: Any) -> Any:
    """The Python value of the first element of ``dt`` in ``raw`` (bytes or a buffer; bfloat16 as a float)."""
    if dt == dtypes.bfloat16:
        word = bytearray(4)
        word[_BF16_HIGH] = bytes(raw[:2])
        return _STRUCTS[dtypes.float32].unpack(word)[0]
    return _STRUCTS[dt].unpack_from(raw)[0]


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 bit patterns (round to nearest even), kept as uint16."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = np.isnan(x)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    # a nan keeps its sign and top payload bits, forced quiet when the low bits would be lost
    nan_bits = np.where((bits & 0xFFFF) != 0, (bits >> 16) | 0x40, bits >> 16).astype(np.uint16)
    return np.where(nan, nan_bits, rounded)


def bf16_to_f32(x: np.ndarray) -> np.ndarray:
    """Expand bfloat16 bit patterns (uint16) to float32."""
    return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
