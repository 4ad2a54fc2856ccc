"""The key of everything codegen reads when it turns a kernel AST into a program.

A lowered program may be reused (from memory or disk) only when nothing that shaped it changed: the AST,
the knobs that pick optimizations (``NOOPT``, ``BEAM``, ``TC``), every capability of the renderer, and the code of
codegen, the renderers and the graph layer themselves. :func:`lowering_key` puts all of them in one string;
the engine's lowering cache and BEAM's result cache both use it.
"""
from __future__ import annotations

import functools
import pathlib
import sys
from typing import Any

from ember.helpers import BEAM, NOOPT, sha256
from ember.ir.uop import UOp, serialize_uop

#: bumped when lowering changes in a way the source hash below would not see
CODEGEN_VERSION = 2
#: instance values that are renderer capabilities (render-time scratch state is lists, sets and dicts of uops)
_PLAIN = (bool, int, float, str, bytes, type(None), tuple, frozenset)


@functools.cache
def codegen_fingerprint(renderer_type: type) -> str:
    """A hash of every source file that decides how an AST is lowered and rendered for ``renderer_type``."""
    import ember

    root = pathlib.Path(ember.__file__).parent
    files = sorted([*root.glob("ir/*.py"), *root.glob("codegen/*.py"), *root.glob("renderer/*.py")])
    for cls in renderer_type.__mro__:
        mod = sys.modules.get(cls.__module__)
        if mod is not None and getattr(mod, "__file__", None):
            files.append(pathlib.Path(mod.__file__ or ""))
    h = sha256(str(CODEGEN_VERSION).encode())
    for f in dict.fromkeys(files):
        h.update(f.read_bytes() if f.is_file() else b"")
    return h.hexdigest()


def capability_names(renderer: Any) -> list[str]:
    """The names of ``renderer``'s capabilities: each public non-method attribute declared on a class of its MRO,
    and each plain public value the instance sets itself (``fp16``, limits)."""
    names: set[str] = set()
    for cls in type(renderer).__mro__:
        for name, value in vars(cls).items():
            if not name.startswith("_") and not callable(value) and not isinstance(value, (property, staticmethod,
                                                                                           classmethod)):
                names.add(name)
    names.update(k for k, v in vars(renderer).items() if not k.startswith("_") and isinstance(v, _PLAIN))
    return sorted(names)


def renderer_identity(renderer: Any) -> str:
    """Every capability of ``renderer`` (see :func:`capability_names`) with its value, and its class."""
    caps = []
    for name in capability_names(renderer):
        value = getattr(renderer, name, None)
        if isinstance(value, (set, frozenset)):
            value = sorted(map(repr, value))
        elif isinstance(value, dict):
            value = sorted((repr(k), repr(v)) for k, v in value.items())
        caps.append(f"{name}={value!r}")
    return f"{type(renderer).__module__}.{type(renderer).__qualname__}(" + ", ".join(caps) + ")"


def knobs() -> str:
    """The environment knobs that change which optimizations a kernel gets."""
    from ember.codegen.heuristic import USE_TC

    return f"NOOPT={int(NOOPT.value)} BEAM={int(BEAM.value)} TC={int(USE_TC.value)}"


def lowering_key(renderer: Any, ast: UOp) -> str:
    """One string naming everything codegen reads for ``ast`` on ``renderer`` (see the module docstring)."""
    renderer_type: type = type(renderer)  # a class object: hashable, whatever its instances are
    return "\0".join([codegen_fingerprint(renderer_type), knobs(), renderer_identity(renderer), serialize_uop(ast)])
