"""DeviceSpec: what a plugin tells ember about one kind of device."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

#: Version of the contract between core and device plugins. A :class:`DeviceSpec` declares
#: the version it was written against; a spec whose version differs is listed as
#: incompatible and cannot be opened. Bump this only for changes that break plugins.
#:
#: 2: plugins import only the facade (``ember.device``, ``ember.renderer``); allocators take
#: :class:`~ember.device.BufferSpec` options and know their ``device``; core calls
#: ``Allocator.transfer`` between devices of one plugin with the device objects; devices have
#: ``finalize()``, called at exit; graphs have ``update_vals``.
PLUGIN_API = 2

_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")
_FACTORY_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class DeviceSpec:
    """Description of one device kind, returned by a plugin's ``ember_devices`` hook.

    Attributes:
        name: the device name users type, in upper case: ``"CPU"``, ``"CUDA"``. ``"CUDA:1"``
            addresses the second CUDA device; the part after ``:`` is never part of ``name``.
        factory: ``"module:Class"`` of the device class. It is imported only when the device
            is first requested, then called as ``Class("CUDA:1")`` with the full device name.
        priority: ranks usable devices when the ``DEV`` environment variable is unset; the
            highest wins. First-party plugins use 0 to 100; the built-in PYTHON device is -100.
        plugin_api: the :data:`ember.device.PLUGIN_API` the plugin was written against.
        probe: a cheap callable returning ``None`` when the device can be used here, otherwise
            a human-readable reason (``"libcuda.so not found"``). ``None`` means always usable.
            A plugin's probe may load driver libraries, so the first run on a machine happens in a
            forked child (a probe that crashes costs the child, not the program).
        precheck: like ``probe``, but plain Python that never loads native code (files, environment
            variables): it runs first, and a reason it returns is final (the probe is not called). With
            ``DEV`` unset it is tried in a child like the rest of the plugin until a clean run is
            remembered; then it runs in the process itself.
        extra: the pip extra of the ``ember`` distribution that installs this plugin
            (``"cpu"`` for ``pip install "ember[cpu]"``), used in error messages.
        description: one line for listings such as ``python -m ember.doctor``.
        compute: False for storage-only devices (such as DISK) that hold tensors but cannot run
            kernels; they are never chosen as the default and are not listed as available.
    """

    name: str
    factory: str
    priority: int = 0
    plugin_api: int = PLUGIN_API
    probe: Callable[[], str | None] | None = None
    precheck: Callable[[], str | None] | None = None
    extra: str | None = None
    description: str = ""
    compute: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ValueError(f"invalid device name {self.name!r}: use upper-case letters, digits and '_', "
                             "starting with a letter (no ':'; the index is not part of the name)")
        if not isinstance(self.factory, str) or not _FACTORY_RE.fullmatch(self.factory):
            raise ValueError(f"invalid factory {self.factory!r} for device {self.name}: expected 'module:Class'")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError(f"priority of device {self.name} must be an int, got {self.priority!r}")
        if not isinstance(self.plugin_api, int) or isinstance(self.plugin_api, bool):
            raise ValueError(f"plugin_api of device {self.name} must be an int, got {self.plugin_api!r}")
        for what in ("probe", "precheck"):
            if (fn := getattr(self, what)) is not None and not callable(fn):
                raise ValueError(f"{what} of device {self.name} must be callable or None, got {fn!r}")
