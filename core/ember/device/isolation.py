"""Running plugin code with a time limit: a plugin's import, hook or probe that never returns is left behind.

Python cannot stop a thread, so the call runs in a daemon thread and the caller stops waiting after
``EMBER_PLUGIN_TIMEOUT`` seconds (default 30). The thread keeps whatever it holds; a daemon thread does
not keep the process alive at exit.

A probe can also kill its process outright (a driver library that segfaults while enumerating GPUs).
:func:`crash_checked` runs such a call once in a forked child first: a crash costs the child, and the
caller gets the reason instead of dying. A call that returned in a child is remembered on disk (per
plugin, version and module file), so later processes on the machine run it directly. The check needs
``os.fork`` and is skipped on macOS (frameworks such as Metal's are not safe to use after a fork) and
with ``EMBER_PROBE_GUARD=0``.

:func:`tried_in_child` does the same for a sequence of calls (a plugin's import, its hook, a device's
precheck, probe and factory): the child reports over a pipe which call it is in, so a segfault, an
``os._exit``, a ``sys.exit``, a ``KeyboardInterrupt`` or a hang is pinned on one call, with its name.
"""
from __future__ import annotations

import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ember.helpers import carry_context, getenv


class PluginTimeout(TimeoutError):
    """A plugin's import, hook or probe did not return within ``EMBER_PLUGIN_TIMEOUT`` seconds."""


def plugin_timeout() -> float:
    """Seconds a plugin's import, ``ember_devices()`` or probe may take (``EMBER_PLUGIN_TIMEOUT``, default 30: an
    OpenCL platform's first listing loads LLVM, slow on a loaded machine)."""
    return getenv("EMBER_PLUGIN_TIMEOUT", 30.0)


def call_with_timeout(fn: Any, what: str, timeout: float | None = None) -> Any:
    """``fn()``, run in a daemon thread; raises :class:`PluginTimeout` naming ``what`` when it takes longer
    than ``timeout`` (the thread is left behind: Python cannot stop it) and re-raises what ``fn`` raised.

    Calls run one after another on one long-lived thread (starting a thread per call cost ~1 ms each, and
    choosing the default device makes a dozen calls); a call made while that thread is busy (from another
    thread, or from inside a call) gets a thread of its own, and a thread left behind by a timeout is
    replaced."""
    limit = plugin_timeout() if timeout is None else timeout
    job = _Job(fn)
    worker = _Worker.take()
    if worker is None:  # busy: a thread for this call alone
        threading.Thread(target=job.run, name=f"ember plugin: {what}", daemon=True).start()
    else:
        worker.submit(job, what)
    if not job.done.wait(limit):
        if worker is not None:
            worker.abandon()
        raise PluginTimeout(f"{what} did not return within {limit:g} s (EMBER_PLUGIN_TIMEOUT)")
    if worker is not None:
        worker.release()
    if job.error is not None:
        raise job.error
    return job.value


class _Job:
    """One plugin call and its outcome."""

    def __init__(self, fn: Any):
        self.fn = carry_context(fn)  # the plugin call sees the caller's knobs (DEBUG set with Context)
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as e:  # noqa: BLE001  (handed to the caller)
            self.error = e
        self.done.set()


class _Worker:
    """The long-lived daemon thread that runs plugin calls, one at a time."""

    _lock = threading.Lock()
    _current: _Worker | None = None

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[_Job, str]] = queue.SimpleQueue()
        self.busy = False
        self.thread = threading.Thread(target=self._loop, name="ember plugin calls", daemon=True)
        self.thread.start()

    @classmethod
    def take(cls) -> _Worker | None:
        """The worker, now reserved for one call, or ``None`` when it is busy with another."""
        with cls._lock:
            if cls._current is None:
                cls._current = _Worker()
            worker = cls._current
            if worker.busy:
                return None
            worker.busy = True
            return worker

    def submit(self, job: _Job, what: str) -> None:
        self.jobs.put((job, what))

    def release(self) -> None:
        """The call is over: the next one may take this worker."""
        with self._lock:
            self.busy = False

    def abandon(self) -> None:
        """The call did not return: this thread stays busy with it forever, later calls get a new worker."""
        with self._lock:
            if _Worker._current is self:
                _Worker._current = None

    def _loop(self) -> None:
        while True:
            job, what = self.jobs.get()
            self.thread.name = f"ember plugin: {what}"  # what a thread dump of a hung call shows
            job.run()
            self.thread.name = "ember plugin calls"


def _importing() -> bool:
    """Whether some module is being imported right now (its ``__spec__`` is marked initializing)."""
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False) for m in list(sys.modules.values()))


def guard_enabled() -> bool:
    """Whether plugin code may be tried in a forked child first: Linux and other systems with ``os.fork``, not
    macOS (frameworks such as Metal's are unsafe after a fork), and not with ``EMBER_PROBE_GUARD=0``."""
    return hasattr(os, "fork") and sys.platform != "darwin" and os.environ.get("EMBER_PROBE_GUARD", "1") != "0"


def crash_checked(fn: Any, what: str, memo_key: str, timeout: float | None = None) -> str | None:
    """``None`` when ``fn()`` returns or raises without killing its process, else why it is unsafe to call.

    The first time for ``memo_key`` (a string naming the code: plugin, version, module file and mtime),
    ``fn`` runs in a forked child; a child killed by a signal, or still running after ``timeout`` seconds
    (``EMBER_PLUGIN_TIMEOUT``), gives the reason. A clean exit is recorded on disk under ``memo_key``, so
    later calls return ``None`` at once. ``fn``'s result is not used: the caller then runs it for real.
    """
    if not guard_enabled():
        return None
    from ember import diskcache  # imported late: only a plugin probe needs it

    path = diskcache.entry_path("probe-ok", memo_key)
    if path is not None and diskcache.read(path) == b"ok":
        return None
    limit = plugin_timeout() if timeout is None else timeout
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run it silently, report only through the exit status, run no exit handlers
        code = 0
        try:
            import faulthandler

            faulthandler.disable()  # a crash here is expected to be possible: no traceback dump
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            fn()
        except BaseException:  # noqa: BLE001  (an exception is the caller's to see when it runs fn itself)
            code = 0
        os._exit(code)
    status = _wait_child(pid, limit)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return f"{what} did not return within {limit:g} s (EMBER_PLUGIN_TIMEOUT), tried in a child process"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        return (f"{what} crashed the process that ran it ({name}), so ember does not call it in this one; "
                "reinstall or update the plugin and its driver, or uninstall the plugin")
    if path is not None:
        diskcache.write(path, b"ok")
    return None


class PluginCrash(RuntimeError):
    """A plugin's code crashed, ended or interrupted the child process that tried it: it is not called here."""


#: What a step of :func:`tried_in_child` returns to say that the steps after it need not run.
STOP = object()


@dataclass(frozen=True)
class ChildVerdict:
    """What a :func:`tried_in_child` run saw: the tags of the steps it started, in order, and for a run that did
    not finish, why (``reason``) and whether its last step merely did not return (``hung``)."""

    started: tuple[str, ...]
    reason: str | None = None
    hung: bool = False

    @property
    def failed(self) -> str | None:
        """The tag of the step that took the child down, or ``None`` when every step returned."""
        return self.started[-1] if self.reason is not None and self.started else None

    def error(self) -> Exception:
        """The exception that stands for the failure: :class:`PluginTimeout` or :class:`PluginCrash`."""
        return PluginTimeout(self.reason) if self.hung else PluginCrash(self.reason)


def tried_in_child(steps: Callable[[], Iterable[tuple[str, str, Callable[[], Any]]]],
                   timeout: float | None = None) -> ChildVerdict:
    """Run the steps ``steps()`` yields (``(tag, what, fn)``; the generator runs in the child, so later steps may
    depend on what earlier ones found) in a forked child. The verdict lists the tags started; it has a reason
    when a step crashed the child (a signal), ended it (``os._exit``), raised ``SystemExit`` or
    ``KeyboardInterrupt``, or ran longer than ``timeout`` seconds (``EMBER_PLUGIN_TIMEOUT``; each step gets the
    whole limit). A step that returns :data:`STOP` ends the run early. Ordinary exceptions and results stay in
    the child: the caller makes the calls itself once they are known to be safe. Requires ``os.fork`` (see
    :func:`guard_enabled`)."""
    limit = plugin_timeout() if timeout is None else timeout
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: silent, reports only through the pipe, runs no exit handlers
        try:
            os.close(read_end)
            import faulthandler

            faulthandler.disable()  # a crash here is expected to be possible: no traceback dump
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            for tag, what, fn in steps():
                line = f"S {tag}\t{what}".replace("\n", " ")  # one line per step, whatever the plugin's name
                os.write(write_end, (line + "\n").encode(errors="replace"))
                try:
                    if fn() is STOP:
                        break
                except Exception:  # noqa: BLE001  (the caller sees it when it makes the call itself)
                    pass
                except BaseException as e:  # noqa: BLE001  (SystemExit, KeyboardInterrupt: the plugin's doing)
                    text = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                    os.write(write_end, f"X {text}\n".encode(errors="replace"))
                    os._exit(0)
            os.write(write_end, b"D\n")
        finally:
            os._exit(0)
    os.close(write_end)
    started: list[str] = []
    what, raised, done, hung = "a plugin call", "", False, False
    try:
        buf = b""
        deadline = time.monotonic() + limit
        while not done:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                hung = True
                break
            chunk = os.read(read_end, 4096)
            if not chunk:
                break  # the child ended
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                kind, _, rest = raw.decode(errors="replace").partition(" ")
                if kind == "S":
                    tag, _, what = rest.partition("\t")
                    started.append(tag)
                    deadline = time.monotonic() + limit
                elif kind == "X":
                    raised = rest
                elif kind == "D":
                    done = True
    finally:
        os.close(read_end)
    status = None if hung else _wait_child(pid, limit)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if done:
        return ChildVerdict(tuple(started))
    if hung or status is None:
        return ChildVerdict(tuple(started), f"{what} did not return within {limit:g} s (EMBER_PLUGIN_TIMEOUT), tried "
                                            "in a child process", hung=True)
    if raised:
        why = f"raised {raised} in the process that tried it (a plugin may not end or interrupt the program)"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        why = f"crashed the process that ran it ({name})"
    else:
        why = f"ended the process that ran it (exit status {os.WEXITSTATUS(status)}, before returning)"
    return ChildVerdict(tuple(started), f"{what} {why}, so ember does not call it in this one; reinstall or update "
                                        "the plugin and its driver, or uninstall the plugin")


def _wait_child(pid: int, limit: float) -> int | None:
    """The exit status of child ``pid`` once it ends, or ``None`` when it is still running after ``limit`` s.

    Woken the moment the child exits where the kernel offers a process file descriptor (Linux 5.3+);
    elsewhere polled at growing intervals (a probe that takes 20 ms was noticed only after 31 ms)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(max(0, int(limit * 1000))):
                return None
        finally:
            os.close(fd)
        return os.waitpid(pid, 0)[1]
    deadline = time.monotonic() + limit
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
