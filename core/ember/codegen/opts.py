"""Kernel optimizations chosen before lowering.

An optimization reshapes a kernel's iteration space without changing its result. Today the
heuristic picks UPCASTs for reductions on loop-based (CPU-style) targets: each loop
iteration computes a small tile of outputs, so loads are shared and the compiler can keep
accumulators in registers and vectorize the contiguous direction. The same ``Opt`` list is
what a BEAM search would vary and time.

Tiles are sized from the target's register file (``vector_floats`` lanes per register,
``vector_registers`` registers; a renderer without them gets a small SSE/NEON-sized default):
enough independent accumulators to cover the latency of the multiply-adds, few enough that
they stay in registers.
"""
from __future__ import annotations

from dataclasses import dataclass

from ember.codegen.lowerer import global_dims, lower_ast
from ember.graph.symbolic import split_terms, term_coeff
from ember.graph.uop import Ops, UOp
from ember.helpers import NOOPT, prod
from ember.renderer import Renderer

#: most operations in the unrolled body of a tiled reduction loop (bounds the C source and its compile time:
#: a float32 matmul, 6 per output, gets a 256-output tile; a padded convolution, ~26, a 32-output one)
MAX_TILE_OPS = 1536


@dataclass(frozen=True)
class Opt:
    """One optimization: ``op`` in ("UPCAST",), applied to output ``axis`` with factor ``amount``."""

    op: str
    axis: int
    amount: int


def load_strides(ast: UOp, lowered: UOp | None = None) -> dict[int, set[int]]:
    """For each output dim, the strides with which the loads inside the kernel's reductions walk it (0 = not used).

    Loads that no reduction loop moves (a bias, a row's max) are read once per output: they do not
    say how a tile would share work. ``lowered`` is ``lower_ast(ast)`` when the caller has it.
    """
    out_shape = global_dims(ast)
    dims = [i for i, d in enumerate(out_shape) if d != 1]
    lowered = lowered if lowered is not None else lower_ast(ast)
    range_dim = {}
    for n in lowered.toposort():
        if n.op is Ops.RANGE and n.arg[1] == "global":
            range_dim[n] = dims[n.arg[0]] if n.arg[0] < len(dims) else None
    strides: dict[int, set[int]] = {d: set() for d in dims}
    for n in lowered.toposort():
        if n.op is not Ops.LOAD or not any(r.op is Ops.RANGE and r.arg[1] == "reduce" for r in n.src[1].toposort()):
            continue
        coeffs: dict[int, int] = {}
        for t in split_terms(n.src[1]):
            var, c = term_coeff(t)
            if var in range_dim and range_dim[var] is not None:
                coeffs[range_dim[var]] = c
        for d in dims:
            strides[d].add(coeffs.get(d, 0))
    return strides


def _largest_factor(size: int, limit: int, smallest: int = 2) -> int:
    """The largest divisor of ``size`` in [smallest, limit], or 1."""
    for amt in range(min(limit, size), smallest - 1, -1):
        if size % amt == 0:
            return amt
    return 1


def reduce_body_ops(lowered: UOp) -> int:
    """How many operations (loads, index math, validity gates, ALU) one output costs per reduction step:
    what a tile copy adds to the innermost loop's body."""
    inside: dict[UOp, bool] = {}
    count = 0
    for n in lowered.toposort():
        if n.op is Ops.RANGE:
            inside[n] = n.arg[1] == "reduce"
            continue
        inside[n] = n.op is not Ops.REDUCE and any(inside[s] for s in n.src)
        count += inside[n]
    return max(1, count)


def heuristic_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """Pick optimizations for ``ast`` on ``renderer`` (no timing; BEAM can do better)."""
    if NOOPT or renderer.has_local or not any(n.op is Ops.REDUCE_AXIS for n in ast.toposort()):
        return []
    out_shape = global_dims(ast)
    lowered = lower_ast(ast)
    strides = load_strides(ast, lowered)
    lanes: int = renderer.vector_floats
    # three quarters of the registers hold accumulators; the rest carry the loads
    acc_regs = max(2, renderer.vector_registers * 3 // 4)
    max_tile = max(1, MAX_TILE_OPS // reduce_body_ops(lowered))
    opts: list[Opt] = []
    # 1) the innermost dim some input reads contiguously: two vector registers of outputs per row of the tile,
    #    which the compiler turns into vector multiply-adds (matmul: a row of B times a broadcast element of A)
    for d in sorted(strides, reverse=True):
        if 1 in strides[d]:
            # a multiple of 4 wide, so it splits into whole vectors
            amt = max([a for a in range(4, min(2 * lanes, max_tile, out_shape[d]) + 1, 4) if out_shape[d] % a == 0],
                      default=1)
            if amt > 1:
                opts.append(Opt("UPCAST", d, amt))
            break
    if opts:
        # 2) rows of the tile: another dim that some input does not depend on (its loads are reused across the row)
        vecs_per_row = -(-opts[0].amount // lanes)
        for d in sorted(strides, reverse=True):
            if d != opts[0].axis and 0 in strides[d]:
                amt = _largest_factor(out_shape[d], min(acc_regs // vecs_per_row, max_tile // opts[0].amount))
                if amt > 1:
                    opts.append(Opt("UPCAST", d, amt))
                break
        return opts
    # 3) nothing contiguous along the outputs (x @ w.T: both inputs run along the reduce axis, which the renderer
    #    vectorizes as a reduction, one vector accumulator per output): a square-ish tile of outputs shares the loads
    budget = min(acc_regs * 2 // 3, max_tile)
    for d in sorted(strides, reverse=True):
        if len(opts) < 2 and 0 in strides[d]:
            limit = budget // prod(o.amount for o in opts) if opts else max(2, int(budget ** 0.5))
            amt = _largest_factor(out_shape[d], min(limit, 4, out_shape[d] // 2))
            if amt > 1:
                opts.append(Opt("UPCAST", d, amt))
    return opts
