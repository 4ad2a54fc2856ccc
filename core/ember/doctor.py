"""``python -m ember.doctor``: report the installation, every device plugin, and smoke-test each usable device.

Exits with status 0 when the default device passes its smoke test, 1 otherwise.
"""
from __future__ import annotations

import importlib.metadata
import platform
import sys
import warnings

from ember.device import PLUGIN_API, Device, DeviceSpec


def _ember_version() -> str:
    try:
        return importlib.metadata.version("ember")
    except importlib.metadata.PackageNotFoundError:
        import ember

        return f"{getattr(ember, '__version__', 'unknown')} (not installed as a distribution)"


def _status(spec: DeviceSpec) -> str:
    if spec.plugin_api != PLUGIN_API:
        return f"incompatible plugin_api {spec.plugin_api} (this ember speaks {PLUGIN_API})"
    reason = Device.probe(spec.name)
    return "usable" if reason is None else f"unusable: {reason}"


def smoke_test(device: str) -> str | None:
    """Run three ops on ``device``; return None when the answer is right, else what went wrong."""
    try:
        from ember.tensor import Tensor

        value = (Tensor([1.0, 2.0, 3.0], device=device) * 2 + 1).sum().item()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    if value != 15.0:
        return f"wrong result: expected 15.0, got {value!r}"
    return None


def main() -> int:
    """Print the report; return the process exit code."""
    print(f"ember    {_ember_version()}")
    print(f"python   {platform.python_version()} ({sys.executable})")
    print(f"platform {platform.platform()} ({platform.machine()})")
    print(f"plugin API {PLUGIN_API}")

    specs = sorted(Device.specs().values(), key=lambda s: (-s.priority, s.name))
    print("\ndevices:")
    for spec in specs:
        label = Device.origin(spec.name).label
        print(f"  {spec.name:<8} {label:<28} priority {spec.priority:>4}  {_status(spec)}")
    for failure in Device.failures():
        if failure.stage == "conflict":
            print(f"  {'-':<8} {failure.origin.label:<28} {'':>13}  ignored: {failure.error}")
        else:
            error = f"{type(failure.error).__name__}: {failure.error}"
            print(f"  {failure.origin.name.upper():<8} {failure.origin.label:<28} priority {'?':>4}  "
                  f"broken ({failure.stage}): {error}")

    headers = Device.report_header()
    if any(headers.values()):
        print("\nplugin reports:")
        for origin, lines in headers.items():
            for line in lines:
                print(f"  [{origin.label}] {line}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            default: str | None = Device.DEFAULT
        except Exception as e:
            default = None
            print(f"\ndefault device: none ({type(e).__name__}: {e})")
    if default is not None:
        print(f"\ndefault device: {default}")
    for w in caught:
        print(f"  note: {w.message}")

    print("\nsmoke test ((Tensor([1., 2., 3.]) * 2 + 1).sum() == 15):")
    usable = Device.available()
    if default is not None and default.partition(":")[0] in usable and default not in usable:
        usable.append(default)  # DEV=CPU:1 style defaults get their own line
    results: dict[str, str | None] = {}
    for name in usable:
        results[name] = smoke_test(name)
        print(f"  {name:<8} {'ok' if results[name] is None else 'FAILED: ' + str(results[name])}")
    ok = default is not None and default in results and results[default] is None
    print(f"\n{'ok' if ok else 'FAILED'}: the default device {'works' if ok else 'does not work'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
