"""One kernel AST with its opts -> lowered DAG -> linear UOps -> source: the :class:`ProgramSpec` a device runs.

The opts are given (:func:`ember.codegen.get_program` chooses them first); BEAM search lowers its candidates
through :func:`lower_program` too.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ember.codegen.linearize import linearize
from ember.codegen.lowerer import ast_shape, global_dims, lower_ast
from ember.codegen.opts import Opt, apply_opts, local_size
from ember.codegen.vectorize import vectorize_memory
from ember.dtype import PtrDType
from ember.helpers import DEBUG, gc_paused, prod
from ember.ir.pattern import keep_rewrites
from ember.ir.uop import GroupOp, Ops, UOp
from ember.renderer import Renderer


@dataclass(frozen=True)
class ProgramSpec:
    """Everything needed to compile and launch one kernel, plus estimates for DEBUG output."""

    name: str
    src: str
    uops: tuple[UOp, ...]
    global_size: tuple[int, ...]  # launch grid, innermost global loop first (see docs/contracts.md)
    local_size: tuple[int, int, int] | None
    estimated_ops: int
    estimated_mem: int
    outs: tuple[int, ...]
    ins: tuple[int, ...]
    #: the optimizations the kernel was lowered with
    opts: tuple[Opt, ...] = ()


def kernel_name(ast: UOp) -> str:
    """A readable name: ``E_`` for elementwise, ``r_`` with reduce sizes for reductions."""
    shape = global_dims(ast)
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE_AXIS]
    parts = [_size_name(d) for d in shape if d != 1] or ["1"]
    if reduces:
        memo: dict[UOp, tuple[int, ...]] = {}
        src_shape = ast_shape(reduces[0].src[0], memo)
        parts += [_size_name(src_shape[a]) for a in reduces[0].arg[1]]
    return ("r_" if reduces else "E_") + "_".join(parts)


def _size_name(d: int | UOp) -> str:
    """A size in a kernel name: the number, or a symbolic size spelled with letters (``n``, ``nP1`` for n+1)."""
    if isinstance(d, int):
        return str(d)
    from ember.ir.symbolic import sint_str

    text = sint_str(d)
    for sym, word in (("+", "P"), ("*", "M"), ("-", "S"), ("//", "D"), ("%", "R"), ("(", ""), (")", "")):
        text = text.replace(sym, word)
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)


def estimate(uops: list[UOp]) -> tuple[int, int]:
    """(ALU ops, bytes of global memory) executed, counting loop trip counts (and a vector op's lanes: the same
    count as the scalar program's)."""
    mult, ops = 1, 0
    stack: list[int] = []
    for u in uops:
        if u.op is Ops.RANGE:
            stack.append(mult)
            size = u.src[1].arg - u.src[0].arg if u.src[1].op is Ops.CONST and u.src[0].op is Ops.CONST else 1
            mult *= max(size, 0)
        elif u.op is Ops.ENDRANGE:
            mult = stack.pop()
        elif u.op in GroupOp.ALU and isinstance(u.dtype, object) and not _is_index(u):
            ops += mult * getattr(u.dtype, "count", 1)  # a vector op does one op per lane
        elif u.op is Ops.WMMA:
            # each lane's share of one instruction's multiply-adds, split over the elements of D it holds
            (m, n, k), threads, counts = u.arg[1], u.arg[2], u.arg[3]
            ops += mult * 2 * m * n * k // (threads * counts[2])
    mem = sum(u.arg[1] * u.dtype.base.itemsize for u in uops if u.op is Ops.DEFINE_GLOBAL
              and isinstance(u.dtype, PtrDType))
    return ops, mem


def _is_index(u: UOp) -> bool:
    return getattr(u.dtype, "kind", "") in "iub" and u.op in (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.CMPLT, Ops.AND)


class LaunchTooLarge(ValueError):
    """A kernel needs more work-items in a launch dimension than its target's hardware ids count (``global_max``):
    refused rather than launched with wrapping ids."""


def lower_program(ast: UOp, renderer: Renderer, opts: Sequence[Opt], name: str | None = None) -> ProgramSpec:
    """Lower (once), linearize and render one kernel AST for ``renderer`` with ``opts`` (see
    :func:`ember.codegen.get_program`, which also chooses the opts). A bad opt raises
    :class:`~ember.codegen.opts.OptError`."""
    with gc_paused(), keep_rewrites():
        return _lower_program(ast, renderer, list(opts), name)


def _lower_program(ast: UOp, renderer: Renderer, opts: list[Opt], name: str | None) -> ProgramSpec:
    plan = apply_opts(ast, renderer, opts)
    sink = lower_ast(ast, len(renderer.global_max) if renderer.global_max is not None else None, plan, renderer)
    sink = vectorize_memory(sink, renderer.vector_widths, renderer.vector_alu, renderer.epilogue_loop_min)
    uops = linearize(sink)
    if DEBUG >= 5:
        for i, u in enumerate(uops):
            print(f"{i:4d} {u.op.name:14s} {str(u.dtype):22s} {[uops.index(s) if s in uops else -1 for s in u.src]} "
                  f"{u.arg!r}")
    name = name or kernel_name(ast)
    if DEBUG >= 3:
        print(f"{name:32s} opts {opts}")
    src = renderer.render(name, uops)
    ops, mem = estimate(uops)
    outs = tuple(s.src[0].arg[0] for s in ast.src)
    ins = tuple(u.arg[0] for u in uops if u.op is Ops.DEFINE_GLOBAL and u.arg[0] not in outs)
    # launch sizes: the innermost global loop is dimension 0
    # (a loop-based target's global loop may run to a symbolic size: its launch size is its maximum)
    sizes = [u.src[1].arg if u.src[1].op is Ops.CONST else int(u.src[1].vmax)
             for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"][::-1]
    g3 = tuple(sizes + [1] * (3 - len(sizes))) if len(sizes) <= 3 else (prod(sizes), 1, 1)
    if renderer.global_max is not None and any(g > most for g, most in zip(g3, renderer.global_max)):
        # (a launch dimension past the target's limit would wrap in its hardware ids)
        raise LaunchTooLarge(f"kernel {name}: launch size {g3} is more than {type(renderer).__name__} launches per "
                             f"dimension ({tuple(renderer.global_max)})")
    return ProgramSpec(name, src, tuple(uops), g3, local_size(plan, renderer), ops, mem, outs, ins,
                       tuple(opts))
