"""The TC opt: a matmul on tensor-core instructions, interpreted lane by lane by the PYTHON oracle.

A toy tensor core (4x4x4 tiles, 16 lanes, a layout unlike any hardware's) declared by a test renderer shows
that core reads shapes and layouts only from the renderer; the CUDA and Metal plugins test their own.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_opts import last_kernel, randf, run_opts

from ember import Device, Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.heuristic import heuristic_opts
from ember.codegen.opts import Opt, OptError, apply_opts
from ember.helpers import Context
from ember.ir.uop import Ops
from ember.renderer import Renderer, TensorCore

TOY = TensorCore((4, 4, 4), dtypes.float16, dtypes.float32, threads=16, elements_per_thread=(1, 1, 1),
                 intrinsic="toy_mma")
TOY32 = TensorCore((4, 2, 2), dtypes.float32, dtypes.float32, threads=4, elements_per_thread=(2, 1, 2),
                   intrinsic="toy_mma32")


class ToyTensorCores(Renderer):
    """The PYTHON renderer with work-groups and two toy tensor cores. Lane l holds A[l % 4][l // 4] (transposed,
    on purpose), B[l // 4][l % 4] and D[l // 4][l % 4] of TOY; TOY32's lanes hold two elements of A and D."""

    def __init__(self) -> None:
        self.base = Device["PYTHON"].renderer
        self.has_local, self.has_shared, self.shared_max = True, True, 1 << 16
        self.local_max, self.global_max = (64, 64, 64), (1 << 20,) * 3
        self.tensor_cores = (TOY, TOY32)

    def tensor_core_layout(self, tc, operand, lane, element):  # noqa: ANN001, ANN201
        if tc is TOY32:  # A 4x2, B 2x2, D 4x2: lane l holds row l of A and D, and B[l // 2][l % 2]
            return (lane // 2, lane % 2) if operand == "B" else (lane, element)
        return (lane % 4, lane // 4) if operand == "A" else (lane // 4, lane % 4)

    def render(self, name, uops):  # noqa: ANN001, ANN201
        return self.base.render(name, uops)


def half(*shape: int) -> tuple[np.ndarray, Tensor]:
    x = randf(*shape).astype(np.float16)
    return x, Tensor(x.astype(np.float32), device="PYTHON").cast(dtypes.float16).realize()


LAYOUTS = ["a@b", "a@b.T", "a.T@b", "a.T@b.T", "batched"]


def layout_case(layout: str):
    """The float16 matmul kernel of ``layout`` (its inputs computed) and numpy's result in float32."""
    (a, ta), (b, tb) = half(8, 12), half(12, 16)
    at, bt = Tensor(np.ascontiguousarray(a.T).astype(np.float32), device="PYTHON").cast(dtypes.float16).realize(), \
        Tensor(np.ascontiguousarray(b.T).astype(np.float32), device="PYTHON").cast(dtypes.float16).realize()
    ref = a.astype(np.float32) @ b.astype(np.float32)
    out = {"a@b": ta @ tb, "a@b.T": ta @ bt.T, "a.T@b": at.T @ tb, "a.T@b.T": at.T @ bt.T}.get(layout)
    if layout == "batched":
        (a3, ta3), (b3, tb3) = half(2, 8, 12), half(2, 12, 16)
        out, ref = ta3 @ tb3, a3.astype(np.float32) @ b3.astype(np.float32)
    return last_kernel(out), ref


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tc_matmul_matches_numpy(layout: str):
    si, ref = layout_case(layout)
    renderer = ToyTensorCores()
    k = len(ref.shape)  # the reduce axis comes after the output axes
    spec = get_program(si.ast, renderer, opts=[Opt("TC", k, 0)])
    assert sum(u.op is Ops.WMMA for u in spec.uops) == 1 and spec.local_size == (16, 1, 1)
    got = run_opts(si, "PYTHON", [Opt("TC", k, 0)], renderer)
    np.testing.assert_allclose(got.reshape(ref.shape), ref.astype(np.float16), rtol=2e-3, atol=2e-3)


def test_tc_with_several_elements_per_lane():
    x, y = randf(8, 6), randf(6, 4)
    tx, ty = Tensor(x, device="PYTHON").realize(), Tensor(y, device="PYTHON").realize()
    si = last_kernel(tx @ ty)
    renderer = ToyTensorCores()
    spec = get_program(si.ast, renderer, opts=[Opt("TC", 2, 1)])
    assert sum(u.op is Ops.WMMA for u in spec.uops) == 2  # two elements of D per lane, one instruction
    assert len({u.src for u in spec.uops if u.op is Ops.WMMA}) == 1
    np.testing.assert_allclose(run_opts(si, "PYTHON", [Opt("TC", 2, 1)], renderer).reshape(8, 4), x @ y,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make,opts,why", [
    (lambda a, b: (a @ b).sum(0), [Opt("TC", 0, 0)], "the kernel is not one sum over one axis"),
    (lambda a, b: a.cast(dtypes.float32).sum(1), [Opt("TC", 1, 0)], "not a product"),
    (lambda a, b: a @ b, [Opt("TC", 1, 0)], "TC names the reduce axis of the matmul"),
    (lambda a, b: a @ b, [Opt("TC", 2, 5)], "the renderer has 2 tensor cores"),
    (lambda a, b: a @ b, [Opt("TC", 2, 1)], "factors are not dtypes.float values"),  # TOY32 takes float32
    (lambda a, b: a @ b, [Opt("TC", 2, 0), Opt("UPCAST", 0, 2)], "TC is applied alone"),
    (lambda a, b: a[:6] @ b, [Opt("TC", 2, 0)], r"M \(axis 0, 6\) is not a multiple of 4"),
])
def test_invalid_tc_raises(make, opts: list[Opt], why: str):
    _, ta = half(8, 12)
    _, tb = half(12, 16)
    si = last_kernel(make(ta, tb))
    with pytest.raises(OptError, match=why):
        apply_opts(si.ast, ToyTensorCores(), opts)


def test_no_tensor_cores_no_tc():
    _, ta = half(8, 12)
    _, tb = half(12, 16)
    si = last_kernel(ta @ tb)
    with pytest.raises(OptError, match="TC on axis 2 .*has no tensor cores"):
        apply_opts(si.ast, Device["PYTHON"].renderer, [Opt("TC", 2, 0)])


def test_beam_offers_tc_where_declared():
    from ember.codegen.search import actions

    _, ta = half(8, 12)
    _, tb = half(12, 16)
    ast = last_kernel(ta @ tb).ast
    assert {o for o in actions(ast, ToyTensorCores()) if o.op == "TC"} == {Opt("TC", 2, 0), Opt("TC", 2, 1)}
    assert not any(o.op == "TC" for o in actions(ast, Device["PYTHON"].renderer))


def test_tc_flops_are_estimated():
    _, ta = half(8, 12)
    _, tb = half(12, 16)
    si = last_kernel(ta @ tb)
    plain = get_program(si.ast, ToyTensorCores(), opts=[])
    tc = get_program(si.ast, ToyTensorCores(), opts=[Opt("TC", 2, 0)])
    assert tc.estimated_ops >= 2 * 8 * 12 * 16 and plain.estimated_ops >= 2 * 8 * 12 * 16


# --- the heuristic's choice ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_heuristic_chooses_tc_and_matches_numpy(layout: str):
    si, ref = layout_case(layout)
    renderer = ToyTensorCores()
    opts = heuristic_opts(si.ast, renderer)
    assert opts == [Opt("TC", len(ref.shape), 0)]  # TOY: float16 in, float32 sums
    got = run_opts(si, "PYTHON", opts, renderer)
    np.testing.assert_allclose(got.reshape(ref.shape), ref.astype(np.float16), rtol=2e-3, atol=2e-3)


def test_heuristic_picks_the_tensor_core_of_the_matmuls_dtypes():
    x, y = randf(8, 6), randf(6, 4)
    si = last_kernel(Tensor(x, device="PYTHON").realize() @ Tensor(y, device="PYTHON").realize())
    renderer = ToyTensorCores()
    opts = heuristic_opts(si.ast, renderer)
    assert opts == [Opt("TC", 2, 1)]  # float32 inputs: TOY32, not TOY
    np.testing.assert_allclose(run_opts(si, "PYTHON", opts, renderer).reshape(8, 4), x @ y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda a, b: a[:6] @ b,                          # M = 6: not a multiple of the 4x4x4 tile (no padding)
    lambda a, b: a @ b[:, :6],                       # N = 6
    lambda a, b: a.cast(dtypes.float32).sum(1),      # a sum, not a matmul
    lambda a, b: (a @ b).relu().sum(0),              # two kernels; the last one sums over M
], ids=["M", "N", "sum", "after"])
def test_heuristic_leaves_tc_out_where_it_does_not_fit(make):
    (_, ta), (_, tb) = half(8, 12), half(12, 16)
    si = last_kernel(make(ta, tb))
    renderer = ToyTensorCores()
    opts = heuristic_opts(si.ast, renderer)
    assert not any(o.op == "TC" for o in opts), opts
    apply_opts(si.ast, renderer, opts)  # what it chose instead is valid


def test_tc_knob_turns_tensor_cores_off():
    from ember.codegen.cachekey import lowering_key
    from ember.codegen.search import actions

    si, ref = layout_case("a@b")
    renderer = ToyTensorCores()
    key = lowering_key(renderer, si.ast)
    with Context(TC=0):
        opts = heuristic_opts(si.ast, renderer)
        assert opts and not any(o.op == "TC" for o in opts)  # the work-group heuristic's tiles instead
        assert not any(o.op == "TC" for o in actions(si.ast, renderer))
        assert lowering_key(renderer, si.ast) != key  # a cached TC kernel is not reused
        got = run_opts(si, "PYTHON", opts, renderer)
    np.testing.assert_allclose(got.reshape(ref.shape), ref.astype(np.float16), rtol=2e-3, atol=2e-3)
    assert heuristic_opts(si.ast, renderer) == [Opt("TC", 2, 0)]
