"""Tensor cores: where a :class:`~ember.renderer.TensorCore`'s elements live (which matmuls it computes is
:mod:`ember.codegen.matmul`'s).

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

from ember.dtype import DType
from ember.ir.uop import UOp
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
