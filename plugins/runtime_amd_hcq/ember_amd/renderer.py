"""The AMD GPU dialect of the C-family renderer: OpenCL C built by clang for ``amdgcn-amd-amdhsa``.

A kernel is ``EMBER_KERNEL void NAME(__global T* restrict data0, ..., const long var_arg)``, compiled
with ``-x cl -cl-std=CL2.0 -nogpulib``: no device libraries, so no OpenCL library call may appear
(``get_global_id`` and ``exp`` would be undefined symbols). Instead:

- work-item and work-group ids, group sizes, the barrier and the local-memory qualifier are macros,
  all defined in one prelude block between :data:`PRELUDE_BEGIN` and :data:`PRELUDE_END`, spelled
  with ``amdgcn`` builtins (``__builtin_amdgcn_workgroup_id_x()``, ``__builtin_amdgcn_workitem_id_x()``,
  and ``__builtin_amdgcn_workgroup_size_x()``, which reads the hidden kernel argument
  ``hidden_group_size_x`` of code-object v5). :func:`host_opencl_source` swaps that block for
  OpenCL's builtins, so the very same kernel builds for a CPU OpenCL (the mock GPU's PoCL);
- math, float16 conversions and ``fmod`` are helper functions in plain OpenCL C
  (:mod:`ember_amd.kernel_lib`);
- a tensor-core kernel (the ``TC`` opt, RDNA3 only) calls its WMMA instruction through the macros of a
  second block, between :data:`WMMA_BEGIN` and :data:`WMMA_END`: on the GPU they are clang's
  ``__builtin_amdgcn_wmma_f32_16x16x16_{f16,bf16}_w32``; :func:`host_opencl_source` swaps them for a plain
  OpenCL C function that trades the wave's A and B through local memory (the work-group of a TC kernel is
  one wave), so the mock GPU runs these kernels too.

The global loops map onto the launch grid as for OpenCL and CUDA (docs/contracts.md, "Launch
grid"): the i-th of n global RANGEs runs along launch dimension ``n-1-i``. A global index is
``group_id * group_size + local_id``, guarded by the loop's end: a dispatch may cover more
work-items than indices (the last work-group is rounded up).

Storage and compute types: ``bool`` buffers hold ``uchar`` (OpenCL forbids ``bool`` parameters);
``float16`` and ``bfloat16`` buffers hold ``ushort`` bit patterns and values are ``float``, rounded
after every op, as the PYTHON device does.

Capabilities come from an architecture name (``AMDRenderer("gfx1100")``: wave size from the
generation) or a KFD topology node (:meth:`AMDRenderer.from_properties`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
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
from ember_amd.kernel_lib import helpers_for

#: the comments around the block of macros :func:`host_opencl_source` replaces
PRELUDE_BEGIN = "/* ember-amd prelude: begin */"
PRELUDE_END = "/* ember-amd prelude: end */"
_PRELUDE_RE = re.compile(re.escape(PRELUDE_BEGIN) + r".*?" + re.escape(PRELUDE_END), re.S)
#: the comments around the block of tensor-core macros (only in kernels that use them)
WMMA_BEGIN = "/* ember-amd wmma: begin */"
WMMA_END = "/* ember-amd wmma: end */"
_WMMA_RE = re.compile(re.escape(WMMA_BEGIN) + r".*?" + re.escape(WMMA_END), re.S)

_DIMS = ("x", "y", "z")

_BASE_TYPES: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
    dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
    dtypes.uint64: "ulong", dtypes.float16: "float", dtypes.bfloat16: "float", dtypes.float32: "float",
    dtypes.float64: "double"}

#: the element types with vector loads and stores, and their alignment
_VECTOR_ALIGN: dict[DType, int] = {dt: dt.itemsize for dt in (
    dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
    dtypes.float32, dtypes.float64)}
_VECTOR_ALIGN_BY_NAME = {_BASE_TYPES[dt]: n for dt, n in _VECTOR_ALIGN.items()}

#: the 16-bit floats this target holds in float registers: every ALU result of them is rounded
_HELD_IN_FLOAT = (dtypes.float16, dtypes.bfloat16)
#: math computed by the double-precision helpers of :mod:`ember_amd.kernel_lib` (float32 rounded once)
_LIB_MATH = {Ops.EXP: "ember_exp", Ops.LOG: "ember_log", Ops.EXP2: "ember_exp2", Ops.LOG2: "ember_log2",
             Ops.SIN: "ember_sin", Ops.POW: "ember_pow", Ops.MOD: "ember_fmod"}

#: a kernel with more math-helper calls than this calls them out of line (``ember_exp_call``): inlining hundreds
#: of copies (unrolled loops) makes clang take seconds per kernel, and one call per use costs a stack in scratch
MAX_INLINE_MATH = 8


def _ids_block(amd: bool, max_workgroup: int) -> str:
    """The prelude macros, spelled with amdgcn builtins (``amd``) or with OpenCL's built-in functions."""
    if amd:
        lines = [f"#define EMBER_KERNEL __kernel __attribute__((amdgpu_flat_work_group_size(1, {max_workgroup})))"]
        for i, d in enumerate(_DIMS):
            lines += [f"#define EMBER_GROUP_ID_{i} __builtin_amdgcn_workgroup_id_{d}()",
                      f"#define EMBER_LOCAL_ID_{i} __builtin_amdgcn_workitem_id_{d}()",
                      f"#define EMBER_GROUP_SIZE_{i} ((uint)__builtin_amdgcn_workgroup_size_{d}())"]
        lines += ["#define EMBER_GROUP_ID(d) EMBER_GROUP_ID_##d", "#define EMBER_LOCAL_ID(d) EMBER_LOCAL_ID_##d",
                  "#define EMBER_GROUP_SIZE(d) EMBER_GROUP_SIZE_##d",
                  '#define EMBER_BARRIER() do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); '
                  '__builtin_amdgcn_s_barrier(); __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); } while (0)']
    else:
        lines = ["#define EMBER_KERNEL __kernel", "#define EMBER_GROUP_ID(d) ((uint)get_group_id(d))",
                 "#define EMBER_LOCAL_ID(d) ((uint)get_local_id(d))",
                 "#define EMBER_GROUP_SIZE(d) ((uint)get_local_size(d))",
                 "#define EMBER_BARRIER() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)"]
    lines += ["#define EMBER_LOCAL __local",
              "#define EMBER_GLOBAL_ID(d) (EMBER_GROUP_ID(d) * EMBER_GROUP_SIZE(d) + EMBER_LOCAL_ID(d))"]
    return "\n".join([PRELUDE_BEGIN, "#ifndef EMBER_AMD_IDS", "#define EMBER_AMD_IDS", *lines, "#endif", PRELUDE_END])


def host_opencl_source(src: str) -> str:
    """``src`` with its prelude block(s) spelled with OpenCL built-ins (``get_group_id`` ...) and its tensor-core
    block (if any) with the host version of the instruction: the same kernel, buildable by any OpenCL C compiler.
    ``ValueError`` when ``src`` has no prelude block."""
    if not _PRELUDE_RE.search(src):
        raise ValueError(f"not an AMD kernel source: no block between {PRELUDE_BEGIN!r} and {PRELUDE_END!r}")
    host, host_wmma = _ids_block(False, 0), _wmma_block(False)
    return _WMMA_RE.sub(lambda _: host_wmma, _PRELUDE_RE.sub(lambda _: host, src))


def wave_size_for(arch: str) -> int:
    """Threads per wave of a gfx target: 64 on GCN/CDNA (gfx9 and older), 32 on RDNA (gfx10, 11, 12)."""
    m = re.fullmatch(r"gfx(\d+?)([0-9a-f]{2})", arch)
    if m is None:
        raise ValueError(f"invalid AMD GPU target {arch!r}: expected a gfx name such as gfx1100 or gfx942")
    return 32 if int(m.group(1)) >= 10 else 64


# RDNA3 WMMA in wave32 (v_wmma_f32_16x16x16_{f16,bf16}, D = A @ B + C with A 16x16 (MxK), B 16x16 (KxN)), as
# AMD documents it (AMD "RDNA3" Instruction Set Architecture reference guide, the "Wave Matrix Multiply
# Accumulate (WMMA)" chapter; GPUOpen, "How to accelerate AI applications on RDNA 3 using WMMA", 2023) and LLVM's
# __builtin_amdgcn_wmma_f32_16x16x16_f16_w32 (V8f = V16h, V16h, V8f; bf16: V16s bit patterns) implements it:
# - A: lane l holds row l % 16 of A, its 16 K values in order (element i is A[l % 16][i]);
# - B: lane l holds column l % 16 of B, its 16 K values in order (element i is B[i][l % 16]);
#   lanes 16-31 must hold the same A and B values as lanes 0-15 (the ISA guide requires the copy);
# - C/D (float): lane l holds 8 values of column l % 16, element i in row 2 * i + l // 16 (the lower half of the
#   wave holds the even rows, the upper half the odd ones).
_WMMA_LAYOUT = (("A", "row=lane%16, k=i"), ("B", "k=i, col=lane%16"), ("C", "row=2*i+lane//16, col=lane%16"))

#: floats of local memory the host version trades the wave's A and B through (32 lanes, 16 values each)
_WMMA_SCRATCH = 2 * 32 * 16


def _wmma_block(amd: bool) -> str:
    """The tensor-core macros: clang's WMMA builtins for the GPU (``amd``), or a plain OpenCL C version of the
    same instruction for a CPU OpenCL (each work-item stores its A and B in local memory, the work-group, which
    is one wave, synchronizes, and each computes its 8 elements of D from lanes 0-15: lanes 16-31 hold copies).

    ``EMBER_WMMA_<T>_VEC`` is the operand vector type, ``EMBER_WMMA_<T>_IN(x)`` converts one element (a float
    holding an exactly representable value) into it, ``EMBER_WMMA_<T>(a, b, lane)`` is D (a ``float8``), and
    ``EMBER_WMMA_SCRATCH`` declares what the instruction needs at the top of the kernel."""
    if amd:
        lines = ["#pragma OPENCL EXTENSION cl_khr_fp16 : enable",
                 "#define EMBER_WMMA_SCRATCH (void)0",
                 "#define EMBER_WMMA_F16_VEC half16", "#define EMBER_WMMA_F16_IN(x) ((half)(x))",
                 "#define EMBER_WMMA_F16(a, b, lane) __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, (float8)(0.0f))",
                 # a bfloat16 value held in a float is the top half of the float's bits
                 "#define EMBER_WMMA_BF16_VEC short16", "#define EMBER_WMMA_BF16_IN(x) ((short)(as_uint(x) >> 16))",
                 "#define EMBER_WMMA_BF16(a, b, lane) "
                 "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a, b, (float8)(0.0f))"]
    else:
        lines = [f"#define EMBER_WMMA_SCRATCH __local float ember_wmma_scratch[{_WMMA_SCRATCH}]",
                 "#define EMBER_WMMA_F16_VEC float16", "#define EMBER_WMMA_F16_IN(x) (x)",
                 "#define EMBER_WMMA_F16(a, b, lane) ember_wmma_host(a, b, lane, ember_wmma_scratch)",
                 "#define EMBER_WMMA_BF16_VEC float16", "#define EMBER_WMMA_BF16_IN(x) (x)",
                 "#define EMBER_WMMA_BF16(a, b, lane) ember_wmma_host(a, b, lane, ember_wmma_scratch)",
                 "static float8 ember_wmma_host(float16 a, float16 b, uint lane, __local float* s) {",
                 "  vstore16(a, lane, s); vstore16(b, 32 + lane, s);",
                 "  barrier(CLK_LOCAL_MEM_FENCE);",
                 "  float d[8];",
                 "  for (uint i = 0; i < 8; i++) {",
                 "    const uint row = 2 * i + lane / 16, col = lane % 16;",
                 "    float acc = 0.0f;",
                 "    for (uint k = 0; k < 16; k++) acc += s[row * 16 + k] * s[(32 + col) * 16 + k];",
                 "    d[i] = acc;",
                 "  }",
                 "  barrier(CLK_LOCAL_MEM_FENCE);",
                 "  return vload8(0, d);",
                 "}"]
    return "\n".join([WMMA_BEGIN, "#ifndef EMBER_AMD_WMMA", "#define EMBER_AMD_WMMA", *lines, "#endif", WMMA_END])


def tensor_cores_for(arch: str) -> tuple[TensorCore, ...]:
    """The WMMA shapes of a gfx target: RDNA3 (gfx11) multiplies 16x16x16 float16 or bfloat16 tiles per wave32
    with float accumulation. Nothing is declared for other targets yet (RDNA4's WMMA has another lane layout,
    CDNA's MFMA is wave64)."""
    m = re.fullmatch(r"gfx(\d+?)[0-9a-f]{2}", arch)
    if m is None or int(m.group(1)) != 11:
        return ()
    return tuple(TensorCore((16, 16, 16), dt, dtypes.float32, threads=32, elements_per_thread=(16, 16, 8),
                            intrinsic=f"__builtin_amdgcn_wmma_f32_16x16x16_{name}_w32", layout=_WMMA_LAYOUT)
                 for dt, name in ((dtypes.float16, "f16"), (dtypes.bfloat16, "bf16")))


class AMDRenderer(BuiltinVectorRenderer):
    """OpenCL C for one AMD GPU target and its limits.

    Args:
        arch: the gfx target (``"gfx1100"``, ``"gfx942"`` ...); the compiler builds for it.
        wave_size: threads per wave; defaults from the target (:func:`wave_size_for`).
        lds_size: bytes of local memory (LDS) one work-group may use.
        max_workgroup: the most work-items in one work-group (also compiled into every kernel's
            ``amdgpu_flat_work_group_size``: clang's default for OpenCL would be 256).
        device: the ember device name the kernels are for.
    """

    kernel_prefix = "EMBER_KERNEL "
    #: math helpers inline (a render with many calls sets its own, see render_program)
    _out_of_line = False
    buffer_prefix = "__global "
    # local memory and barriers of grouped reductions (GROUP/GROUPTOP), through the prelude's macros
    local_prefix = "EMBER_LOCAL "
    barrier = "EMBER_BARRIER();"
    # through the ember_u_ typedefs of the preamble: aligned like one element, as a view may start anywhere
    vector_syntax = VectorSyntax(load="*((__global const ember_u_{t}*)({buf} + {idx}))",
                                 store="*((__global ember_u_{t}*)({buf} + {idx})) = {value};")
    restrict = "restrict"
    has_local = True
    has_shared = True
    parallel_threads = 1
    supports_float16 = True

    def __init__(self, arch: str = "gfx1100", *, wave_size: int | None = None, lds_size: int = 65536,
                 max_workgroup: int = 1024, device: str = "AMD"):
        default_wave = wave_size_for(arch)
        self.arch = arch
        self.device = device
        self.wave_size = default_wave if wave_size is None else int(wave_size)
        if self.wave_size not in (32, 64):
            raise ValueError(f"wave size must be 32 or 64, got {self.wave_size}")
        self.max_workgroup = int(max_workgroup)
        if not 1 <= self.max_workgroup <= 1024:
            raise ValueError(f"max_workgroup must be in [1, 1024] (the hardware's limit), got {self.max_workgroup}")
        self.shared_max = int(lds_size)
        self.local_max = (self.max_workgroup,) * 3
        # a dispatch's grid is 32-bit per dimension (AQL grid sizes, PM4 group counts); ids are 32-bit values
        self.global_max = (2 ** 32 - 1,) * 3
        self.tensor_cores = tensor_cores_for(arch) if self.wave_size == 32 else ()
        self.variant = f"{arch}:w{self.wave_size}:wg{self.max_workgroup}"
        self.supported_dtypes = frozenset(dtypes.fields().values())
        self.type_map = dict(_BASE_TYPES)
        # OpenCL C's vectors of the types a buffer holds as they are computed, up to 16 bytes (one load)
        self.vector_widths = {dt: tuple(n for n in (2, 4) if n * dt.itemsize <= 16) for dt in _VECTOR_ALIGN}

    @classmethod
    def from_properties(cls, properties: Mapping[str, int], device: str = "AMD") -> AMDRenderer:
        """A renderer for a KFD topology node (``/sys/class/kfd/kfd/topology/nodes/N/properties``).

        Reads ``gfx_target_version`` (e.g. 110000 -> gfx1100, 90402 -> gfx942) and ``lds_size_in_kb``. The wave
        size is the target's default, the one clang compiles for (RDNA could also run wave64 code, which ember
        does not build). ``ValueError`` when the node has no gfx target (a CPU node).
        """
        version = properties.get("gfx_target_version")
        if not isinstance(version, int) or version <= 0:
            raise ValueError(f"KFD node properties lack a gfx_target_version (got {version!r}): not a GPU node")
        major, minor, step = version // 10000, (version // 100) % 100, version % 100
        arch = f"gfx{major}{minor:x}{step:x}"
        lds_kb = properties.get("lds_size_in_kb", 64)
        return cls(arch, lds_size=int(lds_kb) * 1024, device=device)

    def __repr__(self) -> str:
        return f"<AMDRenderer {self.arch} wave{self.wave_size} for {self.device}>"

    # --- types --------------------------------------------------------------------------------
    def storage_type(self, dt: DType) -> str:
        """The element type of a buffer of ``dt``."""
        if dt == dtypes.bool:
            return "uchar"
        if dt in (dtypes.float16, dtypes.bfloat16):
            return "ushort"
        return self.render_dtype(dt)

    # --- kernel -------------------------------------------------------------------------------
    def render_program(self, name: str, uops: list[UOp]) -> str:
        """Render ``uops`` as the OpenCL C source of a kernel called ``name``."""
        global_ranges = [u for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"]
        if len(global_ranges) > len(_DIMS):
            raise ValueError(f"kernel {name} has {len(global_ranges)} global loops; a dispatch has at most "
                             f"{len(_DIMS)} dimensions")
        n = len(global_ranges)
        self._dims = {r: n - 1 - i for i, r in enumerate(global_ranges)}
        calls = sum(1 for u in uops if u.op in _LIB_MATH and isinstance(u.dtype, DType) and u.dtype.kind == "f")
        self._out_of_line = calls > MAX_INLINE_MATH
        return super().render_program(name, uops)

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        """The kernel: buffers first (parameter i is buffer i; an untouched buffer below a used one still gets a
        parameter), then each int variable as a ``long``."""
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
                t = self.render_dtype(dt)
                args.append(f"const long {pname}_arg")
                head.append(f"  const {t} {pname} = ({t}){pname}_arg;")
        code = "\n".join([f"{self.kernel_prefix}void {name}({', '.join(args)}) {{", *head, *body, "}", ""])
        return self._preamble(code) + code

    def _preamble(self, code: str) -> str:
        """The prelude block of macros, then the extension pragma and the helpers the kernel uses."""
        parts = [_ids_block(True, self.max_workgroup)]
        if "EMBER_WMMA" in code:
            parts.append(_wmma_block(True))
        # the vector types loads and stores go through, aligned like one element (a view into a buffer may
        # start anywhere); where the address is aligned the load is still one instruction
        for name in sorted(set(re.findall(r"ember_u_([a-z]+)(\d+)\b", code))):
            t = "".join(name)
            parts.append(f"typedef {t} ember_u_{t} __attribute__((aligned({_VECTOR_ALIGN_BY_NAME[name[0]]})));")
        helpers = helpers_for(code)
        if "double" in code or "double" in helpers:
            parts.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        if helpers:
            parts.append(helpers)
        return "\n".join(parts) + "\n"

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        """A global RANGE is this work-item's index along its launch dimension, guarded by the range's end."""
        if u.arg[1] != "global":
            return super().render_range_open(u, var, start, end, parallel)
        t = self.render_dtype(u.value_dtype)
        d = self._dims[u]
        at_zero = u.src[0].op is Ops.CONST and u.src[0].arg == 0  # (a 64-bit zero is spelled 0L)
        index = f"({t})EMBER_GLOBAL_ID({d})" if at_zero else f"({start} + ({t})EMBER_GLOBAL_ID({d}))"
        return [f"const {t} {var} = {index};", f"if ({var} < {end}) {{"]

    def render_range_close(self, u: UOp) -> list[str]:
        return ["}"]

    # --- tensor cores ------------------------------------------------------------------------
    def tensor_core_layout(self, tc: TensorCore, operand: str, lane: Any, element: int) -> tuple[Any, Any]:
        """Where RDNA3 WMMA keeps its elements in wave32 (see :data:`_WMMA_LAYOUT`): A[lane % 16][i] and
        B[i][lane % 16] (lanes 16-31 repeat lanes 0-15), D[2 * i + lane // 16][lane % 16]."""
        if tc not in self.tensor_cores:
            raise ValueError(f"{tc.name} is not a tensor core of {self!r}")
        if operand == "A":
            return lane % 16, element
        if operand == "B":
            return element, lane % 16
        if operand == "C":
            return lane // 16 + 2 * element, lane % 16
        raise ValueError(f"tensor-core operand must be 'A', 'B' or 'C', got {operand!r}")

    def render_wmma(self, u: UOp, srcs: list[str], fresh: Callable[[str], str]) -> tuple[str, list[str], list[str]]:
        """One WMMA: the lane's 16 A and 16 B values packed into the operand vectors, D into a ``float8`` (C is
        zero: the kernel sums the instructions' results); the macros of :func:`_wmma_block` spell the builtin."""
        _intrinsic, _dims, _threads, (na, nb, _nc), dtype_in = u.arg[:5]
        kind = {dtypes.float16: "F16", dtypes.bfloat16: "BF16"}.get(dtype_in)
        if kind is None:
            raise ValueError(f"RDNA3 WMMA takes float16 or bfloat16 operands, not {dtype_in}")
        name = fresh("wmma")
        lines = []
        for operand, values in (("a", srcs[:na]), ("b", srcs[na:na + nb])):
            packed = ", ".join(f"EMBER_WMMA_{kind}_IN({v})" for v in values)
            lines.append(f"const EMBER_WMMA_{kind}_VEC {name}_{operand} = (EMBER_WMMA_{kind}_VEC)({packed});")
        lines.append(f"const float8 {name} = EMBER_WMMA_{kind}({name}_a, {name}_b, (uint)({srcs[na + nb]}));")
        return name, lines, ["EMBER_WMMA_SCRATCH;"]

    # --- loads and stores ---------------------------------------------------------------------
    def render_load_value(self, buf: str, idx: str, dt: DType) -> str:
        if dt == dtypes.float16:
            return f"ember_f16_to_f32({buf}[{idx}])"
        return super().render_load_value(buf, idx, dt)

    def render_store_value(self, value: str, dt: DType) -> str:
        if dt == dtypes.float16:
            return f"ember_f32_to_f16({value})"
        return super().render_store_value(value, dt)

    # --- literals and ops ---------------------------------------------------------------------
    def render_const(self, value: object, dt: DType) -> str:
        if dt.kind == "f" and not math.isfinite(float(value)):  # type: ignore[arg-type]
            v = float(value)  # type: ignore[arg-type]
            if dt == dtypes.float64:
                bits = "0x7ff8000000000000L" if math.isnan(v) else ("0x7ff0000000000000L" if v > 0
                                                                   else "(long)0xfff0000000000000UL")
                return f"as_double({bits})"
            return f"as_float({'0x7fc00000u' if math.isnan(v) else ('0x7f800000u' if v > 0 else '0xff800000u')})"
        if dt.kind in "iu":
            iv = int(value)  # type: ignore[call-overload]
            t = self.render_dtype(dt)
            if dt.kind == "i" and iv == -(2 ** (dt.bitsize - 1)):
                return f"(({t})({iv + 1}{'L' if dt.itemsize == 8 else ''} - 1))"
            suffix = {8: "UL" if dt.kind == "u" else "L", 4: "u" if dt.kind == "u" else ""}.get(dt.itemsize, "")
            return f"(({t}){iv})" if dt.itemsize < 4 else f"{iv}{suffix}"
        return super().render_const(value, dt)

    def math_fn(self, op: Ops, dt: DType) -> Callable[..., str]:
        """sqrt and trunc are single instructions (clang builtins); the rest are :mod:`ember_amd.kernel_lib`
        helpers in double precision, rounded once to float for float32 and the 16-bit floats."""
        if op in (Ops.SQRT, Ops.TRUNC):
            fn = "__builtin_sqrt" if op is Ops.SQRT else "__builtin_trunc"
            return (lambda *a: f"{fn}({', '.join(a)})") if dt == dtypes.float64 else \
                (lambda *a: f"{fn}f({', '.join(a)})")
        out_of_line = self._out_of_line
        if op is Ops.MOD and dt != dtypes.float64 and not out_of_line:
            return lambda *a: f"ember_fmodf({', '.join(a)})"
        fn = _LIB_MATH[op] + ("_call" if out_of_line else "")
        if dt == dtypes.float64:
            return lambda *a: f"{fn}({', '.join(a)})"
        return lambda *a: f"((float){fn}({', '.join(f'(double){x}' for x in a)}))"

    def render_alu(self, u: UOp, a: list[str]) -> str:
        op, dt, sdt = u.op, u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if op in _LIB_MATH and sdt.kind == "f":
            expr = self.math_fn(op, dt)(*a)
        elif op is Ops.IDIV and dt.kind == "f":
            quotient = round_result(dt, f"({a[0]} / {a[1]})", _HELD_IN_FLOAT)
            expr = f"__builtin_trunc({quotient})" if dt == dtypes.float64 else f"__builtin_truncf({quotient})"
        elif op is Ops.RECIP and dt.kind == "f":
            expr = f"(1.0 / {a[0]})" if dt == dtypes.float64 else f"(1.0f / {a[0]})"
        else:
            expr = super().render_alu(u, a)
        return round_result(dt, expr, _HELD_IN_FLOAT, op)

    def render_cast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if dt == dtypes.float16:
            if sdt.kind == "b":
                return f"({x} ? 1.0f : 0.0f)"
            if sdt == dtypes.float64 or (sdt.kind in "iu" and sdt.itemsize >= 4):
                # one rounding: a 32-bit int is exact in double, and a 64-bit one beyond 2**53 is infinite in half
                return f"ember_f16_to_f32(ember_f64_to_f16((double){x}))"
            return f"ember_f16_round((float){x})"
        return super().render_cast(u, x)

    def render_bitcast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if sdt == dtypes.bfloat16:
            bits = f"ember_f32_to_bf16({x})"
        elif sdt == dtypes.float16:
            bits = f"ember_f32_to_f16({x})"
        elif sdt == dtypes.bool:
            bits = f"((uchar){x})"
        else:
            bits = x
        if dt == dtypes.bfloat16:
            return f"ember_bf16_to_f32(as_ushort({bits}))"
        if dt == dtypes.float16:
            return f"ember_f16_to_f32(as_ushort({bits}))"
        if dt == dtypes.bool:
            return f"(as_uchar({bits}) != 0)"
        return f"as_{self.render_dtype(dt)}({bits})"
