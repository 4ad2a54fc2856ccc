"""``python -m ember.doctor``: report the installation, every device plugin, and smoke-test each usable device.

Exits with status 0 when the default device passes its smoke test, 1 otherwise, and 1 when the report is
incomplete (the checking process ended, even with status 0, before its last line).

The probes and smoke tests run in a child process (``--in-process`` is that child), so a plugin that
hangs or crashes the interpreter cannot take the doctor with it: the report shows what was found up to
that point and why it stopped. Inside that child every plugin's import, hook, precheck, probe and factory
is first tried in a child of its own (whatever ``DEV`` says), so a plugin that crashes, exits or hangs is
named under "crashed plugins" and the report goes on. Each plugin import, hook and probe is limited to
``EMBER_PLUGIN_TIMEOUT`` seconds inside the child; the whole child to ``EMBER_DOCTOR_TIMEOUT`` (default:
three of those per installed plugin, plus a minute for the smoke tests).
"""
from __future__ import annotations

import importlib.metadata
import platform
import signal
import subprocess
import sys
import threading
import warnings

from ember.device import PLUGIN_API, Device, DeviceSpec
from ember.helpers import getenv


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


def distributed_report() -> list[str]:
    """One line per communication backend: its name, where it comes from, and whether it is usable here."""
    try:
        from ember.distributed.backend import backends
    except Exception as e:
        return [f"cannot list: {type(e).__name__}: {e}"]
    lines = []
    for name, info in sorted(backends().items()):
        reason = info.probe()
        lines.append(f"{name:<8} {info.origin:<28} {'usable' if reason is None else 'unusable: ' + reason}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the report (probing in a child process, see the module docstring); return the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if "--in-process" in args:
        return report()
    from ember.device.entry_points import entry_points
    from ember.device.registry import ENTRY_POINT_GROUP, plugin_timeout

    plugins = len(entry_points(ENTRY_POINT_GROUP))  # the same plugins device selection finds
    budget = getenv("EMBER_DOCTOR_TIMEOUT", 0.0) or plugin_timeout() * 3 * (plugins + 2) + 60
    child = subprocess.Popen([sys.executable, "-m", "ember.doctor", "--in-process"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    last: list[str] = [""]

    def relay() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.strip():
                last[0] = line.strip()

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = child.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        reader.join(5)
        print(f"\nFAILED: the device checks did not finish within {budget:g} s (EMBER_DOCTOR_TIMEOUT); "
              f"the last line was: {last[0]!r}")
        return 1
    reader.join(5)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        print(f"\nFAILED: a device check crashed the checking process ({name}); the last line was: {last[0]!r}")
        return 1
    if not last[0].startswith(_VERDICTS):
        print(f"\nFAILED: the report is incomplete: the checking process ended (status {code}) before its last "
              f"line; the last line was: {last[0]!r}")
        return 1
    return code


#: How the report's last line starts: any other last line means it was cut off.
_VERDICTS = ("ok: the default device", "FAILED: the default device")


def report() -> int:
    """Print the report, probing in this process; return the process exit code."""
    print(f"ember    {_ember_version()}")
    print(f"python   {platform.python_version()} ({sys.executable})")
    print(f"platform {platform.platform()} ({platform.machine()})")
    print(f"plugin API {PLUGIN_API}")

    Device.try_plugins_in_child = True  # a crash is reported, even of a plugin DEV did not name
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

    print("\ndistributed backends (ember.distributed):")
    for line in distributed_report():
        print(f"  {line}")

    crashed = Device.unsafe_plugins()
    if crashed:
        print("\ncrashed plugins (tried in a child process; never called in this one):")
        for line in crashed:
            print(f"  {line}")

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
