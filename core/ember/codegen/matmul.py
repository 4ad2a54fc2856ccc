"""Which matmul of a kernel a :class:`~ember.renderer.TensorCore` can compute (the ``TC`` opt's match).

The kernel must be a plain matmul: one ADD reduction over K of ``A * B``, with A and B either of the tensor
core's input dtype and accumulated in its output dtype (``a.cast(out) * b.cast(out)``, exact products), or
both already of the output dtype when input and output dtypes are the same. M and N are the output axes only
one factor's loads move along (read by :mod:`ember.codegen.access`).
"""
from __future__ import annotations

from ember.codegen.access import axes_loaded, kernel_shape
from ember.codegen.lowerer import ast_shape
from ember.codegen.tc import TCMatmul
from ember.ir.uop import Ops, UOp
from ember.renderer import TensorCore


def _operand(x: UOp, tc: TensorCore) -> UOp | None:
    """The value of the tensor core's input dtype that ``x`` (a factor of the product) converts exactly."""
    if x.op is Ops.VIEW and x.src[0].op is Ops.CAST:  # a view of the conversion: the same view of its input
        inner = _operand(x.src[0], tc)
        return None if inner is None or inner is x.src[0] else UOp(Ops.VIEW, inner.dtype, (inner,), x.arg)
    if x.op is Ops.CAST and x.src[0].dtype == tc.dtype_in and x.dtype == tc.dtype_out:
        return x.src[0]
    if x.dtype == tc.dtype_in == tc.dtype_out:
        return x
    return None


def match_matmul(ast: UOp, tc: TensorCore) -> TCMatmul | str:
    """The matmul ``tc`` computes in ``ast``, or why it cannot."""
    reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE_AXIS]
    ks = kernel_shape(ast)
    if len(reduces) != 1 or reduces[0].arg[0] is not Ops.ADD or len(ks.reduce_axes) != 1:
        return "the kernel is not one sum over one axis"
    red = reduces[0]
    if ks.reduce_src != {ks.reduce_axes[0]: ks.reduce_axes[0]}:
        return "the reduction's input is reshaped against the output"
    if red.dtype != tc.dtype_out:
        return f"the sum is of {red.dtype}, the tensor core accumulates {tc.dtype_out}"
    body = red.src[0]
    if body.op is not Ops.MUL:
        return "the summed value is not a product"
    a, b = _operand(body.src[0], tc), _operand(body.src[1], tc)
    if a is None or b is None:
        return f"the product's factors are not {tc.dtype_in} values converted exactly to {tc.dtype_out}"
    rank = len(ast_shape(red.src[0], {}))
    k = ks.reduce_axes[0]
    used_a, used_b = axes_loaded(a, rank), axes_loaded(b, rank)
    if k not in used_a or k not in used_b:
        return "a factor does not run along the reduce axis"
    only_a = sorted(used_a - used_b - {k})
    only_b = sorted(used_b - used_a - {k})
    if not only_a or not only_b:
        return "no output axis belongs to one factor only (not a matmul)"
    m, n = only_a[-1], only_b[-1]
    return TCMatmul(red, a, b, m, n, k)
