"""BEAM search: time candidate opt lists on the device and keep the fastest (``BEAM=N``, as in tinygrad).

Starting from no opts and from the heuristic's choice, each round extends every kept opt list by one action
(an :class:`~ember.codegen.opts.Opt` that fits; GROUP and GROUPTOP too on work-group targets with local
memory, and TC on targets with tensor cores), renders all the new candidates, compiles them in one batch
(``compile_cached_many``: the batch compiler spreads them over the cores), and times each on a *sample*:
copies of the kernel's real buffers when the engine hands them over (it searches a kernel when the kernels
before it in the schedule have computed its inputs), else buffers of the kernel's sizes filled with random
values. The real buffers are never written: every parameter gets its own copy, inputs with the real contents,
outputs as scratch (an output the kernel also reads, an in-place update, with the real contents, put back
before each candidate's checked run). A candidate whose output differs from the unoptimized kernel's on the
sample is rejected. The ``N`` fastest survive to the next round; the search stops when a round finds nothing
faster or its time budget (``BEAM_BUDGET`` seconds, default 1.5) is spent.

Candidates are lowered by :func:`~ember.codegen.program.lower_program` and run through the runner factory the
caller hands in (the engine passes its ``CompiledRunner``; without one, :class:`ProgramRunner` loads each on
the device's runtime): the search imports nothing of the engine.

The result is cached on disk under :func:`~ember.codegen.cachekey.lowering_key` (the AST, the knobs and the
renderer's full identity), so a second process searches nothing.
"""
from __future__ import annotations

import os
import pickle
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ember import diskcache
from ember.codegen.access import kernel_shape, reduce_loads
from ember.codegen.cachekey import lowering_key
from ember.codegen.heuristic import USE_TC, heuristic_opts
from ember.codegen.opts import Opt, OptError, apply_opts
from ember.codegen.program import ProgramSpec, kernel_name, lower_program
from ember.device.registry import Device
from ember.dtype import PtrDType, dtypes, to_np_dtype
from ember.helpers import DEBUG, getenv
from ember.ir.shapetracker import ShapeTracker
from ember.ir.uop import Ops, UOp
from ember.renderer import Renderer

if TYPE_CHECKING:
    import numpy as np

    from ember.device.buffer import Buffer
else:
    from ember.helpers import lazy_numpy as np

#: factors tried per action kind
UPCAST_AMOUNTS = (2, 3, 4, 8, 16)
UNROLL_AMOUNTS = (2, 4, 8)
LOCAL_AMOUNTS = (2, 4, 8, 16, 32)
THREAD_AMOUNTS = (2, 4)
GROUP_AMOUNTS = (4, 8, 16, 32, 64, 128, 256)
#: a candidate slower than this many times the best so far is not timed further
SLOW_FACTOR = 3.0
#: a candidate whose first run takes longer than this (seconds) is dropped
CANDIDATE_LIMIT_S = 0.5


class ProgramRunner:
    """A candidate loaded on its device from its binary, run on :class:`Sample` buffers: what a search times
    when its caller hands it no runner of its own (the engine hands its ``CompiledRunner``)."""

    def __init__(self, device: str, spec: ProgramSpec, binary: bytes):
        self.spec = spec
        self.program = Device[device].runtime(spec.name, binary)

    def __call__(self, bufs: list[Buffer], wait: bool = False) -> float | None:
        return self.program(*[b._buf for b in bufs], global_size=self.spec.global_size,
                            local_size=self.spec.local_size, wait=wait)


#: what builds a runnable candidate: ``(device, spec, binary) -> runner``; ``runner(bufs, wait=True)`` returns
#: the seconds one run took
RunnerFactory = Callable[[str, ProgramSpec, bytes], Callable[..., "float | None"]]


def actions(ast: UOp, renderer: Renderer) -> list[Opt]:
    """Every single opt worth trying on ``ast`` for ``renderer`` (later checked against each candidate)."""
    ks = kernel_shape(ast)
    full = ks.full_shape
    out: list[Opt] = []
    for axis, size in enumerate(full):
        if size == 1:
            continue
        if axis in ks.reduce_axes:
            out += [Opt("UNROLL", axis, a) for a in UNROLL_AMOUNTS if size % a == 0]
            if renderer.parallel_threads > 1 and not renderer.has_local:
                out += [Opt("THREAD", axis, a) for a in THREAD_AMOUNTS if a <= renderer.parallel_threads * 2]
            # a matmul on each tensor core (TC stands alone: only the empty list extends to it)
            if USE_TC:
                out += [Opt("TC", axis, i) for i in range(len(renderer.tensor_cores))]
            if renderer.has_local and renderer.has_shared and renderer.shared_max > 0:
                # a reduction shared by a work-group: interleaved and in blocks
                limit = renderer.local_max[0] if renderer.local_max else max(GROUP_AMOUNTS)
                out += [Opt(op, axis, a) for op in ("GROUP", "GROUPTOP") for a in GROUP_AMOUNTS
                        if size % a == 0 and a <= limit]
        else:
            out += [Opt("UPCAST", axis, a) for a in UPCAST_AMOUNTS if size % a == 0]
            if renderer.has_local:
                out += [Opt("LOCAL", axis, a) for a in LOCAL_AMOUNTS if size % a == 0]
    return out


class Sample:
    """The buffers candidates run on: one fresh buffer per kernel parameter, never a real one.

    With ``real`` (the kernel's buffers, by parameter index, its inputs already computed) every parameter the
    kernel reads is a copy of the real contents; without, inputs are random values. Outputs are scratch,
    filled with a pattern (all bits set: NaN for floats) before each candidate, so an element a candidate does
    not write shows up as a difference. An output the kernel also reads (an in-place update) gets its starting
    contents back instead, so every checked run starts from the same values.
    """

    def __init__(self, ast: UOp, device: str, real: Sequence[Any] | None = None):
        from ember.device.buffer import Buffer

        params = dict(sorted({u.arg[0]: u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL}.items()))
        if real is not None and len(real) < len(params):
            raise ValueError(f"the kernel takes {len(params)} buffers, {len(real)} given")
        #: parameter indices the kernel stores to, and those it loads from
        self.outs = sorted({s.src[0].arg[0] for s in ast.src})
        loaded = {s.arg[0] for u in ast.toposort() if u.op is Ops.LOAD for s in u.src if s.op is Ops.DEFINE_GLOBAL}
        self.on_real_buffers = real is not None
        rng = np.random.default_rng(0)
        self.bufs: list[Any] = []
        #: the parameters candidates only read (their copies keep the starting values)
        self.ins = [i for i in params if i not in self.outs]
        #: the starting contents of each output the kernel also reads (an in-place update), put back before runs
        self.start: dict[int, bytes] = {}
        for i, g in params.items():
            dt = g.dtype.base if isinstance(g.dtype, PtrDType) else g.value_dtype
            size = max(int(g.arg[1]), 1)
            if real is not None:  # the copy is of the real buffer's size and dtype, whatever the kernel declares
                dt, size = real[i].dtype, real[i].size
            buf = Buffer(device, size, dt).allocate()
            if i in self.ins or i in loaded:
                data = bytes(real[i].as_bytes()) if real is not None else _random_bytes(rng, dt, size)
                buf.copyin(memoryview(data).cast("B"))
                if i in self.outs:
                    self.start[i] = data
            self.bufs.append(buf)
        self.in_place = sorted(self.start)

    def reset_outputs(self) -> None:
        """Fill the outputs with the pattern (an in-place output with its starting contents)."""
        for i in self.outs:
            b = self.bufs[i]
            b.copyin(memoryview(self.start.get(i, b"\xff" * b.nbytes)).cast("B"))

    def outputs(self) -> list[np.ndarray]:
        """The outputs' contents now, by parameter index order (bfloat16 as float32 values, not bits)."""
        out = []
        for i in self.outs:
            b = self.bufs[i]
            vals: np.ndarray = np.frombuffer(b.as_bytes(), to_np_dtype(b.dtype)).copy()
            out.append((vals.astype(np.uint32) << 16).view(np.float32) if b.dtype == dtypes.bfloat16 else vals)
        return out

    def tolerance(self) -> float:
        """How far a candidate's output may be from the reference's (relative and absolute): a few roundings of
        the coarsest output dtype, at least 1e-3 (a float sum reordered)."""
        eps = {dtypes.float16: 2.0 ** -10, dtypes.bfloat16: 2.0 ** -7}
        return max([1e-3] + [4 * eps.get(self.bufs[i].dtype, 0.0) for i in self.outs])

    def inputs(self) -> dict[int, np.ndarray]:
        """What each read parameter held before any candidate ran, by parameter index."""
        raw = {i: bytes(self.bufs[i].as_bytes()) for i in self.ins} | self.start
        return {i: np.frombuffer(data, to_np_dtype(self.bufs[i].dtype)).copy() for i, data in sorted(raw.items())}


def _random_bytes(rng: np.random.Generator, dt: Any, size: int) -> bytes:
    """``size`` random values of ``dt``: floats in [-1, 1), small non-negative ints, bools."""
    npdt = to_np_dtype(dt)
    vals: np.ndarray
    if np.issubdtype(npdt, np.floating):
        vals = rng.uniform(-1, 1, size).astype(npdt)
    elif npdt == np.bool_:
        vals = rng.integers(0, 2, size).astype(np.bool_)
    else:
        vals = rng.integers(0, 8, size).astype(npdt)
    return vals.tobytes()


@dataclass(frozen=True)
class SearchReport:
    """What one search did, for :data:`observers`: the sample it timed on and every candidate's time."""

    ast: UOp
    #: whether the sample held copies of the kernel's real buffers (else random values)
    on_real_buffers: bool
    #: each read parameter's contents (by index) before any candidate ran
    inputs: dict[int, np.ndarray]
    #: the unoptimized kernel's outputs on the sample, which every candidate had to match
    reference: list[np.ndarray]
    #: seconds per candidate opt list; ``inf`` for one rejected (a wrong result, too slow)
    timed: dict[tuple[Opt, ...], float]
    best: list[Opt]


#: callbacks that get a :class:`SearchReport` after each search (tests; tools that show what BEAM did)
observers: list[Callable[[SearchReport], None]] = []


def _same(a: list[np.ndarray], b: list[np.ndarray], tol: float = 1e-3) -> bool:
    return all(x.shape == y.shape and np.allclose(x, y, rtol=tol, atol=tol, equal_nan=True) for x, y in zip(a, b))


def _time(runner: Any, bufs: list[Any], best: float) -> float:
    """Best of a few runs; a slow candidate is given up early."""
    first = runner(bufs, wait=True) or 0.0
    if first > CANDIDATE_LIMIT_S:
        # a driver may finish building a kernel at its first launch (PoCL does, per work-group size): a
        # candidate is dropped only when a second run is slow too
        first = runner(bufs, wait=True) or 0.0
        if first > CANDIDATE_LIMIT_S:
            return float("inf")
    times = [first]
    for _ in range(2):
        if min(times) > SLOW_FACTOR * best:
            break
        times.append(runner(bufs, wait=True) or 0.0)
    return min(times)


def cached_opts(ast: UOp, renderer: Renderer) -> list[Opt] | None:
    """The opts an earlier search (in any process) found for ``ast`` on ``renderer``, or None."""
    path = diskcache.entry_path("beam", lowering_key(renderer, ast))
    if path is not None and (payload := diskcache.read(path)) is not None:
        try:
            return list(diskcache.restricted_loads(payload))  # Opts and builtins only: an entry never runs code
        except Exception:  # an entry from an incompatible version, or forged: search again
            diskcache.invalidate(path)
    return None


def searchable(ast: UOp) -> bool:
    """Whether BEAM times ``ast`` (a kernel with symbolic sizes would need values for them: the heuristic
    decides)."""
    return not any(u.op is Ops.DEFINE_VAR or (u.op in (Ops.VIEW, Ops.STORE) and isinstance(u.arg, ShapeTracker)
                                              and u.arg.var_names()) for u in ast.toposort())


def beam_search(ast: UOp, renderer: Renderer, amt: int, budget_s: float | None = None,
                bufs: Sequence[Any] | None = None, runner: RunnerFactory | None = None) -> list[Opt]:
    """The fastest opt list found for ``ast`` on ``renderer``'s device with a beam of width ``amt``.

    ``bufs`` are the kernel's real buffers (by parameter index, its inputs computed): candidates run on copies
    of them. Without them they run on random values. ``runner`` builds each candidate's runner (default:
    :class:`ProgramRunner`)."""
    if (found := cached_opts(ast, renderer)) is not None:
        return found
    if not searchable(ast):
        return heuristic_opts(ast, renderer)
    try:
        opts = _search(ast, renderer, amt, getenv("BEAM_BUDGET", 1.5) if budget_s is None else budget_s,
                       bufs, runner or ProgramRunner)
    except Exception as e:  # a device that cannot time candidates: the heuristic's choice, said once per kernel
        warnings.warn(f"BEAM search failed for {kernel_name_of(ast)} ({type(e).__name__}: {e}); using the "
                      "heuristic's opts", stacklevel=2)
        return heuristic_opts(ast, renderer)
    path = diskcache.entry_path("beam", lowering_key(renderer, ast))
    if path is not None:
        diskcache.write(path, pickle.dumps(opts))
    return opts


def _search(ast: UOp, renderer: Renderer, amt: int, budget_s: float, bufs: Sequence[Any] | None = None,
            runner: RunnerFactory = ProgramRunner) -> list[Opt]:
    from ember.progress import progress

    start = time.perf_counter()
    device = renderer.device
    dev = Device[device]
    sample = Sample(ast, device, bufs)

    def build(cands: list[list[Opt]]) -> list[tuple[list[Opt], Any]]:
        st = time.perf_counter()
        specs = [lower_program(ast, renderer, c) for c in cands]
        mid = time.perf_counter()
        binaries = dev.compiler.compile_cached_many([s.src for s in specs])
        if DEBUG >= 3:
            print(f"BEAM: {len(cands)} candidates lowered in {mid - st:.2f}s, "
                  f"compiled in {time.perf_counter() - mid:.2f}s")
        return [(c, runner(device, s, b)) for c, s, b in zip(cands, specs, binaries)]

    heuristic = heuristic_opts(ast, renderer)
    seeds: list[list[Opt]] = [[]] + ([heuristic] if heuristic else [])
    built = build(seeds)
    sample.reset_outputs()
    built[0][1](sample.bufs, wait=True)
    reference = sample.outputs()  # the unoptimized kernel's result: every candidate must match it
    timed: dict[tuple[Opt, ...], float] = {}
    best_t = float("inf")
    all_actions = actions(ast, renderer)
    chunk = max(2, os.cpu_count() or 1)
    # tiles bigger than the heuristic allows take long to compile and rarely win: not tried
    max_tile = max(renderer.max_tile_ops // reduce_loads(ast)[1], _tile(heuristic))
    bar = progress(desc=f"BEAM {amt} {kernel_name_of(ast)}", unit="kernel", disable=DEBUG < 1 and not os.isatty(2))

    def measure(batch: list[tuple[list[Opt], Any]]) -> bool:
        nonlocal best_t
        improved = False
        for c, runner in batch:
            sample.reset_outputs()
            t = _time(runner, sample.bufs, best_t)
            if t != float("inf") and sample.in_place:
                # the timing runs updated the in-place outputs several times: check one run from the start
                sample.reset_outputs()
                runner(sample.bufs, wait=True)
            if t != float("inf") and not _same(sample.outputs(), reference, sample.tolerance()):
                t = float("inf")  # a wrong result is never kept
            timed[tuple(c)] = t
            bar.update(1)
            if t < best_t:
                best_t, improved = t, True
        return improved

    try:
        measure(built)
        frontier = [list(k) for k in sorted(timed, key=lambda k: timed[k])[:amt]]
        while frontier and time.perf_counter() - start < budget_s:
            cands: list[list[Opt]] = []
            for base in frontier:
                for a in all_actions:
                    c = [*base, a]
                    if tuple(c) in timed or c in cands:
                        continue
                    try:
                        apply_opts(ast, renderer, c)
                    except OptError:
                        continue
                    if _tile(c) <= max_tile:
                        cands.append(c)
            improved = False
            # small batches, so the time budget is checked often
            for k in range(0, len(cands), chunk):
                if time.perf_counter() - start >= budget_s:
                    break
                improved |= measure(build(cands[k:k + chunk]))
            ranked = sorted((k for k in timed if timed[k] != float("inf")), key=lambda k: timed[k])
            frontier = [list(k) for k in ranked[:amt]]
            if not improved:
                break
    finally:
        bar.close()
    ranked = sorted((k for k in timed if timed[k] != float("inf")), key=lambda k: timed[k])
    best = list(ranked[0]) if ranked else heuristic
    if DEBUG >= 2:
        print(f"BEAM {amt}: {len(timed)} candidates in {time.perf_counter() - start:.2f}s "
              f"({'real' if sample.on_real_buffers else 'random'} buffers), best {best} {best_t * 1e6:.1f}us")
    if observers:
        report = SearchReport(ast, sample.on_real_buffers, sample.inputs(), reference, dict(timed), best)
        for observe in observers:
            observe(report)
    return best


def _tile(opts: list[Opt]) -> int:
    """How many copies of the loop body a candidate's UPCASTs and UNROLLs make."""
    n = 1
    for o in opts:
        if o.op in ("UPCAST", "UNROLL"):
            n *= o.arg
    return n


def kernel_name_of(ast: UOp) -> str:
    """The kernel's display name (for the progress bar)."""
    return kernel_name(ast)
