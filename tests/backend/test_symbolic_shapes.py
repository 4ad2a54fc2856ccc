"""Symbolic sizes: tensors whose shape holds a bound Variable (tinygrad's test_symbolic_ops and
test_symbolic_jit are the model), checked against numpy for several values on every backend device.

A size that depends on a variable is read by the kernels at run time: one compiled kernel serves every
value, a realized result lives in a buffer sized for the variable's maximum, and ``numpy()`` gives the
bound size.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import GlobalCounters, Tensor, TinyJit, Variable, dtypes
from ember.codegen.opts import Opt, OptError, apply_opts
from ember.device.registry import Device

VALUES = (1, 4, 10)


def _arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- movement ------------------------------------------------------------------------------------------

def test_shrink_and_slice_to_a_variable_length(device):
    a = _arr(10, 6)
    x = Tensor(a, device=device).realize()
    v = Variable("n", 1, 10)
    for n in VALUES:
        vn = v.bind(n)
        assert x[:vn].shape[1] == 6 and x[:vn].shape[0] is vn.bound_uop
        np.testing.assert_array_equal(x[:vn].numpy(), a[:n])
        np.testing.assert_array_equal(x.shrink(((0, vn), None)).numpy(), a[:n])
        np.testing.assert_array_equal(x[10 - vn:].numpy(), a[10 - n:])  # the start moves, the length follows


def test_cache_prefix_up_to_a_position(device):
    """``cache[:, :pos + 1]``: a length one more than the variable."""
    a = _arr(2, 9, 3)
    cache = Tensor(a, device=device).realize()
    pos = Variable("pos", 0, 8)
    for p in (0, 3, 8):
        got = cache[:, :pos.bind(p) + 1]
        np.testing.assert_array_equal(got.numpy(), a[:, :p + 1])
        np.testing.assert_allclose((got * 2).sum(1).numpy(), (a[:, :p + 1] * 2).sum(1), rtol=1e-5)


def test_reshape_to_and_between_symbolic_shapes(device):
    v = Variable("n", 1, 10)
    for n in VALUES:
        vn = v.bind(n)
        a = _arr(n, 4, seed=n)
        x = Tensor(a, device=device).reshape(vn, 4)  # a plain tensor of the bound size becomes symbolic
        np.testing.assert_array_equal(x.numpy(), a)
        np.testing.assert_array_equal(x.reshape(vn * 4).numpy(), a.reshape(-1))
        np.testing.assert_array_equal(x.reshape(vn, 2, 2).permute(2, 0, 1).numpy(), a.reshape(n, 2, 2)
                                      .transpose(2, 0, 1))
        np.testing.assert_array_equal(x.reshape(1, vn, 4).numpy(), a.reshape(1, n, 4))
        np.testing.assert_array_equal(x.T.numpy(), a.T)
        np.testing.assert_array_equal((x.T + 0).numpy(), a.T)


def test_gradient_through_symbolic_sizes(device):
    a = _arr(7, 4)
    v = Variable("n", 1, 10)
    x = Tensor(a, device=device, requires_grad=True)
    y = x.reshape(v.bind(7), 4)
    assert repr(y) == f"<Tensor (n=7, 4) dtypes.float on {device}>"
    (y.exp() * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(a) * 2, rtol=1e-5)
    z = Tensor(_arr(10, 4), device=device, requires_grad=True)
    weights = Tensor(_arr(10, 4, seed=3), device=device)
    (z[:v.bind(3)].softmax(0) * weights[:v.bind(3)]).sum().backward()
    w = _arr(10, 4, seed=3)[:3]
    s = np.exp(z.numpy()[:3] - z.numpy()[:3].max(0))
    s /= s.sum(0)
    want = np.zeros((10, 4), np.float32)
    want[:3] = s * (w - (s * w).sum(0))
    np.testing.assert_allclose(z.grad.numpy(), want, rtol=1e-4, atol=1e-6)


def test_pad_by_a_variable(device):
    b = _arr(3, 5)
    v = Variable("n", 0, 6)
    for n in (0, 2, 6):
        vn = v.bind(n)
        np.testing.assert_array_equal(Tensor(b, device=device).pad(((0, vn), None)).numpy(),
                                      np.pad(b, ((0, n), (0, 0))))
        np.testing.assert_array_equal(Tensor(b, device=device).pad((None, (vn, 1)), value=2.0).numpy(),
                                      np.pad(b, ((0, 0), (n, 1)), constant_values=2.0))
        # a tensor of symbolic size padded by a constant
        a = _arr(8, 2)
        np.testing.assert_array_equal(Tensor(a, device=device)[:vn].pad(((1, 1), (0, 0))).numpy(),
                                      np.pad(a[:n], ((1, 1), (0, 0))))


def test_expand_and_full_of_symbolic_sizes(device):
    v = Variable("n", 1, 10)
    for n in VALUES:
        vn = v.bind(n)
        np.testing.assert_array_equal(Tensor.ones(vn, 3, device=device).numpy(), np.ones((n, 3), np.float32))
        row = _arr(1, 3)
        np.testing.assert_array_equal(Tensor(row, device=device).expand(vn, 3).numpy(), np.repeat(row, n, 0))
        np.testing.assert_array_equal((Tensor.zeros(vn, device=device) + vn).numpy(), np.full(n, n, np.float32))


def test_two_variables_and_cat_along_a_symbolic_axis(device):
    a, b = _arr(10, 8), _arr(8, 10, seed=1)
    A, B = Tensor(a, device=device).realize(), Tensor(b, device=device).realize()
    vi, vj = Variable("i", 1, 10), Variable("j", 1, 8)
    for n, m in ((1, 8), (3, 5), (10, 1)):
        i, j = vi.bind(n), vj.bind(m)
        np.testing.assert_allclose((A[:i, :j] @ B[:j, :i]).numpy(), a[:n, :m] @ b[:m, :n], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(A[:i].cat(A[:2], dim=0).numpy(), np.concatenate([a[:n], a[:2]]))
        # i + j and j + i are one size
        np.testing.assert_array_equal(A[:i].cat(A[:j], dim=0).sum(0).numpy(),
                                      np.concatenate([a[:n], a[:m]]).sum(0))


# --- elementwise, reductions, matmul, attention ------------------------------------------------------

def test_elementwise_and_reductions_over_a_variable_axis(device):
    a = _arr(10, 4)
    x = Tensor(a, device=device).realize()
    v = Variable("n", 2, 10)
    for n in (2, 5, 10):
        s = x[:v.bind(n)]
        np.testing.assert_allclose((s * 3 - 1).exp().numpy(), np.exp(a[:n] * 3 - 1), rtol=1e-5)
        np.testing.assert_allclose(s.sum(0).numpy(), a[:n].sum(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.sum(1).numpy(), a[:n].sum(1), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(s.max(0).numpy(), a[:n].max(0))
        np.testing.assert_array_equal(s.min(1).numpy(), a[:n].min(1))
        np.testing.assert_allclose(s.sum().numpy(), a[:n].sum(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s.mean(0).numpy(), a[:n].mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.var(0).numpy(), a[:n].var(0, ddof=1), rtol=1e-4, atol=1e-6)


def test_matmul_with_a_variable_k(device):
    q, k = _arr(2, 10), _arr(10, 6, seed=1)
    Q, K = Tensor(q, device=device).realize(), Tensor(k, device=device).realize()
    v = Variable("k", 1, 10)
    for n in VALUES:
        vn = v.bind(n)
        np.testing.assert_allclose((Q[:, :vn] @ K[:vn]).numpy(), q[:, :n] @ k[:n], rtol=1e-4, atol=1e-5)
        # and a variable output dim
        np.testing.assert_allclose((K[:vn] @ K[:vn].T).numpy(), k[:n] @ k[:n].T, rtol=1e-4, atol=1e-5)


def test_softmax_attention_over_a_variable_length(device):
    d = 8
    q, ck, cv = _arr(2, d), _arr(12, d, seed=1), _arr(12, d, seed=2)
    Q, K, V = (Tensor(t, device=device).realize() for t in (q, ck, cv))
    v = Variable("len", 1, 12)
    for n in (1, 5, 12):
        vn = v.bind(n)
        att = (Q @ K[:vn].T / np.sqrt(d)).softmax(-1)
        w = _softmax(q @ ck[:n].T / np.sqrt(d))
        np.testing.assert_allclose(att.numpy(), w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose((att @ V[:vn]).numpy(), w @ cv[:n], rtol=1e-5, atol=1e-6)


def test_scaled_dot_product_attention_with_symbolic_keys(device):
    """tinygrad's idiom: keys and values of a plain size reshaped to a bound one."""
    vi = Variable("i", 1, 10)
    q = _arr(2, 1, 4, 8)
    for i in (1, 4, 10):
        k, v = _arr(2, i, 4, 8, seed=i), _arr(2, i, 4, 8, seed=20 + i)

        def f(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return Tensor.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

        tq, tk, tv = (Tensor(t, device=device) for t in (q, k, v))
        got = f(tq, tk.reshape(2, vi.bind(i), 4, 8), tv.reshape(2, vi.bind(i), 4, 8)).numpy()
        scores = q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1) / np.sqrt(8)
        np.testing.assert_allclose(got, _softmax(scores) @ v.transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-6)


def test_cat_of_two_variables_along_dim1(device):
    vi, vj = Variable("i", 1, 10), Variable("j", 1, 10)
    for i, j in ((1, 1), (2, 5), (10, 3)):
        a, b = _arr(3, i, seed=i), _arr(3, j, seed=20 + j)
        got = Tensor(a, device=device).reshape(3, vi.bind(i)).cat(Tensor(b, device=device).reshape(3, vj.bind(j)),
                                                                  dim=1)
        np.testing.assert_array_equal(got.numpy(), np.concatenate([a, b], 1))


# --- one kernel for every value ------------------------------------------------------------------------

def test_one_kernel_serves_every_value(device):
    a = _arr(10, 4)
    x = Tensor(a, device=device).realize()
    v = Variable("n", 1, 10)
    asts = []
    for i, n in enumerate(VALUES):
        out = (x[:v.bind(n)] * 2).sum(0)
        (si,) = out.schedule()
        asts.append(si.ast)
        assert si.var_vals == (("n", n),)
        if i == 1:
            GlobalCounters.reset()
        np.testing.assert_allclose(out.numpy(), (a[:n] * 2).sum(0), rtol=1e-5)
    assert asts[0] is asts[1] is asts[2]  # the values are stripped from the kernel
    assert GlobalCounters.kernels_compiled == 0


def test_realize_into_a_buffer_sized_for_the_maximum(device):
    a = _arr(16, 3)
    v = Variable("n", 1, 16)
    out = (Tensor(a, device=device)[:v.bind(5)] + 1).realize()
    from ember.ir.lazy import base_of, buffers

    assert buffers[base_of(out.lazydata)].size == 16 * 3
    np.testing.assert_allclose(out.numpy(), a[:5] + 1, rtol=1e-6)
    assert out.numpy().shape == (5, 3)


# --- TinyJit ----------------------------------------------------------------------------------------------

def test_jit_replays_attention_for_other_lengths_without_compiling(device):
    d = 8
    ck, cv = _arr(16, d, seed=1), _arr(16, d, seed=2)
    K, V = Tensor(ck, device=device).realize(), Tensor(cv, device=device).realize()

    @TinyJit
    def attend(q: Tensor, n: Variable) -> Tensor:
        return (q @ K[:n].T / np.sqrt(d)).softmax(-1) @ V[:n]

    @TinyJit
    def prefix(n: Variable) -> Tensor:  # a result whose size is the variable
        return K[:n] * 2

    v = Variable("n", 1, 16)
    for i, n in enumerate((3, 5, 1, 9, 16, 2)):
        if i == 2:
            GlobalCounters.reset()
        q = _arr(1, d, seed=10 + n)
        got = attend(Tensor(q, device=device), v.bind(n)).numpy()
        np.testing.assert_allclose(got, _softmax(q @ ck[:n].T / np.sqrt(d)) @ cv[:n], rtol=1e-5, atol=1e-6)
        p = prefix(v.bind(n)).numpy()
        assert p.shape == (n, d)
        np.testing.assert_array_equal(p, ck[:n] * 2)
    assert GlobalCounters.kernels_compiled == 0
    assert attend.cnt == 6 and attend.captured is not None


def test_jit_takes_the_value_from_a_symbolic_input_shape(device):
    """tinygrad's idiom: a tensor reshaped to a bound size is the input, no Variable argument."""
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a @ b).relu()

    vi = Variable("i", 1, 10)
    compiled = 0
    for k, i in enumerate((3, 5, 2, 7, 10, 1)):
        a, b = _arr(4, i, seed=i), _arr(i, 6, seed=20 + i)
        v = vi.bind(i)
        # inputs in buffers sized for the maximum (made before counting: their copies are not the jit's)
        ta = Tensor(a, device=device).reshape(4, v).contiguous().realize()
        tb = Tensor(b, device=device).reshape(v, 6).contiguous().realize()
        before = GlobalCounters.kernels_compiled
        out = f(ta, tb).numpy()
        if k >= 2:
            compiled += GlobalCounters.kernels_compiled - before
        np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
    assert compiled == 0


def test_jit_assigns_into_a_prefix_of_variable_length(device):
    cache = Tensor.zeros(10, 4, device=device).contiguous().realize()
    src = np.arange(40, dtype=np.float32).reshape(10, 4)
    s = Tensor(src, device=device).realize()
    v = Variable("n", 1, 10)

    @TinyJit
    def step(n: Variable) -> Tensor:
        cache[:n].assign(s[:n] * 2).realize()
        return cache.sum(0)

    want = np.zeros((10, 4), np.float32)
    for k, n in enumerate((3, 5, 2, 7)):
        if k == 2:
            GlobalCounters.reset()
        want[:n] = src[:n] * 2
        np.testing.assert_array_equal(step(v.bind(n)).numpy(), want.sum(0))
    assert GlobalCounters.kernels_compiled == 0
    np.testing.assert_array_equal(cache.numpy(), want)


# --- errors ----------------------------------------------------------------------------------------------

def test_unbound_and_out_of_range_variables_are_refused(device):
    x = Tensor(_arr(10, 4), device=device)
    v = Variable("n", 1, 10)
    with pytest.raises(ValueError, match="'n' must be bound"):
        x[:v]
    with pytest.raises(ValueError, match=r"'n': value 11 is outside \[1, 10\]"):
        v.bind(11)
    with pytest.raises(ValueError, match=r"'n': value 0 is outside \[1, 10\]"):
        x[:v.bind(0)]
    # n can reach 10 > 8: accepted as in tinygrad while the bound value fits (read through a masked padding),
    # refused for a value that does not
    np.testing.assert_array_equal(Tensor(_arr(8, 4), device=device)[:v.bind(3)].numpy(), _arr(8, 4)[:3])
    with pytest.raises(Exception, match="out of bounds"):
        Tensor(_arr(8, 4), device=device)[:v.bind(9)]


def test_two_bindings_of_one_variable_are_refused(device):
    x = Tensor(_arr(10, 4), device=device)
    v = Variable("n", 1, 10)
    with pytest.raises(RuntimeError, match="variable 'n' is bound to both [34] and [34]"):
        x[:v.bind(3)] + x[:v.bind(4)]
    with pytest.raises(ValueError, match="variable 'n' is bound to both [34] and [34]"):
        (x[:v.bind(3)].sum(0) + x[:v.bind(4)].sum(0)).numpy()


def test_unsupported_symbolic_ranges_and_scans_name_the_variable(device):
    v = Variable("n", 1, 10).bind(3)
    with pytest.raises(NotImplementedError, match="arange.*depends on a Variable"):
        Tensor.arange(v, device=device)
    with pytest.raises(NotImplementedError, match="cumulative sum along axis 0, whose size n=3"):
        Tensor(_arr(10, 4), device=device)[:v].cumsum(0)


def test_matmul_of_two_bindings_names_them(device):
    vi = Variable("i", 1, 10)
    a = Tensor(_arr(3, 4), device=device).reshape(3, vi.bind(4))
    b = Tensor(_arr(7, 5), device=device).reshape(vi.bind(7), 5)
    with pytest.raises(RuntimeError, match=r"\(3xi=4 and i=7x5\): variable 'i' is bound to both 4 and 7"):
        a @ b


def test_bad_symbolic_reshapes_name_the_sizes(device):
    x = Tensor(_arr(10, 4), device=device)[:Variable("n", 1, 10).bind(3)]
    with pytest.raises(Exception, match=r"cannot reshape \(n=3, 4\) to \(12,\)"):
        x.reshape(12)
    with pytest.raises(Exception, match="-1"):
        x.reshape(-1)


def test_opts_refuse_to_split_a_variable_axis(device):
    x = Tensor(_arr(10, 4), device=device)[:Variable("n", 1, 10).bind(8)]
    (si,) = (x * 2).schedule()
    renderer = Device[device].renderer
    with pytest.raises(OptError, match="depends on a variable"):
        apply_opts(si.ast, renderer, [Opt("UPCAST", 0, 2)])
    apply_opts(si.ast, renderer, [Opt("UPCAST", 1, 2)])  # the fixed axis still splits


def test_fixed_axes_of_a_symbolic_kernel_are_still_tiled(device):
    """The heuristic plans the kernel at the variable's maximum; its splits of fixed-size axes are kept."""
    from ember.codegen import choose_opts
    from ember.codegen.opts import kernel_shape

    x, w = _arr(64, 32), _arr(32, 48, seed=1)
    X, W = Tensor(x, device=device).realize(), Tensor(w, device=device).realize()
    v = Variable("n", 1, 64)
    (si,) = (X[:v.bind(7)] @ W).schedule()
    opts = choose_opts(si.ast, Device[device].renderer)
    full = kernel_shape(si.ast).full_shape
    assert opts and all(isinstance(full[o.axis], int) for o in opts)
    for n in (1, 7, 33, 64):
        np.testing.assert_allclose((X[:v.bind(n)] @ W).numpy(), x[:n] @ w, rtol=1e-4, atol=1e-5)


def test_symbolic_int_tensors_are_int32(device):
    n = Variable("n", 1, 10).bind(6)
    t = Tensor.zeros(3, dtype=dtypes.int32, device=device) + n
    assert t.dtype == dtypes.int32
    np.testing.assert_array_equal(t.numpy(), [6, 6, 6])
