"""The bad-input catalogue: each case is a call torch rejects; ember must reject it with the same builtin exception
type (``backend_utils.same_error`` runs torch first and fails when torch does not raise).

Calls whose check runs on the device (index tensors, integer division by a zero element) end with a read,
because ember raises those at the next read (:mod:`ember.frontend.checks`).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import same_error

from ember import Tensor, dtypes, nn
from ember.frontend import checks

torch = pytest.importorskip("torch")
F = torch.nn.functional

_A = np.arange(6, dtype=np.float32).reshape(2, 3)
_B = np.arange(12, dtype=np.float32).reshape(3, 4)
_V = np.arange(4, dtype=np.float32)


def _e(a: np.ndarray, d: str, **kw: Any) -> Tensor:
    return Tensor(a, device=d, **kw)


def _t(a: Any, **kw: Any) -> Any:
    return torch.tensor(a, **kw)


def _ei(x: Any, d: str) -> Tensor:
    return Tensor(np.array(x, dtype=np.int64), device=d)


# name -> (ember call given the device, the same call in torch)
CASES: dict[str, tuple[Callable[[str], Any], Callable[[], Any]]] = {
    # --- shapes ---
    "add mismatched shapes": (lambda d: _e(_A, d) + _e(_B, d), lambda: _t(_A) + _t(_B)),
    "mul mismatched shapes": (lambda d: _e(_A, d) * _e(_V, d), lambda: _t(_A) * _t(_V)),
    "matmul inner dims": (lambda d: _e(_A, d) @ _e(_A, d), lambda: _t(_A) @ _t(_A)),
    "matmul 0-d": (lambda d: _e(np.float32(2), d) @ _e(_V, d), lambda: _t(2.0) @ _t(_V)),
    "dot of matrices": (lambda d: _e(_A, d).dot(_e(_V, d)), lambda: _t(_A).dot(_t(_V))),
    "reshape wrong size": (lambda d: _e(_A, d).reshape(4, 2), lambda: _t(_A).reshape(4, 2)),
    "reshape two -1": (lambda d: _e(_A, d).reshape(-1, -1), lambda: _t(_A).reshape(-1, -1)),
    "view wrong size": (lambda d: _e(_A, d).view(5), lambda: _t(_A).view(5)),
    "expand smaller": (lambda d: _e(_A, d).expand(2, 2), lambda: _t(_A).expand(2, 2)),
    "expand non-singleton": (lambda d: _e(_A, d).expand(4, 3), lambda: _t(_A).expand(4, 3)),
    "permute too few dims": (lambda d: _e(_A, d).permute(0), lambda: _t(_A).permute(0)),
    "permute repeated dim": (lambda d: _e(_A, d).permute(0, 0), lambda: _t(_A).permute(0, 0)),
    "transpose dim out of range": (lambda d: _e(_A, d).transpose(0, 2), lambda: _t(_A).transpose(0, 2)),
    "sum dim out of range": (lambda d: _e(_A, d).sum(2), lambda: _t(_A).sum(2)),
    "max dim out of range": (lambda d: _e(_A, d).max(-3), lambda: _t(_A).max(-3)),
    "softmax dim out of range": (lambda d: _e(_A, d).softmax(5), lambda: _t(_A).softmax(5)),
    "cat mismatched dims": (lambda d: _e(_A, d).cat(_e(_B, d), dim=0), lambda: torch.cat([_t(_A), _t(_B)], 0)),
    "cat dim out of range": (lambda d: _e(_A, d).cat(_e(_A, d), dim=3), lambda: torch.cat([_t(_A), _t(_A)], 3)),
    "stack different shapes": (lambda d: _e(_A, d).stack(_e(_B, d)), lambda: torch.stack([_t(_A), _t(_B)])),
    "squeeze dim out of range": (lambda d: _e(_A, d).squeeze(4), lambda: _t(_A).squeeze(4)),
    "unsqueeze dim out of range": (lambda d: _e(_A, d).unsqueeze(4), lambda: _t(_A).unsqueeze(4)),
    "flatten start after end": (lambda d: _e(_A, d).flatten(1, 0), lambda: _t(_A).flatten(1, 0)),
    "split size zero": (lambda d: _e(_V, d).split(0), lambda: _t(_V).split(0)),
    "chunk zero": (lambda d: _e(_V, d).chunk(0), lambda: _t(_V).chunk(0)),
    "repeat fewer dims": (lambda d: _e(_A, d).repeat(2), lambda: _t(_A).repeat(2)),
    "pad too many values": (lambda d: _e(_V, d).pad((1, 1, 1, 1, 1, 1)), lambda: F.pad(_t(_V), (1, 1, 1, 1, 1, 1))),
    "pad odd length": (lambda d: _e(_V, d).pad((1, 1, 1)), lambda: F.pad(_t(_V), (1, 1, 1))),
    "negative dimension": (lambda d: Tensor.zeros(2, -1, device=d), lambda: torch.zeros(2, -1)),
    "where mismatched shapes": (lambda d: (_e(_A, d) > 1).where(_e(_B, d), 0.0),
                                lambda: torch.where(_t(_A) > 1, _t(_B), 0.0)),
    # --- indexing with constants ---
    "int index out of range": (lambda d: _e(_V, d)[4], lambda: _t(_V)[4]),
    "negative int index out of range": (lambda d: _e(_V, d)[-5], lambda: _t(_V)[-5]),
    "too many indices": (lambda d: _e(_V, d)[0, 0], lambda: _t(_V)[0, 0]),
    "list index out of range": (lambda d: _e(_V, d)[[0, 9]], lambda: _t(_V)[[0, 9]]),
    "float index": (lambda d: _e(_V, d)[1.5], lambda: _t(_V)[1.5]),
    "bool mask wrong shape": (lambda d: _e(_A, d)[np.array([True, False, True])],
                              lambda: _t(_A)[torch.tensor([True, False, True])]),
    "float index tensor": (lambda d: _e(_V, d)[_e(np.array([1.0], np.float32), d)], lambda: _t(_V)[_t([1.0])]),
    "index_select 2-d index": (lambda d: _e(_V, d).index_select(0, _ei([[0]], d)),
                               lambda: _t(_V).index_select(0, _t([[0]]))),
    "gather float index": (lambda d: _e(_A, d).gather(1, _e(np.zeros((2, 1), np.float32), d)),
                           lambda: _t(_A).gather(1, torch.zeros(2, 1))),
    "gather index ndim": (lambda d: _e(_A, d).gather(1, _ei([0], d)), lambda: _t(_A).gather(1, _t([0]))),
    "scatter dtype mismatch": (lambda d: _e(_V, d).scatter(0, _ei([0], d), _e(np.ones(1, np.float64), d)),
                               lambda: _t(_V).scatter(0, _t([0]), torch.ones(1, dtype=torch.float64))),
    "masked_fill float mask": (lambda d: _e(_V, d).masked_fill(_e(_V, d), 0.0),
                               lambda: _t(_V).masked_fill(_t(_V), 0.0)),
    # --- index tensors, checked at the next read ---
    "index tensor out of range": (lambda d: _e(_V, d)[_ei([7], d)].numpy(), lambda: _t(_V)[_t([7])]),
    "index tensor below -size": (lambda d: _e(_V, d)[_ei([-5], d)].numpy(), lambda: _t(_V)[_t([-5])]),
    "setitem index tensor out of range": (lambda d: _e(_V, d).__setitem__(_ei([4], d), 1.0) or _e(_V, d).numpy(),
                                          lambda: _t(_V).__setitem__(_t([4]), 1.0)),
    "gather index -1": (lambda d: _e(_A, d).gather(1, _ei([[-1], [0]], d)).numpy(),
                        lambda: _t(_A).gather(1, _t([[-1], [0]]))),
    "gather index 7": (lambda d: _e(_A, d).gather(1, _ei([[7], [0]], d)).numpy(),
                       lambda: _t(_A).gather(1, _t([[7], [0]]))),
    "scatter index 5": (lambda d: _e(_V[:3], d).scatter(0, _ei([5], d), _e(np.ones(1, np.float32), d)).numpy(),
                        lambda: _t(_V[:3]).scatter(0, _t([5]), torch.ones(1))),
    "scatter_add index 4": (lambda d: _e(_V, d).scatter_add(0, _ei([4], d), _e(np.ones(1, np.float32), d)).numpy(),
                            lambda: _t(_V).scatter_add(0, _t([4]), torch.ones(1))),
    "index_select out of range": (lambda d: _e(_V, d).index_select(0, _ei([9], d)).numpy(),
                                  lambda: _t(_V).index_select(0, _t([9]))),
    "one_hot class too large": (lambda d: _ei([5], d).one_hot(3).numpy(), lambda: F.one_hot(_t([5]), 3)),
    "one_hot negative class": (lambda d: _ei([-1], d).one_hot(3).numpy(), lambda: F.one_hot(_t([-1]), 3)),
    "cross_entropy target 7": (lambda d: _e(_A, d).cross_entropy(_ei([7, 0], d)).numpy(),
                               lambda: F.cross_entropy(_t(_A), _t([7, 0]))),
    "nll_loss target -2": (lambda d: _e(_A, d).nll_loss(_ei([-2, 0], d)).numpy(),
                           lambda: F.nll_loss(_t(_A), _t([-2, 0]))),
    # --- dtypes and values ---
    "bool subtraction": (lambda d: _e(np.array([True]), d) - _e(np.array([True]), d),
                         lambda: _t([True]) - _t([True])),
    "bitwise and of floats": (lambda d: _e(_V, d) & _e(_V, d), lambda: _t(_V) & _t(_V)),
    "shift of floats": (lambda d: _e(_V, d) << 1, lambda: _t(_V) << 1),
    "int floor-divide by zero": (lambda d: _ei([3], d) // 0, lambda: _t([3]) // 0),
    "int remainder by zero tensor": (lambda d: (_ei([3, 4], d) % _ei([1, 0], d)).numpy(),
                                     lambda: _t([3, 4]) % _t([1, 0])),
    "int floor-divide by zero tensor": (lambda d: (_ei([3, 4], d) // _ei([0, 1], d)).numpy(),
                                        lambda: _t([3, 4]) // _t([0, 1])),
    "full overflows int8": (lambda d: Tensor.full((2,), 300, dtype=dtypes.int8, device=d),
                            lambda: torch.full((2,), 300, dtype=torch.int8)),
    "list value overflows int8": (lambda d: Tensor([300], dtype=dtypes.int8, device=d),
                                  lambda: torch.tensor([300], dtype=torch.int8)),
    "full overflows uint8": (lambda d: Tensor.full((2,), 256, dtype=dtypes.uint8, device=d),
                             lambda: torch.full((2,), 256, dtype=torch.uint8)),
    "full overflows int16 below": (lambda d: Tensor.full((2,), -40000, dtype=dtypes.int16, device=d),
                                   lambda: torch.full((2,), -40000, dtype=torch.int16)),
    "div rounding mode": (lambda d: _e(_V, d).div(2, rounding_mode="round"),
                          lambda: _t(_V).div(2, rounding_mode="round")),
    "requires_grad on int": (lambda d: Tensor([1, 2], device=d, requires_grad=True),
                             lambda: torch.tensor([1, 2], requires_grad=True)),
    "requires_grad_ on int": (lambda d: _ei([1, 2], d).requires_grad_(), lambda: _t([1, 2]).requires_grad_()),
    "item of many elements": (lambda d: _e(_V, d).item(), lambda: _t(_V).item()),
    "len of 0-d": (lambda d: len(_e(np.float32(1), d)), lambda: len(_t(1.0))),
    "tensor from a string": (lambda d: Tensor("abc", device=d), lambda: torch.tensor("abc")),
    "one_hot of floats": (lambda d: _e(_V, d).one_hot(4), lambda: F.one_hot(_t(_V), 4)),
    # --- autograd ---
    "backward of non-scalar": (lambda d: _e(_V, d, requires_grad=True).mul(2).backward(),
                               lambda: _t(_V, requires_grad=True).mul(2).backward()),
    # a plain tensor's requires_grad is None, "not decided", and backward() differentiates it (as in tinygrad);
    # requires_grad=False is torch's plain tensor
    "backward without grad": (lambda d: _e(_V, d, requires_grad=False).sum().backward(),
                              lambda: _t(_V).sum().backward()),
    "backward gradient shape": (lambda d: _e(_V, d, requires_grad=True).mul(2).backward(_e(_A, d)),
                                lambda: _t(_V, requires_grad=True).mul(2).backward(_t(_A))),
    # --- layers and losses ---
    "linear wrong features": (lambda d: nn.Linear(3, 2)(Tensor.ones(2, 4)),
                              lambda: torch.nn.Linear(3, 2)(torch.ones(2, 4))),
    "conv2d wrong channels": (lambda d: nn.Conv2d(3, 2, 3)(Tensor.ones(1, 4, 5, 5)),
                              lambda: torch.nn.Conv2d(3, 2, 3)(torch.ones(1, 4, 5, 5))),
    "conv2d kernel larger than input": (lambda d: nn.Conv2d(1, 1, 5)(Tensor.ones(1, 1, 3, 3)),
                                        lambda: torch.nn.Conv2d(1, 1, 5)(torch.ones(1, 1, 3, 3))),
    "max_pool2d kernel too large": (lambda d: _e(np.ones((1, 1, 2, 2), np.float32), d).max_pool2d(3),
                                    lambda: F.max_pool2d(torch.ones(1, 1, 2, 2), 3)),
    "embedding float indices": (lambda d: nn.Embedding(4, 2)(_e(_V, d)), lambda: torch.nn.Embedding(4, 2)(_t(_V))),
    "embedding index 12 of 10": (lambda d: nn.Embedding(10, 2)(Tensor([12])).numpy(),
                                 lambda: torch.nn.Embedding(10, 2)(_t([12]))),
    "cross_entropy batch mismatch": (lambda d: _e(_A, d).cross_entropy(_ei([0, 1, 2], d)),
                                     lambda: F.cross_entropy(_t(_A), _t([0, 1, 2]))),
    "cross_entropy label smoothing": (lambda d: _e(_A, d).cross_entropy(_ei([0, 1], d), label_smoothing=1.5),
                                      lambda: F.cross_entropy(_t(_A), _t([0, 1]), label_smoothing=1.5)),
    "loss reduction name": (lambda d: _e(_A, d).cross_entropy(_ei([0, 1], d), reduction="avg"),
                            lambda: F.cross_entropy(_t(_A), _t([0, 1]), reduction="avg")),
    "bce target shape": (lambda d: _e(_V / 4, d).binary_crossentropy(_e(_A / 6, d)),
                         lambda: F.binary_cross_entropy(_t(_V / 4), _t(_A / 6))),
}


@pytest.fixture(autouse=True)
def _no_leftover_checks():
    checks.discard()
    yield
    checks.discard()


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_like_torch(device: str, name: str):
    ours, theirs = CASES[name]
    same_error(lambda: ours(device), theirs)


def test_catalogue_is_large_enough():
    assert len(CASES) >= 60


def test_a_float_too_large_for_the_dtype_becomes_inf_without_a_numpy_warning():
    # torch.tensor([70000.], dtype=torch.float16) is inf, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert np.isinf(Tensor([70000.0], dtype=dtypes.float16).numpy()).all()
        assert np.isinf(Tensor(np.array([1e300, -1e300]), dtype=dtypes.float32).numpy()).all()
