"""Convolutions of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): conv2d and conv_transpose2d.

Both work for any number of spatial dims. A convolution multiplies the weight into the sliding
windows of the padded input (a view, see :mod:`ember.frontend.pool`) and sums; a transposed one
spreads the input out with zeros and convolves it with the flipped kernel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ember.dtype import DType, least_upper_dtype, to_dtype
from ember.frontend.base import TensorBase
from ember.frontend.util import Pads, device_policy, int_tuple, nonnegative_pads, resolve_pads, shape_str
from ember.helpers import prod

if TYPE_CHECKING:
    from ember.tensor import Tensor


class ConvMixin(TensorBase):
    """Grouped, strided, dilated and padded convolutions and their transposes."""

    __slots__ = ()

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: int | Sequence[int] = 1,
               dilation: int | Sequence[int] = 1, padding: int | str | Sequence[int] = 0,
               dtype: DType | str | None = None) -> Tensor:
        """Convolution (cross-correlation) like ``torch.nn.functional.conv2d``, for any number of spatial dims.

        ``weight`` is ``(out_channels, in_channels // groups, *kernel)``; the input is ``(batch, in_channels,
        *spatial)`` or unbatched ``(in_channels, *spatial)``. ``padding`` is an int, one int per spatial dim,
        ``2 * dims`` ints in torch's flat order ``(left, right, top, bottom, ...)``, or ``"same"``/``"valid"``.
        A negative padding is refused, as in torch (tinygrad crops; ``x.pad`` with negative values crops first).
        """
        n = weight.ndim - 2
        if n < 1:
            raise RuntimeError(f"conv: weight must have at least 3 dims (out, in, *kernel), got shape {weight.shape}")
        if isinstance(padding, str):
            pads = _string_pads(padding, weight.shape[2:], int_tuple(stride, n, "stride"),
                                int_tuple(dilation, n, "dilation"))
        else:
            pads = resolve_pads(padding, n)
            nonnegative_pads(pads, padding, "conv")
        return _conv(self, weight, bias, groups, stride, dilation, pads, dtype)

    def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
                         padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0) -> Tensor:
        """Transposed convolution like ``torch.nn.functional.conv_transpose2d``, for any number of spatial dims.

        ``weight`` is ``(in_channels, out_channels // groups, *kernel)``.
        """
        n = weight.ndim - 2
        if n < 1:
            raise RuntimeError(f"conv_transpose: weight must have at least 3 dims (in, out, *kernel), got "
                               f"{weight.shape}")
        x, unbatched = _batched(self, weight, groups, "conv_transpose")
        cin, ks = weight.shape[0], weight.shape[2:]
        if x.shape[1] != cin:
            raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected "
                               f"input{list(x.shape)} to have {cin} channels, but got {x.shape[1]} channels instead")
        if cin % groups:
            raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                               f"but got weight of size {list(weight.shape)} instead")
        s_, d_ = _steps(stride, dilation, n)
        op_ = int_tuple(output_padding, n, "output_padding")
        pads = resolve_pads(padding, n)
        if any(p < 0 for pair in pads for p in pair) or any(p < 0 for p in op_):
            raise RuntimeError(f"negative padding is not supported: got padding={padding}, "
                               f"output_padding={output_padding}")
        for o, s, d in zip(op_, s_, d_):
            if o >= s and o >= d:
                raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got "
                                   f"output_padding={list(op_)}, stride={list(s_)}, dilation={list(d_)}")
        x = _spread(x, s_)
        # (groups * cin_g, rcout, *k) -> (groups * rcout, cin_g, *k), kernel flipped
        w = _flipped_transpose(weight, groups)
        new_pads = tuple(((k - 1) * d - pb, (k - 1) * d - pa + o) for k, d, (pb, pa), o in zip(ks, d_, pads, op_))
        out = _conv(x, w, bias, groups, 1, d_, new_pads, None)
        return out.reshape(out.shape[1:]) if unbatched else out


def _batched(x: Tensor, weight: Tensor, groups: int, op: str) -> tuple[Tensor, bool]:
    """``x`` with a batch dim, and whether it came without one; checks its rank and ``groups`` as torch does."""
    n = weight.ndim - 2
    unbatched = x.ndim == weight.ndim - 1
    inp = x.unsqueeze(0) if unbatched else x
    if inp.ndim != weight.ndim:
        raise RuntimeError(f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to {op}{n}d, but got input of "
                           f"size: {list(x.shape)}")
    if not isinstance(groups, int) or groups <= 0:
        raise RuntimeError(f"non-positive groups is not supported: got {groups}")
    return inp, unbatched


def _steps(stride: int | Sequence[int], dilation: int | Sequence[int], n: int) -> tuple[tuple[int, ...], ...]:
    """Stride and dilation, one per spatial dim, each checked positive."""
    steps = int_tuple(stride, n, "stride"), int_tuple(dilation, n, "dilation")
    for values, what in zip(steps, ("stride", "dilation")):
        if any(v <= 0 for v in values):
            raise RuntimeError(f"non-positive {what} is not supported: got {list(values)}")
    return steps


def _string_pads(padding: str, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> Pads:
    if padding == "valid":
        return ((0, 0),) * len(kernel)
    if padding == "same":
        if any(s != 1 for s in stride):
            raise RuntimeError("padding='same' is not supported for strided convolutions")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in total)
    raise RuntimeError(f"Invalid padding string: {padding!r} (expected 'same' or 'valid')")


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, groups: int, stride: int | Sequence[int],
          dilation: int | Sequence[int], pads: Pads, dtype: DType | str | None) -> Tensor:
    """Grouped N-d convolution with explicit per-side padding (negative padding crops)."""
    n = weight.ndim - 2
    inp, unbatched = _batched(x, weight, groups, "conv")
    bs, cin = inp.shape[:2]
    cout, cin_g, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
    if cout % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but "
                           f"got weight of size {list(weight.shape)} instead")
    if cin != cin_g * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected "
                           f"input{list(inp.shape)} to have {cin_g * groups} channels, but got {cin} channels instead")
    s_, d_ = _steps(stride, dilation, n)
    if bias is not None and bias.shape != (cout,):
        raise RuntimeError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with {cout} "
                           f"elements, but got bias of size {list(bias.shape)} instead")
    padded = tuple(i + pb + pa for i, (pb, pa) in zip(inp.shape[2:], pads))
    eff = tuple(d * (k - 1) + 1 for k, d in zip(ks, d_))
    if any(p < e for p, e in zip(padded, eff)):
        raise RuntimeError(f"Calculated padded input size per channel: ({shape_str(padded)}). Kernel size: "
                           f"({shape_str(eff)}). Kernel size can't be greater than actual input size")
    out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(inp.dtype, weight.dtype)
    # the forward is built from detached inputs and records one gradient rule of its own: differentiating
    # the window view instead would build the input gradient as a 9x (kernel-sized) intermediate summed back
    # through div/mod indexing; as a convolution it is one matmul-shaped reduction like the forward
    out = _conv_forward(inp.detach(), weight.detach(), groups, s_, d_, pads, out_dt)

    def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        # both gradients read each output gradient once per weight of a channel pair (cin_g * prod(kernel) or
        # rcout * prod(kernel) times): one computed from several buffers (a batch norm's and a max pool's
        # backward) would be recomputed as often, so it is stored once
        if _buffers_read(g) >= RECOMPUTED_GRAD_BUFFERS:
            g = g.contiguous()
        return (_conv_input_grad(g, p[1], groups, s_, d_, pads, inp.shape[2:]),
                _conv_weight_grad(g, p[0], groups, s_, d_, pads, ks))
    out = out._record((inp, weight), rule, "conv")
    if bias is not None:
        out = out + bias.reshape(1, cout, *([1] * n))
    return out.reshape(out.shape[1:]) if unbatched else out


#: an output gradient computed from at least this many buffers is stored before a convolution's gradients read it
RECOMPUTED_GRAD_BUFFERS = 3


def _buffers_read(t: Tensor) -> int:
    """How many buffers computing ``t`` reads (a realized value counts as one)."""
    from ember.ir.lazy import realized
    from ember.ir.uop import Ops, toposort

    nodes = toposort([t.lazydata], stop=lambda u: u.op is Ops.BUFFER or u in realized)
    return sum(1 for u in nodes if u.op is Ops.BUFFER or u in realized)


def _copied(x: Tensor, pads: Pads) -> bool:
    """Whether ``x`` padded by ``pads`` is large enough to be copied into a buffer of its own (the device's
    ``conv_pad_copy_min``; None: never)."""
    least = device_policy(x.device).conv_pad_copy_min
    padded = prod(x.shape[:2]) * prod(i + pb + pa for i, (pb, pa) in zip(x.shape[2:], pads))
    return least is not None and padded >= least


def _windows(x: Tensor, ks: Sequence[int], s_: Sequence[int], d_: Sequence[int], pads: Pads,
             channels_last: bool = False) -> Tensor:
    """The sliding windows of the padded ``x``: ``(bs, cin, *out, *kernel)`` (a view).

    A large input is padded into a buffer of its own first: every element is read ``cout * prod(kernel)`` times,
    and through a padding view each of those reads is gated (a compiler cannot turn gated loads into vector
    loads: a 3x3 convolution ran 2.5x slower on CPU). The copy is one pass over the input; a small input keeps
    the padding in the convolution's kernel, so it stays one kernel.

    ``channels_last``: a large input is copied (padded or not) with its channels innermost, for the kernels that
    tile along channels (see :func:`_conv_forward` and :func:`_conv_weight_grad`; asked for where the device's
    ``conv_channels_last`` says so); the windows are still indexed as above."""
    padding = any(p > 0 for pair in pads for p in pair)
    if not (channels_last or padding) or not _copied(x, pads):
        return x.pad(((0, 0), (0, 0)) + tuple(pads))._pool(tuple(ks), tuple(s_), tuple(d_))
    # a computed input (an output gradient) is stored first: the copy then reads a padded view of a buffer, where
    # a padded view of an expression is indexed back into coordinates with / and % (a 32x64x56x56 output
    # gradient: 28 ms of CPU time to pad, against 1.5 + 7 ms stored first)
    padded = x.contiguous().pad(((0, 0), (0, 0)) + tuple(pads))
    if channels_last:
        n = len(ks)
        padded = padded.permute(0, *range(2, 2 + n), 1).contiguous().permute(0, n + 1, *range(1, n + 1))
    else:
        padded = padded.contiguous()
    return padded._pool(tuple(ks), tuple(s_), tuple(d_))


def _conv_forward(inp: Tensor, weight: Tensor, groups: int, s_: Sequence[int], d_: Sequence[int], pads: Pads,
                  out_dt: DType) -> Tensor:
    """The convolution itself (no bias, no checks): the weight times the windows, summed over (cin_g, *kernel).

    A large input (one padded into a buffer of its own, see :func:`_windows`) is copied channels-last, the weight
    as ``(groups, *kernel, cin_g, rcout)``, and the result computed as ``(bs, *out, cout)``, returned as a view in
    the usual order: the output channels are then the innermost output axis, read from the weight and written
    contiguously, so the register tile is a row of output channels times a column of input values, which gcc
    vectorizes (a 32x64x56x56 3x3 convolution: 82-90 ms of CPU time -> 34 ms; channels-first its tile row runs
    along 56 output columns, rows of 8 floats fed by one weight load per multiply-add)."""
    n = weight.ndim - 2
    bs = inp.shape[0]
    cout, cin_g, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
    last = _copied(inp, pads) and device_policy(inp.device).conv_channels_last
    windows = _windows(inp, ks, s_, d_, pads, channels_last=last)               # (bs, cin, *out, *k)
    outs = windows.shape[2:2 + n]
    rcout = cout // groups
    windows = windows.reshape(bs, groups, cin_g, 1, *outs, *ks).expand(bs, groups, cin_g, rcout, *outs, *ks)
    if not last:
        # (bs, g, rc, *out, cin_g, *k)
        windows = windows.permute(0, 1, 3, *range(4, 4 + n), 2, *range(4 + n, 4 + 2 * n))
        w = weight.reshape(1, groups, rcout, *([1] * n), cin_g, *ks)
        return (windows * w).sum(tuple(range(-1 - n, 0)), dtype=out_dt).reshape(bs, cout, *outs)
    windows = windows.permute(0, *range(4, 4 + n), 1, 3, *range(4 + n, 4 + 2 * n), 2)  # (bs, *out, g, rc, *k, cin_g)
    w = weight.reshape(groups, rcout, cin_g, *ks).permute(0, *range(3, 3 + n), 2, 1).contiguous()  # (g, *k, cin_g, rc)
    w = w.permute(0, n + 2, *range(1, n + 1), n + 1).reshape(1, *([1] * n), groups, rcout, *ks, cin_g)
    out = (windows * w).sum(tuple(range(-1 - n, 0)), dtype=out_dt).reshape(bs, *outs, cout)
    return out.permute(0, n + 1, *range(1, n + 1))


def _spread(x: Tensor, strides: Sequence[int]) -> Tensor:
    """``x`` with ``stride - 1`` zeros between neighbours along every spatial dim (dims 2...)."""
    for j, s in enumerate(strides):
        if s == 1:
            continue
        ax, i = 2 + j, x.shape[2 + j]
        x = x.reshape(x.shape[:ax] + (i, 1) + x.shape[ax + 1:])
        x = x.pad(tuple((0, s - 1) if a == ax + 1 else (0, 0) for a in range(x.ndim)))
        x = x.reshape(x.shape[:ax] + (i * s,) + x.shape[ax + 2:])
        x = x.shrink(tuple((0, max(i * s - (s - 1), 0)) if a == ax else (0, sz) for a, sz in enumerate(x.shape)))
    return x


def _flipped_transpose(weight: Tensor, groups: int) -> Tensor:
    """``(groups * a, b, *k)`` -> ``(groups * b, a, *k)`` with the kernel flipped: the weight of the convolution
    that goes the other way (a transposed convolution, or a convolution's input gradient)."""
    n = weight.ndim - 2
    a, b, ks = weight.shape[0] // groups, weight.shape[1], weight.shape[2:]
    w = weight.reshape(groups, a, b, *ks).transpose(1, 2).flip(tuple(range(3, 3 + n)))
    return w.reshape(groups * b, a, *ks)


def _conv_input_grad(g: Tensor, weight: Tensor, groups: int, s_: Sequence[int], d_: Sequence[int], pads: Pads,
                     in_shape: Sequence[int]) -> Tensor:
    """d(conv)/d(input) for the output gradient ``g``: ``g`` spread out by the stride, convolved (stride 1) with
    the flipped, transposed weight.

    Output ``o`` read padded input position ``o * s + k * d``; input position ``j`` (padded ``j + pb``) so
    gets ``g[o] * w[k]`` where ``o * s = j + pb - k * d``. With ``k' = K - 1 - k`` that is a convolution of the
    spread ``g`` padded by ``(K - 1) * d - pb`` on the left, sized back to the input (the right padding
    ``L + pb - (O - 1) * s - 1`` may be negative: a crop)."""
    ks = weight.shape[2:]
    outs = g.shape[2:]
    new_pads = tuple(((k - 1) * d - pb, size + pb - (o - 1) * s - 1)
                     for k, d, s, (pb, _), size, o in zip(ks, d_, s_, pads, in_shape, outs))
    return _conv_forward(_spread(g, s_), _flipped_transpose(weight, groups), groups, [1] * len(ks), d_, new_pads,
                         g.dtype)


def _conv_weight_grad(g: Tensor, x: Tensor, groups: int, s_: Sequence[int], d_: Sequence[int], pads: Pads,
                      ks: Sequence[int]) -> Tensor:
    """d(conv)/d(weight) for the output gradient ``g``: each output gradient times its input window, summed over
    the batch and the output positions (the output's axes first, so the reduction is the innermost loop).

    It is computed as ``(out_channels, *kernel, in_channels)`` from a channels-last copy of the input and
    returned as a view in the weight's order: the input channels are then the innermost output axis, read and
    written contiguously, so the kernel is a matmul whose register tile is a row of input channels times a
    column of output gradients (reading the input along its rows instead gives a reduction that gcc vectorizes
    across one 56-wide row at a time, with a horizontal sum per row: 3-4x slower)."""
    n = len(ks)
    bs, cout, outs = g.shape[0], g.shape[1], g.shape[2:]
    cin_g = x.shape[1] // groups
    rcout = cout // groups
    # both operands are permuted to (g, rc, *k, cin_g, bs, *o) before they are multiplied, so the kernel reads
    # them through views of the buffers (a view of the product would be indexed through div/mod)
    order = (1, 2, *range(4 + n, 4 + 2 * n), 3, 0, *range(4, 4 + n))
    last = device_policy(x.device).conv_channels_last
    windows = _windows(x, ks, s_, d_, pads, channels_last=last).reshape(bs, groups, 1, cin_g, *outs, *ks)
    windows = windows.permute(order)
    gg = g.reshape(bs, groups, rcout, 1, *outs, *([1] * n)).permute(order)
    out = (gg * windows).sum(tuple(range(3 + n, 4 + 2 * n)), dtype=g.dtype).reshape(cout, *ks, cin_g)
    return out.permute(0, n + 1, *range(1, n + 1))
