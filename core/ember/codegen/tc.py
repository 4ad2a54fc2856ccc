"""Tensor cores: which matmuls a :class:`~ember.renderer.TensorCore` can compute, and where its elements live.

A ``TC`` opt maps a matmul's M, N and K axes onto one tensor-core instruction ``D[M,N] = A[M,K] @ B[K,N]``.
The kernel must be a plain matmul: one ADD reduction over K of ``A * B``, with A and B either of the tensor
core's input dtype and accumulated in its output dtype (``a.cast(out) * b.cast(out)``, exact products), or
both already of the output dtype when input and output dtypes are the same.

The ``threads`` work-items sharing one instruction (a warp, a SIMD group) run along launch dimension 0; the M
and N tiles are the launch dimensions above it. Each work-item (lane) holds elements of A, B and D at the
(row, col) its renderer's :meth:`~ember.renderer.Renderer.tensor_core_layout` says. The lowered program has
one ``WMMA`` uop per element of D a lane holds; their sources are the lane's elements of A and B (and the lane
index), so a renderer emits the instruction once for all of them. The arg carries the whole layout, so the
PYTHON device can run the instruction lane by lane with numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.dtype import DType, dtypes
from ember.ir.uop import Ops, UOp
from ember.renderer import Renderer, TensorCore


@dataclass(frozen=True)
class TCMatmul:
    """A kernel's matmul as a tensor core sees it: the A and B operand expressions (of the tensor core's input
    dtype) and the M, N and K axes of the kernel's full shape."""

    reduce: UOp
    a: UOp
    b: UOp
    m: int
    n: int
    k: int


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


def _axes_used(ast: UOp, x: UOp, rank: int) -> set[int]:
    """The axes of the reduction's input that move some load of ``x``."""
    from ember.codegen.lowerer import LoweringContext, _lower

    vars_ = tuple(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (f"a{i}", 0, 1 << 20)) for i in range(rank))
    body = _lower(LoweringContext(dtypes.int32), x, vars_, UOp.const(dtypes.bool, True))
    used: set[int] = set()
    for n in body.toposort():
        if n.op is Ops.LOAD:
            for sub in n.src[1].toposort():
                if sub in vars_:
                    used.add(vars_.index(sub))
    return used


def match_matmul(ast: UOp, tc: TensorCore) -> TCMatmul | str:
    """The matmul ``tc`` computes in ``ast``, or why it cannot."""
    from ember.codegen.lowerer import ast_shape
    from ember.codegen.opts import kernel_shape

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
    used_a, used_b = _axes_used(ast, a, rank), _axes_used(ast, b, rank)
    if k not in used_a or k not in used_b:
        return "a factor does not run along the reduce axis"
    only_a = sorted(used_a - used_b - {k})
    only_b = sorted(used_b - used_a - {k})
    if not only_a or not only_b:
        return "no output axis belongs to one factor only (not a matmul)"
    m, n = only_a[-1], only_b[-1]
    return TCMatmul(red, a, b, m, n, k)


def layout_maps(renderer: Renderer, tc: TensorCore) -> tuple[tuple[tuple[tuple[int, int], ...], ...], ...]:
    """For A, B and C: per lane, per element, its (row, col) in the matrix (the renderer's layout as numbers)."""
    out = []
    for operand, count in zip("ABC", tc.elements_per_thread):
        per_lane = []
        for lane in range(tc.threads):
            places = [renderer.tensor_core_layout(tc, operand, lane, i) for i in range(count)]
            per_lane.append(tuple((int(row), int(col)) for row, col in places))
        out.append(tuple(per_lane))
    return tuple(out)


def wmma_arg(renderer: Renderer, tc: TensorCore, element: int) -> tuple[Any, ...]:
    """The arg of a WMMA uop: ``(intrinsic, dims, threads, elements_per_thread, dtype_in, element, maps)``."""
    return (tc.intrinsic, tc.dims, tc.threads, tc.elements_per_thread, tc.dtype_in, element,
            layout_maps(renderer, tc))


def tc_dtype_in(u: UOp) -> DType:
    """The input dtype of a WMMA uop."""
    dt = u.arg[4]
    assert isinstance(dt, DType)
    return dt
