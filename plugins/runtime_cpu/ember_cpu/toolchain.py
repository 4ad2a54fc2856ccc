"""What the host C compiler can do, found by building and running small probe programs.

The CPU device renders and compiles according to these facts instead of assuming them:

- **float16**: native ``_Float16`` arithmetic where the compiler has it *and* its conversions give
  the right bits when run (clang 14 on x86-64 has no ``_Float16``; its ``__fp16`` double->half
  conversion calls a libgcc helper with a mismatched ABI and returns garbage). Otherwise float16
  buffers hold 16-bit patterns converted by ember's own C helpers, with every result rounded to
  half precision: the same answers, no runtime-library dependency.
- **OpenMP**: whether ``-fopenmp`` builds, links and runs. When it does not, the reason and the
  remedy (``apt install libomp-dev`` for clang, ``CC=gcc``) are kept for the doctor.

Probing costs a few compiles (~0.1-0.3 s per compiler), so results are kept on disk keyed by the
compiler's path, size, modification time and version: a later process reads them back.

Without ``CC``, :func:`select_toolchain` probes gcc, then clang, then cc, and takes the first with
both OpenMP and native float16 (gcc also compiles kernels about twice as fast as clang), else the
best of them. ``CC`` chooses the compiler explicitly and is never second-guessed.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from ember.device import diskcache
from ember.dtype import dtypes, scalar_from_bytes

if TYPE_CHECKING:
    from fractions import Fraction

#: probe format version: bump when the probes change, so cached results are not reused
_PROBE_VERSION = 2

_HALF_PROBE = """
void ember_probe_half(const double* d, const float* f, unsigned short* out, int n) {
  for (int i = 0; i < n; i++) {
    _Float16 a = (_Float16)d[i], b = (_Float16)f[i];
    _Float16 c = a * b + b;
    __builtin_memcpy(&out[3 * i], &a, 2); __builtin_memcpy(&out[3 * i + 1], &b, 2);
    __builtin_memcpy(&out[3 * i + 2], &c, 2);
  }
}
"""

_OPENMP_PROBE = """#include <omp.h>
int ember_probe_omp(int n) {
  int total = 0;
  #pragma omp parallel for reduction(+:total)
  for (int i = 0; i < n; i++) total += i;
  return total + 0 * omp_get_max_threads();
}
"""

_MATH_PROBE = """
float expf(float);
float ember_probe_math(float x) { return expf(x); }
"""

#: gcc's link without the C runtime's start files and default libraries: the libraries kernels use, named (libc's
#: functions, memset and the like, come from the process that loads the kernels, which always has libc). A
#: shared object of kernels needs no start files; leaving them and the default library search out makes each
#: build's link ~4.5 ms faster (33.7 -> 29.9 ms for a one-kernel build). Used when the probe program builds,
#: loads and runs with it (see _probe_together)
LEAN_LINK: tuple[str, ...] = ("-nostdlib", "-lgomp", "-lm", "-lgcc")

#: values whose conversion to float16 exercises rounding to even, denormals, overflow and signs
_HALF_VALUES = [0.0, -0.0, 1.0, -2.5, 0.1, 1.0 / 3.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 6.1e-5,
                5.96e-8, 2.98e-8, 1.0009765625, 1.00048828125, 1.000732421875, 2049.0, 3.14159265358979, -7e-6]


@dataclass(frozen=True)
class Toolchain:
    """What one C compiler can do here, found by probing it."""

    cc: tuple[str, ...]
    version: str
    #: "native" (``_Float16``) or "emulated" (16-bit storage, ember's conversions)
    float16: str
    #: why float16 is emulated ("" when native)
    float16_reason: str
    openmp: bool
    #: why OpenMP is unavailable and how to get it ("" when available)
    openmp_reason: str
    #: the link arguments that replace the compiler's default runtime libraries (:data:`LEAN_LINK`), or empty
    link: tuple[str, ...] = ()

    @property
    def score(self) -> int:
        """Higher is a faster working setup: OpenMP matters most (all cores), then native float16."""
        return 2 * self.openmp + (self.float16 == "native")


def find_compilers() -> list[list[str]]:
    """The candidate compiler commands: ``CC`` alone when set, else gcc, clang and cc (distinct binaries)."""
    env_cc = os.environ.get("CC", "").strip()
    if env_cc:
        cmd = shlex.split(env_cc)
        exe = shutil.which(cmd[0])
        return [[exe, *cmd[1:]]] if exe else []
    found: list[list[str]] = []
    seen: set[str] = set()
    for name in ("gcc", "clang", "cc"):
        exe = shutil.which(name)
        if exe and os.path.realpath(exe) not in seen:
            seen.add(os.path.realpath(exe))
            found.append([exe])
    return found


@functools.cache
def cc_version(cc: tuple[str, ...]) -> str:
    """The first line of ``cc --version`` (memoized per process)."""
    try:
        out = subprocess.run([*cc, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError as e:
        return f"unknown ({e})"
    return out.splitlines()[0].strip() if out else "unknown"


def is_clang(cc: tuple[str, ...]) -> bool:
    """Whether ``cc`` is clang (by its version text or its name)."""
    return "clang" in cc_version(cc).lower() or "clang" in os.path.basename(cc[0])


def _build(cc: tuple[str, ...], src: str, flags: list[str], tmp: str, name: str,
           link: Sequence[str] = ()) -> tuple[str | None, str]:
    """Compile ``src`` to a shared object in ``tmp`` (``link``: after the source): (its path, "") or (None, the
    compiler's first error line)."""
    c_path, so_path = os.path.join(tmp, f"{name}.c"), os.path.join(tmp, f"{name}.so")
    with open(c_path, "w") as f:
        f.write(src)
    cmd = [*cc, "-O2", "-fPIC", "-shared", *flags, c_path, "-o", so_path, *link]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False, cwd=tmp)
    except OSError as e:
        return None, str(e)
    if proc.returncode != 0 or not os.path.exists(so_path):
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln.lower()]
        first = (lines or (proc.stderr + proc.stdout).splitlines() or ["failed"])[0]
        return None, first.replace(tmp + os.sep, "").strip()
    return so_path, ""


def _probe_half(cc: tuple[str, ...], tmp: str) -> str:
    """"" when native ``_Float16`` compiles and converts correctly, else why not."""
    so, err = _build(cc, _HALF_PROBE, ["-march=native"], tmp, "half")
    if so is None:
        return f"no _Float16 ({err})"
    try:
        lib = ctypes.CDLL(so)
    except OSError as e:
        return f"a _Float16 program does not load ({e})"
    return _check_half(lib)


def _check_half(lib: ctypes.CDLL) -> str:
    """"" when the loaded probe's ``_Float16`` conversions and arithmetic give the right bits, else why not.

    The expected bits are computed exactly (rationals rounded to each format), without numpy: the probe runs
    while the program starts, and importing numpy then would hold the interpreter for ~37 ms."""
    n = len(_HALF_VALUES)
    d = (ctypes.c_double * n)(*_HALF_VALUES)
    f = (ctypes.c_float * n)(*_HALF_VALUES)  # C's (float) rounding, as the probe's callers see float32 values
    out = (ctypes.c_uint16 * (3 * n))()
    fn = lib.ember_probe_half
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    fn(d, f, out, n)
    raw = bytes(out)
    conv_ok = arith_ok = True
    for i in range(n):
        a, b = _to_half(d[i]), _to_half(f[i])
        got_a, got_b, got_c = (scalar_from_bytes(dtypes.float16, raw[6 * i + 2 * k:]) for k in range(3))
        conv_ok = conv_ok and _same(got_a, a) and _same(got_b, b)
        # a*b+b may be rounded once per op, or once at the end from float32 (excess precision) or exactly
        per_op = _to_half(_exact(_to_half(_exact(a, b, "*", _to_f32)), b, "+", _to_f32))
        once32 = _to_half(_exact(_exact(a, b, "*", _to_f32), b, "+", _to_f32))
        once64 = _to_half(_exact(_exact(a, b, "*", float), b, "+", float))
        arith_ok = arith_ok and any(_same(got_c, want) for want in (per_op, once32, once64))
    if not conv_ok:
        return "its float->float16 conversions give wrong results (a runtime-library helper with another ABI)"
    if not arith_ok:
        return "its _Float16 arithmetic gives wrong results"
    return ""


def _round_binary(x: float | Fraction, mantissa: int, emin: int, emax: int) -> float:
    """``x`` rounded to nearest even in the binary format with ``mantissa`` stored fraction bits and exponents
    ``emin..emax`` (subnormals below; infinity past the largest finite value), as a float (exact: float16 and
    float32 values are doubles)."""
    from fractions import Fraction  # (only the float16 probe needs it, in its thread: ~1.6 ms at import)

    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return x
    sign = math.copysign(1.0, x) if isinstance(x, float) else (-1.0 if x < 0 else 1.0)
    a = abs(Fraction(x))
    if a == 0:
        return 0.0 * sign
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2(a)) or one more
    if a < Fraction(2) ** e:
        e -= 1
    quantum = Fraction(2) ** (max(e, emin) - mantissa)
    r = round(a / quantum) * quantum  # Fraction rounds half to even
    if r >= Fraction(2) ** (emax + 1):
        return math.inf * sign
    return float(r) * sign


def _to_half(x: float | Fraction) -> float:
    return _round_binary(x, 10, -14, 15)


def _to_f32(x: float | Fraction) -> float:
    return _round_binary(x, 23, -126, 127)


def _exact(x: float, y: float, op: str, rounded: Callable[[float | Fraction], float]) -> float:
    """``x op y`` computed exactly and rounded once by ``rounded`` (IEEE arithmetic in that format); with an
    infinite or nan operand, the double result (the same special value every format gives)."""
    from fractions import Fraction

    if not (math.isfinite(x) and math.isfinite(y)):
        return rounded(x * y if op == "*" else x + y)
    exact = Fraction(x) * Fraction(y) if op == "*" else Fraction(x) + Fraction(y)
    return rounded(exact) if exact != 0 else rounded(x * y if op == "*" else x + y)  # keeps the sign of zero


def _same(x: float, y: float) -> bool:
    """The same float16 value with the same sign (zeros), or both NaN."""
    return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1.0, x) == math.copysign(1.0, y))


def _openmp_remedy(cc: tuple[str, ...]) -> str:
    return ("install clang's OpenMP runtime (Debian/Ubuntu: apt install libomp-dev) or use CC=gcc"
            if is_clang(cc) else "install the compiler's OpenMP runtime (Debian/Ubuntu: apt install libgomp1)")


def _probe_openmp(cc: tuple[str, ...], tmp: str) -> str:
    """"" when an OpenMP shared object builds, loads and runs, else why not and how to get it."""
    so, err = _build(cc, _OPENMP_PROBE, ["-fopenmp"], tmp, "omp")
    if so is None:
        return f"{err}; {_openmp_remedy(cc)}"
    try:
        lib = ctypes.CDLL(so)
    except OSError as e:
        return f"an OpenMP program does not load ({e}); {_openmp_remedy(cc)}"
    return _check_openmp(cc, lib)


def _check_openmp(cc: tuple[str, ...], lib: ctypes.CDLL) -> str:
    """"" when the loaded probe's OpenMP reduction gives the right sum, else why not and how to fix it."""
    lib.ember_probe_omp.argtypes = [ctypes.c_int]
    total = lib.ember_probe_omp(100)
    return "" if total == 4950 else f"an OpenMP reduction returned {total}, not 4950; {_openmp_remedy(cc)}"


def _probe_together(cc: tuple[str, ...], tmp: str, link: Sequence[str] = ()) -> tuple[str, str] | None:
    """Both probes from one program (one compiler process, where most compilers have both features): the
    float16 and OpenMP reasons, or ``None`` when that program does not build or load (then each probe runs
    alone, to say which feature is missing). With ``link`` (:data:`LEAN_LINK`) the program is linked with it and
    also calls the C library's ``expf``: ``None`` unless it builds, loads and gives the right value."""
    src = _OPENMP_PROBE + _HALF_PROBE + (_MATH_PROBE if link else "")
    so, _ = _build(cc, src, ["-march=native", "-fopenmp"], tmp, "lean" if link else "both", link)
    if so is None:
        return None
    try:
        lib = ctypes.CDLL(so)
    except OSError:
        return None
    if link:
        lib.ember_probe_math.argtypes, lib.ember_probe_math.restype = [ctypes.c_float], ctypes.c_float
        if abs(lib.ember_probe_math(1.0) - math.e) > 1e-6:
            return None
    return _check_half(lib), _check_openmp(cc, lib)


def _identity(cc: tuple[str, ...]) -> str:
    try:
        st = os.stat(os.path.realpath(cc[0]))
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = "?"
    return f"toolchain v{_PROBE_VERSION}|{' '.join(cc)}|{stamp}|{cc_version(cc)}|{sys.platform}"


#: held while probing: a prefetch and the device's own request wait for one probe instead of running two
_probing = threading.RLock()


def probe_toolchain(cc: tuple[str, ...]) -> Toolchain:
    """Probe ``cc`` (memoized per process and kept on disk by the compiler's identity)."""
    with _probing:
        return _probe(cc)


@functools.cache
def _probe(cc: tuple[str, ...]) -> Toolchain:
    path = diskcache.entry_path("toolchain", _identity(cc))
    payload = diskcache.read(path) if path is not None else None
    if payload is not None:
        try:
            fields = json.loads(payload)
            return Toolchain(**{**fields, "cc": tuple(fields["cc"]), "link": tuple(fields.get("link", ()))})
        except (ValueError, TypeError, KeyError):
            pass  # an entry from another version: probe again
    with tempfile.TemporaryDirectory(prefix="ember-cc-probe-") as tmp:
        # gcc on Linux: first the lean link (one program still, when it works: the usual case)
        lean = not is_clang(cc) and sys.platform.startswith("linux")
        together = _probe_together(cc, tmp, LEAN_LINK) if lean else None
        link = LEAN_LINK if together is not None and not together[1] else ()
        if not link:
            together = _probe_together(cc, tmp)
        if together is not None:
            half_reason, omp_reason = together
        else:  # the two probes build at once (each is a compiler process)
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                half = pool.submit(_probe_half, cc, tmp)
                omp_reason = _probe_openmp(cc, tmp)
                half_reason = half.result()
    tc = Toolchain(cc=cc, version=cc_version(cc), float16="emulated" if half_reason else "native",
                   float16_reason=half_reason, openmp=not omp_reason, openmp_reason=omp_reason, link=link)
    if path is not None:
        diskcache.write(path, json.dumps(asdict(tc)).encode())
    return tc


def select_toolchain() -> Toolchain | None:
    """The toolchain the CPU device uses: ``CC`` when set, else the best probed compiler (None if none exists)."""
    with _probing:
        return _select(os.environ.get("CC", ""), os.environ.get("PATH", ""))


_prefetch: threading.Thread | None = None
_prefetch_lock = threading.Lock()


def prefetch_toolchain() -> None:
    """Start :func:`select_toolchain` on a background thread, once per process.

    With an empty cache the probe builds two programs (~40 ms). Started when the plugin is loaded, it runs
    while the device registry probes the other devices and the program builds its first graph; the CPU
    device then finds the result ready. The thread is not a daemon: a process that ends meanwhile waits
    for the probe to finish, so no compiler process or temporary folder is left behind."""
    global _prefetch
    with _prefetch_lock:
        if _prefetch is None:
            _prefetch = threading.Thread(target=select_toolchain, name="ember-cpu-toolchain-probe")
            _prefetch.start()


@functools.cache
def _select(cc_env: str, path: str) -> Toolchain | None:
    best: Toolchain | None = None
    for cc in find_compilers():
        tc = probe_toolchain(tuple(cc))
        if best is None or tc.score > best.score:
            best = tc
        if best.score == 3:  # nothing beats OpenMP with native float16
            break
    return best
