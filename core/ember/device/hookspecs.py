"""The hooks an ember plugin may implement.

ember finds plugins through the ``ember.devices`` entry-point group and talks to them with
`pluggy <https://pluggy.readthedocs.io>`_ under the project name ``"ember"``. A plugin is an
importable module (or any object) whose functions are decorated with :data:`hookimpl` and
named after one of the specifications below. Each plugin is called on its own, so a hook
that raises only disables the plugin that raised it.

Hooks are few on purpose: they only announce what a plugin offers. Everything a device
*does* lives in the device class named by :attr:`DeviceSpec.factory`.

A minimal device plugin::

    from ember.device import DeviceSpec, hookimpl

    @hookimpl
    def ember_devices():
        return [DeviceSpec("FOO", factory="ember_foo.device:FooDevice", extra="foo")]
"""
from __future__ import annotations

import pluggy

from ember.device.spec import PLUGIN_API, DeviceSpec

__all__ = ["PLUGIN_API", "ember_devices", "ember_report_header", "hookimpl", "hookspec"]


#: Marks the functions in this module as hook specifications.
hookspec = pluggy.HookspecMarker("ember")

#: Marks a plugin's function as the implementation of the hook of the same name.
hookimpl = pluggy.HookimplMarker("ember")


@hookspec
def ember_devices() -> list[DeviceSpec]:
    """Announce the devices this plugin provides. **Required** for a device plugin.

    Called once per process, the first time ember needs to know which devices exist (the
    first ``Device[...]``, ``Device.DEFAULT``, ``Device.specs()`` ...), not at ``import ember``.

    :return: a list of :class:`ember.device.DeviceSpec`, usually one. An empty list is
        allowed (for instance when the plugin supports no device on this platform), but a
        device that is present and unusable should rather be returned with a ``probe`` that
        explains why: that way the user sees the reason in ``python -m ember.doctor``.

    Rules for implementers:

    * Be cheap. Do not import heavy libraries, open drivers or allocate memory here; the
      device class is imported lazily from ``DeviceSpec.factory`` when the device is first
      used, and ``DeviceSpec.probe`` is called only when ember needs to know whether the
      device works.
    * Every name must be unique across installed plugins. A name already taken by an earlier
      plugin (the built-ins come first) is ignored, and the clash is recorded as a failure.
    * Raising is allowed and contained: the exception is recorded against this plugin, and
      requesting one of its devices raises :class:`ember.device.DevicePluginError` chained to it.
    """


@hookspec
def ember_report_header() -> list[str]:
    """Return extra lines describing the plugin's environment. Optional.

    ``python -m ember.doctor`` prints these lines under the plugin's devices. Use them for
    facts that help a bug report: driver or compiler versions, the library path found, the
    number of devices visible. Each string is one line without a trailing newline.

    Like :func:`ember_devices`, this hook must be cheap and is called for each plugin on its
    own; if it raises, the doctor prints the exception instead of the lines.
    """
