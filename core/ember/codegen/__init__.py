"""Codegen: kernel AST -> (optimizations) -> lowered DAG -> linear UOps -> source via a Renderer.

:func:`get_program` chooses a kernel's opts (:func:`choose_opts`: none, the heuristic, or a BEAM search) and
lowers it with them (:mod:`ember.codegen.program`).
"""
from __future__ import annotations

from ember.codegen.heuristic import heuristic_opts
from ember.codegen.opts import Opt, OptError, apply_opts, kernel_shape
from ember.codegen.program import LaunchTooLarge, ProgramSpec, estimate, kernel_name, lower_program
from ember.helpers import BEAM, NOOPT, gc_paused
from ember.ir.pattern import keep_rewrites
from ember.ir.shapetracker import ShapeTracker
from ember.ir.uop import Ops, UOp
from ember.renderer import Renderer

__all__ = ["LaunchTooLarge", "ProgramSpec", "choose_opts", "estimate", "get_program", "has_symbolic_shape",
           "kernel_name", "lower_program", "symbolic_opts"]


def has_symbolic_shape(ast: UOp) -> bool:
    """Whether a loop of the kernel runs to a size that depends on a variable."""
    return any(isinstance(d, UOp) for n in ast.toposort() if n.op in (Ops.VIEW, Ops.STORE)
               and n.arg is not None and hasattr(n.arg, "shape") for d in n.arg.shape)


#: the opts a kernel with symbolic sizes may keep: splits of its fixed-size axes
_SYMBOLIC_SAFE = frozenset({"UPCAST", "UNROLL", "LOCAL", "PADTO"})


def symbolic_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """The opts of a kernel with symbolic sizes: the heuristic plans the kernel with every variable at its
    maximum, and the opts that split a fixed-size axis (upcasts, unrolls, work-groups) are kept where the
    symbolic kernel accepts them; a symbolic axis is never split (its loop runs to the value read at launch)."""
    views = [n for n in ast.toposort() if n.op in (Ops.VIEW, Ops.STORE) and isinstance(n.arg, ShapeTracker)]
    highest = {name: hi for n in views for name, hi in n.arg.var_maxima().items()}
    memo: dict[UOp, UOp] = {}
    for n in ast.toposort():
        arg = n.arg.at_values(highest) if n.op in (Ops.VIEW, Ops.STORE) and isinstance(n.arg, ShapeTracker) \
            else n.arg
        src = tuple(memo[s] for s in n.src)
        memo[n] = n if arg is n.arg and src == n.src else UOp(n.op, n.dtype, src, arg)
    try:
        planned = heuristic_opts(memo[ast], renderer)
    except (OptError, ValueError, TypeError, ZeroDivisionError):  # a plan for the maxima that does not fit
        return []
    full = kernel_shape(ast).full_shape
    kept: list[Opt] = []
    for opt in planned:
        if opt.op not in _SYMBOLIC_SAFE or not isinstance(full[opt.axis], int):
            continue
        try:
            apply_opts(ast, renderer, kept + [opt])
        except OptError:
            continue
        kept.append(opt)
    return kept


def choose_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """The opts a kernel gets: none under ``NOOPT``, a timed search under ``BEAM``, else the heuristic."""
    if NOOPT:
        return []
    if has_symbolic_shape(ast):
        return symbolic_opts(ast, renderer)
    if BEAM >= 1:
        from ember.codegen import search

        return search.beam_search(ast, renderer, int(BEAM.value))
    return heuristic_opts(ast, renderer)


def get_program(ast: UOp, renderer: Renderer, name: str | None = None, opts: list[Opt] | None = None) -> ProgramSpec:
    """Lower (once), linearize and render one kernel AST for ``renderer`` with ``opts`` (default: chosen by
    :func:`choose_opts`). A bad opt raises :class:`~ember.codegen.opts.OptError`."""
    with gc_paused(), keep_rewrites():
        return lower_program(ast, renderer, choose_opts(ast, renderer) if opts is None else list(opts), name)
