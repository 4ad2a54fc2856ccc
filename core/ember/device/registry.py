"""Device discovery and the ``Device`` registry.

Plugins are found through the ``ember.devices`` entry-point group and driven with pluggy
(see :mod:`ember.device.hookspecs`). Discovery is lazy: nothing is imported at ``import
ember``; the first use of :data:`Device` loads every entry point, each in its own
``try``/``except``, so one broken plugin never hides the others. What went wrong is kept in
:meth:`_DeviceRegistry.failures` and raised, chained and naming the distribution, only when
somebody asks for a device that the broken plugin would have provided.

Isolation: a plugin's import, its ``ember_devices()`` hook and each probe run with a time limit
(``EMBER_PLUGIN_TIMEOUT`` seconds, default 30): one that does not return in time is recorded as
broken and left behind. Asking for one device (``DEV=CPU``, ``Device["CPU"]``) loads only the
entry points that may provide it (same name, or its known distribution) while that is enough, so a
hang in an unrelated plugin cannot stall it. Two distributions that declare the same device name are
an error naming both, until the user picks one with ``EMBER_PLUGIN_<NAME>=<distribution>``. When the
default device is chosen by priority, a device whose factory fails is skipped with a warning.

Crashes: with ``DEV`` unset, every call into an installed plugin is tried in a forked child first
(:func:`~ember.device.isolation.tried_in_child`): the entry points' imports and ``ember_devices()`` hooks in
one child, each device's precheck, probe and factory in another. A call that crashes, ends or interrupts
the child, or hangs there, makes that plugin broken (or that device unusable) with the reason and the
distribution's name, and is never made in this process; selection goes on with the next device. A clean
run is remembered on disk per distribution, version, Python and environment (``plugin-ok`` table), so a
warm start forks nothing. An explicit ``DEV=`` runs the plugin in this process, as asked.

Typical use::

    from ember.device import Device
    Device.DEFAULT          # "CPU", chosen from DEV= or by priority
    dev = Device["cpu:1"]   # cached device object, created as CPUDevice("CPU:1")
"""
from __future__ import annotations

import atexit
import functools
import importlib
import os
import sys
import threading
import warnings
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pluggy

from ember.device import hookspecs
from ember.device.entry_points import entry_points as installed_entry_points
from ember.device.hookspecs import PLUGIN_API, hookimpl
from ember.device.isolation import (  # noqa: F401
    PluginCrash,
    PluginTimeout,
    _importing,
    call_with_timeout,
    crash_checked,
    guard_enabled,
    plugin_timeout,
    tried_in_child,
)
from ember.device.spec import DeviceSpec
from ember.helpers import getenv, sha256

#: The entry-point group a device plugin registers under.
ENTRY_POINT_GROUP = "ember.devices"

#: First-party device names and the (pip extra of ``ember``, distribution) that provides each,
#: so that "device not found" can say exactly what to install. The hint names the extra only when
#: the installed ``ember`` declares it (see :func:`_extra_exists`).
KNOWN_PLUGINS: dict[str, tuple[str, str]] = {
    "CPU": ("cpu", "ember-cpu"),
    "CL": ("opencl", "ember-opencl"),
    "CUDA": ("cuda", "ember-cuda"),
    "METAL": ("metal", "ember-metal"),
    "AMD": ("amd", "ember-amd"),
}

#: Devices that ship inside the core distribution. They are registered by core itself (not via
#: entry points) and always come first, so a plugin cannot shadow them.
BUILTIN_SPECS: tuple[DeviceSpec, ...] = (
    DeviceSpec("PYTHON", factory="ember.builtin_devices.python:PythonDevice", priority=-100,
               description="pure-Python UOp interpreter: slow, complete, the reference for testing"),
    DeviceSpec("DISK", factory="ember.builtin_devices.disk:DiskDevice", priority=-1000, compute=False,
               description="a memory-mapped file, DISK:/path (storage only: move tensors to a compute device)"),
)

_BUILTIN_PLUGIN_NAME = "ember:builtin"


class InvalidDeviceName(ValueError, RuntimeError):
    """A device string that is not ``NAME`` or ``NAME:index`` (torch raises RuntimeError, many libraries
    ValueError: it is both)."""


class DeviceNotFoundError(RuntimeError):
    """No installed plugin provides the requested device."""


class DevicePluginError(RuntimeError):
    """The plugin that provides a device is broken or incompatible with this version of ember."""


class DeviceUnavailableError(RuntimeError):
    """The device is installed, but its probe says it cannot be used on this machine."""


class EntryPointLike(Protocol):
    """What :meth:`_DeviceRegistry.load_entry_point` needs: ``importlib.metadata.EntryPoint`` fits."""

    name: str
    value: str

    def load(self) -> Any:
        """Import and return the plugin object."""
        ...


@dataclass(frozen=True)
class PluginOrigin:
    """Where a plugin came from: its name in the plugin manager and the distribution that installed it."""

    name: str
    dist: str | None = None
    version: str | None = None
    entry_point: str | None = None
    builtin: bool = False

    @property
    def label(self) -> str:
        """``"ember-cpu==0.1.0"``, ``"built-in"``, or a description of an in-process plugin."""
        if self.builtin:
            return "built-in"
        if self.dist is not None:
            return f"{self.dist}=={self.version}" if self.version else self.dist
        if self.entry_point is not None:
            return f"unknown distribution (entry point {self.entry_point})"
        return f"in-process plugin {self.name!r}"


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be used. ``stage`` is ``"import"``, ``"register"``, ``"ember_devices"``
    (the hook raised or returned something invalid) or ``"conflict"`` (a device name already taken)."""

    origin: PluginOrigin
    stage: str
    error: BaseException

    def __str__(self) -> str:
        where = f" (entry point {self.origin.entry_point})" if self.origin.entry_point else ""
        return f"{self.origin.label}{where}: {self.stage} failed: {type(self.error).__name__}: {self.error}"


class _BuiltinDevices:
    """The plugin object through which core registers its own devices."""

    @hookimpl
    def ember_devices(self) -> list[DeviceSpec]:
        """Return the built-in device specs."""
        return list(BUILTIN_SPECS)


def _probe_memo_key(spec: DeviceSpec, origin: PluginOrigin) -> str:
    """Names the probe's code: a new version, or an edited module of an editable install, is checked again."""
    module = sys.modules.get(getattr(spec.probe, "__module__", "") or "")
    file = getattr(module, "__file__", None) or ""
    try:
        mtime = os.stat(file).st_mtime_ns if file else 0
    except OSError:
        mtime = 0
    qualname = getattr(spec.probe, "__qualname__", type(spec.probe).__name__)
    return f"{origin.label}|{origin.name}|{spec.name}|{file}|{mtime}|{qualname}"


#: Environment variables a shell changes between commands without changing what a plugin sees of the machine.
_VOLATILE_ENV = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "COLUMNS", "LINES", "PYTEST_CURRENT_TEST"})


def _tried_key(kind: str, origin: PluginOrigin, *parts: str) -> str:
    """The disk-cache key under which a clean run of a plugin's code in a child is remembered: the distribution,
    its version and entry point, this Python and ember, and a hash of the environment (a plugin may read any
    variable: a changed one is checked again)."""
    env = sha256(repr(sorted((k, v) for k, v in os.environ.items() if k not in _VOLATILE_ENV)).encode())
    return "|".join((kind, origin.label, origin.entry_point or "", *parts, sys.version, sys.executable,
                     str(PLUGIN_API), __file__, env.hexdigest()))


def _remembered(key: str) -> bool:
    from ember import diskcache  # imported late: `import ember` does not need it

    path = diskcache.entry_path("plugin-ok", key)
    return path is not None and diskcache.read(path) == b"ok"


def _remember(key: str) -> None:
    from ember import diskcache

    if (path := diskcache.entry_path("plugin-ok", key)) is not None:
        diskcache.write(path, b"ok")


def _origin_of(ep: Any) -> PluginOrigin:
    dist, version = _dist_of(ep)
    name = str(getattr(ep, "name", "?"))
    return PluginOrigin(name, dist, version, entry_point=f"{name} = {getattr(ep, 'value', '?')}")


def _hook_of(plugin: Any) -> Any:
    """A plugin's ``ember_devices`` implementation, called as pluggy calls it (no arguments)."""
    hook = getattr(plugin, "ember_devices", None)
    return hook() if callable(hook) else None


def _device_key(origin: PluginOrigin, name: str) -> tuple[str, str, str]:
    return (origin.label, origin.entry_point or "", name)


def _device_steps(spec: DeviceSpec, origin: PluginOrigin, tag: str, factory_of: Any) -> Generator[Any, None, bool]:
    """For :func:`tried_in_child`: device ``spec``'s precheck, probe and factory, as selection calls them (a reason
    or an exception ends the device's turn). Returns (through ``yield from``) whether the device was made."""
    label = f"device {spec.name} ({origin.label})"
    said: list[Any] = []
    for stage, fn in (("precheck", spec.precheck), ("probe", spec.probe)):
        if fn is not None:
            said.clear()
            yield f"{stage} {tag}", f"the {stage} of {label}", lambda fn=fn: said.append(fn())
            if said != [None]:
                return False
    made: list[Any] = []
    yield f"factory {tag}", f"creating {label}", lambda: made.append(factory_of(spec)(spec.name))
    return bool(made)


def _plugin_steps(eps: list[tuple[Any, PluginOrigin]], skip: set[int], unsafe: set[str],
                  factory_of: Any) -> Iterator[Any]:
    """For :func:`tried_in_child`: import each entry point (but ``skip``) and call its ``ember_devices()``; then
    try their devices as default selection would, highest priority first, until one is made (devices whose tag
    is in ``unsafe`` are passed over). Tags: ``import J``, ``hook J``, ``<stage> J <device>``."""
    found: list[tuple[DeviceSpec, int]] = []
    for j, (ep, origin) in enumerate(eps):
        if j in skip:
            continue
        loaded: list[Any] = []
        yield f"import {j}", f"the import of {origin.label}", lambda ep=ep, out=loaded: out.append(ep.load())
        if not loaded:
            continue
        specs: list[Any] = []
        yield f"hook {j}", f"ember_devices() of {origin.label}", (
            lambda out=specs, plugin=loaded[0]: out.extend(_hook_of(plugin) or ()))
        found += [(spec, j) for spec in specs if isinstance(spec, DeviceSpec) and spec.compute
                  and spec.plugin_api == PLUGIN_API]
    for spec, j in sorted(found, key=lambda t: (-t[0].priority, t[0].name)):
        tag = f"{j} {spec.name}"
        if tag not in unsafe and (yield from _device_steps(spec, eps[j][1], tag, factory_of)):
            return


def canonicalize(name: str) -> str:
    """Normalize a device name: ``"cpu"`` -> ``"CPU"``, ``"CPU:0"`` -> ``"CPU"``, ``"cuda:1"`` -> ``"CUDA:1"``.

    Only the base name before ``:`` is upper-cased; the rest (an index, or a path for DISK) is kept. A name
    that is not a string is a TypeError; one with no base, or whose index is not a plain non-negative
    number (``"CPU:abc"``, ``"CPU:-1"``, ``"CPU:"``, ``"CPU:01"``) raises :class:`InvalidDeviceName`: each
    spelling would otherwise be a device of its own.
    """
    if not isinstance(name, str):
        raise TypeError(f"device must be a string such as 'CPU' or 'CUDA:1', got {type(name).__name__} {name!r}")
    return _canonical(name)


@functools.lru_cache(maxsize=256)
def _canonical(name: str) -> str:
    base, sep, rest = name.strip().partition(":")
    base = base.upper()
    if not base.replace("_", "").isalnum() or not base.isascii() or base[0].isdigit():
        raise InvalidDeviceName(f"invalid device string {name!r}: expected a device name such as 'CPU', "
                                "optionally followed by ':' and an index ('CUDA:1')")
    if base == "DISK":  # the rest is a file path
        return base + sep + rest
    if sep and not (rest.isascii() and rest.isdigit() and (rest == "0" or rest[0] != "0")):
        raise InvalidDeviceName(f"invalid device string {name!r}: the index after ':' must be a non-negative "
                                f"integer such as '{base}:1', got {rest!r}")
    return base if rest == "0" else base + sep + rest


def _extra_exists(extra: str) -> bool:
    """Whether the installed ``ember`` distribution declares the pip extra ``extra`` (True when unknown)."""
    import importlib.metadata  # only for this error message: importing it costs a fresh process ~8 ms

    try:
        extras = importlib.metadata.metadata("ember").get_all("Provides-Extra") or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree: trust KNOWN_PLUGINS
        return True
    return extra in extras


def _dist_of(ep: Any) -> tuple[str | None, str | None]:
    """Distribution name and version of an entry point, or (None, None) when unknown."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    try:
        name = getattr(dist, "name", None) or dist.metadata["Name"]
    except Exception:
        name = None
    try:
        version = dist.version
    except Exception:
        version = None
    return name, version


class _DeviceRegistry:
    """All devices known to this process. Use the singleton :data:`Device`.

    Tests and tools can build an isolated registry: ``_DeviceRegistry(entry_points=[...])``
    uses exactly the given entry points instead of the installed ones (``[]`` for none), and
    ``builtins=False`` leaves out the built-in devices.
    """

    def __init__(self, entry_points: Iterable[EntryPointLike] | None = None, *, builtins: bool = True):
        self._entry_points = None if entry_points is None else list(entry_points)
        self._builtins = builtins
        self._lock = threading.RLock()
        self._pm = pluggy.PluginManager("ember")
        self._pm.add_hookspecs(hookspecs)
        self._loaded = False
        self._pending: list[Any] = []                    # entry points not loaded yet (see _ensure_loaded)
        self._hook_results: dict[str, Any] = {}          # plugin name -> ember_devices() result or its error
        self._ambiguous: dict[str, list[PluginOrigin]] = {}  # device name -> the distributions that declare it
        self._order: list[str] = []                      # plugin names, in registration order
        self._origins: dict[str, PluginOrigin] = {}      # plugin name -> origin
        self._load_failures: list[PluginFailure] = []
        self._specs: dict[str, DeviceSpec] | None = None  # None: hooks not collected yet
        self._spec_origins: dict[str, PluginOrigin] = {}
        self._hook_failures: list[PluginFailure] = []
        self._probe_cache: dict[str, str | None] = {}
        self._devices: dict[str, Any] = {}
        self._finalizer_registered = False
        #: True once :meth:`finalize` ran (at exit): buffers dropped after that leave their memory alone
        self.finalized = False
        self._default: str | None = None                  # set explicitly through the DEFAULT setter
        # what trying plugin code in a child found: id(entry point) -> (entry point, its verdict), and
        # (distribution label, entry point, device name) -> the reason the device's code is unsafe here (None: safe)
        self._tried_eps: dict[int, tuple[Any, tuple[str, Exception] | None]] = {}
        self._tried_specs: dict[tuple[str, str, str], str | None] = {}
        #: try plugin code in a child first even with ``DEV`` set (the doctor reports on every plugin)
        self.try_plugins_in_child = False
        self._auto_default: tuple[str, str] | None = None  # (DEV value it was computed for, result)

    # ----- loading plugins -----

    def _ensure_loaded(self, want: str | None = None) -> None:
        """Register the built-ins and load the entry points: all of them, or with ``want`` only those that may
        provide device ``want`` (same entry-point name, or its known distribution); the others stay pending."""
        with self._lock:
            if not self._loaded:
                self._loaded = True  # set first: a plugin that touches Device while importing must not recurse
                if self._builtins:
                    self._add_plugin(_BuiltinDevices(), PluginOrigin(_BUILTIN_PLUGIN_NAME, builtin=True))
                if self._entry_points is None:
                    self._pending = installed_entry_points(ENTRY_POINT_GROUP)
                else:
                    self._pending = list(self._entry_points)
            if want is None:
                todo, self._pending = self._pending, []
            else:
                dist = KNOWN_PLUGINS.get(want, (None, None))[1]
                todo = [ep for ep in self._pending
                        if str(getattr(ep, "name", "")).upper() == want or (dist and _dist_of(ep)[0] == dist)]
                self._pending = [ep for ep in self._pending if all(ep is not t for t in todo)]
            if todo and self._guarded():
                self._try_entry_points(todo)
            for ep in todo:
                self._load_entry_point(ep)

    def _guarded(self) -> bool:
        """Whether plugin code is tried in a child before it runs here: ``DEV`` unset (an explicit choice runs the
        plugin in this process, as asked) or :attr:`try_plugins_in_child` set, on a platform that can fork."""
        return (self.try_plugins_in_child or not getenv("DEV", "")) and guard_enabled()

    def _try_entry_points(self, eps: list[Any]) -> None:
        """Before anything of theirs runs here, try in one child process each entry point's import and
        ``ember_devices()``, then their devices as default selection would (precheck, probe, factory; highest
        priority first, until one is made). A call that takes the child down is settled (the plugin is broken, or
        the device unusable) and a new child goes on with the rest. Entry points a child already imported
        cleanly with this environment are not tried again; clean runs are remembered on disk."""
        todo: list[tuple[Any, PluginOrigin]] = []
        for ep in eps:
            if id(ep) in self._tried_eps:
                continue
            origin = _origin_of(ep)
            if _remembered(_tried_key("import", origin)):
                self._tried_eps[id(ep)] = (ep, None)
            else:
                todo.append((ep, origin))
        if not todo:
            return
        broken: dict[int, tuple[str, Exception]] = {}
        unsafe: set[str] = set()
        while True:
            verdict = tried_in_child(lambda: _plugin_steps(todo, set(broken), unsafe, self._resolve_factory))
            for tag in verdict.started[:-1] if verdict.failed else verdict.started:
                kind, _, rest = tag.partition(" ")
                j, _, name = rest.partition(" ")
                if kind not in ("import", "hook"):
                    key = _device_key(todo[int(j)][1], name)
                    if self._tried_specs.setdefault(key, None) is None:
                        _remember(_tried_key("device", todo[int(j)][1], name))
            if verdict.failed is None:
                break
            kind, _, rest = verdict.failed.partition(" ")
            index, _, name = rest.partition(" ")
            if kind in ("import", "hook"):
                broken[int(index)] = ("import" if kind == "import" else "ember_devices", verdict.error())
            else:
                self._tried_specs[_device_key(todo[int(index)][1], name)] = verdict.reason
                unsafe.add(rest)
        for k, (ep, origin) in enumerate(todo):
            self._tried_eps[id(ep)] = (ep, broken.get(k))
            if k not in broken:
                _remember(_tried_key("import", origin))

    def _invalidate(self) -> None:
        self._specs = None
        self._probe_cache.clear()
        self._auto_default = None

    def _record_load_failure(self, origin: PluginOrigin, stage: str, error: BaseException) -> None:
        self._load_failures.append(PluginFailure(origin, stage, error))
        self._invalidate()

    def _load_entry_point(self, ep: Any) -> bool:
        origin = _origin_of(ep)
        name = origin.name
        if name in self._origins:
            # the same distribution visible twice on sys.path (e.g. installed and editable): keep the first
            if self._origins[name].entry_point == origin.entry_point:
                return False
            if self._origins[name].dist != origin.dist:
                # another distribution's entry point of the same name (a third-party `cpu`): registered beside the
                # first, so the devices both declare are the conflict error, never a silent displacement
                origin = PluginOrigin(f"{name} ({origin.dist})", origin.dist, origin.version, origin.entry_point)
        unsafe = self._tried_eps.get(id(ep), (None, None))[1]
        if unsafe is not None:  # it took down the child that tried it: never run here
            self._record_load_failure(origin, *unsafe)
            return False
        try:
            # with a time limit, except while some module is being imported: a thread importing it would wait
            # for this one (a plugin found while ember itself is importing)
            plugin = ep.load() if _importing() else call_with_timeout(ep.load, f"import of {origin.label}")
        except (Exception, SystemExit) as e:
            self._record_load_failure(origin, "import", e)
            return False
        try:
            self._add_plugin(plugin, origin)
        except Exception as e:
            self._record_load_failure(origin, "register", e)
            return False
        return True

    def _add_plugin(self, plugin: Any, origin: PluginOrigin) -> None:
        """Register ``plugin`` with pluggy; raise when pluggy refuses it or it lacks ``ember_devices``."""
        self._pm.register(plugin, name=origin.name)
        if not any(impl.plugin is plugin for impl in self._pm.hook.ember_devices.get_hookimpls()):
            self._pm.unregister(plugin)
            raise TypeError(f"plugin {origin.name!r} does not implement the required hook ember_devices() "
                            "(decorate it with ember.device.hookimpl)")
        self._order.append(origin.name)
        self._origins[origin.name] = origin
        self._invalidate()

    def load_entry_point(self, ep: EntryPointLike) -> bool:
        """Load one entry point as a plugin, recording (not raising) any failure.

        ``ep`` is anything with ``.name``, ``.value``, ``.load()`` and optionally ``.dist``
        (an ``importlib.metadata.Distribution``), so tests can inject fakes. Returns True when
        the plugin was registered.
        """
        with self._lock:
            self._ensure_loaded()
            return self._load_entry_point(ep)

    def register_plugin(self, plugin: Any, name: str) -> None:
        """Register an in-process plugin (a module or object with ``@hookimpl`` functions) under ``name``.

        Raises ``ValueError`` when the name is taken and ``TypeError`` when the plugin does not
        implement ``ember_devices``. Errors inside its hooks are recorded like any plugin's.
        """
        with self._lock:
            self._ensure_loaded()
            self._add_plugin(plugin, PluginOrigin(name))

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin registered under ``name``; device objects already created stay cached."""
        with self._lock:
            self._ensure_loaded()
            self._pm.unregister(name=name)
            self._hook_results.pop(name, None)
            self._order.remove(name)
            del self._origins[name]
            self._invalidate()

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The underlying pluggy plugin manager (project name ``"ember"``)."""
        self._ensure_loaded()
        return self._pm

    # ----- collecting specs -----

    def _collect(self, want: str | None = None) -> dict[str, DeviceSpec]:
        """Every spec (``want=None``), or enough of them to know device ``want``: the plugins that may provide it
        first, every plugin only when they do not."""
        with self._lock:
            self._ensure_loaded(want)
            specs = self._collect_loaded()
            if want is not None and want not in specs and self._pending:
                self._ensure_loaded()
                specs = self._collect_loaded()
            return specs

    def _collect_loaded(self) -> dict[str, DeviceSpec]:
        with self._lock:
            if self._specs is not None:
                return self._specs
            impls = {impl.plugin_name: impl for impl in self._pm.hook.ember_devices.get_hookimpls()}
            specs: dict[str, DeviceSpec] = {}
            spec_origins: dict[str, PluginOrigin] = {}
            failures: list[PluginFailure] = []
            self._ambiguous = {}
            for plugin_name in self._order:
                if plugin_name not in impls:  # unregistered behind our back through plugin_manager
                    continue
                origin = self._origins[plugin_name]
                try:
                    result = self._devices_of(plugin_name, impls[plugin_name].function, origin)
                except Exception as e:
                    failures.append(PluginFailure(origin, "ember_devices", e))
                    continue
                for spec in result:
                    if spec.name in specs:
                        keep_new = self._resolve_duplicate(spec.name, spec_origins[spec.name], origin, failures)
                        if not keep_new:
                            continue
                    specs[spec.name] = spec
                    spec_origins[spec.name] = origin
            self._specs, self._spec_origins, self._hook_failures = specs, spec_origins, failures
            return specs

    def _devices_of(self, plugin_name: str, hook: Any, origin: PluginOrigin) -> list[DeviceSpec]:
        """A plugin's ``ember_devices()`` result, called once (with a time limit) and remembered."""
        if plugin_name not in self._hook_results:
            try:
                result = hook() if origin.builtin else call_with_timeout(hook, f"ember_devices() of {origin.label}")
                if not isinstance(result, (list, tuple)) or not all(isinstance(s, DeviceSpec) for s in result):
                    raise TypeError(f"ember_devices() must return a list of DeviceSpec, got {result!r}")
                self._hook_results[plugin_name] = list(result)
            except Exception as e:  # noqa: BLE001  (recorded as the plugin's failure)
                self._hook_results[plugin_name] = e
        result = self._hook_results[plugin_name]
        if isinstance(result, Exception):
            raise result
        return result

    def _resolve_duplicate(self, name: str, first: PluginOrigin, second: PluginOrigin,
                           failures: list[PluginFailure]) -> bool:
        """Two plugins declare device ``name``: whether ``second`` replaces ``first``. Within one distribution the
        first stays; across distributions the one named by ``EMBER_PLUGIN_<NAME>`` wins, and without a choice
        the device is ambiguous (an error naming both when it is used)."""
        chosen = os.environ.get(f"EMBER_PLUGIN_{name}", "").strip()
        if first.dist != second.dist and not first.builtin and chosen not in (first.dist, second.dist):
            self._ambiguous.setdefault(name, [first]).append(second)
            return False
        keep, drop = (second, first) if chosen and chosen == second.dist else (first, second)
        failures.append(PluginFailure(drop, "conflict", ValueError(
            f"device {name} is already provided by {keep.label}; this one is ignored")))
        return keep is second

    def specs(self) -> dict[str, DeviceSpec]:
        """Every device spec installed, by name, including incompatible and unusable ones."""
        return dict(self._collect())

    def failures(self) -> list[PluginFailure]:
        """Plugins that failed to import or register, hooks that raised, and device-name clashes."""
        with self._lock:
            self._collect()
            return [*self._load_failures, *self._hook_failures]

    def origin(self, name: str) -> PluginOrigin:
        """The plugin that provides device ``name`` (``origin("CPU").label == "ember-cpu==0.1.0"``)."""
        base = self._base(name)
        specs = self._collect(base)
        if base not in specs:
            raise DeviceNotFoundError(self._not_found_message(base))
        return self._spec_origins[base]

    def report_header(self) -> dict[PluginOrigin, list[str]]:
        """Lines from each plugin's ``ember_report_header`` hook; a hook that raises gives one error line."""
        with self._lock:
            self._ensure_loaded()
            impls = {impl.plugin_name: impl for impl in self._pm.hook.ember_report_header.get_hookimpls()}
            out: dict[PluginOrigin, list[str]] = {}
            for plugin_name in self._order:
                if plugin_name not in impls:
                    continue
                try:
                    lines: Any = impls[plugin_name].function()
                    out[self._origins[plugin_name]] = [str(line) for line in lines]
                except Exception as e:
                    out[self._origins[plugin_name]] = [f"ember_report_header failed: {type(e).__name__}: {e}"]
            return out

    # ----- names, probing, errors -----

    @staticmethod
    def canonicalize(name: str) -> str:
        """Normalize a device name: ``"cpu"`` -> ``"CPU"``, ``"CPU:0"`` -> ``"CPU"``, ``"cuda:1"`` -> ``"CUDA:1"``."""
        return canonicalize(name)

    @staticmethod
    def _base(name: str) -> str:
        return canonicalize(name).partition(":")[0]

    def _failure_for(self, base: str) -> PluginFailure | None:
        """The load or hook failure of the plugin that would provide ``base``, if any."""
        dist = KNOWN_PLUGINS.get(base, (None, None))[1]
        for failure in [*self._load_failures, *self._hook_failures]:
            if failure.stage == "conflict":
                continue
            named = failure.origin.name.partition(" ")[0].upper()  # "cpu (other-dist)": a second `cpu` entry point
            if named == base or (dist is not None and failure.origin.dist == dist):
                return failure
        return None

    def _not_found_message(self, base: str) -> str:
        installed = ", ".join(sorted(self._collect())) or "none"
        msg = f'device "{base}" is not installed (installed devices: {installed}).'
        if base in KNOWN_PLUGINS:
            extra, dist = KNOWN_PLUGINS[base]
            how = f'pip install "ember[{extra}]"' if _extra_exists(extra) else f"install {dist}"
            msg += f" {base} is provided by the {dist} plugin: {how}."
        else:
            msg += " If a third-party plugin provides it, install that plugin."
        broken = [str(f) for f in self.failures() if f.stage != "conflict"]
        if broken:
            msg += " Plugins that failed to load: " + "; ".join(broken) + "."
        return msg + " `python -m ember.doctor` lists every device and plugin."

    def _run_probe(self, spec: DeviceSpec) -> str | None:
        if spec.name not in self._probe_cache:
            self._probe_cache[spec.name] = self._unusable_because(spec)
        return self._probe_cache[spec.name]

    def _unusable_because(self, spec: DeviceSpec) -> str | None:
        """Why ``spec``'s device cannot be used here, or ``None``: its precheck in this process, then its probe
        (a plugin's probe runs in a forked child first, until it is known not to crash the process)."""
        origin = self._spec_origins.get(spec.name)
        tried = origin is not None and origin.entry_point is not None and self._guarded()
        if tried:
            assert origin is not None
            unsafe = self._try_device(spec, origin)
            if unsafe is not None:
                return unsafe
        stage = "precheck"
        try:
            if spec.precheck is not None:
                early = call_with_timeout(spec.precheck, f"the precheck of device {spec.name}")
                if early is not None:
                    return str(early) or "the precheck reported it unusable"
            if spec.probe is None:
                return None
            stage, what = "probe", f"the probe of device {spec.name}"
            if origin is not None and not origin.builtin and not tried:
                crash = crash_checked(spec.probe, what, _probe_memo_key(spec, origin))
                if crash is not None:
                    return crash
            result = call_with_timeout(spec.probe, what)
            return None if result is None else (str(result) or "the probe reported it unusable")
        except PluginTimeout as e:
            return str(e)
        except Exception as e:
            return f"{stage} raised {type(e).__name__}: {e}"

    def _try_device(self, spec: DeviceSpec, origin: PluginOrigin) -> str | None:
        """Why the code of device ``spec`` may not run here, or ``None``: its precheck, probe and factory, tried in
        a child process (as selection would call them) unless a child already ran them cleanly. Most devices are
        tried by the child of :meth:`_try_entry_points`, before their plugin runs here; this child is forked
        after it did (a device selection did not reach then, or one asked for by name)."""
        key = _device_key(origin, spec.name)
        if key in self._tried_specs:
            return self._tried_specs[key]
        memo = _tried_key("device", origin, spec.name)
        if _remembered(memo):
            self._tried_specs[key] = None
            return None
        verdict = tried_in_child(lambda: _device_steps(spec, origin, "0 " + spec.name, self._resolve_factory))
        self._tried_specs[key] = verdict.reason
        if verdict.reason is None:
            _remember(memo)
        return verdict.reason

    def unsafe_plugins(self) -> list[str]:
        """One line for each plugin call that crashed, ended, interrupted or hung the child process that tried it,
        naming the distribution (what ``python -m ember.doctor`` lists as crashed)."""
        with self._lock:
            self._collect()
            lines = [f"{f.origin.label}: {f.error}" for f in self._load_failures
                     if isinstance(f.error, (PluginCrash, PluginTimeout))]
            return lines + [reason for reason in self._tried_specs.values() if reason is not None]

    def _check(self, base: str) -> DeviceSpec:
        """Return the spec of a usable device ``base``, or raise the error that says why it is not usable."""
        with self._lock:
            specs = self._collect(base)
            spec = specs.get(base)
            if base in self._ambiguous:
                labels = " and ".join(o.label for o in self._ambiguous[base])
                dists = [o.dist for o in self._ambiguous[base] if o.dist]
                raise DevicePluginError(
                    f'device "{base}" is declared by more than one distribution: {labels}. Choose one with '
                    f"EMBER_PLUGIN_{base}=<distribution> (e.g. EMBER_PLUGIN_{base}={dists[0] if dists else '...'}), "
                    "or uninstall the other.")
            if spec is None:
                failure = self._failure_for(base)
                if failure is not None:
                    raise DevicePluginError(
                        f'device "{base}" is unavailable because its plugin is broken: {failure}. '
                        f"Reinstall or fix {failure.origin.dist or 'that plugin'}, or uninstall it."
                    ) from failure.error
                raise DeviceNotFoundError(self._not_found_message(base))
            origin = self._spec_origins[base]
            if spec.plugin_api != PLUGIN_API:
                raise DevicePluginError(
                    f'device "{base}" from {origin.label} is incompatible: it was written for ember plugin API '
                    f"{spec.plugin_api}, and this ember (plugin API {PLUGIN_API}) cannot use it. "
                    "Install versions of ember and the plugin that match.")
            reason = self._run_probe(spec)
            if reason is not None:
                raise DeviceUnavailableError(f'device "{base}" ({origin.label}) is installed but not usable: {reason}')
            return spec

    def probe(self, name: str) -> str | None:
        """``None`` when device ``name`` can be used, else the reason it cannot (never raises)."""
        try:
            self._check(self._base(name))
        except (DeviceNotFoundError, DevicePluginError) as e:
            return str(e)
        except DeviceUnavailableError:
            return self._probe_cache[self._base(name)]
        return None

    def available(self) -> list[str]:
        """Names of the usable compute devices, highest priority first."""
        specs = self._collect()
        ordered = sorted(specs.values(), key=lambda s: (-s.priority, s.name))
        return [s.name for s in ordered if s.compute and self.probe(s.name) is None]

    # ----- device objects -----

    def _resolve_factory(self, spec: DeviceSpec) -> Any:
        module_name, _, attr = spec.factory.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except Exception as e:
            raise DevicePluginError(f'cannot import "{spec.factory}", the factory of device {spec.name} '
                                    f"({self._spec_origins[spec.name].label}): {type(e).__name__}: {e}") from e
        return obj

    def __getitem__(self, name: str) -> Any:
        """The device object for ``name`` (``"CPU"``, ``"cpu"``, ``"CPU:1"``), created on first use and cached."""
        name = canonicalize(name)
        # a device made already is returned without the lock: the lock is held while plugin calls run on other
        # threads (a probe under its time limit), and a collection in such a thread frees buffers, whose
        # allocator is looked up here (with the lock, that probe waited for itself until its time ran out)
        device = self._devices.get(name)
        if device is not None:
            return device
        with self._lock:
            if name in self._devices:
                return self._devices[name]
            spec = self._check(name.partition(":")[0])
            factory = self._resolve_factory(spec)
            try:
                device = factory(name)
            except Exception as e:
                raise DevicePluginError(f"creating device {name} ({self._spec_origins[spec.name].label}) failed: "
                                        f"{type(e).__name__}: {e}") from e
            self._devices[name] = device
            if not self._finalizer_registered:
                atexit.register(self.finalize)
                self._finalizer_registered = True
            return device

    def finalize(self) -> None:
        """Synchronize and ``finalize()`` every device object created so far, newest first, and forget them.

        Registered with ``atexit`` when the first device is created. A device that raises is
        reported with a warning; the others are still finalized.
        """
        with self._lock:
            devices = list(self._devices.items())[::-1]
            self._devices.clear()
            self.finalized = True
        for name, device in devices:
            try:
                for step in ("synchronize", "finalize"):  # optional for a device that is not a Compiled
                    if (method := getattr(device, step, None)) is not None:
                        method()
            except Exception as e:
                warnings.warn(f"ember: finalizing device {name} failed: {type(e).__name__}: {e}", stacklevel=2)

    # ----- the default device -----

    @property
    def DEFAULT(self) -> str:
        """The device tensors go to when none is given.

        Assigned explicitly (``Device.DEFAULT = "CPU"``), or taken from the ``DEV`` environment
        variable (``DEV=CPU``, ``DEV=CUDA:1``; an unusable choice raises, it never falls back),
        or else the usable device of highest priority. A warning names any higher-priority
        device that was skipped and why; the slow PYTHON device is used only as a last resort.
        """
        if self._default is not None:
            return self._default
        with self._lock:
            env = getenv("DEV", "")
            if self._auto_default is None or self._auto_default[0] != env:
                self._auto_default = (env, self._select_default(env))
            return self._auto_default[1]

    @DEFAULT.setter
    def DEFAULT(self, name: str | None) -> None:
        if name is None:
            self._default = None
            return
        name = canonicalize(name)
        self._check(name.partition(":")[0])
        self._default = name

    def _select_default(self, env: str) -> str:
        if env:
            name = canonicalize(env)
            self._check(name.partition(":")[0])
            return name
        specs = self._collect()
        skipped: list[str] = []
        chosen: str | None = None
        for spec in sorted(specs.values(), key=lambda s: (-s.priority, s.name)):
            if not spec.compute:
                continue
            reason = self.probe(spec.name)
            if reason is None:
                try:
                    self[spec.name]  # a factory that fails here makes the next device the default
                except DevicePluginError as e:
                    reason = str(e)
                else:
                    chosen = spec.name
                    break
            skipped.append(f"{spec.name} ({self._spec_origins[spec.name].label}): {reason}")
        broken = [str(f) for f in self.failures() if f.stage != "conflict"]
        if chosen is None:
            raise DeviceNotFoundError("no usable device: " + "; ".join(skipped + broken or ["nothing is installed"]))
        notes = []
        if skipped:
            notes.append("skipped higher-priority devices: " + "; ".join(skipped))
        if broken:
            notes.append("plugins that failed to load: " + "; ".join(broken))
        if chosen == "PYTHON":
            notes.append("PYTHON is a slow pure-Python interpreter; install a device plugin, "
                         'e.g. pip install "ember[cpu]"')
        if notes:
            warnings.warn(f"ember: default device is {chosen}. " + ". ".join(notes), stacklevel=3)
        return chosen

    def __repr__(self) -> str:
        return f"<Device registry: {', '.join(self._collect())}>"


#: The process-wide device registry.
Device = _DeviceRegistry()


def register_plugin(plugin: Any, name: str) -> None:
    """Register an in-process plugin with the global :data:`Device` registry.

    See :meth:`_DeviceRegistry.register_plugin`.
    """
    Device.register_plugin(plugin, name)


def load_entry_point(ep: EntryPointLike) -> bool:
    """Load an entry-point-like object as a plugin of the global :data:`Device` registry; failures are recorded."""
    return Device.load_entry_point(ep)
