"""Creation ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.dtype import DType, dtypes, to_dtype
from ember.frontend.util import Scalar

if TYPE_CHECKING:
    from ember.tensor import Tensor


class CreationMixin:
    """Creation methods; see the module docstring."""

    __slots__ = ()

    def full_like(self, fill_value: Scalar, **kwargs: Any) -> Tensor:
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return type(self).full(self.shape, fill_value, **kwargs)

    def zeros_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(1, **kwargs)

    @classmethod
    def arange(cls, start: Scalar, stop: Scalar | None = None, step: Scalar = 1, **kwargs: Any) -> Tensor:
        """Values from ``start`` to ``stop`` (exclusive) by ``step``, like ``torch.arange``."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise RuntimeError("arange: step must be nonzero")
        n = max(0, math.ceil((stop - start) / step))
        dt = to_dtype(kwargs.pop("dtype")) if "dtype" in kwargs and kwargs["dtype"] is not None else \
            (dtypes.default_float if any(isinstance(x, float) for x in (start, stop, step)) else dtypes.default_int)
        kwargs.pop("dtype", None)
        values = start + np.arange(n, dtype=np.float64 if dt.kind == "f" else np.int64) * step
        return cls(values.astype(np.float64 if dt.kind == "f" else np.int64), dtype=dt, **kwargs)

    @classmethod
    def eye(cls, n: int, m: int | None = None, **kwargs: Any) -> Tensor:
        """The identity matrix (n x m)."""
        m = n if m is None else m
        kwargs.setdefault("dtype", dtypes.default_float)
        diag = cls.ones(n, 1, **kwargs).pad(((0, 0), (0, n))).reshape(n * (n + 1))[: n * n].reshape(n, n)
        return diag[:, :m] if m <= n else diag.pad(((0, 0), (0, m - n)))

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Seed the random number generator."""
        cls._seed = seed
        cls._rng = np.random.default_rng(seed)

    @classmethod
    def rand(cls, *shape: Any, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
        """Uniform random values in [0, 1)."""
        shp = cls._shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        arr = cls._rng.random(shp, dtype=np.float32)
        return cls(arr, **kwargs).cast(dt)

    @classmethod
    def randn(cls, *shape: Any, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
        """Standard normal random values."""
        shp = cls._shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        arr = cls._rng.standard_normal(shp, dtype=np.float32)
        return cls(arr, **kwargs).cast(dt)
