"""The data-parallel recipe of a multi-device training script: a small digits-shaped conv net with BatchNorm and
Adam, its step under ``TinyJit`` and ``Context(TRAINING=1)``, the batch sharded along axis 0 and every parameter
replicated with ``to_``. Its losses equal the one-device run's (BatchNorm's statistics are over the whole batch:
a mean along the sharded axis is an allreduce)."""
from __future__ import annotations

import numpy as np
import pytest

from ember import Context, Device, Tensor, TinyJit, nn
from ember.nn.optim import Adam
from ember.nn.state import get_parameters


class _Digits:
    """Two conv + BatchNorm + relu + maxpool blocks and a linear head, on 1 x 12 x 12 images."""

    def __init__(self) -> None:
        self.c1, self.b1 = nn.Conv2d(1, 4, 3), nn.BatchNorm(4)
        self.c2, self.b2 = nn.Conv2d(4, 8, 3), nn.BatchNorm(8)
        self.head = nn.Linear(8, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.b1(self.c1(x)).relu().max_pool2d(2)  # 10 x 10 -> 5 x 5
        x = self.b2(self.c2(x)).relu().max_pool2d(2)  # 3 x 3 -> 1 x 1
        return self.head(x.flatten(1))


def _run(devices: tuple[str, ...] | None, steps: int = 20) -> tuple[list[float], float]:
    rng = np.random.default_rng(3)
    Tensor.manual_seed(5)
    model = _Digits()
    # the same initial weights for every run: drawn once on the default device, as the one-device run draws them
    params = get_parameters(model)
    for p in params:
        p.realize()
    # two batches, alternately: the net learns them, so the losses move step after step
    images = rng.standard_normal((2, 8, 1, 12, 12)).astype(np.float32)
    labels = rng.integers(0, 10, (2, 8)).astype(np.int32)
    if devices:
        for p in params:
            p.to_(devices)  # the recipe's lines: replicate every parameter (and BatchNorm's running statistics)
    opt = Adam(params, lr=1e-2)

    @TinyJit
    @Context(TRAINING=1)
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        # the loss and the update in one schedule (a loss left lazy until after ``opt.step()`` is computed from
        # the updated weights on one device: ember computes its first step's value differently from a sharded run)
        Tensor.realize_all(loss, *opt.schedule_step())
        return loss

    losses = []
    for i in range(steps):
        x, y = Tensor(images[i % 2]), Tensor(labels[i % 2])
        if devices:
            x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)  # the recipe's lines: shard the batch
        losses.append(step(x.realize(), y.realize()).item())
    assert step.captured is not None, "the step was captured and replayed"
    test = Tensor(images[0])
    acc = (model(test.shard(devices, axis=0) if devices else test).argmax(-1).numpy() == labels[0]).mean()
    return losses, float(acc)


@pytest.mark.parametrize("devices", [("CPU:0", "CPU:1"), ("CPU", "CL")], ids=["cpu-cpu", "cpu-cl"])
def test_data_parallel_recipe_matches_one_device(devices):
    for d in devices:
        if d.split(":")[0] not in Device.available():
            pytest.skip(f"device {d} is not usable here: {Device.probe(d.split(':')[0])}")
    want, want_acc = _run(None)
    got, acc = _run(devices)
    assert want[-1] < want[0], "the one-device run learns"
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert acc == want_acc
