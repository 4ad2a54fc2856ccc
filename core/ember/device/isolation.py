"""Running plugin code with a time limit: a plugin's import, hook or probe that never returns is left behind.

Python cannot stop a thread, so the call runs in a daemon thread and the caller stops waiting after
``EMBER_PLUGIN_TIMEOUT`` seconds (default 10). The thread keeps whatever it holds; a daemon thread does
not keep the process alive at exit.
"""
from __future__ import annotations

import os
import sys
import threading
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
