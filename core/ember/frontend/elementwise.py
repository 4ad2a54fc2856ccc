"""What every elementwise family of the Tensor API builds on (a mixin of :class:`ember.tensor.Tensor`).

The arithmetic, transcendental and activation mixins share three things defined here: the
promotion of integer and bool inputs to the default float, torch's "not implemented" error for a
dtype a kernel rejects, and functions composed of several primitives that carry their own
gradient rule. Such a rule keeps a gradient from passing through an unused branch of a ``where``
(which would turn ``0 * inf`` into nan) and gives kinks the derivative torch defines
(``relu'(0) = 0``, hardtanh's strict interior ...).

Composed functions compute in the tensor's own float type, with float16 and bfloat16 going
through float32. The math-library ones (``wide``) evaluate float32 inputs in float64 when the
device supports it and round once, the way C libraries implement their float versions.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ember.device.registry import Device
from ember.dtype import dtypes
from ember.frontend.base import TensorBase
from ember.frontend.util import compute_dtype, not_implemented

if TYPE_CHECKING:
    from ember.tensor import Tensor

#: Evaluate float32 math-library functions in float64 where the device has float64.
PREFER_WIDE_MATH: bool = True

_F64_SUPPORT: dict[str, bool] = {}


def _has_float64(device: str) -> bool:
    if isinstance(device, tuple):  # a tensor on several devices
        return all(_has_float64(d) for d in device)
    if device not in _F64_SUPPORT:
        dev = Device[device]
        # the device's answer where it has one (it may not need its renderer, which can wait on a compiler probe)
        supported = getattr(dev, "supported_dtypes", None) or dev.renderer.supported_dtypes
        _F64_SUPPORT[device] = dtypes.float64 in supported
    return _F64_SUPPORT[device]


class ElementwiseMixin(TensorBase):
    """Float promotion, dtype checks and custom-gradient functions for the elementwise mixins."""

    __slots__ = ()

    def _to_float(self) -> Tensor:
        """Self as a float tensor (integers and bools become the default float, like torch)."""
        return self if self.dtype.kind == "f" else self.cast(dtypes.default_float)

    def _need_float(self, kernel: str) -> None:
        if self.dtype.kind != "f":
            raise not_implemented(kernel, self.dtype)

    def _custom(self, parents: tuple[Tensor, ...], out: Tensor,
                rule: Callable[[Tensor, Tensor, Sequence[Tensor]], Sequence[Tensor | None]], name: str) -> Tensor:
        """Attach ``rule`` as the gradient of ``out`` (computed from detached inputs) when it is a float."""
        if out.dtype.kind == "f":
            out._record(parents, rule, name)
        return out

    def _unary(self, name: str, fwd: Callable[[Tensor], Tensor], grad: Callable[[Tensor, Tensor, Tensor], Tensor],
               wide: bool = False) -> Tensor:
        """A float function computed from primitives with its own derivative ``grad(g, out, x)``.

        ``fwd`` runs on a detached input in the compute dtype: float32 for float16/bfloat16, and
        float64 for float32 when ``wide`` and the device supports float64.
        """
        x = self._to_float()
        dt = x.dtype
        cdt = compute_dtype(dt)
        if wide and dt == dtypes.float32 and PREFER_WIDE_MATH and _has_float64(x.device):
            cdt = dtypes.float64
        out = fwd(x.detach().cast(cdt)).cast(dt)
        return self._custom((x,), out, lambda g, o, p: (grad(g, o, p[0]),), name)
