"""The fast paths of lowering give what the general code gives: DType hashing and pickling, ``truncate``,
``toposort``'s order, the canonical-sum check, the rewrite cache on nodes and keeping rewrites alive."""
from __future__ import annotations

import gc
import math
import pickle
import random
import struct

import numpy as np
import pytest

from ember.dtype import DTYPES_ALL, DType, PtrDType, dtypes, to_np_dtype, truncate
from ember.ir import uop as uop_module
from ember.ir.pattern import keep_rewrites
from ember.ir.symbolic import _canonical_sum, _is_canonical_sum, _rebuilt_sum, _sum, simplify
from ember.ir.uop import GroupOp, Ops, UOp, toposort


def test_equal_dtypes_hash_equal_and_pickle_through_init():
    twin = DType("float", 4, "f", "f")
    assert twin is not dtypes.float32 and twin == dtypes.float32 and hash(twin) == hash(dtypes.float32)
    assert {dtypes.float32: 1}[twin] == 1 and twin != dtypes.int32 and (twin == 3) is False
    back = pickle.loads(pickle.dumps(dtypes.int64.ptr()))
    assert back == dtypes.int64.ptr() and hash(back) == hash(dtypes.int64.ptr())
    assert isinstance(back, PtrDType) and "_hash" in back.__dict__


def test_dtype_pickled_without_a_cached_hash_still_hashes():
    # a pickle written before DType had __reduce__ restores the fields through __setstate__
    old = DType.__new__(DType)
    old.__setstate__({"name": "int", "itemsize": 4, "kind": "i", "fmt": "i", "_hash": 12345})
    assert old == dtypes.int32 and hash(old) == hash(dtypes.int32)


def _truncate_reference(dt: DType, x: object) -> object:
    """truncate as it was before its fast paths: integer wrap-around, numpy's casts for floats."""
    if dt.kind == "b":
        return bool(x)
    if dt.kind in "iu":
        if isinstance(x, float):
            return truncate(dt, x)  # unchanged path
        v = int(x) & ((1 << dt.bitsize) - 1)
        return v - (1 << dt.bitsize) if dt.kind == "i" and v >= 1 << (dt.bitsize - 1) else v
    if dt in (dtypes.float32,):
        with np.errstate(all="ignore"):
            return float(np.array([float(x)]).astype(to_np_dtype(dt))[0])
    return truncate(dt, x)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("d", a) == struct.pack("d", b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("dt", DTYPES_ALL, ids=lambda d: d.name)
def test_truncate_fast_paths_match_the_general_conversion(dt: DType):
    rng = random.Random(0)
    values: list[object] = [0, 1, -1, 127, 128, -129, 255, 256, 2 ** 31 - 1, 2 ** 31, -2 ** 31, 2 ** 63, 2 ** 64 + 3,
                            True, 0.0, -0.0, 0.1, 1e39, -1e39, 3.4028235e38, 3.4028236e38, 1e-46, math.inf,
                            -math.inf, math.nan]
    values += [rng.randint(-2 ** 70, 2 ** 70) for _ in range(200)] + [rng.uniform(-1e6, 1e6) for _ in range(200)]
    values += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(200)]
    for v in values:
        got, want = truncate(dt, v), _truncate_reference(dt, v)
        assert _same(got, want) or (isinstance(got, float) and math.isnan(got) and math.isnan(want)), (dt, v)


def _recursive_toposort(roots: list[UOp], stop=None) -> list[UOp]:
    order: list[UOp] = []
    seen: set[int] = set()

    def visit(n: UOp) -> None:
        if id(n) in seen:
            return
        seen.add(id(n))
        if stop is None or not stop(n):
            for s in n.src:
                visit(s)
        order.append(n)

    for r in roots:
        visit(r)
    return order


def _random_dag(rng: random.Random, n: int) -> list[UOp]:
    nodes = [UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"v{i}", 0, 9)) for i in range(4)]
    for _ in range(n):
        a, b = rng.choice(nodes), rng.choice(nodes)
        nodes.append(UOp(rng.choice([Ops.ADD, Ops.MUL, Ops.MAX]), dtypes.int32, (a, b)))
    return nodes


def test_toposort_is_the_recursive_depth_first_post_order():
    rng = random.Random(1)
    nodes = _random_dag(rng, 300)
    roots = [nodes[-1], nodes[-7], nodes[150], nodes[-1]]
    assert toposort(roots) == _recursive_toposort(roots)
    stop = lambda u: u.op is Ops.MUL  # noqa: E731
    assert toposort(roots, stop=stop) == _recursive_toposort(roots, stop=stop)
    # any DAG through ``sources`` (ids only: the objects' own == is never called)
    parents = {0: (1, 2), 1: (3,), 2: (3, 1), 3: ()}
    order = toposort([0], sources=lambda k: parents[k])
    assert order == [3, 1, 2, 0]


def test_canonical_sum_check_agrees_with_rebuilding_the_sum():
    rng = random.Random(2)
    xs = [UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"x{i}", 0, 50)) for i in range(5)]
    checked = canonical = 0
    for _ in range(3000):
        terms: list[UOp] = []
        for _ in range(rng.randint(2, 6)):
            kind = rng.random()
            v = rng.choice(xs)
            if kind < 0.2:
                terms.append(UOp.const(dtypes.int32, rng.choice([0, 1, 3, -2])))
            elif kind < 0.6:
                terms.append(v)
            elif kind < 0.8:
                terms.append(UOp(Ops.MUL, dtypes.int32, (v, UOp.const(dtypes.int32, rng.choice([0, 1, 2, 5])))))
            else:
                terms.append(UOp(Ops.MUL, dtypes.int32, (UOp.const(dtypes.int32, 3), v)))
        # left-nested mostly (as rebuilt sums are), sometimes right-nested
        x = _sum(terms, dtypes.int32) if rng.random() < 0.8 else \
            UOp(Ops.ADD, dtypes.int32, (terms[0], _sum(terms[1:], dtypes.int32)))
        if x.op is not Ops.ADD:
            continue
        full = _rebuilt_sum(x)
        checked += 1
        canonical += full is None
        if _is_canonical_sum(x):
            assert full is None, x
        assert _canonical_sum(x) is full
    assert checked > 2000 and 100 < canonical < checked  # both outcomes were exercised


def test_rewritten_nodes_die_with_their_last_reference():
    a = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("keep-a", 0, 9))
    key = (Ops.ADD, dtypes.int32, (a, UOp.const(dtypes.int32, 977)), None, 0)
    expr = a + 977
    assert simplify(expr) is expr  # cached on the node as "itself": no reference cycle
    del expr
    gc.collect()
    assert key not in uop_module._interned


def test_keep_rewrites_holds_rewritten_nodes_until_the_block_ends():
    a = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("keep-b", 0, 9))
    key = (Ops.ADD, dtypes.int32, (a, UOp.const(dtypes.int32, 991)), None, 0)
    with keep_rewrites():
        simplify(a + 991)
        assert key in uop_module._interned  # alive although nothing here refers to it
    assert key not in uop_module._interned


@pytest.mark.parametrize("dt", DTYPES_ALL, ids=lambda d: d.name)
def test_bounds_of_an_unknown_value_are_its_dtypes_range(dt: DType):
    # a node whose value is unknown (a load) is bounded by its dtype: what dtypes.min / dtypes.max say
    buf = UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (0, 8))
    x = UOp(Ops.LOAD, dt, (buf, UOp.const(dtypes.int32, 0)))
    want = (dtypes.min(dt), dtypes.max(dt)) if dt.kind in "iub" else (-math.inf, math.inf)
    assert (x.vmin, x.vmax) == want and type(x.vmin) is type(want[0])


def test_lowering_a_register_tile_leaves_little_to_the_cyclic_collector():
    """Lowering, linearizing and rendering leave (next to) nothing only the cyclic collector could free: their
    recursive closures held themselves and the kernel's tables (~1,100 objects a matmul, 0 alone now), and the
    collections a cold start triggers kept walking each kernel's garbage."""
    renderer = pytest.importorskip("ember_cpu.renderer").CPURenderer()
    from ember import Tensor
    from ember.codegen import get_program

    a, b = Tensor.empty(256, 512, device="CPU"), Tensor.empty(512, 512, device="CPU")
    ast = (a @ b).relu().schedule()[-1].ast
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        spec = get_program(ast, renderer)
        left = gc.collect()
    finally:
        if was_on:
            gc.enable()
    assert spec.src and left < 100


def test_a_compiled_kernel_keeps_none_of_its_lowering_alive(monkeypatch: pytest.MonkeyPatch):
    """Once the engine has a kernel's program, the kernel's lowered nodes are gone: the runner's spec drops its
    linear program (as one read from the lowering cache has none), the renderer forgets the kernel it rendered
    and no cache beside the nodes holds its indices. Kept, a register tile's ~2,300 nodes (~15,000 objects)
    lived on, and each garbage collection of a cold step walked them again (GC 19.5 -> 5.5 ms in an MLP's
    first step)."""
    pytest.importorskip("ember_cpu.renderer")
    from ember import Device, Tensor
    from ember.engine import realize
    from ember.engine.realize import program_for

    monkeypatch.setattr(realize, "_lowered_entry", lambda renderer, ast: None)  # lowered here, not read from disk
    a, b = Tensor.empty(256, 512, device="CPU"), Tensor.empty(512, 512, device="CPU")
    ast = (a @ b).relu().schedule()[-1].ast
    renderer = Device["CPU"].renderer
    program_for("CPU", ast)  # (modules and caches a first kernel sets up once)
    ast2 = (a @ b).exp().schedule()[-1].ast
    gc.collect()
    before = {id(o) for o in gc.get_objects()}
    spec = program_for("CPU", ast2)
    gc.collect()
    new_nodes = [o for o in gc.get_objects() if id(o) not in before and isinstance(o, UOp)]
    assert spec.src and spec.uops == ()
    assert len(new_nodes) < 50, f"{len(new_nodes)} nodes of the kernel outlive it"
    held = [k for k, v in vars(renderer).items() if isinstance(v, UOp)
            or (isinstance(v, (dict, set, list, tuple)) and any(isinstance(x, UOp) for x in v))]
    assert not held, f"the renderer still holds the kernel's nodes in {held}"


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64])
def test_float_nodes_without_constant_sources_are_fixed_points(dt: DType):
    """``known_simplified`` records a float node without a constant source as simplified without trying the
    rules: no rule may rewrite one (a float rule must need a constant source, or its op leaves _FLOAT_INERT)."""
    from ember.ir.symbolic import _FLOAT_INERT, known_simplified

    buf = UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), (0, 16))
    idx = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("i", 0, 15))
    a, b, c = (UOp(Ops.LOAD, dt, (buf, simplify(idx + k))) for k in range(3))
    for op in sorted(_FLOAT_INERT, key=lambda o: o.value):
        if op is Ops.CAST:
            node = UOp(Ops.CAST, dt, (UOp(Ops.LOAD, dtypes.float32, (buf, idx)),))
        elif op in GroupOp.Comparison:
            continue  # (a comparison's result is a bool, not a float node)
        else:
            arity = 1 if op in GroupOp.Unary else 2
            node = UOp(op, dt, (a, b, c)[:arity])
        fresh = UOp(node.op, node.dtype, node.src, node.arg)
        assert simplify(fresh) is fresh, f"a rule rewrites {op} of {dt} without a constant source"
        assert known_simplified(node)
    where = UOp(Ops.WHERE, dt, (UOp(Ops.LOAD, dtypes.bool, (buf, idx)), a, a))
    assert not known_simplified(where) and simplify(where) is a  # (c ? a : a folds: WHERE is never recorded)
    assert not known_simplified(UOp(Ops.MUL, dt, (a, UOp.const(dt, 1))))


def test_recording_simplified_nodes_changes_no_kernel(monkeypatch: pytest.MonkeyPatch):
    """Lowering records the nodes it builds as simplified (``known_simplified``, ``_add_const``) so the kernel's
    final simplification skips them; every kernel renders the same source as without the records (checked here on
    matmul tiles, a masked pad, a softmax and a random kernel; ``bench/render_corpus.py`` does it for a corpus)."""
    renderer = pytest.importorskip("ember_cpu.renderer").CPURenderer()
    from ember import Tensor
    from ember.codegen import get_program, lowerer

    a, b = Tensor.empty(64, 128, device="CPU"), Tensor.empty(128, 96, device="CPU")
    x = Tensor.empty(16, 10, device="CPU")
    outs = [(a @ b).relu(), (a.T.contiguous() @ a), x.pad(((1, 2), (0, 3))).exp(), x.softmax(1),
            Tensor.rand(7, 33, device="CPU") * x.sum()]
    asts = [si.ast for out in outs for si in out.schedule() if si.ast.op is Ops.SINK]
    with_records = [get_program(ast, renderer).src for ast in asts]
    monkeypatch.setattr(lowerer, "known_simplified", lambda u: False)
    monkeypatch.setattr(lowerer, "mark_simplified", lambda u: u)
    assert [get_program(ast, renderer).src for ast in asts] == with_records
