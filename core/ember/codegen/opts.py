"""Kernel optimizations chosen before lowering.

An optimization reshapes a kernel's iteration space without changing its result. Today the
heuristic picks UPCASTs for reductions on loop-based (CPU-style) targets: each loop
iteration computes a small tile of outputs, so loads are shared and the compiler can keep
accumulators in registers and vectorize the contiguous direction. The same ``Opt`` list is
what a BEAM search would vary and time.
"""
from __future__ import annotations

from dataclasses import dataclass

from ember.codegen.lowerer import global_dims, lower_ast
from ember.graph.symbolic import split_terms, term_coeff
from ember.graph.uop import Ops, UOp
from ember.helpers import NOOPT
from ember.renderer import Renderer


@dataclass(frozen=True)
class Opt:
    """One optimization: ``op`` in ("UPCAST",), applied to output ``axis`` with factor ``amount``."""

    op: str
    axis: int
    amount: int


def load_strides(ast: UOp) -> dict[int, set[int]]:
    """For each output dim, the strides with which the kernel's loads walk it (0 = not used)."""
    out_shape = global_dims(ast)
    dims = [i for i, d in enumerate(out_shape) if d != 1]
    lowered = lower_ast(ast)
    range_dim = {}
    for n in lowered.toposort():
        if n.op is Ops.RANGE and n.arg[1] == "global":
            range_dim[n] = dims[n.arg[0]] if n.arg[0] < len(dims) else None
    strides: dict[int, set[int]] = {d: set() for d in dims}
    for n in lowered.toposort():
        if n.op is not Ops.LOAD:
            continue
        coeffs: dict[int, int] = {}
        for t in split_terms(n.src[1]):
            var, c = term_coeff(t)
            if var in range_dim and range_dim[var] is not None:
                coeffs[range_dim[var]] = c
        for d in dims:
            strides[d].add(coeffs.get(d, 0))
    return strides


def heuristic_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """Pick optimizations for ``ast`` on ``renderer`` (no timing; BEAM can do better)."""
    if NOOPT or renderer.has_local or not any(n.op is Ops.REDUCE_AXIS for n in ast.toposort()):
        return []
    out_shape = global_dims(ast)
    strides = load_strides(ast)
    opts: list[Opt] = []
    # 1) the innermost dim some input reads contiguously: 8 (or 4) outputs per iteration
    for d in sorted(strides, reverse=True):
        if 1 in strides[d]:
            for amt in (8, 4):
                if out_shape[d] % amt == 0 and out_shape[d] >= amt:
                    opts.append(Opt("UPCAST", d, amt))
                    break
            break
    if opts:
        # 2) another dim that some input does not depend on (its loads are reused across the tile): 4
        for d in sorted(strides, reverse=True):
            if d != opts[0].axis and out_shape[d] % 4 == 0 and out_shape[d] >= 8 and 0 in strides[d]:
                opts.append(Opt("UPCAST", d, 4))
                break
        return opts
    # 3) nothing contiguous along the outputs (x @ w.T: both inputs run along the reduce axis, which
    #    the renderer vectorizes as a reduction): a 2x2 tile of outputs shares the loads
    for d in sorted(strides, reverse=True):
        if len([o for o in opts if o.op == "UPCAST"]) < 2 and out_shape[d] % 2 == 0 and out_shape[d] >= 4 \
                and 0 in strides[d]:
            opts.append(Opt("UPCAST", d, 2))
    return opts
