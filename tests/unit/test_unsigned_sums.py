"""Sums of unsigned integers stay as written; signed ones (index arithmetic) are combined into canonical form.

Unsigned values are data (Threefry's words, hashes), not indices: regrouping them finds nothing to fold and
rebuilds a chain of additions each time a term repeats. Threefry's 20 rounds then became ~110 additions
instead of 36, which every random-number kernel paid in lowering and in the C compiler.
"""
from __future__ import annotations

import re

from ember import Device, Tensor
from ember.codegen import get_program
from ember.dtype import dtypes
from ember.ir.symbolic import simplify
from ember.ir.uop import Ops, UOp


def _var(name: str, dtype) -> UOp:
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, 0, 100))


def test_signed_sums_combine_like_terms():
    a, b = _var("a", dtypes.int32), _var("b", dtypes.int32)
    out = simplify(UOp(Ops.ADD, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (a, b)), a)))
    assert out is not None and out.op is Ops.ADD
    terms = {out.src[0], out.src[1]}
    assert b in terms and UOp(Ops.MUL, dtypes.int32, (a, UOp.const(dtypes.int32, 2))) in terms


def test_unsigned_sums_keep_their_order_and_still_fold_constants():
    a, b = _var("a", dtypes.uint32), _var("b", dtypes.uint32)
    x = UOp(Ops.ADD, dtypes.uint32, (UOp(Ops.ADD, dtypes.uint32, (a, b)), a))
    assert simplify(x) is x
    assert simplify(UOp(Ops.ADD, dtypes.uint32, (a, UOp.const(dtypes.uint32, 0)))) is a
    seven = simplify(UOp(Ops.ADD, dtypes.uint32, (UOp.const(dtypes.uint32, 3), UOp.const(dtypes.uint32, 4))))
    assert seven.op is Ops.CONST and seven.arg == 7


def test_a_random_kernel_adds_once_per_threefry_step():
    Tensor.manual_seed(0)
    src = get_program(Tensor.rand(512, 784, device="CPU").schedule()[-1].ast, Device["CPU"].renderer).src
    adds = [line for line in src.splitlines() if re.match(r"\s*unsigned int alu\d+ = \(\w+ \+ \w+\);", line)]
    # 20 rounds of x0 + x1, 5 key injections of three additions each, the counter and key words: 36 to 40
    assert 30 <= len(adds) <= 45, len(adds)
