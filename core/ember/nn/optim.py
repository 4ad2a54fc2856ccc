"""Optimizers, learning-rate schedules and gradient clipping.

An optimizer owns the tensors it updates and its own state (moments, step counter, learning
rate), all as tensors: ``step()`` builds the update of every parameter and every state tensor
as one lazy graph and realizes them with a single ``Tensor.realize_all`` call, so the whole
update compiles to a few fused kernels. Hyperparameters that change during training (the
learning rate, Adam's betas, SGD's momentum) live in 1-element tensors, so a schedule changes
their values without changing the kernels.

Update rules follow ``torch.optim`` (SGD, Adam, AdamW), the LAMB paper and tinygrad's LARS; the schedules
follow ``torch.optim.lr_scheduler`` names and values.
"""
from __future__ import annotations

import array
import bisect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ember.dtype import dtypes, to_np_dtype
from ember.ir.uop import Ops
from ember.tensor import Tensor, no_grad

if TYPE_CHECKING:
    import numpy as np
else:
    from ember.helpers import lazy_numpy as np


@dataclass(frozen=True, slots=True)
class _HostValue:
    """The exact Python value of a hyperparameter tensor, valid while the tensor still holds ``node``."""

    value: float
    node: Any


def _dedup(xs: Iterable[Tensor]) -> list[Tensor]:
    seen: set[int] = set()
    out: list[Tensor] = []
    for x in xs:
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out


def _zeros_buffer(like: Tensor) -> Tensor:
    """Zeros shaped like ``like`` in their own buffer from the start (a lazy constant would make the first
    step's graph differ from later steps', compiling every kernel twice)."""
    host_dtype = np.float32 if like.dtype == dtypes.bfloat16 else to_np_dtype(like.dtype)
    return Tensor(np.zeros(like.shape, dtype=host_dtype), device=like.device, dtype=like.dtype, requires_grad=False)


def _grad(p: Tensor) -> Tensor:
    """``p.grad`` of a parameter known to have one (updates and clipping visit only those)."""
    assert p.grad is not None, "a parameter without a gradient reached an update"
    return p.grad


def _scalar_tensor(value: float, device: str) -> Tensor:
    """A 1-element float32 tensor in its own buffer (a kernel argument, not a compiled-in constant)."""
    # array's float32 element rounds a double as C's (float) cast does, as numpy's would
    return Tensor(Tensor._from_host(array.array("f", [float(value)]), dtypes.float32, (1,), device),
                  requires_grad=False)


class Optimizer:
    """Base class: holds the parameters, the learning rate and the state; subclasses write ``_update``.

    Parameters whose ``requires_grad`` is None become trainable (set to True); tensors with
    ``requires_grad=False`` (e.g. BatchNorm running statistics) are not updated but are realized
    with every step, so lazy updates made to them during the forward pass run in the same schedule.
    """

    def __init__(self, params: Sequence[Tensor], lr: float):
        params = list(params)
        if not all(isinstance(p, Tensor) for p in params):
            raise TypeError("optimizer params must be a list of Tensors")
        if lr < 0:
            raise ValueError(f"Invalid learning rate: {lr}")
        for p in params:
            if p.requires_grad is None:
                p.requires_grad = True
        self.params = _dedup(p for p in params if p.requires_grad)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.buffers = _dedup(p for p in params if not p.requires_grad)
        # lazy initial values (constants, unrealized math) are made buffers of their own in the first schedule
        # that uses them (the first step's, so their kernels build in the same batch): the step's kernels then
        # read them from memory as every later step does, instead of recomputing random numbers per use
        for t in (*self.params, *self.buffers):
            if t.lazydata.op is not Ops.CONTIGUOUS:  # (a buffer already is its own contiguous form)
                t.lazydata = t.contiguous().lazydata
        self.device = self.params[0].device
        # exact Python values of the scalar hyperparameters, for schedules
        self._host: dict[str, _HostValue] = {}
        self.lr = self._scalar("lr", lr)

    def zero_grad(self) -> None:
        """Forget the gradients of all parameters (sets ``.grad`` to None)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update the parameters from their ``.grad`` and realize parameters and state in one schedule."""
        Tensor.realize_all(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """Build (without running) the update; returns every tensor that must be realized for it.

        Realize them together with the loss, ``Tensor.realize_all(loss, *opt.schedule_step())``,
        to run the forward pass, the backward pass and the update in one schedule.
        """
        with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
        for i in with_grad:
            if _grad(self.params[i]).shape != self.params[i].shape:
                raise RuntimeError(f"gradient of shape {_grad(self.params[i]).shape} does not match its parameter's "
                                   f"shape {self.params[i].shape}")
        with no_grad():
            state = self._update(with_grad)
        return _dedup([*state, *self.params, *self.buffers])

    def _update(self, idx: list[int]) -> list[Tensor]:
        """Assign new values to ``self.params[i]`` for ``i`` in ``idx``; return the state tensors it changed."""
        raise NotImplementedError

    # --- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """The optimizer state (learning rate, step counter, moments ...) by name; parameters are not included."""
        out: dict[str, Tensor] = {}
        for name, value in self.__dict__.items():
            if name in ("params", "buffers"):
                continue
            if isinstance(value, Tensor):
                out[name] = value
            elif isinstance(value, list) and value and all(isinstance(v, Tensor) for v in value):
                out.update({f"{name}.{i}": v for i, v in enumerate(value)})
        return out

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Copy values saved by :meth:`state_dict` into this optimizer's state (same names and shapes)."""
        own = self.state_dict()
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise KeyError(f"optimizer state_dict does not match: missing keys {missing}, unexpected keys {unexpected}")
        for name, t in own.items():
            src = state_dict[name]
            if not isinstance(src, Tensor):
                src = Tensor(src, device=t.device, dtype=t.dtype)
            if src.shape != t.shape:
                raise RuntimeError(f"optimizer state {name!r}: saved shape {src.shape} does not match {t.shape}")
            with no_grad():
                t.assign(src.to(t.device).cast(t.dtype).contiguous())
        Tensor.realize_all(*own.values())

    def _scalar(self, name: str, value: float) -> Tensor:
        """A new 1-element hyperparameter tensor, remembering its exact Python value."""
        t = _scalar_tensor(value, self.device)
        self._host[name] = _HostValue(float(value), t.lazydata)
        return t

    def _set_scalar(self, name: str, value: float) -> None:
        """Give the 1-element hyperparameter tensor ``name`` a new value (no recompilation)."""
        t: Tensor = getattr(self, name)
        # written now: a jitted step reads the buffer and does not run this (lazy) assign
        t.assign(Tensor([float(value)], device=t.device, dtype=t.dtype)).realize()
        self._host[name] = _HostValue(float(value), t.lazydata)

    def _get_scalar(self, name: str) -> float:
        """The exact value last given to hyperparameter ``name`` (read back from the device if unknown)."""
        t: Tensor = getattr(self, name)
        known = self._host.get(name)
        return known.value if known is not None and known.node is t.lazydata else float(t.item())


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight decay (torch's rule).

    ``g = grad + weight_decay * p``; with momentum ``b = momentum * b + g`` and ``g = b`` (or
    ``g + momentum * b`` with Nesterov); then ``p -= lr * g``.
    """

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False):
        if momentum < 0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, lr)
        self.nesterov, self.weight_decay = nesterov, weight_decay
        self.has_momentum = momentum != 0
        if self.has_momentum:
            self.momentum = self._scalar("momentum", momentum)
            self.b = [_zeros_buffer(p) for p in self.params]

    def _update(self, idx: list[int]) -> list[Tensor]:
        changed: list[Tensor] = []
        for i in idx:
            p = self.params[i]
            g = _grad(p).detach()
            if self.weight_decay:
                g = g + p.detach() * self.weight_decay
            if self.has_momentum:
                b = self.b[i]
                b.assign(b * self.momentum + g)
                changed.append(b)
                g = g + b * self.momentum if self.nesterov else b
            p.assign(p.detach() - g * self.lr)
        return changed


class LAMB(Optimizer):
    """LAMB (layer-wise adaptive moments); with ``adam=True`` it is Adam with decoupled weight decay (AdamW).

    ``m``/``v`` are the bias-corrected moments; the update ``u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p``
    is scaled per tensor by the trust ratio ``|p| / |u|`` (1 when either norm is 0, or when ``adam``).
    """

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False):
        if eps < 0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, b in enumerate((b1, b2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
        if weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, lr)
        self.eps, self.weight_decay, self.adam = eps, weight_decay, adam
        self.b1 = self._scalar("b1", b1)
        self.b2 = self._scalar("b2", b2)
        self.step_count = _scalar_tensor(0, self.device)  # float32, like torch's per-parameter "step"
        self.m = [_zeros_buffer(p) for p in self.params]
        self.v = [_zeros_buffer(p) for p in self.params]

    def _moments(self, i: int, g: Tensor, c1: Tensor, c2: Tensor) -> tuple[Tensor, Tensor]:
        """Advance the first and second moments of parameter ``i`` (``c1 = 1 - b1``, ``c2 = 1 - b2``); returns them."""
        m, v = self.m[i], self.v[i]
        m.assign(m * self.b1 + g * c1)
        v.assign(v * self.b2 + g * g * c2)
        return m, v

    def _update(self, idx: list[int]) -> list[Tensor]:
        if not idx:
            return []
        self.step_count.assign(self.step_count + 1)
        bc1 = 1 - self.b1.pow(self.step_count)
        bc2 = 1 - self.b2.pow(self.step_count)
        c1, c2 = 1 - self.b1, 1 - self.b2  # built once per step, shared by every parameter's update
        changed = [self.step_count]
        for i in idx:
            p = self.params[i]
            m, v = self._moments(i, _grad(p).detach(), c1, c2)
            up = (m / bc1) / ((v / bc2).sqrt() + self.eps)
            if self.weight_decay:
                up = up + p.detach() * self.weight_decay
            if self.adam:
                p.assign(p.detach() - up * self.lr)
            else:
                r1 = p.detach().square().sum().sqrt()
                r2 = up.square().sum().sqrt()
                ratio = (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)
                p.assign(p.detach() - up * (self.lr * ratio))
            changed += [m, v]
        return changed


class Adam(LAMB):
    """Adam (torch's rule): ``p -= lr * m_hat / (sqrt(v_hat) + eps)``; ``weight_decay`` adds L2 to the gradient."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr, b1, b2, eps, 0.0, adam=True)
        self.l2 = weight_decay
        if weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")

    def _moments(self, i: int, g: Tensor, c1: Tensor, c2: Tensor) -> tuple[Tensor, Tensor]:
        if self.l2:
            g = g + self.params[i].detach() * self.l2
        return super()._moments(i, g, c1, c2)


class AdamW(LAMB):
    """AdamW (torch's rule): decoupled weight decay, ``p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)``."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True)


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (tinygrad's rule; torch has no LARS): SGD whose step for each
    parameter is scaled by the trust ratio ``r = tcoef * |p| / (|grad| + weight_decay * |p|)`` (1 when
    either norm is 0, or when ``tcoef`` is 0).

    ``g = grad + weight_decay * p``; ``classic`` momentum scales before accumulating
    (``g = r * lr * g``, ``b = momentum * b + g``, ``p -= b``), otherwise after (``b = momentum * b + g``,
    ``p -= r * lr * b``); ``nesterov`` uses ``g + momentum * b`` in place of ``b``.
    """

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.9,
                 weight_decay: float = 1e-4, nesterov: bool = False, classic: bool = True, tcoef: float = 0.001):
        for name, v in (("momentum", momentum), ("weight_decay", weight_decay), ("tcoef", tcoef)):
            if v < 0:
                raise ValueError(f"Invalid {name} value: {v}")
        super().__init__(params, lr)
        self.weight_decay, self.nesterov, self.classic, self.tcoef = weight_decay, nesterov, classic, tcoef
        self.has_momentum = momentum != 0
        if self.has_momentum:
            self.momentum = self._scalar("momentum", momentum)
            self.b = [_zeros_buffer(p) for p in self.params]

    def _update(self, idx: list[int]) -> list[Tensor]:
        changed: list[Tensor] = []
        for i in idx:
            p = self.params[i]
            w, g = p.detach(), _grad(p).detach()
            scale = self.lr
            if self.tcoef:
                r1, r2 = w.square().sum().sqrt(), g.square().sum().sqrt()
                ratio = (r1 > 0).where((r2 > 0).where(r1 * self.tcoef / (r2 + r1 * self.weight_decay), 1.0), 1.0)
                scale = self.lr * ratio
            if self.weight_decay:
                g = g + w * self.weight_decay
            if self.classic:
                g = g * scale
            if self.has_momentum:
                b = self.b[i]
                b.assign(b * self.momentum + g)
                changed.append(b)
                g = g + b * self.momentum if self.nesterov else b
            if not self.classic:
                g = g * scale
            p.assign(w - g)
        return changed


class OptimizerGroup(Optimizer):
    """Several optimizers stepped as one (e.g. different learning rates for two parts of a model).

    ``step()`` realizes every optimizer's update in one schedule; ``group[i]`` is the i-th optimizer.
    """

    def __init__(self, *optimizers: Optimizer):  # no super().__init__: the members own params and state
        if not optimizers or not all(isinstance(o, Optimizer) for o in optimizers):
            raise TypeError("OptimizerGroup takes one or more Optimizers")
        self.optimizers = optimizers
        self.params = [p for o in optimizers for p in o.params]
        self.buffers = [b for o in optimizers for b in o.buffers]
        self.device = optimizers[0].device

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    def zero_grad(self) -> None:
        """Forget the gradients of every member's parameters."""
        for o in self.optimizers:
            o.zero_grad()

    def schedule_step(self) -> list[Tensor]:
        """Every member's update, built but not run; returns the tensors to realize."""
        return _dedup(t for o in self.optimizers for t in o.schedule_step())

    def state_dict(self) -> dict[str, Tensor]:
        """Each member's state under the prefix ``"<index>."``."""
        return {f"{i}.{k}": v for i, o in enumerate(self.optimizers) for k, v in o.state_dict().items()}

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Load what :meth:`state_dict` saved, member by member."""
        for i, o in enumerate(self.optimizers):
            o.load_state_dict({k[len(f"{i}."):]: v for k, v in state_dict.items() if k.startswith(f"{i}.")})


# --- gradient clipping ---------------------------------------------------------------------------
def _grads_of(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p for p in params if p.grad is not None]


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale all gradients together so their joint ``norm_type`` norm is at most ``max_norm``; returns that norm.

    Like ``torch.nn.utils.clip_grad_norm_``: the scale is ``min(1, max_norm / (norm + 1e-6))``. The norm and
    the scaled gradients are realized together, in one schedule: the gradients are scaled in place, and a
    gradient realized alone would change the norm the others are scaled by.
    """
    params = _grads_of(parameters)
    if not params:
        return Tensor(0.0)
    norm_type = float(norm_type)
    if math.isinf(norm_type):
        per = [_grad(p).detach().abs().max() for p in params]
        total = per[0]
        for n in per[1:]:
            total = total.maximum(n)
    else:
        total = sum((_grad(p).detach().abs().pow(norm_type).sum() for p in params[1:]),
                    _grad(params[0]).detach().abs().pow(norm_type).sum())
        total = total.sqrt() if norm_type == 2.0 else total.pow(1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(float(total.item())):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so "
                           f"it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           f"norm anyway, set `error_if_nonfinite=False`")
    coef = (max_norm / (total + 1e-6)).minimum(1.0)
    with no_grad():
        for p in params:
            g = _grad(p)
            g.assign(g.detach() * coef.cast(g.dtype))
    Tensor.realize_all(total, *(p.grad for p in params if p.grad is not None))
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every gradient element to ``[-clip_value, clip_value]`` (``torch.nn.utils.clip_grad_value_``)."""
    with no_grad():
        for p in _grads_of(parameters):
            g = _grad(p)
            g.assign(g.detach().maximum(-clip_value).minimum(clip_value))


# --- learning-rate schedules ---------------------------------------------------------------------
class LRScheduler:
    """Base class of the schedules: ``step()`` advances ``last_epoch`` and writes the new lr into the optimizer.

    Values are computed in Python (float64) from a closed form of ``last_epoch``, like torch's
    schedulers, and written into the optimizer's 1-element ``lr`` tensor. Constructing a
    schedule performs the first ``step()`` (epoch 0), as in torch.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        self.base_lr = optimizer._get_scalar("lr")
        self.last_epoch = last_epoch
        self._last_lr: list[float] = [self.base_lr]
        self.step()

    def get_lr(self) -> float:
        """The learning rate for ``self.last_epoch``."""
        raise NotImplementedError

    def step(self) -> None:
        """Move to the next epoch (or iteration) and set the optimizer's learning rate."""
        self.last_epoch += 1
        lr = self.get_lr()
        self.optimizer._set_scalar("lr", lr)
        self._last_lr = [lr]

    def get_last_lr(self) -> list[float]:
        """The learning rate set by the last ``step()`` (a one-element list, as torch returns one per group)."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """The schedule's state (everything but the optimizer), as plain Python values."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`."""
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float], last_epoch: int = -1):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> float:
        """``base_lr * lr_lambda(last_epoch)``."""
        return self.base_lr * self.lr_lambda(self.last_epoch)

    def state_dict(self) -> dict[str, Any]:
        """The state without the (unpicklable) function."""
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambda"}


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> float:
        """``base_lr * gamma ** (epoch // step_size)``."""
        return self.base_lr * self.gamma ** (self.last_epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """Multiply the lr by ``gamma`` at each epoch in ``milestones``."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> float:
        """``base_lr * gamma ** (number of milestones reached)``."""
        return self.base_lr * self.gamma ** bisect.bisect_right(self.milestones, self.last_epoch)


class ExponentialLR(LRScheduler):
    """Multiply the lr by ``gamma`` every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> float:
        """``base_lr * gamma ** epoch``."""
        return self.base_lr * self.gamma ** self.last_epoch


class LinearLR(LRScheduler):
    """Scale the lr linearly from ``start_factor`` to ``end_factor`` over ``total_iters`` epochs."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> float:
        """The base lr times the interpolated factor."""
        frac = min(self.total_iters, self.last_epoch) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * frac)


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the base lr down to ``eta_min`` over ``T_max`` epochs (then back up, periodically)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> float:
        """``eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``."""
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2


class OneCycleLR(LRScheduler):
    """The 1cycle policy: warm up to ``max_lr``, then anneal far below the start; call ``step()`` after every batch.

    With ``cycle_momentum`` the momentum (SGD's ``momentum`` or Adam's ``b1``) moves the opposite
    way between ``max_momentum`` and ``base_momentum``. Phases and values follow torch's OneCycleLR.
    """

    def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int | None = None, epochs: int | None = None,
                 steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum: float = 0.85, max_momentum: float = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1):
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
            if epochs <= 0 or steps_per_epoch <= 0:
                raise ValueError(f"Expected positive integer epochs and steps_per_epoch, got {epochs}, "
                                 f"{steps_per_epoch}")
            total_steps = epochs * steps_per_epoch
        if total_steps <= 0:
            raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self.total_steps, self.anneal_strategy, self.cycle_momentum = total_steps, anneal_strategy, cycle_momentum
        self.initial_lr = max_lr / div_factor
        self.max_lr, self.min_lr = max_lr, self.initial_lr / final_div_factor
        self.base_momentum, self.max_momentum = base_momentum, max_momentum
        warm_end = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(warm_end, self.initial_lr, self.max_lr, max_momentum, base_momentum),
                           (float(2 * pct_start * total_steps) - 2, self.max_lr, self.initial_lr, base_momentum,
                            max_momentum),
                           (total_steps - 1.0, self.initial_lr, self.min_lr, max_momentum, max_momentum)]
        else:
            self.phases = [(warm_end, self.initial_lr, self.max_lr, max_momentum, base_momentum),
                           (total_steps - 1.0, self.max_lr, self.min_lr, base_momentum, max_momentum)]
        if cycle_momentum:
            self._momentum_name = self._find_momentum(optimizer)
        optimizer._set_scalar("lr", self.initial_lr)
        self._last_momentum = max_momentum
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _find_momentum(optimizer: Optimizer) -> str:
        if isinstance(optimizer, SGD):
            if not optimizer.has_momentum:
                raise ValueError("cycle_momentum needs an SGD built with momentum > 0 (or pass cycle_momentum=False)")
            return "momentum"
        if isinstance(optimizer, LAMB):
            return "b1"
        raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _values(self) -> tuple[float, float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
        start = 0.0
        for i, (end, lr0, lr1, m0, m1) in enumerate(self.phases):
            if step <= end or i == len(self.phases) - 1:
                pct = (step - start) / (end - start)
                return self._anneal(lr0, lr1, pct), self._anneal(m0, m1, pct)
            start = end
        raise AssertionError("unreachable")

    def get_lr(self) -> float:
        """The lr of the current phase at ``last_epoch``."""
        return self._values()[0]

    def step(self) -> None:
        """Advance one batch: set the lr (and the momentum when cycling)."""
        super().step()
        if self.cycle_momentum:
            self._last_momentum = self._values()[1]
            self.optimizer._set_scalar(self._momentum_name, self._last_momentum)


__all__ = ["LAMB", "LARS", "SGD", "Adam", "AdamW", "CosineAnnealingLR", "ExponentialLR", "LRScheduler", "LambdaLR",
           "LinearLR", "MultiStepLR", "OneCycleLR", "Optimizer", "OptimizerGroup", "StepLR", "clip_grad_norm_",
           "clip_grad_value_"]
