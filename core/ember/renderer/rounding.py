"""16-bit float results of a target that computes them in float: which results are rounded, and how.

ember's float16 and bfloat16 arithmetic is float32 arithmetic rounded to the 16-bit type after every ALU op
(docs/contracts.md). A target that holds such values in ``float`` registers (bfloat16 almost everywhere,
float16 where the target has no half arithmetic) wraps each result in the preamble's rounding function, but
not the results of :data:`EXACT_OPS`, which are already values of the type. Renderers call
:func:`round_result` instead of keeping their own copy of the rule.
"""
from __future__ import annotations

from collections.abc import Collection

from ember.dtype import DType, PtrDType, dtypes
from ember.ir.uop import Ops

#: ALU ops whose result is one of their operands, its negation, or its integer part: a value of the operands'
#: 16-bit type already, never rounded
EXACT_OPS = frozenset({Ops.MAX, Ops.WHERE, Ops.NEG, Ops.TRUNC})
#: the C preamble's functions that round a float to the nearest float16 / bfloat16 value (round-half-even,
#: NaN kept, overflow to infinity), returning a float
ROUND_FNS = {dtypes.float16: "ember_f16_round", dtypes.bfloat16: "ember_bf16_round"}


def round_result(dt: DType | PtrDType | None, expr: str, held_in_float: Collection[DType], op: Ops | None = None
                 ) -> str:
    """``expr`` (a value computed in float) rounded to ``dt`` when ``dt`` is a 16-bit float the target holds in
    a float (one of ``held_in_float``) and ``op`` (None: a conversion, always rounded) is not in
    :data:`EXACT_OPS`; else ``expr`` unchanged."""
    if dt in held_in_float and (op is None or op not in EXACT_OPS):
        assert isinstance(dt, DType)
        return f"{ROUND_FNS[dt]}({expr})"
    return expr
