"""The movement API beyond the primitives, against torch: values, shapes, dtypes, gradients and errors.

Covers view/reshape, flatten/unflatten, squeeze/unsqueeze, expand, repeat, repeat_interleave, pad (every
mode), shrink, flip, roll, cat, stack, split, chunk, tril/triu, transpose/permute/swapaxes, contiguous and
meshgrid, on contiguous and non-contiguous inputs, 0-d and size-0 tensors, on every backend device.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from backend_utils import assert_like, check_grad, laid_out, rand, same_error

from ember import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional


def pieces(parts: Any, scale: Callable[[Any, int], Any], join: Callable[..., Any], dim: int) -> Any:
    """Weight each piece differently and join them back, so a gradient shows where each piece went."""
    return join(*[scale(p, i + 1) for i, p in enumerate(parts)], dim=dim)


def ours_split(t: Tensor, *args: Any, dim: int) -> Tensor:
    return pieces(t.split(*args, dim=dim), lambda p, k: p * k, Tensor.cat, dim)


def torch_split(t: Any, *args: Any, dim: int) -> Any:
    return pieces(torch.split(t, *args, dim=dim), lambda p, k: p * k, lambda *ps, dim: torch.cat(ps, dim), dim)


def ours_chunk(t: Tensor, n: int, dim: int) -> Tensor:
    return pieces(t.chunk(n, dim), lambda p, k: p * k, Tensor.cat, dim)


def torch_chunk(t: Any, n: int, dim: int) -> Any:
    return pieces(torch.chunk(t, n, dim), lambda p, k: p * k, lambda *ps, dim: torch.cat(ps, dim), dim)


# name: (ember op, torch op), both applied to a (2, 3, 4) float tensor
MOVES: dict[str, tuple[Callable, Callable]] = {
    "reshape": (lambda t: t.reshape(4, 6), lambda t: t.reshape(4, 6)),
    "reshape_tuple_infer": (lambda t: t.reshape((6, -1)), lambda t: t.reshape((6, -1))),
    "reshape_flat": (lambda t: t.reshape(-1), lambda t: t.reshape(-1)),
    "view_varargs": (lambda t: t.view(2, -1, 2), lambda t: t.view(2, -1, 2)),
    "flatten": (lambda t: t.flatten(), lambda t: t.flatten()),
    "flatten_range": (lambda t: t.flatten(1), lambda t: t.flatten(1)),
    "flatten_negative": (lambda t: t.flatten(-3, -2), lambda t: t.flatten(-3, -2)),
    "unflatten": (lambda t: t.unflatten(2, (2, 2)), lambda t: t.unflatten(2, (2, 2))),
    "unflatten_infer": (lambda t: t.unflatten(-2, (-1, 1, 1)), lambda t: t.unflatten(-2, (-1, 1, 1))),
    "squeeze_tuple": (lambda t: t.reshape(2, 1, 3, 1, 4).squeeze((1, 3, 4)),
                      lambda t: t.reshape(2, 1, 3, 1, 4).squeeze((1, 3, 4))),
    "squeeze_all": (lambda t: t.reshape(1, 2, 1, 12, 1).squeeze(), lambda t: t.reshape(1, 2, 1, 12, 1).squeeze()),
    "squeeze_negative": (lambda t: t.reshape(2, 12, 1).squeeze(-1), lambda t: t.reshape(2, 12, 1).squeeze(-1)),
    "squeeze_not_one": (lambda t: t.squeeze(1), lambda t: t.squeeze(1)),
    "unsqueeze": (lambda t: t.unsqueeze(1), lambda t: t.unsqueeze(1)),
    "unsqueeze_end": (lambda t: t.unsqueeze(-1), lambda t: t.unsqueeze(-1)),
    "expand_minus_one": (lambda t: t.reshape(2, 1, 3, 4).expand(-1, 5, -1, -1),
                         lambda t: t.reshape(2, 1, 3, 4).expand(-1, 5, -1, -1)),
    "expand_new_dims": (lambda t: t.expand(3, 2, 3, 4), lambda t: t.expand(3, 2, 3, 4)),
    "repeat": (lambda t: t.repeat(2, 1, 3), lambda t: t.repeat(2, 1, 3)),
    "repeat_new_dims": (lambda t: t.repeat((2, 1, 2, 1)), lambda t: t.repeat((2, 1, 2, 1))),
    "repeat_zero": (lambda t: t.repeat(1, 0, 2), lambda t: t.repeat(1, 0, 2)),
    "repeat_interleave": (lambda t: t.repeat_interleave(2, 1), lambda t: t.repeat_interleave(2, 1)),
    "repeat_interleave_flat": (lambda t: t.repeat_interleave(3), lambda t: t.repeat_interleave(3)),
    "repeat_interleave_negative_dim": (lambda t: t.repeat_interleave(2, dim=-1),
                                       lambda t: t.repeat_interleave(2, dim=-1)),
    "pad_flat_torch_order": (lambda t: t.pad((1, 2, 0, 1)), lambda t: F.pad(t, (1, 2, 0, 1))),
    "pad_per_dim_value": (lambda t: t.pad(((0, 0), (1, 0), (2, 1)), value=1.5), lambda t: F.pad(t, (2, 1, 1, 0),
                                                                                               value=1.5)),
    "pad_negative": (lambda t: t.pad((-1, 2, 1, -1)), lambda t: F.pad(t, (-1, 2, 1, -1))),
    "reflect_last": (lambda t: t._pad_mode((2, 3), "reflect"), lambda t: F.pad(t, (2, 3), mode="reflect")),
    "reflect_two": (lambda t: t._pad_mode((1, 2, 2, 0), "reflect"), lambda t: F.pad(t, (1, 2, 2, 0), mode="reflect")),
    "replicate_two": (lambda t: t._pad_mode((3, 1, 0, 2), "replicate"),
                      lambda t: F.pad(t, (3, 1, 0, 2), mode="replicate")),
    "circular_two": (lambda t: t._pad_mode((4, 1, 2, 3), "circular"),
                     lambda t: F.pad(t, (4, 1, 2, 3), mode="circular")),
    "circular_negative": (lambda t: t._pad_mode((-1, 2), "circular"), lambda t: F.pad(t, (-1, 2), mode="circular")),
    "reflect_negative": (lambda t: t._pad_mode((2, -1), "reflect"), lambda t: F.pad(t, (2, -1), mode="reflect")),
    "shrink": (lambda t: t.shrink(((1, 2), None, (1, 3))), lambda t: t[1:2, :, 1:3]),
    "flip": (lambda t: t.flip(0, 2), lambda t: t.flip(0, 2)),
    "flip_negative": (lambda t: t.flip((-1,)), lambda t: t.flip(-1)),
    "roll": (lambda t: t.roll(1, 2), lambda t: t.roll(1, 2)),
    "roll_several": (lambda t: t.roll((1, -2, 7), (0, 2, 1)), lambda t: t.roll((1, -2, 7), (0, 2, 1))),
    "roll_flat": (lambda t: t.roll(5), lambda t: t.roll(5)),
    "roll_multiple_of_size": (lambda t: t.roll(-8, -1), lambda t: t.roll(-8, -1)),
    "cat_self": (lambda t: t.cat(t * 2, dim=1), lambda t: torch.cat([t, t * 2], 1)),
    "cat_list": (lambda t: Tensor.cat([t[:, :1], t, t[:, 1:]], dim=-2),
                 lambda t: torch.cat([t[:, :1], t, t[:, 1:]], -2)),
    "cat_last": (lambda t: t[..., :1].cat(t, t[..., 2:], dim=-1), lambda t: torch.cat([t[..., :1], t, t[..., 2:]], -1)),
    "stack": (lambda t: t.stack(t * 3), lambda t: torch.stack([t, t * 3])),
    "stack_last": (lambda t: Tensor.stack(t, t + 1, t, dim=-1), lambda t: torch.stack([t, t + 1, t], -1)),
    "stack_middle_list": (lambda t: Tensor.stack([t, -t], dim=2), lambda t: torch.stack([t, -t], 2)),
    "split_int": (lambda t: ours_split(t, 3, dim=2), lambda t: torch_split(t, 3, dim=2)),
    "split_list": (lambda t: ours_split(t, [1, 0, 2], dim=1), lambda t: torch_split(t, [1, 0, 2], dim=1)),
    "chunk": (lambda t: ours_chunk(t, 3, 2), lambda t: torch_chunk(t, 3, 2)),
    "chunk_uneven": (lambda t: ours_chunk(t, 2, -2), lambda t: torch_chunk(t, 2, -2)),
    "tril": (lambda t: t.tril(), lambda t: t.tril()),
    "tril_diagonal": (lambda t: t.tril(1), lambda t: t.tril(1)),
    "triu": (lambda t: t.triu(), lambda t: t.triu()),
    "triu_negative": (lambda t: t.triu(-1), lambda t: t.triu(-1)),
    "triu_far": (lambda t: t.triu(5), lambda t: t.triu(5)),
    "transpose": (lambda t: t.transpose(0, 2), lambda t: t.transpose(0, 2)),
    "transpose_default": (lambda t: t.transpose(), lambda t: t.transpose(1, 0)),
    "swapaxes": (lambda t: t.swapaxes(-1, 0), lambda t: t.swapaxes(-1, 0)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda t: t.permute(2, 0, 1)),
    "permute_negative": (lambda t: t.permute((-1, -3, -2)), lambda t: t.permute((-1, -3, -2))),
    "T_matrix": (lambda t: t[0].T, lambda t: t[0].T),
    "contiguous": (lambda t: t.permute(2, 0, 1).contiguous(), lambda t: t.permute(2, 0, 1).contiguous()),
}


# --- forward and backward of every op ----------------------------------------------------------------
@pytest.mark.parametrize("name", MOVES)
def test_move(device, name):
    ours, theirs = MOVES[name]
    check_grad(device, ours, theirs, rand(2, 3, 4))


@pytest.mark.parametrize("layout", ["permuted", "flipped", "shrunk"])
def test_non_contiguous_inputs(device, layout):
    base, view_e, view_t = laid_out(rand(2, 3, 4, seed=1), layout)
    for name in ("reshape", "roll_several", "cat_self", "split_list", "tril_diagonal", "reflect_two"):
        ours, theirs = MOVES[name]
        check_grad(device, lambda t, f=ours: f(view_e(t)), lambda t, f=theirs: f(view_t(t)), base)


def test_cat_promotes_dtypes_and_grads_every_input(device):
    a, b, c = rand(2, 3), rand(2, 1, seed=1), rand(2, 2, seed=2)
    check_grad(device, lambda x, y, z: x.cat(y, z, dim=1), lambda x, y, z: torch.cat([x, y, z], 1), a, b, c)
    check_grad(device, lambda x, y: Tensor.stack(x, y, dim=1), lambda x, y: torch.stack([x, y], 1), a, a.copy())
    i = np.array([[1, 2]], np.int32)
    f16 = np.array([[0.5, 1.5]], np.float16)
    bl = np.array([[True, False]])
    for xs in ((i, bl), (i, f16), (bl, bl), (f16, i, bl)):
        ours = Tensor.cat(*[Tensor(x, device=device) for x in xs])
        assert_like(ours, torch.cat([torch.tensor(x) for x in xs]))
    # -0.0 keeps its sign (cat selects, it does not add)
    z = Tensor(np.array([-0.0, 1.0], np.float32), device=device).cat(Tensor(np.array([-0.0], np.float32),
                                                                            device=device)).numpy()
    assert np.signbit(z[0]) and np.signbit(z[2])


def test_cat_skips_legacy_empty_and_keeps_empty_dims(device):
    a = rand(2, 3)
    ours = Tensor.cat(Tensor(np.zeros(0, np.float32), device=device), Tensor(a, device=device))
    assert_like(ours, torch.cat([torch.zeros(0), torch.tensor(a)]))
    e = np.zeros((2, 0), np.float32)
    assert_like(Tensor(e, device=device).cat(Tensor(a, device=device), Tensor(e, device=device), dim=1),
                torch.cat([torch.tensor(e), torch.tensor(a), torch.tensor(e)], 1))
    assert_like(Tensor(e, device=device).cat(Tensor(e, device=device)), torch.cat([torch.tensor(e)] * 2))
    single = Tensor(a, device=device)
    assert_like(Tensor.cat([single]), torch.cat([torch.tensor(a)]))


def test_zero_dim(device):
    a = np.array(1.5, np.float32)
    x, t = Tensor(a, device=device), torch.tensor(a)
    for ours, theirs in ((x.reshape(1, 1), t.reshape(1, 1)), (x.reshape(()), t.reshape(())),
                         (x.view(-1), t.view(-1)), (x.flatten(), t.flatten()), (x.squeeze(0), t.squeeze(0)),
                         (x.squeeze(), t.squeeze()), (x.squeeze((0,)), t.squeeze((0,))),
                         (x.unsqueeze(-1), t.unsqueeze(-1)), (x.expand(2, 3), t.expand(2, 3)),
                         (x.repeat(2, 3), t.repeat(2, 3)), (x.repeat(()), t.repeat(())),
                         (x.repeat_interleave(3), t.repeat_interleave(3)), (x.roll(2), t.roll(2)),
                         (x.stack(x, x), torch.stack([t, t, t])), (x.permute(()), t.permute(())),
                         (x.flip(()), t.flip(())), (x.contiguous(), t.contiguous())):
        assert_like(ours, theirs)
    check_grad(device, lambda u: u.reshape(1, 1).expand(2, 3), lambda u: u.reshape(1, 1).expand(2, 3), a)
    check_grad(device, lambda u: Tensor.stack(u, u * 2, dim=0), lambda u: torch.stack([u, u * 2], 0), a)


SIZE0 = {
    "reshape": (lambda t: t.reshape(3, 0), lambda t: t.reshape(3, 0)),
    "reshape_infer": (lambda t: t.reshape(-1, 3), lambda t: t.reshape(-1, 3)),
    "flatten": (lambda t: t.flatten(), lambda t: t.flatten()),
    "unflatten": (lambda t: t.unflatten(1, (3, 1)), lambda t: t.unflatten(1, (3, 1))),
    "squeeze": (lambda t: t.unsqueeze(0).squeeze(), lambda t: t.unsqueeze(0).squeeze()),
    "expand": (lambda t: t.reshape(0, 3, 1).expand(-1, -1, 2), lambda t: t.reshape(0, 3, 1).expand(-1, -1, 2)),
    "repeat": (lambda t: t.repeat(3, 2), lambda t: t.repeat(3, 2)),
    "repeat_interleave": (lambda t: t.repeat_interleave(2, 1), lambda t: t.repeat_interleave(2, 1)),
    "roll": (lambda t: t.roll((1, 2), (0, 1)), lambda t: t.roll((1, 2), (0, 1))),
    "cat": (lambda t: t.cat(t, dim=1), lambda t: torch.cat([t, t], 1)),
    "stack": (lambda t: t.stack(t, dim=-1), lambda t: torch.stack([t, t], -1)),
    "split": (lambda t: t.split(2, 1)[1], lambda t: torch.split(t, 2, 1)[1]),
    "split_empty_dim": (lambda t: t.split(2, 0)[0], lambda t: torch.split(t, 2, 0)[0]),
    "chunk": (lambda t: t.chunk(3, 0)[2], lambda t: torch.chunk(t, 3, 0)[2]),
    "tril": (lambda t: t.tril(), lambda t: t.tril()),
    "triu": (lambda t: t.T.triu(1), lambda t: t.T.triu(1)),
    "pad": (lambda t: t.pad((1, 1, 2, 0)), lambda t: F.pad(t, (1, 1, 2, 0))),
    "circular": (lambda t: t._pad_mode((1, 2), "circular"), lambda t: F.pad(t.unsqueeze(0), (1, 2),
                                                                           mode="circular")[0]),
    "transpose": (lambda t: t.transpose(0, 1), lambda t: t.transpose(0, 1)),
    "flip": (lambda t: t.flip(0), lambda t: t.flip(0)),
}


@pytest.mark.parametrize("name", SIZE0)
def test_size_zero(device, name):
    ours, theirs = SIZE0[name]
    check_grad(device, ours, theirs, np.zeros((0, 3), np.float32))


def test_split_and_chunk_structure(device):
    a = np.arange(30, dtype=np.float32).reshape(5, 6)
    x, t = Tensor(a, device=device), torch.tensor(a)
    for dim, ours, theirs in ((0, x.split(2), torch.split(t, 2)), (1, x.split(4, 1), torch.split(t, 4, 1)),
                              (0, x.split(10), torch.split(t, 10)), (1, x.chunk(4, 1), torch.chunk(t, 4, 1)),
                              (0, x.chunk(7), torch.chunk(t, 7)), (1, x.chunk(6, -1), torch.chunk(t, 6, -1))):
        assert [o.shape for o in ours] == [tuple(r.shape) for r in theirs]
        # the pieces hold the right values: reassembled with their neighbours' scale they give torch's result
        assert_like(pieces(ours, lambda p, k: p * k, Tensor.cat, dim),
                    pieces(theirs, lambda p, k: p * k, lambda *ps, dim: torch.cat(ps, dim), dim))
    assert isinstance(x.split(2), tuple) and isinstance(x.chunk(2), list)  # tinygrad's return types
    e = np.zeros((0, 2), np.float32)
    assert [p.shape for p in Tensor(e, device=device).chunk(3)] == [tuple(p.shape) for p in torch.chunk(
        torch.tensor(e), 3)]
    assert [p.shape for p in Tensor(e, device=device).split(0)] == [tuple(p.shape) for p in torch.split(
        torch.tensor(e), 0)]


@pytest.mark.parametrize("mode, numpy_mode", [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")])
def test_pad_modes_any_dim(device, mode, numpy_mode):
    # torch limits these modes to the trailing 1-3 dims of batched inputs; ember pads any dim (numpy's semantics)
    a = rand(3, 4, 5, seed=3)
    pads = [(2, 1), (0, 3), (1, 4)]
    ours = Tensor(a, device=device)._pad_mode(tuple(pads), mode)
    expected = np.pad(a, pads, mode=numpy_mode)
    assert ours.shape == expected.shape and ours.dtype == dtypes.float32
    np.testing.assert_allclose(ours.numpy(), expected)
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = Tensor(ints, device=device)._pad_mode(((1, 1), (2, 2)), mode)
    assert got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), np.pad(ints, [(1, 1), (2, 2)], mode=numpy_mode))
    x4 = rand(1, 2, 3, 4, seed=4)
    check_grad(device, lambda t: t._pad_mode((1, 2, 2, 1), mode), lambda t: F.pad(t, (1, 2, 2, 1), mode=mode), x4)


def test_tensor_pad_modes(device):
    a = rand(1, 2, 5)
    for mode in ("reflect", "replicate", "circular"):
        assert_like(Tensor(a, device=device).pad((2, 1), mode=mode), F.pad(torch.tensor(a), (2, 1), mode=mode))


def test_pad_to_and_shrink_to(device):
    a = rand(2, 3)
    x, t = Tensor(a, device=device), torch.tensor(a)
    assert_like(x.pad_to(4, None), F.pad(t, (0, 0, 0, 2)))
    assert_like(x.pad_to((3, 5)), F.pad(t, (0, 2, 0, 1)))
    assert_like(x.shrink_to(1, 2), t[:1, :2])
    assert_like(x.shrink_to((None, 1)), t[:, :1])


def test_meshgrid(device):
    a, b, c = np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32) * 2, np.array(7.0, np.float32)
    xa, xb, xc = (Tensor(v, device=device) for v in (a, b, c))
    ta, tb, tc = (torch.tensor(v) for v in (a, b, c))
    for indexing in ("ij", "xy"):
        for ours, theirs in ((xa.meshgrid(xb, indexing=indexing), torch.meshgrid(ta, tb, indexing=indexing)),
                             (Tensor.meshgrid(xa, xb, xc, indexing=indexing),
                              torch.meshgrid(ta, tb, tc, indexing=indexing)),
                             (Tensor.meshgrid([xc, xa], indexing=indexing),
                              torch.meshgrid([tc, ta], indexing=indexing)),
                             (xa.meshgrid(indexing=indexing), torch.meshgrid(ta, indexing=indexing))):
            assert len(ours) == len(theirs)
            for o, r in zip(ours, theirs):
                assert_like(o, r)
    check_grad(device, lambda u, v: u.meshgrid(v)[0] * u.meshgrid(v)[1],
               lambda u, v: torch.meshgrid(u, v, indexing="ij")[0] * torch.meshgrid(u, v, indexing="ij")[1], a, b)


def test_tril_triu_shapes_and_dtypes(device):
    for shape, diagonals in (((4, 3), (-4, 2)), ((3, 5), (-1, 6)), ((1, 1), (0,)), ((2, 1, 4), (1,))):
        a = np.arange(np.prod(shape), dtype=np.int32).reshape(shape) + 1
        x, t = Tensor(a, device=device), torch.tensor(a)
        for d in diagonals:
            assert_like(x.tril(d), t.tril(d))
            assert_like(x.triu(d), t.triu(d))
    b = np.ones((3, 3), bool)
    assert_like(Tensor(b, device=device).triu(1), torch.tensor(b).triu(1))


def test_roll_and_repeat_dtypes(device):
    for arr in (np.arange(6, dtype=np.int64).reshape(2, 3), np.array([[True, False, False]]),
                np.arange(6, dtype=np.uint8)):
        x, t = Tensor(arr, device=device), torch.tensor(arr)
        assert_like(x.roll(1, -1), t.roll(1, -1))
        assert_like(x.repeat(2, 1), t.repeat(2, 1))
        assert_like(x.repeat_interleave(2), t.repeat_interleave(2))
        assert_like(x.flatten().flip(0), t.flatten().flip(0))


# --- errors ----------------------------------------------------------------------------------------------
A = rand(2, 3, 4)
ERRORS: dict[str, tuple[Callable, Callable]] = {
    "reshape_bad_size": (lambda t: t.reshape(5, 5), lambda t: t.reshape(5, 5)),
    "reshape_two_infer": (lambda t: t.reshape(-1, -1), lambda t: t.reshape(-1, -1)),
    "view_bad_infer": (lambda t: t.view(5, -1), lambda t: t.view(5, -1)),
    "flatten_start_after_end": (lambda t: t.flatten(2, 1), lambda t: t.flatten(2, 1)),
    "flatten_dim_out_of_range": (lambda t: t.flatten(0, 3), lambda t: t.flatten(0, 3)),
    "unflatten_bad_sizes": (lambda t: t.unflatten(1, (2, 2)), lambda t: t.unflatten(1, (2, 2))),
    "unflatten_bad_infer": (lambda t: t.unflatten(2, (3, -1)), lambda t: t.unflatten(2, (3, -1))),
    "unflatten_empty_sizes": (lambda t: t.unflatten(1, ()), lambda t: t.unflatten(1, ())),
    "unflatten_0d": (lambda t: t[0, 0, 0].unflatten(0, (1,)), lambda t: t[0, 0, 0].unflatten(0, (1,))),
    "squeeze_out_of_range": (lambda t: t.squeeze(3), lambda t: t.squeeze(3)),
    "squeeze_repeated": (lambda t: t.squeeze((0, 0)), lambda t: t.squeeze((0, 0))),
    "unsqueeze_out_of_range": (lambda t: t.unsqueeze(4), lambda t: t.unsqueeze(4)),
    "expand_bad": (lambda t: t.expand(2, 5, 4), lambda t: t.expand(2, 5, 4)),
    "expand_too_few": (lambda t: t.expand(3, 4), lambda t: t.expand(3, 4)),
    "repeat_too_few": (lambda t: t.repeat(2, 2), lambda t: t.repeat(2, 2)),
    "repeat_negative": (lambda t: t.repeat(1, -1, 1), lambda t: t.repeat(1, -1, 1)),
    "repeat_interleave_negative": (lambda t: t.repeat_interleave(-1, 0), lambda t: t.repeat_interleave(-1, 0)),
    "repeat_interleave_dim": (lambda t: t.repeat_interleave(2, 3), lambda t: t.repeat_interleave(2, 3)),
    "roll_mismatch": (lambda t: t.roll((1, 2), 0), lambda t: t.roll((1, 2), 0)),
    "roll_dim_out_of_range": (lambda t: t.roll(1, 3), lambda t: t.roll(1, 3)),
    "cat_shapes": (lambda t: t.cat(t[:, :2], dim=2), lambda t: torch.cat([t, t[:, :2]], 2)),
    "cat_ndim": (lambda t: t.cat(t[0]), lambda t: torch.cat([t, t[0]])),
    "cat_zero_dim": (lambda t: t[0, 0, 0].cat(t[0, 0, 1]), lambda t: torch.cat([t[0, 0, 0], t[0, 0, 1]])),
    "cat_dim_out_of_range": (lambda t: t.cat(t, dim=3), lambda t: torch.cat([t, t], 3)),
    "cat_empty_list": (lambda t: Tensor.cat([]), lambda t: torch.cat([])),
    "stack_shapes": (lambda t: t.stack(t[:1]), lambda t: torch.stack([t, t[:1]])),
    "stack_dim_out_of_range": (lambda t: t.stack(t, dim=4), lambda t: torch.stack([t, t], 4)),
    "split_bad_sum": (lambda t: t.split([1, 1], 1), lambda t: torch.split(t, [1, 1], 1)),
    "split_negative_size": (lambda t: t.split(-1), lambda t: torch.split(t, -1)),
    "split_negative_list": (lambda t: t.split([3, -1], 1), lambda t: torch.split(t, [3, -1], 1)),
    "split_zero": (lambda t: t.split(0), lambda t: torch.split(t, 0)),
    "split_dim_out_of_range": (lambda t: t.split(1, 3), lambda t: torch.split(t, 1, 3)),
    "chunk_zero": (lambda t: t.chunk(0), lambda t: torch.chunk(t, 0)),
    "chunk_dim_out_of_range": (lambda t: t.chunk(2, -4), lambda t: torch.chunk(t, 2, -4)),
    "tril_1d": (lambda t: t[0, 0].tril(), lambda t: t[0, 0].tril()),
    "triu_0d": (lambda t: t[0, 0, 0].triu(), lambda t: t[0, 0, 0].triu()),
    "permute_not_a_permutation": (lambda t: t.permute(0, 0, 1), lambda t: t.permute(0, 0, 1)),
    "permute_out_of_range": (lambda t: t.permute(0, 1, 3), lambda t: t.permute(0, 1, 3)),
    "transpose_out_of_range": (lambda t: t.transpose(0, 3), lambda t: t.transpose(0, 3)),
    "swapaxes_out_of_range": (lambda t: t.swapaxes(-4, 0), lambda t: t.swapaxes(-4, 0)),
    "reflect_too_wide": (lambda t: t._pad_mode((4, 0), "reflect"), lambda t: F.pad(t, (4, 0), mode="reflect")),
    "circular_wraps_twice": (lambda t: t._pad_mode((0, 5), "circular"), lambda t: F.pad(t, (0, 5), mode="circular")),
    "pad_unknown_mode": (lambda t: t._pad_mode((1, 1), "mirror"), lambda t: F.pad(t, (1, 1), mode="mirror")),
    "meshgrid_indexing": (lambda t: t[0, 0].meshgrid(t[0, 1], indexing="ji"),
                          lambda t: torch.meshgrid(t[0, 0], t[0, 1], indexing="ji")),
    "meshgrid_2d": (lambda t: t[0].meshgrid(t[0, 0]), lambda t: torch.meshgrid(t[0], t[0, 0], indexing="ij")),
    "meshgrid_dtypes": (lambda t: t[0, 0].meshgrid(t[0, 0].cast(dtypes.float64)),
                        lambda t: torch.meshgrid(t[0, 0], t[0, 0].double(), indexing="ij")),
}


@pytest.mark.parametrize("name", ERRORS)
def test_errors(device, name):
    ours, theirs = ERRORS[name]
    same_error(lambda: ours(Tensor(A, device=device)), lambda: theirs(torch.tensor(A)))


def test_cat_error_names_the_shapes(device):
    x = Tensor(A, device=device)
    err = same_error(lambda: x.cat(Tensor(rand(2, 5, 4), device=device), dim=2),
                     lambda: torch.cat([torch.tensor(A), torch.zeros(2, 5, 4)], 2))
    assert "(2, 3, 4)" in str(err) and "(2, 5, 4)" in str(err)
    err = same_error(lambda: x.stack(x[:, :1]), lambda: torch.stack([torch.tensor(A), torch.tensor(A)[:, :1]]))
    assert "[2, 3, 4]" in str(err) and "[2, 1, 4]" in str(err)


def test_cat_device_mismatch():
    from ember import Device

    if not {"CPU", "PYTHON"} <= set(Device.available()):
        pytest.skip("needs both the CPU and the PYTHON device")
    with pytest.raises(RuntimeError):
        Tensor(A, device="CPU").cat(Tensor(A, device="PYTHON"))
