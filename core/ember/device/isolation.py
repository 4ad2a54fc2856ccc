"""Running plugin code with a time limit: a plugin's import, hook or probe that never returns is left behind.

Python cannot stop a thread, so the call runs in a daemon thread and the caller stops waiting after
``EMBER_PLUGIN_TIMEOUT`` seconds (default 10). The thread keeps whatever it holds; a daemon thread does
not keep the process alive at exit.

A probe can also kill its process outright (a driver library that segfaults while enumerating GPUs).
:func:`crash_checked` runs such a call once in a forked child first: a crash costs the child, and the
caller gets the reason instead of dying. A call that returned in a child is remembered on disk (per
plugin, version and module file), so later processes on the machine run it directly. The check needs
``os.fork`` and is skipped on macOS (frameworks such as Metal's are not safe to use after a fork) and
with ``EMBER_PROBE_GUARD=0``.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from typing import Any


class PluginTimeout(TimeoutError):
    """A plugin's import, hook or probe did not return within ``EMBER_PLUGIN_TIMEOUT`` seconds."""


def plugin_timeout() -> float:
    """Seconds a plugin's import, ``ember_devices()`` or probe may take (``EMBER_PLUGIN_TIMEOUT``, default 10)."""
    return float(os.environ.get("EMBER_PLUGIN_TIMEOUT", "") or 10)


def call_with_timeout(fn: Any, what: str, timeout: float | None = None) -> Any:
    """``fn()``, run in a daemon thread; raises :class:`PluginTimeout` naming ``what`` when it takes longer
    than ``timeout`` (the thread is left behind: Python cannot stop it) and re-raises what ``fn`` raised."""
    limit = plugin_timeout() if timeout is None else timeout
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed to the caller)
            box["error"] = e

    worker = threading.Thread(target=run, name=f"ember plugin: {what}", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        raise PluginTimeout(f"{what} did not return within {limit:g} s (EMBER_PLUGIN_TIMEOUT)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _importing() -> bool:
    """Whether some module is being imported right now (its ``__spec__`` is marked initializing)."""
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False) for m in list(sys.modules.values()))


def _guard_enabled() -> bool:
    return hasattr(os, "fork") and sys.platform != "darwin" and os.environ.get("EMBER_PROBE_GUARD", "1") != "0"


def crash_checked(fn: Any, what: str, memo_key: str, timeout: float | None = None) -> str | None:
    """``None`` when ``fn()`` returns or raises without killing its process, else why it is unsafe to call.

    The first time for ``memo_key`` (a string naming the code: plugin, version, module file and mtime),
    ``fn`` runs in a forked child; a child killed by a signal, or still running after ``timeout`` seconds
    (``EMBER_PLUGIN_TIMEOUT``), gives the reason. A clean exit is recorded on disk under ``memo_key``, so
    later calls return ``None`` at once. ``fn``'s result is not used: the caller then runs it for real.
    """
    if not _guard_enabled():
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
