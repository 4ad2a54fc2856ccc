"""The order in which a register tile's results are handed to the code after its loop.

gcc vectorizes a register tile (the accumulators of one reduction loop) from the group of stores after the loop:
neighbouring stores become the lanes of one vector, and the loop body is vectorized to match. When the tile's
accumulators are numbered along the axis its output is contiguous in, but its loads run along another one (a
matmul ``a.T @ b.T``: the output runs along ``b``'s rows, the loads of ``a`` along the output's columns), the
lanes follow the output and every vector of loads is put together from scalar loads: 2x slower than the same
tile with its lanes along the loads.

:func:`tile_order` finds such tiles and the order that puts neighbouring loads in neighbouring lanes; the
renderer then stores the accumulators to an array in that order right after the loop (a group of stores along
the loads), and the code after it reads the array. :class:`TileOrders` is the renderer's part of it, a base
class, so the lowering cache's fingerprint of the renderer's code covers this module too.
"""
from __future__ import annotations

from ember.renderer import Ops, UOp, split_terms, term_coeff, toposort

#: an index as (its variable terms with their coefficients, its constant)
Affine = tuple[frozenset[tuple[UOp, int]], int]


#: where a node keeps its :func:`_affine` answer
_AFFINE = "_ember_affine"


def _affine(idx: UOp) -> Affine:
    """``idx`` as its variable terms and its constant (a term that is not affine counts as a variable).

    A tile's analyses ask for the same few hundred indices again and again (once per accumulator and per epilogue
    element): UOps are immutable, so each node keeps its answer, which goes with it (a cache beside the nodes
    would keep every kernel's index nodes alive, for each garbage collection to walk)."""
    hit = idx.__dict__.get(_AFFINE)
    if hit is not None:
        return hit
    terms: dict[UOp, int] = {}
    const = 0
    for t in split_terms(idx):
        var, c = term_coeff(t)
        if var is None:
            const += c
        else:
            terms[var] = terms.get(var, 0) + c
    out = idx.__dict__[_AFFINE] = (frozenset(terms.items()), const)
    return out


def _loads_by_buffer(value: UOp, acc: UOp) -> dict[UOp, list[UOp]]:
    """The loads ``value`` (an accumulator's update) reads, by buffer (accumulators are not looked into)."""
    out: dict[UOp, list[UOp]] = {}
    for n in toposort([value], stop=lambda u: u.op is Ops.DEFINE_ACC or u is acc):
        if n.op is Ops.LOAD:
            out.setdefault(n.src[0], []).append(n)
    return out


def tile_order(uops: list[UOp], reduce_range: UOp, accs: list[UOp]) -> list[int] | None:
    """Where each accumulator of the tile ``accs`` (updated in ``reduce_range``'s loop) goes in the results
    array, when storing them in their own order would give gcc lanes along no load (None otherwise).

    Each accumulator is described by the offset, from the first accumulator's, of its one load of each buffer
    (a buffer read by more or fewer loads per accumulator, or at indices that differ by more than a constant,
    says nothing). When no buffer's loads step by one element from the first accumulator to the second, and one
    buffer's loads step by one between some two accumulators, the accumulators are ordered by the other
    buffers' offsets, then by that buffer's: neighbours in the array then read neighbouring elements."""
    if len(accs) < 2:
        return None
    start = uops.index(reduce_range)
    end = next((i for i, u in enumerate(uops) if u.op is Ops.ENDRANGE and u.src[0] is reduce_range), None)
    if end is None:
        return None
    updates = {u.src[0]: u.src[1] for u in uops[start + 1:end] if u.op is Ops.ASSIGN}
    if any(a not in updates for a in accs):
        return None
    per_acc = [_loads_by_buffer(updates[a], a) for a in accs]
    buffers = [b for b in per_acc[0] if all(len(loads.get(b, ())) == 1 for loads in per_acc)]
    offsets: dict[UOp, list[int]] = {}
    for b in buffers:
        first_vars, first_const = _affine(per_acc[0][b][0].src[1])
        column = []
        for loads in per_acc:
            vars_, const = _affine(loads[b][0].src[1])
            if vars_ != first_vars:
                break
            column.append(const - first_const)
        else:
            offsets[b] = column
    if not offsets or any(col[1] - col[0] == 1 for col in offsets.values()):
        return None  # already lanes along a load (or nothing to go by)
    along = [b for b, col in offsets.items() if 1 in {y - x for x in col for y in col}]
    if not along:
        return None
    lanes = along[0]
    others = [b for b in offsets if b is not lanes]
    order = sorted(range(len(accs)), key=lambda t: (*(offsets[b][t] for b in others), offsets[lanes][t]))
    if offsets[lanes][order[1]] - offsets[lanes][order[0]] != 1:
        return None
    slots = [0] * len(accs)
    for slot, t in enumerate(order):
        slots[t] = slot
    return slots


class TileOrders:
    """The CPU renderer's base that finds, before rendering, the register tiles to store in another order."""

    def tile_orders(self, uops: list[UOp], skip: frozenset[UOp] | set[UOp] = frozenset()) -> dict[UOp, list[int]]:
        """Each reduce loop of ``uops`` (but those in ``skip``) whose tile :func:`tile_order` reorders, with the
        slot of each of its accumulators (those opened right before the loop)."""
        orders: dict[UOp, list[int]] = {}
        opened: list[UOp] = []
        for u in uops:
            if u.op is Ops.DEFINE_ACC:
                opened.append(u)
            elif u.op in (Ops.RANGE, Ops.ENDRANGE):
                if u.op is Ops.RANGE and u.arg[1] == "reduce" and u not in skip and \
                        (slots := tile_order(uops, u, opened)) is not None:
                    orders[u] = slots
                opened = []
        return orders
