"""TinyJit: capture, replay with swapped inputs, argument checks, in-place updates, random numbers,
the memory planner and symbolic variables, on every backend device (modelled on tinygrad's test_jit)."""
from __future__ import annotations

import numpy as np
import pytest
from backend_utils import other_device

from ember import Device, GlobalCounters, JitError, Tensor, TinyJit, Variable, dtypes, jit, nn
from ember.nn import optim


def _arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- in-place assign ---------------------------------------------------------------------------------

def test_assign_writes_in_place_and_earlier_views_see_it(device):
    a = Tensor(np.arange(4, dtype=np.float32), device=device).realize()
    view = a[1:3]
    before = a.lazydata
    a.assign(a + 1).realize()
    assert a.lazydata is before  # the same buffer holds the new value
    np.testing.assert_array_equal(view.numpy(), [2, 3])


def test_assign_into_views_and_self_overlapping_values(device):
    b = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device).realize()
    b[:, 1:2].assign(Tensor([[10.0], [20.0]], device=device)).realize()
    np.testing.assert_array_equal(b.numpy(), [[0, 10, 2], [3, 20, 5]])
    t = b.permute(1, 0)
    t.assign(t * 2).realize()
    np.testing.assert_array_equal(b.numpy(), [[0, 20, 4], [6, 40, 10]])
    c = Tensor([1.0, 2.0, 3.0], device=device).realize()
    c.assign(c.flip(0)).realize()  # reads the buffer at other places than it writes: via a temporary
    np.testing.assert_array_equal(c.numpy(), [3, 2, 1])


def test_assign_ordering_and_repeats(device):
    d = Tensor([1.0, 2.0, 3.0], device=device).realize()
    e = d * 2  # reads the old value; realized together with the update it runs first
    d.assign(d + 10)
    Tensor.realize_all(d, e)
    np.testing.assert_array_equal(d.numpy(), [11, 12, 13])
    np.testing.assert_array_equal(e.numpy(), [2, 4, 6])
    d.assign(d + 1)
    d.assign(d * 2)  # two pending updates of one buffer run in order
    np.testing.assert_array_equal(d.numpy(), [24, 26, 28])
    held = []
    for _ in range(3):  # equal updates are separate writes, even while an earlier one is still referenced
        held.append(d.assign(d + 1).lazydata)
        d.realize()
    np.testing.assert_array_equal(d.numpy(), [27, 29, 31])
    x, w = Tensor([1.0, 1.0], device=device).realize(), Tensor([2.0, 3.0], device=device).realize()
    for k in range(3):  # a result computed from the old value is not reused after the update
        assert (x * w).sum().item() == 5 + 2 * k
        w.assign(w + 1).realize()


def test_assign_fuses_unless_it_reads_its_buffer_elsewhere(device):
    a, b = _arr(4, 3, seed=1), _arr(4, 3, seed=2)
    p = Tensor(_arr(3, 3), device=device).realize()
    want = p.numpy() - a.T @ b
    upd = p.assign(p - Tensor(a, device=device).T @ Tensor(b, device=device))
    assert len(upd.schedule()) == 1  # the matmul reads other buffers: it runs inside the update's kernel
    np.testing.assert_allclose(upd.numpy(), want, rtol=1e-5, atol=1e-5)
    q = Tensor(_arr(3, 3, seed=3), device=device).realize()
    want = q.numpy().T @ q.numpy()
    upd = q.assign(q.T @ q)  # reads q at other places than it writes: a temporary, then the write
    assert len(upd.schedule()) == 2
    np.testing.assert_allclose(upd.numpy(), want, rtol=1e-5, atol=1e-5)


def test_assign_keeps_gradients_right(device):
    a = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    b = (a * 1).realize()
    b.assign(b * b)  # the history of the new value reads b's old value: kept in a copy
    b.realize()
    b.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [2, 4, 6])
    np.testing.assert_array_equal(b.numpy(), [1, 4, 9])


# --- capture and replay -------------------------------------------------------------------------------

def test_capture_count_and_replay(device):
    calls = []

    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        calls.append(1)
        return (a + b).relu() * 2

    for i in range(5):
        a, b = _arr(3, 4, seed=i), _arr(3, 4, seed=10 + i)
        out = f(Tensor(a, device=device), Tensor(b, device=device))
        np.testing.assert_allclose(out.numpy(), np.maximum(a + b, 0) * 2, rtol=1e-6)
        assert f.cnt == i + 1
    assert len(calls) == 2  # run, capture; then only replays
    assert f.captured is not None and f.captured.kernel_count == 1


def test_capture_first_records_on_the_first_call(device):
    calls = []

    def fn(a: Tensor) -> Tensor:
        calls.append(1)
        return (a * 3 + 1).relu()

    f = TinyJit(fn, capture_first=True)
    a = _arr(3, 4)
    np.testing.assert_allclose(f(Tensor(a, device=device)).numpy(), np.maximum(a * 3 + 1, 0), rtol=1e-6)
    assert f.captured is not None and f.captured.kernel_count == 1 and len(calls) == 1
    for i in range(1, 3):
        a = _arr(3, 4, seed=i)
        GlobalCounters.reset()
        out = f(Tensor(a, device=device))
        assert GlobalCounters.kernel_count == 1 and GlobalCounters.kernels_compiled == 0
        np.testing.assert_allclose(out.numpy(), np.maximum(a * 3 + 1, 0), rtol=1e-6)
    assert len(calls) == 1 and f.cnt == 3  # recorded once, then replayed twice
    f.reset()
    f(Tensor(_arr(3, 4), device=device))
    assert f.captured is not None and len(calls) == 2  # reset keeps the choice: the next call records again


def test_default_runs_first_call_eagerly(device):
    f = TinyJit(lambda a: a * 2)
    f(Tensor(_arr(3), device=device))
    assert f.captured is None and not f.capture_first  # the default: call 1 only runs, as tinygrad does


@pytest.mark.parametrize("kw", ["capture_first", "plan_memory"])
def test_jit_flags_must_be_bool(kw):
    with pytest.raises(TypeError, match=kw):
        TinyJit(lambda a: a, **{kw: 1})


def test_replay_compiles_and_schedules_nothing(device):
    f = TinyJit(lambda x: (x * 3 + 1).sum(axis=1))
    for i in range(2):
        f(Tensor(_arr(4, 5, seed=i), device=device))
    GlobalCounters.reset()
    out = f(Tensor(_arr(4, 5, seed=7), device=device))
    assert GlobalCounters.kernels_compiled == 0
    assert GlobalCounters.kernel_count == f.captured.kernel_count
    np.testing.assert_allclose(out.numpy(), (_arr(4, 5, seed=7) * 3 + 1).sum(axis=1), rtol=1e-5)


def test_outputs_differ_for_different_inputs(device):
    f = jit(lambda x: x * x)
    outs = [f(Tensor(np.full(4, i, np.float32), device=device)).numpy().copy() for i in range(4)]
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o, np.full(4, i * i, np.float32))


def test_keyword_inputs(device):
    @TinyJit
    def f(x: Tensor, *, y: Tensor, scale: float = 1.0) -> Tensor:
        return x * scale - y

    for i in range(4):
        x, y = _arr(6, seed=i), _arr(6, seed=20 + i)
        out = f(Tensor(x, device=device), y=Tensor(y, device=device), scale=2.0)
        np.testing.assert_allclose(out.numpy(), x * 2 - y, rtol=1e-6)


def test_view_inputs_are_realized(device):
    f = TinyJit(lambda x: x + 1)
    for i in range(4):
        a = _arr(4, 3, seed=i)
        out = f(Tensor(a, device=device).permute(1, 0))  # a strided view: the jit gives it its own buffer
        np.testing.assert_allclose(out.numpy(), a.T + 1, rtol=1e-6)


def test_replay_goes_through_the_device_graph(device):
    if Device[device].graph is None:
        pytest.skip(f"{device} has no Graph: replays run a plain loop")
    f = TinyJit(lambda x: ((x + 1).contiguous() * 2).contiguous().sum())
    for i in range(3):
        out = f(Tensor(_arr(8, seed=i), device=device))
    np.testing.assert_allclose(out.numpy(), ((_arr(8, seed=2) + 1) * 2).sum(), rtol=1e-5)
    assert f.captured.kernel_count == 3 and len(f.captured.runs) == 1


# --- argument checks ----------------------------------------------------------------------------------

def _captured(device: str) -> TinyJit:
    f = TinyJit(lambda x, k=1: x * k)
    for _ in range(2):
        f(Tensor(_arr(2, 3), device=device), k=2)
    return f


def test_shape_change_raises(device):
    f = _captured(device)
    with pytest.raises(JitError, match=r"argument 0.*shape \(2, 3\).*shape \(3, 3\)"):
        f(Tensor(_arr(3, 3), device=device), k=2)


def test_dtype_change_raises(device):
    f = _captured(device)
    with pytest.raises(JitError, match=r"argument 0.*float.*int"):
        f(Tensor(np.ones((2, 3), np.int32), device=device), k=2)


def test_device_change_raises(device):
    f = _captured(device)
    other = other_device(device)
    with pytest.raises(JitError, match=f"argument 0.*{device}.*{other}"):
        f(Tensor(_arr(2, 3), device=other), k=2)


def test_non_tensor_argument_change_raises(device):
    f = _captured(device)
    np.testing.assert_allclose(f(Tensor(_arr(2, 3, seed=3), device=device), k=2).numpy(), _arr(2, 3, seed=3) * 2)
    with pytest.raises(JitError, match=r"argument 'k': captured 2, now 3"):
        f(Tensor(_arr(2, 3), device=device), k=3)


# --- state, realize, random numbers ---------------------------------------------------------------

def test_two_jits_sharing_buffers(device):
    state = Tensor.zeros(4, device=device).contiguous().realize()

    @TinyJit
    def accumulate(x: Tensor) -> Tensor:
        return state.assign(state + x).realize()

    @TinyJit
    def read(scale: Tensor) -> Tensor:
        return state * scale

    total = np.zeros(4, np.float32)
    for i in range(5):
        x = _arr(4, seed=i)
        total += x
        accumulate(Tensor(x, device=device))
        np.testing.assert_allclose(read(Tensor(np.full(4, 2.0, np.float32), device=device)).numpy(), total * 2,
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.numpy(), total, rtol=1e-5, atol=1e-6)


def test_realize_inside(device):
    @TinyJit
    def f(x: Tensor) -> Tensor:
        y = (x * 2).realize()
        z = (y + 1).realize()
        return z.sum()

    for i in range(4):
        a = _arr(5, seed=i)
        np.testing.assert_allclose(f(Tensor(a, device=device)).numpy(), (a * 2 + 1).sum(), rtol=1e-5)
    assert f.captured.kernel_count == 3


def test_random_numbers_advance_like_eager(device):
    x = Tensor.zeros(6, device=device).contiguous().realize()
    f = TinyJit(lambda x: Tensor.rand(6, device=device) + x)
    Tensor.manual_seed(3)
    jitted = [f(x).numpy().copy() for _ in range(5)]
    Tensor.manual_seed(3)
    eager = [(Tensor.rand(6, device=device) + x).numpy() for _ in range(5)]
    assert len({a.tobytes() for a in jitted}) == 5  # every replay draws new numbers ...
    np.testing.assert_array_equal(np.stack(jitted), np.stack(eager))  # ... the ones an eager call draws


def _train_mlp(device: str, batches: list[tuple[np.ndarray, np.ndarray]], jitted: bool) -> tuple[list[float],
                                                                                               list[np.ndarray]]:
    Tensor.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.Linear(8, 3)]
    params = [t for lin in layers for t in (lin.weight, lin.bias)]
    for p in params:
        p.to_(device)
    opt = optim.Adam(params, lr=0.01)  # realizes the parameters: each in its own buffer

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            return loss.realize()

    fn = TinyJit(step) if jitted else step
    losses = [fn(Tensor(x, device=device), Tensor(y, device=device)).item() for x, y in batches]
    return losses, [p.numpy() for p in params]


def test_optimizer_step_matches_eager_bit_for_bit(device):
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 6)).astype(np.float32), rng.integers(0, 3, 4)) for _ in range(5)]
    eager, jitted = _train_mlp(device, batches, False), _train_mlp(device, batches, True)
    assert eager[0] == jitted[0]
    for eager_p, jit_p in zip(eager[1], jitted[1]):
        np.testing.assert_array_equal(eager_p, jit_p)


def test_batchnorm_running_stats_update_in_place(device):
    def run(jitted: bool) -> tuple[np.ndarray, np.ndarray]:
        bn = nn.BatchNorm(3)
        stats = (bn.running_mean, bn.running_var, bn.num_batches_tracked)
        for t in (*stats, bn.weight, bn.bias):
            t.to_(device)
        Tensor.realize_all(*stats)  # in buffers, so the updates write in place

        def fwd(x: Tensor) -> Tensor:
            with Tensor.train():
                out = bn(x)
            Tensor.realize_all(out, bn.running_mean, bn.running_var, bn.num_batches_tracked)
            return out

        fn = TinyJit(fwd) if jitted else fwd
        for i in range(4):
            fn(Tensor(_arr(5, 3, seed=i), device=device))
        return bn.running_mean.numpy(), bn.running_var.numpy()

    for a, b in zip(run(False), run(True)):
        np.testing.assert_array_equal(a, b)


# --- the memory planner ------------------------------------------------------------------------------

def _chain(x: Tensor) -> Tensor:
    y = x
    for k in range(5):  # each step in its own buffer, dead two steps later
        y = (y * 1.5 + k).contiguous()
    return y.sum(axis=0)


def test_memory_planner_shares_dead_intermediates(device):
    planned, plain = TinyJit(_chain), TinyJit(_chain, plan_memory=False)
    for i in range(4):
        a = _arr(16, 4, seed=i)
        want = a
        for k in range(5):
            want = want * np.float32(1.5) + np.float32(k)
        p, q = planned(Tensor(a, device=device)), plain(Tensor(a, device=device))
        np.testing.assert_array_equal(p.numpy(), q.numpy())
        np.testing.assert_allclose(p.numpy(), want.sum(axis=0), rtol=1e-5)
    assert planned.captured.distinct_buffers() < plain.captured.distinct_buffers()


def test_memory_planner_never_aliases_live_buffers(device):
    kept: list[Tensor] = []

    def f(x: Tensor) -> Tensor:
        a = (x + 1).contiguous().realize()
        if len(kept) < 2:
            kept.append(a)  # alive after the call: must keep its own buffer
        b = (a * 2).contiguous()
        c = (b * 3).contiguous()
        return (c + 1).sum()

    planned = TinyJit(f)
    for i in range(4):
        a = _arr(8, seed=i)
        np.testing.assert_allclose(planned(Tensor(a, device=device)).numpy(), ((a + 1) * 6 + 1).sum(), rtol=1e-5)
        # the kept intermediate holds this call's value, untouched by the buffers planned around it
        np.testing.assert_allclose(kept[min(i, 1)].numpy(), a + 1, rtol=1e-6)
    cap = planned.captured
    for ei in cap.exec_items:  # one kernel never gets one buffer twice unless it asked for that
        assert len({id(b) for b in ei.bufs}) == len(ei.bufs)


# --- symbolic variables -------------------------------------------------------------------------------

def test_variable_binding_checks():
    v = Variable("n", 1, 16)
    assert v.bind(7).val == 7 and v.val is None
    with pytest.raises(ValueError, match="outside"):
        v.bind(17)
    with pytest.raises(TypeError, match="int"):
        v.bind(2.5)
    with pytest.raises(ValueError, match="bound"):
        Tensor.ones(20).shrink(((v, v + 2),))


def test_symbolic_shrink_and_pad_match_numpy(device):
    a = _arr(12)
    x = Tensor(a, device=device).realize()
    v = Variable("i", 0, 9)
    for val in (0, 4, 9):
        i = v.bind(val)
        np.testing.assert_array_equal(x.shrink(((i, i + 3),)).numpy(), a[val:val + 3])
        np.testing.assert_array_equal(Tensor(a[:3], device=device).pad(((i, 9 - i),)).numpy(),
                                      np.pad(a[:3], (val, 9 - val)))
    # i + 4 can reach 13 > 12: accepted as in tinygrad while the bound value fits, refused when it does not
    np.testing.assert_array_equal(x.shrink(((v.bind(1), v.bind(1) + 4),)).numpy(), a[1:5])
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.shrink(((v.bind(9), v.bind(9) + 4),))


def test_symbolic_jit_replays_for_several_values(device):
    a = _arr(10)
    x = Tensor(a, device=device).realize()
    v = Variable("p", 0, 7)
    f = TinyJit(lambda x, p: x.shrink(((p, p + 3),)) * 2 + 1)
    for val in (0, 1):
        f(x, v.bind(val))
    GlobalCounters.reset()
    for val in (5, 2, 7, 3):
        np.testing.assert_allclose(f(x, v.bind(val)).numpy(), a[val:val + 3] * 2 + 1, rtol=1e-6)
    assert GlobalCounters.kernels_compiled == 0


def test_kv_cache_update_at_a_symbolic_position(device):
    size = 8
    cache = Tensor.zeros(size, 3, device=device).contiguous().realize()
    v = Variable("pos", 0, size - 1)

    @TinyJit
    def step(x: Tensor, pos: Variable) -> Tensor:
        cache.shrink(((pos, pos + 1), None)).assign(x.reshape(1, 3)).realize()
        # rows [0, pos] are valid: a window of a padded ones vector, moved by the position
        valid = Tensor.ones(size, device=device).pad(((0, size),)).shrink(((size - 1 - pos, 2 * size - 1 - pos),))
        return (cache * valid.reshape(size, 1)).sum(axis=0)

    want = np.zeros((size, 3), np.float32)
    for p in range(6):
        want[p] = _arr(3, seed=p)
        np.testing.assert_allclose(step(Tensor(want[p], device=device), v.bind(p)).numpy(), want[:p + 1].sum(0),
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(cache.numpy(), want)


def test_output_fed_back_as_input(device):
    f = TinyJit(lambda x: (x @ x).realize())
    x = Tensor(np.eye(2, dtype=np.float32) * 2, device=device)
    for i in range(5):
        x = f(x)  # from the third call on, the input is the buffer the kernels write
        assert float(x.numpy()[0, 0]) == 2.0 ** (2 ** (i + 1))


def test_tensors_inside_containers_are_refused(device):
    g = TinyJit(lambda xs: xs[0] + 1)
    with pytest.raises(JitError, match="inside a list"):
        g([Tensor([1.0], device=device)])


def test_symbolic_views_print_in_full():
    """Kernel cache keys are built from the printed AST: views that differ deep in a symbolic offset must differ."""
    from ember.ir.shapetracker import View
    from ember.ir.uop import UOp

    def deep(last: int) -> View:
        u = Variable("i", 0, 9).uop
        for k in (1, 2, 3, 4, last):
            u = u.maximum(UOp.const(dtypes.int32, k))
        return View.create((4,), (1,), u)

    assert repr(deep(5)) != repr(deep(6))


def test_reshape_and_permute_of_symbolic_views(device):
    a = np.arange(24, dtype=np.float32)
    x = Tensor(a, device=device).realize()
    v = Variable("i", 0, 16)
    for val in (0, 5, 16):
        i = v.bind(val)
        np.testing.assert_array_equal(x.shrink(((i, i + 8),)).reshape(2, 4).permute(1, 0).numpy(),
                                      a[val:val + 8].reshape(2, 4).T)
        padded = Tensor(a[:4], device=device).reshape(2, 2).pad(((0, 0), (i, 16 - i))).reshape(2, 9, 2)
        np.testing.assert_array_equal(padded.numpy(), np.pad(a[:4].reshape(2, 2), ((0, 0), (val, 16 - val)))
                                      .reshape(2, 9, 2))


def test_multiple_outputs_method_and_reset(device):
    class Model:
        def __init__(self) -> None:
            self.scale = Tensor([3.0], device=device).realize()

        @TinyJit
        def __call__(self, x: Tensor) -> dict[str, Tensor | tuple[Tensor, int]]:
            return {"double": x * 2, "pair": (x * self.scale, 7)}

    m = Model()
    for i in range(4):
        a = _arr(3, seed=i)
        out = m(Tensor(a, device=device))
        np.testing.assert_allclose(out["double"].numpy(), a * 2, rtol=1e-6)
        np.testing.assert_allclose(out["pair"][0].numpy(), a * 3, rtol=1e-6)
        assert out["pair"][1] == 7
    jitted = Model.__call__
    assert jitted.cnt == 4 and jitted.captured is not None
    jitted.reset()
    assert jitted.cnt == 0 and jitted.captured is None
    np.testing.assert_allclose(m(Tensor(_arr(5), device=device))["double"].numpy(), _arr(5) * 2, rtol=1e-6)


def test_capture_after_a_call_with_the_same_input(device):
    """Results remembered from the first call (the returned tensor keeps its graph alive through autograd) must not
    hide kernels from the capture: a replay with another input computes from that input."""
    w = Tensor(np.ones(3, np.float32), device=device, requires_grad=True)
    f = TinyJit(lambda x: ((x * w).exp() * 2).sum().realize())
    x = Tensor(np.arange(3, dtype=np.float32), device=device).realize()
    kept = [f(x), f(x)]  # run, then capture with the very same input
    y = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(f(Tensor(y, device=device)).item(), (np.exp(y) * 2).sum(), rtol=1e-5)
    assert len(kept) == 2


def test_function_without_kernels_is_refused(device):
    f = TinyJit(lambda x: x)
    x = Tensor([1.0], device=device).realize()
    f(x)
    with pytest.raises(JitError, match="no kernels"):
        f(x)
