"""The device layer: plugin discovery and the ``Device`` registry (more is re-exported as it lands).

This module must stay import-light: plugins import it, and it never imports the tensor layer.
"""
from ember.device.hookspecs import PLUGIN_API, hookimpl, hookspec
from ember.device.registry import Device, DeviceNotFoundError, DevicePluginError, DeviceUnavailableError
from ember.device.spec import DeviceSpec

__all__ = [
    "PLUGIN_API",
    "Device",
    "DeviceNotFoundError",
    "DevicePluginError",
    "DeviceSpec",
    "DeviceUnavailableError",
    "hookimpl",
    "hookspec",
]
