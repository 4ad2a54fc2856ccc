"""``ember.function`` (tinygrad's ``@function``): one reusable call, its inputs found in its arguments, implicit
inputs refused, kernels compiled once, gradients through it, ``precompile=``, and use under TinyJit."""
from __future__ import annotations

import numpy as np
import pytest

from ember import GlobalCounters, Tensor, TinyJit, function, nn


def _arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class _Model:
    def __init__(self, device: str):
        self.l1 = nn.Linear(3, 4)
        self.l1.weight = Tensor(_arr(4, 3, seed=1), device=device)
        self.l1.bias = Tensor(_arr(4, seed=2), device=device)

    @function
    def __call__(self, x: Tensor) -> Tensor:
        return self.l1(x).relu()

    def plain(self, x: Tensor) -> Tensor:
        return self.l1(x).relu()


def test_import_forms():
    import ember
    from ember.function import function as from_module

    assert from_module is function is ember.function


def test_model_call_gives_the_undecorated_values(device):
    m = _Model(device)
    x = Tensor(_arr(2, 3, seed=3), device=device)
    want = np.maximum(_arr(2, 3, seed=3) @ _arr(4, 3, seed=1).T + _arr(4, seed=2), 0)
    np.testing.assert_allclose(m(x).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.plain(x).numpy(), want, rtol=1e-5, atol=1e-6)


def test_tensors_inside_dicts_lists_and_objects_are_inputs(device):
    @function
    def f(p: dict) -> Tensor:
        return p["a"] * p["b"][0] + p["b"][1] * p["o"].t

    class Holder:
        pass

    for scale in (1.0, 2.0):  # the second call reuses the first's trace with other tensors in place
        h = Holder()
        h.t = Tensor([2.0, 3.0], device=device) * scale
        got = f({"a": Tensor([1.0, 2.0], device=device), "b": [Tensor([3.0, 4.0], device=device),
                                                            Tensor([5.0, 6.0], device=device)], "o": h})
        np.testing.assert_allclose(got.numpy(), [3 + 10 * scale, 8 + 18 * scale])
    assert f.runs == 1


def test_implicit_tensor_is_refused_naming_it(device):
    w = Tensor([1.0, 2.0, 3.0], device=device).realize()

    @function
    def f(a: Tensor) -> Tensor:
        return a + w

    # tinygrad 0.14 gives RuntimeError "function f has 1 implicit buffer(s), but allow_implicit=False\n  0: ..."
    with pytest.raises(RuntimeError, match=r"function .*f has 1 implicit buffer\(s\), but allow_implicit=False"
                                           r"(.|\n)*w \(closure\)"):
        f(Tensor([1.0, 1.0, 1.0], device=device))

    @function(allow_implicit=True)
    def g(a: Tensor) -> Tensor:
        return a + w

    np.testing.assert_allclose(g(Tensor([1.0, 1.0, 1.0], device=device)).numpy(), [2, 3, 4])
    w.assign(Tensor([10.0, 20.0, 30.0], device=device)).realize()  # an allowed implicit input is read afresh
    np.testing.assert_allclose(g(Tensor([1.0, 1.0, 1.0], device=device)).numpy(), [11, 21, 31])


def test_an_attribute_of_an_object_not_passed_is_implicit(device):
    m = _Model(device)

    @function
    def f(x: Tensor) -> Tensor:
        return m.plain(x)

    with pytest.raises(RuntimeError, match=r"2 implicit buffer\(s\)(.|\n)*m\.l1\.weight \(closure\)"):
        f(Tensor(_arr(2, 3), device=device))


def test_kernels_compiled_once_and_python_run_once(device):
    m = _Model(device)
    m(Tensor(_arr(2, 3, seed=10), device=device)).numpy()
    runs, built = _Model.__call__.runs, GlobalCounters.kernels_compiled
    for seed in (11, 12, 13):
        x = _arr(2, 3, seed=seed)
        got = m(Tensor(x, device=device)).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ _arr(4, 3, seed=1).T + _arr(4, seed=2), 0), rtol=1e-5,
                                   atol=1e-6)
    assert GlobalCounters.kernels_compiled == built
    assert _Model.__call__.runs == runs  # the traced graph is reused: the function's Python did not run again


def test_new_structure_traces_again(device):
    @function
    def f(a: Tensor, k: float) -> Tensor:
        return a * k

    a = Tensor([1.0, 2.0], device=device)
    np.testing.assert_allclose(f(a, 3).numpy(), [3, 6])
    np.testing.assert_allclose(f(a, 4).numpy(), [4, 8])  # a non-tensor argument is part of the structure
    np.testing.assert_allclose(f(Tensor([1.0, 2.0, 3.0], device=device), 4).numpy(), [4, 8, 12])
    np.testing.assert_allclose(f(Tensor([[1.0, 2.0], [3.0, 4.0]], device=device).T[0], 2).numpy(), [2, 6])
    assert f.runs == 4


def test_gradients_equal_the_undecorated_ones(device):
    m = _Model(device)
    x = Tensor(_arr(2, 3, seed=5), device=device)
    targets = (m.l1.weight, m.l1.bias, x)
    want = [g.numpy() for g in (m.plain(x) * 3).sum().gradient(*targets)]
    for _ in range(2):  # the second call's gradient comes from the reused trace
        got = [g.numpy() for g in (m(x) * 3).sum().gradient(*targets)]
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_backward_fills_grad_like_the_undecorated_call(device):
    def grads(call: str) -> list[np.ndarray]:
        m = _Model(device)
        for p in (m.l1.weight, m.l1.bias):
            p.requires_grad_()
        x = Tensor(_arr(2, 3, seed=6), device=device)
        (getattr(m, call)(x) ** 2).mean().backward()
        return [m.l1.weight.grad.numpy(), m.l1.bias.grad.numpy()]

    for w, g in zip(grads("plain"), grads("__call__")):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_tuple_results_and_refused_result_types(device):
    @function
    def two(a: Tensor) -> tuple[Tensor, Tensor]:
        return a + 1, a * 2

    r = two(Tensor([1.0, 2.0], device=device))
    assert isinstance(r, tuple) and len(r) == 2
    np.testing.assert_allclose(r[0].numpy(), [2, 3])
    np.testing.assert_allclose(r[1].numpy(), [2, 4])

    @function
    def as_list(a: Tensor) -> list[Tensor]:
        return [a + 1]

    # tinygrad 0.14 gives RuntimeError "function return type <class 'list'> not supported"
    with pytest.raises(RuntimeError, match="function return type <class 'list'> not supported"):
        as_list(Tensor([1.0], device=device))


def test_realizing_inside_is_refused(device):
    @function
    def f(a: Tensor) -> Tensor:
        return (a * 2).realize()

    with pytest.raises(RuntimeError, match="realized a tensor while it was traced"):
        f(Tensor([1.0, 2.0], device=device))


def test_precompile_makes_a_boundary(device):
    def body(a: Tensor) -> Tensor:
        return (a * 2).sum()

    counts = []
    for fn in (function(body), function(precompile=True)(body)):
        x = Tensor([1.0, 2.0], device=device).realize()
        GlobalCounters.reset()
        out = (fn(x) + 1).realize()
        counts.append(GlobalCounters.kernel_count)
        assert out.item() == 7.0
    assert counts[0] == 1 and counts[1] == 2  # fused into the caller / its own kernel, then the caller's


def test_assign_into_an_argument_is_repeated_each_call(device):
    @function
    def step(a: Tensor, state: Tensor) -> Tensor:
        state.assign(state + a.detach())  # a value with no gradient history: no old value to keep
        return state * 2

    state = Tensor([0.0, 0.0], device=device, requires_grad=False).realize()
    for i in range(1, 4):
        np.testing.assert_allclose(step(Tensor([1.0, 2.0], device=device), state).numpy(), [2 * i, 4 * i])
        np.testing.assert_allclose(state.numpy(), [i, 2 * i])
    assert step.runs == 1


def test_random_numbers_inside_are_fresh_each_call(device):
    @function
    def noisy(a: Tensor) -> Tensor:
        return a + Tensor.rand(4, device=device)

    z = Tensor.zeros(4, device=device).contiguous()
    first, second = noisy(z).numpy(), noisy(z).numpy()
    assert not np.array_equal(first, second)
    assert ((0 <= first) & (first < 1)).all() and ((0 <= second) & (second < 1)).all()


def test_batchnorm_training_inside_updates_running_stats(device):
    def run(decorated: bool) -> tuple[np.ndarray, np.ndarray]:
        bn = nn.BatchNorm(3)
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            setattr(bn, name, getattr(bn, name).to(device).realize())
        call = function(lambda m, x: m(x)) if decorated else (lambda m, x: m(x))
        with Tensor.train():
            for seed in (20, 21):
                out = call(bn, Tensor(_arr(4, 3, seed=seed) * 2 + 1, device=device)).numpy()
        return out, bn.running_mean.numpy()

    (out_p, mean_p), (out_f, mean_f) = run(False), run(True)
    np.testing.assert_allclose(out_f, out_p, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean_f, mean_p, rtol=1e-5, atol=1e-6)
    assert not np.allclose(mean_f, 0)


def test_nested_functions(device):
    @function
    def inner(a: Tensor) -> Tensor:
        return a * 2

    @function
    def outer(a: Tensor) -> Tensor:
        return inner(a) + 1

    x = Tensor([1.0, 2.0], device=device)
    np.testing.assert_allclose(outer(x).numpy(), [3, 5])
    np.testing.assert_allclose(outer(x * 1).numpy(), [3, 5])
    np.testing.assert_allclose((outer(x) * x).sum().gradient(x)[0].numpy(), [5, 9])  # 4x + 1


def test_works_under_tinyjit(device):
    m = _Model(device)
    step = TinyJit(lambda x: m(x).realize())
    for seed in range(4):
        x = _arr(2, 3, seed=30 + seed)
        got = step(Tensor(x, device=device)).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ _arr(4, 3, seed=1).T + _arr(4, seed=2), 0), rtol=1e-5,
                                   atol=1e-6)
    assert step.captured is not None


def test_uncomparable_arguments_run_the_function_each_call(device):
    @function
    def f(a: Tensor, table: np.ndarray) -> Tensor:
        return a * float(table.sum())

    a = Tensor([1.0, 2.0], device=device)
    np.testing.assert_allclose(f(a, np.array([1.0, 2.0])).numpy(), [3, 6])
    np.testing.assert_allclose(f(a, np.array([4.0, 1.0])).numpy(), [5, 10])  # not baked into a trace
    assert f.runs == 2
    w = Tensor([1.0, 1.0], device=device).realize()
    with pytest.raises(RuntimeError, match=r"1 implicit buffer\(s\)(.|\n)*w \(closure\)"):
        function(lambda a, t: a + w)(a, np.zeros(1))


def test_grad_fxn_is_refused():
    with pytest.raises(NotImplementedError, match="grad_fxn"):
        function(lambda a: a, grad_fxn=lambda *g: g)
