"""A corpus of kernel ASTs: every kernel a program (or a test suite) asks ember to lower.

Set ``KERNEL_CORPUS=<folder>`` and each kernel AST the engine lowers is appended, once per
process, to ``<folder>/<pid>.pkl``. :func:`load_corpus` reads a folder back as a de-duplicated
list of ASTs. Device plugins for hardware the test machine lacks (CUDA, Metal, AMD) use it to
render and compile every kernel a real workload produces, so a renderer bug fails without the
hardware: run the backend suite once with the knob set, then compile the corpus for the target.

The ASTs are device independent (codegen and its opts run after this point), so one corpus
serves every renderer.
"""
from __future__ import annotations

import os
import pathlib
import pickle
import sys
from collections.abc import Iterable
from typing import Any

from ember.dtype import DType, PtrDType, dtypes
from ember.helpers import getenv
from ember.ir.shapetracker import ShapeTracker, View
from ember.ir.uop import Ops, UOp, serialize_uop

_seen: set[UOp] = set()


def corpus_dir() -> pathlib.Path | None:
    """The folder named by ``KERNEL_CORPUS``, or None when capture is off."""
    folder = getenv("KERNEL_CORPUS", "")
    return pathlib.Path(folder) if folder else None


def record(ast: UOp) -> None:
    """Append ``ast`` to this process's corpus file (a no-op unless ``KERNEL_CORPUS`` is set)."""
    folder = corpus_dir()
    if folder is None or ast in _seen:
        return
    _seen.add(ast)
    folder.mkdir(parents=True, exist_ok=True)
    # one pickle per record, appended: a process killed mid-run leaves every earlier record readable
    # pickling nests a frame per level of the AST; a kernel's depth is bounded (the scheduler's fusion rule 8),
    # so a program that runs with a low recursion limit (or deep in its own recursion) gets the room it needs
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        with open(folder / f"{os.getpid()}.pkl", "ab") as f:
            pickle.dump(ast, f)
    finally:
        sys.setrecursionlimit(limit)


def load_corpus(folder: str | os.PathLike[str]) -> list[UOp]:
    """Every distinct AST recorded under ``folder``, in a stable order (sorted by their text form).

    The files are read without running any code they name: only the classes a kernel AST is made of are
    accepted, each record is checked and rebuilt through the ordinary constructors, and a file naming anything
    else raises ValueError naming the file.
    """
    root = pathlib.Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"kernel corpus folder {root} does not exist (record one with KERNEL_CORPUS={root})")
    found: dict[str, UOp] = {}
    for path in sorted(root.glob("*.pkl")):
        for ast in _read_records(path):
            found.setdefault(serialize_uop(ast), ast)
    return [found[k] for k in sorted(found)]


def _read_records(path: pathlib.Path) -> Iterable[UOp]:
    with open(path, "rb") as f:
        while True:
            try:
                raw = _CorpusUnpickler(f, path).load()
            except EOFError:
                return
            except _Refused:
                raise
            except pickle.UnpicklingError as e:
                if "truncated" in str(e):
                    return  # a torn last record (the writer was killed): keep what came before
                raise ValueError(f"kernel corpus file {path}: a record cannot be read ({e})") from e
            except (AttributeError, ValueError, TypeError, ImportError, IndexError, KeyError, MemoryError,
                    RecursionError) as e:
                raise ValueError(f"kernel corpus file {path}: a record cannot be read ({type(e).__name__}: {e}); "
                                 "record the corpus again") from e
            if isinstance(raw, _Raw) and raw.kind == "UOp":
                try:
                    node = _Rebuild(path).uop(raw)
                except RecursionError:
                    raise _Refused(f"kernel corpus file {path}: malformed record: its args nest too deeply") from None
                yield node


# --- reading records without running a pickle's code -------------------------------------------------------
# A corpus file is a pickle, and a plain unpickler would run whatever callable a planted file names. The corpus
# unpickler maps the few globals a recorded AST names to inert stand-ins (``_Raw``: the arguments and the state a
# pickle gives them, nothing else), so loading builds no ember object at all and no pickle opcode can reach a
# live one (BUILD would otherwise let a file rewrite, say, an ``Ops`` member in place). The stand-ins are then
# checked and turned into UOps, dtypes and shape trackers through their ordinary constructors.

#: the globals a recorded AST names, by (module, name) -> the kind of stand-in
_CORPUS_GLOBALS = {("ember.ir.uop", "UOp"): "UOp", ("ember.ir.uop", "Ops"): "Ops", ("ember.dtype", "DType"): "DType",
                   ("ember.dtype", "PtrDType"): "PtrDType", ("ember.ir.shapetracker", "ShapeTracker"): "ShapeTracker",
                   ("ember.ir.shapetracker", "View"): "View"}
#: nesting allowed in a node's arg (tuples, views, the symbolic sizes inside them): real ASTs stay under ten
_MAX_ARG_DEPTH = 64


class _Refused(ValueError):
    """A corpus record that is refused (its message names the file and why)."""


class _Raw:
    """An object of a corpus pickle before it is checked: the arguments it was called with (REDUCE) or the
    state it was given (NEWOBJ + BUILD land in ``__dict__``)."""

    kind = ""
    args: tuple | None = None

    def __init__(self, *args: object) -> None:
        self.args = args


_STAND_INS = {kind: type(f"_Raw{kind}", (_Raw,), {"kind": kind}) for kind in set(_CORPUS_GLOBALS.values())}


class _CorpusUnpickler(pickle.Unpickler):
    def __init__(self, f: Any, path: pathlib.Path) -> None:
        super().__init__(f)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        kind = _CORPUS_GLOBALS.get((module, name))
        if kind is None:
            # a class this ember does not have is the usual reason (a file of another version): say so, and
            # never import or call it
            raise _Refused(f"kernel corpus file {self._path}: a record names {module}.{name}, which a kernel "
                             "AST never holds: refusing to load it (a file of an incompatible ember version, or "
                             "not a kernel corpus)")
        return _STAND_INS[kind]

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(f"kernel corpus file {self._path}: unexpected persistent id {pid!r}")


_KNOWN_DTYPES: dict[tuple, DType] = {}


def _known_dtypes() -> dict[tuple, DType]:
    if not _KNOWN_DTYPES:
        for d in vars(dtypes).values():
            if isinstance(d, DType):
                _KNOWN_DTYPES[(d.name, d.itemsize, d.kind, d.fmt)] = d
    return _KNOWN_DTYPES


class _Rebuild:
    """Checks the stand-ins of one record and builds the real objects (each node once: the DAG is shared)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.done: dict[int, Any] = {}

    def bad(self, what: str) -> ValueError:
        """The error for a record that is not a well-formed AST."""
        return _Refused(f"kernel corpus file {self.path}: malformed record: {what}")

    def fields(self, raw: _Raw, names: tuple[str, ...]) -> tuple:
        """The constructor arguments of ``raw``: its call arguments, or the named entries of its state."""
        if raw.args is not None:
            if len(raw.args) != len(names):
                raise self.bad(f"{raw.kind} takes {len(names)} arguments, got {len(raw.args)}")
            return raw.args
        state = raw.__dict__
        if isinstance(state.get("args"), tuple):  # a state named "args" is not a call
            raise self.bad(f"{raw.kind} state")
        if not all(n in state for n in names):
            raise self.bad(f"{raw.kind} lacks {[n for n in names if n not in state]}")
        return tuple(state[n] for n in names)

    def uop(self, root: _Raw) -> UOp:
        """The UOp DAG under ``root``, built bottom-up without recursion (ASTs can be thousands deep)."""
        if id(root) in self.done:
            return self.done[id(root)]
        stack: list[tuple[_Raw, bool]] = [(root, False)]
        visiting: set[int] = set()
        while stack:
            raw, ready = stack.pop()
            if id(raw) in self.done:
                continue
            op, dtype, src, arg = self.fields(raw, ("op", "dtype", "src", "arg"))
            if not isinstance(src, tuple) or not all(isinstance(s, _Raw) and s.kind == "UOp" for s in src):
                raise self.bad(f"the sources of a node must be a tuple of UOps, got {type(src).__name__}")
            if not ready:
                if id(raw) in visiting:  # met again below itself, before it was built
                    raise self.bad("a node is its own source (a cycle)")
                visiting.add(id(raw))
                stack.append((raw, True))
                stack.extend((s, False) for s in src if id(s) not in self.done)
                continue
            node = UOp(self.ops(op), self.dtype(dtype, allow_none=True), tuple(self.done[id(s)] for s in src),
                       self.arg(arg, 0))
            self.done[id(raw)] = node
        return self.done[id(root)]

    def ops(self, x: Any) -> Ops:
        if not (isinstance(x, _Raw) and x.kind == "Ops" and x.args is not None and len(x.args) == 1):
            raise self.bad(f"expected an Ops member, got {type(x).__name__}")
        try:
            return Ops(x.args[0])
        except ValueError:
            raise self.bad(f"{x.args[0]!r} is no Ops member of this ember version") from None

    def dtype(self, x: Any, allow_none: bool = False) -> DType | PtrDType | None:
        if x is None and allow_none:
            return None
        if isinstance(x, _Raw) and x.kind == "PtrDType":
            base = self.dtype(self.fields(x, ("base",))[0])
            if not isinstance(base, DType):
                raise self.bad("a pointer to a pointer")
            return base.ptr()
        if isinstance(x, _Raw) and x.kind == "DType":
            key = self.fields(x, ("name", "itemsize", "kind", "fmt"))
            if all(isinstance(k, (str, int, type(None))) for k in key) and key in _known_dtypes():
                return _known_dtypes()[key]
            raise self.bad(f"unknown dtype {key!r}")
        raise self.bad(f"expected a dtype, got {type(x).__name__}")

    def arg(self, x: Any, depth: int) -> Any:
        if depth > _MAX_ARG_DEPTH:
            raise self.bad(f"an arg nests more than {_MAX_ARG_DEPTH} deep")
        if x is None or type(x) in (bool, int, float, str):
            return x
        if type(x) is tuple:
            return tuple(self.arg(v, depth + 1) for v in x)
        if not isinstance(x, _Raw):
            raise self.bad(f"an arg of type {type(x).__name__}")
        if x.kind == "UOp":  # a symbolic size inside a view, or a node in an arg
            return self.uop(x)
        if x.kind == "Ops":
            return self.ops(x)
        if x.kind in ("DType", "PtrDType"):
            return self.dtype(x)
        if x.kind == "ShapeTracker":
            (views,) = self.fields(x, ("views",))
            if type(views) is not tuple or not views:
                raise self.bad("a ShapeTracker without views")
            return ShapeTracker(tuple(self.view(v, depth + 1) for v in views))
        raise self.bad(f"a {x.kind} where a view belongs")

    def view(self, x: Any, depth: int) -> View:
        if not (isinstance(x, _Raw) and x.kind == "View"):
            raise self.bad(f"expected a View, got {type(x).__name__}")
        shape, strides, offset, mask, contiguous = self.fields(x, ("shape", "strides", "offset", "mask",
                                                                   "contiguous"))

        def sints(t: Any, n: int | None = None) -> tuple:
            if type(t) is not tuple or (n is not None and len(t) != n):
                raise self.bad(f"view field {t!r}")
            out = tuple(self.arg(v, depth + 1) for v in t)
            if not all(type(v) is int or isinstance(v, UOp) for v in out):
                raise self.bad(f"view sizes must be integers or symbolic, got {out!r}")
            return out

        shape = sints(shape)
        strides = sints(strides, len(shape))
        (offset,) = sints((offset,))
        if mask is not None:
            if type(mask) is not tuple or len(mask) != len(shape):
                raise self.bad(f"view mask {mask!r}")
            mask = tuple(sints(m, 2) for m in mask)
        if type(contiguous) is not bool:
            raise self.bad(f"view contiguous flag {contiguous!r}")
        return View(shape, strides, offset, mask, contiguous)
