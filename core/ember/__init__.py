"""ember: a small, fast deep-learning framework with separately installable device plugins.

Public API::

    from ember import Tensor, dtypes, Device, Context, GlobalCounters, getenv, nn
"""
from ember.helpers import DEBUG, Context, GlobalCounters, gc_paused, getenv

with gc_paused():  # the import's burst of allocations would set off collections that find nothing (~8 ms)
    from ember import nn  # ``from ember import Tensor, nn`` as in tinygrad
    from ember.device.registry import Device
    from ember.dtype import DType, dtypes
    from ember.engine.jit import JitError, TinyJit, Variable, jit  # noqa: F401  (tinygrad names)
    from ember.function import function  # noqa: F401  (tinygrad's name; the module stays importable as ember.function)
    from ember.tensor import Tensor, no_grad

__version__ = "0.1.0"

__all__ = ["DEBUG", "Context", "DType", "Device", "GlobalCounters", "Tensor", "dtypes", "function", "getenv", "nn",
           "no_grad", "__version__"]
