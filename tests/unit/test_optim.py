"""ember.nn.optim against torch.optim: update rules, schedules, clipping, state round trips."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ember import Tensor, no_grad
from ember.nn import optim

torch = pytest.importorskip("torch")

SHAPES = ((4, 3), (3,))


def _init(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _grads(step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


# (ember class, ember kwargs, torch class, torch kwargs)
CONFIGS = {
    "sgd": (optim.SGD, dict(lr=0.1), "SGD", dict(lr=0.1)),
    "sgd_momentum": (optim.SGD, dict(lr=0.05, momentum=0.9), "SGD", dict(lr=0.05, momentum=0.9)),
    "sgd_nesterov_wd": (optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1), "SGD",
                        dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
    "adam": (optim.Adam, dict(lr=0.01), "Adam", dict(lr=0.01)),
    "adam_l2": (optim.Adam, dict(lr=0.01, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1), "Adam",
                dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    "adamw": (optim.AdamW, dict(lr=0.01), "AdamW", dict(lr=0.01)),
    "adamw_wd": (optim.AdamW, dict(lr=0.02, weight_decay=0.3, b2=0.95), "AdamW",
                 dict(lr=0.02, weight_decay=0.3, betas=(0.9, 0.95))),
}


def _run_pair(name: str, steps: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    ecls, ekw, tname, tkw = CONFIGS[name]
    init = _init()
    eparams = [Tensor(a.copy()) for a in init]
    tparams = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    eopt, topt = ecls(eparams, **ekw), getattr(torch.optim, tname)(tparams, **tkw)
    for s in range(steps):
        for p, tp, g in zip(eparams, tparams, _grads(s)):
            p.grad, tp.grad = Tensor(g), torch.tensor(g)
        eopt.step()
        topt.step()
    return [p.numpy() for p in eparams], [tp.detach().numpy() for tp in tparams]


@pytest.mark.parametrize("steps", [1, 10])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_optimizer_matches_torch(name: str, steps: int) -> None:
    got, want = _run_pair(name, steps)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _lamb_reference(steps: int, lr: float, b1: float, b2: float, eps: float, wd: float) -> list[np.ndarray]:
    params = [a.astype(np.float64) for a in _init()]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for s in range(steps):
        t = s + 1
        for i, g in enumerate(_grads(s)):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            up = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * params[i]
            r1, r2 = np.linalg.norm(params[i]), np.linalg.norm(up)
            ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
            params[i] = params[i] - lr * ratio * up
    return params


@pytest.mark.parametrize("steps", [1, 10])
def test_lamb_matches_reference(steps: int) -> None:
    params = [Tensor(a.copy()) for a in _init()]
    opt = optim.LAMB(params, lr=0.01, b1=0.9, b2=0.99, eps=1e-6, weight_decay=0.05)
    for s in range(steps):
        for p, g in zip(params, _grads(s)):
            p.grad = Tensor(g)
        opt.step()
    for p, want in zip(params, _lamb_reference(steps, 0.01, 0.9, 0.99, 1e-6, 0.05)):
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-5, atol=1e-6)


def test_end_to_end_backward_matches_torch() -> None:
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((5, 4)).astype(np.float32)
    init = _init()
    w, b = (Tensor(a.copy()) for a in init)
    tw, tb = (torch.tensor(a.copy(), requires_grad=True) for a in init)
    opt, topt = optim.Adam([w, b], lr=0.05), torch.optim.Adam([tw, tb], lr=0.05)
    x, tx = Tensor(x_np), torch.tensor(x_np)
    for _ in range(5):
        opt.zero_grad()
        loss = ((x @ w + b).tanh() ** 2).mean()
        loss.backward()
        loss.realize()  # the step updates w and b in place: a lazy loss would see the new values
        opt.step()
        topt.zero_grad()
        tloss = ((tx @ tw + tb).tanh() ** 2).mean()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_step_realizes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    params = [Tensor(a.copy()) for a in _init()]
    opt = optim.Adam(params, lr=0.01)
    for p, g in zip(params, _grads(0)):
        p.grad = Tensor(g)
    calls: list[int] = []
    real = Tensor.realize_all
    monkeypatch.setattr(Tensor, "realize_all", staticmethod(lambda *ts: (calls.append(len(ts)), real(*ts))[1]))
    opt.step()
    assert len(calls) == 1
    assert calls[0] == len(opt.schedule_step())  # params, moments and step counter realized together


def test_requires_grad_handling_and_zero_grad() -> None:
    a, b, c = Tensor([1.0, 2.0]), Tensor([3.0], requires_grad=True), Tensor([4.0], requires_grad=False)
    opt = optim.SGD([a, b, c, a], lr=0.1)
    assert a.requires_grad is True and c.requires_grad is False
    assert opt.params == [a, b] and opt.buffers == [c]
    a.grad = Tensor([1.0, 1.0])
    opt.step()  # b has no gradient: left alone, like torch
    np.testing.assert_allclose(a.numpy(), [0.9, 1.9], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), [3.0])
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_invalid_arguments_raise_like_torch() -> None:
    tp = [torch.zeros(2, requires_grad=True)]
    cases = [
        (lambda: optim.SGD([Tensor([1.0])], lr=-1.0), lambda: torch.optim.SGD(tp, lr=-1.0)),
        (lambda: optim.SGD([], lr=0.1), lambda: torch.optim.SGD([], lr=0.1)),
        (lambda: optim.SGD([Tensor([1.0])], lr=0.1, nesterov=True), lambda: torch.optim.SGD(tp, lr=0.1, nesterov=True)),
        (lambda: optim.SGD([Tensor([1.0])], lr=0.1, momentum=-0.5), lambda: torch.optim.SGD(tp, lr=0.1, momentum=-0.5)),
        (lambda: optim.Adam([Tensor([1.0])], b1=1.0), lambda: torch.optim.Adam(tp, betas=(1.0, 0.999))),
        (lambda: optim.Adam([Tensor([1.0])], eps=-1.0), lambda: torch.optim.Adam(tp, eps=-1.0)),
        (lambda: optim.AdamW([Tensor([1.0])], weight_decay=-1.0), lambda: torch.optim.AdamW(tp, weight_decay=-1.0)),
    ]
    for ours, theirs in cases:
        with pytest.raises(Exception) as want:
            theirs()
        with pytest.raises(want.type):
            ours()


# --- schedules -----------------------------------------------------------------------------------
SCHEDULES = {
    "step": (lambda o: optim.StepLR(o, step_size=3, gamma=0.5),
             lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)),
    "multistep": (lambda o: optim.MultiStepLR(o, milestones=[5, 2, 9], gamma=0.3),
                  lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[5, 2, 9], gamma=0.3)),
    "exponential": (lambda o: optim.ExponentialLR(o, gamma=0.9),
                    lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)),
    "linear": (lambda o: optim.LinearLR(o, start_factor=0.25, total_iters=4),
               lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=4)),
    "lambda": (lambda o: optim.LambdaLR(o, lambda e: 1 / (1 + e)),
               lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (1 + e))),
    "cosine": (lambda o: optim.CosineAnnealingLR(o, T_max=7, eta_min=0.01),
               lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7, eta_min=0.01)),
    "onecycle": (lambda o: optim.OneCycleLR(o, max_lr=0.5, total_steps=20),
                 lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=20)),
    "onecycle_linear_3phase": (
        lambda o: optim.OneCycleLR(o, max_lr=0.5, epochs=4, steps_per_epoch=5, anneal_strategy="linear",
                                   three_phase=True, pct_start=0.25),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, epochs=4, steps_per_epoch=5,
                                                      anneal_strategy="linear", three_phase=True, pct_start=0.25)),
}


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_matches_torch(name: str, kind: str) -> None:
    ours_fn, theirs_fn = SCHEDULES[name]
    p, tp = Tensor([1.0]), torch.zeros(1, requires_grad=True)
    if kind == "sgd":
        opt, topt = optim.SGD([p], lr=0.1, momentum=0.9), torch.optim.SGD([tp], lr=0.1, momentum=0.9)
    else:
        opt, topt = optim.Adam([p], lr=0.1), torch.optim.Adam([tp], lr=0.1)
    sched, tsched = ours_fn(opt), theirs_fn(topt)
    for _ in range(20):
        want = topt.param_groups[0]["lr"]
        assert sched.get_last_lr()[0] == pytest.approx(want, rel=1e-9, abs=1e-15)
        assert opt.lr.item() == pytest.approx(want, rel=1e-6, abs=1e-12)
        if name.startswith("onecycle"):
            tm = topt.param_groups[0]["momentum"] if kind == "sgd" else topt.param_groups[0]["betas"][0]
            m = opt.momentum if kind == "sgd" else opt.b1
            assert m.item() == pytest.approx(tm, rel=1e-6)
        topt.step()
        tsched.step()
        sched.step()


def test_onecycle_errors_like_torch() -> None:
    tp = [torch.zeros(1, requires_grad=True)]
    p = [Tensor([1.0])]
    for kw in (dict(), dict(total_steps=0), dict(total_steps=5, pct_start=1.5),
               dict(total_steps=5, anneal_strategy="square")):
        with pytest.raises(ValueError):
            torch.optim.lr_scheduler.OneCycleLR(torch.optim.SGD(tp, lr=0.1), max_lr=1.0, **kw)
        with pytest.raises(ValueError):
            optim.OneCycleLR(optim.SGD(p, lr=0.1, momentum=0.9), max_lr=1.0, **kw)
    sched = optim.OneCycleLR(optim.Adam(p, lr=0.1), max_lr=1.0, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ValueError):
        sched.step()


def test_scheduler_changes_no_kernels() -> None:
    from ember import GlobalCounters

    p = Tensor([1.0, 2.0])
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    sched = optim.OneCycleLR(opt, max_lr=1.0, total_steps=10)
    for _ in range(2):  # the first step starts from zero momentum: its graph differs
        p.grad = Tensor([1.0, 1.0])
        opt.step()
        sched.step()
    GlobalCounters.reset()
    for _ in range(3):
        p.grad = Tensor([1.0, 1.0])
        opt.step()
        sched.step()
    assert GlobalCounters.kernels_compiled == 0  # new lr/momentum values are data, not code


# --- clipping ------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_matches_torch(norm_type: float) -> None:
    grads = _grads(3)
    params = [Tensor(a) for a in _init()]
    tparams = [torch.tensor(a, requires_grad=True) for a in _init()]
    for p, tp, g in zip(params, tparams, grads):
        p.grad, tp.grad = Tensor(g * 3), torch.tensor(g * 3)
    total = optim.clip_grad_norm_(params, max_norm=1.5, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(tparams, max_norm=1.5, norm_type=norm_type)
    np.testing.assert_allclose(total.numpy(), ttotal.numpy(), rtol=1e-5)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)
    # no clipping when the norm is already small
    small = Tensor([1.0])
    small.grad = Tensor([0.1])
    optim.clip_grad_norm_(small, max_norm=1.0)
    np.testing.assert_allclose(small.grad.numpy(), [0.1], rtol=1e-6)


def test_clip_grad_value_matches_torch() -> None:
    g = _grads(4)[0]
    p, tp = Tensor(_init()[0]), torch.tensor(_init()[0], requires_grad=True)
    p.grad, tp.grad = Tensor(g), torch.tensor(g)
    optim.clip_grad_value_([p], 0.5)
    torch.nn.utils.clip_grad_value_([tp], 0.5)
    np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy())


# --- state ---------------------------------------------------------------------------------------
def _adam_with_schedule(init: list[np.ndarray]) -> tuple[list[Tensor], optim.Optimizer, optim.OneCycleLR]:
    params = [Tensor(a.copy()) for a in init]
    opt = optim.Adam(params, lr=0.01)
    return params, opt, optim.OneCycleLR(opt, max_lr=0.1, total_steps=12)


def _train(params: list[Tensor], opt: optim.Optimizer, sched: optim.LRScheduler, steps: range) -> list[float]:
    x = Tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4))
    losses = []
    for _ in steps:
        opt.zero_grad()
        loss = ((x @ params[0] + params[1]).tanh() - 0.5).square().mean()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def test_state_dict_contents() -> None:
    params, opt, _ = _adam_with_schedule(_init())
    sd = opt.state_dict()
    assert set(sd) == {"lr", "b1", "b2", "step_count", "m.0", "m.1", "v.0", "v.1"}
    sgd = optim.SGD([Tensor([1.0])], lr=0.1, momentum=0.9)
    assert set(sgd.state_dict()) == {"lr", "momentum", "b.0"}


def test_resume_gives_the_same_loss_curve() -> None:
    init = _init()
    params, opt, sched = _adam_with_schedule(init)
    straight = _train(params, opt, sched, range(10))

    params, opt, sched = _adam_with_schedule(init)
    first = _train(params, opt, sched, range(4))
    saved_params = [p.numpy() for p in params]
    saved_opt = {k: v.numpy() for k, v in opt.state_dict().items()}
    saved_sched = sched.state_dict()

    params2, opt2, sched2 = _adam_with_schedule(_init(seed=7))  # different values, overwritten below
    with no_grad():
        for p, a in zip(params2, saved_params):
            p.assign(Tensor(a))
    opt2.load_state_dict({k: Tensor(v) for k, v in saved_opt.items()})
    sched2.load_state_dict(saved_sched)
    resumed = first + _train(params2, opt2, sched2, range(6))
    np.testing.assert_allclose(resumed, straight, rtol=1e-6)


def test_load_state_dict_errors() -> None:
    opt = optim.Adam([Tensor([1.0, 2.0])], lr=0.01)
    sd = opt.state_dict()
    with pytest.raises(KeyError):
        opt.load_state_dict({k: v for k, v in sd.items() if k != "lr"})
    bad = dict(sd)
    bad["m.0"] = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match="m.0"):
        opt.load_state_dict(bad)


def test_checkpoint_round_trip_through_safetensors(tmp_path) -> None:
    state = pytest.importorskip("ember.nn.state")
    init = _init()
    params, opt, sched = _adam_with_schedule(init)
    _train(params, opt, sched, range(3))
    path = str(tmp_path / "ckpt.safetensors")
    state.safe_save({**{f"p{i}": p for i, p in enumerate(params)}, **{f"optim.{k}": v for k, v in
                                                                        opt.state_dict().items()}}, path)
    loaded = state.safe_load(path)
    params2, opt2, sched2 = _adam_with_schedule(_init(seed=3))
    with no_grad():
        for i, p in enumerate(params2):
            p.assign(loaded[f"p{i}"].to(p.device))
    opt2.load_state_dict({k[len("optim."):]: v for k, v in loaded.items() if k.startswith("optim.")})
    sched2.load_state_dict(sched.state_dict())
    a = _train(params, opt, sched, range(2))
    b = _train(params2, opt2, sched2, range(2))
    np.testing.assert_allclose(a, b, rtol=1e-6)
