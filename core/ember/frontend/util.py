"""Helpers shared by the Tensor class and its mixins."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ember.dtype import DType, dtypes, truncate
from ember.helpers import is_int_like
from ember.ir.uop import Ops, UOp

if TYPE_CHECKING:
    from ember.renderer import Renderer

Scalar = int | float | bool
Shape = tuple[int, ...]
#: per spatial dim, the padding ``(before, after)``
Pads = tuple[tuple[int, int], ...]

#: torch's names for dtypes in its "not implemented for" messages
_TORCH_NAMES = {"bool": "Bool", "char": "Char", "uchar": "Byte", "short": "Short", "ushort": "UInt16", "int": "Int",
                "uint": "UInt32", "long": "Long", "ulong": "UInt64", "half": "Half", "bfloat16": "BFloat16",
                "float": "Float", "double": "Double"}


class ArgumentError(RuntimeError, ValueError):
    """A bad size, shape, padding or repeat argument to a Tensor method.

    It is both the RuntimeError torch raises for such a call and the ValueError tinygrad raises, so
    code written for either catches it.
    """


class EmptyTensorList(ArgumentError, TypeError):
    """``cat``/``stack`` of no tensors: torch raises RuntimeError, tinygrad a TypeError (its methods need a first
    tensor); this is both, and a ValueError (an ArgumentError)."""


class BadShapeArgument(TypeError, ValueError):
    """A shape given as a mix of sequences and sizes, like ``f((2, 3), 3)``: torch raises TypeError, tinygrad
    ValueError; this is both."""


def size_arg(s: object, what: str = "size") -> int:
    """One size as an int: a float (even 2.0, as in torch), a bool or a non-number is a TypeError naming it."""
    if is_int_like(s) and not isinstance(s, bool):
        return int(s)
    raise TypeError(f"{what} must be an int, got {type(s).__name__} {s!r}")


def dim_arg(d: object, what: str = "dim") -> int:
    """One dimension index as an int: a float, a bool or a non-number is a TypeError naming ``what`` (torch
    refuses them too; ``int(0.5)`` would quietly pick dimension 0)."""
    if is_int_like(d) and not isinstance(d, bool):
        return int(d)
    raise TypeError(f"{what} must be an int, got {type(d).__name__} {d!r}")


def shape_arg(shape: Sequence[object], what: str = "shape") -> Shape:
    """``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` as the shape (2, 3); a negative size, or more elements than
    :data:`MAX_NUMEL`, is an ArgumentError."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    elif any(isinstance(s, (tuple, list)) for s in shape):
        raise BadShapeArgument(f"bad {what} argument {tuple(shape)}: give sizes, or one sequence of sizes")
    out = tuple(size_arg(s, f"{what} entry") for s in shape)
    if any(s < 0 for s in out):
        raise ArgumentError(f"Trying to create tensor with negative dimension {min(out)}: {out}")
    check_numel(out)
    return out


#: the most elements a tensor may have: kernels index its elements with signed 64-bit integers
MAX_NUMEL = 2 ** 63 - 1


def check_numel(shape: tuple[int | UOp, ...]) -> None:
    """Refuse ``shape`` (an ArgumentError naming it) if its element count, at its variables' maxima, is more than
    :data:`MAX_NUMEL`: no kernel could index it."""
    n = 1
    for d in shape:
        if isinstance(d, UOp):
            from ember.ir.symbolic import sint_max

            d = sint_max(d)
        n *= d
    if n > MAX_NUMEL:
        raise ArgumentError(f"shape {_shape_text(shape)} has {n} elements, more than the {MAX_NUMEL} (2**63 - 1) a "
                            "tensor can have")


def broadcast_shape(*shapes: Shape) -> Shape:
    """numpy/torch broadcasting; a mismatch raises RuntimeError naming the shapes."""
    ndim = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for i, dims in enumerate(zip(*padded)):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            from ember.ir.symbolic import binding_conflict, sint_str

            if (conflict := binding_conflict(*sizes)) is not None:
                raise RuntimeError(f"dimension {i} of shapes {' and '.join(_shape_text(s) for s in shapes)}: "
                                   f"{conflict}")
            raise RuntimeError(f"The size of tensor a ({sint_str(dims[0])}) must match the size of tensor b "
                               f"({sint_str(dims[1])}) at non-singleton dimension {i}: shapes "
                               f"{' and '.join(_shape_text(s) for s in shapes)} cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _shape_text(shape: Shape) -> str:
    """A shape in a message; symbolic sizes written out (``(n=3, 4)``)."""
    from ember.ir.symbolic import sint_str

    return "(" + ", ".join(sint_str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def make_const(value: Scalar, dtype: DType, device: str) -> UOp:
    return UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, None, (), device),), truncate(dtype, value))


def not_implemented(kernel: str, dt: DType) -> NotImplementedError:
    """The error torch raises when its kernel ``kernel`` has no version for ``dt``."""
    return NotImplementedError(f'"{kernel}" not implemented for \'{_TORCH_NAMES.get(dt.name, dt.name)}\'')


def compute_dtype(dt: DType) -> DType:
    """The float type a composed function computes in: float16 and bfloat16 go through float32."""
    return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt


def int_tuple(value: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    """``value`` repeated ``n`` times, or ``value`` itself when it already has ``n`` entries."""
    if isinstance(value, bool) or not (is_int_like(value) or isinstance(value, (tuple, list))):
        raise TypeError(f"expected {name} to be an integer or a sequence of integers, got {value!r}")
    if is_int_like(value):
        return (int(value),) * n
    vals = tuple(size_arg(v, f"{name} entry") for v in value)
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise RuntimeError(f"expected {name} to be a single integer value or a list of {n} values, "
                           f"but got {list(vals)}")
    return vals


def resolve_pads(padding: int | Sequence[int], n: int) -> Pads:
    """Per spatial dim ``(before, after)`` from an int, ``n`` symmetric values or ``2n`` torch-style flat values.

    The flat form lists the last dim first: ``(left, right, top, bottom, ...)``.
    """
    if isinstance(padding, bool) or not (is_int_like(padding) or isinstance(padding, (tuple, list))):
        raise TypeError(f"expected padding to be an integer or a sequence of integers, got {padding!r}")
    if is_int_like(padding):
        return ((int(padding), int(padding)),) * n
    vals = tuple(size_arg(p, "padding entry") for p in padding)
    if len(vals) == n:
        return tuple((p, p) for p in vals)
    if len(vals) == 2 * n:
        return tuple((vals[2 * j], vals[2 * j + 1]) for j in reversed(range(n)))
    raise ArgumentError(f"padding must be an int or a sequence of {n} or {2 * n} ints, but got {list(vals)}")


def nonnegative_pads(pads: Pads, padding: object, name: str) -> None:
    """torch's refusal of a negative padding (``x.pad`` crops with one; a convolution or a pool does not)."""
    if any(p < 0 for pair in pads for p in pair):
        raise RuntimeError(f"{name}: negative padding is not supported, but got padding={padding!r} (to crop the "
                           "input, pad or shrink it first)")


def shape_str(shape: Sequence[int]) -> str:
    """A shape as torch prints it in size errors: ``2 x 3 x 4``."""
    return " x ".join(str(s) for s in shape)


def device_policy(device: str | tuple[str, ...]) -> Renderer:
    """The renderer of ``device`` (the first device of a sharded tensor): its frontend policy says which layout
    copies pay before a matmul or a convolution (see :class:`ember.renderer.Renderer`)."""
    from ember.device.registry import Device

    return Device[device[0] if isinstance(device, tuple) else device].renderer
