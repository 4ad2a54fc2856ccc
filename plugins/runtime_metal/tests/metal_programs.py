"""Hand-built linear programs covering what the MSL renderer must handle (shared by the METAL tests)."""
from __future__ import annotations

from ember.renderer import Ops, UOp, dtypes

FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32)
INTS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64)
ALL = (dtypes.bool, *INTS, *FLOATS)
FLOAT_OPS = (Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP, Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.ADD, Ops.SUB,
             Ops.MUL, Ops.MAX, Ops.IDIV, Ops.MOD, Ops.FDIV, Ops.POW)
INT_OPS = (Ops.NEG, Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.IDIV, Ops.MOD, Ops.FDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL,
           Ops.SHR)
UNARY = {Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP, Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.CAST, Ops.BITCAST}
N = 64


def program(outputs: list[tuple[Ops, object]], in_dts: tuple, dims: int = 1, var: bool = False,
            gated: bool = False) -> list[UOp]:
    """One kernel storing ``op(inputs...)`` for each output (output k to buffer k, inputs after them) over
    ``dims`` global loops; with ``var`` an int variable bounds the index, with ``gated`` loads and stores
    are gated."""
    idx = dtypes.int32
    outs = [UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (k, N)) for k, (_, dt) in enumerate(outputs)]
    ins = [UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (len(outputs) + i, N)) for i, dt in enumerate(in_dts)]
    consts = [UOp.const(idx, 0), UOp.const(idx, 4), UOp.const(idx, 2)]
    uops: list[UOp] = [*outs, *ins, *consts]
    variable = UOp(Ops.DEFINE_VAR, idx, (), ("n", 1, N)) if var else None
    if variable is not None:
        uops.insert(len(outs) + len(ins), variable)
    sizes = [consts[1], consts[2], consts[2]][:dims]
    ranges = [UOp(Ops.RANGE, idx, (consts[0], s), (i, "global")) for i, s in enumerate(sizes)]
    uops += ranges
    index = ranges[0]
    for r in ranges[1:]:
        index = UOp(Ops.ADD, idx, (UOp(Ops.MUL, idx, (index, consts[2])), r))
        uops += [index.src[0], index]
    gate = None
    if variable is not None or gated:
        gate = UOp(Ops.CMPLT, dtypes.bool, (index, variable if variable is not None else consts[1]))
        uops.append(gate)
    loads = [UOp(Ops.LOAD, dt, (g, index) + ((gate,) if gate is not None else ())) for g, dt in zip(ins, in_dts)]
    uops += loads
    for out, (op, dt) in zip(outs, outputs):
        arity = 3 if op is Ops.WHERE else 1 if op in UNARY else 2
        value = UOp(op, dt, tuple(loads[:arity]))
        uops += [value, UOp(Ops.STORE, None, (out, index, value) + ((gate,) if gate is not None else ()))]
    uops += [UOp(Ops.ENDRANGE, None, (r,)) for r in reversed(ranges)]
    return [*uops, UOp(Ops.SINK, None, ())]


def every_program() -> list[tuple[str, list[UOp]]]:
    """Named linear programs covering every dtype with its ops, comparisons, casts, bitcasts and launch shapes."""
    found: list[tuple[str, list[UOp]]] = []
    for dt in FLOATS:
        found.append((f"ops_{dt.name}", program([(op, dt) for op in FLOAT_OPS], (dt, dt))))
        found.append((f"where_{dt.name}", program([(Ops.WHERE, dt)], (dtypes.bool, dt, dt))))
    for dt in INTS:
        found.append((f"ops_{dt.name}", program([(op, dt) for op in INT_OPS], (dt, dt))))
    found.append(("ops_bool", program([(op, dtypes.bool) for op in (Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.NEG)],
                                      (dtypes.bool, dtypes.bool))))
    for dt in ALL:
        found.append((f"cmp_{dt.name}", program([(op, dtypes.bool) for op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)],
                                                (dt, dt))))
        found.append((f"cast_from_{dt.name}", program([(Ops.CAST, to) for to in ALL], (dt,))))
        same_size = [to for to in ALL if to.itemsize == dt.itemsize and to != dt]
        if same_size:
            found.append((f"bitcast_from_{dt.name}", program([(Ops.BITCAST, to) for to in same_size], (dt,))))
    found.append(("grid_2d", program([(Ops.ADD, dtypes.float32)], (dtypes.float32, dtypes.float32), dims=2)))
    found.append(("grid_3d", program([(Ops.MUL, dtypes.float16)], (dtypes.float16, dtypes.float16), dims=3)))
    found.append(("with_var", program([(Ops.ADD, dtypes.float32)], (dtypes.float32, dtypes.float32), var=True)))
    found.append(("gated", program([(Ops.ADD, dtypes.bfloat16)], (dtypes.bfloat16, dtypes.bfloat16), gated=True)))
    return found


def threadgroup_sum_program(dt) -> list[UOp]:
    """A work-group sum: each of 16 threads of a threadgroup stores its element into threadgroup memory, a
    barrier, then thread 0 adds the 16 and stores the group's sum (4 threadgroups)."""
    idx = dtypes.int32
    out = UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (0, 4))
    inp = UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (1, 64))
    tmp = UOp(Ops.DEFINE_LOCAL, dt.ptr(), (), (0, 16))
    c0, c16, zero = UOp.const(idx, 0), UOp.const(idx, 16), UOp.const(dt, 0)
    group = UOp(Ops.SPECIAL, idx, (), ("gidx0", 4))
    lane = UOp(Ops.SPECIAL, idx, (), ("lidx0", 16))
    scaled = UOp(Ops.MUL, idx, (group, c16))
    element = UOp(Ops.ADD, idx, (scaled, lane))
    value = UOp(Ops.LOAD, dt, (inp, element))
    first = UOp(Ops.CMPEQ, dtypes.bool, (lane, c0))
    acc = UOp(Ops.DEFINE_ACC, dt, (zero,), 0)
    rng = UOp(Ops.RANGE, idx, (c0, c16), (1, "reduce"))
    part = UOp(Ops.LOAD, dt, (tmp, rng))
    total = UOp(Ops.ADD, dt, (acc, part))
    assign = UOp(Ops.ASSIGN, dt, (acc, total))
    return [out, inp, tmp, c0, c16, zero, group, lane, scaled, element, value, UOp(Ops.STORE, None, (tmp, lane, value)),
            UOp(Ops.BARRIER, None, ()), first, acc, rng, part, total, assign, UOp(Ops.ENDRANGE, None, (rng,)),
            UOp(Ops.STORE, None, (out, group, assign, first)), UOp(Ops.SINK, None, ())]
