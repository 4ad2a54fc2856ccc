"""Tiered compilation (``TIERED=1``): new kernels run first from a quick build; the optimized build replaces it.

A C compiler spends most of a fresh process's first training step on its optimizer (the vectorizer and
the register allocator on large register tiles). With ``TIERED=1``, a kernel missing from the compile
cache is built by the device compiler's :meth:`~ember.device.compiler.Compiler.quick_tier` (a cheaper
build of the same source, cached under its own key) and runs at once; the optimized build is made in
a background thread and swapped in by :func:`apply` when ready. A later process finds the optimized
binary in the cache and never runs the quick one.

Both builds compute the same operations in IEEE arithmetic, but a compiler's choice of where to
contract ``a * b + c`` into one fused multiply-add depends on its optimizations, so the two tiers can
differ in the last bits of a result: while a kernel is upgraded, the same call may return slightly
different values before and after. That is why tiering is opt-in (the default always runs the
optimized build, so results never depend on timing or on the cache's state).

Upgrades are applied only between kernel launches, on the thread that runs them: at the start of
:func:`~ember.engine.realize.lower_schedule` and of a jit replay (which rebuilds its device graphs when
:data:`generation` moved).

A process that ends while optimized builds are under way waits for them at exit, at most
``TIERED_EXIT_WAIT`` seconds (default 120), so the next process finds them in the cache; builds still
unfinished then are abandoned (the cache's writes are atomic: nothing half-written is left) and made again by
a later process. ``TIERED_EXIT_WAIT=0`` exits at once.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import functools
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ember.device.compiler import Compiler
from ember.helpers import DEBUG, carry_context, getenv

if TYPE_CHECKING:
    from ember.engine.realize import CompiledRunner

#: builds under way: the future of their binaries, the compiler's id, and the runners waiting for each source
pending: list[tuple[concurrent.futures.Future[list[bytes]], int, dict[str, list[CompiledRunner]]]] = []
#: how many upgrade batches were applied in this process (a captured graph older than this is rebuilt)
generation = 0
#: the waiting runners of each (compiler, source) under way, so a kernel seen again is not built twice
_waiting: dict[tuple[int, str], list[CompiledRunner]] = {}
#: the background builder's queue of (future, function, argument); None until the first upgrade
_jobs: queue.SimpleQueue[tuple[concurrent.futures.Future, Callable[[Any], Any], Any]] | None = None
#: the futures of every build handed to the background builder and not yet finished (waited for at exit)
_unfinished: set[concurrent.futures.Future] = set()
_lock = threading.Lock()


def _builder() -> None:
    """The background builder's loop: one build at a time, in the order they were asked for."""
    assert _jobs is not None
    while True:
        fut, fn, arg = _jobs.get()
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn(arg))
            except BaseException as e:  # noqa: BLE001  (handed to whoever applies the build)
                fut.set_exception(e)
        with _lock:
            _unfinished.discard(fut)


def _submit(fn: Callable[[Any], Any], arg: Any) -> concurrent.futures.Future:
    """Run ``fn(arg)`` on the background builder (a daemon thread: the exit waits for it only as long as
    ``TIERED_EXIT_WAIT`` allows, see :func:`_wait_at_exit`)."""
    global _jobs
    fut: concurrent.futures.Future = concurrent.futures.Future()
    with _lock:
        if _jobs is None:
            _jobs = queue.SimpleQueue()
            threading.Thread(target=_builder, name="ember optimized build", daemon=True).start()
            atexit.register(_wait_at_exit)
        _unfinished.add(fut)
    _jobs.put((fut, fn, arg))
    return fut


def exit_wait() -> float:
    """How long an ending process waits for its unfinished optimized builds, in seconds (``TIERED_EXIT_WAIT``)."""
    return max(0.0, float(getenv("TIERED_EXIT_WAIT", 120.0)))


def _wait_at_exit() -> None:
    """At exit: give the background builds still under way up to :func:`exit_wait` seconds to reach the cache."""
    with _lock:
        left = set(_unfinished)
    if not left:
        return
    limit = exit_wait()
    _, not_done = concurrent.futures.wait(left, timeout=limit)
    if not_done:
        print(f"ember: {len(not_done)} optimized build batch(es) still under way after TIERED_EXIT_WAIT={limit:g} s "
              "at exit: abandoned, a later process builds them again", file=sys.stderr)


def enabled() -> bool:
    """Whether new kernels start from a quick build (``TIERED=1``; read on every schedule)."""
    return bool(getenv("TIERED", 0))


def quick_binaries(compiler: Compiler, srcs: Iterable[str]) -> tuple[list[bytes], list[int]]:
    """Binaries for ``srcs`` (which may still be being rendered): the optimized one where it is cached, else a
    build by ``compiler.quick_tier()`` (which must exist). Returns them with the indices of the quick ones."""
    quick = compiler.quick_tier()
    if quick is None:
        raise ValueError(f"{type(compiler).__name__} has no quick tier")
    found: dict[int, bytes] = {}
    slow: list[int] = []

    def misses() -> Iterator[str]:
        for i, src in enumerate(srcs):
            if (binary := compiler.cached(src)) is not None:
                found[i] = binary
            else:
                slow.append(i)
                yield src

    built = quick.compile_cached_stream(misses())
    found.update(zip(slow, built))
    return [found[i] for i in range(len(found))], slow


def upgrade_later(compiler: Compiler, runners: Sequence[CompiledRunner]) -> None:
    """Build the optimized binaries of ``runners`` in the background; :func:`apply` loads them."""
    waiting: dict[str, list[CompiledRunner]] = {}
    for r in runners:
        if (key := (id(compiler), r.spec.src)) in _waiting:
            _waiting[key].append(r)  # already being built
        else:
            waiting.setdefault(r.spec.src, []).append(r)
    if not waiting:
        return
    # one background batch at a time, with the compiler's low-priority twin; an ending process waits for it
    # (bounded: TIERED_EXIT_WAIT), so a process that ends early still leaves the optimized binaries cached (the
    # twin must start no thread pool of its own then: see CPUCompiler.background)
    srcs = list(waiting)
    # the build sees the knobs of the thread that asked for it (CACHELEVEL, DEBUG set with Context)
    pending.append((_submit(carry_context(_background(compiler).compile_cached_many), srcs), id(compiler),
                    waiting))
    for src in srcs:
        _waiting[(id(compiler), src)] = waiting[src]


@functools.cache
def _background(compiler: Compiler) -> Compiler:
    """``compiler``'s low-priority twin for the optimized builds (made once per compiler)."""
    return compiler.background()


def apply(wait: bool = False) -> int:
    """Load the optimized binaries that are ready (all of them, waiting, when ``wait``); returns how many
    kernels changed binary."""
    global generation
    done = 0
    for entry in list(pending):
        fut, cid, waiting = entry
        if not (wait or fut.done()):
            continue
        pending.remove(entry)
        srcs = list(waiting)
        for src in srcs:
            del _waiting[(cid, src)]
        try:
            binaries = fut.result()
        except Exception as e:  # noqa: BLE001  (the quick build works: keep it rather than fail a running program)
            if DEBUG >= 1:
                print(f"tiered compile: the optimized build of {len(srcs)} kernels failed, keeping the quick "
                      f"build: {str(e).splitlines()[0]}")
            continue
        for src, binary in zip(srcs, binaries):
            done += sum(runner.load(binary) for runner in waiting[src])
    if done:
        generation += 1
    return done
