"""Register tiles of outer-product multiply-adds written as C vector code (GCC vector extensions).

A matmul's register tile is ``rows x cols`` accumulators, each updated once per reduce step as
``acc[i, j] + x[i] * y[j]``: ``x`` read from one buffer at ``rows`` neighbouring elements, ``y`` at ``cols``
elements of another. Written as scalar C (thousands of lines for a 32 x 8 tile), gcc's SLP vectorizer and
register allocator turn it into vector code, at a cost of a quarter to a third of a second per kernel. Written
with vector types, ``x`` is loaded as ``rows / lanes`` vectors, each ``y[j]`` is broadcast, and the accumulators
are ``rows / lanes * cols`` vectors: the same instructions, built several times faster. A column sum's tile
(``acc[i] + x[i]``, a bias gradient) is the same with one column and no ``y``.

Float semantics are kept: each accumulator still adds one product per reduce step, in the same order, as one
statement for the product and one for the sum (which a compiler contracts into a fused multiply-add exactly
when it would contract the scalar statements). After the loop the vectors are stored to the tile array the
code after it reads (see :meth:`CPURenderer.render_loop_results`), so that code is unchanged.

:class:`VectorTile` finds such a tile in the linearized uops; :class:`VectorTiles` is the renderer's part (a
base class of :class:`~ember_cpu.renderer.CPURenderer`, so the lowering cache's fingerprint of the renderer's
code covers this module).
"""
from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from ember.renderer import DType, GroupOp, Ops, UOp, dtypes
from ember_cpu.renderer_rolled_epilogue import RolledEpilogue, RolledEpilogues
from ember_cpu.renderer_tile_order import _affine

#: the narrowest vector worth writing, in bytes (one SSE/NEON register)
MIN_VECTOR_BYTES = 16
#: the fewest accumulators a vector tile has (a smaller tile costs the compiler little either way)
MIN_VECTOR_TILE = 8


def _loop_body(uops: list[UOp], reduce_range: UOp) -> tuple[int, list[UOp]] | None:
    """The index of ``reduce_range`` in ``uops`` and the uops inside its loop (None when it is never closed)."""
    start = uops.index(reduce_range)
    end = next((i for i, u in enumerate(uops) if u.op is Ops.ENDRANGE and u.src[0] is reduce_range), None)
    return None if end is None else (start, uops[start + 1:end])


def _load_of(factor: UOp) -> UOp | None:
    """The plain load a tile's factor reads: the factor itself, or the load in ``max(load, c)`` with ``c`` a
    constant that is not nan (a relu of the loaded value); None for anything else."""
    load = factor.src[0] if factor.op is Ops.MAX and factor.src[1].op is Ops.CONST and \
        not math.isnan(float(factor.src[1].arg)) else factor
    return load if load.op is Ops.LOAD and len(load.src) == 2 and load.dtype == factor.dtype else None


def _load_src(factor: UOp) -> UOp:
    """The load of a factor :func:`_load_of` accepted."""
    load = _load_of(factor)
    assert load is not None, "a tile factor without its load"
    return load


def _buffer(factor: UOp) -> UOp:
    """The buffer a tile factor reads."""
    return _load_src(factor).src[0]


def _update(assign: UOp) -> tuple[UOp, UOp, UOp | None, UOp, tuple[UOp, ...]] | None:
    """``(acc, add, mul, assign, factors)`` when ``assign`` updates ``acc`` as ``acc + a * b`` (``mul`` is that
    product, ``factors`` are ``a`` and ``b``) or ``acc + a`` (``mul`` is None), in either order, ``a`` and ``b``
    loads of the accumulator's float type (or relus of loads, see :func:`_load_of`); None otherwise."""
    acc, val = assign.src
    if acc.op is not Ops.DEFINE_ACC or val.op is not Ops.ADD or acc.value_dtype not in (dtypes.float32,
                                                                                         dtypes.float64):
        return None
    if val.src[0] is acc:
        term = val.src[1]
    elif val.src[1] is acc:
        term = val.src[0]
    else:
        return None
    if val.dtype != acc.value_dtype or term.dtype != acc.value_dtype:
        return None
    mul, loads = (term, term.src) if term.op is Ops.MUL else (None, (term,))
    if any(s.dtype != acc.value_dtype or _load_of(s) is None for s in loads):
        return None
    return acc, val, mul, assign, loads


def _int_math(u: UOp) -> bool:
    """A constant or integer arithmetic (index math)."""
    return u.op is Ops.CONST or (u.op in GroupOp.ALU and isinstance(u.dtype, DType) and u.dtype.kind in "iu")


def _nest_top(uops: list[UOp], start: int, end: int) -> int:
    """The index of the outermost reduce loop that encloses the loop opened at ``start`` (closed at ``end``) with
    nothing but index math besides: its loops open one inside the other and close together. ``start`` when the
    loop is not nested so."""
    top, k, ends = start, start - 1, end + 1
    while k >= 0 and (_int_math(uops[k]) or (uops[k].op is Ops.RANGE and uops[k].arg[1] == "reduce")):
        if uops[k].op is Ops.RANGE:
            if ends >= len(uops) or uops[ends].op is not Ops.ENDRANGE or uops[ends].src[0] is not uops[k]:
                break
            top, ends = k, ends + 1
        k -= 1
    return top


@dataclass(frozen=True)
class VectorTile:
    """A register tile of ``rows x cols`` outer-product multiply-adds in one reduce loop.

    Accumulator ``accs[t]`` sums ``x[i] * y[j]`` with ``(i, j) = cells[t]``: ``x[i]`` is ``x_load``'s element
    plus ``i`` (``rows`` a multiple of ``width``, the lanes of a vector), ``y[j]`` is ``y_loads[j]``; a column
    sum has no ``y_loads`` (one column) and sums ``x[i]``. Its result goes to slot ``j * rows + i`` of the tile
    array."""

    accs: tuple[UOp, ...]
    cells: tuple[tuple[int, int], ...]
    rows: int
    cols: int
    width: int
    dtype: DType
    #: the accumulators' common starting value
    init: UOp
    x_load: UOp
    #: ``x[i]`` is ``max(element, x_max)`` (a relu) where not None
    x_max: object
    y_loads: tuple[UOp, ...]
    #: every load in the loop, in order (each is still rendered: its buffer and index name the vector code's)
    body_loads: tuple[UOp, ...]
    #: the multiply-adds and updates the vector code replaces
    dropped: frozenset[UOp]
    #: the outermost loop of the reduce nest whose innermost loop updates the tile (a convolution's kernel rows,
    #: kernel columns and channels), where the vector accumulators are opened; None: the tile's own loop
    outer: UOp | None = None

    @property
    def slots(self) -> list[int]:
        """Where each accumulator's result goes in the tile array."""
        return [j * self.rows + i for i, j in self.cells]

    @staticmethod
    def find(uops: list[UOp], reduce_range: UOp, vector_bytes: int) -> VectorTile | None:
        """The tile updated in ``reduce_range``'s loop, with vectors of at most ``vector_bytes`` bytes, or None
        when the loop does anything else (or the tile has no vector-sized run of neighbouring loads)."""
        found = _loop_body(uops, reduce_range)
        if found is None:
            return None
        start, body = found
        assigns = [u for u in body if u.op is Ops.ASSIGN]
        if len(assigns) < MIN_VECTOR_TILE:
            return None
        updates = [_update(a) for a in assigns]
        if any(up is None for up in updates):
            return None
        ups = [up for up in updates if up is not None]
        dt, init = ups[0][0].value_dtype, ups[0][0].src[0]
        if init.op is not Ops.CONST or any(acc.value_dtype != dt or acc.src[0] is not init for acc, *_ in ups):
            return None
        best: VectorTile | None = None
        if all(mul is None for _, _, mul, _, _ in ups):
            # a column sum: each update adds one element of one buffer
            bufs: tuple[UOp, ...] = (_buffer(ups[0][4][0]),)
            if any(_buffer(loads[0]) is not bufs[0] for *_, loads in ups):
                return None
            best = VectorTile._grid(ups, [loads[0] for *_, loads in ups], None, dt, init, vector_bytes)
            # not an unrolled sum along a contiguous run (its steps read on where the tile's run ends): that is
            # vectorized along the reduction, many partial sums at once (see CPURenderer.render_range_open)
            if best is not None and dict(_affine(best.x_load.src[1])[0]).get(reduce_range, 0) <= best.rows:
                return None
        elif any(mul is None for _, _, mul, _, _ in ups):
            return None
        else:
            # the two buffers every update multiplies, and each update's load of each
            first = ups[0][4]
            bufs = (_buffer(first[0]), _buffer(first[1]))
            if bufs[0] is bufs[1]:
                return None
            per_buf: list[list[UOp]] = [[], []]
            for *_, loads in ups:
                by_buf = {_buffer(ld): ld for ld in loads}
                if set(by_buf) != set(bufs):
                    return None
                for b in (0, 1):
                    per_buf[b].append(by_buf[bufs[b]])
            for xb in (0, 1):
                tile = VectorTile._grid(ups, per_buf[xb], per_buf[1 - xb], dt, init, vector_bytes)
                if tile is not None and (best is None or tile.rows > best.rows):
                    best = tile
        if best is None:
            return None
        # nothing else in the loop but the tile's loads and integer index math
        if any(u not in best.dropped and u.op not in (Ops.LOAD, Ops.CONST) and
               not (u.op in GroupOp.ALU and isinstance(u.dtype, DType) and u.dtype.kind in "iu") for u in body):
            return None
        body_loads = [u for u in body if u.op is Ops.LOAD]
        if any(u.src[0] not in bufs for u in body_loads):
            return None
        # a load the tile reads but the loop does not hold (a loop-invariant one, e.g. a broadcast constant
        # hoisted out of it) is not rendered inside the loop: the scalar program handles it
        if any(u not in body_loads for u in (best.x_load, *best.y_loads)):
            return None
        # the replaced uops feed nothing else
        if any(s in best.dropped for u in uops if u not in best.dropped for s in u.src):
            return None
        outer = _nest_top(uops, start, start + len(body) + 1)
        # the loop's accumulators (those declared since the loop before the nest) are the tile's, in order
        since = max((i for i, u in enumerate(uops[:outer]) if u.op in (Ops.RANGE, Ops.ENDRANGE)), default=-1)
        if [u for u in uops[since + 1:outer] if u.op is Ops.DEFINE_ACC] != list(best.accs):
            return None
        return VectorTile(best.accs, best.cells, best.rows, best.cols, best.width, dt, init, best.x_load,
                          best.x_max, best.y_loads, tuple(body_loads), best.dropped,
                          uops[outer] if outer != start else None)

    @staticmethod
    def _grid(ups: list[tuple[UOp, UOp, UOp | None, UOp, tuple[UOp, ...]]], xs: list[UOp], ys: list[UOp] | None,
              dt: DType, init: UOp, vector_bytes: int) -> VectorTile | None:
        """The tile with ``xs`` (each update's load of one buffer) as the neighbouring elements ``x[i]`` and
        ``ys`` as ``y[j]`` (None: a column sum, one column), or None when the loads do not form a full
        ``rows x cols`` grid that way."""
        def offsets(factors: list[UOp]) -> list[int] | None:
            forms = [_affine(_load_src(f).src[1]) for f in factors]
            if any(f[0] != forms[0][0] for f in forms):
                return None  # indices that differ by more than a constant
            return [f[1] for f in forms]
        xo, yo = offsets(xs), (offsets(ys) if ys is not None else [0] * len(xs))
        if xo is None or yo is None:
            return None
        x0 = min(xo)
        rows = max(xo) - x0 + 1
        ycols = sorted(set(yo))
        cells = tuple((x - x0, ycols.index(y)) for x, y in zip(xo, yo))
        if len(set(cells)) != len(cells) or rows * len(ycols) != len(cells):
            return None  # not every (i, j) once
        width = vector_bytes // dt.itemsize
        while width > 1 and rows % width:
            width //= 2
        if width * dt.itemsize < MIN_VECTOR_BYTES:
            return None
        # the x factors all loads, or all relus against one constant; the y factors loads
        relus = {f.src[1].arg if f.op is Ops.MAX else None for f in xs}
        if len(relus) != 1 or any(f.op is not Ops.LOAD for f in ys or ()):
            return None
        x_max = relus.pop()
        x_load = _load_src(xs[xo.index(x0)])
        y_loads = tuple(ys[yo.index(y)] for y in ycols) if ys is not None else ()
        dropped = frozenset(u for _, add, mul, assign, _ in ups for u in (add, mul, assign) if u is not None)
        dropped |= {f for f in xs if f.op is Ops.MAX}
        return VectorTile(tuple(up[0] for up in ups), cells, rows, len(ycols), width, dt, init, x_load, x_max,
                          y_loads, (), dropped)


class VectorTiles(RolledEpilogues):
    """The CPU renderer's part: which reduce loops are vector tiles (and which of their epilogues are rolled into
    a loop, see :mod:`ember_cpu.renderer_rolled_epilogue`), and their C.

    Rendering state (set by :meth:`find_vector_tiles` on the per-kernel copy of the renderer): the open tile, its
    name, and the (buffer, index) each of its loop's loads rendered as."""

    #: write outer-product register tiles with vector types (see :class:`VectorTile`)
    vector_tiles = True
    vector_floats: int

    #: roll a vector tile's epilogue into a loop where it can (see :class:`RolledEpilogue`)
    rolled_epilogues = True
    _undeclared: AbstractSet[UOp]
    #: no vector tile open (a render sets its own, see find_vector_tiles)
    _vtile_open: tuple[VectorTile, str, list[tuple[str, str]]] | None = None

    def find_vector_tiles(self, uops: list[UOp]) -> dict[UOp, VectorTile]:
        """Each reduce loop of ``uops`` that is a vector tile, with its tile; the rolled epilogues found are
        left in ``rolled`` (by tile), the uops both replace in ``vector_dropped``, the loop each tile's vectors
        open before in ``vector_opens`` (the outermost of a nest of reduce loops)."""
        self._vtile_open = None
        self._vtile_closed: tuple[VectorTile, str] | None = None
        self._vtile_count = 0
        self.rolled: dict[VectorTile, RolledEpilogue] = {}
        self.vector_dropped: set[UOp] = set()
        # the scalar accumulators and loads the vector code makes dead: not written at all (less for the compiler)
        self._undeclared = undeclared = set()
        self.vector_opens: dict[UOp, VectorTile] = {}
        if not self.vector_tiles:
            return {}
        found: dict[UOp, VectorTile] = {}
        for u in uops:
            if u.op is Ops.RANGE and u.arg[1] == "reduce" and \
                    (tile := VectorTile.find(uops, u, self.vector_floats * 4)) is not None:
                found[u] = tile
                top = tile.outer if tile.outer is not None else u
                self.vector_opens[top] = tile
                self.vector_dropped |= tile.dropped
                undeclared |= {*tile.accs, *tile.body_loads}
                cells = dict(zip(tile.accs, tile.cells))
                if self.rolled_epilogues and \
                        (ep := RolledEpilogue.find(uops, top, cells, tile.rows, tile.cols)) is not None:
                    self.rolled[tile] = ep
                    self.vector_dropped |= ep.dropped
        return found

    def vector_type(self, tile: VectorTile, declared: dict[str, str]) -> str:
        """The name of the tile's vector type, its typedef added to the kernel's declarations."""
        scalar = self.render_dtype(tile.dtype)
        name = f"ember_v{tile.width}{scalar[0]}"
        declared[name] = f"  typedef {scalar} {name} __attribute__((vector_size({tile.width * tile.dtype.itemsize})));"
        return name

    def vector_tile_open(self, tile: VectorTile, loop: str, declared: dict[str, str]) -> list[str]:
        """The tile's vector accumulators (its scalar ones are not declared), then the loop's first line."""
        name = f"vtile{self._vtile_count}"
        self._vtile_count += 1
        self._vtile_open = (tile, name, [])
        vt = self.vector_type(tile, declared)
        init = ", ".join([self.render_const(tile.init.arg, tile.dtype)] * tile.width)
        accs = [f"{name}_a{j}_{v}" for j in range(tile.cols) for v in range(tile.rows // tile.width)]
        return [f"{vt} {a} = {{{init}}};" for a in accs] + [loop]

    def vector_tile_load(self, buf: str, idx: str) -> None:
        """Note how a load of the open tile's loop was rendered."""
        if self._vtile_open is not None:
            self._vtile_open[2].append((buf, idx))

    def vector_tile_step(self, tile: VectorTile, declared: dict[str, str]) -> list[str]:
        """One reduce step of the open tile: ``x`` as vectors, each ``y[j]`` broadcast, one multiply and one add
        per vector accumulator (separate statements: contracted, or not, as the scalar tile's would be)."""
        assert self._vtile_open is not None and self._vtile_open[0] is tile, "a vector tile's step outside it"
        _, name, rendered = self._vtile_open
        assert len(rendered) == len(tile.body_loads), "a vector tile's loads were not all rendered"
        where = dict(zip(tile.body_loads, rendered))
        self._vtile_open, self._vtile_closed = None, (tile, name)
        vt = self.vector_type(tile, declared)
        xbuf, xidx = where[tile.x_load]
        nvec = tile.rows // tile.width
        lines = [f"  {vt} {name}_x{v}; __builtin_memcpy(&{name}_x{v}, &{xbuf}[{xidx}] + {v * tile.width}, "
                 f"sizeof({name}_x{v}));" for v in range(nvec)]
        if tile.x_max is not None:
            lines += self._vector_max(tile, name, nvec, declared)
        if not tile.y_loads:  # a column sum
            return lines + [f"  {name}_a0_{v} = {name}_a0_{v} + {name}_x{v};" for v in range(nvec)]
        for j, y in enumerate(tile.y_loads):
            ybuf, yidx = where[y]
            lines.append(f"  {{ {self.render_dtype(tile.dtype)} {name}_y = {ybuf}[{yidx}];")
            for v in range(nvec):
                acc = f"{name}_a{j}_{v}"
                lines.append(f"    {vt} {name}_p{v} = {name}_x{v} * {name}_y; {acc} = {acc} + {name}_p{v};")
            lines.append("  }")
        return lines

    def _vector_max(self, tile: VectorTile, name: str, nvec: int, declared: dict[str, str]) -> list[str]:
        """``x = max(x, c)`` on the loaded vectors as the scalar ``!(x <= c) ? x : c`` computes it (a nan is kept,
        an equal value gives ``c``): C has no vector ``?:``, so the lanes are chosen through the compare's mask."""
        vt = self.vector_type(tile, declared)
        it = f"ember_v{tile.width}i{tile.dtype.itemsize}"
        ints = "int" if tile.dtype.itemsize == 4 else "long long"
        declared[it] = f"  typedef {ints} {it} __attribute__((vector_size({tile.width * tile.dtype.itemsize})));"
        c = self.render_const(tile.x_max, tile.dtype)
        lines = [f"  const {vt} {name}_c = {{{', '.join([c] * tile.width)}}};"]
        for v in range(nvec):
            x = f"{name}_x{v}"
            lines.append(f"  {{ {it} m = {x} <= {name}_c; {x} = ({vt})((~m & ({it}){x}) | (m & ({it}){name}_c)); }}")
        return lines

    def vector_tile_results(self, n_accs: int, tile_name: str) -> tuple[list[str], list[str]] | None:
        """After a vector tile's loop: its vectors stored to the array ``tile_name``, and each accumulator's
        element of it (None when the loop just closed was no vector tile)."""
        if self._vtile_closed is None:
            return None
        tile, name = self._vtile_closed
        self._vtile_closed = None
        assert n_accs == len(tile.accs), "a vector tile's loop closed with other accumulators"
        lines = [f"{self.render_dtype(tile.dtype)} {tile_name}[{len(tile.accs)}];"]
        for j in range(tile.cols):
            for v in range(tile.rows // tile.width):
                acc, at = f"{name}_a{j}_{v}", j * tile.rows + v * tile.width
                lines.append(f"__builtin_memcpy(&{tile_name}[{at}], &{acc}, sizeof({acc}));")
        lines.append(f'__asm__ volatile("" : : "r"({tile_name}) : "memory");')
        if tile in self.rolled:
            lines += self.render_rolled(self.rolled[tile], tile_name, f"{name}_e", dict(zip(tile.accs, tile.cells)))
        return lines, [f"{tile_name}[{slot}]" for slot in tile.slots]

    # provided by the renderer
    def render_dtype(self, dt: DType) -> str:
        raise NotImplementedError

    def render_const(self, value: object, dt: DType) -> str:
        raise NotImplementedError
