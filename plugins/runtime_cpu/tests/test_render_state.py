"""A renderer keeps no state from one kernel to the next: every source is the one a fresh renderer writes.

A device's renderer is shared by every kernel of the process (and every thread). What a render records while
it walks a kernel (names, open loops, register tiles, the loads of a tile's loop) belongs to that kernel; kept
on the renderer it names nodes of a kernel long gone, and hash-consed nodes die with their kernel while an equal
one made later is another object. These tests render a few hundred mixed kernels (matmul tiles with their
epilogues, column max tiles, reductions, elementwise) through one renderer in varied orders, after the kernels'
nodes died and were made again, and from several threads at once.
"""
from __future__ import annotations

import gc
import pickle
import random
import re
import threading

import numpy as np
import pytest

from ember import Tensor
from ember.codegen import get_program
from ember.ir.uop import UOp
from ember_cpu.renderer import CPURenderer

pytestmark = pytest.mark.usefixtures("private_cache_dir")


def _asts() -> list[UOp]:
    """Distinct kernel ASTs of a variety of ops: matmuls forward and backward (vector tiles, rolled epilogues),
    column and row reductions (max tiles, simd reductions), softmax, transposes, elementwise chains."""
    rng = np.random.default_rng(5)
    out: dict[UOp, None] = {}

    def take(*ts: Tensor) -> None:
        for t in ts:
            for si in t.schedule():
                if getattr(si, "ast", None) is not None:
                    out.setdefault(si.ast)

    def rand(*shape: int, grad: bool = False) -> Tensor:
        return Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad).realize()

    for n, k, m in [(8, 8, 8), (16, 32, 8), (32, 16, 64), (64, 64, 64), (48, 24, 40), (128, 64, 32), (17, 33, 9)]:
        a, b, bias = rand(n, k, grad=True), rand(k, m, grad=True), rand(m, grad=True)
        y = (a @ b + bias).relu()
        loss = (y * y).mean()
        loss.backward()
        assert a.grad is not None and b.grad is not None and bias.grad is not None
        take(a @ b, y, loss, a.grad, b.grad, bias.grad, (a.T @ a), (b @ b.T).exp(), (a @ b).max(1))
    for r, c in [(16, 64), (64, 16), (33, 128), (256, 32), (5, 7), (128, 128), (12, 40), (96, 24), (3, 200)]:
        x = rand(r, c)
        take(x.max(0), x.max(1), x.sum(0), x.sum(1), x.softmax(-1), x.softmax(0), x.T.contiguous(),
             (x.exp() + 1).log(), x.relu() * 2 - x, (x > 0).where(x, x * 0.1), x.cumsum(1) if c <= 64 else x.abs(),
             x.reshape(c, r).sum(0), x.float().cast("float64").sum(0), x.cast("float16") * 3, x.argmax(1))
    return list(out)


@pytest.fixture(scope="module")
def kernels() -> list[tuple[str, list[UOp], str]]:
    """(name, linear program, the source a fresh renderer writes) of each kernel."""
    found = []
    for ast in _asts():
        spec = get_program(ast, CPURenderer())
        found.append((spec.name, list(spec.uops), spec.src))
    assert len(found) >= 200, f"only {len(found)} distinct kernels"
    return found


def test_one_renderer_in_any_order_writes_what_a_fresh_one_does(kernels: list[tuple[str, list[UOp], str]]):
    shared = CPURenderer()
    before = dict(vars(shared))
    assert any(re.search(r"ember_float\d+ acc\d+ = ", src) for _, _, src in kernels), "no vector tile among the kernels"
    assert any("m_ = (a_ > b_)" in src for _, _, src in kernels), "no vector max among the kernels"
    for seed in range(2):
        order = list(range(len(kernels)))
        random.Random(seed).shuffle(order)
        for i in order:
            name, uops, src = kernels[i]
            assert shared.render(name, uops) == src, f"kernel {name} rendered after others differs (order {seed})"
    assert vars(shared) == before, "rendering wrote state onto the shared renderer"


def test_kernels_made_again_after_their_nodes_died(kernels: list[tuple[str, list[UOp], str]]):
    """The kernels' nodes die and equal ones are made again (other objects): the same renderer still writes each
    source as a fresh renderer does."""
    shared = CPURenderer()
    blobs = []
    for name, uops, src in kernels[::3]:
        shared.render(name, uops)
        blobs.append((name, pickle.dumps(uops), src))
    for seed in range(2):
        random.Random(seed).shuffle(blobs)
        for name, blob, src in blobs:
            uops = pickle.loads(blob)
            assert shared.render(name, uops) == src, f"kernel {name} made again renders differently"
            del uops
            gc.collect(0)


def test_threads_share_one_renderer(kernels: list[tuple[str, list[UOp], str]]):
    shared = CPURenderer()
    wrong: list[str] = []

    def work(seed: int) -> None:
        order = list(range(len(kernels)))
        random.Random(seed).shuffle(order)
        for i in order[:40]:
            name, uops, src = kernels[i]
            try:
                if shared.render(name, uops) != src:
                    wrong.append(name)
            except Exception as e:  # noqa: BLE001  (any failure of one thread is reported by the test)
                wrong.append(f"{name}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} renders went wrong with 4 threads sharing a renderer: {wrong[:3]}"
