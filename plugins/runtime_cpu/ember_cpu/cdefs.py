"""The C declarations the CPU runtime calls through cffi, and the generator of their prebuilt form.

Parsing declarations (``cffi.FFI().cdef``) imports pycparser and costs about 65 ms at every start, so
:mod:`ember_cpu._ffi` holds them prebuilt (cffi's out-of-line ABI mode: type tables, no parser, ~1 ms).
After editing :data:`CDEF`, regenerate it with ``python -m ember_cpu.cdefs``; a test checks that the
two agree.
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

CDEF = """
typedef void (*ember_kernel_fn)(void **bufs, const long long *vals);
typedef void (*ember_batch_fn)(int n, ember_kernel_fn *fns, void ***bufs, const long long **vals);
void *dlopen(const char *filename, int flags);
void *dlsym(void *handle, const char *symbol);
int dlclose(void *handle);
char *dlerror(void);
"""

#: the prebuilt module, next to this one
MODULE = "ember_cpu._ffi"
MODULE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ffi.py")


def parsed_ffi() -> Any:
    """An FFI with :data:`CDEF` parsed now (what the prebuilt module stands in for)."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi


def prebuilt_source() -> str:
    """The text of :mod:`ember_cpu._ffi` for :data:`CDEF` and the installed cffi."""
    ffi = parsed_ffi()
    ffi.set_source(MODULE, None)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "_ffi.py")
        ffi.emit_python_code(path)  # (cffi says "generating <path>" on stdout)
        with open(path) as f:
            body = f.read()
    header = ('"""Prebuilt cffi declarations of the CPU runtime: generated from ember_cpu.cdefs.CDEF by\n'
              '``python -m ember_cpu.cdefs``; do not edit."""\n# ruff: noqa\n# mypy: ignore-errors\n')
    return header + body.replace("# auto-generated file\n", "")


def load() -> Any:
    """The runtime's FFI: the prebuilt one, or (a cffi whose backend refuses it) :data:`CDEF` parsed now."""
    try:
        from ember_cpu._ffi import ffi

        return ffi
    except Exception:  # noqa: BLE001 - an incompatible or missing prebuilt module: parse instead
        return parsed_ffi()


if __name__ == "__main__":
    with open(MODULE_PATH, "w") as out:
        out.write(prebuilt_source())
    print(f"wrote {MODULE_PATH}", file=sys.stderr)
