"""The OpenCL C dialect of the C-family renderer.

A kernel is ``__kernel void NAME(__global T* data0, ..., const long var)``. The global loops of
the linear program become work-item ids (see docs/contracts.md, "Launch grid"): the i-th of n
global RANGEs reads ``get_global_id(n-1-i)``, so launch dimension 0 is the innermost loop.

Storage and compute types:

- ``bool`` buffers hold ``uchar`` (OpenCL forbids ``bool`` in kernel parameters).
- ``bfloat16`` buffers hold ``ushort`` bit patterns; values are computed as ``float``.
- ``float16`` is native ``half`` when the device has ``cl_khr_fp16``. Without it, buffers hold
  ``ushort`` bit patterns converted with the core built-ins ``vload_half``/``vstore_half_rte``, values
  are ``float``, and every float16 result is rounded to half precision, which gives the same
  answers as half arithmetic.
- ``float64`` needs ``cl_khr_fp64``; without it the dtype is left out of ``supported_dtypes``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ember.renderer import BuiltinVectorRenderer, DType, Ops, PtrDType, UOp, VectorSyntax, dtypes, round_result

_BF16_HELPERS = """float ember_bf16_to_f32(ushort b) { return as_float(((uint)b) << 16); }
ushort ember_f32_to_bf16(float f) { uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
float ember_bf16_round(float f) { return ember_bf16_to_f32(ember_f32_to_bf16(f)); }"""

_F16_HELPERS = """float ember_f16_to_f32(ushort b) { return vload_half(0, (const __private half*)&b); }
ushort ember_f32_to_f16(float f) { ushort b; vstore_half_rte(f, 0, (__private half*)&b); return b; }
float ember_f16_round(float f) { return ember_f16_to_f32(ember_f32_to_f16(f)); }"""

_F64_TO_F16_HELPER = """ushort ember_f64_to_f16(double d) { ushort b; vstore_half_rte(d, 0, (__private half*)&b);
  return b; }"""


# float64 and wide integers to bfloat16 with one rounding (see ember.renderer's C preamble)
_BF16_FROM_F64_HELPER = """float ember_bf16_from_f64(double d) { float f = (float)d; uint u = as_uint(f);
  if (f == f && (double)f != d) { if (fabs((double)f) > fabs(d)) u -= 1u; u |= 1u; }
  return ember_bf16_round(as_float(u)); }"""
_BF16_FROM_U64_HELPER = """float ember_bf16_from_u64(ulong m, int neg) { int s = (m >> 24) ? 40 - (int)clz(m) : 0;
  ulong q = (m >> s) | (ulong)((m & ((((ulong)1) << s) - (ulong)1)) != (ulong)0);
  float f = ldexp((float)q, s); return ember_bf16_round(neg ? -f : f); }"""

def _guarded(macro: str, code: str) -> str:
    """``code`` under an include guard: kernels built together as one program define each helper once."""
    return f"#ifndef {macro}\n#define {macro}\n{code}\n#endif"


_BASE_TYPES: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
    dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
    dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.bfloat16: "float", dtypes.float32: "float",
    dtypes.float64: "double"}




class CLRenderer(BuiltinVectorRenderer):
    """OpenCL C for one device's capabilities.

    Args:
        fp16: the device has ``cl_khr_fp16`` (native ``half`` arithmetic).
        fp64: the device has ``cl_khr_fp64``.
        global_max: the largest launch size per dimension (3 dimensions).
        local_max: the largest work-group size per dimension (``CL_DEVICE_MAX_WORK_ITEM_SIZES``).
        shared_max: bytes of local memory per work-group (``CL_DEVICE_LOCAL_MEM_SIZE``).
        device: the ember device name the kernels are for.

    The defaults describe the least capable device (no fp16, no fp64, OpenCL's minimum limits);
    :class:`~ember_opencl.device.CLDevice` passes what its device reports.
    """

    kernel_prefix = "__kernel "
    buffer_prefix = "__global "
    restrict = "restrict"
    has_local = True
    has_shared = True
    local_prefix = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    vector_syntax = VectorSyntax(load="vload{n}(0, {buf} + {idx})", store="vstore{n}({value}, 0, {buf} + {idx});")
    parallel_threads = 1
    math_fns = {Ops.SQRT: "sqrt", Ops.EXP: "exp", Ops.LOG: "log", Ops.EXP2: "exp2", Ops.LOG2: "log2",
                Ops.SIN: "sin", Ops.TRUNC: "trunc", Ops.POW: "pow"}

    def __init__(self, fp16: bool = False, fp64: bool = False, global_max: Sequence[int] = (2 ** 32 - 1,) * 3,
                 local_max: Sequence[int] = (1, 1, 1), shared_max: int = 32768, device: str = "CL"):
        self.device = device
        self.fp16, self.fp64 = fp16, fp64
        self.global_max: tuple[int, ...] = tuple(global_max)
        self.local_max = tuple(local_max)
        self.shared_max = shared_max
        self.supports_float16 = True  # natively, or as storage with float arithmetic
        self.supported_dtypes = frozenset(dt for dt in dtypes.fields().values() if fp64 or dt != dtypes.float64)
        self.type_map = dict(_BASE_TYPES)
        if not fp16:
            self.type_map[dtypes.float16] = "float"
        # vloadN/vstoreN of the types a buffer holds as they are computed (not bool, bfloat16 or emulated half),
        # up to 16 bytes (the widest load of most devices); they need only the element's alignment
        self.vector_widths = {dt: tuple(n for n in (2, 4, 8) if n * dt.itemsize <= 16)
                              for dt in self.supported_dtypes
                              if dt.kind != "b" and dt != dtypes.bfloat16 and not self._emulated_half(dt)}

    # --- types --------------------------------------------------------------------------------
    def storage_type(self, dt: DType) -> str:
        """The element type of a buffer of ``dt``."""
        if dt == dtypes.bool:
            return "uchar"
        if dt == dtypes.bfloat16 or (dt == dtypes.float16 and not self.fp16):
            return "ushort"
        return self.render_dtype(dt)

    def _emulated_half(self, dt: DType | PtrDType | None) -> bool:
        return dt == dtypes.float16 and not self.fp16

    # --- kernel -------------------------------------------------------------------------------
    def render_program(self, name: str, uops: list[UOp]) -> str:
        """Render ``uops`` as the OpenCL C source of a kernel called ``name``."""
        global_ranges = [u for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"]
        if len(global_ranges) > len(self.global_max):
            raise ValueError(f"kernel {name} has {len(global_ranges)} global loops; OpenCL launches at most "
                             f"{len(self.global_max)} dimensions")
        n = len(global_ranges)
        self._dims = {r: n - 1 - i for i, r in enumerate(global_ranges)}
        return super().render_program(name, uops)

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        """The ``__kernel`` function: buffers first, then each int variable as a ``long``.

        Kernel arguments are positional: parameter i is always buffer i, in index order, and a buffer the
        program never touches (no DEFINE_GLOBAL) still gets a parameter when a later buffer has one.
        """
        buffers: dict[int, DType] = {u.arg[0]: u.dtype.base for u in uops
                                     if u.op is Ops.DEFINE_GLOBAL and isinstance(u.dtype, PtrDType)}
        args: list[str] = []
        for i in range(max(buffers, default=-1) + 1):
            if i in buffers:
                args.append(f"{self.buffer_prefix}{self.storage_type(buffers[i])}* {self.restrict} data{i}")
            else:
                args.append(f"{self.buffer_prefix}uchar* unused{i}")
        head: list[str] = []
        for pname, dt in params:
            if not isinstance(dt, PtrDType):
                args.append(f"const long {pname}_arg")
                head.append(f"  const {self.render_dtype(dt)} {pname} = ({self.render_dtype(dt)}){pname}_arg;")
        code = "\n".join([f"{self.kernel_prefix}void {name}({', '.join(args)}) {{", *head, *body, "}", ""])
        return self._preamble(code) + code

    def _preamble(self, code: str) -> str:
        """Extension pragmas and helper functions, only those the kernel uses."""
        parts: list[str] = []
        if self.fp64 and "double" in code:
            parts.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        if self.fp16 and "half" in code:
            parts.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
        if "ember_bf16_" in code or "ember_f32_to_bf16" in code:
            parts.append(_guarded("EMBER_BF16_HELPERS", _BF16_HELPERS))
        if "ember_bf16_from_f64" in code:
            parts.append(_guarded("EMBER_BF16_FROM_F64_HELPER", _BF16_FROM_F64_HELPER))
        if "ember_bf16_from_u64" in code:
            parts.append(_guarded("EMBER_BF16_FROM_U64_HELPER", _BF16_FROM_U64_HELPER))
        if "ember_f16_" in code or "ember_f32_to_f16" in code or "ember_f64_to_f16" in code:
            parts.append(_guarded("EMBER_F16_HELPERS", _F16_HELPERS))
        if "ember_f64_to_f16" in code:
            parts.append(_guarded("EMBER_F64_TO_F16_HELPER", _F64_TO_F16_HELPER))
        return "\n".join(parts) + "\n" if parts else ""

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        """A global RANGE is this work-item's id in its launch dimension; other RANGEs are loops."""
        if u.arg[1] == "global":
            t = self.render_dtype(u.value_dtype)
            return [f"const {t} {var} = ({t})get_global_id({self._dims[u]});"]
        return super().render_range_open(u, var, start, end, parallel)

    def render_range_close(self, u: UOp) -> list[str]:
        """Nothing closes a global RANGE: the whole kernel body is one work item."""
        return [] if u.arg[1] == "global" else ["}"]

    # --- loads and stores ---------------------------------------------------------------------
    def render_load_value(self, buf: str, idx: str, dt: DType) -> str:
        if self._emulated_half(dt):
            return f"ember_f16_to_f32({buf}[{idx}])"
        return super().render_load_value(buf, idx, dt)

    def render_store_value(self, value: str, dt: DType) -> str:
        if self._emulated_half(dt):
            return f"ember_f32_to_f16({value})"
        return super().render_store_value(value, dt)

    # --- literals and ops ---------------------------------------------------------------------
    def render_const(self, value: object, dt: DType) -> str:
        if dt.kind in "iu":
            iv = int(value)  # type: ignore[call-overload]
            t = self.render_dtype(dt)
            if dt.kind == "i" and iv == -(2 ** (dt.bitsize - 1)):
                return f"(({t})({iv + 1}{'L' if dt.itemsize == 8 else ''} - 1))"
            suffix = {8: "UL" if dt.kind == "u" else "L", 4: "u" if dt.kind == "u" else ""}.get(dt.itemsize, "")
            return f"(({t}){iv})" if dt.itemsize < 4 else f"{iv}{suffix}"
        lit = super().render_const(value, dt)
        if dt == dtypes.float64 and lit in ("NAN", "INFINITY", "(-INFINITY)"):
            return f"((double){lit})"  # the macros are float: make the literal a double
        return lit

    def math_fn(self, op: Ops, dt: DType) -> Callable[..., str]:
        """OpenCL's math built-ins are overloaded for half, float and double: one name for all."""
        fn = self.math_fns[op]
        return lambda *a: f"{fn}({', '.join(a)})"

    def render_alu(self, u: UOp, a: list[str]) -> str:
        op, dt = u.op, u.dtype
        assert isinstance(dt, DType)
        if op in (Ops.IDIV, Ops.MOD, Ops.FDIV) and dt.kind in "iu":
            expr = self._render_int_division(u, a)
        elif op is Ops.IDIV and dt.kind == "f":
            # half arithmetic rounds the quotient before truncating; bfloat16 rounds once, after (as float32 would)
            quotient = f"({a[0]} / {a[1]})"
            rounded = round_result(dt, quotient, self._held_in_float()) if self._emulated_half(dt) else quotient
            expr = f"trunc({rounded})"
        elif op is Ops.MOD and dt.kind == "f":
            expr = f"fmod({a[0]}, {a[1]})"
        elif op in (Ops.SHL, Ops.SHR):
            expr = self._render_shift(u, a)
        else:
            expr = super().render_alu(u, a)
        return round_result(dt, expr, self._held_in_float(), op)

    def _held_in_float(self) -> tuple[DType, ...]:
        """The 16-bit floats computed in float (float16 only without the ``cl_khr_fp16`` extension)."""
        return (dtypes.bfloat16,) if self.fp16 else (dtypes.float16, dtypes.bfloat16)

    def _render_shift(self, u: UOp, a: list[str]) -> str:
        """Shifts in the operand's width; an amount outside [0, width) gives 0 (-1 for SHR of a negative value).

        OpenCL itself masks the amount (``x << (n % width)``), so the range is checked first.
        """
        dt = u.dtype
        assert isinstance(dt, DType)
        x, n = a
        amount = u.src[1]
        sym = "<<" if u.op is Ops.SHL else ">>"
        shifted = f"(({self.render_dtype(dt)})({x} {sym} {n}))"
        if amount.op is Ops.CONST and 0 <= amount.arg < dt.bitsize:
            return shifted
        amount_dt = amount.dtype
        assert isinstance(amount_dt, DType)
        in_range = f"{n} < {dt.bitsize}" if amount_dt.kind == "u" else f"({n} >= 0 && {n} < {dt.bitsize})"
        outside = f"({x} < 0 ? -1 : 0)" if u.op is Ops.SHR and dt.kind == "i" else "0"
        return f"(({in_range}) ? {shifted} : {outside})"

    def _render_int_division(self, u: UOp, a: list[str]) -> str:
        """C division and remainder, except x/0 == x%0 == 0 and (signed) x/-1 == -x, x%-1 == 0 without a trap.

        FDIV of integers is integer division.
        """
        dt = u.dtype
        assert isinstance(dt, DType)
        sym = "%" if u.op is Ops.MOD else "/"
        divisor = u.src[1]
        if divisor.op is Ops.CONST and divisor.arg != 0 and (dt.kind == "u" or divisor.arg != -1):
            return f"({a[0]} {sym} {a[1]})"
        if dt.kind == "u":  # an unsigned divisor is never -1
            return f"(({a[1]} == 0) ? 0 : ({a[0]} {sym} {a[1]}))"
        minus_one = f"{'-(' + a[0] + ')' if sym == '/' else '0'}"
        return f"(({a[1]} == 0 || {a[1]} == -1) ? ({a[1]} == 0 ? 0 : {minus_one}) : ({a[0]} {sym} {a[1]}))"

    def render_cast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if self._emulated_half(dt) and sdt.kind != "b":
            if sdt == dtypes.float64:
                return f"ember_f16_to_f32(ember_f64_to_f16({x}))"
            return f"ember_f16_round((float){x})"
        if sdt.kind == "f" and dt.kind in "iu":
            return self._render_float_to_int(x, sdt, dt)
        return super().render_cast(u, x)

    def _render_float_to_int(self, x: str, sdt: DType, dt: DType) -> str:
        """C's truncating conversion where the result fits, else 0 (nan included), compared in the source type.

        A bound is ``x > lo - 1`` where the source type holds ``lo - 1`` exactly, else ``x >= lo``: then no
        value of the source type lies between the two, so both tests agree. A float source needs no double.
        """
        t = self.render_dtype(dt)
        signed = dt.kind == "i"
        lo = -(2 ** (dt.bitsize - 1)) if signed else 0
        hi = 2 ** (dt.bitsize - 1) if signed else 2 ** dt.bitsize
        if sdt == dtypes.float64:
            # doubles hold lo - 1 exactly for every integer width up to 32 bits; above that lo itself
            # is the nearest double, and anything in (lo - 1, lo) truncates to lo anyway
            low = f"{x} > {float(lo - 1)!r}" if not signed or dt.bitsize <= 32 else f"{x} >= {float(lo)!r}"
            return f"(({low} && {x} < {float(hi)!r}) ? (({t}){x}) : 0)"
        low = f"{x} > {float(lo - 1)!r}f" if not signed or dt.bitsize <= 16 else f"{x} >= {float(lo)!r}f"
        return f"(({low} && {x} < {float(hi)!r}f) ? (({t}){x}) : 0)"

    def render_bitcast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if sdt == dtypes.bfloat16:
            bits = f"ember_f32_to_bf16({x})"
        elif self._emulated_half(sdt):
            bits = f"ember_f32_to_f16({x})"
        elif sdt == dtypes.bool:
            bits = f"((uchar){x})"
        else:
            bits = x
        if dt == dtypes.bfloat16:
            return f"ember_bf16_to_f32(as_ushort({bits}))"
        if self._emulated_half(dt):
            return f"ember_f16_to_f32(as_ushort({bits}))"
        if dt == dtypes.bool:
            return f"(as_uchar({bits}) != 0)"
        return f"as_{self.render_dtype(dt)}({bits})"
