"""NN ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`)."""
from __future__ import annotations


class NNMixin:
    """NN methods; see the module docstring."""

    __slots__ = ()
