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
from collections.abc import Iterable

from ember.helpers import getenv
from ember.ir.uop import UOp, serialize_uop

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
    with open(folder / f"{os.getpid()}.pkl", "ab") as f:
        pickle.dump(ast, f)


def load_corpus(folder: str | os.PathLike[str]) -> list[UOp]:
    """Every distinct AST recorded under ``folder``, in a stable order (sorted by their text form)."""
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
                ast = pickle.load(f)
            except EOFError:
                return
            except pickle.UnpicklingError as e:
                if "truncated" in str(e):
                    return  # a torn last record (the writer was killed): keep what came before
                raise ValueError(f"kernel corpus file {path}: a record cannot be read ({e})") from e
            except (AttributeError, ValueError, TypeError, ImportError) as e:
                # a record this ember cannot rebuild (written by another version): never skip it silently, or a
                # compile-only check would pass on an empty corpus
                raise ValueError(f"kernel corpus file {path} was written by an incompatible ember version "
                                 f"({type(e).__name__}: {e}); record the corpus again") from e
            if isinstance(ast, UOp):
                yield ast
