"""The renderer contract has one definition: ``ember.renderer.Renderer`` declares every field core reads, the
Protocol in ``ember.device.contracts`` lists the same fields with the same types, and core reads no other
attribute of a renderer."""
from __future__ import annotations

import ast
import inspect
import pathlib

import ember
from ember.device import contracts
from ember.renderer import Renderer

CORE = pathlib.Path(ember.__file__).parent
#: names core gives a renderer (or a device's renderer reached as ``x.renderer``)
RENDERER_NAMES = {"renderer", "policy"}


def declared_fields() -> dict[str, str]:
    """The public non-method fields of ``ember.renderer.Renderer`` -> their annotation ("" where none)."""
    out: dict[str, str] = {}
    for name, value in vars(Renderer).items():
        if not name.startswith("_") and not callable(value) and not isinstance(value, (property, staticmethod,
                                                                                        classmethod)):
            out[name] = str(Renderer.__annotations__.get(name, ""))
    for name, ann in Renderer.__annotations__.items():
        if not name.startswith("_"):
            out.setdefault(name, str(ann))
    return out


def protocol_members() -> tuple[dict[str, str], set[str]]:
    """The Protocol's properties -> their return annotation, and its methods."""
    props: dict[str, str] = {}
    methods: set[str] = set()
    for name, value in vars(contracts.Renderer).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            assert value.fget is not None
            props[name] = str(value.fget.__annotations__["return"])
        elif inspect.isfunction(value):
            methods.add(name)
    return props, methods


def test_the_protocol_lists_exactly_the_declared_fields_with_their_types():
    fields = declared_fields()
    props, methods = protocol_members()
    assert set(props) == set(fields), (f"only in the Renderer class: {sorted(set(fields) - set(props))}; only in "
                                       f"the Protocol: {sorted(set(props) - set(fields))}")
    for name, ann in fields.items():
        if ann:  # a descriptor (supported_dtypes) has no annotation on the class
            assert props[name] == ann, f"{name}: the Renderer class says {ann}, the Protocol {props[name]}"
    assert methods == {"render", "tensor_core_layout"}
    assert all(callable(getattr(Renderer, m)) for m in methods)


def test_the_protocol_check_fails_when_a_field_is_only_in_the_class(monkeypatch):
    """The check above can fail: a field declared on the class alone is reported."""
    monkeypatch.setattr(Renderer, "made_up_tile_size", 3, raising=False)
    props, _ = protocol_members()
    assert "made_up_tile_size" in declared_fields() and "made_up_tile_size" not in props


def _renderer_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, attribute) of every attribute core reads from a renderer in ``tree``, and of every ``getattr`` on one
    with a literal name."""
    def is_renderer(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in RENDERER_NAMES) or \
            (isinstance(node, ast.Attribute) and node.attr == "renderer")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_renderer(node.value):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and is_renderer(node.args[0]) and isinstance(node.args[1], ast.Constant):
            out.append((node.lineno, f"{node.func.id}:{node.args[1].value}"))
    return out


def test_core_reads_only_declared_renderer_attributes():
    allowed = set(declared_fields()) | {n for n, v in vars(Renderer).items() if callable(v)} | {"__name__"}
    bad = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE)
        if rel.parts[0] in ("renderer", "testing"):  # the class itself; conformance tests poke at what they test
            continue
        for line, attr in _renderer_reads(ast.parse(path.read_text(), str(path))):
            if attr.startswith(("getattr:", "hasattr:")) or attr not in allowed:
                bad.append(f"{rel}:{line}: {attr}")
    assert not bad, "core reads renderer attributes the Renderer class does not declare:\n" + "\n".join(bad)


def test_the_scan_finds_an_undeclared_read():
    """The scan above can fail: a ``getattr`` on a renderer and an undeclared attribute are both found."""
    src = "def f(renderer):\n    return getattr(renderer, 'vector_max_tiles', False) or renderer.made_up\n"
    assert sorted(a for _, a in _renderer_reads(ast.parse(src))) == ["getattr:vector_max_tiles", "made_up"]
