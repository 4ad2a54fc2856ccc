"""Reduce ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`)."""
from __future__ import annotations


class ReduceMixin:
    """Reduce methods; see the module docstring."""

    __slots__ = ()
