"""The device conformance suite, runnable against any installed device.

    pytest --pyargs ember.testing --device=CL [--fuzz-graphs N]

checks a device against numpy and against ember's PYTHON reference device:

- ``test_casts``: every pair of dtypes, on values chosen to break conversions (NaN, infinities,
  signed zeros, denormals, halfway cases that only show after a second rounding, the edges of every
  integer width, out-of-range float -> int, which gives 0 on every ember device);
- ``test_op_families``: every op family once (integer semantics, float specials, math against
  numpy, reductions along each axis, movement, matmul, convolution and pooling, indexing and
  gather/scatter, scans, sorting);
- ``test_views_sizes``: views that start in the middle of an allocation, sizes 0, 1, primes and
  past 2**16 elements, and batched replay through the device's graph;
- ``test_runtime_values``: kernels that read symbolic ``Variable`` values at launch, and ``TinyJit``
  replays;
- ``test_fuzz_graphs``: a few hundred random op graphs (:mod:`ember.testing.fuzz`, fixed seeds),
  forward and gradients;
- ``test_conformance``: basics (0-d tensors, copies between devices, autograd, fusion).

Every first-party plugin runs it in CI; a third-party plugin should too. ``bench/fuzz.py`` runs
the fuzzer at scale.

A plugin for hardware the test machine lacks checks its renderer and compiler on a kernel corpus instead:
every kernel AST a workload lowered (recorded with ``KERNEL_CORPUS=<folder>``), read back with
:func:`load_corpus`.
"""
from ember.engine.corpus import load_corpus

__all__ = ["load_corpus"]
