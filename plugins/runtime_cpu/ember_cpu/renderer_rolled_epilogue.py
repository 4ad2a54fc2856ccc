"""The code after a vector tile's loop, rolled back into a loop over the tile.

After a register tile's loop a kernel computes each output from its accumulator (a bias added, a relu mask,
an SGD update) and stores it: the same few operations once per accumulator, over a thousand statements for a
32 x 8 tile, which cost gcc more than the tile's loop (0.27 s of gcc -O2 for a relu mask of 256 elements).
When every element's computation is the same but for index constants that move linearly with the element's
place in the tile, :class:`RolledEpilogue` renders it once, as a loop over the tile's rows and columns (the
inner one along the output's contiguous axis, ``omp simd``): gcc builds it in a fraction of the time. Each
element still computes the same operations on the same values, one statement per operation, as before.

:class:`RolledEpilogues` is the renderer's part (a base class of the CPU renderer, so the lowering cache's
fingerprint of the renderer's code covers this module).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ember.renderer import DType, GroupOp, Ops, UOp, dtypes
from ember_cpu.renderer_tile_order import _affine

#: value types an epilogue's operations may have (bfloat16 and emulated float16 round after each operation)
_VALUE_TYPES = (dtypes.float32, dtypes.float64, dtypes.bool)


def _plain_index(u: UOp) -> bool:
    """Whether an index term is integer math over loop variables, runtime values and constants (which the
    rolled loop writes out again; anything else has a name only the shared renderer knows)."""
    if u.op in (Ops.RANGE, Ops.DEFINE_VAR, Ops.CONST):
        return True
    return u.op in GroupOp.ALU and isinstance(u.dtype, DType) and u.dtype.kind in "iu" and \
        all(_plain_index(s) for s in u.src)


class _NotRollable(Exception):
    """An epilogue element that is no instance of the common pattern."""


class _Walk:
    """One element's store, in a canonical form: its shape (equal for every element of a rollable epilogue),
    the constants of its indices in walk order, the accumulators it reads and the loads of the buffers it
    stores to."""

    def __init__(self, store: UOp, accs: frozenset[UOp]):
        self.uop, self.accs = store, accs
        self.consts: list[int] = []
        self.read: set[UOp] = set()
        # each uop once (as the renderer names it once): a value used twice has its index constants once
        self.seen: dict[UOp, tuple] = {}
        self.loads: list[tuple[UOp, frozenset[tuple[UOp, int]], int]] = []
        vars_, const = self._index(store.src[1])
        self.store = (store.src[0], vars_, const)
        self.shape = ("store", store.src[0], vars_, self._value(store.src[2]))

    def _index(self, idx: UOp) -> tuple[frozenset[tuple[UOp, int]], int]:
        vars_, const = _affine(idx)
        if not all(_plain_index(v) for v, _ in vars_):
            raise _NotRollable("an index that reads memory")
        self.consts.append(const)
        return vars_, const

    def _value(self, u: UOp) -> tuple:
        if u not in self.seen:
            self.seen[u] = self._shape(u)
        return self.seen[u]

    def _shape(self, u: UOp) -> tuple:
        if u in self.accs:
            self.read.add(u)
            return ("acc",)
        if u.op is Ops.CONST:
            return ("const", u.arg, u.dtype)
        if u.op is Ops.LOAD and len(u.src) == 2 and u.src[0].op is Ops.DEFINE_GLOBAL and u.dtype in _VALUE_TYPES:
            vars_, const = self._index(u.src[1])
            self.loads.append((u.src[0], vars_, const))
            return ("load", u.src[0], vars_, u.dtype)
        if (u.op in GroupOp.ALU or u.op is Ops.CAST) and u.dtype in _VALUE_TYPES and \
                all(s.dtype in _VALUE_TYPES for s in u.src):
            return ("alu", u.op, u.dtype, u.arg, tuple(self._value(s) for s in u.src))
        raise _NotRollable(u.op)


@dataclass(frozen=True)
class RolledEpilogue:
    """The stores after a tile's loop (one per element of a ``rows x cols`` tile), rendered as a loop.

    ``template`` is element (0, 0)'s store; the k-th index constant met walking it is
    ``c + ci * i + cj * j`` in element (i, j), with ``(c, ci, cj) = consts[k]``."""

    rows: int
    cols: int
    template: UOp
    consts: tuple[tuple[int, int, int], ...]
    #: the loop over ``i`` inside the one over ``j`` (the stores move by one element along ``i``)
    i_inner: bool
    #: the epilogue's uops (rendered by the loop instead)
    dropped: frozenset[UOp]

    @staticmethod
    def find(uops: list[UOp], reduce_range: UOp, cells: dict[UOp, tuple[int, int]], rows: int,
             cols: int) -> RolledEpilogue | None:
        """The epilogue of the tile whose accumulators are ``cells`` (each with its place ``(i, j)``), updated in
        ``reduce_range``'s loop: the uops from its end to the end of the enclosing loop. None when they are not
        one store per element, each the same computation but for index constants linear in ``(i, j)``."""
        end = next((k for k, u in enumerate(uops) if u.op is Ops.ENDRANGE and u.src[0] is reduce_range), None)
        if end is None:
            return None
        stop = next((k for k in range(end + 1, len(uops)) if uops[k].op is Ops.ENDRANGE), len(uops))
        region = [u for u in uops[end + 1:stop] if u.op is not Ops.CONST]
        stores = [u for u in region if u.op is Ops.STORE]
        if len(stores) != len(cells) or any(len(s.src) != 3 for s in stores):
            return None
        accs = frozenset(cells)
        walks: dict[tuple[int, int], _Walk] = {}
        try:
            for s in stores:
                w = _Walk(s, accs)
                if len(w.read) != 1:
                    return None
                walks[cells[next(iter(w.read))]] = w
        except _NotRollable:
            return None
        if len(walks) != len(cells) or (0, 0) not in walks:
            return None
        first = walks[(0, 0)]
        if any(w.shape != first.shape or len(w.consts) != len(first.consts) for w in walks.values()):
            return None
        consts = []
        for k, c in enumerate(first.consts):
            ci = walks[(1, 0)].consts[k] - c if rows > 1 else 0
            cj = walks[(0, 1)].consts[k] - c if cols > 1 else 0
            if any(w.consts[k] != c + ci * i + cj * j for (i, j), w in walks.items()):
                return None
            consts.append((c, ci, cj))
        # each element its own output, and a buffer it stores to read only at that element's output: the
        # elements may then run in any order
        if len({w.store[2] for w in walks.values()}) != len(walks):
            return None
        stored = {w.store[0] for w in walks.values()}
        if any(buf in stored and (vars_, const) != w.store[1:] for w in walks.values()
               for buf, vars_, const in w.loads):
            return None
        # nothing else happens there, and nothing later reads what the loop computes
        used = set().union(*(set(w.seen) for w in walks.values())) | set(stores)
        index_math = {u for u in region if u not in used and u.op in GroupOp.ALU and isinstance(u.dtype, DType)
                      and u.dtype.kind in "iu"}
        if any(u not in used and u not in index_math for u in region):
            return None
        dropped = frozenset(region)
        if any(s in dropped for u in uops[stop:] for s in u.src):
            return None
        _, ci, _ = consts[0]  # the store's index
        return RolledEpilogue(rows, cols, first.uop, tuple(consts), ci == 1, dropped)


class RolledEpilogues:
    """The CPU renderer's part: the C of a rolled epilogue."""

    def render_rolled(self, ep: RolledEpilogue, tile: str, name: str, cells: dict[UOp, tuple[int, int]]) -> list[str]:
        """``ep`` as a loop over the tile array ``tile`` (element (i, j) at ``tile[j * rows + i]``); ``name``
        prefixes its variables. Values the same for every element (a learning rate read from memory) are computed
        once, before the loop: in an OpenMP outlined loop the compiler may not know the load cannot see the
        stores, and reloads it per element (3% of an SGD step's weight-gradient kernel)."""
        i, j = f"{name}_i", f"{name}_j"
        consts = iter(ep.consts)
        body: list[str] = []
        before: list[str] = []
        names: dict[UOp, str] = {}
        invariant: set[UOp] = set()  # the values computed before the loop

        def index(idx: UOp) -> str:
            return index_of(idx)[0]

        def index_of(idx: UOp) -> tuple[str, bool]:
            """The index's C and whether it is the same for every element."""
            vars_, _ = _affine(idx)
            c, ci, cj = next(consts)
            # in a fixed order (a set's order changes from run to run, and the source is a cache key)
            terms = sorted(f"{self._index_var(v)} * {k}" if k != 1 else self._index_var(v) for v, k in vars_)
            terms += [f"{var} * {k}" if k != 1 else var for var, k in ((i, ci), (j, cj)) if k]
            terms += [str(c)] if c or not terms else []
            return "(" + " + ".join(terms) + ")", not ci and not cj

        def value(u: UOp) -> str:
            if u in names:
                return names[u]
            if u in cells:
                out = f"{tile}[{j} * {ep.rows} + {i}]"
            elif u.op is Ops.CONST:
                out = self.render_const(u.arg, u.dtype)
            else:
                if u.op is Ops.LOAD:
                    where, same = index_of(u.src[1])
                    expr = self.render_load_value(self._index_var(u.src[0]), where[1:-1], u.dtype)
                else:
                    srcs = [value(s) for s in u.src]
                    expr = self.render_cast(u, srcs[0]) if u.op is Ops.CAST else self.render_alu(u, srcs)
                    same = all(s in invariant or s.op is Ops.CONST for s in u.src)
                out = f"{name}_v{len(body) + len(before)}"
                (before if same else body).append(f"{self.render_dtype(u.dtype)} {out} = {expr};")
                if same:
                    invariant.add(u)
            names[u] = out
            return out

        store = ep.template
        where = index(store.src[1])
        val = value(store.src[2])
        value = None  # type: ignore[assignment]  # a recursive closure holds itself: unbound, it goes with refcounts
        buf = self._index_var(store.src[0])
        body.append(f"{buf}[{where[1:-1]}] = {self.render_store_value(val, store.src[0].pointer_dtype.base)};")
        outer, inner = ((j, ep.cols), (i, ep.rows)) if ep.i_inner else ((i, ep.rows), (j, ep.cols))
        lines = before + [f"for (int {outer[0]} = 0; {outer[0]} < {outer[1]}; {outer[0]}++) {{"]
        if inner[1] >= 4:
            lines.append("  #pragma omp simd")
        lines.append(f"  for (int {inner[0]} = 0; {inner[0]} < {inner[1]}; {inner[0]}++) {{")
        return lines + [f"    {s}" for s in body] + ["  }", "}"]

    def _index_var(self, u: UOp) -> str:
        """The C of an index term (a loop variable, a runtime value, a buffer, integer math over them)."""
        if u.op is Ops.RANGE:
            return f"{'gidx' if u.arg[1] == 'global' else 'ridx'}{u.arg[0]}"
        if u.op is Ops.DEFINE_VAR:
            return str(u.arg[0])
        if u.op is Ops.DEFINE_GLOBAL:
            return f"data{u.arg[0]}"
        if u.op is Ops.CONST:
            return self.render_const(u.arg, u.dtype)
        if u.op in GroupOp.ALU:
            return self.render_alu(u, [self._index_var(s) for s in u.src])
        raise NotImplementedError(f"an index term of {u.op}")

    # provided by the renderer
    render_dtype: Callable[..., str]
    render_const: Callable[..., str]
    render_alu: Callable[..., str]
    render_cast: Callable[..., str]
    render_load_value: Callable[..., str]
    render_store_value: Callable[..., str]
