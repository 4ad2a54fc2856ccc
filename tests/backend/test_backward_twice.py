"""A second ``backward()`` through the same graph behaves as in torch: it raises where torch's graph saved values
for the first, accumulates where it saved none, and ``retain_graph=True`` keeps it usable."""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor

torch = pytest.importorskip("torch")

GRAPHS = {
    "x * x": lambda x: (x * x).sum(),
    "x + 1": lambda x: (x + 1).sum(),
    "x - x": lambda x: (x - x).sum(),
    "-x reshaped": lambda x: (-x).reshape(2, 2).sum(),
    "exp": lambda x: x.exp().sum(),
    "relu": lambda x: x.relu().sum(),
    "x * 2": lambda x: (x * 2).sum(),
    "x / y": lambda x: (x / 3.0).sum(),
    "float64 cast": lambda x: x.double().sum(),
}


def _twice(make, t, retain: bool) -> tuple[bool, np.ndarray]:
    y = make(t)
    y.backward(retain_graph=retain)
    try:
        y.backward()
    except RuntimeError:
        return True, t.grad.numpy()
    return False, t.grad.numpy()


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("retain", [False, True])
def test_second_backward_like_torch(device: str, name: str, retain: bool):
    a = np.array([0.5, -1.0, 2.0, 3.0], dtype=np.float32)
    ours = _twice(GRAPHS[name], Tensor(a, device=device, requires_grad=True), retain)
    theirs = _twice(GRAPHS[name], torch.tensor(a, requires_grad=True), retain)
    assert ours[0] == theirs[0], f"torch {'raises' if theirs[0] else 'accumulates'}, ember does not"
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6)
