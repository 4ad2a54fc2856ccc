"""Tensor creation (data, constants, ranges, identity) and random numbers, on every usable backend device.

Creation results are compared with torch (values, shapes and dtypes). The random number generator is
Threefry-2x32-20 evaluated on the device: it is checked against the published known-answer vectors
and a numpy reference, for bit-identical results across devices, and for the moments and bounds of
each distribution.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import pytest
from backend_utils import assert_like, other_device, tg_index

from ember import Device, GlobalCounters, Tensor, dtypes
from ember.dtype import DType

torch = pytest.importorskip("torch")

# --------------------------------------------------------------------------------------------
# Tensor(data): dtype inference like torch.tensor
# --------------------------------------------------------------------------------------------

DATA = [
    3, -2.5, True, [1, 2, 3], [[1.0, 2], [3, 4.5]], [True, False], [1, 2.5, True], [True, 2], [[[1], [2]]], (1, 2),
    [], [[], []], np.float64(2.0), np.int16(7), np.array([1, 2], np.int16), np.array([[0.5]], np.float64),
    np.array([True]), np.zeros((2, 0), np.float32), [np.int32(1), 2], 2 ** 40, [-1.5e30, 1e-30],
]


@pytest.mark.parametrize("data", DATA, ids=[f"{type(d).__name__}{i}" for i, d in enumerate(DATA)])
def test_tensor_from_data_infers_dtype_like_torch(device, data):
    want = torch.tensor(data)
    if want.dtype == torch.int64 and want.numel() and want.abs().max() < 2**31:
        want = want.int()  # Python ints become the default int, int32 as in tinygrad, unless they need int64
    assert_like(Tensor(data, device=device), want, exact=True)


def test_tensor_from_bytes_and_overrides(device):
    t = Tensor(b"\x01\xff\x10", device=device)
    assert t.dtype == dtypes.uint8 and t.tolist() == [1, 255, 16]
    assert_like(Tensor([1, 2], device=device, dtype=dtypes.float16), torch.tensor([1, 2], dtype=torch.float16))
    assert_like(Tensor([1.7, -1.7], device=device, dtype="int32"), torch.tensor([1.7, -1.7]).to(torch.int32))
    assert_like(Tensor(np.array([1.5, 2.5]), device=device, dtype=dtypes.float32), torch.tensor([1.5, 2.5]))
    r = Tensor([1.0, 2.0], device=device, requires_grad=True)
    assert r.requires_grad and r.grad is None and r.device == device


def test_list_of_numpy_scalars_keeps_their_dtype():
    for data in ([np.float64(2.0)], [np.int8(3)], [np.float16(1.0), 2]):
        assert_like(Tensor(data), torch.tensor(data), exact=True)


def test_tensor_from_bad_data_raises(device):
    with pytest.raises(ValueError):
        torch.tensor([[1, 2], [3]])
    with pytest.raises(ValueError):
        Tensor([[1, 2], [3]], device=device)
    with pytest.raises(TypeError):
        Tensor({"a": 1}, device=device)


# --------------------------------------------------------------------------------------------
# constants
# --------------------------------------------------------------------------------------------

def test_full_zeros_ones_empty(device):
    assert_like(Tensor.full((2, 3), 7, device=device), torch.full((2, 3), 7, dtype=torch.int32))  # the default int
    assert_like(Tensor.full((2, 3), 2.5, device=device), torch.full((2, 3), 2.5))
    assert_like(Tensor.full((2, 3), True, device=device), torch.full((2, 3), True))
    assert_like(Tensor.full(4, -1, device=device, dtype=dtypes.int8), torch.full((4,), -1, dtype=torch.int8))
    assert_like(Tensor.zeros(2, 3, device=device), torch.zeros(2, 3))
    assert_like(Tensor.zeros((2, 3), device=device, dtype=dtypes.int32), torch.zeros((2, 3), dtype=torch.int32))
    assert_like(Tensor.ones([2, 3], device=device, dtype=dtypes.bool), torch.ones([2, 3], dtype=torch.bool))
    assert_like(Tensor.ones(device=device), torch.ones(()))
    e = Tensor.empty(0, 3, device=device)
    assert e.shape == (0, 3) and e.dtype == dtypes.float32 and e.numpy().shape == (0, 3)
    with pytest.raises(RuntimeError):
        torch.zeros(-1, 2)
    with pytest.raises(RuntimeError):
        Tensor.zeros(-1, 2, device=device)


def test_zeros_requires_grad_is_a_leaf():
    x = Tensor.zeros(3, requires_grad=True)
    (x * 2).sum().backward()
    assert x.requires_grad and x.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_creation_with_requires_grad_gives_leaves(device):
    made = [Tensor.eye(2, device=device, requires_grad=True), Tensor([1.0, 2.0], device=device).zeros_like(
        requires_grad=True), Tensor.arange(3.0, device=device, requires_grad=True),
        Tensor.linspace(0, 1, 3, device=device, requires_grad=True), Tensor.rand(3, device=device, requires_grad=True),
        Tensor.uniform(3, device=device, requires_grad=True), Tensor.kaiming_uniform(3, 2, device=device,
                                                                                        requires_grad=True)]
    for t in made:
        assert t.requires_grad and t._ctx is None
        (t * 2).sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(), np.full(t.shape, 2.0, np.float32))


def test_like_constructors_take_overrides(device):
    other = other_device(device)
    base = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    tb = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    assert_like(base.zeros_like(), torch.zeros_like(tb))
    assert_like(base.ones_like(dtype=dtypes.float16), torch.ones_like(tb, dtype=torch.float16))
    assert_like(base.full_like(9), torch.full_like(tb, 9))
    moved = base.full_like(2.5, dtype=dtypes.float32, device=other)
    assert moved.device == other
    assert_like(moved, torch.full_like(tb, 2.5, dtype=torch.float32))
    e = base.empty_like(dtype=dtypes.int64)
    assert e.shape == (2, 3) and e.dtype == dtypes.int64 and e.device == device
    r = base.rand_like(dtype=dtypes.float32)
    assert r.shape == (2, 3) and r.dtype == dtypes.float32 and r.device == device
    f = Tensor([1.0, 2.0], device=device)
    assert f.randn_like().shape == (2,) and f.randn_like().dtype == dtypes.float32
    with pytest.raises(NotImplementedError):
        torch.rand_like(tb)
    with pytest.raises(NotImplementedError):
        base.rand_like()


# --------------------------------------------------------------------------------------------
# ranges and identity
# --------------------------------------------------------------------------------------------

ARANGE = [
    ((5,), {}), ((2, 9, 3), {}), ((5, 0, -2), {}), ((0.5, 2.0, 0.5), {}), ((0, 1, 0.1), {}), ((1, 0, -0.3), {}),
    ((4,), {"dtype": "float32"}), ((3, 3), {}), ((0,), {}), ((-3.5, 2, 0.75), {"dtype": "float64"}),
    ((0, 5.5, 1.5), {"dtype": "int64"}), ((0.5, 3), {"dtype": "int64"}), ((-1.5, 3, 1.1), {"dtype": "int32"}),
    ((10,), {"dtype": "int16"}), ((2.0, 7.0), {"dtype": "float16"}), ((5.0,), {}), ((1e6, 1e6 + 4), {}),
]


@pytest.mark.parametrize("args, kwargs", ARANGE, ids=[f"{a}{k.get('dtype', '')}" for a, k in ARANGE])
def test_arange_matches_torch(device, args, kwargs):
    tk = {k: getattr(torch, v) for k, v in kwargs.items()}
    want = torch.arange(*args, **tk)
    assert_like(Tensor.arange(*args, device=device, **kwargs), want if "dtype" in kwargs else tg_index(want))


def test_arange_errors_like_torch(device):
    for args in ((0, 10, -1), (0, 10, 0), (5, 0)):
        with pytest.raises(RuntimeError):
            torch.arange(*args)
        with pytest.raises(RuntimeError):
            Tensor.arange(*args, device=device)


LINSPACE = [((0, 10, 4), {"dtype": "int64"}), ((0, 1, 1), {}), ((0, 1, 0), {}), ((3, 1, 5), {}), ((-1, 1, 7), {}),
            ((2.5, -4.0, 11), {"dtype": "float64"}), ((0, 1, 5), {"dtype": "float16"})]


@pytest.mark.parametrize("args, kwargs", LINSPACE, ids=[f"{a}{k.get('dtype', '')}" for a, k in LINSPACE])
def test_linspace_matches_torch(device, args, kwargs):
    tk = {k: getattr(torch, v) for k, v in kwargs.items()}
    assert_like(Tensor.linspace(*args, device=device, **kwargs), torch.linspace(*args, **tk))


def test_linspace_negative_steps_raises(device):
    with pytest.raises(RuntimeError):
        torch.linspace(0, 1, -1)
    with pytest.raises(RuntimeError):
        Tensor.linspace(0, 1, -1, device=device)


@pytest.mark.parametrize("n, m, dtype", [(3, None, None), (2, 4, None), (4, 2, "int32"), (0, None, None),
                                         (1, None, "bool")])
def test_eye_matches_torch(device, n, m, dtype):
    kw = {"dtype": dtype} if dtype else {}
    tkw = {"dtype": getattr(torch, dtype)} if dtype else {}
    assert_like(Tensor.eye(n, m, device=device, **kw), torch.eye(n, m, **tkw) if m is not None else torch.eye(n, **tkw))
    with pytest.raises(RuntimeError):
        torch.eye(-1)
    with pytest.raises(RuntimeError):
        Tensor.eye(-1, device=device)


# --------------------------------------------------------------------------------------------
# the generator: Threefry-2x32-20
# --------------------------------------------------------------------------------------------

ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def threefry_reference(key: tuple[int, int], c0: np.ndarray, c1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds in numpy uint32 arithmetic (the Random123 definition)."""
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = c0.astype(np.uint32) + ks[0], c1.astype(np.uint32) + ks[1]
    for r in range(20):
        rot = ROTATIONS[r % 8]
        x0 = x0 + x1
        x1 = ((x1 << np.uint32(rot)) | (x1 >> np.uint32(32 - rot))) ^ x0
        if r % 4 == 3:
            s = r // 4 + 1
            x0 = x0 + ks[s % 3]
            x1 = x1 + ks[(s + 1) % 3] + np.uint32(s)
    return x0, x1


@pytest.mark.parametrize("key, ctr, expected", [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_threefry_reference_known_answers(key, ctr, expected):
    out = threefry_reference(key, np.array([ctr[0]], np.uint32), np.array([ctr[1]], np.uint32))
    assert (int(out[0][0]), int(out[1][0])) == expected


def reference_words(seed: int, counter: int, num: int) -> np.ndarray:
    """The ``num`` words of a draw of the first device to draw after ``manual_seed(seed)``, its counter at
    ``counter``: the draw key is the block of the counter under ``(sha256 word, seed word)``, and word pair ``j``
    is the block ``(j, j + ceil(num / 2))`` under the draw key (first words, then second words)."""
    base = (int.from_bytes(hashlib.sha256((0).to_bytes(4, "big")).digest()[-4:], "big"), seed & 0xFFFFFFFF)
    k0, k1 = threefry_reference(base, np.array([counter & 0xFFFFFFFF], np.uint32), np.array([counter >> 32], np.uint32))
    half = -(-num // 2)
    j = np.arange(half, dtype=np.uint32)
    x0, x1 = threefry_reference((int(k0[0]), int(k1[0])), j, j + np.uint32(half))
    return np.concatenate([x0, x1])[:num]


@pytest.mark.parametrize("seed", [0, 1234, 2 ** 40 + 5])
def test_device_words_match_reference(device, seed):
    n = 301  # odd, and not a power of two: the element counter is built from a smaller ramp
    Tensor.manual_seed(seed)
    first = Tensor.rand(n, device=device).numpy()
    second = Tensor.rand(n, device=device).numpy()  # the counter moved on by n words
    for got, counter in ((first, 0), (second, n)):
        want = (reference_words(seed, counter, n) >> np.uint32(9)).astype(np.float32) * np.float32(2.0 ** -23)
        np.testing.assert_array_equal(got, want)


def test_host_block_is_the_published_vector():
    from ember.frontend.creation import _threefry_host
    assert _threefry_host(0, 0, 0, 0) == (0x6B200159, 0x99BA4EFE)
    assert _threefry_host(0x13198A2E, 0x03707344, 0x243F6A88, 0x85A308D3) == (0xC4923A9C, 0x483DF7A0)


def test_long_ramp_counter_matches_reference(device):
    n = (1 << 16) + 3  # beyond the cached ramps: the counter is computed as row * b + column in the kernel
    if device == "PYTHON":
        n = 4099  # the interpreter's time; the long ramp is checked below
    Tensor.manual_seed(3)
    got = Tensor.rand(n, device=device).numpy()
    want = (reference_words(3, 0, n) >> np.uint32(9)).astype(np.float32) * np.float32(2.0 ** -23)
    np.testing.assert_array_equal(got, want)
    m = (1 << 16) + 3
    np.testing.assert_array_equal(Tensor._ramp(m, device).numpy(), np.arange(m, dtype=np.uint32))


def test_random_is_identical_across_devices():
    missing = [d for d in ("CPU", "PYTHON") if d not in Device.available()]
    if missing:
        pytest.skip(f"needs devices {missing}")
    draws = []
    for dev in ("CPU", "PYTHON"):
        Tensor.manual_seed(99)
        draws.append((Tensor.rand(5, 7, device=dev).numpy(), Tensor.randint(5, 7, low=-3, high=9, device=dev).numpy(),
                      Tensor.randperm(20, device=dev).numpy(), Tensor.randn(5, 7, device=dev).numpy(),
                      Tensor.rand(5, 7, device=dev, dtype=dtypes.float64).numpy()))
    (a_rand, a_int, a_perm, a_norm, a_f64), (b_rand, b_int, b_perm, b_norm, b_f64) = draws
    np.testing.assert_array_equal(a_rand, b_rand)
    np.testing.assert_array_equal(a_int, b_int)
    np.testing.assert_array_equal(a_perm, b_perm)
    np.testing.assert_array_equal(a_f64, b_f64)
    np.testing.assert_allclose(a_norm, b_norm, rtol=1e-5, atol=1e-6)  # log/cos may differ in the last bit


def test_reproducible_and_successive_draws_differ(device):
    Tensor.manual_seed(42)
    a, b = Tensor.rand(4, 5, device=device).numpy(), Tensor.rand(4, 5, device=device).numpy()
    Tensor.manual_seed(42)
    np.testing.assert_array_equal(Tensor.rand(4, 5, device=device).numpy(), a)
    np.testing.assert_array_equal(Tensor.rand(4, 5, device=device).numpy(), b)
    assert not np.array_equal(a, b)
    Tensor.manual_seed(43)
    assert not np.array_equal(Tensor.rand(4, 5, device=device).numpy(), a)


def test_one_kernel_compiled_once(device):
    Tensor.manual_seed(5)
    Tensor.rand(33, 3, device=device).realize()  # compiles
    GlobalCounters.reset()
    out = Tensor.rand(33, 3, device=device).realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.kernels_compiled == 0, "a new draw of the same shape must reuse the kernel"
    assert out.shape == (33, 3)


# --------------------------------------------------------------------------------------------
# distributions
# --------------------------------------------------------------------------------------------

N_MOMENTS = 100_000


def test_rand_moments_and_bounds(device):
    Tensor.manual_seed(11)
    r = Tensor.rand(N_MOMENTS, device=device)
    assert r.shape == (N_MOMENTS,) and r.dtype == dtypes.float32
    v = r.numpy()
    assert v.min() >= 0.0 and v.max() < 1.0
    assert abs(v.mean() - 0.5) < 0.005 and abs(v.var() - 1 / 12) < 0.002
    hist = np.histogram(v, bins=10, range=(0, 1))[0]
    chi2 = ((hist - N_MOMENTS / 10) ** 2 / (N_MOMENTS / 10)).sum()
    assert chi2 < 30, f"uniform histogram chi-square {chi2} (9 dof)"


def test_randn_normal_moments(device):
    Tensor.manual_seed(12)
    v = Tensor.randn(N_MOMENTS, device=device).numpy()
    assert v.dtype == np.float32 and np.isfinite(v).all()
    assert abs(v.mean()) < 0.015 and abs(v.std() - 1) < 0.015
    assert abs((v ** 3).mean()) < 0.05 and abs((v ** 4).mean() - 3) < 0.1
    w = Tensor.normal(N_MOMENTS, mean=3.0, std=0.5, device=device).numpy()
    assert abs(w.mean() - 3.0) < 0.01 and abs(w.std() - 0.5) < 0.01


def test_randn_cosine_is_tensor_cos_bit_for_bit(device):
    """float32 randn takes its Box-Muller cosine as sin(pi/2 - angle) in float64, one sine where Tensor.cos takes
    three (the angle is in [0, 2 pi): every 7th float32 there, 155M values, and the 400,000 nearest each zero of
    cos round to the same float32 as the float64 cos); the values are those of the general cos, bit for bit.
    randn of n elements reads the draw of rand(2, n): angles from the first row, radii from the second."""
    Tensor.manual_seed(31)
    got = Tensor.randn(4096, device=device).numpy()
    Tensor.manual_seed(31)
    u = Tensor.rand(2, 4096, device=device)
    want = ((u[0] * (2.0 * math.pi)).cos() * ((1.0 - u[1]).log() * -2.0).sqrt()).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float64])
def test_rand_other_float_dtypes(device, dtype):
    Tensor.manual_seed(4)
    v = Tensor.rand(500, device=device, dtype=dtype)
    assert v.dtype == dtype
    got = v.numpy()
    assert got.min() >= 0 and got.max() < 1 and 0.4 < got.mean() < 0.6
    if dtype == dtypes.float16:
        assert Tensor.randn(3, device=device, dtype=dtype).dtype == dtype


@pytest.mark.parametrize("dtype, mantissa", [(dtypes.float16, 10), (dtypes.bfloat16, 7), (dtypes.float32, 23),
                                             (dtypes.float64, 52)])
def test_units_are_exact_fractions_below_one(device, dtype, mantissa):
    Tensor.manual_seed(1)
    m = Tensor.rand(999, device=device, dtype=dtype).numpy().astype(np.float64) * 2.0 ** mantissa
    assert (m == np.floor(m)).all() and m.min() >= 0 and m.max() < 2 ** mantissa and m.max() > 0.99 * 2 ** mantissa


def test_rand_shapes_and_arguments(device):
    assert Tensor.rand(2, 3, device=device).shape == (2, 3)
    assert Tensor.rand((2, 3), device=device).shape == (2, 3)
    assert Tensor.rand([2, 3], device=device).shape == (2, 3)
    assert Tensor.rand(device=device).shape == ()
    assert Tensor.rand(0, 3, device=device).numpy().shape == (0, 3)
    assert Tensor.randn(device=device).shape == ()
    r = Tensor.rand(3, device=device, requires_grad=True)
    assert r.requires_grad and r._ctx is None
    for call in (lambda t: t.rand(-1), lambda t: t.randn(2, -1)):
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(Tensor)
    with pytest.raises(NotImplementedError):
        torch.rand(2, dtype=torch.int32)
    with pytest.raises(NotImplementedError):
        Tensor.rand(2, dtype=dtypes.int32, device=device)


def test_randint_both_signatures(device):
    Tensor.manual_seed(8)
    t = Tensor.randint(50, 40, low=-5, high=5, device=device)  # tinygrad: *shape, low=, high=
    assert t.shape == (50, 40) and t.dtype == dtypes.int32
    v = t.numpy()
    assert v.min() == -5 and v.max() == 4
    counts = np.bincount(v.reshape(-1) + 5, minlength=10)
    assert np.all(np.abs(counts - 200) < 60), counts
    u = Tensor.randint(3, 10, (4, 5), device=device)  # torch: low, high, size
    assert u.shape == (4, 5) and u.dtype == dtypes.int64
    assert u.numpy().min() >= 3 and u.numpy().max() < 10
    w = Tensor.randint(7, (100,), device=device, dtype=dtypes.int16)  # torch: high, size
    assert w.dtype == dtypes.int16 and 0 <= w.numpy().min() and w.numpy().max() < 7
    big = Tensor.randint(2 ** 40, (200,), device=device).numpy()
    assert big.min() >= 0 and big.max() < 2 ** 40 and big.max() > 2 ** 39
    assert Tensor.randint(device=device).shape == ()
    with pytest.raises(RuntimeError):
        torch.randint(5, 3, (2,))
    with pytest.raises(RuntimeError):
        Tensor.randint(5, 3, (2,), device=device)


def test_uniform_and_initializers(device):
    Tensor.manual_seed(2)
    u = Tensor.uniform(4000, low=-2.0, high=3.0, device=device).numpy()
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.1
    assert Tensor.uniform(4, low=0, high=10, dtype=dtypes.int32, device=device).dtype == dtypes.int32
    shape = (64, 3, 5)
    fan_in = 15
    bounds = {
        "scaled_uniform": (64 * 15) ** -0.5,
        "glorot_uniform": (6 / (64 + fan_in)) ** 0.5,
        "kaiming_uniform": 3 ** 0.5 * (2 / (1 + 0.01 ** 2)) ** 0.5 / fan_in ** 0.5,
    }
    for name, bound in bounds.items():
        w = getattr(Tensor, name)(*shape, device=device)
        assert w.shape == shape and w.dtype == dtypes.float32
        v = w.numpy()
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.95 * bound, name
        assert abs(v.std() - bound / 3 ** 0.5) < 0.1 * bound, name
    k = Tensor.kaiming_normal(*shape, a=0.0, device=device, requires_grad=True)
    assert k.requires_grad and abs(k.numpy().std() - (2 / fan_in) ** 0.5) < 0.05


def test_randperm(device):
    Tensor.manual_seed(6)
    for n in (0, 1, 10, 2049):  # beyond 2048 the ranking runs on the host
        p = Tensor.randperm(n, device=device)
        assert p.shape == (n,) and p.dtype == dtypes.int32
        np.testing.assert_array_equal(np.sort(p.numpy()), np.arange(n))
    many = np.stack([Tensor.randperm(4, device=device).numpy() for _ in range(3)])
    assert len({tuple(r) for r in many}) > 1
    assert Tensor.randperm(5, device=device, dtype=dtypes.int64).dtype == dtypes.int64
    with pytest.raises(RuntimeError):
        torch.randperm(-1)
    with pytest.raises(RuntimeError):
        Tensor.randperm(-1, device=device)


@pytest.mark.parametrize("n", [10, 2049])  # beyond 2048 the sort runs on the host
def test_randperm_is_the_stable_argsort_of_rand(device, n):
    Tensor.manual_seed(23)
    perm = Tensor.randperm(n, device=device).numpy()
    Tensor.manual_seed(23)
    np.testing.assert_array_equal(perm, np.argsort(Tensor.rand(n, device=device).numpy(), kind="stable"))


def test_multinomial_with_replacement_frequencies(device):
    Tensor.manual_seed(9)
    p = np.array([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]], np.float32)
    s = Tensor(p, device=device).multinomial(2000, replacement=True)
    assert s.shape == (2, 2000) and s.dtype == dtypes.int32
    for row, probs in zip(s.numpy(), p / p.sum(1, keepdims=True)):
        freq = np.bincount(row, minlength=4) / 2000
        assert freq[probs == 0].sum() == 0
        np.testing.assert_allclose(freq, probs, atol=0.04)
    one = Tensor(np.array([0.0, 0.0, 5.0], np.float32), device=device).multinomial(10, replacement=True)
    assert one.shape == (10,) and (one.numpy() == 2).all()


def test_multinomial_without_replacement(device):
    Tensor.manual_seed(10)
    p = np.array([0.1, 0.0, 0.6, 0.3], np.float32)
    rows = np.tile(p, (1500, 1))
    first = Tensor(rows, device=device).multinomial(1).numpy()[:, 0]
    np.testing.assert_allclose(np.bincount(first, minlength=4) / 1500, p, atol=0.045)
    s = Tensor(p, device=device).multinomial(4).numpy()
    assert sorted(s.tolist()) == [0, 1, 2, 3] and s[-1] == 1, "distinct; zero weight comes last"


def test_multinomial_errors_like_torch(device):
    cases = [(np.ones((2, 2, 2), np.float32), 1, False), (np.ones(2, np.float32), 3, False),
             (np.ones(2, np.float32), 0, True)]
    for p, n, repl in cases:
        with pytest.raises(RuntimeError):
            torch.from_numpy(p).multinomial(n, repl)
        with pytest.raises(RuntimeError):
            Tensor(p, device=device).multinomial(n, repl)


def test_random_dtype_defaults() -> None:
    specs: list[tuple[Any, DType]] = [
        (Tensor.rand(2), dtypes.float32), (Tensor.randn(2), dtypes.float32), (Tensor.randint(2), dtypes.int32),
        (Tensor.randperm(2), dtypes.int32), (Tensor.normal(2), dtypes.float32), (Tensor.uniform(2), dtypes.float32),
        (Tensor.randint(0, 3, (2,)), dtypes.int64), (Tensor([1.0]).multinomial(1), dtypes.int32),
    ]
    for made, dt in specs:
        assert made.dtype == dt and made.shape in ((2,), (1,))
