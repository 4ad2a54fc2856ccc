"""The shared 16-bit float rounding rule renderers use (ember.renderer.round_result)."""
from __future__ import annotations

import pytest

from ember.renderer import EXACT_OPS, Ops, dtypes, round_result

BOTH = (dtypes.float16, dtypes.bfloat16)


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MUL, Ops.EXP2, Ops.SQRT, Ops.RECIP, None])
def test_every_other_result_of_a_held_type_is_rounded(op):
    assert round_result(dtypes.float16, "x", BOTH, op) == "ember_f16_round(x)"
    assert round_result(dtypes.bfloat16, "x", BOTH, op) == "ember_bf16_round(x)"


def test_exact_ops_and_other_types_are_left_alone():
    assert EXACT_OPS == {Ops.MAX, Ops.WHERE, Ops.NEG, Ops.TRUNC}
    for op in EXACT_OPS:
        assert round_result(dtypes.bfloat16, "x", BOTH, op) == "x"
    assert round_result(dtypes.float32, "x", BOTH, Ops.ADD) == "x"
    # a target with native half rounds only bfloat16
    assert round_result(dtypes.float16, "x", (dtypes.bfloat16,), Ops.ADD) == "x"
    assert round_result(dtypes.bool, "x", BOTH, Ops.CMPLT) == "x"
