"""The entry point (group ``ember.devices``): says that device FOO exists. Cheap to import."""
from __future__ import annotations

import os
import shutil

from ember.device import DeviceSpec, hookimpl


def find_cc() -> str | None:
    """The C compiler FOO builds kernels with: ``$CC``, else ``cc``; ``None`` when there is none."""
    return shutil.which(os.environ.get("CC", "cc"))


def probe() -> str | None:
    """``None`` when FOO can work here, else the reason it cannot."""
    if find_cc() is None:
        return f"no C compiler found (looked for {os.environ.get('CC', 'cc')!r}): install gcc or clang, or set CC"
    return None


@hookimpl
def ember_devices() -> list[DeviceSpec]:
    """Device FOO; priority below the CPU plugin's, so it is used only when asked for (``DEV=FOO``)."""
    return [DeviceSpec("FOO", factory="ember_foo.device:FooDevice", priority=-10, probe=probe,
                       description="example plugin: C kernels built by the system C compiler, run through ctypes")]


@hookimpl
def ember_report_header() -> list[str]:
    """One line for ``python -m ember.doctor``."""
    return [f"FOO: C compiler {find_cc() or 'not found'}"]
