"""BEAM search: time candidate opt lists on the device and keep the fastest (``BEAM=N``, as in tinygrad).

Starting from no opts and from the heuristic's choice, each round extends every kept opt list by one action
(an :class:`~ember.codegen.opts.Opt` that fits; GROUP and GROUPTOP too on work-group targets with local
memory, and TC on targets with tensor cores), renders all the new candidates, compiles them in one batch
(``compile_cached_many``: the batch compiler spreads them over the cores), and times each on scratch buffers
of the kernel's sizes, filled with random values. A candidate whose output differs from the unoptimized
kernel's on those buffers is rejected. The ``N`` fastest survive to the next round; the search stops when
a round finds nothing faster or its time budget (``BEAM_BUDGET`` seconds, default 1.5) is spent.

The result is cached on disk under :func:`~ember.codegen.cachekey.lowering_key` (the AST, the knobs and the
renderer's full identity), so a second process searches nothing.
"""
from __future__ import annotations

import os
import pickle
import time
import warnings
from typing import Any

import numpy as np

from ember import diskcache
from ember.codegen.cachekey import lowering_key
from ember.codegen.heuristic import MAX_TILE_OPS, reduce_loads
from ember.codegen.opts import Opt, OptError, apply_opts, kernel_shape
from ember.dtype import PtrDType, to_np_dtype
from ember.helpers import DEBUG
from ember.ir.uop import Ops, UOp
from ember.renderer import Renderer

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


def _scratch_buffers(ast: UOp, device: str) -> list[Any]:
    """One buffer per kernel parameter, of its size and dtype, inputs filled with random values."""
    from ember.device.buffer import Buffer

    rng = np.random.default_rng(0)
    params = sorted({u.arg[0]: u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL}.items())
    bufs = []
    for _, g in params:
        dt = g.dtype.base if isinstance(g.dtype, PtrDType) else g.value_dtype
        npdt = to_np_dtype(dt)
        size = max(int(g.arg[1]), 1)
        vals: np.ndarray
        if np.issubdtype(npdt, np.floating):
            vals = rng.uniform(-1, 1, size).astype(npdt)
        elif npdt == np.bool_:
            vals = rng.integers(0, 2, size).astype(np.bool_)
        else:
            vals = rng.integers(0, 8, size).astype(npdt)
        buf = Buffer(device, size, dt).allocate()
        buf.copyin(memoryview(vals.tobytes()).cast("B"))
        bufs.append(buf)
    return bufs


def _output(bufs: list[Any], ast: UOp) -> list[np.ndarray]:
    outs = {s.src[0].arg[0] for s in ast.src}
    return [np.frombuffer(b.as_bytes(), to_np_dtype(b.dtype)).copy() for i, b in enumerate(bufs) if i in outs]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.shape == y.shape and np.allclose(x, y, rtol=1e-3, atol=1e-3, equal_nan=True) for x, y in zip(a, b))


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


def beam_search(ast: UOp, renderer: Renderer, amt: int, budget_s: float | None = None) -> list[Opt]:
    """The fastest opt list found for ``ast`` on ``renderer``'s device with a beam of width ``amt``."""
    path = diskcache.entry_path("beam", lowering_key(renderer, ast))
    if path is not None and (payload := diskcache.read(path)) is not None:
        try:
            return list(diskcache.restricted_loads(payload))  # Opts and builtins only: an entry never runs code
        except Exception:  # an entry from an incompatible version, or forged: search again
            diskcache.invalidate(path)
    from ember.codegen.opts import heuristic_opts

    if any(u.op is Ops.DEFINE_VAR for u in ast.toposort()):
        # symbolic sizes: the scratch buffers would need values for them; the heuristic decides
        return heuristic_opts(ast, renderer)
    try:
        opts = _search(ast, renderer, amt, float(os.environ.get("BEAM_BUDGET", 1.5)) if budget_s is None else budget_s)
    except Exception as e:  # a device that cannot time candidates: the heuristic's choice, said once per kernel
        warnings.warn(f"BEAM search failed for {kernel_name_of(ast)} ({type(e).__name__}: {e}); using the "
                      "heuristic's opts", stacklevel=2)
        return heuristic_opts(ast, renderer)
    if path is not None:
        diskcache.write(path, pickle.dumps(opts))
    return opts


def _search(ast: UOp, renderer: Renderer, amt: int, budget_s: float) -> list[Opt]:
    from ember.codegen import get_program
    from ember.codegen.opts import heuristic_opts
    from ember.device.registry import Device
    from ember.engine.realize import CompiledRunner
    from ember.progress import progress

    start = time.perf_counter()
    device = renderer.device
    dev = Device[device]
    bufs = _scratch_buffers(ast, device)

    def build(cands: list[list[Opt]]) -> list[tuple[list[Opt], Any]]:
        st = time.perf_counter()
        specs = [get_program(ast, renderer, opts=c) for c in cands]
        mid = time.perf_counter()
        binaries = dev.compiler.compile_cached_many([s.src for s in specs])
        if DEBUG >= 3:
            print(f"BEAM: {len(cands)} candidates lowered in {mid - st:.2f}s, "
                  f"compiled in {time.perf_counter() - mid:.2f}s")
        return [(c, CompiledRunner(device, s, b)) for c, s, b in zip(cands, specs, binaries)]

    heuristic = heuristic_opts(ast, renderer)
    seeds: list[list[Opt]] = [[]] + ([heuristic] if heuristic else [])
    built = build(seeds)
    built[0][1](bufs, wait=True)
    reference = _output(bufs, ast)  # the unoptimized kernel's result: every candidate must match it
    timed: dict[tuple[Opt, ...], float] = {}
    best_t = float("inf")
    all_actions = actions(ast, renderer)
    chunk = max(2, os.cpu_count() or 1)
    # tiles bigger than the heuristic allows take long to compile and rarely win: not tried
    max_tile = max(MAX_TILE_OPS // reduce_loads(ast)[1], _tile(heuristic))
    bar = progress(desc=f"BEAM {amt} {kernel_name_of(ast)}", unit="kernel", disable=DEBUG < 1 and not os.isatty(2))

    def measure(batch: list[tuple[list[Opt], Any]]) -> bool:
        nonlocal best_t
        improved = False
        for c, runner in batch:
            t = _time(runner, bufs, best_t)
            if t != float("inf") and not _same(_output(bufs, ast), reference):
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
        print(f"BEAM {amt}: {len(timed)} candidates in {time.perf_counter() - start:.2f}s, best {best} "
              f"{best_t * 1e6:.1f}us")
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
    from ember.codegen import kernel_name

    return kernel_name(ast)
