"""The Metal Shading Language (MSL) dialect of the C-family renderer.

A kernel is ``kernel void NAME(device T* data0 [[buffer(0)]], ..., uint3 gid [[thread_position_in_grid]])``.
Address spaces: buffers a kernel only reads are ``const device``, the others ``device``; the launch's int
variables arrive together as one ``constant long*`` array at buffer index :data:`VALS_INDEX`; local memory
is ``threadgroup``. The global loops of the linear program become thread positions (docs/contracts.md,
"Launch grid"): the i-th of n global RANGEs reads component ``n-1-i`` of ``thread_position_in_grid``, so
launch dimension 0 (``x``) is the innermost loop. The runtime dispatches exactly ``global_size`` threads
(``dispatchThreads``), so no thread needs a bounds check.

Storage and compute types (Metal has no 64-bit float: float64 is not a supported dtype):

- ``bool`` buffers hold ``uchar``; values are ``bool``.
- ``float16`` is native ``half``. Transcendental functions compute in float (``precise::``) and round.
- ``bfloat16`` buffers hold ``ushort`` bit patterns; values are ``float`` rounded to bfloat16 after every
  op (round to nearest even, written out with ``as_type`` so it does not depend on the Metal version).
- Float math uses the ``metal::precise`` functions, so results do not depend on the library's math mode.

Tensor cores: Apple GPUs multiply 8x8 tiles per SIMD group (``simdgroup_matrix``). :func:`tensor_cores`
declares them for the kernel optimizer and :func:`wmma_helper` renders the function a kernel calls for
one tile. It uses only the documented ``simdgroup_load`` / ``simdgroup_multiply_accumulate`` /
``simdgroup_store``, staging each thread's elements through threadgroup memory; thread ``t`` of the SIMD
group holds row ``t / 4``, columns ``2 * (t % 4)`` and ``2 * (t % 4) + 1`` of A, B and C.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.renderer import (
    BuiltinVectorRenderer,
    DType,
    Ops,
    PtrDType,
    TensorCore,
    UOp,
    VectorSyntax,
    dtypes,
    round_result,
)

#: the buffer index of the launch's int variables (``constant long*``); Metal binds at most 31 buffers
#: (indices 0-30), so a kernel has at most 30 tensor buffers
VALS_INDEX = 30

#: the element types MSL has packed vectors of (``packed_float4``)
_PACKED = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.float16,
           dtypes.float32)

_BASE_TYPES: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
    dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
    dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.bfloat16: "float", dtypes.float32: "float"}

_BF16_HELPERS = """inline float ember_bf16_to_f32(ushort b) { return as_type<float>(((uint)b) << 16); }
inline ushort ember_f32_to_bf16(float f) { uint u = as_type<uint>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
inline float ember_bf16_round(float f) { return ember_bf16_to_f32(ember_f32_to_bf16(f)); }"""

#: an integer of up to 64 bits to bfloat16 with one rounding: the bits below float's 24 fold into a sticky
#: bit, so the float is exact and only the bfloat16 rounding rounds (used by the shared C-family casts)
_BF16_FROM_U64 = """inline float ember_bf16_from_u64(ulong m, bool neg) {
  const int s = (m >> 24) ? 40 - (int)clz(m) : 0;
  const ulong q = (m >> s) | (ulong)((m & ((1UL << s) - 1UL)) != 0UL);
  const float f = ldexp((float)q, s);
  return ember_bf16_round(neg ? -f : f); }"""

#: the attribute each kind of hardware index reads (SPECIAL names start with the kind)
_INDEX_ATTRS = {"gid": ("uint3", "thread_position_in_grid"),
                "lid": ("uint3", "thread_position_in_threadgroup"),
                "group": ("uint3", "threadgroup_position_in_grid")}



def _guarded(macro: str, code: str) -> str:
    """``code`` under an include guard: kernels built together as one library define each helper once."""
    return f"#ifndef {macro}\n#define {macro}\n{code}\n#endif"


def tensor_cores(bfloat: bool = False) -> tuple[TensorCore, ...]:
    """The ``simdgroup_matrix`` multiply-accumulates of an Apple GPU (family Apple7 / M1 and later).

    One 8x8x8 tile per SIMD group of 32 threads; each thread holds 2 elements of A, B and C. ``bfloat``
    adds the bfloat16 inputs of MSL 3.1 (macOS 14).
    """
    pairs = [(dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float16)]
    if bfloat:
        pairs.append((dtypes.bfloat16, dtypes.float32))
    return tuple(TensorCore(dims=(8, 8, 8), dtype_in=i, dtype_out=o, threads=32, elements_per_thread=(2, 2, 2),
                            intrinsic="simdgroup_multiply_accumulate",
                            layout=(("row", "lane / 4"), ("col", "2 * (lane % 4) + element")))
                 for i, o in pairs)


def _msl_type(dt: DType) -> str:
    """The MSL name of a tensor-core element type (bfloat16 is MSL 3.1's ``bfloat``)."""
    return "bfloat" if dt == dtypes.bfloat16 else _BASE_TYPES[dt]


def wmma_name(tc: TensorCore) -> str:
    """The name of the helper function :func:`wmma_helper` renders for ``tc``."""
    m, n, k = tc.dims
    return f"ember_wmma_{m}x{n}x{k}_{tc.dtype_in.name}_{tc.dtype_out.name}"


def wmma_helper(tc: TensorCore) -> str:
    """MSL for ``D = A @ B + C`` on one tile: ``NAME(a, b, c, scratch_a, scratch_b, scratch_c, lane)``.

    ``a``, ``b``, ``c`` are this thread's two elements (``T2`` vectors), the scratch pointers are 64
    elements of threadgroup memory owned by this SIMD group, ``lane`` is
    ``[[thread_index_in_simdgroup]]``; returns this thread's two elements of D.
    """
    if tc.dims != (8, 8, 8) or tc.threads != 32:
        raise ValueError(f"{tc.name}: Metal multiplies 8x8x8 tiles per SIMD group of 32 threads")
    ti, to = _msl_type(tc.dtype_in), _msl_type(tc.dtype_out)
    code = f"""inline {to}2 {wmma_name(tc)}({ti}2 a, {ti}2 b, {to}2 c, threadgroup {ti}* sa, threadgroup {ti}* sb,
    threadgroup {to}* sc, ushort lane) {{
  const uint at = (lane / 4) * 8 + 2 * (lane % 4);
  simdgroup_barrier(mem_flags::mem_threadgroup);  // the previous tile's results have been read
  sa[at] = a.x; sa[at + 1] = a.y; sb[at] = b.x; sb[at + 1] = b.y; sc[at] = c.x; sc[at + 1] = c.y;
  simdgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_matrix<{ti}, 8, 8> ma, mb;
  simdgroup_matrix<{to}, 8, 8> mc;
  simdgroup_load(ma, sa, 8);
  simdgroup_load(mb, sb, 8);
  simdgroup_load(mc, sc, 8);
  simdgroup_multiply_accumulate(mc, ma, mb, mc);
  simdgroup_store(mc, sc, 8);
  simdgroup_barrier(mem_flags::mem_threadgroup);
  return {to}2(sc[at], sc[at + 1]);
}}"""
    return _guarded(f"EMBER_{wmma_name(tc).upper()}", code)


class MetalRenderer(BuiltinVectorRenderer):
    """MSL for an Apple GPU.

    Args:
        local_max: the largest threadgroup size per dimension (``maxThreadsPerThreadgroup``).
        shared_max: bytes of threadgroup memory (``maxThreadgroupMemoryLength``).
        simdgroup_matrix: the GPU has ``simdgroup_matrix`` (MTLGPUFamilyApple7 / Mac2): declare tensor cores.
        bfloat_tensor_cores: declare bfloat16 ``simdgroup_matrix`` tiles too (MSL 3.1, macOS 14).
        device: the ember device name the kernels are for.

    The defaults describe every Apple-silicon GPU (1024 threads per threadgroup, 32 KiB of
    threadgroup memory), so the renderer works without a device (CI renders and checks with it).
    """

    kernel_prefix = "kernel "
    buffer_prefix = "device "
    restrict = ""
    has_local = True
    has_shared = True
    local_prefix = "threadgroup "
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    # through packed_ types: aligned like one element, as a view may start anywhere
    vector_syntax = VectorSyntax(load="{t}(*((device const packed_{t}*)({buf} + {idx})))",
                                 store="*((device packed_{t}*)({buf} + {idx})) = packed_{t}({value});",
                                 vectorize="{t}({vals})", gep="{vec}.{xyzw}")
    parallel_threads = 1
    math_fns = {Ops.SQRT: "precise::sqrt", Ops.EXP: "precise::exp", Ops.LOG: "precise::log",
                Ops.EXP2: "precise::exp2", Ops.LOG2: "precise::log2", Ops.SIN: "precise::sin", Ops.TRUNC: "trunc",
                Ops.POW: "precise::pow"}

    def __init__(self, local_max: Sequence[int] = (1024, 1024, 1024), shared_max: int = 32768,
                 simdgroup_matrix: bool = True, bfloat_tensor_cores: bool = False, device: str = "METAL"):
        self.device = device
        self.global_max = (2 ** 32 - 1,) * 3  # thread_position_in_grid is a uint3
        self.local_max = tuple(local_max)
        self.shared_max = shared_max
        self.supports_float16 = True
        self.supported_dtypes = frozenset(dt for dt in dtypes.fields().values() if dt != dtypes.float64)
        self.type_map = dict(_BASE_TYPES)
        # the packed vectors (aligned like one element: a view into a buffer may start anywhere) of the types a
        # buffer holds as they are computed, up to 16 bytes
        self.vector_widths = {dt: tuple(n for n in (2, 4) if n * dt.itemsize <= 16) for dt in _PACKED}
        self.tensor_cores = tensor_cores(bfloat_tensor_cores) if simdgroup_matrix else ()
        self.variant = "msl-bf16tc" if bfloat_tensor_cores and simdgroup_matrix else "msl"

    # --- types --------------------------------------------------------------------------------
    def render_dtype(self, dt: DType) -> str:
        if dt.count != 1:
            return self.render_vector_dtype(dt)
        if dt not in self.type_map:
            raise NotImplementedError(f"Metal has no {dt.name} (supported: "
                                      f"{', '.join(sorted(d.name for d in self.supported_dtypes))})")
        return self.type_map[dt]

    def storage_type(self, dt: DType) -> str:
        """The element type of a buffer of ``dt``."""
        if dt == dtypes.bool:
            return "uchar"
        if dt == dtypes.bfloat16:
            return "ushort"
        return self.render_dtype(dt)

    # --- kernel -------------------------------------------------------------------------------
    def render_program(self, name: str, uops: list[UOp]) -> str:
        """Render ``uops`` as the MSL source of a kernel called ``name``."""
        global_ranges = [u for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"]
        if len(global_ranges) > 3:
            raise ValueError(f"kernel {name} has {len(global_ranges)} global loops; Metal launches at most 3 "
                             "dimensions")
        n = len(global_ranges)
        self._dims = {r: n - 1 - i for i, r in enumerate(global_ranges)}
        return super().render_program(name, uops)

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        """The ``kernel`` function: buffer i at ``[[buffer(i)]]``, the int variables at :data:`VALS_INDEX`.

        A buffer the kernel never stores to is ``const device``; a buffer index the program does not use
        needs no parameter (Metal binds by index, not by position).
        """
        buffers: dict[int, UOp] = {u.arg[0]: u for u in uops if u.op is Ops.DEFINE_GLOBAL}
        if buffers and max(buffers) >= VALS_INDEX:
            raise ValueError(f"kernel {name} uses buffer {max(buffers)}; Metal binds at most {VALS_INDEX} "
                             f"buffers (indices 0-{VALS_INDEX - 1}) besides the int variables")
        stored = {u.src[0] for u in uops if u.op is Ops.STORE}
        args: list[str] = []
        for i in sorted(buffers):
            g = buffers[i]
            assert isinstance(g.dtype, PtrDType)
            const = "" if g in stored else "const "
            args.append(f"{const}device {self.storage_type(g.dtype.base)}* data{i} [[buffer({i})]]")
        head: list[str] = []
        variables = [(pname, dt) for pname, dt in params if not isinstance(dt, PtrDType)]
        if variables:
            args.append(f"constant long* ember_vals [[buffer({VALS_INDEX})]]")
            for j, (pname, dt) in enumerate(variables):
                t = self.render_dtype(dt)
                head.append(f"  const {t} {pname} = ({t})ember_vals[{j}];")
        text = "\n".join(body)
        for var, (t, attr) in _INDEX_ATTRS.items():
            if f"{var}." in text:
                args.append(f"{t} {var} [[{attr}]]")
        code = "\n".join([f"kernel void {name}({', '.join(args)}) {{", *head, *body, "}", ""])
        return self._preamble(code) + code

    def _preamble(self, code: str) -> str:
        """The standard library and the helper functions the kernel uses."""
        parts = ["#include <metal_stdlib>", "using namespace metal;"]
        if "ember_bf16_" in code or "ember_f32_to_bf16" in code:
            parts.append(_guarded("EMBER_BF16_HELPERS", _BF16_HELPERS))
        if "ember_bf16_from_u64" in code:
            parts.append(_guarded("EMBER_BF16_FROM_U64", _BF16_FROM_U64))
        parts += [wmma_helper(tc) for tc in self.tensor_cores if f"{wmma_name(tc)}(" in code]
        return "\n".join(parts) + "\n"

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        """A global RANGE is this thread's position in its launch dimension; other RANGEs are loops."""
        if u.arg[1] == "global":
            t = self.render_dtype(u.dtype)  # type: ignore[arg-type]
            return [f"const {t} {var} = ({t})gid.{'xyz'[self._dims[u]]};"]
        return super().render_range_open(u, var, start, end, parallel)

    def render_range_close(self, u: UOp) -> list[str]:
        """Nothing closes a global RANGE: the whole kernel body is one thread."""
        return [] if u.arg[1] == "global" else ["}"]

    # --- hardware ids, threadgroup memory, barriers --------------------------------------------
    def render_extra(self, u: UOp, srcs: list[str], fresh: Callable[[str], str]) -> tuple[str, list[str]]:
        """SPECIAL ids (``lidxN``: position in the threadgroup, ``gidxN``: the threadgroup's position, ``idxN``:
        position in the grid; N is the launch dimension). DEFINE_LOCAL and BARRIER are the shared renderer's,
        spelled by :attr:`local_prefix` and :attr:`barrier`."""
        if u.op is Ops.SPECIAL:
            name, _size = u.arg[0], u.arg[1]
            kind = name.rstrip("0123456789")
            var = {"lidx": "lid", "gidx": "group", "idx": "gid"}.get(kind)
            dim = name[len(kind):]
            if var is None or dim not in ("0", "1", "2"):
                raise ValueError(f"SPECIAL {name}: expected lidx0-2, gidx0-2 or idx0-2")
            t = self.render_dtype(u.dtype)  # type: ignore[arg-type]
            return name, [f"const {t} {name} = ({t}){var}.{'xyz'[int(dim)]};"]
        return super().render_extra(u, srcs, fresh)

    # --- tensor cores ------------------------------------------------------------------------
    def tensor_core_layout(self, tc: TensorCore, operand: str, lane: Any, element: int) -> tuple[Any, Any]:
        """Every ``simdgroup_matrix`` tile the same way (see :func:`wmma_helper`): row lane / 4, column
        2 * (lane % 4) + element."""
        return lane // 4, lane % 4 * 2 + element

    def render_wmma(self, u: UOp, srcs: list[str], fresh: Callable[[str], str]) -> tuple[str, list[str], list[str]]:
        """A call of the tile's :func:`wmma_helper` (C is zero: the kernel sums the instructions' results), with
        the SIMD group's threadgroup scratch declared at the top of the kernel. The lane is the launch
        dimension 0 position: a threadgroup is one SIMD group along it."""
        tc = next((t for t in self.tensor_cores if (t.intrinsic, t.dims, t.dtype_in, t.dtype_out) ==
                   (u.arg[0], u.arg[1], u.arg[4], u.dtype)), None)
        if tc is None:
            raise NotImplementedError(f"MetalRenderer declares no tensor core {u.arg[:2]} for {u.dtype}")
        ti, to = _msl_type(tc.dtype_in), _msl_type(tc.dtype_out)
        scratch = [f"ember_tc_{ti}_a", f"ember_tc_{ti}_b", f"ember_tc_{to}_c"]
        head = [f"threadgroup {t} {n}[64];" for t, n in zip((ti, ti, to), scratch)]
        name = fresh("wmma")
        # bfloat16 values live in float registers: each element converted explicitly
        a, b = (f"{ti}2(({ti}){srcs[j]}, ({ti}){srcs[j + 1]})" for j in (0, 2))
        call = f"{wmma_name(tc)}({a}, {b}, {to}2(0, 0), {', '.join(scratch)}, (ushort){srcs[-1]})"
        return name, [f"const {to}2 {name}_v = {call};", f"const {to} {name}[2] = {{{name}_v.x, {name}_v.y}};"], head

    # --- literals and ops ---------------------------------------------------------------------
    def render_const(self, value: object, dt: DType) -> str:
        if dt.kind in "iu":  # MSL has no long long: 64-bit literals take L / UL
            iv = int(value)  # type: ignore[call-overload]
            t = self.render_dtype(dt)
            if dt.kind == "i" and iv == -(2 ** (dt.bitsize - 1)):
                return f"(({t})({iv + 1}{'L' if dt.itemsize == 8 else ''} - 1))"
            suffix = {8: "UL" if dt.kind == "u" else "L", 4: "u" if dt.kind == "u" else ""}.get(dt.itemsize, "")
            return f"(({t}){iv})" if dt.itemsize < 4 else f"{iv}{suffix}"
        return super().render_const(value, dt)

    def math_fn(self, op: Ops, dt: DType) -> Callable[..., str]:
        """``metal::precise`` functions take float: half operands are widened and the result rounded back."""
        fn = self.math_fns[op]
        if dt == dtypes.float16 and fn.startswith("precise::"):
            return lambda *a: f"((half){fn}({', '.join(f'(float){x}' for x in a)}))"
        return lambda *a: f"{fn}({', '.join(a)})"

    def render_alu(self, u: UOp, a: list[str]) -> str:
        op, dt = u.op, u.dtype
        assert isinstance(dt, DType)
        if op is Ops.IDIV and dt.kind == "f":
            # half division rounds the quotient before truncating (the cast says so on any C++ compiler);
            # bfloat16 is float arithmetic rounded once, after
            quotient = f"(half)({a[0]} / {a[1]})" if dt == dtypes.float16 else f"{a[0]} / {a[1]}"
            expr = f"trunc({quotient})"
        elif op is Ops.MOD and dt.kind == "f":
            expr = f"fmod({a[0]}, {a[1]})"
        else:
            expr = super().render_alu(u, a)
        # half is native; bfloat16 is float arithmetic rounded after each op (a comparison's result is a bool)
        return round_result(dt, expr, (dtypes.bfloat16,), op)

    def render_cast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if sdt.kind == "f" and dt.kind in "iu":
            return self._render_float_to_int(x, dt)
        return super().render_cast(u, x)

    def _render_float_to_int(self, x: str, dt: DType) -> str:
        """C's truncating conversion where the result fits, else 0 (nan included), compared in float.

        The lower bound is ``x > lo - 1`` where float holds ``lo - 1`` exactly (16-bit and unsigned
        targets), else ``x >= lo``: no float lies between the two, so both tests agree. Metal has no
        double to compare in.
        """
        t = self.render_dtype(dt)
        signed = dt.kind == "i"
        lo = -(2 ** (dt.bitsize - 1)) if signed else 0
        hi = 2 ** (dt.bitsize - 1) if signed else 2 ** dt.bitsize
        low = f"{x} > {float(lo - 1)!r}f" if not signed or dt.bitsize <= 16 else f"{x} >= {float(lo)!r}f"
        return f"(({low} && {x} < {float(hi)!r}f) ? (({t}){x}) : 0)"

    def render_bitcast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if sdt == dtypes.bfloat16:
            bits = f"ember_f32_to_bf16({x})"
        elif sdt == dtypes.bool:
            bits = f"((uchar){x})"
        else:
            bits = x
        if dt == dtypes.bfloat16:
            return f"ember_bf16_to_f32(as_type<ushort>({bits}))"
        if dt == dtypes.bool:
            return f"(as_type<uchar>({bits}) != 0)"
        return f"as_type<{self.render_dtype(dt)}>({bits})"
