"""Kernels over views of more than 2**31 elements give the right values: each reads a few elements at the far
end of a huge view of a small buffer, so its index math runs past the int32 range while the kernel stays
cheap (in 32 bits the offsets wrap and the loads land before the buffer). Shapes of more elements than a
signed 64-bit index can count are refused when they are made."""
from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor
from ember.frontend.util import MAX_NUMEL, ArgumentError

ROWS = 5 * 10 ** 8  # rows of 7 elements: 3.5e9 elements, past 2**31 and past 2**32


def _flat(device: str) -> Tensor:
    """0, 1, ..., 6 repeated ROWS times, as a view of a 7-element buffer."""
    x = Tensor(np.arange(7, dtype=np.float32), device=device)
    return x.reshape(1, 7).expand(ROWS, 7).reshape(ROWS * 7)


def _want(start: int, stop: int) -> np.ndarray:
    return (np.arange(start, stop, dtype=np.int64) % 7).astype(np.float32)


def test_tail_of_a_reshaped_huge_expand(device):
    n = ROWS * 7
    np.testing.assert_array_equal(_flat(device)[-3:].numpy(), _want(n - 3, n))
    np.testing.assert_array_equal(_flat(device)[n - 2 ** 31 - 2:n - 2 ** 31 + 3].numpy(),
                                  _want(n - 2 ** 31 - 2, n - 2 ** 31 + 3))


def test_flipped_tail(device):
    np.testing.assert_array_equal(_flat(device).flip(0)[:4].numpy(), _want(ROWS * 7 - 4, ROWS * 7)[::-1])


def test_sum_of_the_tail(device):
    n = ROWS * 7
    assert _flat(device)[-1000:].sum().item() == _want(n - 1000, n).sum()


def test_tail_of_a_padded_huge_expand(device):
    x = Tensor(np.array([1, 2, 3], dtype=np.float32), device=device)
    padded = x.reshape(1, 3).expand(2 ** 30 + 1, 3).pad(((0, 0), (1, 0))).reshape(-1)  # rows of 0, 1, 2, 3
    np.testing.assert_array_equal(padded[-6:].numpy(), [2, 3, 0, 1, 2, 3])
    assert padded[-1000:].sum().item() == 250 * 6


def test_two_dims_whose_product_passes_2_31(device):
    x = Tensor(np.arange(5, dtype=np.float32), device=device)
    big = x.reshape(5, 1).expand(5, 2 ** 31 // 3).reshape(-1)  # each value repeated 715827882 times
    k = 2 ** 31 // 3
    np.testing.assert_array_equal(big[3 * k - 2:3 * k + 2].numpy(), [2, 2, 3, 3])
    np.testing.assert_array_equal(big[-2:].numpy(), [4, 4])


# --- shapes past 2**63 - 1 elements ------------------------------------------------------------------
REFUSED = {
    "ones": lambda: Tensor.ones(2 ** 40, 2 ** 40, device="PYTHON"),
    "empty": lambda: Tensor.empty(2 ** 32, 2 ** 32, device="PYTHON"),
    "full": lambda: Tensor.full((2 ** 62, 3), 1.0, device="PYTHON"),
    "expand": lambda: Tensor([1.0], device="PYTHON").reshape(1, 1).expand(2 ** 40, 2 ** 40),
    "pad": lambda: Tensor.ones(2 ** 62, device="PYTHON").pad(((0, 2 ** 62),)),
}


@pytest.mark.parametrize("make", REFUSED.values(), ids=REFUSED.keys())
def test_shapes_past_2_63_elements_are_refused(make):
    with pytest.raises(ArgumentError, match=r"shape \(\d+, ?(\d+)?\) has \d+ elements, more than the "
                                            r"9223372036854775807"):
        make()


def test_the_largest_shape_is_accepted():
    t = Tensor.ones(MAX_NUMEL, device="PYTHON")
    assert t.shape == (2 ** 63 - 1,)
    t = Tensor([1.0], device="PYTHON").reshape(1, 1).expand(2 ** 31, 2 ** 31).reshape(2 ** 62).pad(((0, 2 ** 62 - 1),))
    assert t.shape == (MAX_NUMEL,)


@pytest.mark.parametrize("n", [2 ** 31 + 7, 2 ** 32 + 5])
def test_positions_past_int32_and_uint32(device, n):
    """The position ramp that gather, scatter, argmax and one-hot indexing compare indices against counts past
    2**31 (int64, not a wrapped int32) and past 2**32 (not a wrapped uint32 ramp): a gather at index 2**31 + 6
    of a 2**31 + 7 buffer read 0 on a GPU with the memory for it."""
    pos = Tensor([0], device=device)._positions(n)
    assert pos.dtype.itemsize == 8
    np.testing.assert_array_equal(pos[-3:].numpy(), np.arange(n - 3, n))
    np.testing.assert_array_equal(Tensor._ramp(n, device)[-2:].numpy(), np.arange(n - 2, n))


def test_long_integer_ranges_are_computed_where_read(device):
    """An integer arange past 2**20 values is not built on the host: arange(2**31 + 7) is int64, and its last
    values are computed alone (its size in Python, not an n-long walk or a 16 GiB upload)."""
    n = 2 ** 31 + 7
    big = Tensor.arange(n, device=device)
    assert big.dtype.itemsize == 8 and big.shape == (n,)
    np.testing.assert_array_equal(big[-3:].numpy(), np.arange(n - 3, n))
    for args in [(2 ** 21,), (5, 2 ** 21 + 5, 3), (10, -2 ** 21, -7), (2 ** 33, 2 ** 33 + 2 ** 21 + 1, 2 ** 10)]:
        np.testing.assert_array_equal(Tensor.arange(*args, device=device).numpy(), np.arange(*args))
