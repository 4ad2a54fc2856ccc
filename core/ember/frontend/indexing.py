"""Indexing ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


class IndexingMixin:
    """Indexing methods; see the module docstring."""

    __slots__ = ()
