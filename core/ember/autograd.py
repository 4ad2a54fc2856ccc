"""Reverse-mode autograd as local derivative rules on a tape of tensors.

Every differentiable primitive a Tensor method builds records a :class:`GradFn`: its parent
tensors and a function from the output gradient to the parents' gradients. ``backward`` and
``gradient`` walk that tape in reverse topological order and accumulate.

As in tinygrad, ``requires_grad`` is three-valued: True (train it), False (never differentiate
through it) and None, the default, "not decided": ops on such tensors are recorded, so
``gradient()`` works for plain tensors and ``backward()`` fills them when nothing was marked True.

Rules are written with Tensor operations, so gradients are lazy graphs like everything else and fuse with the
optimizer step when realized together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ember.ir.uop import Ops, toposort

# a rule gets (output gradient, output tensor, parent tensors) and returns one gradient (or None) per parent
Rule = Callable[[Any, Any, Sequence[Any]], Sequence[Any]]


@dataclass
class GradFn:
    """How a tensor was made: its parents and the rule for their gradients."""

    parents: tuple[Any, ...]
    rule: Rule
    name: str = ""


ALU_RULES: dict[Ops, Rule] = {
    Ops.ADD: lambda g, out, p: (g, g),
    Ops.SUB: lambda g, out, p: (g, -g),
    Ops.MUL: lambda g, out, p: (g * p[1], g * p[0]),
    Ops.FDIV: lambda g, out, p: (g / p[1], -g * out / p[1]),
    Ops.NEG: lambda g, out, p: (-g,),
    Ops.RECIP: lambda g, out, p: (-g * out * out,),
    Ops.SQRT: lambda g, out, p: (g / (out * 2),),
    Ops.EXP: lambda g, out, p: (g * out,),
    Ops.EXP2: lambda g, out, p: (g * out * math.log(2),),
    Ops.LOG: lambda g, out, p: (g / p[0],),
    Ops.LOG2: lambda g, out, p: (g / (p[0] * math.log(2)),),
    Ops.SIN: lambda g, out, p: (g * p[0].cos(),),
    Ops.TRUNC: lambda g, out, p: (g * 0,),
    # torch splits the gradient evenly between equal inputs
    Ops.MAX: lambda g, out, p: ((p[0] > p[1]).where(g, (p[0] == p[1]).where(g * 0.5, g * 0)),
                                (p[1] > p[0]).where(g, (p[0] == p[1]).where(g * 0.5, g * 0))),
    Ops.WHERE: lambda g, out, p: (None, p[0].where(g, g * 0), p[0].where(g * 0, g)),
    # like torch: no gradient to the base where the exponent is 0 (0 ** -1 would give 0 * inf), none to the
    # exponent where the base is 0 and the exponent non-negative
    Ops.POW: lambda g, out, p: ((p[1] == 0).where(g * 0, g * p[1] * p[0].pow(p[1] - 1)),
                                ((p[0] == 0) & (p[1] >= 0)).where(g * 0, g * out * p[0].log())),
}


def tracked(t: Any) -> bool:
    """Whether gradients flow into ``t``: ``requires_grad`` True or None (tinygrad's "not decided").

    False stops them."""
    return t.requires_grad is not False


def toposort_tape(root: Any) -> list[Any]:
    """Tensors reachable from ``root`` through recorded GradFns, parents first."""
    def parents(t: Any) -> list[Any]:
        return [] if t._ctx is None else [p for p in t._ctx.parents if tracked(p)]

    return toposort([root], sources=parents)


def backward_targets(order: Sequence[Any]) -> list[Any]:
    """The leaves ``backward()`` fills: float leaves with ``requires_grad=True``, or, when the graph has none
    (nothing was decided, as in tinygrad's docs), every float leaf whose ``requires_grad`` is None."""
    leaves = [t for t in order if t._ctx is None and t.dtype.kind == "f"]
    return [t for t in leaves if t.requires_grad] or [t for t in leaves if t.requires_grad is None]


def run_backward(root: Any, seed: Any, targets: Sequence[Any]) -> dict[int, Any]:
    """Propagate ``seed`` from ``root``; returns the gradient of each reached target, by id.

    Only tensors on a path from ``root`` to a target are differentiated, so tensors that merely
    could take a gradient (constants, data) cost nothing.
    """
    order = toposort_tape(root)
    want = {id(t) for t in targets}
    needed: set[int] = set()
    for t in order:  # parents first: a tensor is needed when it is a target or one of its parents is needed
        if id(t) in want or (t._ctx is not None and any(id(p) in needed for p in t._ctx.parents)):
            needed.add(id(t))
    grads: dict[int, Any] = {id(root): seed}
    out: dict[int, Any] = {}
    for t in reversed(order):
        g = grads.pop(id(t), None)
        if g is None or id(t) not in needed:
            continue
        if id(t) in want:
            out[id(t)] = g
        if t._ctx is None:
            continue
        pgrads = t._ctx.rule(g, t, t._ctx.parents)
        for p, pg in zip(t._ctx.parents, pgrads):
            if pg is None or id(p) not in needed:
                continue
            if pg.shape != p.shape:
                raise RuntimeError(f"gradient rule {t._ctx.name} gave shape {pg.shape} for an input of shape {p.shape}")
            if pg.dtype != p.dtype:
                pg = pg.cast(p.dtype)
            grads[id(p)] = pg if id(p) not in grads else grads[id(p)] + pg
    return out
