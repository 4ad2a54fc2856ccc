"""Index width: a kernel whose index math can pass 2**31 - 1 indexes with 64-bit integers, every other kernel with
32-bit ones. Only lowering here (no kernel runs): the run tests are tests/backend/test_huge_views.py.

The choice comes from :func:`ember.codegen.lowerer.index_reach`, a bound computed from the kernel AST. The
property test below checks it: wherever 32 bits were chosen, lowering with 32 gives the uops lowering with 64
gives (no constant wrapped on the way), and symbolic's bounds keep every index value in the int32 range.
"""
from __future__ import annotations

import random
from typing import Callable

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.codegen import get_program, lowerer
from ember.codegen.lowerer import INDEX32_MAX, index_reach
from ember.dtype import DType
from ember.ir.uop import GroupOp, Ops, UOp, _alu_bounds
from ember.renderer import Renderer

BIG = 2 ** 31 + 5


def _cpu() -> Renderer:
    return pytest.importorskip("ember_cpu.renderer").CPURenderer()


def _grid(**kwargs: object) -> Renderer:
    """A launch-grid target (3 global dimensions, merged when a kernel has more)."""
    return pytest.importorskip("ember_opencl.renderer").CLRenderer(**kwargs)


def last_ast(t: Tensor) -> UOp:
    return [si.ast for si in t.schedule() if si.ast.op is not Ops.COPY][-1]


def small(n: int = 7) -> Tensor:
    return Tensor(np.arange(n, dtype=np.float32), device="PYTHON").realize()


def index_dtypes(uops: tuple[UOp, ...]) -> set:
    return {u.dtype for u in uops if u.op is Ops.RANGE}


def address_overflow(uops: tuple[UOp, ...], within: DType = dtypes.int32) -> UOp | None:
    """The first uop of index math (over loops, constants and variables; not over loaded values) whose value
    may leave the range of ``within``, by symbolic's bounds; None if there is none. Run on uops lowered with
    64-bit indices (where no constant has wrapped), it says whether 32 bits would have been enough."""
    data: set[UOp] = set()  # values that depend on memory (a gather's index): their range is not the codegen's
    lo, hi = dtypes.min(within), dtypes.max(within)
    for u in uops:
        if u.op is Ops.LOAD or any(s in data for s in u.src):
            data.add(u)
            continue
        if u.dtype not in (dtypes.int32, dtypes.int64):
            continue
        if u.op is Ops.CONST:
            bounds = (u.arg, u.arg)
        elif u.op is Ops.RANGE:
            bounds = (u.src[0].vmin, u.src[1].vmax)
        elif u.op in GroupOp.ALU:
            bounds = _alu_bounds(u, (dtypes.min(u.dtype), dtypes.max(u.dtype)))
        else:
            continue
        if bounds[0] < lo or bounds[1] > hi:
            return u
    return None


def lowered_with(bits: int, ast: UOp, renderer: Renderer, monkeypatch: pytest.MonkeyPatch) -> tuple[UOp, ...]:
    """The uops of ``ast`` lowered with ``bits``-bit indices whatever its size."""
    with monkeypatch.context() as m:
        m.setattr(lowerer, "INDEX32_MAX", -1 if bits == 64 else 2 ** 200)
        uops = get_program(ast, renderer).uops
    assert index_dtypes(uops) <= {dtypes.int64 if bits == 64 else dtypes.int32}
    return uops


def fits_32_bits(ast: UOp, renderer: Callable[[], Renderer], monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether 32-bit indices compute what 64-bit ones do: the same uops but for the index type (no constant
    wrapped on the way, no simplification went another way), none of whose values leaves the int32 range."""
    wide, narrow = lowered_with(64, ast, renderer(), monkeypatch), lowered_with(32, ast, renderer(), monkeypatch)
    if address_overflow(wide) is not None or len(wide) != len(narrow):
        return False
    pos = {u: i for i, u in enumerate(wide)}
    npos = {u: i for i, u in enumerate(narrow)}
    for w, n in zip(wide, narrow):
        dt = dtypes.int32 if w.dtype == dtypes.int64 else w.dtype
        if (w.op, w.arg, dt, [pos[s] for s in w.src]) != (n.op, n.arg, n.dtype, [npos[s] for s in n.src]):
            return False
    return True


# --- which kernels get 64 bits -------------------------------------------------------------------------------
HUGE = {
    # (a max of one value broadcast would fold: the values alternate, so the loop stays)
    "reduce loop past 2**31": lambda: small(2).reshape(1, 2).expand(BIG // 2 + 1, 2).reshape(BIG + 1).max(),
    "output past 2**31": lambda: Tensor.ones(BIG, device="PYTHON").contiguous(),
    "two loops whose product passes 2**31": lambda: Tensor.ones(2 ** 16, 2 ** 16 + 1, device="PYTHON").contiguous(),
    "tail of a reshaped expand": lambda: small().reshape(1, 7).expand(BIG, 7).reshape(BIG * 7)[-3:].contiguous(),
    "flipped tail": lambda: small().reshape(1, 7).expand(BIG, 7).reshape(BIG * 7).flip(0)[:3].contiguous(),
    "sum of the tail": lambda: small().reshape(1, 7).expand(BIG, 7).reshape(BIG * 7)[-1000:].sum(),
    "tail of a padded expand": lambda: small(3).reshape(1, 3).expand(2 ** 30 + 1, 3).pad(((0, 0), (1, 0))).reshape(
        -1)[-6:].contiguous(),
}


@pytest.mark.parametrize("make", HUGE.values(), ids=HUGE.keys())
@pytest.mark.parametrize("renderer", [_cpu, _grid], ids=["loops", "grid"])
def test_kernels_past_2_31_index_with_64_bits(make, renderer, monkeypatch):
    ast = last_ast(make())
    assert index_reach(ast) > INDEX32_MAX
    r = renderer()
    prg = get_program(ast, r)
    assert index_dtypes(prg.uops) == {dtypes.int64}
    assert not any(u.dtype == dtypes.int32 for u in prg.uops if u.op in GroupOp.ALU | {Ops.CONST}
                   and u.op not in GroupOp.Comparison)
    assert address_overflow(prg.uops, dtypes.int64) is None
    if r.global_max is None:  # (a grid target may split the loops into pieces that would each fit 32 bits)
        assert not fits_32_bits(ast, renderer, monkeypatch), "32 bits would have done"


SMALL = {
    "elementwise": lambda: (small(1000) * 2 + 1).contiguous(),
    "reduce": lambda: small(1000).reshape(10, 100).sum(1),
    "expand just below the limit": lambda: small(2).reshape(1, 2).expand(INDEX32_MAX // 2, 2).reshape(
        INDEX32_MAX // 2 * 2).max(),
    "tail of a reshaped expand below the limit": lambda: small().reshape(1, 7).expand(2 ** 28, 7).reshape(
        7 * 2 ** 28)[-3:].contiguous(),
    "matmul": lambda: small(64).reshape(8, 8) @ small(64).reshape(8, 8),
}


@pytest.mark.parametrize("make", SMALL.values(), ids=SMALL.keys())
@pytest.mark.parametrize("renderer", [_cpu, _grid], ids=["loops", "grid"])
def test_other_kernels_index_with_32_bits(make, renderer, monkeypatch):
    ast = last_ast(make())
    prg = get_program(ast, renderer())
    assert index_dtypes(prg.uops) == {dtypes.int32}
    assert fits_32_bits(ast, renderer, monkeypatch)


def test_cpu_source_names_the_64_bit_type_only_where_needed():
    src = get_program(last_ast(HUGE["reduce loop past 2**31"]()), _cpu()).src
    assert "for (long long ridx0 = 0ll;" in src and f"< {(BIG + 1) // 2}ll;" in src, src
    src = get_program(last_ast(SMALL["reduce"]()), _cpu()).src
    assert "long long gidx" not in src and "long long ridx" not in src and "for (int ridx" in src


def test_overflow_check_sees_a_wrapping_index():
    """The property test's checker can fail: a loop to 2**31 + 5 and a product past the int32 range."""
    r = UOp(Ops.RANGE, dtypes.int64, (UOp.const(dtypes.int64, 0), UOp.const(dtypes.int64, BIG)), (0, "reduce"))
    assert address_overflow((r,)) is r and address_overflow((r,), dtypes.int64) is None
    r = UOp(Ops.RANGE, dtypes.int64, (UOp.const(dtypes.int64, 0), UOp.const(dtypes.int64, 2 ** 20)), (0, "reduce"))
    mul = r * 2 ** 12
    assert address_overflow((r, mul.src[1], mul)) is mul


# --- the bound is sound: 32 bits are chosen only where nothing can wrap ---------------------------------------
def _random_view(rng: random.Random) -> Tensor:
    """A small buffer seen through movement ops as a view of 2**27 to 2**33 elements (nothing is allocated),
    of which a kernel reads a few."""
    n = rng.choice([3, 7, 16])
    rows = rng.choice([2 ** 27, 3 * 10 ** 8, 2 ** 31 // n - 1, 2 ** 31 // n + 1, 10 ** 9])
    t = small(n).reshape(1, n).expand(rows, n)
    for op in rng.sample(["permute", "flip", "pad", "shrink", "half"], k=rng.randint(1, 3)):
        if op == "permute":
            t = t.permute(1, 0)
        elif op == "flip":
            t = t.flip(rng.choice([0, 1]))
        elif op == "pad":
            t = t.pad(tuple((rng.randint(0, 3), rng.randint(0, 3)) for _ in t.shape))
        elif op == "shrink":
            t = t.shrink(tuple((rng.randint(0, 2), d) for d in t.shape))
        elif op == "half":
            t = t.shrink(tuple((0, (d + 1) // 2) for d in t.shape))
    if rng.random() < 0.7:  # flattened: a second view unless the dims merge
        t = t.reshape(-1)
    # the last few elements along every axis
    t = t.shrink(tuple((d - min(d, rng.choice([3, 50])), d) for d in t.shape))
    return t.sum() if rng.random() < 0.3 else (t + 1).contiguous()


@pytest.mark.parametrize("seed", range(3))
def test_32_bits_are_chosen_only_where_no_index_wraps(seed, monkeypatch):
    """Wherever 32 bits are chosen, they compute what 64 would."""
    rng = random.Random(seed)
    chosen = []
    for _ in range(12):
        kernels = [si.ast for si in _random_view(rng).schedule() if si.ast.op is not Ops.COPY]
        if not kernels:  # (the few elements read were all padding: a constant, no kernel)
            continue
        ast = kernels[-1]
        for renderer in (_cpu, _grid):
            uops = get_program(ast, renderer()).uops
            dts = index_dtypes(uops)
            chosen.append(dts)
            if dtypes.int64 not in dts:
                assert fits_32_bits(ast, renderer, monkeypatch), f"32-bit index math would wrap in\n{ast}"
    assert {dtypes.int64} in chosen and {dtypes.int32} in chosen


def test_bound_counts_padded_loops():
    """A PADTO'd output loop runs past the output's size: the bound counts the padded size."""
    from ember.codegen.opts import Opt, apply_opts

    ast = last_ast(Tensor.ones(2 ** 30 + 1, device="PYTHON").contiguous())
    assert index_reach(ast) <= INDEX32_MAX
    plan = apply_opts(ast, _cpu(), [Opt("PADTO", 0, 2 ** 30)])
    assert index_reach(ast, plan) > INDEX32_MAX


def test_a_launch_past_the_targets_limit_is_refused():
    """A grid target's hardware ids hold its launch limit: a longer launch dimension is an error, not a wrap."""
    ast = last_ast(Tensor.ones(2 ** 20 + 1, device="PYTHON").contiguous())
    with pytest.raises(ValueError, match=r"kernel E_1048577: launch size \(1048577, 1, 1\) is more than CLRenderer "
                                         r"launches per dimension \(\(1048576, 1048576, 1048576\)\)"):
        get_program(ast, _grid(global_max=(2 ** 20,) * 3), opts=[])
    assert get_program(ast, _grid(global_max=(2 ** 20 + 1,) * 3), opts=[]).global_size == (2 ** 20 + 1, 1, 1)
