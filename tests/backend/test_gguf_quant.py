"""GGUF quantized weights dequantized by graph ops (``ggml_dequantize_tensor``) on the device.

The oracle is the ``gguf`` package's reference dequantizer (``gguf.quants.dequantize``, numpy): every
element must have the same float32 bits. Then a matmul reading the dequantized weight must equal
dequantize-then-matmul, and stay one kernel (the unpacking fused into it).
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import GlobalCounters, Tensor, dtypes
from ember.nn.gguf import GGML_TYPES, ggml_dequantize_tensor, ggml_matmul
from ember.nn.weights import GGUFError

gguf_quants = pytest.importorskip("gguf.quants", reason="the gguf package (extra llm-test) is the reference")
from gguf import GGMLQuantizationType  # noqa: E402

#: ggml type -> byte offsets of its float16 scale fields (set to finite values: real files have no NaN scales)
F16_FIELDS = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 12: [0, 2], 13: [0, 2], 14: [208]}


def _random_blocks(ggml_type: int, rows: int, blocks: int, seed: int) -> np.ndarray:
    """(rows, blocks * block bytes) random blocks whose scale fields are finite float16 values."""
    size = GGML_TYPES[ggml_type][2]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    for at in F16_FIELDS[ggml_type]:
        raw[..., at:at + 2] = (rng.standard_normal((rows, blocks, 1)) * 0.1).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, blocks * size)


@pytest.mark.parametrize("ggml_type", sorted(F16_FIELDS), ids=lambda t: GGML_TYPES[t][0])
def test_dequantize_bit_equal_to_gguf_reference(ggml_type: int) -> None:
    raw = _random_blocks(ggml_type, 3, 4, seed=ggml_type)
    ref = gguf_quants.dequantize(raw, GGMLQuantizationType(ggml_type))
    got = ggml_dequantize_tensor(Tensor(raw), ggml_type).numpy()
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("ggml_type", [3, 12, 14], ids=lambda t: GGML_TYPES[t][0])
def test_dequantize_on_python_oracle(ggml_type: int) -> None:
    """The same unpacking on the PYTHON interpreter (the codegen oracle), one block per row."""
    raw = _random_blocks(ggml_type, 2, 1, seed=100 + ggml_type)
    ref = gguf_quants.dequantize(raw, GGMLQuantizationType(ggml_type))
    got = ggml_dequantize_tensor(Tensor(raw, device="PYTHON"), ggml_type).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_plain_float_types(name: str) -> None:
    rng = np.random.default_rng(5)
    vals = rng.standard_normal((4, 64)).astype(np.float32)
    if name == "F16":
        bits, t = vals.astype(np.float16), Tensor(vals.astype(np.float16))
        ggml_type = 1
    else:
        bits = (vals.view(np.uint32) >> 16).astype(np.uint16)
        t, ggml_type = Tensor(bits).bitcast(dtypes.bfloat16), 30
    ref = gguf_quants.dequantize(bits.view(np.uint8), GGMLQuantizationType(ggml_type))
    got = ggml_dequantize_tensor(t, ggml_type).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), ref.reshape(got.shape).view(np.uint32))


@pytest.mark.parametrize("ggml_type", sorted(F16_FIELDS), ids=lambda t: GGML_TYPES[t][0])
@pytest.mark.parametrize("tokens", [1, 5])
def test_fused_matmul_equals_dequantize_then_matmul(ggml_type: int, tokens: int) -> None:
    block = GGML_TYPES[ggml_type][1]
    out_features, blocks = 24, 512 // block
    raw = _random_blocks(ggml_type, out_features, blocks, seed=7)
    weight = gguf_quants.dequantize(raw, GGMLQuantizationType(ggml_type))  # (out, in)
    x = np.random.default_rng(8).standard_normal((tokens, weight.shape[1])).astype(np.float32)
    raw_t, x_t = Tensor(raw).realize(), Tensor(x).realize()
    GlobalCounters.reset()
    got = ggml_matmul(x_t, raw_t, ggml_type).numpy()
    # one row: one kernel (the per-block dot products nest inside the sum over blocks; types with a per-block min
    # also sum x per block, in a kernel of its own), no kernel stores the dequantized matrix; several rows: the
    # weight is dequantized once, then multiplied
    assert GlobalCounters.kernel_count == (2 if tokens > 1 or ggml_type in (3, 7) else 1)
    want = x @ weight.T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_errors_name_the_problem() -> None:
    with pytest.raises(GGUFError, match="Q2_K"):
        ggml_dequantize_tensor(Tensor(np.zeros((1, 84), np.uint8)), 10)
    with pytest.raises(GGUFError, match="whole number of Q4_1 blocks"):
        ggml_dequantize_tensor(Tensor(np.zeros((1, 30), np.uint8)), 3)
    with pytest.raises(ValueError, match="x has 64 features, the weight 32"):
        ggml_matmul(Tensor(np.zeros((1, 64), np.float32)), Tensor(np.zeros((2, 20), np.uint8)), 3)
    with pytest.raises(TypeError, match="uint8"):
        ggml_dequantize_tensor(Tensor(np.zeros((1, 20), np.float32)), 3)
