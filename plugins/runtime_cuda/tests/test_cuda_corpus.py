"""Every kernel of a corpus renders for CUDA and compiles for Turing, Ampere and Hopper, without a GPU.

With ``KERNEL_CORPUS=<folder>`` set (a corpus recorded by a test run; ``make test`` records the main
suite's and runs the ``corpus``-marked tests after it) the test compiles that whole corpus; otherwise it
schedules a small representative set of ops itself (:mod:`cuda_test_kernels`), so it never passes on
nothing. Kernels are joined into a few
NVRTC programs per architecture; ``ptxas`` then assembles each program's PTX for the real
architecture (NVRTC builds the CUBIN itself where the CUDA toolkit's ``ptxas`` is missing).
"""
from __future__ import annotations

import os
import time

import pytest
from ember_cuda.corpus_check import ARCHS, check_corpus, find_ptxas

from ember.testing import load_corpus
from ember.testing.kernels import representative_asts

pytestmark = pytest.mark.usefixtures("nvrtc_available")


@pytest.fixture(scope="module")
def corpus() -> list:
    folder = os.environ.get("KERNEL_CORPUS")
    if folder:
        asts = load_corpus(folder)
        assert asts, f"KERNEL_CORPUS={folder} holds no kernels: record it by running the backend suite with it set"
        return asts
    return representative_asts()


#: CUDA_CORPUS_ARCHS="sm_80" checks fewer architectures (each costs about as much as the others)
CHECKED_ARCHS = tuple(os.environ.get("CUDA_CORPUS_ARCHS", " ".join(ARCHS)).split())


#: KERNEL_CORPUS_ARCHS="sm_80 gfx1100" (any vendor's names): only those targets compile the recorded corpus; the
#: others compile the representative kernels (``make test`` keeps within its time this way). Unset: every target.
FULL_CORPUS_ARCHS = os.environ.get("KERNEL_CORPUS_ARCHS")


@pytest.mark.corpus
@pytest.mark.parametrize("arch", CHECKED_ARCHS)
def test_every_kernel_renders_and_compiles(corpus: list, arch: str) -> None:
    if FULL_CORPUS_ARCHS is not None and arch not in FULL_CORPUS_ARCHS.split():
        corpus = representative_asts()
    start = time.perf_counter()
    [result] = check_corpus(corpus, [arch])
    assert result.kernels == len(corpus) and result.programs >= 1
    assert result.assembler == ("ptxas" if find_ptxas() else "nvrtc")
    print(f"\n{arch}: {result.kernels} kernels in {result.programs} programs, {time.perf_counter() - start:.1f} s "
          f"(render {result.render_s:.1f} s, NVRTC {result.nvrtc_s:.1f} s, {result.assembler} {result.ptxas_s:.1f} s)")


def test_small_corpus_covers_every_dtype() -> None:
    """The corpus used without KERNEL_CORPUS touches every dtype, so a dtype the renderer mishandles fails here."""
    from ember.dtype import PtrDType, dtypes

    seen = set()
    for ast in representative_asts():
        seen |= {u.dtype.base for u in ast.toposort() if isinstance(u.dtype, PtrDType)}
    assert set(dtypes.fields().values()) <= seen, set(dtypes.fields().values()) - seen
