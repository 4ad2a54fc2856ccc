"""ember.nn layers against torch.nn: forward values, input and parameter gradients, state-dict names, init."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

from ember import Tensor, dtypes, nn
from ember.nn.state import get_state_dict

torch = pytest.importorskip("torch")

FWD = dict(rtol=1e-3, atol=1e-6)
BWD = dict(rtol=1e-3, atol=1e-4)


def _copy_from_torch(layer: Any, tlayer: Any) -> None:
    """Give the ember layer the torch layer's parameters and buffers (names must agree)."""
    ours = get_state_dict(layer)
    theirs = tlayer.state_dict()
    assert set(ours) == set(theirs), f"state dict names differ: {sorted(ours)} vs {sorted(theirs)}"
    for k, v in theirs.items():
        assert ours[k].shape == tuple(v.shape), f"{k}: {ours[k].shape} vs {tuple(v.shape)}"
        t = Tensor(v.detach().numpy().copy(), dtype=ours[k].dtype)
        t.requires_grad = ours[k].requires_grad
        setattr_path(layer, k, t)


def setattr_path(obj: Any, path: str, value: Any) -> None:
    *head, last = path.split(".")
    for part in head:
        obj = obj[int(part)] if isinstance(obj, (list, tuple)) else getattr(obj, part)
    setattr(obj, last, value)


def _trainable(layer: Any, tlayer: Any) -> list[tuple[str, Tensor, Any]]:
    ours = get_state_dict(layer)
    return [(k, ours[k], p) for k, p in tlayer.named_parameters()]


def check_layer(layer: Any, tlayer: Any, inputs: list[np.ndarray], call: Callable[[Any, list[Any]], Any] | None = None,
                grad_inputs: bool = True, seed: int = 0) -> None:
    """Forward and backward of ``layer`` equal ``tlayer``'s for the same parameters and inputs."""
    call = call or (lambda f, xs: f(*xs))
    _copy_from_torch(layer, tlayer)
    params = _trainable(layer, tlayer)
    for _, p, _ in params:
        p.requires_grad = True
    xs = [Tensor(a, requires_grad=grad_inputs and a.dtype.kind == "f") for a in inputs]
    txs = [torch.tensor(a, requires_grad=grad_inputs and a.dtype.kind == "f") for a in inputs]
    out, tout = call(layer, xs), call(tlayer, txs)
    outs, touts = (out, tout) if isinstance(out, tuple) else ((out,), (tout,))
    rng = np.random.default_rng(seed)
    loss, tloss = None, None
    for o, to in zip(outs, touts):
        assert o.shape == tuple(to.shape)
        np.testing.assert_allclose(o.numpy(), to.detach().numpy(), **FWD)
        w = rng.standard_normal(o.shape).astype(np.float32)
        term, tterm = (o * Tensor(w)).sum(), (to * torch.tensor(w)).sum()
        loss, tloss = (term, tterm) if loss is None else (loss + term, tloss + tterm)
    loss.backward()
    tloss.backward()
    for name, p, tp in params:
        assert p.grad is not None, f"no gradient for {name}"
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), err_msg=name, **BWD)
    for x, tx in zip(xs, txs):
        if tx.requires_grad:
            np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **BWD)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- layers vs torch ------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    check_layer(nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias), [rand(2, 4, 5)])


def test_linear_non_contiguous_input() -> None:
    layer, tlayer = nn.Linear(4, 3), torch.nn.Linear(4, 3)
    _copy_from_torch(layer, tlayer)
    x = rand(4, 6)
    out = layer(Tensor(x).transpose())  # a permuted view
    np.testing.assert_allclose(out.numpy(), tlayer(torch.tensor(x).T).detach().numpy(), **FWD)


@pytest.mark.parametrize("kw", [dict(kernel_size=3, padding=1),
                                dict(kernel_size=(3, 2), stride=2, padding=(1, 0), groups=2),
                                dict(kernel_size=3, padding="same", dilation=2, bias=False)])
def test_conv2d(kw: dict) -> None:
    check_layer(nn.Conv2d(4, 6, **kw), torch.nn.Conv2d(4, 6, **kw), [rand(2, 4, 7, 6)])


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("kw", [dict(kernel_size=3, padding=1), dict(kernel_size=2, stride=2, dilation=2),
                                dict(kernel_size=4, padding="same")])
def test_conv1d(kw: dict) -> None:
    check_layer(nn.Conv1d(2, 3, **kw), torch.nn.Conv1d(2, 3, **kw), [rand(2, 2, 9)])


def test_conv_transpose2d() -> None:
    kw = dict(kernel_size=3, stride=2, padding=1, output_padding=1, groups=2)
    check_layer(nn.ConvTranspose2d(4, 6, **kw), torch.nn.ConvTranspose2d(4, 6, **kw), [rand(2, 4, 3, 4)])


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 3)])
def test_batchnorm_training(shape: tuple[int, ...]) -> None:
    layer, tlayer = nn.BatchNorm(3, momentum=0.2), torch.nn.BatchNorm1d(3, momentum=0.2)
    if len(shape) == 4:
        tlayer = torch.nn.BatchNorm2d(3, momentum=0.2)
    tlayer.train()
    with Tensor.train():
        check_layer(layer, tlayer, [rand(*shape) * 2 + 1])
    np.testing.assert_allclose(layer.running_mean.numpy(), tlayer.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.numpy(), tlayer.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert layer.num_batches_tracked.item() == 1
    # eval mode: the running statistics normalize
    tlayer.eval()
    x = rand(*shape, seed=3)
    with Tensor.test():
        np.testing.assert_allclose(layer(Tensor(x)).numpy(), tlayer(torch.tensor(x)).detach().numpy(), **FWD)


def test_batchnorm_no_affine_no_running_stats() -> None:
    layer = nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    tlayer = torch.nn.BatchNorm2d(3, affine=False, track_running_stats=False).eval()
    check_layer(layer, tlayer, [rand(2, 3, 2, 2)])
    assert not hasattr(layer, "running_mean")


def test_batchnorm_errors() -> None:
    with Tensor.train(), pytest.raises(ValueError):
        nn.BatchNorm(3)(Tensor(rand(1, 3)))
    with pytest.raises(ValueError):
        torch.nn.BatchNorm1d(3).train()(torch.tensor(rand(1, 3)))


def test_layernorm() -> None:
    check_layer(nn.LayerNorm((4, 5)), torch.nn.LayerNorm((4, 5)), [rand(2, 3, 4, 5)])
    check_layer(nn.LayerNorm(5, elementwise_affine=False, eps=1e-3),
                torch.nn.LayerNorm(5, elementwise_affine=False, eps=1e-3), [rand(3, 5)])


def test_layernorm_wrong_shape_raises_like_torch() -> None:
    with pytest.raises(RuntimeError):
        torch.nn.LayerNorm(4)(torch.zeros(2, 5))
    with pytest.raises(RuntimeError):
        nn.LayerNorm(4)(Tensor(rand(2, 5)))


def test_groupnorm() -> None:
    check_layer(nn.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6), [rand(2, 6, 3, 2)])


def test_instancenorm() -> None:
    check_layer(nn.InstanceNorm(3), torch.nn.InstanceNorm2d(3, affine=True), [rand(2, 3, 4, 4)])


def test_rmsnorm() -> None:
    check_layer(nn.RMSNorm(5, eps=1e-6), torch.nn.RMSNorm(5, eps=1e-6), [rand(2, 3, 5)])


def test_embedding() -> None:
    idx = np.array([[1, 0, 7], [7, 3, 9]], dtype=np.int64)
    check_layer(nn.Embedding(10, 4), torch.nn.Embedding(10, 4), [idx])
    with pytest.raises(RuntimeError):
        nn.Embedding(10, 4)(Tensor(rand(2)))


def test_lstm_cell() -> None:
    x, h, c = rand(3, 4), rand(3, 5, seed=1), rand(3, 5, seed=2)
    check_layer(nn.LSTMCell(4, 5), torch.nn.LSTMCell(4, 5), [x, h, c], call=lambda f, xs: f(xs[0], (xs[1], xs[2])))
    # no state given: zeros, like torch
    layer, tlayer = nn.LSTMCell(4, 5, bias=False), torch.nn.LSTMCell(4, 5, bias=False)
    _copy_from_torch(layer, tlayer)
    for ours, theirs in zip(layer(Tensor(x)), tlayer(torch.tensor(x))):
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), **FWD)


# --- default initialization -----------------------------------------------------------------------
# ember initializes like tinygrad, not torch (tests/backend/test_nn_init_tinygrad.py compares the values):
# the state-dict names and shapes are torch's, the bounds are tinygrad's. Grouped and transposed convs use
# 1/sqrt(in_channels * prod(kernel)) (torch: in_channels // groups, resp. out_channels // groups), LSTM biases
# start at zero (torch draws them) and Embedding is Glorot uniform (torch: standard normal).
INIT_CASES = {
    "linear": (lambda: nn.Linear(64, 32), lambda: torch.nn.Linear(64, 32), {"weight": 1 / 8, "bias": 1 / 8}),
    "conv2d": (lambda: nn.Conv2d(8, 16, 3, groups=2), lambda: torch.nn.Conv2d(8, 16, 3, groups=2),
               {"weight": 1 / math.sqrt(72), "bias": 1 / math.sqrt(72)}),
    "conv1d": (lambda: nn.Conv1d(4, 8, 4), lambda: torch.nn.Conv1d(4, 8, 4), {"weight": 1 / 4, "bias": 1 / 4}),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(8, 4, 3), lambda: torch.nn.ConvTranspose2d(8, 4, 3),
                         {"weight": 1 / math.sqrt(72), "bias": 1 / math.sqrt(72)}),
    "lstm": (lambda: nn.LSTMCell(8, 16), lambda: torch.nn.LSTMCell(8, 16),
             {"weight_ih": 0.25, "weight_hh": 0.25, "bias_ih": 0.0, "bias_hh": 0.0}),
    "embedding": (lambda: nn.Embedding(200, 16), lambda: torch.nn.Embedding(200, 16),
                  {"weight": math.sqrt(6 / 216)}),
}


@pytest.mark.parametrize("name", list(INIT_CASES))
def test_default_init_bounds_follow_tinygrad(name: str) -> None:
    Tensor.manual_seed(0)
    make, tmake, bounds = INIT_CASES[name]
    layer, tlayer = make(), tmake()
    ours = get_state_dict(layer)
    assert {k: v.shape for k, v in ours.items()} == {k: tuple(v.shape) for k, v in tlayer.state_dict().items()}
    for k, bound in bounds.items():
        vals = ours[k].numpy()
        assert ours[k].dtype == dtypes.float32
        assert np.abs(vals).max() <= bound
        if bound and vals.size >= 32:  # a uniform draw of this size fills most of the interval, std bound / sqrt(3)
            assert np.abs(vals).max() > 0.8 * bound
            assert abs(vals.std() - bound / math.sqrt(3)) < 0.25 * bound


def test_default_init_of_norms() -> None:
    Tensor.manual_seed(0)
    bn = nn.BatchNorm2d(4)
    np.testing.assert_array_equal(bn.weight.numpy(), np.ones(4, np.float32))
    np.testing.assert_array_equal(bn.bias.numpy(), np.zeros(4, np.float32))
    np.testing.assert_array_equal(bn.running_var.numpy(), np.ones(4, np.float32))
    assert bn.num_batches_tracked.dtype == dtypes.int64 and bn.num_batches_tracked.shape == ()
    assert bn.running_mean.requires_grad is False and bn.weight.requires_grad is None
    assert set(get_state_dict(nn.LayerNorm(3))) == set(torch.nn.LayerNorm(3).state_dict())
    assert set(get_state_dict(nn.GroupNorm(1, 3))) == set(torch.nn.GroupNorm(1, 3).state_dict())


def test_conv_argument_errors() -> None:
    with pytest.raises(ValueError):
        torch.nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError):
        torch.nn.Conv2d(2, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError):
        nn.Conv2d(2, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError):
        nn.Conv2d(2, 4, 3, padding="full")


def test_zeros_keeps_requires_grad_false() -> None:  # buffers made this way must stay out of the optimizer
    assert Tensor.zeros(3, requires_grad=False).requires_grad is False


def test_reexports() -> None:
    from ember.nn import get_parameters, load_state_dict
    from ember.nn import state as st

    assert get_parameters is st.get_parameters and load_state_dict is st.load_state_dict
    model = [nn.Linear(2, 3), nn.BatchNorm(3)]
    assert len(get_parameters(model)) == 2 + 5
