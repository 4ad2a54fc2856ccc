"""TinyJit and results remembered from earlier calls: weights initialized lazily (never realized before the first
jitted call) are computed by the first call and read, not recomputed, by every replay; a remembered result that
a replay could change (computed from a jit input, from a buffer the step writes, or from a buffer assigned into
outside the function) is still computed afresh."""
from __future__ import annotations

import numpy as np

from ember import GlobalCounters, Tensor, TinyJit, nn
from ember.nn import optim

_X = np.arange(8, dtype=np.float32).reshape(2, 4) * 0.25

# tinygrad 0.14 gives these for manual_seed(0), nn.Linear(4, 3), and per call i (of 4) the output of
# l1(_X - i).dropout(0.5) in training mode: jitted and unjitted alike
_TG_WEIGHT = [[0.14867639541625977, -0.14871346950531006, -0.2644599676132202, -0.4158898591995239],
              [-0.14134716987609863, -0.06868588924407959, -0.18206572532653809, 0.012555837631225586],
              [0.1618748903274536, 0.3683433532714844, 0.35473382472991943, 0.0874030590057373]]
_TG_BIAS = [0.39772188663482666, -0.023846983909606934, 0.39298152923583984]
_TG_OUT = [[[0.0, -0.24526888132095337, 1.4559731483459473], [0.0, -1.00435471534729, 3.4006834030151367]],
           [[0.0, 0.5138169527053833, 0.0], [-0.1672077775001526, -0.24526888132095337, 1.4559731483459473]],
           [[2.554339647293091, 1.2729029655456543, 0.0], [1.193566083908081, 0.0, -0.4887371063232422]],
           [[0.0, 2.0319886207580566, -4.378157615661621], [2.554339647293091, 1.2729029655456543, 0.0]]]


def _dropout_run(device: str, jitted: bool, realize_first: bool) -> tuple[list[np.ndarray], list[int], np.ndarray,
                                                                            np.ndarray]:
    """(outputs, kernels run per call, weight, bias) of four calls of a lazily initialized Linear + dropout."""
    Tensor.manual_seed(0)
    lin = nn.Linear(4, 3)
    lin.weight.to_(device)
    lin.bias.to_(device)
    if realize_first:
        Tensor.realize_all(lin.weight, lin.bias)

    def fwd(x: Tensor) -> Tensor:
        with Tensor.train():
            return lin(x).dropout(0.5).realize()

    f = TinyJit(fwd) if jitted else fwd
    outs, kernels = [], []
    for i in range(4):
        x = Tensor(_X - i, device=device).realize()
        GlobalCounters.reset()
        outs.append(f(x).numpy().copy())
        kernels.append(GlobalCounters.kernel_count)
    return outs, kernels, lin.weight.numpy(), lin.bias.numpy()


def test_lazy_weights_with_dropout_match_unjitted_and_tinygrad(device):
    """The weights are drawn once (their random key is not re-uploaded like dropout's), and every replay reads them:
    the same outputs as unjitted calls, and as tinygrad's, whose weights are buffers after the first call."""
    outs, kernels, w, b = _dropout_run(device, jitted=True, realize_first=False)
    eager_outs, eager_kernels, eager_w, eager_b = _dropout_run(device, jitted=False, realize_first=False)
    np.testing.assert_array_equal(np.stack(outs), np.stack(eager_outs))
    np.testing.assert_array_equal(w, eager_w)
    np.testing.assert_array_equal(b, eager_b)
    assert kernels == eager_kernels  # the initialization runs in the first call only, jitted or not
    np.testing.assert_allclose(w, _TG_WEIGHT, rtol=0, atol=1e-6)
    np.testing.assert_allclose(b, _TG_BIAS, rtol=0, atol=1e-6)
    if device == "CPU":  # dropout draws on the device it runs on: another device has a random stream of its own
        np.testing.assert_allclose(np.stack(outs), _TG_OUT, rtol=1e-5, atol=1e-6)


def test_replay_of_a_lazily_initialized_model_runs_the_kernels_of_a_realized_one(device):
    _, lazy_kernels, _, _ = _dropout_run(device, jitted=True, realize_first=False)
    _, real_kernels, _, _ = _dropout_run(device, jitted=True, realize_first=True)
    assert lazy_kernels[0] > real_kernels[0]  # the first call computes the weights ...
    assert lazy_kernels[1:] == real_kernels[1:]  # ... the capture and the replays only the forward


def _train(device: str, jitted: bool, realize_first: bool) -> tuple[list[float], list[np.ndarray], int]:
    """(losses, final parameters, kernels of the last call) of five Adam steps of a lazily initialized MLP."""
    Tensor.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.Linear(8, 3)]
    params = [t for lin in layers for t in (lin.weight, lin.bias)]
    for p in params:
        p.to_(device)
    if realize_first:
        Tensor.realize_all(*params)
    opt = optim.Adam(params, lr=0.01)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = layers[1](layers[0](x).relu().dropout(0.25)).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            return loss.realize()

    fn = TinyJit(step) if jitted else step
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(5):
        x, y = rng.standard_normal((4, 6)).astype(np.float32), rng.integers(0, 3, 4)
        GlobalCounters.reset()
        losses.append(fn(Tensor(x, device=device), Tensor(y, device=device)).item())
    return losses, [p.numpy() for p in params], GlobalCounters.kernel_count


def test_optimizer_step_on_lazily_initialized_parameters(device):
    """The parameters are assigned inside the step: the jit updates them like eager steps do, bit for bit."""
    eager_losses, eager_params, _ = _train(device, jitted=False, realize_first=False)
    losses, params, kernels = _train(device, jitted=True, realize_first=False)
    _, _, realized_kernels = _train(device, jitted=True, realize_first=True)
    assert losses == eager_losses
    for a, b in zip(params, eager_params):
        np.testing.assert_array_equal(a, b)
    assert kernels == realized_kernels


def test_a_remembered_result_of_a_jit_input_is_computed_again(device):
    """``y = x * 2`` realized before: passing ``x`` as the input, with the same or new values, recomputes it."""
    a = np.arange(5, dtype=np.float32)
    x = Tensor(a, device=device).realize()
    y = (x * 2).exp2()  # held: the jitted function builds this very graph again
    (x * 2).exp2().realize()  # a twin: y's node is remembered
    f = TinyJit(lambda t: ((t * 2).exp2() + 1).realize())
    np.testing.assert_allclose(f(x).numpy(), np.exp2(a * 2) + 1, rtol=1e-6)
    np.testing.assert_allclose(f(x).numpy(), np.exp2(a * 2) + 1, rtol=1e-6)  # the capture, same input buffer
    for k in range(3):
        new = a - k
        x.assign(Tensor(new, device=device)).realize()  # new values in the same buffer
        np.testing.assert_allclose(f(x).numpy(), np.exp2(new * 2) + 1, rtol=1e-6)
        other = a * (k + 3)
        np.testing.assert_allclose(f(Tensor(other, device=device)).numpy(), np.exp2(other * 2) + 1, rtol=1e-6)
    assert f.captured is not None and f.captured.kernel_count == 1
    np.testing.assert_allclose(y.numpy(), np.exp2((a - 2) * 2), rtol=1e-6)  # x's last values


def test_a_remembered_result_read_before_the_step_writes_its_source_is_recorded(device):
    """The step reads ``w * 2`` (remembered from the call before), then updates ``w`` and computes ``w * 2``
    again: a replay reading the remembered buffer would add a stale value. The jit notices after the capture
    and captures again on the next call, computing everything."""
    w = Tensor.zeros(3, device=device).contiguous().realize()
    w2 = w * 2  # held: its node stays remembered while this lives

    def step(x: Tensor) -> Tensor:
        out = (x + w2).realize()
        w.assign(w + 1).realize()
        (w * 2).realize()  # the same graph as w2: remembered for the next call
        return out

    f = TinyJit(step)
    for k in range(6):
        a = np.full(3, 10.0 * k, np.float32)
        np.testing.assert_array_equal(f(Tensor(a, device=device)).numpy(), a + 2 * k)
    assert f.captured is not None and f.captured.kept == []


def test_an_assign_outside_the_function_makes_the_replay_capture_again(device):
    """A remembered result the replays read is forgotten when a buffer it was computed from is assigned into
    outside the function: the next call captures again and computes it from the new contents, like an eager
    call."""
    w = Tensor(np.arange(3, dtype=np.float32), device=device).realize()
    w2 = (w * 2).exp2()
    (w * 2).exp2().realize()  # a twin: w2's node now reads a buffer
    f = TinyJit(lambda x: (x + w2).realize())
    base = np.arange(3, dtype=np.float32)
    for k in range(3):
        np.testing.assert_array_equal(f(Tensor(np.full(3, k, np.float32), device=device)).numpy(),
                                      k + np.exp2(base * 2))
    assert f.captured is not None and len(f.captured.kept) == 1 and f.captured.kernel_count == 1
    w.assign(w + 1).realize()
    for k in range(3):
        np.testing.assert_allclose(f(Tensor(np.full(3, k, np.float32), device=device)).numpy(),
                                   k + np.exp2((base + 1) * 2), rtol=1e-6)
    assert f.captured is not None and f.captured.kept == [] and f.captured.kernel_count == 1


def test_a_replay_of_another_jit_writing_the_source_makes_the_replay_capture_again(device):
    """A replay runs no schedule, so it cannot make the results computed from what it overwrites forgotten: a
    jit that reads one notices the other's writes before its own replay, and captures again."""
    w = Tensor(np.arange(3, dtype=np.float32), device=device).realize()
    update = TinyJit(lambda d: w.assign(w + d).realize())
    for _ in range(3):  # captured: later calls replay
        update(Tensor(np.ones(3, np.float32), device=device))
    w2 = (w * 0.5).exp2()
    (w * 0.5).exp2().realize()  # a twin: w2's node now reads a buffer
    evaluate = TinyJit(lambda x: (x + w2).realize())
    for k in range(3):
        np.testing.assert_allclose(evaluate(Tensor(np.full(3, k, np.float32), device=device)).numpy(),
                                   k + np.exp2((np.arange(3) + 3) * 0.5), rtol=1e-6)
    assert evaluate.captured is not None and len(evaluate.captured.kept) == 1
    update(Tensor(np.ones(3, np.float32), device=device))  # a replay: w is 4, 5, 6 now
    for k in range(3):
        np.testing.assert_allclose(evaluate(Tensor(np.full(3, k, np.float32), device=device)).numpy(),
                                   k + np.exp2((np.arange(3) + 4) * 0.5), rtol=1e-6)
    assert evaluate.captured is not None and evaluate.captured.kept == []
