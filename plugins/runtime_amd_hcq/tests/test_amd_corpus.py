"""Every kernel of a corpus renders for AMD GPUs, compiles for gfx1100 and gfx942, and passes the metadata checks.

With ``KERNEL_CORPUS=<folder>`` set (a corpus recorded by a test run; ``make test`` records the main
suite's and runs the ``corpus``-marked tests after it) the test compiles that whole corpus; otherwise
it schedules a small representative set of ops itself (:mod:`amd_test_kernels`), so it never passes
on nothing. Kernels are joined into programs of a few hundred per clang call, two calls at a time,
and each kernel's entry in the code object's metadata is checked
(:func:`ember_amd.corpus_check.check_kernel`). Nothing runs on a GPU.
"""
from __future__ import annotations

import os
import time

import pytest
from amd_test_tools import require_clang
from ember_amd.corpus_check import ARCHS, arch_limits, check_corpus, check_kernel
from ember_amd.elf import ArgInfo, KernelInfo
from ember_amd.renderer import AMDRenderer

from ember.testing import load_corpus
from ember.testing.kernels import representative_asts


@pytest.fixture(scope="module")
def corpus() -> list:
    folder = os.environ.get("KERNEL_CORPUS")
    if folder:
        asts = load_corpus(folder)
        assert asts, f"KERNEL_CORPUS={folder} holds no kernels: record it by running the backend suite with it set"
        return asts
    return representative_asts()


#: AMD_CORPUS_ARCHS="gfx1100" checks fewer targets
CHECKED_ARCHS = tuple(os.environ.get("AMD_CORPUS_ARCHS", " ".join(ARCHS)).split())


#: KERNEL_CORPUS_ARCHS="sm_80 gfx1100" (any vendor's names): only those targets compile the recorded corpus; the
#: others compile the representative kernels (``make test`` keeps within its time this way). Unset: every target.
FULL_CORPUS_ARCHS = os.environ.get("KERNEL_CORPUS_ARCHS")


@pytest.mark.corpus
@pytest.mark.parametrize("arch", CHECKED_ARCHS)
def test_every_kernel_compiles_and_passes_the_metadata_checks(corpus: list, arch: str) -> None:
    if FULL_CORPUS_ARCHS is not None and arch not in FULL_CORPUS_ARCHS.split():
        corpus = representative_asts()
    require_clang(arch)
    start = time.perf_counter()
    [result] = check_corpus(corpus, [arch])
    assert 0 < result.kernels <= len(corpus) and result.programs >= 1
    limits = arch_limits(arch)
    assert 0 < result.max_vgprs <= limits.max_vgprs and 0 < result.max_sgprs <= limits.max_sgprs
    print(f"\n{arch}: {result.kernels} distinct kernels of {len(corpus)} in {result.programs} programs, "
          f"{time.perf_counter() - start:.1f} s (render {result.render_s:.1f} s, clang {result.compile_s:.1f} s); "
          f"{result.with_scratch} use scratch, max {result.max_vgprs} VGPRs, {result.max_sgprs} SGPRs")


def test_small_corpus_covers_every_dtype() -> None:
    """The corpus used without KERNEL_CORPUS touches every dtype, so a dtype the renderer mishandles fails here."""
    from ember.dtype import PtrDType, dtypes

    seen = set()
    for ast in representative_asts():
        seen |= {u.dtype.base for u in ast.toposort() if isinstance(u.dtype, PtrDType)}
    assert set(dtypes.fields().values()) <= seen, set(dtypes.fields().values()) - seen


def _info(**changes) -> KernelInfo:
    fields = dict(name="k", descriptor_offset=0, kernarg_size=272, kernarg_align=8,
                  args=[ArgInfo("data0", 0, 8, "global_buffer"), ArgInfo("n_arg", 8, 8, "by_value"),
                        ArgInfo("", 16, 4, "hidden_block_count_x"), ArgInfo("", 28, 2, "hidden_group_size_x")],
                  group_segment_fixed_size=0, private_segment_fixed_size=0, sgpr_count=20, vgpr_count=8,
                  wavefront_size=32, max_flat_workgroup_size=1024)
    fields.update(changes)
    return KernelInfo(**fields)


SRC = ("/* ember-amd prelude: end */\nEMBER_KERNEL void k(__global float* restrict data0, const long n_arg) {\n"
       "  const int gidx0 = (int)EMBER_GLOBAL_ID(0);\n}\n")


@pytest.mark.parametrize("changes, problem", [
    ({}, None),
    ({"kernarg_size": 12}, "kernarg size 12"),
    ({"sgpr_count": 109}, "109 SGPRs"),
    ({"vgpr_count": 257}, "257 VGPRs"),
    ({"wavefront_size": 64}, "wave size 64"),
    ({"max_flat_workgroup_size": 256}, "max work-group size 256"),
    ({"args": [ArgInfo("data0", 0, 8, "global_buffer")]}, "1 explicit arguments"),
    ({"args": [ArgInfo("data0", 0, 8, "global_buffer"), ArgInfo("n_arg", 4, 8, "by_value")]}, "overlaps"),
    ({"args": [ArgInfo("data0", 0, 8, "by_value"), ArgInfo("n_arg", 8, 8, "by_value")]}, "expected global_buffer"),
    ({"args": [ArgInfo("data0", 0, 8, "global_buffer"), ArgInfo("n_arg", 8, 8, "by_value")]}, "hidden_group_size_x"),
])
def test_metadata_checks_catch_each_problem(changes, problem):
    problems = check_kernel(_info(**changes), SRC, AMDRenderer("gfx1100"))
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems
