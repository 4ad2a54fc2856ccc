"""OpenCL C helper functions the AMD kernels use in place of an OpenCL library.

Kernels are built with ``-nogpulib``: no ROCm device libraries, so OpenCL's library functions
(``exp``, ``log``, ``sin``, ``pow``, ``fmod``, ``vload_half`` ...) do not exist, and the AMDGPU
backend has no instruction for double-precision ``exp``/``log``/``sin`` ("no libcall available").
What the kernels need is written here in plain OpenCL C: arithmetic, ``as_type`` reinterpretation
and the clang builtins that become single LLVM intrinsics (``sqrt``, ``trunc``, ``rint``,
``fabs``), so the same text also builds for a CPU (the mock GPU compiles kernels with PoCL).

Accuracy (measured against numpy in the tests): double-precision ``exp``, ``exp2``, ``log``, ``log2``
and ``pow`` within 1 ulp (the logarithm is carried in double-double: log(m) = 2*atanh((m-1)/(m+1));
``pow`` is ``exp(y*log|x|)`` with the product in double-double), ``sin`` within 2 (Cody-Waite reduction
by pi/2 below 2**19, Payne-Hanek above). float32 functions are computed by these in double and rounded once, so they are
within 1 ulp of the exact result. ``fmod`` is exact.

The helpers are inlined; a kernel with many math calls calls the out-of-line ``*_call`` entry points
instead (see :data:`ember_amd.renderer.MAX_INLINE_MATH`). Each helper sits under an include guard
(kernels of a batch are joined into one program); the renderer includes the blocks a kernel names,
with their dependencies (:data:`DEPENDS`).
"""
from __future__ import annotations

#: the text of each helper block, by the function names that select it
HELPERS: dict[str, str] = {}
#: blocks a block needs first
DEPENDS: dict[str, tuple[str, ...]] = {}


def _block(name: str, code: str, needs: tuple[str, ...] = ()) -> None:
    HELPERS[name] = f"#ifndef EMBER_AMD_{name.upper()}\n#define EMBER_AMD_{name.upper()}\n{code.strip()}\n#endif"
    DEPENDS[name] = needs


_block("ldexp", """
/* x * 2**n by exact power-of-two factors (two steps cover the subnormal range) */
static inline double ember_ldexp(double x, int n) {
  n = n > 2200 ? 2200 : (n < -2200 ? -2200 : n);
  while (n > 1023) { x *= 8.98846567431158e307; n -= 1023; }
  while (n < -1022) { x *= 2.2250738585072014e-308; n += 1022; }
  return x * as_double((long)(n + 1023) << 52); }
""")

_block("exp", """
/* e**r for |r| <= 0.35 (Taylor series to r**13: truncation below 1e-17) */
static inline double ember_exp_poly(double r) {
  return 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720 + r * (1.0 / 5040
    + r * (1.0 / 40320 + r * (1.0 / 362880 + r * (1.0 / 3628800 + r * (1.0 / 39916800 + r * (1.0 / 479001600
    + r * (1.0 / 6227020800.0))))))))))))); }
/* e**(x + lo) for a double-double argument (lo below x's last bit), within 1 ulp */
static inline double ember_exp_dd(double x, double lo) {
  if (x != x) return x;
  if (x > 709.79) return as_double(0x7ff0000000000000L);
  if (x < -745.2) return 0.0;
  double k = __builtin_rint(x * 1.4426950408889634);
  /* ln 2 in two parts: k * hi is exact for |k| < 2**11 */
  double r = ((x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10) + lo;
  return ember_ldexp(ember_exp_poly(r), (int)k); }
static inline double ember_exp(double x) { return ember_exp_dd(x, 0.0); }
static inline double ember_exp2(double x) {
  if (x != x) return x;
  if (x > 1024.0) return as_double(0x7ff0000000000000L);
  if (x < -1075.0) return 0.0;
  double k = __builtin_rint(x);
  return ember_ldexp(ember_exp_poly((x - k) * 6.93147180559945309417e-01), (int)k); }
""", ("ldexp",))

_block("log", """
/* the rounding error of a * b (Dekker's product, no fma needed: a and b are split in 26-bit halves) */
static inline double ember_mul_err(double a, double b, double p) {
  double ca = 134217729.0 * a, ah = ca - (ca - a), al = a - ah;
  double cb = 134217729.0 * b, bh = cb - (cb - b), bl = b - bh;
  return ((ah * bh - p) + ah * bl + al * bh) + al * bl; }
/* log(x) for finite x > 0 as hi + *lo (about 2**-60 relative: what pow needs to be within a few ulp) */
static inline double ember_log_dd(double x, double* lo) {
  double e = 0.0;
  if (x < 2.2250738585072014e-308) { x *= 18014398509481984.0; e = -54.0; }
  long bits = as_long(x);
  e += (double)((int)((bits >> 52) & 0x7ff) - 1023);
  double m = as_double((bits & 0x000fffffffffffffL) | 0x3ff0000000000000L);
  if (m > 1.4142135623730951) { m *= 0.5; e += 1.0; }
  double f = m - 1.0;                                              /* exact */
  double u = m + 1.0, ub = u - 1.0, ue = (1.0 - (u - ub)) + (m - ub); /* m + 1 == u + ue exactly */
  double s = f / u, p = s * u;
  double s_lo = (((f - p) - ember_mul_err(s, u, p)) - s * ue) / u;  /* f / (m + 1) == s + s_lo */
  double z = s * s;
  double tail = 2.0 * s * z * (1.0 / 3 + z * (1.0 / 5 + z * (1.0 / 7 + z * (1.0 / 9 + z * (1.0 / 11 + z * (1.0 / 13
    + z * (1.0 / 15 + z * (1.0 / 17 + z * (1.0 / 19 + z * (1.0 / 21 + z * (1.0 / 23)))))))))));
  double a = e * 6.93147180369123816490e-01, b = 2.0 * s, hi = a + b, hb = hi - a;
  double rest = ((a - (hi - hb)) + (b - hb)) + (e * 1.90821492927058770002e-10 + 2.0 * s_lo + tail);
  double h = hi + rest;
  *lo = rest - (h - hi);
  return h; }
static inline double ember_log_special(double x) {
  if (x != x) return x;
  if (x < 0.0) return as_double(0x7ff8000000000000L);
  if (x == 0.0) return as_double(0xfff0000000000000L);
  return x; /* +inf */ }
static inline double ember_log(double x) {
  if (!(x > 0.0) || x == as_double(0x7ff0000000000000L)) return ember_log_special(x);
  double lo;
  return ember_log_dd(x, &lo); }
static inline double ember_log2(double x) {
  if (!(x > 0.0) || x == as_double(0x7ff0000000000000L)) return ember_log_special(x);
  double lo, h = ember_log_dd(x, &lo), p = h * 1.4426950408889634; /* log2(e) = 1.4426950408889634 + 2.0355e-17 */
  return p + (ember_mul_err(h, 1.4426950408889634, p) + (h * 2.0355273740931033e-17 + lo * 1.4426950408889634)); }
""")

def _two_over_pi_chunks(count: int = 56) -> list[int]:
    """The first ``24 * count`` bits of 2/pi after the binary point, 24 bits per chunk (pi by Machin's formula
    in integer fixed point with 40 guard bits)."""
    bits = 24 * count + 40
    one = 1 << bits

    def atan_inv(n: int) -> int:  # atan(1/n) * 2**bits
        total = term = one // n
        k, sign = 1, -1
        while term:
            term //= n * n
            k += 2
            total += sign * (term // k)
            sign = -sign
        return total

    pi = 16 * atan_inv(5) - 4 * atan_inv(239)
    frac = (2 * one * one // pi) >> 40
    return [(frac >> (24 * (count - i - 1))) & 0xFFFFFF for i in range(count)]


_block("sin", f"""
__constant double ember_two_over_pi[56] = {{{", ".join(f"{c}.0" for c in _two_over_pi_chunks())}}};
/* x = n*pi/2 + r for |x| >= 2**19 (Payne-Hanek): x * 2/pi from the 24-bit chunks of x and of 2/pi, with the
   products whose weight makes them multiples of 4 left out; every partial sum is exact in double */
static inline double ember_rem_pio2_large(double x, long* quadrant) {{
  long bits = as_long(x);
  int ex = (int)((bits >> 52) & 0x7ff) - 1023;
  long m = (bits & 0x000fffffffffffffL) | 0x0010000000000000L;
  double xs[3] = {{(double)(m >> 29), (double)((m >> 5) & 0xffffff), (double)((m & 31) << 19)}};
  int e0 = ex - 23;
  int t0 = e0 >= 2 ? (e0 - 2) / 24 : 0;
  double q[7];
  for (int j = 0; j < 7; j++) {{
    int t = t0 + j; double acc = 0.0;
    for (int k = 0; k < 3; k++) if (t - k >= 0) acc += xs[k] * ember_two_over_pi[t - k];
    q[j] = acc;
  }}
  for (int j = 6; j > 0; j--) {{ double c = __builtin_floor(q[j] * 5.9604644775390625e-08); q[j] -= c * 16777216.0;
    q[j - 1] += c; }}
  int s0 = e0 - 24 * (t0 + 1);
  double hi = ember_ldexp(q[0], s0);
  hi -= 4.0 * __builtin_floor(hi * 0.25);
  double n = __builtin_floor(hi), f = hi - n;
  f += ember_ldexp(q[1], s0 - 24);
  double n2 = __builtin_floor(f); n += n2; f -= n2;
  if (f >= 0.5) {{ f -= 1.0; n += 1.0; }} /* exact: the digits below are added after any cancellation */
  f += ember_ldexp(q[2] + (q[3] + (q[4] + (q[5] + q[6] * 5.9604644775390625e-08) * 5.9604644775390625e-08)
                            * 5.9604644775390625e-08) * 5.9604644775390625e-08, s0 - 48);
  *quadrant = (long)n & 3;
  return f * 1.57079632679489655800e+00 + f * 6.12323399573676603587e-17; }}
/* sin(x): x = k*pi/2 + r, |r| <= pi/4 (three-part Cody-Waite below 2**19, else the reduction above), then the
   sin or cos series of r by quadrant */
static inline double ember_sin(double x) {{
  if (x != x || x - x != 0.0) return as_double(0x7ff8000000000000L); /* nan, +-inf */
  if (x == 0.0) return x; /* keeps the sign of -0.0, which the reduction would lose */
  double r; long q;
  if (__builtin_fabs(x) < 524288.0) {{
    double k = __builtin_rint(x * 6.36619772367581382433e-01);
    r = ((x - k * 1.57079632673412561417e+00) - k * 6.07710050630396597660e-11) - k * 2.02226624871116645580e-21;
    q = (long)k & 3;
  }} else {{
    r = ember_rem_pio2_large(__builtin_fabs(x), &q);
    if (x < 0.0) {{ r = -r; q = (4 - q) & 3; }}
  }}
  double z = r * r;
  double s = r + r * z * (-1.0 / 6 + z * (1.0 / 120 + z * (-1.0 / 5040 + z * (1.0 / 362880 + z * (-1.0 / 39916800
    + z * (1.0 / 6227020800.0 + z * (-1.0 / 1307674368000.0 + z * (1.0 / 355687428096000.0))))))));
  double c = 1.0 + z * (-0.5 + z * (1.0 / 24 + z * (-1.0 / 720 + z * (1.0 / 40320 + z * (-1.0 / 3628800
    + z * (1.0 / 479001600.0 + z * (-1.0 / 87178291200.0 + z * (1.0 / 20922789888000.0))))))));
  double v = (q & 1) ? c : s;
  return (q & 2) ? -v : v; }}
""", ("ldexp",))

_block("pow", """
static inline double ember_pow(double x, double y) {
  if (y == 0.0 || x == 1.0) return 1.0;
  if (x != x || y != y) return x + y;
  int neg = as_long(x) < 0;
  int yint = __builtin_trunc(y) == y;
  int yodd = yint && __builtin_fabs(y) < 9007199254740992.0 && ((long)y & 1);
  double ax = __builtin_fabs(x);
  if (x < 0.0 && !yint && ax != as_double(0x7ff0000000000000L)) return as_double(0x7ff8000000000000L);
  if (ax == 1.0) return (neg && yodd) ? -1.0 : 1.0; /* (-1)**(+-inf) == 1 */
  double r;
  if (ax == 0.0 || ax == as_double(0x7ff0000000000000L)) {
    r = (y > 0.0) == (ax != 0.0) ? as_double(0x7ff0000000000000L) : 0.0;
  } else { /* exp(y * log|x|) with the product carried in double-double */
    double l_lo, l = ember_log_dd(ax, &l_lo), p = y * l;
    r = !(__builtin_fabs(p) < 1000.0) ? ember_exp(p) : ember_exp_dd(p, ember_mul_err(y, l, p) + y * l_lo);
  }
  return (neg && yodd) ? -r : r; }
""", ("exp", "log"))

_block("fmod", """
/* exact remainders: subtract |b| scaled by the largest power of two that fits, one exponent step at a time */
static inline double ember_fmod(double a, double b) {
  if (a != a || b != b || a - a != 0.0 || b == 0.0) return as_double(0x7ff8000000000000L);
  double x = __builtin_fabs(a), y = __builtin_fabs(b);
  if (x < y) return a;
  while (x >= y) {
    int ex = (int)((as_long(x) >> 52) & 0x7ff), ey = (int)((as_long(y) >> 52) & 0x7ff);
    double t = (ey == 0 || ex == ey) ? y : ember_ldexp(y, ex - ey);
    while (t + t <= x) t += t; /* y subnormal: doubling is exact */
    if (t > x) t *= 0.5;
    x -= t;
  }
  return a < 0.0 ? -x : x; }
/* float: |a / b| < 2**29 makes trunc(q) * b exact in double (one |b| corrects a quotient that rounded up) */
static inline float ember_fmodf(float a, float b) {
  double q = (double)a / (double)b;
  if (!(__builtin_fabs(q) < 536870912.0)) return (float)ember_fmod((double)a, (double)b);
  double t = __builtin_trunc(q);
  if (t == 0.0) return a;
  double r = (double)a - t * (double)b;
  if (r != 0.0 && ((r < 0.0) != (a < 0.0))) r += (a < 0.0) ? -__builtin_fabs((double)b) : __builtin_fabs((double)b);
  return r == 0.0 ? (a < 0.0 ? -0.0f : 0.0f) : (float)r; }
""", ("ldexp",))

_block("f16", """
/* float16 in ushort storage; round to nearest even; a NaN keeps its sign and top payload bits */
static inline float ember_f16_to_f32(ushort h) {
  uint s = ((uint)h & 0x8000u) << 16, e = ((uint)h >> 10) & 0x1fu, m = (uint)h & 0x3ffu;
  if (e == 0u) { float f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }
  if (e == 31u) return as_float(s | 0x7f800000u | (m << 13));
  return as_float(s | ((e + 112u) << 23) | (m << 13)); }
static inline ushort ember_f32_to_f16(float f) {
  uint u = as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { uint h = sign | 0x7c00u | ((a >> 13) & 0x3ffu); return (ushort)((h & 0x3ffu) ? h : (h | 1u)); }
  if (a >= 0x477ff000u) return (ushort)(sign | 0x7c00u); /* 65520 and up round to infinity */
  if (a < 0x38800000u) return (ushort)(sign | (uint)__builtin_rintf(as_float(a) * 16777216.0f)); /* subnormal */
  uint r = a - 0x38000000u, h = r >> 13, rem = r & 0x1fffu;
  h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
  return (ushort)(sign | h); }
static inline float ember_f16_round(float f) { return ember_f16_to_f32(ember_f32_to_f16(f)); }
/* double to half with one rounding: narrow to float rounding to odd, then to half */
static inline ushort ember_f64_to_f16(double d) {
  float f = (float)d; uint u = as_uint(f);
  if (f == f && (double)f != d) { if (__builtin_fabs((double)f) > __builtin_fabs(d)) u -= 1u; u |= 1u; }
  return ember_f32_to_f16(as_float(u)); }
""")

_block("bf16", """
static inline float ember_bf16_to_f32(ushort b) { return as_float(((uint)b) << 16); }
static inline ushort ember_f32_to_bf16(float f) { uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
static inline float ember_bf16_round(float f) { return ember_bf16_to_f32(ember_f32_to_bf16(f)); }
/* float64 and wide integers to bfloat16 with one rounding (round to odd into float, then to nearest even) */
static inline float ember_bf16_from_f64(double d) { float f = (float)d; uint u = as_uint(f);
  if (f == f && (double)f != d) { if (__builtin_fabs((double)f) > __builtin_fabs(d)) u -= 1u; u |= 1u; }
  return ember_bf16_round(as_float(u)); }
static inline float ember_bf16_from_u64(ulong m, int neg) { int s = (m >> 24) ? 40 - (int)__builtin_clzl(m) : 0;
  ulong q = (m >> s) | (ulong)((m & ((((ulong)1) << s) - (ulong)1)) != (ulong)0);
  float f = (float)q * as_float((uint)(127 + s) << 23); return ember_bf16_round(neg ? -f : f); }
""")

_OUT_OF_LINE = (("ember_exp", "double x", "x"), ("ember_exp2", "double x", "x"), ("ember_log", "double x", "x"),
                ("ember_log2", "double x", "x"), ("ember_sin", "double x", "x"),
                ("ember_pow", "double x, double y", "x, y"), ("ember_fmod", "double x, double y", "x, y"))
_block("calls", """
/* out-of-line entry points: a kernel with many math calls (an unrolled loop) calls these instead of inlining
   each helper at every use, which would take clang seconds; calls need a stack, so such kernels use scratch */
""" + "\n".join(f"__attribute__((noinline)) static double {fn}_call({params}) {{ return {fn}({args}); }}"
                for fn, params, args in _OUT_OF_LINE), ("exp", "log", "sin", "pow", "fmod"))


#: which block defines each helper function a kernel may call
PROVIDES: dict[str, str] = {
    "_call(": "calls",
    "ember_ldexp": "ldexp", "ember_exp": "exp", "ember_exp2": "exp", "ember_log": "log", "ember_log2": "log",
    "ember_sin": "sin", "ember_pow": "pow", "ember_fmod": "fmod", "ember_fmodf": "fmod",
    "ember_f16_": "f16", "ember_f32_to_f16": "f16", "ember_f64_to_f16": "f16",
    "ember_bf16_": "bf16", "ember_f32_to_bf16": "bf16",
}


def helpers_for(code: str) -> str:
    """The helper blocks ``code`` calls, dependencies first, each once."""
    wanted = [block for prefix, block in PROVIDES.items() if prefix in code]
    order: list[str] = []

    def visit(block: str) -> None:
        if block in order:
            return
        for dep in DEPENDS[block]:
            visit(dep)
        order.append(block)

    for block in wanted:
        visit(block)
    return "\n".join(HELPERS[b] for b in order)
