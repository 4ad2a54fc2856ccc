"""The CUDA C dialect of the C-family renderer.

A kernel is ``extern "C" __global__ void NAME(const long long var_arg, ..., T* __restrict__ data0, ...)``,
compiled by NVRTC as C++. The global loops of the linear program map onto the launch grid (see
docs/contracts.md, "Launch grid"): the i-th of n global RANGEs runs along launch dimension
``n-1-i``, so dimension 0 (``x``) is the innermost loop. Each global RANGE is a grid-stride loop
(``for (i = blockIdx.x*blockDim.x + threadIdx.x; i < end; i += gridDim.x*blockDim.x)``): the
runtime may then choose any block size and cap the grid at the hardware limits (65535 blocks in
``y`` and ``z``), and every launch still covers every index exactly once.

Storage and compute types:

- ``float16`` buffers hold ``half`` (``cuda_fp16.h``); values are computed as ``float`` and every
  float16 result is rounded to half precision (``ember_f32_to_f16``). float32 has more than twice
  half's precision plus two bits, so add, sub, mul, div and sqrt give exactly half arithmetic's
  answers, without the overload ambiguities of ``__half`` operators.
- ``bfloat16`` buffers hold ``__nv_bfloat16`` (``cuda_bf16.h``); values are ``float`` rounded to
  bfloat16 after every op, as the PYTHON device does.
- NAN and INFINITY are bit patterns (``__int_as_float``): NVRTC has no ``math.h`` macros.

Capabilities come from the device (:meth:`CUDARenderer.from_attributes`) or, without a GPU, from
an architecture name (``CUDARenderer("sm_80")``), so kernels render and compile for a GPU this
machine does not have.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ember.dtype import DType, PtrDType, dtypes
from ember.ir import Ops, UOp
from ember.renderer import BuiltinVectorRenderer, TensorCore, VectorSyntax, round_result

#: every float16 or bfloat16 result is computed in float and rounded back by these (under include guards:
#: the kernels of a batch are joined into one program). Finite values round to nearest even (the headers'
#: conversions); a NaN keeps its sign and top payload bits, made quiet for bfloat16, as numpy and the
#: PYTHON device convert it (the hardware conversion would give one canonical NaN)
_F16_HELPERS = """#ifndef EMBER_CUDA_F16
#define EMBER_CUDA_F16
#include <cuda_fp16.h>
static __device__ __forceinline__ half ember_f32_to_f16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    unsigned short h = (unsigned short)(((u >> 16) & 0x8000u) | 0x7c00u | ((u >> 13) & 0x3ffu));
    return __ushort_as_half((h & 0x3ffu) ? h : (unsigned short)(h | 1u));
  }
  return __float2half_rn(f); }
static __device__ __forceinline__ half ember_f64_to_f16(double d) {
  return d != d ? ember_f32_to_f16((float)d) : __double2half(d); }
static __device__ __forceinline__ float ember_f16_round(float f) { return __half2float(ember_f32_to_f16(f)); }
#endif"""

_BF16_HELPERS = """#ifndef EMBER_CUDA_BF16
#define EMBER_CUDA_BF16
#include <cuda_bf16.h>
static __device__ __forceinline__ __nv_bfloat16 ember_f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return __ushort_as_bfloat16((unsigned short)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u)));
  return __ushort_as_bfloat16((unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)); }
static __device__ __forceinline__ __nv_bfloat16 ember_f64_to_bf16(double d) {
  return d != d ? ember_f32_to_bf16((float)d) : __double2bfloat16(d); }
static __device__ __forceinline__ float ember_bf16_round(float f) { return __bfloat162float(ember_f32_to_bf16(f)); }
#endif"""

_BITCAST_HELPER = """#ifndef EMBER_CUDA_BITCAST
#define EMBER_CUDA_BITCAST
template <class D, class S> static __device__ __forceinline__ D ember_bitcast(S s) {
  static_assert(sizeof(D) == sizeof(S), "bitcast between types of different sizes");
  D d; memcpy(&d, &s, sizeof(D)); return d; }
#endif"""

#: two 16-bit floats packed into the 32-bit register an ``mma.sync`` operand takes (the lower-numbered element in
#: the low half)
_PACK_HELPERS = """#ifndef EMBER_CUDA_PACK
#define EMBER_CUDA_PACK
static __device__ __forceinline__ unsigned ember_pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi); return *reinterpret_cast<unsigned*>(&h); }
static __device__ __forceinline__ unsigned ember_pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi); return *reinterpret_cast<unsigned*>(&h); }
#endif"""

#: a vector access: one instruction where the buffer's start is aligned to the vector (the index is a multiple of
#: the lane count, so then the address is), else one access per lane (a view into a buffer may start anywhere)
_VECTOR_HELPERS = """#ifndef EMBER_CUDA_VECTOR
#define EMBER_CUDA_VECTOR
template <class V, int N, class T> static __device__ __forceinline__ V ember_vload(const T* base, long long i) {
  if (((unsigned long long)base & (sizeof(V) - 1)) == 0) return *reinterpret_cast<const V*>(base + i);
  T l[N]; for (int k = 0; k < N; k++) l[k] = base[i + k];
  V v; memcpy(&v, l, sizeof(V)); return v; }
template <class V, int N, class T> static __device__ __forceinline__ void ember_vstore(T* base, long long i, V v) {
  if (((unsigned long long)base & (sizeof(V) - 1)) == 0) { *reinterpret_cast<V*>(base + i) = v; return; }
  T l[N]; memcpy(l, &v, sizeof(V)); for (int k = 0; k < N; k++) base[i + k] = l[k]; }
#endif"""

#: CUDA's vector type of each element type it has them for (``float4``, ``longlong2``)
_VECTOR_NAMES: dict[DType, str] = {
    dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort", dtypes.int32: "int",
    dtypes.uint32: "uint", dtypes.int64: "longlong", dtypes.uint64: "ulonglong", dtypes.float32: "float",
    dtypes.float64: "double", dtypes.float16: "half"}

_BASE_TYPES: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
    dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int",
    dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "float",
    dtypes.bfloat16: "float", dtypes.float32: "float", dtypes.float64: "double"}

#: the 16-bit floats this target holds in float registers: every ALU result of them is rounded
_HELD_IN_FLOAT = (dtypes.float16, dtypes.bfloat16)

#: the grid registers of each launch dimension
_DIMS = ("x", "y", "z")

#: float32 functions CUDA computes with more than 1 ulp of error (expf, exp2f, sinf: 2; powf: more; logf and
#: log2f: 1 but not correctly rounded): computed in float64 and rounded once they are within 1 ulp, the bound
#: ember holds every compiled device to
WIDE_MATH_OPS = frozenset({Ops.EXP, Ops.EXP2, Ops.LOG, Ops.LOG2, Ops.SIN, Ops.POW})


@dataclass(frozen=True)
class ArchLimits:
    """What a CUDA architecture guarantees every GPU of it (used when no GPU is there to ask)."""

    compute_capability: tuple[int, int]
    #: static shared memory one block may declare (48 KiB on every architecture; more needs an opt-in)
    shared_max: int = 48 * 1024
    max_threads_per_block: int = 1024
    max_block_dims: tuple[int, int, int] = (1024, 1024, 64)
    max_grid_dims: tuple[int, int, int] = (2 ** 31 - 1, 65535, 65535)
    warp_size: int = 32


#: the architectures ember tests without a GPU (CI compiles every kernel for each of them)
KNOWN_ARCHS: dict[str, ArchLimits] = {
    "sm_75": ArchLimits((7, 5)),
    "sm_80": ArchLimits((8, 0)),
    "sm_86": ArchLimits((8, 6)),
    "sm_89": ArchLimits((8, 9)),
    "sm_90": ArchLimits((9, 0)),
}


#: the lane layout of ``mma.sync`` fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane = 4*group + t;
#: A element i sits at row group (+8 when i&2), column 2*t + (i&1) (+8 when i&4); B element i at row 2*t + (i&1)
#: (+8 when i&2), column group; C element i at row group (+8 when i&2), column 2*t + (i&1)
_MMA_LAYOUT = (("lane", ("group", 3), ("t", 2)), ("A", "row=group+8*(i>>1&1), col=2*t+(i&1)+8*(i>>2&1)"),
               ("B", "row=2*t+(i&1)+8*(i>>1&1), col=group"), ("C", "row=group+8*(i>>1&1), col=2*t+(i&1)"))


def tensor_cores_for(cc: tuple[int, int]) -> tuple[TensorCore, ...]:
    """The warp-wide ``mma.sync`` shapes with float accumulation a GPU of compute capability ``cc`` has.

    m16n8k16 takes float16 or bfloat16 inputs from Ampere (sm_80) on; Turing (sm_75) has float16
    m16n8k8 only (bfloat16 mma came with Ampere).
    """
    shapes: list[TensorCore] = []
    if cc >= (8, 0):
        for dt, ptx in ((dtypes.float16, "f16"), (dtypes.bfloat16, "bf16")):
            shapes.append(TensorCore((16, 8, 16), dt, dtypes.float32, threads=32, elements_per_thread=(8, 4, 4),
                                     intrinsic=f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx}.{ptx}.f32",
                                     layout=_MMA_LAYOUT))
    if cc >= (7, 5):
        shapes.append(TensorCore((16, 8, 8), dtypes.float16, dtypes.float32, threads=32, elements_per_thread=(4, 2, 4),
                                 intrinsic="mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", layout=_MMA_LAYOUT))
    return tuple(shapes)


def parse_arch(arch: str) -> tuple[int, int]:
    """``"sm_80"`` (or ``"compute_80"``, ``"sm_90a"``) -> ``(8, 0)``; ``ValueError`` for anything else."""
    m = re.fullmatch(r"(?:sm|compute)_(\d+)(\d)a?", arch)
    if m is None:
        raise ValueError(f"invalid CUDA architecture {arch!r}: expected sm_XY such as sm_75, sm_80 or sm_90")
    return int(m.group(1)), int(m.group(2))


class CUDARenderer(BuiltinVectorRenderer):
    """CUDA C for one GPU architecture and its limits.

    Args:
        arch: the target, ``"sm_75"``, ``"sm_80"``, ``"sm_90"`` ... (the compiler builds for it).
        shared_max: bytes of shared memory one block may use.
        max_threads_per_block: the most threads in one block.
        max_block_dims: the largest block size per dimension.
        max_grid_dims: the largest grid size (in blocks) per dimension.
        warp_size: threads per warp.
        device: the ember device name the kernels are for.

    Limits left out default to what every GPU of ``arch`` has (:data:`KNOWN_ARCHS`, else the
    common CUDA limits); :class:`~ember_cuda.device.CUDADevice` passes what its GPU reports.
    """

    kernel_prefix = 'extern "C" __global__ '
    restrict = "__restrict__"
    has_local = True
    has_shared = True
    local_prefix = "__shared__ "
    # every thread of a block reaches it: a kernel with a barrier is launched with its LOCAL/GROUP sizes as
    # the block, which divide the global size, so each grid-stride loop runs the same trips in every thread
    barrier = "__syncthreads();"
    vector_syntax = VectorSyntax(load="ember_vload<{t}, {n}>({buf}, {idx})",
                                 store="ember_vstore<{t}, {n}>({buf}, {idx}, {value});",
                                 vectorize="make_{t}({vals})", gep="{vec}.{xyzw}")
    vector_names = _VECTOR_NAMES
    parallel_threads = 1
    supports_float16 = True
    #: compute :data:`WIDE_MATH_OPS` of float32 (and 16-bit floats) in float64, rounded once
    wide_math = True
    math_fns = {Ops.SQRT: "sqrtf", Ops.EXP: "expf", Ops.LOG: "logf", Ops.EXP2: "exp2f", Ops.LOG2: "log2f",
                Ops.SIN: "sinf", Ops.TRUNC: "truncf", Ops.POW: "powf"}

    def __init__(self, arch: str = "sm_80", shared_max: int | None = None, max_threads_per_block: int | None = None,
                 max_block_dims: Sequence[int] | None = None, max_grid_dims: Sequence[int] | None = None,
                 warp_size: int | None = None, device: str = "CUDA"):
        cc = parse_arch(arch)
        base = KNOWN_ARCHS.get(f"sm_{cc[0]}{cc[1]}", ArchLimits(cc))
        self.arch = arch
        self.compute_capability = cc
        self.device = device
        self.shared_max = base.shared_max if shared_max is None else int(shared_max)
        self.max_threads_per_block = base.max_threads_per_block if max_threads_per_block is None \
            else int(max_threads_per_block)
        self.local_max = tuple(int(d) for d in (base.max_block_dims if max_block_dims is None else max_block_dims))
        self.max_grid_dims = tuple(int(d) for d in (base.max_grid_dims if max_grid_dims is None else max_grid_dims))
        self.warp_size = base.warp_size if warp_size is None else int(warp_size)
        # grid-stride loops cover any size in any dimension; the 64-bit signed limit keeps index math defined
        self.global_max = (2 ** 63 - 1,) * 3
        self.tensor_cores = tensor_cores_for(cc)
        # the tensor cores (and so the kernels codegen plans) differ per architecture
        self.variant = arch
        self.supported_dtypes = frozenset(dtypes.fields().values())
        self.type_map = dict(_BASE_TYPES)
        # the built-in vector types of the types a buffer holds as they are computed, up to 16 bytes (one load)
        # (half has half2 only: its lanes are converted to and from the float values are computed in)
        self.vector_widths = {dt: (2,) if dt == dtypes.float16 else tuple(n for n in (2, 4) if n * dt.itemsize <= 16)
                              for dt in _VECTOR_NAMES}

    @classmethod
    def from_attributes(cls, compute_capability: tuple[int, int], shared_max: int, max_threads_per_block: int,
                        max_block_dims: Sequence[int], max_grid_dims: Sequence[int], warp_size: int,
                        device: str = "CUDA") -> CUDARenderer:
        """A renderer for a GPU's reported attributes (``cuDeviceGetAttribute``)."""
        return cls(f"sm_{compute_capability[0]}{compute_capability[1]}", shared_max, max_threads_per_block,
                   max_block_dims, max_grid_dims, warp_size, device)

    def __repr__(self) -> str:
        return f"<CUDARenderer {self.arch} for {self.device}>"

    # --- types --------------------------------------------------------------------------------
    def storage_type(self, dt: DType) -> str:
        """The element type of a buffer of ``dt``."""
        if dt == dtypes.float16:
            return "half"
        if dt == dtypes.bfloat16:
            return "__nv_bfloat16"
        return self.render_dtype(dt)

    # --- kernel -------------------------------------------------------------------------------
    def render_program(self, name: str, uops: list[UOp]) -> str:
        """Render ``uops`` as the CUDA C source of a kernel called ``name``."""
        global_ranges = [u for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"]
        if len(global_ranges) > len(_DIMS):
            raise ValueError(f"kernel {name} has {len(global_ranges)} global loops; CUDA launches at most "
                             f"{len(_DIMS)} dimensions")
        n = len(global_ranges)
        self._dims = {r: n - 1 - i for i, r in enumerate(global_ranges)}
        return super().render_program(name, uops)

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        """The ``__global__`` function: each int variable as a ``long long`` first, then the buffers (buffer
        parameter i is buffer i; one the program never touches still gets a parameter when a later buffer
        has one). Buffers come last so a launch may pass more buffers than the kernel reads."""
        buffers: dict[int, DType] = {u.arg[0]: u.dtype.base for u in uops
                                     if u.op is Ops.DEFINE_GLOBAL and isinstance(u.dtype, PtrDType)}
        args: list[str] = []
        head: list[str] = []
        for pname, dt in params:
            if not isinstance(dt, PtrDType):
                t = self.render_dtype(dt)
                args.append(f"const long long {pname}_arg")
                head.append(f"  const {t} {pname} = ({t}){pname}_arg;")
        for i in range(max(buffers, default=-1) + 1):
            if i in buffers:
                args.append(f"{self.storage_type(buffers[i])}* {self.restrict} data{i}")
            else:
                args.append(f"unsigned char* unused{i}")
        code = "\n".join([f"{self.kernel_prefix}void {name}({', '.join(args)}) {{", *head, *body, "}", ""])
        return self._preamble(code) + code

    def _preamble(self, code: str) -> str:
        """The headers and helpers the kernel uses, each under an include guard."""
        parts: list[str] = []
        if "half" in code or "ember_f16_round" in code or "_to_f16(" in code:
            parts.append(_F16_HELPERS)
        if "bfloat16" in code or "ember_bf16_round" in code or "_to_bf16(" in code:
            parts.append(_BF16_HELPERS)
        if "ember_bitcast" in code:
            parts.append(_BITCAST_HELPER)
        if "ember_vload<" in code or "ember_vstore<" in code:
            parts.append(_VECTOR_HELPERS)
        if "ember_pack_" in code:
            parts += [p for p in (_F16_HELPERS, _BF16_HELPERS) if p not in parts] + [_PACK_HELPERS]
        return "\n".join(parts) + "\n" if parts else ""

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        """A global RANGE is a grid-stride loop over its launch dimension; other RANGEs are plain loops."""
        if u.arg[1] != "global":
            return super().render_range_open(u, var, start, end, parallel)
        t = self.render_dtype(u.dtype)  # type: ignore[arg-type]
        d = _DIMS[self._dims[u]]
        first = f"(long long)blockIdx.{d} * blockDim.{d} + threadIdx.{d}"
        stride = f"(long long)gridDim.{d} * blockDim.{d}"
        bound = u.src[1].arg if u.src[1].op is Ops.CONST else None
        if u.dtype == dtypes.int32 and bound is not None and bound <= 2 ** 30:
            # index + stride stays below 2**31 (the runtime never launches more threads than indices, rounded
            # up to a block): the loop runs in 32-bit registers
            return [f"for ({t} {var} = ({t})({first}); {var} < {end}; {var} += ({t})({stride})) {{"]
        # a loop variable wide enough that index + stride cannot overflow
        return [f"for (long long {var}_l = {first}; {var}_l < (long long){end}; {var}_l += {stride}) {{",
                f"  const {t} {var} = ({t}){var}_l;"]

    def render_range_close(self, u: UOp) -> list[str]:
        return ["}"]

    # --- tensor cores ------------------------------------------------------------------------
    def tensor_core_layout(self, tc: TensorCore, operand: str, lane: Any, element: int) -> tuple[Any, Any]:
        """The ``mma.sync`` fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16" and m16n8k8, see
        :data:`_MMA_LAYOUT`): lane = 4 * group + t."""
        group, t, i = lane // 4, lane % 4, element
        if operand == "A":
            return group + 8 * (i >> 1 & 1), t * 2 + (i & 1) + 8 * (i >> 2 & 1)
        if operand == "B":
            return t * 2 + (i & 1) + 8 * (i >> 1 & 1), group
        return group + 8 * (i >> 1 & 1), t * 2 + (i & 1)

    def render_wmma(self, u: UOp, srcs: list[str], fresh: Callable[[str], str]) -> tuple[str, list[str], list[str]]:
        """``mma.sync`` as inline PTX: A and B packed two 16-bit floats per register, D into a float array
        (C is zero: the kernel sums the instructions' results)."""
        intrinsic, _dims, _threads, (na, nb, nc), dtype_in = u.arg[:5]
        pack = "ember_pack_bf16x2" if dtype_in == dtypes.bfloat16 else "ember_pack_f16x2"
        regs = [f"{pack}({srcs[j]}, {srcs[j + 1]})" for j in range(0, na + nb, 2)]
        name = fresh("wmma")
        outs = ", ".join(f"%{j}" for j in range(nc))
        a_ops = ", ".join(f"%{nc + j}" for j in range(na // 2))
        b_ops = ", ".join(f"%{nc + na // 2 + j}" for j in range(nb // 2))
        c_ops = ", ".join(f"%{nc + (na + nb) // 2 + j}" for j in range(nc))
        constraints = ", ".join(f'"=f"({name}[{j}])' for j in range(nc))
        inputs = ", ".join([f'"r"({r})' for r in regs] + ['"f"(0.0f)'] * nc)
        return name, [f"float {name}[{nc}];",
                      f'asm volatile("{intrinsic} {{{outs}}}, {{{a_ops}}}, {{{b_ops}}}, {{{c_ops}}};" : {constraints} '
                      f": {inputs});"], []

    # --- loads and stores ---------------------------------------------------------------------
    def render_vectorize(self, vals: list[str], dt: DType) -> str:
        if dt.scalar() == dtypes.float16:  # the float values rounded as a store of each would
            return f"__halves2half2({', '.join(f'ember_f32_to_f16({v})' for v in vals)})"
        return super().render_vectorize(vals, dt)

    def render_gep(self, vec: str, lane: int, dt: DType) -> str:
        if dt.scalar() == dtypes.float16:
            return f"__half2float({vec}.{'xy'[lane]})"
        return super().render_gep(vec, lane, dt)

    def render_load_value(self, buf: str, idx: str, dt: DType) -> str:
        if dt == dtypes.float16:
            return f"__half2float({buf}[{idx}])"
        if dt == dtypes.bfloat16:
            return f"__bfloat162float({buf}[{idx}])"
        return f"{buf}[{idx}]"

    def render_store_value(self, value: str, dt: DType) -> str:
        if dt == dtypes.float16:
            return f"ember_f32_to_f16({value})"
        if dt == dtypes.bfloat16:
            return f"ember_f32_to_bf16({value})"
        return value

    # --- literals and ops ---------------------------------------------------------------------
    def render_const(self, value: object, dt: DType) -> str:
        if dt.kind == "f" and not math.isfinite(float(value)):  # type: ignore[arg-type]
            v = float(value)  # type: ignore[arg-type]
            if dt == dtypes.float64:
                bits = "0x7ff8000000000000ll" if math.isnan(v) else ("0x7ff0000000000000ll" if v > 0
                                                                   else "(long long)0xfff0000000000000ull")
                return f"__longlong_as_double({bits})"
            bits = "0x7fc00000" if math.isnan(v) else ("0x7f800000" if v > 0 else "(int)0xff800000u")
            return f"__int_as_float({bits})"
        return super().render_const(value, dt)

    def math_fn(self, op: Ops, dt: DType) -> Callable[..., str]:
        """float64 functions for float64; for narrower floats the float64 function rounded once where CUDA's own
        float function is less accurate than 1 ulp (see :data:`WIDE_MATH_OPS`), else the float function."""
        fn = self.math_fns[op]
        if dt == dtypes.float64:
            return lambda *a: f"{fn[:-1]}({', '.join(a)})"
        if self.wide_math and op in WIDE_MATH_OPS:
            return lambda *a: f"((float){fn[:-1]}({', '.join(f'(double){x}' for x in a)}))"
        return lambda *a: f"{fn}({', '.join(a)})"

    def render_alu(self, u: UOp, a: list[str]) -> str:
        op, dt = u.op, u.dtype
        assert isinstance(dt, DType)
        if op is Ops.IDIV and dt.kind == "f":
            quotient = round_result(dt, f"({a[0]} / {a[1]})", _HELD_IN_FLOAT)
            expr = f"trunc({quotient})" if dt == dtypes.float64 else f"truncf({quotient})"
        elif op is Ops.MOD and dt.kind == "f":
            expr = f"fmod({a[0]}, {a[1]})" if dt == dtypes.float64 else f"fmodf({a[0]}, {a[1]})"
        elif op is Ops.RECIP and dt.kind == "f":
            expr = f"(1.0 / {a[0]})" if dt == dtypes.float64 else f"(1.0f / {a[0]})"
        else:
            expr = super().render_alu(u, a)
        return round_result(dt, expr, _HELD_IN_FLOAT, op)

    def render_cast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if dt in (dtypes.float16, dtypes.bfloat16) and sdt.kind != "b":
            if sdt == dtypes.float64:  # one rounding, straight from double
                return f"__half2float(ember_f64_to_f16({x}))" if dt == dtypes.float16 else \
                    f"__bfloat162float(ember_f64_to_bf16({x}))"
            if sdt.kind in "iu" and sdt.itemsize >= 4:  # a wide int is not exact in float: one rounding, from the int
                fn = {(4, "i"): "int", (4, "u"): "uint", (8, "i"): "ll", (8, "u"): "ull"}[(sdt.itemsize, sdt.kind)]
                return f"__half2float(__{fn}2half_rn({x}))" if dt == dtypes.float16 else \
                    f"__bfloat162float(__{fn}2bfloat16_rn({x}))"
            return round_result(dt, f"((float){x})", _HELD_IN_FLOAT)
        if dt in (dtypes.float16, dtypes.bfloat16):  # from bool
            return f"({x} ? 1.0f : 0.0f)"
        return super().render_cast(u, x)

    def render_bitcast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if sdt == dtypes.float16:
            bits, src_t = f"__half_as_ushort(ember_f32_to_f16({x}))", "unsigned short"
        elif sdt == dtypes.bfloat16:
            bits, src_t = f"__bfloat16_as_ushort(ember_f32_to_bf16({x}))", "unsigned short"
        else:
            bits, src_t = x, self.render_dtype(sdt)
        if dt == dtypes.float16:
            return f"__half2float(__ushort_as_half(ember_bitcast<unsigned short, {src_t}>({bits})))"
        if dt == dtypes.bfloat16:
            return f"__bfloat162float(__ushort_as_bfloat16(ember_bitcast<unsigned short, {src_t}>({bits})))"
        return f"ember_bitcast<{self.render_dtype(dt)}, {src_t}>({bits})"
