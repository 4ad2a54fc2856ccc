"""Grad mode, training mode and pending index checks belong to the thread (and asyncio task) that set them.

Each test forces its interleaving with events: one thread holds a mode (or a pending bad index) while the
other works, so the outcome does not depend on timing. A thread body's assertion failures and exceptions are
handed back to the test through ``_Worker``.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

import numpy as np
import pytest

from ember import Tensor, no_grad
from ember.frontend import checks
from ember.frontend.checks import IndexOutOfRange

WAIT_S = 60  # an upper bound only: every wait below ends as soon as the other side gets there


class _Worker(threading.Thread):
    """A thread running ``fn``; ``join_result()`` re-raises what it raised and returns what it returned."""

    def __init__(self, fn: Callable[[], Any]):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001  (handed to the test)
            self.error = e
        finally:
            checks.discard()

    def join_result(self) -> Any:
        self.join(WAIT_S)
        assert not self.is_alive(), "the thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def _wait(event: threading.Event) -> None:
    assert event.wait(WAIT_S), "the other thread never got there"


@pytest.fixture(autouse=True)
def _clean():
    checks.discard()
    yield
    checks.discard()


def test_no_grad_in_another_thread_leaves_backward_here_alone():
    inside, done = threading.Event(), threading.Event()

    def hold_no_grad() -> bool:
        with no_grad():
            inside.set()
            _wait(done)
            return Tensor.no_grad

    other = _Worker(hold_no_grad)
    other.start()
    _wait(inside)
    try:
        assert not Tensor.no_grad
        w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
        (w * w).sum().backward()
        assert w.grad is not None
        np.testing.assert_allclose(w.grad.numpy(), [2.0, 4.0, 6.0])
    finally:
        done.set()
    assert other.join_result() is True  # while this thread differentiated, the other stayed in no_grad


def test_no_grad_here_does_not_stop_backward_in_another_thread():
    def differentiate() -> list[float]:
        assert not Tensor.no_grad  # a new thread starts with gradients recorded, as in torch
        w = Tensor([1.0, -2.0], requires_grad=True)
        (w * 3).sum().backward()
        assert w.grad is not None
        return w.grad.numpy().tolist()

    with no_grad():
        other = _Worker(differentiate)
        other.start()
        assert other.join_result() == [3.0, 3.0]
        assert Tensor.no_grad
        w = Tensor([1.0], requires_grad=True)
        assert (w * 2)._ctx is None  # still not recording here
    assert not Tensor.no_grad


def test_a_decorated_function_keeps_its_grad_mode_while_another_thread_runs_it():
    inside, left = threading.Event(), threading.Event()

    @no_grad()
    def step(hold: bool) -> bool:
        if hold:
            inside.set()
            _wait(left)  # the other thread enters and leaves the same decorated function meanwhile
        return Tensor.no_grad

    other = _Worker(lambda: step(True))
    other.start()
    _wait(inside)
    assert step(False) is True
    assert not Tensor.no_grad
    left.set()
    assert other.join_result() is True
    assert not Tensor.no_grad


def test_a_bad_index_raises_in_its_own_thread_not_in_an_unrelated_read():
    registered, read_done = threading.Event(), threading.Event()

    def bad_index() -> None:
        y = Tensor([1.0, 2.0, 3.0])[Tensor([5])]  # out of range: the check waits for this thread's read
        assert checks.pending() == 1
        registered.set()
        _wait(read_done)
        y.numpy()

    other = _Worker(bad_index)
    other.start()
    _wait(registered)
    try:
        assert checks.pending() == 0
        np.testing.assert_array_equal((Tensor([1.0, 2.0]) + 1).numpy(), [2.0, 3.0])  # unrelated: no error
    finally:
        read_done.set()
    with pytest.raises(IndexOutOfRange, match="index 5 is out of bounds for dimension 0 with size 3"):
        other.join_result()


def test_a_lazy_result_handed_to_another_thread_is_checked_at_that_read():
    handed: list[Tensor] = []
    ready, read_done = threading.Event(), threading.Event()

    def producer() -> None:
        handed.append(Tensor([1.0, 2.0, 3.0])[Tensor([0, 7])])
        ready.set()
        _wait(read_done)
        (Tensor([1.0]) * 2).numpy()  # any read here raises the failure of this thread's check too

    other = _Worker(producer)
    other.start()
    _wait(ready)
    try:
        with pytest.raises(IndexOutOfRange, match="index 7"):
            (handed[0] * 2).numpy()  # computed from the other thread's bad index: never a silent [2, 0]
        np.testing.assert_array_equal(Tensor([4]).numpy(), [4])  # its check is not this thread's to raise again
    finally:
        read_done.set()
    with pytest.raises(IndexOutOfRange, match="index 7"):
        other.join_result()


def test_training_mode_is_per_thread():
    inside, done = threading.Event(), threading.Event()

    def train_and_drop() -> np.ndarray:
        with Tensor.train():
            inside.set()
            _wait(done)
            return Tensor.ones(1000).dropout(0.5).numpy()

    def set_attr() -> bool:  # tinygrad's spelling, a class attribute set in this thread only
        Tensor.training = True
        return Tensor.training and Tensor.ones(1).training

    other = _Worker(train_and_drop)
    other.start()
    _wait(inside)
    try:
        assert not Tensor.training
        np.testing.assert_array_equal(Tensor.ones(1000).dropout(0.5).numpy(), np.ones(1000))  # eval: identity
        setter = _Worker(set_attr)
        setter.start()
        assert setter.join_result() is True
        assert not Tensor.training
    finally:
        done.set()
    dropped = other.join_result()
    assert 0 < (dropped == 0).sum() < 1000 and set(np.unique(dropped)) == {0.0, 2.0}


def test_training_set_as_a_class_attribute_sticks_in_this_thread():
    try:
        Tensor.training = True
        assert Tensor.training and Tensor.ones(1).training
        with Tensor.test():
            assert not Tensor.training
        assert Tensor.training
    finally:
        Tensor.training = False
    assert not Tensor.training


def test_asyncio_tasks_keep_their_own_modes_and_checks():
    async def main() -> None:
        entered = asyncio.Event()
        checked = asyncio.Event()

        async def holder() -> None:
            with no_grad(), Tensor.train():
                bad = Tensor([1.0, 2.0])[Tensor([9])]
                entered.set()
                await checked.wait()
                assert Tensor.no_grad and Tensor.training
                with pytest.raises(IndexOutOfRange, match="index 9"):
                    bad.numpy()

        async def other() -> None:
            await entered.wait()
            assert not Tensor.no_grad and not Tensor.training
            assert checks.pending() == 0
            assert Tensor([3]).numpy().tolist() == [3]
            w = Tensor([2.0], requires_grad=True)
            (w * w).sum().backward()
            assert w.grad is not None and w.grad.numpy().tolist() == [4.0]
            checked.set()

        await asyncio.wait_for(asyncio.gather(holder(), other()), WAIT_S)

    asyncio.run(main())
    assert not Tensor.no_grad and not Tensor.training
