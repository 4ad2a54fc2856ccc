"""tinygrad API that torch lacks or spells differently, checked against torch or against the rule in numpy.

masked_select/nonzero with ``size=`` (fixed-size, no read-back), cropping before a convolution with ``pad``
(a negative conv padding is refused, as in torch), ``nn.ConvTranspose1d``, ``contiguous_backward``,
``replace``, ``nn.optim.LARS`` and ``OptimizerGroup``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from test_tinygrad_compat import check, check_grad, q, unique

from ember import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

# --------------------------------------------------------------------------------------------------
# masked_select(size=) / nonzero(size=): fixed-size results, computed without reading back
# --------------------------------------------------------------------------------------------------
def test_masked_select_with_size(device):
    a = unique(3, 4)
    m = np.array([[True, False, True, False], [False, False, True, True], [True, False, False, False]])
    x, mask = Tensor(a, device=device), Tensor(m, device=device)
    hits = torch.tensor(a).masked_select(torch.tensor(m)).numpy()  # 5 elements
    for size, fill in ((5, 0), (8, -1.5), (2, 0), (0, 0)):
        got = x.masked_select(mask, size=size, fill_value=fill)
        want = np.concatenate([hits, np.full(max(0, size - len(hits)), fill, np.float32)])[:size]
        assert got.shape == (size,) and got.dtype == dtypes.float32
        np.testing.assert_array_equal(got.numpy(), want)
    # broadcast mask, int values, special floats kept bit for bit
    ints = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    got = ints.masked_select(Tensor([False, True, True], device=device), size=5, fill_value=-1)
    np.testing.assert_array_equal(got.numpy(), [1, 2, 4, 5, -1])
    special = np.array([-0.0, math.nan, math.inf, 1.0], np.float32)
    got = Tensor(special, device=device).masked_select(Tensor([True, True, True, False], device=device), size=3)
    np.testing.assert_array_equal(np.signbit(got.numpy()), [True, False, False])
    np.testing.assert_array_equal(got.numpy(), special[:3])
    # the gradient reaches the selected elements only
    w = q(4)
    t = Tensor(a, device=device, requires_grad=True)
    (t.masked_select(mask, size=4) * Tensor(w, device=device)).sum().backward()
    tt = torch.tensor(a, requires_grad=True)
    (tt.masked_select(torch.tensor(m))[:4] * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())
    with pytest.raises(ValueError, match="size"):
        x.masked_select(mask, size=-1)


def test_nonzero_with_size(device):
    a = np.array([[1, 0, 2], [0, 0, 3]], np.int32)
    want = torch.tensor(a).nonzero().numpy()  # (3, 2)
    x = Tensor(a, device=device)
    plain = x.nonzero()
    assert plain.dtype == dtypes.int32
    np.testing.assert_array_equal(plain.numpy(), want)
    for size, fill in ((3, 0), (5, -1), (1, 0)):
        got = x.nonzero(size=size, fill_value=fill)
        assert got.shape == (size, 2) and got.dtype == dtypes.int32
        expect = np.concatenate([want, np.full((max(0, size - 3), 2), fill)])[:size]
        np.testing.assert_array_equal(got.numpy(), expect)
    rows, cols = x.nonzero(as_tuple=True, size=4, fill_value=9)
    np.testing.assert_array_equal(rows.numpy(), [0, 0, 1, 9])
    np.testing.assert_array_equal(cols.numpy(), [0, 2, 2, 9])
    flat = Tensor([0.0, -1.5, 0.0, math.nan], device=device).nonzero(size=2)
    np.testing.assert_array_equal(flat.numpy(), torch.tensor([0.0, -1.5, 0.0, math.nan]).nonzero().numpy())
    assert Tensor(np.zeros((0, 3), np.float32), device=device).nonzero(size=2).tolist() == [[0, 0], [0, 0]]


# --------------------------------------------------------------------------------------------------
# conv with negative padding (refused, as in torch), ConvTranspose1d, contiguous_backward, replace
# --------------------------------------------------------------------------------------------------
def test_conv2d_negative_padding_is_refused_and_pad_crops_instead(device):
    # tinygrad crops with a negative conv padding; ember refuses it as torch does (a typo must not crop
    # silently) and the crop is spelled with pad, whose negative values crop
    x, w = q(1, 2, 7, 6), q(3, 2, 3, 3)
    for padding in (-1, (-1, 0), (0, -1, 1, -2)):
        with pytest.raises(RuntimeError, match="negative padding"):
            Tensor(x, device=device).conv2d(Tensor(w, device=device), padding=padding)
    got = Tensor(x, device=device).pad((0, -1, 1, -2)).conv2d(Tensor(w, device=device))
    check(got, F.conv2d(F.pad(torch.tensor(x), (0, -1, 1, -2)), torch.tensor(w)), atol=1e-5)
    check_grad(device, lambda a, b: a.pad((-1, -1, -1, -1)).conv2d(b),
               lambda a, b: F.conv2d(a[..., 1:-1, 1:-1], b), [x, w], atol=1e-5)


def test_conv_transpose1d_layer_matches_torch(device):
    from ember import nn

    for kw in ({}, {"stride": 2, "padding": 1, "output_padding": 1}, {"groups": 2, "dilation": 2, "bias": False}):
        layer = nn.ConvTranspose1d(4, 6, 3, **kw)
        layer.weight = layer.weight.to(device)
        layer.bias = None if layer.bias is None else layer.bias.to(device)
        ref = torch.nn.ConvTranspose1d(4, 6, 3, **kw)
        assert layer.weight.shape == tuple(ref.weight.shape)
        with torch.no_grad():
            ref.weight.copy_(torch.tensor(layer.weight.numpy()))
            if layer.bias is not None:
                ref.bias.copy_(torch.tensor(layer.bias.numpy()))
        x = q(2, 4, 5)
        check(layer(Tensor(x, device=device)), ref(torch.tensor(x)), atol=1e-5)
    bound = 1 / math.sqrt(4 * 3)  # tinygrad's init bound: in_channels * kernel (torch's: out_channels // groups)
    w = nn.ConvTranspose1d(4, 6, 3).weight.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > bound / 2


def test_contiguous_backward_and_replace(device):
    x = q(3, 1)
    check_grad(device, lambda t: (t.expand(3, 4).contiguous_backward() * 2).permute(1, 0),
               lambda t: (t.expand(3, 4) * 2).permute(1, 0), [x])
    t = Tensor([1.0, 2.0], device=device, requires_grad=True)
    y = t * 3
    assert y.replace(Tensor([5, 6], device=device)) is y
    assert y.dtype == dtypes.int32 and y.tolist() == [5, 6] and y._ctx is None  # new data, no history
    with pytest.raises(RuntimeError, match=r"\(3,\)"):
        t.replace(Tensor([1.0, 2.0, 3.0], device=device))


# --------------------------------------------------------------------------------------------------
# nn.optim.LARS and OptimizerGroup (torch has no LARS: checked against the rule written in numpy)
# --------------------------------------------------------------------------------------------------
def lars_reference(w: np.ndarray, grads: list[np.ndarray], lr: float, momentum: float, wd: float, tcoef: float,
                   classic: bool, nesterov: bool) -> np.ndarray:
    w, b = w.astype(np.float64), np.zeros_like(w, np.float64)
    for g in grads:
        r1, r2 = np.linalg.norm(w), np.linalg.norm(g)
        r = tcoef * r1 / (r2 + wd * r1) if tcoef and r1 > 0 and r2 > 0 else 1.0
        g = g + wd * w
        if classic:
            g = g * r * lr
        if momentum:
            b = momentum * b + g
            g = g + momentum * b if nesterov else b
        if not classic:
            g = g * r * lr
        w = w - g
    return w


@pytest.mark.parametrize("kw", [{}, {"classic": False, "nesterov": True}, {"momentum": 0.0, "tcoef": 0.0}],
                         ids=str)
def test_lars_matches_its_rule(device, kw):
    from ember import nn

    w0, target = q(4, 3), q(4, 3)
    p = Tensor(w0, device=device)
    opt = nn.optim.LARS([p], lr=0.5, weight_decay=0.01, **kw)
    grads = []
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad()
            ((p - Tensor(target, device=device)) ** 2).sum().backward()
            grads.append(p.grad.numpy().astype(np.float64))
            opt.step()
    args = {"momentum": 0.9, "tcoef": 0.001, "classic": True, "nesterov": False} | kw
    want = lars_reference(w0, grads, 0.5, args["momentum"], 0.01, args["tcoef"], args["classic"], args["nesterov"])
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(p.numpy(), w0)


def test_optimizer_group_steps_every_member(device):
    from ember import nn

    a, b = Tensor(q(3), device=device), Tensor(q(2), device=device)
    ta, tb = torch.tensor(a.numpy(), requires_grad=True), torch.tensor(b.numpy(), requires_grad=True)
    group = nn.optim.OptimizerGroup(nn.optim.SGD([a], lr=0.1), nn.optim.Adam([b], lr=0.01))
    tga, tgb = torch.optim.SGD([ta], lr=0.1), torch.optim.Adam([tb], lr=0.01)
    assert isinstance(group[1], nn.optim.Adam) and group.params == [a, b]
    for _ in range(2):
        group.zero_grad()
        ((a * a).sum() + (b * 3).sum()).backward()
        group.step()
        tga.zero_grad(), tgb.zero_grad()
        ((ta * ta).sum() + (tb * 3).sum()).backward()
        tga.step(), tgb.step()
    # Adam's update divides by sqrt(v) + eps: a fused multiply-add (CUDA contracts them) moves the last bits
    np.testing.assert_allclose(a.numpy(), ta.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-5)
    state = group.state_dict()
    assert {"0.lr", "1.lr", "1.m.0"} <= set(state)
    group.load_state_dict(state)
    with pytest.raises(TypeError):
        nn.optim.OptimizerGroup()
