"""Plugins import core only through its public facade: ember.device, ember.renderer, ember.dtype, ember.ir.

The submodules behind the facade (``ember.device.allocator``, ``ember.ir.symbolic``, ``ember.helpers`` ...)
are core's own layout; a plugin that reaches into one breaks when core moves things. This test reads
the source of every plugin package in the repository (``plugins/*/ember_*`` and the documented example
plugin) and fails on any import of a core module outside the facade, naming the file, line and module.
"""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: the modules a plugin may import from core (each exactly: not their submodules)
FACADE = ("ember.device", "ember.renderer", "ember.dtype", "ember.ir")
#: developer tools shipped inside a plugin package that drive codegen themselves (not part of the device):
#: file (relative to plugins/) -> the extra core modules it may import
TOOLS = {
    "runtime_cuda/ember_cuda/corpus_check.py": ("ember.codegen", "ember.testing"),
    "runtime_amd_hcq/ember_amd/corpus_check.py": ("ember.codegen", "ember.testing"),
}


def plugin_packages() -> list[pathlib.Path]:
    """Every plugin package in the repository: ``plugins/<dist>/ember_*`` and ``docs/example_plugin/ember_*``."""
    found = sorted(p for p in (ROOT / "plugins").glob("*/ember_*") if p.is_dir() and not p.name.endswith(".egg-info"))
    found += sorted(p for p in (ROOT / "docs" / "example_plugin").glob("ember_*") if p.is_dir())
    return found


def core_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, module)`` for each import of a core (``ember`` / ``ember.*``) module in ``path``, local imports too.

    ``from ember import x`` counts as importing ``ember.x`` (x may be a submodule such as ``diskcache``).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name == "ember" or a.name.startswith("ember.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "ember":
                out += [(node.lineno, f"ember.{a.name}") for a in node.names]
            elif node.module.startswith("ember."):
                out.append((node.lineno, node.module))
    return out


def _tool_key(path: pathlib.Path) -> str:
    return path.relative_to(ROOT / "plugins").as_posix() if (ROOT / "plugins") in path.parents else ""


def test_every_plugin_directory_is_scanned() -> None:
    dirs = {p.parent.name for p in plugin_packages() if p.parent.parent.name == "plugins"}
    assert {"runtime_cpu", "runtime_opencl"} <= dirs


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plugin_imports_only_the_facade(package: pathlib.Path) -> None:
    bad = [f"{f.relative_to(ROOT)}:{line}: {mod}" for f in sorted(package.rglob("*.py"))
           for line, mod in core_imports(f) if mod not in FACADE + TOOLS.get(_tool_key(f), ())]
    assert not bad, "plugins must import core only through " + ", ".join(FACADE) + ":\n" + "\n".join(bad)


def test_scanner_sees_private_imports(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom ember.device import Compiled\nfrom ember import diskcache\n"
                   "def f():\n    from ember.ir.symbolic import split_terms\n    import ember.helpers\n")
    assert core_imports(src) == [(2, "ember.device"), (3, "ember.diskcache"), (5, "ember.ir.symbolic"),
                                 (6, "ember.helpers")]


@pytest.mark.parametrize("facade", ["ember.device", "ember.renderer"])
def test_facade_exports_resolve(facade: str) -> None:
    module = importlib.import_module(facade)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing


def test_device_facade_has_the_plugin_contract() -> None:
    import ember.device as dev

    need = {"Compiled", "Allocator", "LRUAllocator", "BufferSpec", "Compiler", "BatchCompiler", "KernelBinary",
            "CompileError", "Program", "Graph", "Renderer", "DeviceSpec", "hookimpl", "PLUGIN_API", "getenv", "DEBUG",
            "DevicePluginError", "DeviceUnavailableError", "DeviceNotFoundError", "copyin_source", "copyout_dest"}
    assert need <= set(dev.__all__)
    from ember.renderer import CStyleRenderer, Ops, Renderer, UOp, dtypes  # noqa: F401
