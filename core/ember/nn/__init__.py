"""Neural-network layers: the building blocks of a model, plus re-exports of the weights helpers.

Every layer is a plain Python object whose :class:`~ember.tensor.Tensor` attributes are its
parameters (``ember.nn.state.get_parameters(model)`` finds them by walking attributes), and
calling the layer runs its forward pass. Constructor signatures and default initializations
follow tinygrad's ``nn`` module: the same distributions, bounds, dtypes and order of random draws,
so a model built after ``Tensor.manual_seed(s)`` starts from tinygrad's weights for that seed
(where tinygrad differs from PyTorch, e.g. the Embedding, grouped-conv and LSTM bias
initializations, ember follows tinygrad).

Parameters are created with ``requires_grad=None``: an optimizer given them turns that into
``True``; buffers such as BatchNorm's running statistics are ``requires_grad=False``.

As in tinygrad, ``from ember import nn`` also gives ``nn.optim`` and ``nn.state``.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from ember.dtype import DType, dtypes, to_np_dtype
from ember.frontend import checks
from ember.frontend.segment import scatter_add_is_cheaper, scatter_add_rows
from ember.helpers import prod
from ember.nn import optim
from ember.tensor import Tensor

if TYPE_CHECKING:  # for type checkers: numpy (imported on first use otherwise) and the names __getattr__ resolves
    import numpy as np

    from ember.nn import state
    from ember.nn.state import get_parameters, get_state_dict, load_state_dict
else:
    from ember.helpers import lazy_numpy as np

#: imported on first use (``nn.state``, ``nn.get_parameters`` ...): the weights formats it brings (gguf,
#: safetensors, torch checkpoints) are not needed to build and train a model
_FROM_STATE = ("get_parameters", "get_state_dict", "load_state_dict")


def __getattr__(name: str) -> Any:
    if name == "state" or name in _FROM_STATE:
        import importlib

        state_module = importlib.import_module("ember.nn.state")  # (sets this module's ``state``)
        return state_module if name == "state" else getattr(state_module, name)
    raise AttributeError(f"module 'ember.nn' has no attribute {name!r}")


def _pair(v: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    """``v`` repeated ``n`` times if it is an int, else ``v`` as a tuple of length ``n``."""
    if isinstance(v, int):
        return (v,) * n
    out = tuple(int(x) for x in v)
    if len(out) != n:
        raise ValueError(f"{name} must be an int or a sequence of {n} ints, got {v!r}")
    return out


def _uniform_param(shape: tuple[int, ...], bound: float) -> Tensor:
    """A parameter drawn uniformly from ``[-bound, bound)`` in the default float dtype."""
    return Tensor.uniform(*shape, low=-bound, high=bound)


def _inv_sqrt(fan: int) -> float:
    """``1 / sqrt(fan)``, the uniform bound of a layer with ``fan`` inputs per output; 0 for an empty layer."""
    return 1 / math.sqrt(fan) if fan > 0 else 0.0


def _filled(shape: int | tuple[int, ...], value: float, dtype: DType | None = None) -> Tensor:
    """A tensor in its own buffer from the start (not a lazy constant), so the first training step's graph
    is the same as every later step's and its kernels are compiled once. ``dtype`` defaults to the default
    float at call time (as ``Tensor.ones`` would)."""
    dt = dtypes.default_float if dtype is None else dtype
    return Tensor(np.full(shape, value, dtype=to_np_dtype(dt)), dtype=dt)


def _channel_affine(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """Scale and shift along dim 1 (the channel dim) of ``x``."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if weight is not None:
        x = x * weight.reshape(shape)
    if bias is not None:
        x = x + bias.reshape(shape)
    return x


class Linear:
    """``y = x @ W.T + b`` with ``W`` of shape ``(out_features, in_features)``.

    Weight and bias are uniform in ``±1/sqrt(in_features)``, like ``torch.nn.Linear``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = _inv_sqrt(in_features)
        self.weight = _uniform_param((out_features, in_features), bound)
        self.bias = _uniform_param((out_features,), bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        """Apply the layer to the last dim of ``x``."""
        return x.linear(self.weight.transpose(), self.bias)


class Conv2d:
    """A 2-D convolution (also N-D: the number of dims comes from ``kernel_size``).

    ``padding`` may be an int, a tuple, or the strings ``"valid"`` and ``"same"`` (stride 1).
    Weight ``(out_channels, in_channels // groups, *kernel_size)`` and bias are uniform in
    ``±1/sqrt(in_channels * prod(kernel_size))``, weight drawn first. As in tinygrad the bound counts all
    ``in_channels`` even when ``groups > 1`` (torch divides by ``groups``), so grouped convolutions start
    ``sqrt(groups)`` times smaller than torch's.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: int = 1,
                 padding: int | tuple[int, ...] | str = 0, dilation: int = 1, groups: int = 1, bias: bool = True):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by "
                             f"groups ({groups})")
        self.kernel_size = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding = self._resolve_padding(padding)
        bound = _inv_sqrt(in_channels * prod(self.kernel_size))
        self.weight = _uniform_param((out_channels, in_channels // groups, *self.kernel_size), bound)
        self.bias = _uniform_param((out_channels,), bound) if bias else None

    def _resolve_padding(self, padding: int | tuple[int, ...] | str) -> int | tuple[int, ...]:
        if not isinstance(padding, str):
            return padding
        if padding == "valid":
            return 0
        if padding != "same":
            raise ValueError(f"invalid padding string {padding!r}, should be one of ('valid', 'same')")
        if any(s != 1 for s in _pair(self.stride, len(self.kernel_size), "stride")):
            raise ValueError("padding='same' is not supported for strided convolutions")
        # torch's "same": total padding d*(k-1) per dim, the extra element (when odd) goes after
        pads: list[int] = []
        for d, k in zip(reversed(_pair(self.dilation, len(self.kernel_size), "dilation")), reversed(self.kernel_size)):
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        return tuple(pads)

    def __call__(self, x: Tensor) -> Tensor:
        """Convolve ``x`` of shape ``(N, C_in, *spatial)``."""
        return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation,
                        padding=self.padding)


class Conv1d(Conv2d):
    """A 1-D convolution over ``(N, C_in, L)``; weight ``(out_channels, in_channels // groups, kernel_size)``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int], stride: int = 1,
                 padding: int | tuple[int] | str = 0, dilation: int = 1, groups: int = 1, bias: bool = True):
        ks = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
        super().__init__(in_channels, out_channels, ks, stride, padding, dilation, groups, bias)

    def __call__(self, x: Tensor) -> Tensor:
        """Convolve ``x`` of shape ``(N, C_in, L)`` as a 2-D convolution with a height of 1."""
        stride = _pair(self.stride, 1, "stride")[0]
        dilation = _pair(self.dilation, 1, "dilation")[0]
        pad = self.padding
        if isinstance(pad, int):
            pad2: tuple[int, ...] = (pad, pad, 0, 0)
        elif len(pad) == 1:
            pad2 = (pad[0], pad[0], 0, 0)
        else:
            pad2 = (pad[0], pad[1], 0, 0)
        out = x.unsqueeze(2).conv2d(self.weight.unsqueeze(2), self.bias, groups=self.groups, stride=(1, stride),
                                    dilation=(1, dilation), padding=pad2)
        return out.squeeze(2)


class ConvTranspose2d(Conv2d):
    """A transposed 2-D convolution; weight ``(in_channels, out_channels // groups, *kernel_size)``.

    Initialized as tinygrad does, where this layer builds the plain convolution it extends first: the
    random stream gives, in order, a convolution weight ``(out_channels, in_channels // groups, *kernel_size)``
    that is thrown away, the bias ``(out_channels,)`` (if ``bias``), then the weight. All three are uniform
    in ``±1/sqrt(in_channels * prod(kernel_size))`` (torch uses ``out_channels // groups`` in place of
    ``in_channels``).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: int = 1,
                 padding: int | tuple[int, ...] = 0, output_padding: int | tuple[int, ...] = 0, dilation: int = 1,
                 groups: int = 1, bias: bool = True):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by "
                             f"groups ({groups})")
        self.kernel_size = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding, self.output_padding = padding, output_padding
        bound = _inv_sqrt(in_channels * prod(self.kernel_size))
        # the first draw is replaced below and never computed: it only moves the random stream on, so every later
        # layer's weights stay those tinygrad gives for the same seed (and the state dict lists weight first)
        self.weight = Tensor.rand(out_channels, in_channels // groups, *self.kernel_size, contiguous=False)
        self.bias = _uniform_param((out_channels,), bound) if bias else None
        self.weight = _uniform_param((in_channels, out_channels // groups, *self.kernel_size), bound)

    def __call__(self, x: Tensor) -> Tensor:
        """Apply the transposed convolution to ``x`` of shape ``(N, C_in, H, W)``."""
        return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride,
                                  dilation=self.dilation, padding=self.padding, output_padding=self.output_padding)


class ConvTranspose1d(ConvTranspose2d):
    """A transposed 1-D convolution over ``(N, C_in, L)``; weight ``(in_channels, out_channels // groups, k)``.

    Initialized like :class:`ConvTranspose2d` with a kernel of ``(k,)``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int], stride: int = 1,
                 padding: int | tuple[int] = 0, output_padding: int | tuple[int] = 0, dilation: int = 1,
                 groups: int = 1, bias: bool = True):
        ks = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
        super().__init__(in_channels, out_channels, ks, stride, padding, output_padding, dilation, groups, bias)


class BatchNorm:
    """Batch normalization over dim 1 of ``(N, C, *)`` inputs (BatchNorm1d/2d/3d are this class).

    In training mode (``Tensor.training``) it normalizes with the batch statistics and updates
    ``running_mean``/``running_var`` (unbiased variance) with ``momentum``; in eval mode it uses
    the running statistics (or the batch's when ``track_running_stats=False``).
    """

    def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
                 momentum: float = 0.1):
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Tensor | None = _filled(sz, 1.0) if affine else None
        self.bias: Tensor | None = _filled(sz, 0.0) if affine else None
        # buffers, not parameters: an optimizer given them realizes but never trains them
        if track_running_stats:
            self.num_batches_tracked = _filled((), 0, dtypes.int64).requires_grad_(False)
            self.running_mean = _filled(sz, 0.0).requires_grad_(False)
            self.running_var = _filled(sz, 1.0).requires_grad_(False)

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The batch mean and (biased) variance per channel, in two passes (``Tensor.var_mean``)."""
        var, mean = x.var_mean(axis=tuple(i for i in range(x.ndim) if i != 1), correction=0)
        return mean, var

    def __call__(self, x: Tensor) -> Tensor:
        """Normalize ``x`` of shape ``(N, C, *)``."""
        if x.ndim < 2:
            raise ValueError(f"expected at least 2D input (got {x.ndim}D input)")
        use_batch = Tensor.training or not self.track_running_stats
        if use_batch:
            mean, var = self.calc_stats(x)
            if Tensor.training and self.track_running_stats:
                n = x.numel() // x.shape[1]
                if n <= 1:
                    raise ValueError(f"Expected more than 1 value per channel when training, got input size {x.shape}")
                m = self.momentum
                self.running_mean.assign(self.running_mean * (1 - m) + mean.detach() * m)
                self.running_var.assign(self.running_var * (1 - m) + var.detach() * (m * n / (n - 1)))
                self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        else:
            mean, var = self.running_mean, self.running_var
        return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).sqrt().reciprocal())


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
    """Layer normalization over the last ``len(normalized_shape)`` dims, with an optional affine."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight: Tensor | None = _filled(self.normalized_shape, 1.0) if elementwise_affine else None
        self.bias: Tensor | None = _filled(self.normalized_shape, 0.0) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        """Normalize the trailing dims of ``x``."""
        if x.shape[x.ndim - len(self.normalized_shape):] != self.normalized_shape:
            raise RuntimeError(f"Given normalized_shape={list(self.normalized_shape)}, expected input with shape "
                               f"[*, {', '.join(map(str, self.normalized_shape))}], but got input of size {x.shape}")
        x = x.layernorm(axis=self.axis, eps=self.eps)
        if not self.elementwise_affine:
            return x
        assert self.weight is not None and self.bias is not None, "elementwise_affine without weight and bias"
        return x * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channel dim of ``(N, C, H, W)`` inputs."""

    def __call__(self, x: Tensor) -> Tensor:
        """Normalize each pixel's channel vector."""
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class GroupNorm:
    """Group normalization: channels split into ``num_groups`` groups, each normalized over its channels and space."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight: Tensor | None = _filled(num_channels, 1.0) if affine else None
        self.bias: Tensor | None = _filled(num_channels, 0.0) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        """Normalize ``x`` of shape ``(N, C, *)``."""
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise RuntimeError(f"Expected input with {self.num_channels} channels in dim 1, got shape {x.shape}")
        y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        return _channel_affine(y, self.weight, self.bias)


class InstanceNorm:
    """Instance normalization: each (sample, channel) plane normalized on its own, with an optional affine."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        self.num_features, self.eps = num_features, eps
        self.weight: Tensor | None = _filled(num_features, 1.0) if affine else None
        self.bias: Tensor | None = _filled(num_features, 0.0) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        """Normalize ``x`` of shape ``(N, C, *)``."""
        if x.ndim < 3 or x.shape[1] != self.num_features:
            raise RuntimeError(f"Expected input (N, {self.num_features}, *) with a spatial dim, got shape {x.shape}")
        y = x.reshape(x.shape[0], x.shape[1], -1).layernorm(eps=self.eps).reshape(x.shape)
        return _channel_affine(y, self.weight, self.bias)


class RMSNorm:
    """Root-mean-square normalization over the last dim, ``x / sqrt(mean(x**2) + eps) * weight``."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
        self.eps = eps
        self.weight: Tensor | None = _filled(dim, 1.0) if elementwise_affine else None

    def _norm(self, x: Tensor) -> Tensor:
        return x * (x.square().mean(-1, keepdim=True) + self.eps).sqrt().reciprocal()

    def __call__(self, x: Tensor) -> Tensor:
        """Normalize the last dim of ``x`` (computed in float32 for low-precision inputs)."""
        y = self._norm(x.float()).cast(x.dtype)
        return y if self.weight is None else y * self.weight


class Embedding:
    """A lookup table: integer indices of any shape -> rows of ``weight`` (``vocab_size x embed_size``).

    The weight is Glorot uniform, in ``±sqrt(6 / (vocab_size + embed_size))``, as in tinygrad (torch's is
    standard normal).
    """

    def __init__(self, vocab_size: int, embed_size: int):
        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

    def __call__(self, idx: Tensor) -> Tensor:
        """The rows of ``weight`` picked by ``idx``; the result has shape ``(*idx.shape, embed_size)``."""
        if idx.dtype.kind not in "iu":
            raise RuntimeError(f"Expected tensor for argument #1 'indices' to have an integer dtype, got {idx.dtype}")
        checks.index_in_range(idx, self.vocab_sz, 0, message="index {index} is out of range for an Embedding "
                              "with {size} rows (dimension {dim} of its weight)")
        # a one-hot selection against the ramp [0, vocab): the codegen turns its sum into one load per output
        # (a matmul by the one-hot mask would read the whole table per output row), and the weight's gradient
        # is the same selection summed the other way
        ramp = self.weight._positions(self.vocab_sz).cast(idx.dtype).reshape(self.vocab_sz, 1)
        hot = idx.reshape(*idx.shape, 1, 1) == ramp
        n = idx.numel()
        if not (isinstance(n, int) and scatter_add_is_cheaper(n, self.embed_sz, self.vocab_sz)):
            return hot.where(self.weight, 0).sum(-2, dtype=self.weight.dtype)
        # a large vocabulary: the gradient as a scatter-add of the token rows, sorted by index (O(tokens^1.5 *
        # embed) instead of the one-hot sum's O(vocab * tokens * embed))
        out = hot.where(self.weight.detach(), 0).sum(-2, dtype=self.weight.dtype)

        def rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor]:
            rows = g.reshape(n, self.embed_sz).cast(self.weight.dtype)
            return (scatter_add_rows(idx.reshape(n), rows, self.vocab_sz),)

        return out._custom((self.weight,), out, rule, "embedding")


class LSTMCell:
    """One step of an LSTM: ``(x, (h, c)) -> (h', c')``.

    ``weight_ih`` then ``weight_hh`` are uniform in ``±1/sqrt(hidden_size)``; the biases start at zero and
    draw nothing from the random stream, as in tinygrad (torch draws them uniform too).
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        self.hidden_size = hidden_size
        bound = _inv_sqrt(hidden_size)
        self.weight_ih = _uniform_param((hidden_size * 4, input_size), bound)
        self.weight_hh = _uniform_param((hidden_size * 4, hidden_size), bound)
        self.bias_ih = _filled(hidden_size * 4, 0.0) if bias else None
        self.bias_hh = _filled(hidden_size * 4, 0.0) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Advance the state ``hc = (h, c)`` (zeros when None) by input ``x`` of shape ``(N, input_size)``."""
        if hc is None:
            zeros = Tensor.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            hc = (zeros, zeros)
        h, c = hc
        gates = x.linear(self.weight_ih.transpose(), self.bias_ih) + h.linear(self.weight_hh.transpose(), self.bias_hh)
        hs = self.hidden_size
        i, f, g, o = (gates[:, k * hs:(k + 1) * hs] for k in range(4))
        new_c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        new_h = o.sigmoid() * new_c.tanh()
        return new_h.contiguous(), new_c.contiguous()


__all__ = ["BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose1d",
           "ConvTranspose2d", "Embedding", "GroupNorm", "InstanceNorm", "LSTMCell", "LayerNorm", "LayerNorm2d",
           "Linear", "RMSNorm", "get_parameters", "get_state_dict", "load_state_dict", "optim", "state"]
