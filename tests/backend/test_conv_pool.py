"""Convolutions, pooling and interpolation against torch.nn.functional: values, shapes, dtypes, gradients,
errors and kernel counts.

Convolution inputs are random multiples of 1/8, so every product and partial sum is exact in float32;
pooling inputs are continuous so that maxima are unique (torch sends a tied max's gradient to one element).
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from backend_utils import compare_with_torch, raises_like, tg_index

from ember import GlobalCounters, Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(11)


def q(*shape: int) -> np.ndarray:
    """Random float32 multiples of 1/8 in [-1, 1]."""
    return (rng.integers(-8, 9, size=shape) / 8).astype(np.float32)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# the upstream gradient of a comparison is drawn like the other inputs of this module
compare = partial(compare_with_torch, upstream=q)

TORCH_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}
TORCH_CONV_T = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}

# --------------------------------------------------------------------------------------------------
# conv2d (any number of spatial dims)
# --------------------------------------------------------------------------------------------------
CONV_CASES = [
    ((2, 4, 6, 5), (6, 4, 3, 3), {}),
    ((1, 4, 6, 5), (2, 4, 3, 3), {"bias": False}),
    ((1, 4, 7, 6), (6, 2, 3, 2), {"groups": 2, "stride": 2, "padding": 1}),
    ((2, 3, 7, 7), (4, 3, 3, 3), {"dilation": 2, "padding": (2, 1)}),
    ((1, 4, 8, 7), (4, 1, 3, 3), {"groups": 4, "stride": (2, 3), "dilation": (1, 2), "padding": 2}),
    ((2, 2, 5, 5), (3, 2, 1, 1), {"stride": 2}),
    ((2, 3, 4, 4), (2, 3, 4, 4), {}),
    ((2, 2, 9), (3, 2, 3), {"stride": 2, "padding": 1}),
    ((1, 2, 4, 4, 3), (2, 2, 2, 2, 2), {"padding": 1}),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CONV_CASES])
def test_conv2d(device, xs, ws, kw):
    kw = dict(kw)
    bias = kw.pop("bias", True)
    tconv = TORCH_CONV[len(xs)]
    compare(device, lambda x, w, b: x.conv2d(w, b, **kw), lambda x, w, b: tconv(x, w, b, **kw),
            [q(*xs), q(*ws), q(ws[0]) if bias else None])


def test_conv2d_noncontiguous(device):
    compare(device, lambda x, w, b: x.conv2d(w, b, padding=1), lambda x, w, b: F.conv2d(x, w, b, padding=1),
            [q(2, 3, 5, 4), q(4, 3, 3, 3), q(4)], ["permuted", "flipped", "contiguous"])


def test_conv2d_padding_forms(device):
    x, w = q(1, 2, 6, 5), q(3, 2, 3, 2)
    # flat torch order (left, right, top, bottom)
    compare(device, lambda x, w: x.conv2d(w, padding=(1, 0, 2, 1)), lambda x, w: F.conv2d(F.pad(x, (1, 0, 2, 1)), w),
            [x, w])
    for pad in ("same", "valid"):
        compare(device, lambda x, w, pad=pad: x.conv2d(w, padding=pad, dilation=(1, 2)),
                lambda x, w, pad=pad: F.conv2d(x, w, padding=pad, dilation=(1, 2)), [x, w], backward=False)


def test_conv2d_unbatched_and_dtypes(device):
    compare(device, lambda x, w: x.conv2d(w, padding=1), lambda x, w: F.conv2d(x, w, padding=1),
            [q(2, 4, 4), q(3, 2, 3, 3)])
    compare(device, lambda x, w: x.conv2d(w), lambda x, w: F.conv2d(x, w),
            [q(1, 2, 4, 4).astype(np.float64), q(3, 2, 3, 3).astype(np.float64)], backward=False)
    xi = rng.integers(-3, 4, size=(1, 2, 4, 4)).astype(np.int32)
    wi = rng.integers(-3, 4, size=(2, 2, 2, 2)).astype(np.int32)
    out = Tensor(xi).conv2d(Tensor(wi))
    assert out.dtype == dtypes.int32
    np.testing.assert_array_equal(out.numpy(), F.conv2d(torch.tensor(xi, dtype=torch.float64),
                                                        torch.tensor(wi, dtype=torch.float64)).numpy())


def test_conv_and_pool_empty_batch(device):
    x = np.zeros((0, 3, 5, 5), np.float32)
    for fn, tfn in [(lambda t: t.conv2d(Tensor(q(4, 3, 3, 3), device=device), padding=1),
                     lambda t: F.conv2d(t, torch.zeros(4, 3, 3, 3), padding=1)),
                    (lambda t: t.max_pool2d(2), lambda t: F.max_pool2d(t, 2)),
                    (lambda t: t.avg_pool2d(3, 1, padding=1), lambda t: F.avg_pool2d(t, 3, 1, padding=1))]:
        out, want = fn(Tensor(x, device=device)), tfn(torch.tensor(x))
        assert out.shape == tuple(want.shape) and out.numpy().shape == tuple(want.shape)


def test_conv2d_kernel_counts(device):
    x, w, b = Tensor(q(2, 3, 6, 6), device=device), Tensor(q(4, 3, 3, 3), device=device), Tensor(q(4), device=device)
    for out in (x.conv2d(w, b), x.conv2d(w, b, padding=1), x.conv2d(w, b, stride=2, dilation=2, padding=(1, 2))):
        GlobalCounters.reset()
        out.realize()
        assert GlobalCounters.kernel_count <= 2
    GlobalCounters.reset()
    x.conv2d(w, b, padding=1).realize()
    assert GlobalCounters.kernel_count == 1


def test_conv2d_cropping_padding_gradients(device):
    """Negative (cropping) padding with strides, groups and dilation: the input gradient convolves the spread
    output gradient and crops back to the input, which must land every gradient where torch puts it.

    ``conv2d`` refuses a negative padding (as torch does), but the convolution underneath takes one (a
    transposed convolution's gradient crops this way), so it is called directly."""
    from ember.frontend.conv import _conv
    from ember.frontend.util import resolve_pads

    for pad, kw in [((-1, 2, 1, -2), {"stride": (2, 1), "groups": 2, "dilation": (1, 2)}),
                    ((0, -1, -1, 0), {"stride": 3, "groups": 2})]:
        def ours(x, w, pad=pad, kw=kw):
            return _conv(x, w, None, kw["groups"], kw["stride"], kw.get("dilation", 1), resolve_pads(pad, 2), None)
        compare(device, ours, lambda x, w, pad=pad, kw=kw: F.conv2d(F.pad(x, pad), w, **kw),
                [q(2, 4, 9, 8), q(6, 2, 3, 2)])
        with pytest.raises(RuntimeError, match="negative padding"):
            Tensor(q(2, 4, 9, 8), device=device).conv2d(Tensor(q(6, 2, 3, 2), device=device), padding=pad, **kw)


def test_conv2d_second_order_gradient(device):
    """The convolution's own gradient rule is built from convolutions, so it is differentiable again."""
    x, w = q(2, 4, 6, 5), q(6, 2, 3, 3)
    tx, tw = Tensor(x, device=device, requires_grad=True), Tensor(w, device=device, requires_grad=True)
    out = tx.conv2d(tw, padding=1, groups=2, stride=(1, 2))
    (gx,) = (out * out).sum().gradient(tx)
    (gw,) = (gx * gx).sum().gradient(tw)
    px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    pout = F.conv2d(px, pw, padding=1, groups=2, stride=(1, 2))
    (pgx,) = torch.autograd.grad((pout * pout).sum(), px, create_graph=True)
    (pgw,) = torch.autograd.grad((pgx * pgx).sum(), pw)
    np.testing.assert_allclose(gw.numpy(), pgw.numpy(), rtol=1e-5, atol=1e-3)


def test_conv2d_backward_kernels(device):
    """Each gradient of a 3x3 convolution is one reduction kernel reading only its inputs: no kernel-sized (9x)
    intermediate is written and summed back."""
    x = Tensor(q(2, 3, 8, 8), device=device, requires_grad=True)
    w = Tensor(q(4, 3, 3, 3), device=device, requires_grad=True)
    out = x.conv2d(w, padding=1)
    (out * Tensor(q(2, 4, 8, 8), device=device)).sum().backward()
    assert x.grad is not None and w.grad is not None
    for grad in (x.grad, w.grad):
        GlobalCounters.reset()
        grad.realize()
        assert GlobalCounters.kernel_count == 1


#: inputs large enough (CPU: conv_pad_copy_min) that the weight gradient reads a channels-last copy of the input; the
#: first one's weight gradient sums 8 * 64 * 64 = SPLIT_REDUCE_RATIO products per weight, so the scheduler splits
#: it over the batch
LARGE_CONV_CASES = [
    ((8, 4, 64, 64), (6, 4, 3, 3), {"padding": 1}),
    ((2, 8, 64, 66), (6, 4, 3, 2), {"groups": 2, "stride": (2, 1), "padding": (1, 0)}),
    ((2, 16, 64, 64), (8, 16, 1, 1), {}),
    ((1, 4, 130, 130), (4, 4, 3, 3), {"dilation": 2}),
]


@pytest.mark.parametrize("xs,ws,kw", LARGE_CONV_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in LARGE_CONV_CASES])
def test_large_conv2d_gradients(xs, ws, kw):
    """Both gradients of convolutions over large inputs (padded, unpadded, grouped, strided, dilated) with a
    random output gradient equal torch's (CPU only: the PYTHON device takes minutes at these sizes)."""
    from ember.device import Device

    least = Device["CPU"].renderer.conv_pad_copy_min
    assert least is not None and np.prod(xs) >= least
    compare("CPU", lambda x, w: x.conv2d(w, **kw), lambda x, w: F.conv2d(x, w, **kw), [q(*xs), q(*ws)])


def test_large_conv_transpose2d_gradients():
    """A strided transposed convolution whose spread, padded input is large (the channels-last path): values and
    both gradients equal torch's."""
    kw = {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}
    compare("CPU", lambda x, w: x.conv_transpose2d(w, **kw), lambda x, w: F.conv_transpose2d(x, w, **kw),
            [q(2, 8, 40, 40), q(8, 3, 3, 3)])


def test_large_conv2d_output_layout():
    """A large convolution is computed channels-last and returned as a view in (batch, channels, *spatial)
    order: its values, its contiguous copy and what is fused after it (a bias, a relu) land where torch puts
    them."""
    x, w, b = q(2, 8, 64, 64), q(16, 8, 3, 3), q(16)
    tx, tw, tb = Tensor(x, device="CPU"), Tensor(w, device="CPU"), Tensor(b, device="CPU")
    out = tx.conv2d(tw, tb, padding=1).relu()
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), padding=1).relu().numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.contiguous().reshape(2, 16, -1).numpy(), ref.reshape(2, 16, -1), rtol=1e-5,
                               atol=1e-5)


def test_large_conv2d_weight_gradient_kernels():
    """The weight gradient of a large convolution is a channels-last copy of the input, then (split over the
    batch: 8 * 64 * 64 products per weight) the partial sums of each image and their sum: three kernels, none
    writing more than the input's size."""
    x = Tensor(q(8, 4, 64, 64), device="CPU", requires_grad=True)
    w = Tensor(q(6, 4, 3, 3), device="CPU", requires_grad=True)
    (x.conv2d(w, padding=1) * Tensor(q(8, 6, 64, 64), device="CPU")).sum().backward()
    assert w.grad is not None
    sched = w.grad.schedule()
    assert len(sched) == 3
    assert all(si.bufs[0].size <= 8 * 4 * 66 * 66 for si in sched)
    assert sched[1].bufs[0].size == 8 * 6 * 4 * 3 * 3  # one partial weight gradient per image


def test_conv2d_gradients_read_a_computed_output_gradient_stored_once():
    """An output gradient computed from several buffers (here a batch-norm-like scale and shift and a relu mask)
    is stored once: the weight gradient's reduction, which reads each of its elements once per weight of a
    channel pair, reads that buffer instead of recomputing the expression (and its inputs) in its inner loop."""
    x = Tensor(q(4, 8, 12, 12), device="CPU", requires_grad=True)
    w = Tensor(q(16, 8, 3, 3), device="CPU", requires_grad=True)
    scale, shift = Tensor(q(1, 16, 1, 1), device="CPU"), Tensor(q(1, 16, 1, 1), device="CPU")
    r = Tensor(q(4, 16, 10, 10), device="CPU")
    y = x.conv2d(w).realize()  # the forward computed: the output gradient is elementwise of four buffers
    ((y * scale + shift).relu() * r).sum().backward()
    assert w.grad is not None and x.grad is not None
    sched = w.grad.schedule(x.grad)
    grads = [si for si in sched if si.bufs[0].size in (16 * 8 * 3 * 3, 4 * 8 * 12 * 12)
             and any(u.op.name == "REDUCE_AXIS" for u in si.ast.toposort())]
    # each reads the stored output gradient and one operand (the weight, or the input's channels-last copy)
    assert len(grads) == 2 and all(len(si.bufs) == 3 for si in grads), [len(si.bufs) for si in grads]
    xn, wn, sn, hn, rn = (t.numpy() for t in (x, w, scale, shift, r))
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    ((F.conv2d(xt, wt) * torch.tensor(sn) + torch.tensor(hn)).relu() * torch.tensor(rn)).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_large_conv2d_input_gradient_pads_a_stored_gradient():
    """The input gradient of a large convolution pads a stored output gradient into its own buffer: the padding
    kernel reads the buffer through one padded view, indexed without / or % (a padded view of an expression,
    or a padded view composed over the buffer's own view, is indexed back into coordinates with them)."""
    from ember.codegen import get_program
    from ember.device import Device

    x = Tensor(q(4, 4, 64, 64), device="CPU", requires_grad=True)
    w = Tensor(q(6, 4, 3, 3), device="CPU", requires_grad=True)
    (x.conv2d(w, padding=1) * Tensor(q(4, 6, 64, 64), device="CPU")).sum().backward()
    assert x.grad is not None
    sched = x.grad.schedule()
    pads = [si for si in sched if si.bufs[0].size == 4 * 6 * 66 * 66]
    assert len(pads) == 1
    spec = get_program(pads[0].ast, Device["CPU"].renderer)
    body = spec.src[spec.src.index(f"void {spec.name}("):]
    assert "/" not in body and "%" not in body, body


CONV_ERRORS = [
    ((1, 5, 6, 6), (4, 3, 3, 3), {}),                     # channel mismatch
    ((1, 3, 2, 2), (4, 3, 3, 3), {}),                     # kernel larger than the input
    ((1, 4, 6, 6), (3, 2, 3, 3), {"groups": 2}),          # out channels not divisible by groups
    ((1, 3, 6, 6), (4, 3, 3, 3), {"groups": 0}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"stride": 0}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"dilation": 0}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"padding": (1, 2, 3)}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"padding": "same", "stride": 2}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"padding": "full"}),
    ((6, 6), (4, 3, 3, 3), {}),                           # wrong input rank
]


@pytest.mark.parametrize("xs,ws,kw", CONV_ERRORS, ids=[str(c[2]) or str(c[0]) for c in CONV_ERRORS])
def test_conv2d_errors(xs, ws, kw):
    x, w = np.zeros(xs, np.float32), np.zeros(ws, np.float32)
    raises_like(lambda: Tensor(x).conv2d(Tensor(w), **kw), lambda: F.conv2d(torch.tensor(x), torch.tensor(w), **kw))


def test_conv2d_bias_shape_error():
    x, w, b = np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32), np.zeros(5, np.float32)
    raises_like(lambda: Tensor(x).conv2d(Tensor(w), Tensor(b)),
                lambda: F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b)))


# --------------------------------------------------------------------------------------------------
# conv_transpose2d
# --------------------------------------------------------------------------------------------------
CONVT_CASES = [
    ((2, 4, 4, 3), (4, 3, 3, 2), {}),
    ((1, 4, 4, 3), (4, 3, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((2, 4, 3, 4), (4, 2, 2, 3), {"groups": 2, "stride": (1, 2), "dilation": (2, 1), "padding": (1, 0)}),
    ((1, 2, 5), (2, 3, 3), {"stride": 3, "padding": 2}),
]


@pytest.mark.parametrize("xs,ws,kw", CONVT_CASES, ids=[str(c[2]) for c in CONVT_CASES])
def test_conv_transpose2d(device, xs, ws, kw):
    tconv = TORCH_CONV_T[len(xs)]
    cout = ws[1] * kw.get("groups", 1)
    compare(device, lambda x, w, b: x.conv_transpose2d(w, b, **kw), lambda x, w, b: tconv(x, w, b, **kw),
            [q(*xs), q(*ws), q(cout)])


@pytest.mark.parametrize("xs,ws,kw", [((1, 3, 4, 4), (3, 2, 3, 3), {"stride": 2, "output_padding": 2}),
                                      ((1, 4, 4, 4), (3, 2, 3, 3), {}),
                                      ((1, 3, 4, 4), (3, 2, 3, 3), {"padding": -1})], ids=str)
def test_conv_transpose2d_errors(xs, ws, kw):
    x, w = np.zeros(xs, np.float32), np.zeros(ws, np.float32)
    raises_like(lambda: Tensor(x).conv_transpose2d(Tensor(w), **kw),
                lambda: F.conv_transpose2d(torch.tensor(x), torch.tensor(w), **kw))


# --------------------------------------------------------------------------------------------------
# max / avg pooling
# --------------------------------------------------------------------------------------------------
POOL_CASES = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 1), "ceil_mode": True},
    {"kernel_size": (3, 2), "stride": 1},
]


@pytest.mark.parametrize("kw", POOL_CASES, ids=str)
def test_max_pool2d(device, kw):
    compare(device, lambda x: x.max_pool2d(**kw), lambda x: F.max_pool2d(x, **kw), [randn(2, 3, 7, 6)])


def with_tg_indices(pair: tuple) -> tuple:
    """torch's (values, int64 indices) with the indices in tinygrad's dtype, the default int (int32)."""
    return pair[0], tg_index(pair[1])


def test_max_pool2d_dilation_indices_and_views(device):
    kw = {"kernel_size": (2, 3), "stride": (2, 1), "dilation": (2, 1), "padding": 1, "ceil_mode": True}
    compare(device, lambda x: x.max_pool2d(**kw, return_indices=True),
            lambda x: with_tg_indices(F.max_pool2d(x, **kw, return_indices=True)), [randn(1, 2, 7, 6)], ["permuted"])
    # 3-d input: (C, H, W)
    compare(device, lambda x: x.max_pool2d(3, 2, padding=1, return_indices=True),
            lambda x: with_tg_indices(F.max_pool2d(x, 3, 2, padding=1, return_indices=True)), [randn(2, 5, 5)],
            ["flipped"])
    ints = rng.integers(-50, 50, size=(1, 2, 5, 4)).astype(np.int64)
    compare(device, lambda x: x.max_pool2d(2, padding=1), lambda x: F.max_pool2d(x, 2, padding=1), [ints])


@pytest.mark.parametrize("include_pad", [True, False], ids=["include_pad", "exclude_pad"])
@pytest.mark.parametrize("kw", [c for c in POOL_CASES if "dilation" not in c][1:4], ids=str)
def test_avg_pool2d(device, kw, include_pad):
    compare(device, lambda x: x.avg_pool2d(**kw, count_include_pad=include_pad),
            lambda x: F.avg_pool2d(x, **kw, count_include_pad=include_pad), [randn(2, 3, 7, 6)])


def test_avg_pool2d_defaults_views_and_ints(device):
    compare(device, lambda x: x.avg_pool2d(), lambda x: F.avg_pool2d(x, 2), [randn(1, 2, 5, 4)], ["flipped"])
    ints = rng.integers(-50, 50, size=(1, 2, 5, 5)).astype(np.int64)
    compare(device, lambda x: x.avg_pool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
            lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False), [ints])


@pytest.mark.parametrize("name", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize("shape,kw", [((1, 3, 5, 5), {"kernel_size": 3, "padding": 2}),
                                      ((1, 3, 2, 2), {"kernel_size": 3}),
                                      ((1, 3, 5, 5), {"kernel_size": 2, "stride": 0})], ids=str)
def test_pool_errors(name, shape, kw):
    x = np.zeros(shape, np.float32)
    raises_like(lambda: getattr(Tensor(x), name)(**kw), lambda: getattr(F, name)(torch.tensor(x), **kw))


# --------------------------------------------------------------------------------------------------
# adaptive pooling
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, (3, 3), (4, 5), (2, None)], ids=str)
def test_adaptive_pools(device, size):
    x = randn(2, 3, 7, 6)
    compare(device, lambda x: x.adaptive_avg_pool2d(size), lambda x: F.adaptive_avg_pool2d(x, size), [x])
    compare(device, lambda x: x.adaptive_max_pool2d(size), lambda x: F.adaptive_max_pool2d(x, size), [x])
    compare(device, lambda x: x.adaptive_max_pool2d(size, return_indices=True),
            lambda x: with_tg_indices(F.adaptive_max_pool2d(x, size, return_indices=True)), [x], backward=False)


def test_adaptive_pool_edge_cases(device):
    out = Tensor(randn(1, 2, 4, 4), device=device).adaptive_avg_pool2d(0)
    assert out.shape == (1, 2, 0, 0)
    x = np.zeros((1, 3, 0, 4), np.float32)
    raises_like(lambda: Tensor(x).adaptive_avg_pool2d(2), lambda: F.adaptive_avg_pool2d(torch.tensor(x), 2))


# --------------------------------------------------------------------------------------------------
# interpolate
# --------------------------------------------------------------------------------------------------
INTERP_CASES = [
    ("linear", (7, 9), False), ("linear", (3, 2), False), ("linear", (7, 5), True), ("linear", (1, 3), True),
    ("nearest", (10, 8), False), ("nearest", (3, 3), False), ("nearest", (7, 5), False),
    ("nearest-exact", (7, 3), False),
]


@pytest.mark.parametrize("mode,size,align", INTERP_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in INTERP_CASES])
def test_interpolate(device, mode, size, align):
    tmode = "bilinear" if mode == "linear" else mode
    kw = {"align_corners": True} if align else {}
    compare(device, lambda x: x.interpolate(size, mode=mode, **kw),
            lambda x: F.interpolate(x, size=size, mode=tmode, **kw), [randn(1, 2, 5, 4)])


def test_interpolate_1d_views_and_ints(device):
    compare(device, lambda x: x.interpolate((7,)), lambda x: F.interpolate(x, size=7, mode="linear"),
            [randn(2, 3, 4)], ["permuted"])
    compare(device, lambda x: x.interpolate(6, mode="bilinear"), lambda x: F.interpolate(x, size=6, mode="bilinear"),
            [randn(1, 1, 4, 3)], ["flipped"])
    img = rng.integers(0, 255, size=(1, 3, 4, 5)).astype(np.uint8)
    compare(device, lambda x: x.interpolate((6, 7), mode="nearest"), lambda x: F.interpolate(x, (6, 7)), [img])


def test_interpolate_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    raises_like(lambda: Tensor(x).interpolate((5, 5), mode="nearest", align_corners=True),
                lambda: F.interpolate(torch.tensor(x), (5, 5), mode="nearest", align_corners=True))
    raises_like(lambda: Tensor(x).interpolate((5, 5), mode="cubic-ish"),
                lambda: F.interpolate(torch.tensor(x), (5, 5), mode="cubic-ish"))
