"""Helpers shared by the Tensor class and its mixins."""
from __future__ import annotations

from ember.dtype import DType, truncate
from ember.graph.uop import Ops, UOp

Scalar = int | float | bool
Shape = tuple[int, ...]


def broadcast_shape(*shapes: Shape) -> Shape:
    """numpy/torch broadcasting; a mismatch raises RuntimeError naming the shapes."""
    ndim = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for i, dims in enumerate(zip(*padded)):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise RuntimeError(f"The size of tensor a ({dims[0]}) must match the size of tensor b ({dims[1]}) at "
                               f"non-singleton dimension {i}: shapes {' and '.join(str(tuple(s)) for s in shapes)} "
                               f"cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def make_const(value: Scalar, dtype: DType, device: str) -> UOp:
    return UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, None, (), device),), truncate(dtype, value))
