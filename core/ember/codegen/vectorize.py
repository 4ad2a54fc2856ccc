"""Vector loads and stores: the lanes of an upcast tile that touch neighbouring elements, moved together.

Lowering gives each copy of an upcast (or unrolled) axis its own LOAD and STORE, at indices that differ by
constants: ``base + 0, base + 1, ...``. Where the axis is contiguous in a buffer (stride 1), every element of a
run of ``n`` is touched, and ``base`` is provably a multiple of ``n``, the run is one aligned vector access:
a LOAD of ``dtype.vec(n)`` whose lanes the scalar users read through GEP, or a STORE of a VECTORIZE of the
``n`` values. A renderer says which widths it has for which dtypes (:attr:`ember.renderer.Renderer.vector_widths`);
one that declares none gets the scalar program unchanged.

Only what is certain is grouped: every lane of a run must be present (a vector never reads an element the
scalar program did not, so it stays within the buffer), loads must be ungated, stores share one gate, and the
index's alignment must follow from its terms (each variable term's coefficient a multiple of ``n``, the
constant too). ALU ops stay scalar.
"""
from __future__ import annotations

from collections.abc import Mapping

from ember.dtype import DType, PtrDType
from ember.ir.symbolic import split_terms, term_coeff
from ember.ir.uop import Ops, UOp, toposort


def _split_index(idx: UOp) -> tuple[UOp | None, int]:
    """``idx`` as (variable part, constant offset): the form lowering gives the copies of an upcast tile, which
    share the variable part (one node) and differ in the constant."""
    if idx.op is Ops.CONST:
        return None, idx.arg
    if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST:
        return idx.src[0], idx.src[1].arg
    return idx, 0


def _multiple_of(x: UOp | None, n: int) -> bool:
    """Whether every value of the index expression ``x`` is a multiple of ``n`` (from its terms' coefficients)."""
    if x is None:
        return True
    for t in split_terms(x):
        var, coeff = term_coeff(t)
        if coeff % n:
            return False
        if var is not None and var.dtype is not None and getattr(var.dtype, "kind", "f") not in "iu":
            return False
    return True


def _runs(offsets: set[int], base: UOp | None, widths: tuple[int, ...]) -> list[tuple[int, int]]:
    """(first offset, width) of each aligned run of ``offsets`` to access as one vector: the widest first, each
    offset in at most one run."""
    runs: list[tuple[int, int]] = []
    left = set(offsets)
    for n in sorted(widths, reverse=True):
        if n < 2 or not _multiple_of(base, n):
            continue
        for c in sorted(left):
            if c % n == 0 and all(c + k in left for k in range(n)):
                runs.append((c, n))
                left.difference_update(range(c, c + n))
    return runs


def _element(u: UOp) -> DType | None:
    """The element dtype of the global buffer ``u`` reads or writes, None for anything else."""
    buf = u.src[0]
    if buf.op is not Ops.DEFINE_GLOBAL or not isinstance(buf.dtype, PtrDType):
        return None
    return buf.dtype.base


def vectorize_memory(sink: UOp, widths: Mapping[DType, tuple[int, ...]]) -> UOp:
    """``sink`` (a lowered kernel, see :func:`ember.codegen.lowerer.lower_ast`) with each aligned run of
    neighbouring global loads and stores (see the module docstring) made one vector access of a width in
    ``widths[element dtype]``."""
    if not widths:
        return sink
    nodes = toposort([sink])
    # loads: (buffer, variable part) -> offset -> load
    load_groups: dict[tuple[UOp, UOp | None], dict[int, UOp]] = {}
    for n in nodes:
        if n.op is Ops.LOAD and len(n.src) == 2 and (dt := _element(n)) is not None and n.dtype == dt \
                and widths.get(dt):
            base, off = _split_index(n.src[1])
            load_groups.setdefault((n.src[0], base), {})[off] = n
    replace: dict[UOp, UOp] = {}
    for (buf, base), by_off in load_groups.items():
        dt = buf.pointer_dtype.base
        for first, n in _runs(set(by_off), base, widths[dt]):
            vload = UOp(Ops.LOAD, dt.vec(n), (buf, by_off[first].src[1]))
            for k in range(n):
                replace[by_off[first + k]] = UOp(Ops.GEP, dt, (vload,), k)
    stores = list(sink.src)
    if replace:
        done: dict[UOp, UOp] = {}
        for n in nodes:
            if n in replace:
                done[n] = replace[n]
                continue
            src = tuple(done.get(s, s) for s in n.src)
            done[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
        stores = [done[s] for s in stores]
    # stores: (buffer, variable part, gate) -> offset -> position in the sink
    store_groups: dict[tuple[UOp, UOp | None, UOp | None], dict[int, int]] = {}
    for i, s in enumerate(stores):
        if s.op is Ops.STORE and (dt := _element(s)) is not None and s.src[2].dtype == dt and widths.get(dt):
            base, off = _split_index(s.src[1])
            group = store_groups.setdefault((s.src[0], base, s.src[3] if len(s.src) > 3 else None), {})
            if off not in group:  # (two stores of one element are left as they are, in their order)
                group[off] = i
    drop: set[int] = set()
    for (buf, base, gate), by_off in store_groups.items():
        dt = buf.pointer_dtype.base
        for first, n in _runs(set(by_off), base, widths[dt]):
            at = [by_off[first + k] for k in range(n)]
            vals = tuple(stores[i].src[2] for i in at)
            value = _vectorized(vals, dt.vec(n))
            srcs = (buf, stores[at[0]].src[1], value) + ((gate,) if gate is not None else ())
            stores[min(at)] = UOp(Ops.STORE, None, srcs)
            drop.update(i for i in at if i != min(at))
    if not replace and not drop:
        return sink
    return UOp(Ops.SINK, sink.dtype, tuple(s for i, s in enumerate(stores) if i not in drop), sink.arg)


def _vectorized(vals: tuple[UOp, ...], dt: DType) -> UOp:
    """The vector of ``vals``: the vector they were read from when they are its lanes in order (a copy), else a
    VECTORIZE."""
    first = vals[0]
    if first.op is Ops.GEP and first.src[0].dtype == dt and \
            all(v.op is Ops.GEP and v.src[0] is first.src[0] and v.arg == k for k, v in enumerate(vals)):
        return first.src[0]
    return UOp(Ops.VECTORIZE, dt, vals)


__all__ = ["vectorize_memory"]
