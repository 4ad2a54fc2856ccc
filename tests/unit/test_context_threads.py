"""Knobs set with ``Context`` (or by assigning ``.value``) hold in the running thread and asyncio task only;
the value from the environment at import is every thread's default. Interleavings are forced with events."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable

from ember.helpers import NOOPT, Context, ContextVar, carry_context, getenv

WAIT_S = 60  # an upper bound only: every wait ends as soon as the other thread gets there


def _in_thread(fn: Callable[[], Any]) -> Any:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result(WAIT_S)


def test_a_knob_set_in_one_thread_is_not_seen_in_another():
    default = NOOPT.value
    inside, done = threading.Event(), threading.Event()
    seen: list[Any] = []

    def hold() -> None:
        with Context(NOOPT=default + 5, EMBER_TEST_ONLY_KNOB=7):
            seen.append((NOOPT.value, getenv("EMBER_TEST_ONLY_KNOB", 0)))
            inside.set()
            assert done.wait(WAIT_S)
            seen.append((NOOPT.value, getenv("EMBER_TEST_ONLY_KNOB", 0)))

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    try:
        assert inside.wait(WAIT_S)
        assert NOOPT.value == default and NOOPT == default and not NOOPT > default
        assert getenv("EMBER_TEST_ONLY_KNOB", 0) == 0 and getenv("EMBER_TEST_ONLY_KNOB", 3) == 3
    finally:
        done.set()
        t.join(WAIT_S)
    assert seen == [(default + 5, 7), (default + 5, 7)]  # this thread's reads changed nothing there


def test_a_knob_set_here_is_not_seen_by_a_new_thread():
    default = NOOPT.value
    with Context(NOOPT=default + 1):
        assert NOOPT.value == default + 1
        assert _in_thread(lambda: NOOPT.value) == default  # a new thread starts from the defaults
        assert _in_thread(carry_context(lambda: NOOPT.value)) == default + 1  # unless handed this thread's values
    assert NOOPT.value == default


def test_assigning_value_holds_in_this_thread_only():
    default = NOOPT.value
    try:
        NOOPT.value = default + 2
        assert int(NOOPT) == default + 2
        assert _in_thread(lambda: NOOPT.value) == default
    finally:
        NOOPT.value = default


def test_a_knob_ember_does_not_declare_is_gone_after_the_block():
    assert getenv("EMBER_TEST_ONLY_LEAK", 0) == 0
    with Context(EMBER_TEST_ONLY_LEAK=1):
        assert getenv("EMBER_TEST_ONLY_LEAK", 0) == 1
        with Context(EMBER_TEST_ONLY_LEAK=2):
            assert getenv("EMBER_TEST_ONLY_LEAK", 0) == 2
        assert getenv("EMBER_TEST_ONLY_LEAK", 0) == 1
    assert getenv("EMBER_TEST_ONLY_LEAK", 0) == 0  # the reader's default again, not the last value set


def test_one_context_object_entered_twice_nests():
    default = NOOPT.value
    ctx = Context(NOOPT=default + 3)
    with ctx:
        NOOPT.value = default + 4
        with ctx:
            assert NOOPT.value == default + 3
        assert NOOPT.value == default + 4
    assert NOOPT.value == default


def test_a_decorated_function_run_by_two_threads_at_once():
    default = NOOPT.value
    inside, left = threading.Event(), threading.Event()

    @Context(NOOPT=default + 6)
    def read(hold: bool) -> int:
        if hold:
            inside.set()
            assert left.wait(WAIT_S)
        return NOOPT.value

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(read, True)
        assert inside.wait(WAIT_S)
        assert read(False) == default + 6  # entered and left while the other thread is inside
        assert NOOPT.value == default
        left.set()
        assert held.result(WAIT_S) == default + 6


def test_asyncio_tasks_see_their_own_context():
    default = NOOPT.value

    async def main() -> None:
        entered, checked = asyncio.Event(), asyncio.Event()

        async def holder() -> int:
            with Context(NOOPT=default + 8):
                entered.set()
                await checked.wait()
                return NOOPT.value

        async def other() -> int:
            await entered.wait()
            value = NOOPT.value
            checked.set()
            return value

        assert await asyncio.wait_for(asyncio.gather(holder(), other()), WAIT_S) == [default + 8, default]

    asyncio.run(main())
    assert NOOPT.value == default


def test_the_environment_is_every_threads_default(monkeypatch):
    monkeypatch.setenv("EMBER_TEST_ONLY_ENV_KNOB", "4")
    knob = ContextVar("EMBER_TEST_ONLY_ENV_KNOB", 0)
    try:
        assert knob.value == 4 and _in_thread(lambda: knob.value) == 4
        monkeypatch.setenv("EMBER_TEST_ONLY_ENV_KNOB", "9")  # read once, when the knob is made
        assert _in_thread(lambda: knob.value) == 4
    finally:
        del ContextVar.by_key["EMBER_TEST_ONLY_ENV_KNOB"]
