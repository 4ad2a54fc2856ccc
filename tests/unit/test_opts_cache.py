"""The lowering cache key covers everything codegen reads, and BEAM search results are cached on disk.

- the key changes with each knob (NOOPT, BEAM) and with every renderer capability;
- NOOPT=1 with a warm lowering cache gives the unoptimized kernel (it used to return the tiled one);
- BEAM on a tiny kernel returns valid opts whose kernel matches numpy, and a second search reads the disk.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest

from ember import Device, Tensor, diskcache
from ember.codegen import get_program, search
from ember.codegen.cachekey import capability_names, lowering_key
from ember.codegen.opts import Opt, apply_opts
from ember.dtype import dtypes
from ember.engine.realize import CompiledRunner, program_for
from ember.helpers import BEAM, NOOPT
from ember.renderer import Renderer, TensorCore

RNG = np.random.default_rng(3)


@contextlib.contextmanager
def Context(**knobs: int):
    """Set codegen's knobs for a block. (``ember.helpers.Context`` replaces a knob whose value is 0 with a new
    one instead of setting it, so it cannot turn NOOPT or BEAM on: the knobs are set directly here.)"""
    table = {"NOOPT": NOOPT, "BEAM": BEAM}
    saved = {k: table[k].value for k in knobs}
    try:
        for k, v in knobs.items():
            table[k].value = v
        yield
    finally:
        for k, v in saved.items():
            table[k].value = v


def matmul_ast(device: str = "CPU", n: int = 16):
    a = Tensor(RNG.uniform(-1, 1, (n, n)).astype(np.float32), device=device).realize()
    b = Tensor(RNG.uniform(-1, 1, (n, n)).astype(np.float32), device=device).realize()
    return (a @ b).schedule()[-1], a.numpy() @ b.numpy()


def changed(value: object) -> object:
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, frozenset):
        return frozenset(list(value)[1:]) if value else frozenset({dtypes.float32})
    if isinstance(value, tuple):
        if value and isinstance(value[0], TensorCore):
            return value[1:]
        return value + (1,) if not value or isinstance(value[0], int) else value[1:]
    if isinstance(value, dict):
        return {**value, "extra": "x"}
    if value is None:
        return (1, 1, 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. a renderer's VectorSyntax
        first = dataclasses.fields(value)[0].name
        return dataclasses.replace(value, **{first: changed(getattr(value, first))})
    raise AssertionError(f"no other value for {value!r}")


def renderers() -> list[Renderer]:
    out: list[Renderer] = [Device["CPU"].renderer, Device["PYTHON"].renderer]
    try:
        from ember_opencl.renderer import CLRenderer

        out.append(CLRenderer(local_max=(64, 64, 64)))
    except ImportError:
        pass
    return out


def test_key_changes_with_each_knob():
    si, _ = matmul_ast()
    renderer = Device["CPU"].renderer
    keys = {lowering_key(renderer, si.ast)}
    for knobs in ({"NOOPT": 1}, {"BEAM": 1}, {"BEAM": 2}):
        with Context(**knobs):
            keys.add(lowering_key(renderer, si.ast))
    assert len(keys) == 4


@pytest.mark.parametrize("renderer", renderers(), ids=lambda r: type(r).__name__)
def test_key_changes_with_every_capability(renderer: Renderer):
    si, _ = matmul_ast()
    base = lowering_key(renderer, si.ast)
    names = capability_names(renderer)
    for must in ("has_local", "local_max", "global_max", "parallel_threads", "vector_floats", "tensor_cores",
                 "supported_dtypes", "device"):
        assert must in names
    for name in names:
        other = copy.copy(renderer)
        setattr(other, name, changed(getattr(renderer, name)))
        assert lowering_key(other, si.ast) != base, f"the lowering key ignores {type(renderer).__name__}.{name}"


def test_noopt_with_a_warm_cache_is_not_optimized():
    si, _ = matmul_ast(n=32)
    tiled = program_for("CPU", si.ast)
    assert tiled.opts, "the heuristic tiles a matmul"
    with Context(NOOPT=1):
        plain = program_for("CPU", si.ast)
    assert plain.opts == ()
    assert program_for("CPU", si.ast).opts == tiled.opts


def test_beam_finds_valid_opts_and_caches_them(monkeypatch: pytest.MonkeyPatch):
    si, ref = matmul_ast(n=16)
    renderer = Device["CPU"].renderer
    with Context(BEAM=2):
        opts = search.beam_search(si.ast, renderer, 2, budget_s=1.0)
        apply_opts(si.ast, renderer, opts)  # valid for this kernel
        spec = get_program(si.ast, renderer, opts=opts)
        for b in si.bufs:
            b.allocate()
        CompiledRunner("CPU", spec)(list(si.bufs), wait=True)
        got = np.frombuffer(si.bufs[0].as_bytes(), np.float32).reshape(ref.shape)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)

        def no_search(*args: object, **kwargs: object) -> None:
            raise AssertionError("BEAM searched again: the disk cache was not used")
        monkeypatch.setattr(search, "_search", no_search)
        assert search.beam_search(si.ast, renderer, 2, budget_s=1.0) == opts


def test_a_forged_beam_entry_runs_no_code_and_is_searched_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """BEAM's cached opt lists load through the disk cache's restricted unpickler: a forged entry naming any
    callable (even one of ember's own) is refused, deleted, and the search runs again."""
    si, _ = matmul_ast(n=16)
    renderer = Device["CPU"].renderer
    target = tmp_path / "written"

    class Forged:
        def __reduce__(self):
            return (diskcache.write, (target, b"forged"))

    path = diskcache.entry_path("beam", lowering_key(renderer, si.ast))
    assert path is not None
    diskcache.write(path, pickle.dumps(Forged()))
    searched: list[int] = []

    def fake_search(*args: object, **kwargs: object) -> list[Opt]:
        searched.append(1)
        return []
    monkeypatch.setattr(search, "_search", fake_search)
    assert search.beam_search(si.ast, renderer, 2, budget_s=1.0) == []
    assert searched and not target.exists()
    diskcache.invalidate(path)  # the empty list it cached is no entry for later tests

def test_beam_is_chosen_by_the_knob(monkeypatch: pytest.MonkeyPatch):
    si, _ = matmul_ast(n=8)
    seen = []
    monkeypatch.setattr(search, "beam_search", lambda ast, r, amt: seen.append(amt) or [])
    with Context(BEAM=3):
        assert get_program(si.ast, Device["CPU"].renderer).opts == ()
    assert seen == [3]


def test_beam_candidates_must_match_the_unoptimized_kernel():
    same = search._same
    assert same([np.array([1.0, np.nan])], [np.array([1.0, np.nan])])
    assert not same([np.array([1.0, 2.0])], [np.array([1.0, 2.5])])
