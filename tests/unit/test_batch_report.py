"""Under DEBUG>=2 each batch of new kernels says where its time went: lowering, waiting for the compiler, cache."""
from __future__ import annotations

import re

import numpy as np

from ember import Context, Tensor


def test_a_batch_of_new_kernels_is_reported(capsys) -> None:
    x = Tensor(np.arange(1031, dtype=np.float32)).realize()  # a size no other test uses: the kernels are new
    capsys.readouterr()
    with Context(DEBUG=2):
        out = ((x * 3 + 1).sum() + (x - 2).max()).numpy()
    assert out == np.float32((np.arange(1031) * 3 + 1).sum() + 1028)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "new kernel" in ln]
    assert len(lines) == 1, lines
    m = re.fullmatch(r"(\w+): (\d+) new kernels? ready in ([\d.]+) s: lowering and rendering ([\d.]+) s, then "
                     r"([\d.]+) s waiting for the compiler; (\d+) built( \([\d.]+ s CPU in compiler processes\))?, "
                     r"(\d+) from the cache", lines[0])
    assert m is not None, lines[0]
    kernels, built, cached = int(m[2]), int(m[6]), int(m[8])
    assert kernels >= 1 and built + cached == kernels
    assert float(m[4]) <= float(m[3]) + 1e-3  # rendering is part of the whole


def test_nothing_is_reported_without_new_kernels(capsys) -> None:
    x = Tensor(np.arange(1033, dtype=np.float32)).realize()
    (x * 5).numpy()
    capsys.readouterr()
    with Context(DEBUG=2):
        (x * 5).numpy()  # the same kernel again
    assert "new kernel" not in capsys.readouterr().out
