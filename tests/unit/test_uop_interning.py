"""UOp hash-consing and the pattern rewriter: identical nodes are one object, dead nodes leave the intern
table, and rewriting reaches the same fixed point whatever the order rules fire in."""
from __future__ import annotations

import gc

from ember.dtype import dtypes
from ember.ir import uop as uop_module
from ember.ir.pattern import PatternMatcher, UPat, graph_rewrite
from ember.ir.symbolic import simplify
from ember.ir.uop import Ops, UOp


def test_identical_nodes_are_one_object():
    a = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("a", 0, 9))
    assert UOp(Ops.ADD, dtypes.int32, (a, UOp.const(dtypes.int32, 3))) is a + 3
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.float32, 1.0) is not UOp.const(dtypes.float64, 1.0)


def test_dead_nodes_leave_the_intern_table():
    key = ("interning-test", 12345)
    node = UOp(Ops.DEFINE_VAR, dtypes.int32, (), key)
    entry = (Ops.DEFINE_VAR, dtypes.int32, (), key, 0)
    assert entry in uop_module._interned
    ident = id(node)
    del node
    gc.collect()  # (other tests' garbage may leave the table too: check this node's entry, not the count)
    assert entry not in uop_module._interned
    again = UOp(Ops.DEFINE_VAR, dtypes.int32, (), key)  # built afresh, and interned again
    assert UOp(Ops.DEFINE_VAR, dtypes.int32, (), key) is again
    del again, ident


def test_ops_hash_and_compare_by_identity():
    assert len({Ops.ADD, Ops.ADD, Ops.MUL}) == 2
    assert {Ops.ADD: 1}[Ops.ADD] == 1
    assert Ops.ADD != Ops.MUL and Ops["ADD"] is Ops.ADD


def test_commutative_pattern_binds_the_matching_order():
    x = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("x", 0, 7))
    c = UOp.const(dtypes.int32, 4)
    pat = UPat(Ops.MUL, src=(UPat.cvar("c"), UPat.var("v")))
    store: dict[str, UOp] = {}
    assert pat.match(x * c, store) and store == {"c": c, "v": x}
    # a name bound twice must be the same node in both places
    same = UPat(Ops.ADD, src=(UPat.var("y"), UPat.var("y")))
    assert same.match(x + x, {}) and not same.match(x + c, {})


def test_rewrite_reaches_a_fixed_point_through_chained_rules():
    x = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("x", 0, 100))
    # ((x * 2) * 3 + 0) * 1 -> x * 6 needs several rules in turn, each on the output of another
    expr = ((x * 2) * 3 + 0) * 1
    assert simplify(expr) is x * 6
    # a rule that produces a node another rule rewrites again: A -> B -> C
    a, b, c = (UOp(Ops.DEFINE_VAR, dtypes.int32, (), (n, 0, 1)) for n in "abc")
    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=("a", 0, 1)), lambda: b + 0),
                         (UPat(Ops.ADD, src=(UPat.var("v"), UPat(Ops.CONST, arg=0))), lambda v: v),
                         (UPat(Ops.DEFINE_VAR, arg=("b", 0, 1)), lambda: c)])
    assert graph_rewrite(a * 5, pm) is c * 5
    assert simplify(((x // 4) * 4 + x % 4) % 4) is x % 4
