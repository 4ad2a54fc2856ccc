"""Reductions (sum, max, min, mean) and matmul against numpy, on contiguous and non-contiguous inputs."""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.ir.uop import Ops

RNG = np.random.default_rng(99)

# float32 sums are accumulated in a different order than numpy's pairwise sum: allow a few ulp per term.
REDUCE_TOL = {"rtol": 1e-5, "atol": 1e-5}

REDUCES = {  # name: (ember, numpy), both called as f(x, axis, keepdim)
    name: (lambda t, axis, keepdim, n=name: getattr(t, n)(axis, keepdim=keepdim),
           lambda a, axis, keepdim, n=name: getattr(a, n)(axis, keepdims=keepdim))
    for name in ("sum", "max", "min", "mean")
}
AXES = [None, 0, 1, -1, (0, 2), (-1, 0), (1,), (0, 1, 2)]
VIEW_AXES = [None, 1, -1, (0, 2)]  # every layout: all axes, a middle one, the innermost one, two at once


def randf(*shape: int) -> np.ndarray:
    return RNG.uniform(-3, 3, size=shape).astype(np.float32)


@pytest.mark.parametrize("name", REDUCES)
@pytest.mark.parametrize("axis", VIEW_AXES, ids=str)
def test_reduce_views(name, axis, make, check):
    ours, theirs = REDUCES[name]
    t, e = make(randf(2, 3, 4))
    for keepdim in (False, True):
        check(ours(t, axis, keepdim), theirs(e, axis, keepdim), **REDUCE_TOL)


@pytest.mark.parametrize("name", REDUCES)
def test_reduce_every_axis(device, check, name):
    ours, theirs = REDUCES[name]
    a = randf(2, 3, 4)
    t = Tensor(a, device=device)
    for axis in AXES:
        for keepdim in (False, True):
            check(ours(t, axis, keepdim), theirs(a, axis, keepdim), **REDUCE_TOL)


@pytest.mark.parametrize("name", REDUCES)
def test_reduce_0d(device, check, name):
    ours, theirs = REDUCES[name]
    a = np.array(2.5, np.float32)
    t = Tensor(a, device=device)
    for keepdim in (False, True):
        check(ours(t, None, keepdim), np.asarray(theirs(a, None, False)))


@pytest.mark.parametrize("name", REDUCES)
def test_reduce_0d_with_axis(device, check, name):
    ours, theirs = REDUCES[name]
    a = np.array(2.5, np.float32)
    t = Tensor(a, device=device)
    for axis in (0, -1, (0,)):
        for keepdim in (False, True):
            check(ours(t, axis, keepdim), np.asarray(theirs(a, None, False)))


def test_sum_size_zero(device, check):
    a = np.zeros((0, 3), np.float32)
    t = Tensor(a, device=device)
    check(t.sum(), np.array(0.0, np.float32))
    check(t.sum(0), np.zeros(3, np.float32))
    check(t.sum(1), np.zeros(0, np.float32))
    check(t.sum(0, keepdim=True), np.zeros((1, 3), np.float32))
    check(Tensor(np.zeros((0,), np.int32), device=device).sum(), np.array(0, np.int32))
    check(Tensor(np.zeros((2, 0, 3), np.float32), device=device).sum((0, 1)), np.zeros(3, np.float32))
    check(Tensor(np.zeros((2, 0), np.float32), device=device).max(0), np.zeros(0, np.float32))


def test_sum_size_zero_views(make, check):
    t, e = make(np.zeros((0, 3), np.float32))
    check(t.sum(), np.array(0.0, np.float32))
    check(t.sum(0), e.sum(0))
    check(t.sum(1, keepdim=True), e.sum(1, keepdims=True))


def test_mean_size_zero_is_nan(device, check):
    with np.errstate(all="ignore"):
        check(Tensor(np.zeros((0, 3), np.float32), device=device).mean(0), np.full(3, np.nan, np.float32))
        check(Tensor(np.zeros((0,), np.float32), device=device).mean(), np.array(np.nan, np.float32))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_of_empty_raise(device, name):
    t = Tensor(np.zeros((0, 3), np.float32), device=device)
    with pytest.raises((IndexError, RuntimeError)):
        getattr(t, name)()
    with pytest.raises((IndexError, RuntimeError)):
        getattr(t, name)(0)


# tinygrad's accumulation dtypes: bool and narrow ints sum in int32, unsigned ones in uint32, 64-bit ones keep theirs
@pytest.mark.parametrize("npdt, out", [(np.int8, np.int32), (np.int32, np.int32), (np.int64, np.int64),
                                       (np.uint8, np.uint32), (np.int16, np.int32), (np.bool_, np.int32),
                                       (np.uint32, np.uint32), (np.uint64, np.uint64),
                                       (np.float16, np.float16), (np.float64, np.float64)],
                         ids=lambda x: np.dtype(x).name)
def test_sum_dtype(device, check, npdt, out):
    a = (np.arange(12).reshape(3, 4) % 5 * (1 if npdt is np.bool_ else 25)).astype(npdt)
    t = Tensor(a, device=device)
    check(t.sum(), a.sum(dtype=out))
    check(t.sum(1), a.sum(1, dtype=out))
    check(t.T.sum(0, keepdim=True), a.T.sum(0, keepdims=True, dtype=out))


def test_int_sum_does_not_overflow_narrow_dtype(device, check):
    a = np.full((4, 50), 100, np.int8)  # 20000 does not fit in int8 or int16 when summed
    check(Tensor(a, device=device).sum(), np.array(20000, np.int32))
    b = np.full(10, 2 ** 31 - 1, np.int32)  # int32 sums wrap as in tinygrad; ask for int64 to hold them
    check(Tensor(b, device=device).sum(dtype=dtypes.int64), np.array(10 * (2 ** 31 - 1), np.int64))
    check(Tensor(b.astype(np.int64), device=device).sum(), np.array(10 * (2 ** 31 - 1), np.int64))


def test_sum_explicit_dtype(device, check):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    check(Tensor(a, device=device).sum(1, dtype=dtypes.int32), a.sum(1, dtype=np.int32))
    check(Tensor(a, device=device).sum(dtype="float32"), np.array(15.0, np.float32))


@pytest.mark.parametrize("npdt", [np.int8, np.int32, np.uint8, np.int64, np.float16, np.bool_],
                         ids=lambda x: np.dtype(x).name)
def test_max_min_keep_dtype(device, check, npdt):
    if npdt is np.bool_:
        a = np.array([[True, False, False], [False, False, False]])
    else:
        info = np.iinfo(npdt) if np.dtype(npdt).kind in "iu" else np.finfo(npdt)
        a = np.array([[info.min, 3, 0], [1, info.max, 2]], dtype=npdt)
    t = Tensor(a, device=device)
    check(t.max(), a.max())
    check(t.min(), a.min())
    check(t.max(1), a.max(1))
    check(t.min(0), a.min(0))


def test_max_min_special_values(device, check):
    a = np.array([[-np.inf, -1.0], [np.nan, 2.0], [np.inf, -0.0]], np.float32)
    t = Tensor(a, device=device)
    check(t.max(1), a.max(1))
    check(t.min(1), a.min(1))
    check(t.max(0), a.max(0))
    check(t.min(0), a.min(0))
    check(Tensor(np.full(3, -np.inf, np.float32), device=device).max(), np.array(-np.inf, np.float32))


def test_mean_of_ints_is_a_float(device, check):
    # tinygrad's answer (torch refuses): the mean of bools or ints is the default float, as for an accuracy
    check(Tensor([1, 2, 4], device=device).mean(), np.array(7 / 3, np.float32))
    check(Tensor([[True, False], [True, True]], device=device).mean(1), np.array([0.5, 1.0], np.float32))


def test_reduce_broadcast_and_chain(device, check):
    a, b = randf(3, 1, 5), randf(4, 1)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    check((x * y).sum(1), (a * b).sum(1), **REDUCE_TOL)
    check((x + y).max((0, 2), keepdim=True), (a + b).max((0, 2), keepdims=True))
    check(x.sum(2).mean(), a.sum(2).mean(), **REDUCE_TOL)
    check(x.expand(3, 4, 5).sum(1), np.broadcast_to(a, (3, 4, 5)).sum(1), **REDUCE_TOL)
    check((x - x.max(2, keepdim=True)).exp().sum(2), np.exp(a - a.max(2, keepdims=True)).sum(2), **REDUCE_TOL)


def test_reduce_larger(device, check):
    a = randf(37, 129)
    t = Tensor(a, device=device)
    check(t.sum(), a.sum(dtype=np.float64).astype(np.float32), rtol=1e-4, atol=1e-3)
    check(t.sum(0), a.sum(0), rtol=1e-4, atol=1e-4)
    check(t.max(1), a.max(1))
    check(t.mean(0), a.mean(0), rtol=1e-4, atol=1e-5)


def test_reduce_axis_out_of_range(device):
    t = Tensor(randf(2, 3), device=device)
    with pytest.raises(IndexError):
        t.sum(2)
    with pytest.raises(IndexError):
        t.max(-3)


# --------------------------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------------------------

# float32 dot products of length <= 16: rounding of partial sums differs from numpy's BLAS
MATMUL_TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.mark.parametrize("shapes", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((1, 1), (1, 1)), ((5, 16), (16, 3)), ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
], ids=str)
def test_matmul_shapes(device, check, shapes):
    a, b = randf(*shapes[0]), randf(*shapes[1])
    check(Tensor(a, device=device) @ Tensor(b, device=device), a @ b, **MATMUL_TOL)


def test_matmul_views(make, check):
    x, xe = make(randf(3, 4))
    y, ye = make(randf(4, 5))
    check(x @ y, xe @ ye, **MATMUL_TOL)
    check(x.matmul(y), xe @ ye, **MATMUL_TOL)
    check(y.T @ x.T, ye.T @ xe.T, **MATMUL_TOL)
    v, ve = make(randf(4))
    check(v @ y, ve @ ye, **MATMUL_TOL)
    check(x @ v, xe @ ve, **MATMUL_TOL)
    check(v @ v, ve @ ve, **MATMUL_TOL)


def test_matmul_transposed_inputs(device, check):
    a, b = randf(4, 3), randf(5, 4)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    check(x.T @ y.T, a.T @ b.T, **MATMUL_TOL)
    check(x.T @ x, a.T @ a, **MATMUL_TOL)
    c = randf(2, 4, 3)
    check(Tensor(c, device=device).permute(2, 0, 1)[::-1] @ x, c.transpose(2, 0, 1)[::-1] @ a, **MATMUL_TOL)
    check(Tensor(c, device=device).transpose(1, 2) @ Tensor(c, device=device), c.transpose(0, 2, 1) @ c, **MATMUL_TOL)


def test_matmul_size_zero(device, check):
    check(Tensor(randf(0, 3), device=device) @ Tensor(randf(3, 4), device=device), np.zeros((0, 4), np.float32))
    check(Tensor(randf(3, 0), device=device) @ Tensor(randf(0, 4), device=device), np.zeros((3, 4), np.float32))
    check(Tensor(randf(0), device=device) @ Tensor(randf(0), device=device), np.array(0.0, np.float32))


def test_matmul_dtypes(device, check):
    a, b = randf(2, 3).astype(np.float64), randf(3, 2).astype(np.float64)
    check(Tensor(a, device=device) @ Tensor(b, device=device), a @ b)
    h, g = randf(2, 3).astype(np.float16), randf(3, 2).astype(np.float16)
    check(Tensor(h, device=device) @ Tensor(g, device=device), (h.astype(np.float32) @ g.astype(np.float32))
          .astype(np.float16), rtol=2e-3, atol=2e-3)
    i, j = np.arange(6, dtype=np.int64).reshape(2, 3), np.arange(6, dtype=np.int64).reshape(3, 2) - 2
    check(Tensor(i, device=device) @ Tensor(j, device=device), i @ j)
    check(Tensor(a, device=device) @ Tensor(b.astype(np.float32), device=device), a @ b.astype(np.float32))


def test_matmul_int32_keeps_dtype(device, check):
    i, j = np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(6, dtype=np.int32).reshape(3, 2) - 2
    check(Tensor(i, device=device) @ Tensor(j, device=device), i @ j)


def test_matmul_then_elementwise(device, check):
    a, b, c = randf(3, 4), randf(4, 5), randf(5)
    out = (Tensor(a, device=device) @ Tensor(b, device=device) + Tensor(c, device=device)).relu()
    check(out, np.maximum(a @ b + c, 0), **MATMUL_TOL)


#: a product large enough for its operands' layout to count (see ember.frontend.linalg._tile_layout): n, k, m
LARGE_NKM = (384, 1024, 352)
#: the four layouts: (a stored as, b stored as, how the product reads them)
LAYOUTS = {
    "a@b": ((384, 1024), (1024, 352), lambda a, b: a @ b),
    "a@b.T": ((384, 1024), (352, 1024), lambda a, b: a @ b.T),
    "a.T@b": ((1024, 384), (1024, 352), lambda a, b: a.T @ b),
    "a.T@b.T": ((1024, 384), (352, 1024), lambda a, b: a.T @ b.T),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_large_matmul_layouts(check, layout):
    """A large product in each layout matches numpy. Operands both contiguous along k (a @ b.T) or both along
    their output axes (a.T @ b, with a long k and many outputs) are computed with one of them copied into another
    layout first: one more kernel; the other two layouts are one kernel."""
    from ember.device import Device

    policy = Device["CPU"].renderer
    n, k, m = LARGE_NKM
    assert policy.matmul_copy_min_macs is not None and n * k * m >= policy.matmul_copy_min_macs
    assert k >= policy.matmul_copy_min_k_across and n * m >= policy.matmul_copy_min_outputs_across
    sa, sb, f = LAYOUTS[layout]
    a, b = randf(*sa), randf(*sb)
    out = f(Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize())
    kernels = [si for si in out.schedule() if si.ast.op is Ops.SINK]
    assert len(kernels) == (2 if layout in ("a@b.T", "a.T@b") else 1), [si.ast.src[0].arg.shape for si in kernels]
    check(out, f(a, b), rtol=1e-4, atol=1e-3)


def test_small_or_broadcast_matmuls_are_not_copied(check):
    """A product below matmul_copy_min_macs, one with a short output dim, and one whose operand is a broadcast view (a
    copy would store every repeat) stay one kernel, and match numpy."""
    a, b = randf(48, 64), randf(40, 64)
    ta, tb = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()
    for out, want in ((ta @ tb.T, a @ b.T),):
        assert len(out.schedule()) == 1
        check(out, want, **MATMUL_TOL)
    thin, wide = randf(32, 1024), randf(512, 1024)
    out = Tensor(thin, device="CPU").realize() @ Tensor(wide, device="CPU").realize().T
    assert len(out.schedule()) == 1
    check(out, thin @ wide.T, rtol=1e-4, atol=1e-3)
    row = randf(1, 1024)
    rows = Tensor(row, device="CPU").realize().expand(256, 1024)
    out = rows @ Tensor(wide, device="CPU").realize().T
    assert len(out.schedule()) == 1
    check(out, np.broadcast_to(row, (256, 1024)) @ wide.T, rtol=1e-4, atol=1e-3)


def test_copied_matmul_operand_gets_its_gradient(check):
    """The gradients flow through the layout copy of a @ b.T (dL/da = g @ b, dL/db = g.T @ a)."""
    a, b, g = randf(96, 1024), randf(80, 1024), randf(96, 80)
    ta = Tensor(a, device="CPU", requires_grad=True).realize()
    tb = Tensor(b, device="CPU", requires_grad=True).realize()
    (ta @ tb.T * Tensor(g, device="CPU")).sum().backward()
    assert ta.grad is not None and tb.grad is not None
    check(ta.grad, g @ b, rtol=1e-4, atol=1e-3)
    check(tb.grad, g.T @ a, rtol=1e-4, atol=1e-3)


def test_matmul_of_regrouped_heads_reads_a_copy():
    """``x @ w.T`` where x joins heads back into features (``att.transpose(1, 2).reshape(b, t, h * d)``, as
    attention's output projection reads it): x is copied into a tile layout first, so the product's loads are
    affine along k (no division or remainder per step: the uncopied product ran 15x slower)."""
    from ember import Device
    from ember.codegen import get_program

    att, w = randf(2, 4, 128, 64), randf(256, 256)
    out = Tensor(att).transpose(1, 2).reshape(2, 128, 256) @ Tensor(w).T
    sched = out.schedule()
    assert len(sched) == 2  # the copy, then the product
    spec = get_program(sched[-1].ast, Device[Device.DEFAULT].renderer)
    assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in spec.uops)
    want = att.transpose(0, 2, 1, 3).reshape(2, 128, 256) @ w.T
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)



def test_matmul_of_a_broadcast_constant(device, check):
    # a constant expanded to a matrix is one loop-invariant load in the matmul's reduce loop (the fuzzer's seed
    # 5828 on CPU: the vector tile expected every load of its loop inside it and raised KeyError)
    x = randf(13, 8)
    c = Tensor([-1.5], device=device).reshape(1, 1, 1, 1).expand(7, 7, 2, 13)
    check(c @ Tensor(x, device=device), np.full((7, 7, 2, 13), -1.5, np.float32) @ x, rtol=1e-5, atol=1e-5)
    y = randf(5, 13)
    c2 = Tensor([0.75], device=device).reshape(1, 1).expand(13, 8)
    check(Tensor(y, device=device) @ c2, y @ np.full((13, 8), 0.75, np.float32), rtol=1e-5, atol=1e-5)
