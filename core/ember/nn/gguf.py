"""``gguf_load``: GGUF v2/v3 metadata and tensors.

Quantized tensors (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K ... Q8_K, IQ4_NL) are dequantized to float32
with numpy on the host; plain types stay zero-copy DISK views.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ember.dtype import DType, dtypes
from ember.helpers import prod
from ember.nn.weights import (
    GGUFError,
    _is_int,
    _Source,
)
from ember.tensor import Tensor

# =============================================================================================
# GGUF
# =============================================================================================

#: ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
#: ggml types stored as plain elements: loaded as zero-copy views in their own dtype
_GGML_PLAIN: dict[int, DType] = {0: dtypes.float32, 1: dtypes.float16, 24: dtypes.int8, 25: dtypes.int16,
                                 26: dtypes.int32, 27: dtypes.int64, 28: dtypes.float64, 30: dtypes.bfloat16}

_IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _f16(col: np.ndarray) -> np.ndarray:
    """(blocks, 2) uint8 little-endian float16 bytes -> (blocks, 1) float32."""
    return np.ascontiguousarray(col).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles of every byte, then high nibbles (the 32-element layout of Q4_0/Q4_1/Q5_x)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray, n: int = 32) -> np.ndarray:
    """(blocks, 4) uint8 little-endian uint32 -> (blocks, n) of its bits 0..n-1."""
    word = np.ascontiguousarray(qh).view("<u4")
    return ((word >> np.arange(n, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scale_min(sc: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit scale and min of sub-block ``j`` packed in the 12 scale bytes of Q4_K/Q5_K."""
    if j < 4:
        return (sc[:, j] & 63).astype(np.float32)[:, None], (sc[:, j + 4] & 63).astype(np.float32)[:, None]
    scale = (sc[:, j + 4] & 0x0F) | ((sc[:, j - 4] >> 6) << 4)
    mn = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
    return scale.astype(np.float32)[:, None], mn.astype(np.float32)[:, None]


def _dq_q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * (_nibbles(b[:, 2:18]).astype(np.float32) - 8)


def _dq_q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * _nibbles(b[:, 4:20]).astype(np.float32) + _f16(b[:, 2:4])


def _dq_q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)
    return _f16(b[:, 0:2]) * (q.astype(np.float32) - 16)


def _dq_q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return _f16(b[:, 0:2]) * q.astype(np.float32) + _f16(b[:, 2:4])


def _dq_q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32)


def _dq_q8_k(b: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4").astype(np.float32)
    return d * np.ascontiguousarray(b[:, 4:260]).view(np.int8).astype(np.float32)


def _dq_q2_k(b: np.ndarray) -> np.ndarray:
    scales, qs, d, dmin = b[:, 0:16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    out = np.empty((b.shape[0], 256), np.float32)
    for half in range(2):
        q = qs[:, 32 * half:32 * half + 32]
        for j in range(4):
            for sub in range(2):
                sc = scales[:, 8 * half + 2 * j + sub][:, None]
                vals = ((q[:, 16 * sub:16 * sub + 16] >> (2 * j)) & 3).astype(np.float32)
                at = 128 * half + 32 * j + 16 * sub
                out[:, at:at + 16] = d * (sc & 0x0F) * vals - dmin * (sc >> 4)
    return out


def _dq_q3_k(b: np.ndarray) -> np.ndarray:
    hmask, qs, d = b[:, 0:32], b[:, 32:96], _f16(b[:, 108:110])
    a = np.ascontiguousarray(b[:, 96:108]).view("<u4")  # (blocks, 3)
    lo4, hi2 = np.uint32(0x0F0F0F0F), np.uint32(0x03030303)
    packed = [(a[:, 0] & lo4) | (((a[:, 2] >> 0) & hi2) << 4), (a[:, 1] & lo4) | (((a[:, 2] >> 2) & hi2) << 4),
              ((a[:, 0] >> 4) & lo4) | (((a[:, 2] >> 4) & hi2) << 4),
              ((a[:, 1] >> 4) & lo4) | (((a[:, 2] >> 6) & hi2) << 4)]
    scales = np.ascontiguousarray(np.stack(packed, axis=1).astype("<u4")).view(np.int8).astype(np.float32) - 32
    out = np.empty((b.shape[0], 256), np.float32)
    for half in range(2):
        q = qs[:, 32 * half:32 * half + 32]
        for j in range(4):
            bit = 4 * half + j
            for sub in range(2):
                low = ((q[:, 16 * sub:16 * sub + 16] >> (2 * j)) & 3).astype(np.float32)
                high = (hmask[:, 16 * sub:16 * sub + 16] >> bit) & 1
                vals = low - np.where(high == 1, 0, 4).astype(np.float32)
                at = 128 * half + 32 * j + 16 * sub
                out[:, at:at + 16] = d * scales[:, 8 * half + 2 * j + sub][:, None] * vals
    return out


def _dq_q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin, sc, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:16], b[:, 16:144]
    out = np.empty((b.shape[0], 256), np.float32)
    for c in range(4):
        q = qs[:, 32 * c:32 * c + 32]
        s1, m1 = _k_scale_min(sc, 2 * c)
        s2, m2 = _k_scale_min(sc, 2 * c + 1)
        out[:, 64 * c:64 * c + 32] = d * s1 * (q & 0x0F).astype(np.float32) - dmin * m1
        out[:, 64 * c + 32:64 * c + 64] = d * s2 * (q >> 4).astype(np.float32) - dmin * m2
    return out


def _dq_q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin, sc, qh, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:16], b[:, 16:48], b[:, 48:176]
    out = np.empty((b.shape[0], 256), np.float32)
    for c in range(4):
        q = qs[:, 32 * c:32 * c + 32]
        s1, m1 = _k_scale_min(sc, 2 * c)
        s2, m2 = _k_scale_min(sc, 2 * c + 1)
        lo = (q & 0x0F) + 16 * ((qh >> (2 * c)) & 1)
        hi = (q >> 4) + 16 * ((qh >> (2 * c + 1)) & 1)
        out[:, 64 * c:64 * c + 32] = d * s1 * lo.astype(np.float32) - dmin * m1
        out[:, 64 * c + 32:64 * c + 64] = d * s2 * hi.astype(np.float32) - dmin * m2
    return out


def _dq_q6_k(b: np.ndarray) -> np.ndarray:
    ql, qh, d = b[:, 0:128], b[:, 128:192], _f16(b[:, 208:210])
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    out = np.empty((b.shape[0], 256), np.float32)
    for half in range(2):
        lq, hq, s = ql[:, 64 * half:64 * half + 64], qh[:, 32 * half:32 * half + 32], sc[:, 8 * half:8 * half + 8]
        parts = [(lq[:, 0:32] & 0x0F) | (((hq >> 0) & 3) << 4), (lq[:, 32:64] & 0x0F) | (((hq >> 2) & 3) << 4),
                 (lq[:, 0:32] >> 4) | (((hq >> 4) & 3) << 4), (lq[:, 32:64] >> 4) | (((hq >> 6) & 3) << 4)]
        for i, q in enumerate(parts):
            scale = np.repeat(s[:, 2 * i:2 * i + 2], 16, axis=1)
            at = 128 * half + 32 * i
            out[:, at:at + 32] = d * scale * (q.astype(np.float32) - 32)
    return out


def _dq_iq4_nl(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, 0:2]) * _IQ4NL_VALUES[_nibbles(b[:, 2:18])]


_DEQUANT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: _dq_q4_0, 3: _dq_q4_1, 6: _dq_q5_0, 7: _dq_q5_1, 8: _dq_q8_0, 10: _dq_q2_k, 11: _dq_q3_k,
    12: _dq_q4_k, 13: _dq_q5_k, 14: _dq_q6_k, 15: _dq_q8_k, 20: _dq_iq4_nl,
}


def ggml_dequantize(data: Any, ggml_type: int, n: int) -> np.ndarray:
    """Dequantize ``n`` elements of ggml type ``ggml_type`` from the raw block bytes ``data`` to float32 (numpy)."""
    if ggml_type not in GGML_TYPES:
        raise GGUFError(f"unknown ggml type {ggml_type}")
    name, block, size = GGML_TYPES[ggml_type]
    if ggml_type not in _DEQUANT:
        raise GGUFError(f"ggml type {name} cannot be dequantized by ember (supported: "
                        f"{', '.join(GGML_TYPES[t][0] for t in _DEQUANT)})")
    if n % block:
        raise GGUFError(f"{n} elements are not a whole number of {name} blocks of {block}")
    raw = np.frombuffer(data, dtype=np.uint8, count=n // block * size)
    return _DEQUANT[ggml_type](raw.reshape(-1, size)).reshape(-1)


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
    """``n`` elements of ggml type ``ggml_type`` from the uint8 tensor ``t`` of raw blocks.

    Plain types are reinterpreted; quantized ones are dequantized to float32 on the host (numpy).
    """
    src = _Source.open(t)
    if ggml_type in _GGML_PLAIN:
        dt = _GGML_PLAIN[ggml_type]
        if n * dt.itemsize > src.size:
            raise GGUFError(f"{src.name}: {n} {GGML_TYPES[ggml_type][0]} elements need {n * dt.itemsize} bytes, "
                            f"the tensor has {src.size}")
        return src.tensor(0, (n,), dt)
    name, block, size = GGML_TYPES.get(ggml_type, (str(ggml_type), 1, 1))
    if n // max(block, 1) * size > src.size:
        raise GGUFError(f"{src.name}: {n} {name} elements need {n // block * size} bytes, the tensor has {src.size}")
    return Tensor(ggml_dequantize(src.view, ggml_type, n), device=src.host_device())


# ---------------------------------------------------------------------------------------------
# dequantization as graph ops: the raw blocks stay on the device, and the arithmetic below is ordinary
# elementwise ops, so a matmul reading a dequantized weight fuses the unpacking into its own kernel
# ---------------------------------------------------------------------------------------------


def _g_f16(b: Tensor, at: int) -> Tensor:
    """The little-endian float16 at byte ``at`` of every block, as float32 (..., blocks, 1)."""
    lo, hi = b[..., at:at + 1].cast(dtypes.uint16), b[..., at + 1:at + 2].cast(dtypes.uint16)
    return (lo | (hi << 8)).bitcast(dtypes.float16).cast(dtypes.float32)


def _g_split(q: Tensor, parts: int, bits: int, mask: int, axis: int) -> Tensor:
    """``q`` repeated ``parts`` times on a new axis before ``axis`` (counted from the end), each copy shifted
    right by ``bits`` more than the last and masked: the packed fields of every byte, in order."""
    shape = q.shape
    at = len(shape) + axis
    q = q.reshape(*shape[:at], 1, *shape[at:]).expand(*shape[:at], parts, *shape[at:])
    shifts = (Tensor.arange(parts, device=q.device) * bits).cast(q.dtype).reshape(parts, *([1] * (len(shape) - at)))
    return (q >> shifts) & mask


def _g_bits32(qh: Tensor) -> Tensor:
    """(..., blocks, 4) bytes of a little-endian uint32 -> (..., blocks, 32): its bits 0..31."""
    return _g_split(qh.reshape(*qh.shape, 1), 8, 1, 1, -1).reshape(*qh.shape[:-1], 32)


def _f32(x: Tensor) -> Tensor:
    return x.cast(dtypes.float32)


# Each unpacker returns a block as equal parts (..., blocks, S), in order: the block is their concatenation.
# Every part is computed with constant shifts, so a matmul can read each part against its slice of the input
# without index arithmetic in the kernel.

def _u8f(q: Tensor, minus: int = 0) -> Tensor:
    """The small unsigned integers ``q`` (uint8) minus ``minus`` as float32, exactly: ``q`` goes into the low
    mantissa bits of 2**23 and 2**23 + minus is subtracted. Unlike an int -> float cast this is integer and float
    arithmetic only, which C compilers vectorize (the cast is rendered with a select keeping zero's sign)."""
    return (q.cast(dtypes.uint32) | 0x4B000000).bitcast(dtypes.float32) - float(2 ** 23 + minus)


#: the block-affine types of 4-bit quants (Q4_0, Q4_1) and 5-bit ones (Q5_0, Q5_1): (byte of m or None, byte of
#: the 16 bytes of nibbles, byte of the 4 bytes of fifth bits or None, what is subtracted from q); d is at byte 0
_NIBBLE_LAYOUTS: dict[int, tuple[int | None, int, int | None, int]] = {
    2: (None, 2, None, 8), 3: (2, 4, None, 0), 6: (None, 6, 2, 16), 7: (2, 8, 4, 0),
}


def _nibbles16(qs: Tensor) -> Tensor:
    """(..., blocks, 16) bytes -> (..., blocks, 32): the low nibbles, then the high ones, as one expression (a
    concatenation of the two would be a masked select with index arithmetic on every element)."""
    return Tensor.stack(qs & 0x0F, qs >> 4, dim=-2).reshape(*qs.shape[:-1], 32)


def _nibble_blocks(ggml_type: int, whole: bool) -> Callable[[Tensor], tuple[Tensor, Tensor | None, Any]]:
    """The unpacker of a type of :data:`_NIBBLE_LAYOUTS`: (d, m, q) with q the whole block (``whole``) or its two
    halves of 16 (the low nibbles, then the high ones)."""
    m_at, qs_at, qh_at, minus = _NIBBLE_LAYOUTS[ggml_type]

    def unpack(b: Tensor) -> tuple[Tensor, Tensor | None, Any]:
        d, m, qs = _g_f16(b, 0), None if m_at is None else _g_f16(b, m_at), b[..., qs_at:qs_at + 16]
        high = None if qh_at is None else _g_bits32(b[..., qh_at:qh_at + 4]) << 4
        if whole:
            q = _nibbles16(qs)
            return d, m, _u8f(q if high is None else q | high, minus)
        lo, hi = qs & 0x0F, qs >> 4
        if high is not None:
            lo, hi = lo | high[..., :16], hi | high[..., 16:]
        return d, m, [_u8f(lo, minus), _u8f(hi, minus)]
    return unpack


def _a_q8_0(b: Tensor) -> tuple[Tensor, Tensor | None, list[Tensor]]:
    # the int8 value plus 128, unsigned; two halves of 16 like the 4- and 5-bit types: the matvec adds the halves
    # elementwise and reduces 16 lanes per block, not 32 (gcc folds each block's lanes one by one, and the
    # 49152-row output head of a SmolLM2 file took ~15-25% longer with 32)
    return _g_f16(b, 0), None, [_u8f(b[..., 2 + 16 * h:18 + 16 * h] ^ 0x80, 128) for h in range(2)]


def _w_q8_0(b: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
    return _g_f16(b, 0), None, _u8f(b[..., 2:34] ^ 0x80, 128)


#: block-affine types as (d, m, q) with q the whole block (..., blocks, 32): the dequantized weight of prefill
_AFFINE_WHOLE: dict[int, Callable[[Tensor], tuple[Tensor, Tensor | None, Tensor]]] = {
    **{t: _nibble_blocks(t, whole=True) for t in _NIBBLE_LAYOUTS}, 8: _w_q8_0,
}

_Affine = Callable[[Tensor], tuple[Tensor, "Tensor | None", list[Tensor]]]
#: block-affine types: a block is ``d * q + m`` (m optional) with one d (and m) per block and integer-valued q
#: parts, so a dot product with a block is ``d * sum(x * q) + m * sum(x)``: the scales apply once per block
_AFFINE: dict[int, _Affine] = {**{t: _nibble_blocks(t, whole=False) for t in _NIBBLE_LAYOUTS}, 8: _a_q8_0}


def _affine_parts(fn: _Affine) -> Callable[[Tensor], list[Tensor]]:
    def parts(b: Tensor) -> list[Tensor]:
        d, m, qs = fn(b)
        return [q * d if m is None else d * q + m for q in qs]  # the reference's order of operations
    return parts


def _g_k_scales(sc: Tensor) -> tuple[Tensor, Tensor]:
    """The eight 6-bit scales and mins packed in the 12 scale bytes of Q4_K/Q5_K: float32 (..., blocks, 8)."""
    lo_s, lo_m = sc[..., 0:4] & 63, sc[..., 4:8] & 63
    hi_s = (sc[..., 8:12] & 0x0F) | ((sc[..., 0:4] >> 6) << 4)
    hi_m = (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)
    return _f32(Tensor.cat(lo_s, hi_s, dim=-1)), _f32(Tensor.cat(lo_m, hi_m, dim=-1))


def _p_k(b: Tensor, qs_at: int, qh_at: int | None) -> list[Tensor]:
    """Q4_K (``qh_at`` None) and Q5_K: eight parts of 32, each with its own 6-bit scale and min."""
    d, dmin = _g_f16(b, 0), _g_f16(b, 2)
    sc, mn = _g_k_scales(b[..., 4:16])
    parts = []
    for j in range(8):
        q = (b[..., qs_at + 32 * (j // 2):qs_at + 32 * (j // 2) + 32] >> (4 * (j % 2))) & 0x0F
        if qh_at is not None:
            q = q | (((b[..., qh_at:qh_at + 32] >> j) & 1) << 4)
        parts.append((d * sc[..., j:j + 1]) * _f32(q) - dmin * mn[..., j:j + 1])
    return parts


def _p_q4_k(b: Tensor) -> list[Tensor]:
    return _p_k(b, 16, None)


def _p_q5_k(b: Tensor) -> list[Tensor]:
    return _p_k(b, 48, 16)


def _p_q6_k(b: Tensor) -> list[Tensor]:
    """Sixteen parts of 16, each with its own int8 scale."""
    scale = _g_f16(b, 208) * _f32(b[..., 192:208].bitcast(dtypes.int8))
    parts = []
    for p in range(16):
        half, i, k = p // 8, (p % 8) // 2, 16 * (p % 2)
        lo_at, hi_at = 64 * half + 32 * (i % 2) + k, 128 + 32 * half + k
        low = (b[..., lo_at:lo_at + 16] >> (4 * (i // 2))) & 0x0F
        high = (b[..., hi_at:hi_at + 16] >> (2 * i)) & 3
        parts.append(scale[..., p:p + 1] * _f32((low | (high << 4)).bitcast(dtypes.int8) - 32))
    return parts


#: ggml type id -> graph-op unpacker of raw blocks (..., blocks, bytes) -> equal parts (..., blocks, S)
_GRAPH_DEQUANT: dict[int, Callable[[Tensor], list[Tensor]]] = {
    **{t: _affine_parts(fn) for t, fn in _AFFINE.items()}, 12: _p_q4_k, 13: _p_q5_k, 14: _p_q6_k,
}
#: the ggml types :func:`ggml_dequantize_tensor` reads (plain float types are a cast)
GRAPH_DEQUANT_TYPES: tuple[str, ...] = ("F32", "F16", "BF16", *(GGML_TYPES[t][0] for t in _GRAPH_DEQUANT))


def _blocks(raw: Tensor, ggml_type: int) -> Tensor:
    """``raw`` (..., n_bytes) checked and viewed as (..., blocks, block bytes)."""
    if ggml_type not in _GRAPH_DEQUANT:
        name = GGML_TYPES[ggml_type][0] if ggml_type in GGML_TYPES else f"unknown type {ggml_type}"
        raise GGUFError(f"ggml type {name} cannot be dequantized in a kernel by ember (supported: "
                        f"{', '.join(GRAPH_DEQUANT_TYPES)})")
    name, _, size = GGML_TYPES[ggml_type]
    if raw.dtype != dtypes.uint8:
        raise TypeError(f"expected {name} blocks as a uint8 tensor, got {raw.dtype}")
    if not raw.shape or raw.shape[-1] % size:
        raise GGUFError(f"a row of {raw.shape[-1] if raw.shape else 0} bytes is not a whole number of {name} blocks "
                        f"of {size} bytes")
    return raw.reshape(*raw.shape[:-1], raw.shape[-1] // size, size)


def ggml_dequantize_tensor(raw: Tensor, ggml_type: int) -> Tensor:
    """Dequantize ``raw`` to float32 with graph ops (no host work: it fuses into the kernel that reads it).

    ``raw`` is (..., n_bytes) uint8 blocks of ggml type ``ggml_type`` (the last axis a whole number of
    blocks), or, for F32/F16/BF16, a tensor already in that dtype. The result is (..., n_elements).
    """
    if ggml_type in (0, 1, 30):
        return raw.cast(dtypes.float32)
    b = _blocks(raw, ggml_type)
    if ggml_type in _AFFINE_WHOLE:
        d, m, q = _AFFINE_WHOLE[ggml_type](b)
        block = q * d if m is None else d * q + m  # the reference's order of operations
        return block.reshape(*raw.shape[:-1], b.shape[-2] * GGML_TYPES[ggml_type][1])
    parts = _GRAPH_DEQUANT[ggml_type](b)
    block = Tensor.cat(*parts, dim=-1) if len(parts) > 1 else parts[0]
    return block.reshape(*raw.shape[:-1], b.shape[-2] * GGML_TYPES[ggml_type][1])


def ggml_matmul(x: Tensor, raw: Tensor, ggml_type: int) -> Tensor:
    """``x @ W.T`` for the (out, in) weight ``W`` stored as ``raw`` (see :func:`ggml_dequantize_tensor`).

    For one row of ``x`` (decoding) the blocks are unpacked inside the matvec kernel, never stored; for more
    rows the weight is dequantized once into a temporary buffer, then multiplied.
    """
    if ggml_type in (0, 1, 30):
        return x @ raw.cast(dtypes.float32).T
    b = _blocks(raw, ggml_type)
    if raw.ndim != 2:
        raise ValueError(f"ggml_matmul needs a 2-D weight of rows of blocks, got shape {raw.shape}")
    out_features, nb = b.shape[0], b.shape[1]
    k = nb * GGML_TYPES[ggml_type][1]
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {k}")
    lead = x.shape[:-1]
    if prod(lead) > 1:
        # several rows (prefill): unpacking inside the matmul would repeat it for every row, so the weight is
        # dequantized once into a temporary buffer and multiplied by the ordinary matmul kernel
        return x @ ggml_dequantize_tensor(raw, ggml_type).contiguous().T
    if ggml_type in _AFFINE:
        d, m, qs = _AFFINE[ggml_type](b)
        xr, dot = _dot_parts(x, qs)
        per_block = dot.sum(-1) * d[..., 0]
        if m is not None:
            per_block = per_block + xr.sum((-2, -1)) * m[..., 0]
        return per_block.sum(-1).reshape(*lead, out_features)
    _, acc = _dot_parts(x, _GRAPH_DEQUANT[ggml_type](b))
    return acc.sum((-2, -1)).reshape(*lead, out_features)


def _dot_parts(x: Tensor, parts: list[Tensor]) -> tuple[Tensor, Tensor]:
    """One row ``x`` (..., k) against a weight unpacked as equal parts (out, blocks, S): ``x`` as (..., 1, blocks,
    parts, S), and the sum over the parts of each part times its slice of ``x`` (..., out, blocks, S), elementwise
    (the parts stay separate expressions, so the kernel reads each against its slice without index arithmetic)."""
    xr = x.reshape(*x.shape[:-1], 1, parts[0].shape[-2], len(parts), parts[0].shape[-1])
    acc = xr[..., 0, :] * parts[0]
    for p in range(1, len(parts)):
        acc = acc + xr[..., p, :] * parts[p]
    return xr, acc


_GGUF_SCALARS: dict[int, tuple[str, str]] = {  # value type -> (struct format, name)
    0: ("<B", "UINT8"), 1: ("<b", "INT8"), 2: ("<H", "UINT16"), 3: ("<h", "INT16"), 4: ("<I", "UINT32"),
    5: ("<i", "INT32"), 6: ("<f", "FLOAT32"), 7: ("<?", "BOOL"), 10: ("<Q", "UINT64"), 11: ("<q", "INT64"),
    12: ("<d", "FLOAT64"),
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_MAX_DIMS = 4
_GGUF_MAX_NESTING = 16  # arrays of arrays: real files nest one or two levels
_GGUF_MAX_DIM = 2 ** 63 - 1  # dimensions are u64 in the file; tensor sizes are int64


class _GGUFReader:
    def __init__(self, src: _Source):
        self.src, self.pos = src, 0

    def take(self, n: int, what: str) -> memoryview:
        """The next ``n`` bytes; ``what`` names the field in the error when the file ends first."""
        if n < 0 or self.pos + n > self.src.size:
            raise GGUFError(f"{self.src.name}: the file ends while reading {what} (truncated or corrupt file)")
        out = self.src.view[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        """The next value of struct format ``fmt``."""
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        """The next GGUF string (u64 length, UTF-8 bytes)."""
        n = self.scalar("<Q", what)
        raw = self.take(n, what)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.src.name}: {what} is not valid UTF-8 ({e})") from e

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        """The next metadata value of GGUF value type ``vtype`` (arrays become lists)."""
        if depth > _GGUF_MAX_NESTING:
            raise GGUFError(f"{self.src.name}: {what} nests arrays more than {_GGUF_MAX_NESTING} deep "
                            "(corrupt file)")
        if vtype in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[vtype][0], what)
        if vtype == _GGUF_STRING:
            return self.string(what)
        if vtype == _GGUF_ARRAY:
            itype, count = self.scalar("<I", what), self.scalar("<Q", what)
            if itype in _GGUF_SCALARS:
                fmt = _GGUF_SCALARS[itype][0]
                raw = self.take(count * struct.calcsize(fmt), what)
                return np.frombuffer(raw, dtype=np.dtype(fmt)).tolist()
            if itype == _GGUF_ARRAY and count * 12 > self.src.size - self.pos:  # each needs its type and count
                raise GGUFError(f"{self.src.name}: {what} claims {count} arrays, more than the file can hold "
                                "(truncated or corrupt file)")
            return [self.value(itype, what, depth + 1) for _ in range(count)]
        raise GGUFError(f"{self.src.name}: {what} has unknown value type {vtype}")


class GGUFTensor(NamedTuple):
    """A tensor of a GGUF file as stored: ``data`` is a zero-copy view of its bytes.

    Plain types (F32, F16, BF16, ints) are viewed in their dtype with ``shape``; quantized types as uint8
    rows of raw blocks, ``(prod(shape[:-1]), bytes per row)``.
    """
    shape: tuple[int, ...]
    ggml_type: int
    data: Tensor

    @property
    def type_name(self) -> str:
        """The ggml type's name (Q4_1, F32 ...)."""
        return GGML_TYPES[self.ggml_type][0]


def gguf_load(fn: Tensor | str | os.PathLike[str] | bytes) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Read a GGUF (v2 or v3) file: ``(metadata, {name: tensor})``.

    Tensor shapes are numpy order (GGUF lists dimensions fastest first, so they are reversed).
    Plain tensors (F32, F16, BF16, F64, I8 ... I64) keep their dtype and are zero-copy DISK views
    of the file; quantized ones (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    Q8_K, IQ4_NL) are dequantized to float32 by numpy on the host, at load time, on the default device.
    """
    metadata, tensors = _gguf_parse(fn, raw=False)
    return metadata, {k: v.data for k, v in tensors.items()}


def gguf_read(fn: Tensor | str | os.PathLike[str] | bytes) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """Read a GGUF file without dequantizing: ``(metadata, {name: GGUFTensor})``, every tensor a zero-copy
    view of its stored bytes (quantized ones for :func:`ggml_dequantize_tensor`). Any ggml type is accepted."""
    return _gguf_parse(fn, raw=True)


def _gguf_parse(fn: Any, raw: bool) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    src = _Source.open(fn)
    r = _GGUFReader(src)
    where = src.name
    magic = bytes(r.take(4, "the magic number")) if src.size >= 4 else bytes(src.view)
    if magic != b"GGUF":
        raise GGUFError(f"{where}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = r.scalar("<I", "the version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version >> 16:
            raise GGUFError(f"{where}: a big-endian GGUF file; ember reads little-endian GGUF only")
        raise GGUFError(f"{where}: unsupported GGUF version {version} (ember reads versions 2 and 3)")
    n_tensors, n_kv = r.scalar("<Q", "the tensor count"), r.scalar("<Q", "the metadata count")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}")
        vtype = r.scalar("<I", f"the type of metadata {key!r}")
        metadata[key] = r.value(vtype, f"metadata {key!r}")
    alignment = metadata.get("general.alignment", 32)
    if not _is_int(alignment) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{where}: general.alignment must be a power of two, got {alignment!r}")
    infos = []
    for i in range(n_tensors):
        name = r.string(f"the name of tensor #{i}")
        what = f"tensor {name!r}"
        n_dims = r.scalar("<I", what)
        if n_dims > _GGUF_MAX_DIMS:
            raise GGUFError(f"{where}: {what} has {n_dims} dimensions, more than the {_GGUF_MAX_DIMS} GGUF allows")
        dims = [r.scalar("<Q", what) for _ in range(n_dims)]
        ggml_type, offset = r.scalar("<I", what), r.scalar("<Q", what)
        infos.append((name, tuple(reversed(dims)), ggml_type, offset))
    data_start = -(-r.pos // alignment) * alignment
    data_size = max(0, src.size - data_start)
    tensors: dict[str, GGUFTensor] = {}
    for name, shape, ggml_type, offset in infos:
        what = f"{where}: tensor {name!r}"
        if ggml_type not in GGML_TYPES:
            raise GGUFError(f"{what} has unknown ggml type {ggml_type}")
        tname, block, size = GGML_TYPES[ggml_type]
        if not raw and ggml_type not in _GGML_PLAIN and ggml_type not in _DEQUANT:
            raise GGUFError(f"{what} uses quantization {tname}, which ember cannot dequantize (supported: "
                            f"{', '.join(GGML_TYPES[t][0] for t in _DEQUANT)})")
        if any(d > _GGUF_MAX_DIM for d in shape) or prod(shape) > _GGUF_MAX_DIM:
            raise GGUFError(f"{what}: shape {shape} is larger than a tensor can be (dimensions and element count "
                            f"must fit in int64)")
        numel = prod(shape)
        if (shape[-1] if shape else numel) % block:
            raise GGUFError(f"{what}: its rows of {shape[-1] if shape else numel} elements are not whole {tname} "
                            f"blocks of {block}")
        nbytes = numel // block * size
        if offset % alignment:
            raise GGUFError(f"{what}: data offset {offset} is not a multiple of the alignment {alignment}")
        if offset + nbytes > data_size:
            raise GGUFError(f"{what}: its {nbytes} bytes at data offset {offset} run past the end of the file "
                            f"({data_size} bytes of tensor data; truncated file?)")
        if name in tensors:
            raise GGUFError(f"{what} is listed twice")
        start = data_start + offset
        if ggml_type in _GGML_PLAIN:
            data = src.tensor(start, shape, _GGML_PLAIN[ggml_type])
        elif raw:
            row = shape[-1] if shape else numel
            data = src.tensor(start, (numel // max(row, 1), row // block * size), dtypes.uint8)
        else:
            try:
                values = ggml_dequantize(src.view[start:start + nbytes], ggml_type, numel).reshape(shape)
            except (GGUFError, ValueError, MemoryError) as e:
                raise GGUFError(f"{what}: cannot dequantize its {numel} {tname} elements: {e}") from e
            data = Tensor(values, device=src.host_device())
        tensors[name] = GGUFTensor(shape, ggml_type, data)
    return metadata, tensors

__all__ = ["GGML_TYPES", "GGUFTensor", "GRAPH_DEQUANT_TYPES", "ggml_data_to_tensor", "ggml_dequantize",
           "ggml_dequantize_tensor", "ggml_matmul", "gguf_load", "gguf_read"]
