"""The CPU plugin's C dialect: one uniform entry point per kernel, OpenMP on the outer loop.

The C it writes is what the IR says: an upcast tile along a contiguous axis arrives as vector loads, vector
arithmetic and accumulator vectors (see :mod:`ember.codegen.vectorize`; :attr:`CPURenderer.vector_widths` and
:attr:`CPURenderer.vector_alu`) and is written with GCC/clang vector types. Speed besides comes from ``omp simd``
on unit-stride loops and reductions, and branch-free float32 ``exp``/``exp2`` that vectorize where the C library's
scalar calls would not.

float16 is ``_Float16`` where the compiler has it and converts correctly (see
:mod:`ember_cpu.toolchain`); elsewhere (``float16="emulated"``) a float16 buffer holds 16-bit
patterns, values are ``float``, conversions are ember's own branch-free C (round to nearest even,
denormals, inf and nan; float64 rounds to half directly, never through float) and every float16
result is rounded to half precision, which gives the answers of half arithmetic.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

from ember.renderer import (
    C_PREAMBLE,
    CStyleRenderer,
    DType,
    GroupOp,
    Ops,
    PtrDType,
    UOp,
    dtypes,
    round_result,
    split_terms,
    term_coeff,
    toposort,
)
from ember_cpu.compiler import host_cpu, host_machine

#: float32 exp and exp2 through float64: 2**y = 2**k * 2**f with k = round(y), |f| <= 1/2, 2**f a
#: degree-8 Taylor polynomial (relative error < 3e-10), one rounding to float at the end. That is
#: within 1 ulp of the exact result for every float32 input (denormal results, overflow to inf and
#: nan included), and branch-free, so loops calling it vectorize.
CPU_MATH = """#ifndef EMBER_CPU_MATH
#define EMBER_CPU_MATH
static inline float ember_exp2_to_f32(double y) {
  double c = y < 200.0 ? y : 200.0;
  c = c > -200.0 ? c : -200.0;
  double t = c + 0x1.8p52;
  double k = t - 0x1.8p52;
  double u = (c - k) * 0x1.62e42fefa39efp-1;
  double p = 1.0 + u * (1.0 + u * (0x1p-1 + u * (0x1.5555555555555p-3 + u * (0x1.5555555555555p-5
             + u * (0x1.1111111111111p-7 + u * (0x1.6c16c16c16c17p-10 + u * (0x1.a01a01a01a01ap-13
             + u * 0x1.a01a01a01a01ap-16)))))));
  unsigned long long bits; __builtin_memcpy(&bits, &t, 8);
  bits = (bits + 1023ull) << 52;
  double s; __builtin_memcpy(&s, &bits, 8);
  float r = (float)(p * s);
  return y == y ? r : (float)y;
}
static inline float ember_expf(float x) { return ember_exp2_to_f32((double)x * 0x1.71547652b82fep0); }
static inline float ember_exp2f(float x) { return ember_exp2_to_f32((double)x); }
#endif
"""


#: float16 <-> float conversions without a runtime-library helper (bit-exact with numpy's)
HALF_HELPERS = """#ifndef EMBER_F16_HELPERS
#define EMBER_F16_HELPERS
static inline float ember_f16_to_f32(unsigned short h) {
  unsigned int o = ((unsigned int)h & 0x7fffu) << 13, s = ((unsigned int)h & 0x8000u) << 16, u;
  float f; __builtin_memcpy(&f, &o, 4);
  f *= 0x1p112f;  /* rebias the exponent; exact for normals and denormals alike */
  __builtin_memcpy(&u, &f, 4);
  if (o >= 0x0f800000u) u |= 0x7f800000u;  /* inf and nan */
  u |= s; __builtin_memcpy(&f, &u, 4); return f; }
static inline unsigned short ember_f32_to_f16(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  unsigned int s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, out;
  if (a > 0x7f800000u) out = 0x7e00u | ((a >> 13) & 0x3ffu);  /* nan stays nan */
  else if (a >= 0x477ff000u) out = 0x7c00u;  /* 65520 and up round to inf */
  else if (a < 0x38800000u) { float v; __builtin_memcpy(&v, &a, 4);  /* a half denormal */
    out = (unsigned int)((v * 0x1p24f + 0x1p23f) - 0x1p23f); }
  else out = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  return (unsigned short)(out | s); }
static inline unsigned short ember_f64_to_f16(double d) {
  unsigned long long u; __builtin_memcpy(&u, &d, 8);
  unsigned long long a = u & 0x7fffffffffffffffull, out;
  unsigned int s = (unsigned int)(u >> 48) & 0x8000u;
  if (a > 0x7ff0000000000000ull) out = 0x7e00u | ((a >> 42) & 0x3ffu);
  else if (a >= 0x40effe0000000000ull) out = 0x7c00u;
  else if (a < 0x3f10000000000000ull) { double v; __builtin_memcpy(&v, &a, 8);
    out = (unsigned long long)((v * 0x1p24 + 0x1p52) - 0x1p52); }
  else out = (a - 0x3f00000000000000ull + 0x1ffffffffffull + ((a >> 42) & 1u)) >> 42;
  return (unsigned short)(out | s); }
static inline float ember_f16_round(float f) { return ember_f16_to_f32(ember_f32_to_f16(f)); }
#endif
"""

#: the largest UNROLL of a reduction along a contiguous axis still vectorized as a reduction (its loads move by
#: the unroll; gcc deinterleaves them into one vector per accumulator)
MAX_SIMD_UNROLL = 8



#: gcc's -O2 vectorizer cost model ("very cheap") leaves a register tile scalar when its loop body does more than
#: multiply-add (a relu recomputed on the loaded values: 40x slower); its "cheap" model vectorizes it. Fused
#: tiles ask for it (clang ignores the attribute and vectorizes them anyway).
FUSED_TILE_ATTR = """#ifndef EMBER_FUSED_TILE
#if defined(__GNUC__) && !defined(__clang__)
#define EMBER_FUSED_TILE __attribute__((optimize("vect-cost-model=cheap")))
#else
#define EMBER_FUSED_TILE
#endif
#endif
"""

#: a fused tile whose reduction loop reads some input with a stride past one element (a weight gradient, the
#: reduction over rows): under the "cheap" model gcc also vectorizes that loop, across the reduction, building each
#: vector of strided elements with permutes of whole rows. The tile's own vectors are what pays: such kernels keep
#: the cost model and leave the loop to the tile. Declared only in the kernels that use it, so other kernels'
#: sources stay as they were.
STRIDED_TILE_ATTR = """#ifndef EMBER_STRIDED_TILE
#if defined(__GNUC__) && !defined(__clang__)
#define EMBER_STRIDED_TILE __attribute__((optimize("vect-cost-model=cheap", "no-tree-loop-vectorize")))
#else
#define EMBER_STRIDED_TILE
#endif
#endif
"""


def _strided_reduce(uops: list[UOp]) -> bool:
    """Whether an innermost reduction loop that updates accumulators has a load moving along it by more than one
    element (or through ``/`` or ``%``): vectorizing that loop means gathering, never plain vector loads."""
    last_open: UOp | None = None
    innermost: set[UOp] = set()
    for u in uops:
        if u.op is Ops.RANGE:
            last_open = u
        elif u.op is Ops.ENDRANGE and u.src[0] is last_open and last_open.arg[1] == "reduce":
            innermost.add(last_open)
    if not innermost:
        return False
    for u in uops:
        if u.op is Ops.LOAD:
            affine, hidden = _index_terms(u.src[1])
            if any(r in hidden or affine.get(r, 0) not in (0, 1) for r in innermost if r in affine or r in hidden):
                return True
    return False


def _fused_tile(uops: list[UOp], in_loop: bool = False) -> bool:
    """A register tile (several accumulators) with float work besides one multiply-add per accumulator update:
    inside its loops (``in_loop``), or anywhere (float work after the loop counts).

    gcc (12) vectorizes a tile's accumulators only when the loop's results go straight to a group of stores:
    with anything computed from them after the loop (a fused relu mask, a bias, an SGD update) the whole tile
    stays scalar, 20-40x slower. Such tiles store their accumulators to an array right after the loop (see
    :meth:`CPURenderer.render_loop_results`), which is that group of stores."""
    updates = sum(1 for u in uops if u.op is Ops.ASSIGN)
    if updates < 2:
        return False
    inside, outside, depth = 0, 0, 0
    for u in uops:
        # (a rolled epilogue's loop is work after the tile's loop)
        if u.op is Ops.RANGE and u.arg[1] not in ("global", "loop"):
            depth += 1
        elif u.op is Ops.ENDRANGE and u.src[0].arg[1] not in ("global", "loop"):
            depth -= 1
        elif u.op in GroupOp.ALU and isinstance(u.dtype, DType) and u.dtype.kind == "f":
            if depth:
                inside += 1
            else:
                outside += 1
    # a multiply-add (or a plain sum) per update is what a tile's loop body does by itself
    return inside > 2 * updates if in_loop else (outside > 0 or inside > 2 * updates)


@functools.cache
def host_vector_registers() -> tuple[int, int]:
    """(float32 lanes per vector register, number of vector registers) of the machine ``-march=native`` targets."""
    machine = host_machine()
    if machine in ("aarch64", "arm64"):
        return 4, 32
    if machine not in ("x86_64", "amd64", "i386", "i686"):
        return 4, 16
    flags = set(host_cpu().get("flags", "").split())
    if "avx512f" in flags:
        return 16, 32
    if "avx" in flags:
        return 8, 16
    return 4, 16


def host_vector_widths() -> dict[DType, tuple[int, ...]]:
    """The float32 and float64 vector widths from one SSE/NEON register (16 bytes: a narrower vector is no faster
    than its scalars) up to one vector register of the host (see :func:`host_vector_registers`)."""
    nbytes = host_vector_registers()[0] * 4
    return {dt: tuple(n for n in (2, 4, 8, 16) if 16 <= n * dt.itemsize <= nbytes)
            for dt in (dtypes.float32, dtypes.float64)}


def _index_terms(idx: UOp) -> tuple[dict[UOp, int], set[UOp]]:
    """The loops an index walks affinely (with their coefficients) and the loops hidden in other terms."""
    affine: dict[UOp, int] = {}
    hidden: set[UOp] = set()
    for t in split_terms(idx):
        var, c = term_coeff(t)
        if var is not None and var.op is Ops.RANGE:
            affine[var] = affine.get(var, 0) + c
        elif var is not None:
            hidden.update(n for n in toposort([var]) if n.op is Ops.RANGE)
    return affine, hidden


def _kernel_steps(uops: list[UOp]) -> int:
    """About how many elements a kernel computes: its loops' trip counts multiplied (a loop of symbolic length
    counts as long), times the copies its body computes per step (an upcast tile's outputs, an unrolled
    reduction's accumulators)."""
    steps, stores, per_store = 1, 0, [1]
    for u in uops:
        if u.op is Ops.RANGE:
            lo, hi = u.src
            size = hi.arg - lo.arg if lo.op is Ops.CONST and hi.op is Ops.CONST else 1 << 20
            if u.arg[1] == "loop":  # a rolled epilogue: its store is one per lane of the tile
                per_store.append(per_store[-1] * size)
            else:
                steps *= size
        elif u.op is Ops.ENDRANGE and u.src[0].arg[1] == "loop":
            per_store.pop()
        elif u.op is Ops.STORE:
            stores += per_store[-1]
    copies = max(stores, sum(u.op is Ops.DEFINE_ACC for u in uops), 1)
    return steps * copies


class CPURenderer(CStyleRenderer):
    """Plain C for the host compiler.

    Every kernel has the signature ``void NAME(void** bufs, const long long* vals)`` so the
    runtime and the batched graph call all kernels the same way.
    """

    device = "CPU"
    preamble = C_PREAMBLE + CPU_MATH
    has_local = False
    parallel_threads = os.cpu_count() or 1
    #: the register file register tiles are sized for (see :func:`ember.codegen.heuristic.heuristic_opts`)
    vector_floats, vector_registers = host_vector_registers()
    #: float32 and float64 vectors up to one vector register: an upcast tile along a contiguous axis is vector loads,
    #: arithmetic and accumulators in the IR itself (see :mod:`ember.codegen.vectorize`), GCC/clang vector code
    vector_widths = host_vector_widths()
    vector_alu = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX})
    #: a tile's epilogue of this many lanes or more is a loop (see :mod:`ember.codegen.epilogue`): gcc builds the
    #: unrolled statements of a 32 x 8 tile in several times the time of the rest of the kernel
    epilogue_loop_min = 64
    #: an innermost loop shorter than this is left scalar
    simd_min_trip = 8
    #: a kernel of fewer steps than this (see :func:`_kernel_steps`) gets no ``omp simd``: an MLP's
    #: 256 x 10 softmax kernels and 10-element bias initialization, ~1 us either way, built ~5 ms faster each
    simd_min_work = 4096
    #: a register tile of a float max along a non-contiguous axis is accumulator vectors (one vector max per
    #: step, see :mod:`ember.codegen.vectorize`), so the heuristic may make it wider than the register file
    vector_max_tiles = True
    # the codegen and frontend policy (see ember.renderer.Renderer), tuned on gcc and clang at -O2 for x86-64
    # (AVX2, AVX-512) and aarch64 on 2-16 cores: what a register tile costs to compile against what it saves
    max_tile_ops = 1536
    small_kernel_work, small_kernel_tile = 1 << 22, 64
    tiny_kernel_work = 1 << 13
    small_shared_tile = 2
    thread_min_work = 1 << 17
    wide_sum_min_work = 1 << 22
    row_max_unroll = 2
    transpose_min_size, transpose_tile = 1 << 14, (8, 2)
    # the compiler vectorizes a register tile's row only when an operand is contiguous along it: the frontend
    # copies matmul operands and convolution inputs into such layouts where the copy costs less than it saves
    matmul_copy_min_macs, matmul_copy_min_dim = 1 << 21, 64
    matmul_copy_min_k_across, matmul_copy_min_outputs_across = 1024, 1 << 17
    conv_pad_copy_min, conv_channels_last = 1 << 16, True

    def __init__(self, float16: str = "native"):
        """``float16``: "native" (``_Float16``) or "emulated" (16-bit storage, float arithmetic rounded to half)."""
        if float16 not in ("native", "emulated"):
            raise ValueError(f"float16 must be 'native' or 'emulated', got {float16!r}")
        self.float16 = float16
        self.variant = f"float16={float16}"
        if self.emulated_half:
            self.type_map = {**self.type_map, dtypes.float16: "float"}
            self.preamble = self.preamble + HALF_HELPERS

    @property
    def emulated_half(self) -> bool:
        """Whether float16 lives in 16-bit storage with float arithmetic."""
        return self.float16 == "emulated"

    def _is_soft_half(self, dt: object) -> bool:
        return self.emulated_half and dt == dtypes.float16

    def storage_type(self, dt: DType) -> str:
        return "unsigned short" if self._is_soft_half(dt) else super().storage_type(dt)

    def render_load_value(self, buf: str, idx: str, dt: DType) -> str:
        if self._is_soft_half(dt):
            return f"ember_f16_to_f32({buf}[{idx}])"
        return super().render_load_value(buf, idx, dt)

    def render_store_value(self, value: str, dt: DType) -> str:
        return f"ember_f32_to_f16({value})" if self._is_soft_half(dt) else super().render_store_value(value, dt)

    def render_alu(self, u: UOp, a: list[str]) -> str:
        expr = super().render_alu(u, a)
        return round_result(u.dtype, expr, (dtypes.float16,) if self.emulated_half else (), u.op)

    def render_cast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        if self._is_soft_half(dt) and isinstance(sdt, DType):
            if sdt == dtypes.float64:
                return f"ember_f16_to_f32(ember_f64_to_f16({x}))"
            return f"((float){x})" if sdt.kind == "b" or sdt == dtypes.float16 else f"ember_f16_round((float){x})"
        return super().render_cast(u, x)

    def render_bitcast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        if not (self._is_soft_half(dt) or self._is_soft_half(sdt)):
            return super().render_bitcast(u, x)
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        src_t, dst_t = self.storage_type(sdt), self.storage_type(dt)
        val = {dtypes.float16: f"ember_f32_to_f16({x})", dtypes.bfloat16: f"ember_f32_to_bf16({x})"}.get(sdt, x)
        out = f"({{ {src_t} s_ = {val}; {dst_t} d_; __builtin_memcpy(&d_, &s_, sizeof(d_)); d_; }})"
        return {dtypes.float16: f"ember_f16_to_f32({out})", dtypes.bfloat16: f"ember_bf16_to_f32({out})"}.get(dt, out)

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        head: list[str] = []
        nvar = 0
        for pname, dt in params:
            if isinstance(dt, PtrDType):
                t = self.storage_type(dt.base)
                head.append(f"  {t}* {self.restrict} {pname} = ({t}*)bufs[{pname[4:]}];")
            else:
                t = self.render_dtype(dt)
                head.append(f"  const {t} {pname} = ({t})vals[{nvar}];")
                nvar += 1
        head += list(self._declared.values())
        attr, preamble = "", self.preamble + FUSED_TILE_ATTR
        if _fused_tile(uops, in_loop=True):
            attr = "EMBER_FUSED_TILE "
            if _strided_reduce(uops):
                attr, preamble = "EMBER_STRIDED_TILE ", preamble + STRIDED_TILE_ATTR
        return "\n".join([preamble, f"{attr}void {name}(void** bufs, const long long* vals) {{",
                          *head, *body, "}", ""])

    def math_fn(self, op: Ops, dt: DType) -> Callable[..., str]:
        if op in (Ops.EXP, Ops.EXP2) and dt != dtypes.float64:
            # the float32 (and narrower, computed in float32) exp that vectorizes; float64 keeps the C library's
            fn = "ember_expf" if op is Ops.EXP else "ember_exp2f"
            if dt == dtypes.float16:
                return lambda x: f"(({self.render_dtype(dt)}){fn}((float){x}))"
            return lambda x: f"{fn}({x})"
        return super().math_fn(op, dt)

    def render_program(self, name: str, uops: list[UOp]) -> str:
        """The kernel's C. Runs on a per-kernel copy of the renderer (see :meth:`ember.renderer.Renderer.render`):
        every attribute set from here on (loop strides, register tiles, their names) belongs to this kernel."""
        # how every load and store walks each loop: unit-stride loops vectorize
        load_strides: dict[UOp, set[int]] = {}
        walks: dict[UOp, set[int]] = {}
        stored: dict[UOp, set[int]] = {}
        hidden: set[UOp] = set()
        for u in uops:
            if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is not Ops.DEFINE_REG:
                affine, inside = _index_terms(u.src[1])
                hidden |= inside
                for r, c in affine.items():
                    walks.setdefault(r, set()).add(c)
                    (load_strides if u.op is Ops.LOAD else stored).setdefault(r, set()).add(c)
        # a kernel of few steps runs in about a microsecond whatever its code: its loops are not forced into vector
        # code, whose vector and remainder loops cost the compiler several ms (the compiler may still vectorize)
        tiny = _kernel_steps(uops) < self.simd_min_work
        if tiny:
            load_strides = {}
        # loops along which every load that moves moves by one element: worth vectorizing as a reduction
        self.unit_stride_ranges = {r for r, cs in load_strides.items() if cs == {1}}
        # loops along which every load that moves moves by the same few elements: an unrolled reduction whose
        # copies read neighbouring elements (UNROLL k), vectorized when it has just those k accumulators
        self.unrolled_ranges = {r: next(iter(cs)) for r, cs in load_strides.items()
                                if len(cs) == 1 and 1 < next(iter(cs)) <= MAX_SIMD_UNROLL}
        # innermost global loops that every store walks with stride 1 and every load with 0 or 1 (never through / or %)
        innermost: set[UOp] = set()
        last_open: UOp | None = None
        for u in uops:
            if u.op is Ops.RANGE:
                last_open = u
            elif u.op is Ops.ENDRANGE and u.src[0] is last_open:
                innermost.add(last_open)
        self.simd_ranges = set() if tiny else {r for r in innermost if r.arg[1] in ("global", "loop")
                            and r not in hidden
                            and stored.get(r) == {1} and walks[r] <= {1} and r.src[1].op is Ops.CONST
                            and r.src[1].arg - r.src[0].arg >= self.simd_min_trip}
        self._declared: dict[str, str] = {}
        self._thread_accs: list[tuple[str, Ops | None, DType]] = []
        self._fused, self._tiles = _fused_tile(uops), 0
        return super().render_program(name, uops)

    def _reduction_clauses(self, accs: list[tuple[str, Ops | None, DType]]) -> list[str] | None:
        """OpenMP ``reduction`` clauses for ``accs``, or None when one has no OpenMP combiner. A float max uses
        a declared reduction (emitted at function scope) that keeps a nan, as the scalar loop would."""
        clauses: list[str] = []
        for name, op, dt in accs:
            if op is Ops.ADD:
                clauses.append(f"reduction(+:{name})")
            elif op is Ops.MUL:
                clauses.append(f"reduction(*:{name})")
            elif op is Ops.MAX and dt.kind == "f":
                t = self.render_dtype(dt)
                red = f"ember_max_{t.replace(' ', '_')}"
                # declared once at function scope (render_kernel), visible to every loop of the kernel
                self._declared[red] = (f"  #pragma omp declare reduction({red} : {t} : omp_out = (omp_in > omp_out"
                                       " || omp_in != omp_in) ? omp_in : omp_out) initializer(omp_priv = omp_orig)")
                clauses.append(f"reduction({red}:{name})")
            elif op is Ops.MAX:
                clauses.append(f"reduction(max:{name})")
            else:
                return None
        return clauses

    def _thread_loop(self, loop: str) -> list[str]:
        """A THREAD loop: its parts of a full reduction run on different cores, each into a private copy of the
        accumulators, combined at the end."""
        # the accumulators of enclosing reduce loops are updated in here too: each needs its own clause,
        # or the cores race on it (a THREAD loop inside another reduce loop)
        found = self._reduction_clauses(self.live_accs)
        if found is None:
            raise NotImplementedError(f"{type(self).__name__}: a THREAD loop cannot combine {self.live_accs}")
        clauses = found
        # the reduction loop inside works on each thread's private copies: it may still vectorize them
        self._thread_accs = self.loop_accs
        return [f"#pragma omp parallel for schedule(static) {' '.join(clauses)}", loop]

    def render_loop_results(self, accs: list[str], dts: list[DType]) -> tuple[list[str], list[str]]:
        """In a fused register tile of scalar accumulators, the accumulators of a loop are stored to an array the
        code after it reads (the compiler barrier keeps the stores, so the compiler sees one contiguous group of
        them). Accumulator vectors are left as they are: they are the vector code already."""
        if not self._fused or len(accs) < 2 or len(set(dts)) != 1 or dts[0].count != 1:
            return [], accs
        self._tiles += 1
        tile = f"tile{self._tiles - 1}"
        lines = [f"{self.render_dtype(dts[0])} {tile}[{len(accs)}];"]
        lines += [f"{tile}[{j}] = {a};" for j, a in enumerate(accs)]
        lines.append(f'__asm__ volatile("" : : "r"({tile}) : "memory");')
        return lines, [f"{tile}[{j}]" for j in range(len(accs))]

    def render_reg(self, name: str, dt: DType, size: int, vals: list[tuple[str, DType]]) -> list[str]:
        """A rolled epilogue's array, filled with one copy per vector (rather than a statement per lane)."""
        lines = [f"{self.render_dtype(dt)} {name}[{size}];"]
        at = 0
        for v, vdt in vals:
            lines.append(f"__builtin_memcpy(&{name}[{at}], &{v}, sizeof({v}));" if vdt.count != 1
                         else f"{name}[{at}] = {v};")
            at += vdt.count
        return lines

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        loop = f"for ({self.render_dtype(u.value_dtype)} {var} = {start}; {var} < {end}; {var}++) {{"
        simd = u in self.simd_ranges
        if u.arg[1] == "thread":
            return self._thread_loop(loop)
        if parallel:
            return [f"#pragma omp parallel for{' simd' if simd else ''} schedule(static)", loop]
        if simd:
            return ["#pragma omp simd", loop]
        accs = self.loop_accs or self._thread_accs
        self._thread_accs = []
        if not accs and u.arg[1] == "reduce" and u.src[1].op is Ops.CONST and u.src[0].op is Ops.CONST and \
                u.src[1].arg - u.src[0].arg >= self.simd_min_trip:
            # the inner loop of a reduction over several axes (a convolution's weight gradient: batch, rows,
            # columns): its accumulators were opened before the outermost of them, and it is the loop that walks
            # memory with unit stride. A short one (a 3-wide kernel row inside a register tile) stays as it is:
            # lanes over 3 steps would only break up the tile's own vectors
            accs = self.live_accs
        floats = all(op in (Ops.ADD, Ops.MAX) and dt in (dtypes.float32, dtypes.float64) for _, op, dt in accs)
        # an unrolled row reduction (one output, k accumulators over interleaved elements): k vector chains (gcc
        # deinterleaves the loads), where one vector max chain is bound by its compare-and-blend latency (a
        # 4096^2 row max, UNROLL 2: 0.73x the CPU time). A register tile besides is left as it is
        unrolled = self.unrolled_ranges.get(u, 0)
        contiguous = u in self.unit_stride_ranges or (unrolled > 1 and len(accs) == unrolled)
        if u.arg[1] == "reduce" and accs and floats and contiguous:
            # let the compiler reorder this float sum or max into vector lanes (as BLAS and numpy do)
            found = self._reduction_clauses(accs)
            if found is not None:
                return [f"#pragma omp simd {' '.join(found)}", loop]
        return [loop]
