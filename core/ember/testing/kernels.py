"""A small, representative set of kernel ASTs for compile-only checks of targets without hardware (CUDA, AMD)
when no recorded corpus is given.

Each entry schedules (without running) a few ops on the PYTHON device, so the ASTs cover every dtype,
casts and bitcasts, integer division and shifts, transcendental functions, reductions, matmul,
convolution, views (pad, shrink, flip, permute, expand) and gated loads.
"""
from __future__ import annotations

from typing import cast

import numpy as np

from ember import Tensor, dtypes
from ember.ir.uop import Ops, UOp

DEVICE = "PYTHON"


def _t(a: np.ndarray) -> Tensor:
    return Tensor(a, device=DEVICE).realize()


def _workloads() -> list[Tensor]:
    rng = np.random.default_rng(0)
    f32 = _t(rng.standard_normal((8, 16), dtype=np.float32))
    g32 = _t(rng.standard_normal((16, 12), dtype=np.float32))
    i32 = _t(rng.integers(-100, 100, (8, 16), dtype=np.int32))
    u8 = _t(rng.integers(0, 255, (8, 16), dtype=np.uint8))
    img = _t(rng.standard_normal((2, 3, 10, 10), dtype=np.float32))
    w = _t(rng.standard_normal((4, 3, 3, 3), dtype=np.float32))
    out: list[Tensor] = [
        (f32 * 2 + 1).relu().exp() - f32.sqrt().log(),          # elementwise chain, nan for negatives
        f32.sin() + f32.exp2() + f32.abs() ** 1.5,
        f32 @ g32,                                              # matmul
        f32.sum(axis=1), f32.max(axis=0), f32.prod(axis=1),     # reductions
        f32.softmax(axis=1), f32.argmax(axis=1),
        f32.sum(),                                              # full reduction
        img.conv2d(w, padding=1),                               # convolution with padded (gated) loads
        cast(Tensor, img.max_pool2d(2)),  # (a Tensor: no return_indices)
        f32.pad(((1, 1), (2, 0))).flip(0).permute(1, 0)[3:9, ::2].contiguous(),
        f32.reshape(8, 16, 1).expand(8, 16, 4).contiguous(),
        (i32 // 7) + (i32 % 5) + (i32 // (i32 + 101)) + (i32 % (i32 - 101)),
        (i32 << 3) ^ (i32 >> 2) | (i32 & 0xFF),
        (u8 >> 1) + u8 * 3,
        f32.cast(dtypes.int32) + i32, i32.cast(dtypes.float32) / 3,
        f32.cast(dtypes.uint8).cast(dtypes.int64), f32.cast(dtypes.bool).where(f32, -f32),
        f32.bitcast(dtypes.int32) >> 1, i32.bitcast(dtypes.float32) * 2,
        (f32 < f32.flip(0)) & (f32 != 0),
        f32 // 0.5, f32 % 0.3,
    ]
    for dt in (dtypes.float16, dtypes.bfloat16, dtypes.float64):
        x, y = f32.cast(dt), g32.cast(dt)
        out += [(x * 3 + 1).exp() / x, x @ y, x.sum(axis=1), x.max(axis=1), x.sqrt().sin(),
                x.cast(dtypes.int16), i32.cast(dt),
                x.cast(dtypes.float32) + x.cast(dtypes.float64).cast(dtypes.float32)]
    out += [f32.cast(dtypes.float16).bitcast(dtypes.int16), i32.cast(dtypes.int16).bitcast(dtypes.float16),
            f32.cast(dtypes.bfloat16).bitcast(dtypes.uint16), f32.cast(dtypes.float64).bitcast(dtypes.int64),
            i32.cast(dtypes.int64).cast(dtypes.bfloat16), i32.cast(dtypes.uint64).cast(dtypes.float16),
            i32.cast(dtypes.uint32).cast(dtypes.bfloat16)]
    for dt in (dtypes.int8, dtypes.uint16, dtypes.uint32, dtypes.int64, dtypes.uint64):
        x = i32.cast(dt)
        out += [x * 3 - x // 2, x.sum(axis=0), x.max(axis=1), (x << 1) >> 3]
    out += [Tensor.full((4, 4), float("nan"), device=DEVICE) + Tensor.full((4, 4), float("-inf"), device=DEVICE),
            Tensor.arange(37, device=DEVICE) * 2]
    return out


def representative_asts() -> list[UOp]:
    """Distinct kernel ASTs of the workloads above (scheduled, never run)."""
    found: dict[UOp, None] = {}
    for t in _workloads():
        for si in t.schedule():
            if si.ast.op is not Ops.COPY:
                found.setdefault(si.ast, None)
    return list(found)
