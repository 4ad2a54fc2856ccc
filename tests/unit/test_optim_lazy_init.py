"""An optimizer leaves lazy initial values lazy: they become buffers in the first step's schedule, with the same
values and updates as parameters realized beforehand."""
from __future__ import annotations

import numpy as np
import pytest

from ember import GlobalCounters, Tensor, nn
from ember.nn.optim import SGD, Adam


def _model() -> tuple[list[nn.Linear], list[Tensor]]:
    Tensor.manual_seed(3)
    layers = [nn.Linear(12, 16), nn.Linear(16, 5)]
    return layers, [t for lin in layers for t in (lin.weight, lin.bias)]


def _train(make_opt, realize_first: bool, steps: int = 3) -> tuple[list[float], list[np.ndarray]]:
    layers, params = _model()
    if realize_first:
        Tensor.realize_all(*params)
    opt = make_opt(params)
    x = Tensor(np.linspace(-1, 1, 8 * 12, dtype=np.float32).reshape(8, 12))
    y = Tensor(np.arange(8) % 5)
    losses = []
    with Tensor.train():
        for _ in range(steps):
            opt.zero_grad()
            loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            Tensor.realize_all(loss, *opt.schedule_step())
            losses.append(loss.item())
    return losses, [p.numpy() for p in params]


@pytest.mark.parametrize("make_opt", [lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: Adam(ps, lr=0.01)],
                         ids=["sgd_momentum", "adam"])
def test_lazy_initial_values_train_like_realized_ones(make_opt) -> None:
    lazy_losses, lazy_params = _train(make_opt, realize_first=False)
    real_losses, real_params = _train(make_opt, realize_first=True)
    assert lazy_losses == real_losses  # bit for bit: the same kernels read the same buffers
    for a, b in zip(lazy_params, real_params):
        np.testing.assert_array_equal(a, b)


def test_optimizer_init_runs_no_kernel() -> None:
    _, params = _model()
    before = GlobalCounters.kernel_count
    SGD(params, lr=0.1)
    assert GlobalCounters.kernel_count == before
    # the random initial values are still computed once, into buffers the step reads
    w = params[0].numpy()
    np.testing.assert_array_equal(w, params[0].numpy())
    assert np.all(np.abs(w) <= 1 / np.sqrt(12))


def test_two_optimizers_on_the_same_parameters_share_their_values() -> None:
    _, params = _model()
    SGD(params, lr=0.1)
    SGD(params, lr=0.2)  # does not wrap the lazy values a second time
    before = GlobalCounters.kernel_count
    Tensor.realize_all(*params)
    assert GlobalCounters.kernel_count - before == len(params)
