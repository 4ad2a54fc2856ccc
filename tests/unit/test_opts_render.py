"""Kernels lowered with opts for a work-group target (OpenCL) render to valid OpenCL C with launch sizes that
fit: checked with clang's OpenCL front end, so no OpenCL device is needed."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opts import Opt

CLRenderer = pytest.importorskip("ember_opencl.renderer").CLRenderer
CLANG = shutil.which("clang")
pytestmark = pytest.mark.skipif(CLANG is None, reason="clang (for its OpenCL syntax check) is not installed")


def syntax_check(src: str, tmp_path) -> None:
    path = tmp_path / "kernel.cl"
    path.write_text(src)
    res = subprocess.run([CLANG, "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header", "-fsyntax-only",
                          "-target", "spir-unknown-unknown", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, f"{res.stderr}\n--- source ---\n{src}"


def kernels():
    a = Tensor(np.ones((64, 48), np.float32), device="PYTHON").realize()
    b = Tensor(np.ones((48, 32), np.float32), device="PYTHON").realize()
    x = Tensor(np.ones((2, 3, 7, 7), np.float32), device="PYTHON").realize()
    w = Tensor(np.ones((4, 3, 3, 3), np.float32), device="PYTHON").realize()
    return {"matmul": (a @ b).schedule()[-1].ast, "row sum": a.sum(1).schedule()[-1].ast,
            "column max": a.max(0).schedule()[-1].ast, "elementwise": (a * 2).exp().schedule()[-1].ast,
            # more output dims than launch dimensions: some are merged, LOCAL must avoid them
            "conv2d": x.permute(0, 1, 3, 2).conv2d(w, padding=(2, 1), dilation=2).schedule()[-1].ast,
            "4d elementwise": (x.permute(3, 2, 1, 0) + 1).schedule()[-1].ast}


@pytest.mark.parametrize("name", ["matmul", "row sum", "column max", "elementwise", "conv2d", "4d elementwise"])
def test_heuristic_cl_kernels_render_valid_opencl(name: str, tmp_path):
    renderer = CLRenderer(local_max=(256, 256, 256))
    spec = get_program(kernels()[name], renderer)
    assert spec.local_size is not None, "the heuristic picks work-group sizes on a work-group target"
    assert all(g % l == 0 for g, l in zip(spec.global_size, spec.local_size))
    assert all(l <= m for l, m in zip(spec.local_size, renderer.local_max))
    syntax_check(spec.src, tmp_path)


def test_explicit_opts_render_valid_opencl(tmp_path):
    renderer = CLRenderer(local_max=(256, 256, 256))
    spec = get_program(kernels()["matmul"], renderer, opts=[Opt("PADTO", 1, 24), Opt("LOCAL", 0, 8),
                                                            Opt("UPCAST", 1, 4), Opt("UNROLL", 2, 4)])
    assert spec.local_size == (1, 8, 1)  # axis 0 is the outer launch dimension
    assert spec.global_size == (12, 64, 1)  # 32 padded to 48, 4 outputs per work-item
    syntax_check(spec.src, tmp_path)
