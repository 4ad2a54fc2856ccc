"""matmul / dot / linear / einsum against torch: values, shapes, dtypes, gradients, errors and kernel counts.

Inputs are random multiples of 1/8, so every product and partial sum is exact in float32 and the
results do not depend on summation order.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from backend_utils import FWD, compare_with_torch

from ember import GlobalCounters, Tensor, dtypes

torch = pytest.importorskip("torch")

rng = np.random.default_rng(7)


def q(*shape: int) -> np.ndarray:
    """Random float32 multiples of 1/8 in [-1, 1]."""
    return (rng.integers(-8, 9, size=shape) / 8).astype(np.float32)


# the upstream gradient of a comparison is drawn like the other inputs of this module
compare = partial(compare_with_torch, upstream=q)


# --------------------------------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------------------------------
MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (2, 4, 5)),
                 ((2, 1, 3, 4), (3, 4, 2)), ((3, 4), (2, 4, 5)), ((1, 1), (1, 1)), ((2, 3, 4), (4,)),
                 ((0, 3), (3, 4)), ((3, 0), (0, 4))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(device, shapes):
    compare(device, lambda a, b: a @ b, lambda a, b: a @ b, [q(*shapes[0]), q(*shapes[1])])


@pytest.mark.parametrize("layout", ["permuted", "flipped", "shrunk"])
def test_matmul_noncontiguous(device, layout):
    compare(device, lambda a, b: a.matmul(b), torch.matmul, [q(2, 3, 4), q(2, 4, 3)], [layout, layout])
    compare(device, lambda a, b: a @ b, torch.matmul, [q(3, 4), q(4)], [layout, "contiguous"])


def test_matmul_dtypes(device):
    i32 = rng.integers(-5, 6, size=(2, 3)).astype(np.int32)
    j32 = rng.integers(-5, 6, size=(3, 4)).astype(np.int32)
    compare(device, lambda a, b: a @ b, lambda a, b: a @ b, [i32, j32])
    compare(device, lambda a, b: a @ b, lambda a, b: a @ b, [i32.astype(np.int64), j32.astype(np.int64)])
    compare(device, lambda a, b: a @ b, lambda a, b: a @ b, [q(2, 3).astype(np.float64), q(3, 4).astype(np.float64)])
    compare(device, lambda a, b: a @ b, lambda a, b: a @ b, [q(2, 3).astype(np.float16), q(3, 4).astype(np.float16)],
            backward=False)
    # mixed float dtypes promote (torch refuses them; tinygrad promotes)
    out = Tensor(q(2, 3), device=device) @ Tensor(q(3, 2).astype(np.float64), device=device)
    assert out.dtype == dtypes.float64
    # the dtype argument sets the accumulation and output dtype
    assert Tensor(i32, device=device).matmul(Tensor(j32, device=device), dtype=dtypes.int64).dtype == dtypes.int64


def test_dot_reverse_and_operators(device):
    a, b = q(3, 4), q(4, 2)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    np.testing.assert_allclose(ta.dot(tb).numpy(), a @ b, **FWD)
    np.testing.assert_allclose(tb.matmul(ta, reverse=True).numpy(), a @ b, **FWD)
    np.testing.assert_allclose(ta.__rmatmul__(Tensor(q(5, 3), device=device)).shape, (5, 4))
    v = Tensor(q(4), device=device)
    assert v.dot(v).shape == ()
    c = Tensor(q(4, 4), device=device)
    c @= Tensor(np.eye(4, dtype=np.float32), device=device)
    assert c.shape == (4, 4)


@pytest.mark.parametrize("shapes", [((), (3,)), ((3,), ()), ((3, 4), (5, 6)), ((3,), (4,)), ((3,), (4, 2)),
                                    ((2, 3, 4), (3, 4, 5)), ((2, 3, 4), (2, 5, 6))], ids=str)
def test_matmul_errors(shapes):
    a, b = np.zeros(shapes[0], np.float32), np.zeros(shapes[1], np.float32)
    with pytest.raises(Exception) as want:
        torch.tensor(a) @ torch.tensor(b)
    with pytest.raises(want.type) as got:
        Tensor(a) @ Tensor(b)
    if len(shapes[0]) and len(shapes[1]) and want.type is RuntimeError and "batch" not in str(got.value):
        assert "x".join(map(str, shapes[1])) in str(got.value) or str(shapes[1][-2 if len(shapes[1]) > 1 else 0]) \
            in str(got.value)


def test_matmul_and_linear_are_one_kernel(device):
    x, w, b = Tensor(q(3, 4), device=device), Tensor(q(4, 5), device=device), Tensor(q(5), device=device)
    for t in (x @ w, x.linear(w, b), Tensor(q(2, 3, 4), device=device) @ w):
        GlobalCounters.reset()
        t.realize()
        assert GlobalCounters.kernel_count == 1


# --------------------------------------------------------------------------------------------------
# linear
# --------------------------------------------------------------------------------------------------
def test_linear(device):
    compare(device, lambda x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, [q(2, 3, 4), q(4, 5), q(5)])
    compare(device, lambda x, w: x.linear(w), lambda x, w: x @ w, [q(1, 4), q(4, 2)])
    compare(device, lambda x, w, b: x.linear(w, b), lambda x, w, b: x * w + b, [q(3, 4), q(4), q(4)])
    compare(device, lambda x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, [q(3, 4), q(4, 5), q(5)],
            ["permuted", "flipped", "contiguous"])
    out = Tensor(q(2, 3), device=device).linear(Tensor(q(3, 2), device=device), dtype=dtypes.float64)
    assert out.dtype == dtypes.float64


# --------------------------------------------------------------------------------------------------
# einsum
# --------------------------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 3)]),
    ("...ij,jk->...ik", [(2, 3, 4), (4, 2)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->", [(2, 3, 4)]),
    ("i,i->", [(5,)] * 2),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,ij,ij->i", [(2, 3)] * 3),
]


@pytest.mark.parametrize("formula,shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum(device, formula, shapes):
    compare(device, lambda *ts: Tensor.einsum(formula, *ts), lambda *ts: torch.einsum(formula, *ts),
            [q(*s) for s in shapes])


def test_einsum_list_views_and_dtypes(device):
    compare(device, lambda a, b: Tensor.einsum("ij,jk->ik", [a, b]), lambda a, b: torch.einsum("ij,jk->ik", a, b),
            [q(3, 4), q(4, 2)], ["flipped", "permuted"])
    i = rng.integers(-4, 5, size=(3,)).astype(np.int32)
    compare(device, lambda a, b: Tensor.einsum("i,i", a, b), lambda a, b: torch.einsum("i,i", a, b), [i, i])
    assert Tensor.einsum("ij->", Tensor(q(2, 2), device=device), dtype=dtypes.float64).dtype == dtypes.float64


@pytest.mark.parametrize("formula,shapes", [("ij,jk->ik", [(2, 3)]), ("ij,jk->ik", [(2, 3), (4, 5)]),
                                            ("ijk,jk->ik", [(2, 3), (3, 5)]), ("ij,jk->il", [(2, 3), (3, 5)]),
                                            ("i1,jk->ik", [(2, 3), (3, 5)]), ("ij->ii", [(2, 2)])], ids=str)
def test_einsum_errors(formula, shapes):
    arrays = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(Exception) as want:
        torch.einsum(formula, *[torch.tensor(a) for a in arrays])
    with pytest.raises(want.type):
        Tensor.einsum(formula, *[Tensor(a) for a in arrays])
