"""The random stream is tinygrad 0.14's: the same seed gives the same numbers, on every device.

Every expected value below is a literal taken from tinygrad 0.14.0 (run on its CPU device, the bfloat16
draws on its PYTHON device). Uniform draws, integers, permutations, samples and masks are compared bit
for bit; values that pass through log and cos (randn, normal, kaiming_normal) within a few float32 ulps,
since tinygrad's own CPU and PYTHON devices differ from each other there by as much.
"""
from __future__ import annotations

import numpy as np
import pytest
from backend_utils import other_device

from ember import Device, GlobalCounters, Tensor, TinyJit, dtypes, nn


def _f64(t: Tensor) -> list:
    return np.asarray(t.numpy()).astype(np.float64).tolist()


def _affine_of_rand(t: Tensor, want: list, device: str) -> None:
    """``t`` (``rand() * scale + shift``) equals ``want`` bit for bit on the CPU device; elsewhere within the
    product's rounding: tinygrad's CPU device and ember's fuse the multiply-add into one rounding, the PYTHON
    interpreter and OpenCL round the product first."""
    got = t.numpy().astype(np.float64)
    if device == "CPU":
        assert got.tolist() == want
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-7)


def test_randint_after_manual_seed_42(device):
    Tensor.manual_seed(42)
    assert Tensor.randint(4, high=1000, device=device).tolist() == [533, 670, 763, 432]  # tinygrad 0.14 gives this


def test_a_sequence_of_calls_and_dtypes(device):
    # tinygrad 0.14 gives these, one call after another after manual_seed(42): each call moves the device's
    # counter on by the 32-bit words it used (2-byte floats share a word, float64 takes two)
    Tensor.manual_seed(42)
    assert Tensor.randint(4, high=1000, device=device).tolist() == [533, 670, 763, 432]
    assert _f64(Tensor.rand(3, device=device)) == [0.18275272846221924, 0.051476120948791504, 0.31145310401916504]
    assert _f64(Tensor.rand(5, device=device, dtype=dtypes.float16)) == [0.23828125, 0.9521484375, 0.1171875,
                                                                         0.759765625, 0.287109375]
    assert _f64(Tensor.rand(5, device=device, dtype=dtypes.bfloat16)) == [0.9921875, 0.1875, 0.7578125, 0.21875,
                                                                          0.078125]
    assert _f64(Tensor.rand(3, device=device, dtype=dtypes.float64)) == [0.8230110630708234, 0.9488637214815807,
                                                                         0.815417155442989]
    assert Tensor.randint(2, 4, low=-5, high=5, device=device).tolist() == [[2, -3, 4, 0], [-1, 4, -3, -4]]
    _affine_of_rand(Tensor.uniform(4, low=-2.0, high=3.0, device=device), [
        -0.7486112117767334, 1.8692092895507812, 2.66483473777771, -0.7031394243240356], device)
    assert _f64(Tensor.uniform(3, low=-2, high=3, dtype=dtypes.float16, device=device)) == [0.34375, 1.052734375,
                                                                                            -0.2314453125]
    assert _f64(Tensor.rand(1, device=device)) == [0.2368631362915039]
    assert Tensor._rng_devices[device][2] == 4 + 3 + 3 + 3 + 6 + 8 + 4 + 3 + 1  # words drawn


def test_manual_seed_restarts_the_stream(device):
    Tensor.manual_seed(42)
    Tensor.rand(100, device=device).realize()
    Tensor.manual_seed(42)  # as in tinygrad, the same numbers again from the start
    assert Tensor.randint(4, high=1000, device=device).tolist() == [533, 670, 763, 432]
    assert _f64(Tensor.rand(3, device=device)) == [0.18275272846221924, 0.051476120948791504, 0.31145310401916504]


@pytest.mark.parametrize("seed, want", [
    (0, [0.8280726671218872, 0.6228508949279785, 0.5572898387908936, 0.5873724222183228]),
    (1, [0.3963594436645508, 0.3038344383239746, 0.22018158435821533, 0.3790891170501709]),
    (1234, [0.4457383155822754, 0.19074082374572754, 0.9462800025939941, 0.010805010795593262]),
    (2 ** 40 + 5, [0.3820037841796875, 0.4123044013977051, 0.4209791421890259, 0.3060481548309326]),  # low word
    (-1, [0.25323426723480225, 0.4000053405761719, 0.8883266448974609, 0.7869913578033447]),
])
def test_seeds(device, seed, want):
    Tensor.manual_seed(seed)
    assert _f64(Tensor.rand(4, device=device)) == want  # tinygrad 0.14 gives these


# tinygrad 0.14 gives, after manual_seed(7), for rand(n): the fractions m = value * 2**23 at a few positions
# (0, 1, the middle ones, the last) and the sum of all of them
SIZES = {1: ([2862653], 2862653), 3: ([3644806, 396535, 76207], 4117548),
         1000: ([6278595, 3956547, 1818198, 1660150], 4086821527),
         2 ** 16 + 1: ([8023993, 5605694, 4324724, 4395035, 5217707], 275244600992)}


@pytest.mark.parametrize("n", list(SIZES))
def test_odd_sizes(device, n):
    if device == "PYTHON" and n > 1000:
        pytest.skip("the interpreter takes too long for 2**16 threefry blocks")
    Tensor.manual_seed(7)
    m = (Tensor.rand(n, device=device).numpy().astype(np.float64) * 2 ** 23).astype(np.int64)
    picks, total = SIZES[n]
    assert [int(m[i]) for i in sorted({0, 1, n // 2, (n + 1) // 2, n - 1}) if i < n] == picks
    assert int(m.sum()) == total


def test_odd_sizes_of_two_and_eight_byte_floats(device):
    # tinygrad 0.14 gives these after manual_seed(7): rand(1001, float16) (as m / 2**10), then rand(1001, float64)
    # (as m / 2**52; the sum modulo 2**61)
    Tensor.manual_seed(7)
    h = (Tensor.rand(1001, device=device, dtype=dtypes.float16).numpy().astype(np.float64) * 2 ** 10).astype(np.int64)
    assert h[[0, 1, 2, 500, 1000]].tolist() == [565, 518, 651, 192, 675] and int(h.sum()) == 509808
    d = (Tensor.rand(1001, device=device, dtype=dtypes.float64).numpy() * 2.0 ** 52).astype(np.int64)
    assert d[[0, 1, 500, 501, 1000]].tolist() == [2991663300058352, 1823188720286953, 3475423041853771,
                                                  2830234874129852, 814323290320968]
    assert int(d.sum() % 2 ** 61) == 2262342452569209571
    assert Tensor._rng_devices[device][2] == 501 + 2002  # tinygrad's counter reads [2503, 0] here


def test_randn_normal_and_kaiming_normal(device):
    # tinygrad 0.14 gives these after manual_seed(3); the Box-Muller log and cos round differently (tinygrad's
    # CPU and PYTHON devices differ from each other by up to 1e-6 too)
    Tensor.manual_seed(3)
    np.testing.assert_allclose(Tensor.randn(6, device=device).numpy(), [
        -1.07635498046875, 1.5961180925369263, 0.26631149649620056, 1.3013859987258911, 0.045235611498355865,
        -0.7462201118469238], rtol=0, atol=1e-6)
    np.testing.assert_allclose(Tensor.normal(2, 3, mean=10, std=2, device=device).numpy(), [
        [12.529375076293945, 10.578581809997559, 12.17425537109375],
        [11.547416687011719, 8.127642631530762, 9.093103408813477]], rtol=0, atol=4e-6)
    half = Tensor.randn(4, device=device, dtype=dtypes.float16)
    assert half.dtype == dtypes.float16
    np.testing.assert_allclose(half.numpy().astype(np.float64), [1.1142578125, -0.3134765625, -0.52783203125,
                                                                 -0.85498046875], rtol=0, atol=1e-3)
    np.testing.assert_allclose(Tensor.kaiming_normal(2, 3, device=device).numpy(), [
        [0.14686889946460724, -0.8047651648521423, 0.18207667768001556],
        [2.0119099617004395, -0.7067247033119202, -0.43505895137786865]], rtol=0, atol=2e-6)
    assert Tensor._rng_devices[device][2] == 12 + 12 + 8 + 12  # randn of n takes the words of rand(2, n)


def test_initializers_and_rand_like(device):
    Tensor.manual_seed(5)  # tinygrad 0.14 gives these, one call after another
    _affine_of_rand(Tensor.kaiming_uniform(3, 4, device=device), [
        [-0.7496748566627502, 0.08330369740724564, 0.8793487548828125, -0.8772411942481995],
        [-0.7341399788856506, 0.6265107989311218, -0.1220889538526535, 1.085627555847168],
        [-0.5601336359977722, -0.5558615326881409, 0.6547263860702515, 0.197381392121315]], device)
    _affine_of_rand(Tensor.glorot_uniform(2, 3, device=device), [
        [0.4385388493537903, -0.28673431277275085, -0.6596397757530212],
        [-0.5202726125717163, 0.3559828996658325, -0.3199262022972107]], device)
    _affine_of_rand(Tensor.scaled_uniform(2, 3, device=device), [
        [-0.33746108412742615, -0.050533659756183624, 0.17770791053771973],
        [0.0363956093788147, -0.15371283888816833, -0.366573303937912]], device)
    like = Tensor.ones(2, 2, dtype=dtypes.float16, device=device).rand_like()
    assert like.dtype == dtypes.float16 and _f64(like) == [[0.92578125, 0.8564453125], [0.1025390625, 0.3955078125]]


def test_layers_initialize_like_tinygrad():
    Tensor.manual_seed(5)  # tinygrad 0.14 gives these: Linear(3, 2), then Conv2d(2, 3, 3), weight before bias
    lin, conv = nn.Linear(3, 2), nn.Conv2d(2, 3, 3)
    dev = lin.weight.device
    _affine_of_rand(lin.weight, [[-0.47398796677589417, -0.01823834888637066, 0.0870589092373848],
                                 [0.013204175047576427, -0.19109128415584564, -0.02962525375187397]], dev)
    _affine_of_rand(lin.bias, [0.13078072667121887, 0.49787455797195435], dev)
    _affine_of_rand(conv.weight[0, 0], [[-0.1533464789390564, 0.06664416939020157, -0.1321743130683899],
                                        [-0.11495963484048843, -0.09748964756727219, 0.05024286359548569],
                                        [0.01040510181337595, 0.21826739609241486, -0.039433155208826065]], dev)
    _affine_of_rand(conv.bias, [-0.04071947559714317, -0.06265696883201599, 0.12610197067260742], dev)


def test_randperm(device):
    Tensor.manual_seed(11)  # tinygrad 0.14 gives these
    assert Tensor.randperm(6, device=device).tolist() == [1, 4, 5, 3, 0, 2]
    assert Tensor.randperm(20, device=device).tolist() == [18, 1, 16, 3, 12, 19, 14, 0, 4, 15, 6, 11, 7, 8, 17, 5,
                                                          13, 10, 2, 9]
    p = Tensor.randperm(3, device=device, dtype=dtypes.int64)
    assert p.dtype == dtypes.int64 and p.tolist() == [2, 1, 0]


def test_multinomial(device, monkeypatch):
    # tinygrad draws the uniforms of sampling with replacement on the default device (then moves them); with
    # weights on the default device all draws come from one stream, as here
    monkeypatch.setattr(Device, "DEFAULT", device)
    Tensor.manual_seed(13)  # tinygrad 0.14 gives these
    w = Tensor([[1.0, 2, 3, 4], [0, 5, 0, 1]], device=device)
    one = Tensor([1.0, 2, 3, 4], device=device)
    assert one.multinomial(20, replacement=True).tolist() == [2, 3, 3, 3, 3, 3, 2, 2, 3, 3, 3, 2, 1, 2, 1, 1, 3, 1,
                                                              3, 3]
    assert w.multinomial(6, replacement=True).tolist() == [[2, 3, 1, 1, 1, 3], [1, 1, 1, 1, 1, 3]]
    assert one.multinomial(3).tolist() == [0, 3, 1]
    assert w.multinomial(2).tolist() == [[2, 1], [1, 3]]
    assert w.multinomial(1).tolist() == [[0], [1]]


def test_dropout_masks(device):
    Tensor.manual_seed(17)  # tinygrad 0.14 gives these masks (in training mode)
    with Tensor.train():
        a = Tensor.ones(10, device=device).dropout(0.3)
        b = Tensor.ones(3, 7, device=device).dropout(0.5)
    assert (a.numpy() != 0).tolist() == [False, True, True, True, True, True, True, True, True, False]
    assert (b.numpy() != 0).tolist() == [[False, False, False, False, False, True, False],
                                         [True, False, False, False, False, True, True],
                                         [False, False, True, False, False, False, False]]
    assert set(a.numpy().tolist()) == {0.0, float(np.float32(1 / 0.7))}


def test_each_device_has_its_own_stream(device):
    other = other_device(device)
    # tinygrad 0.14 gives these: rand(3) on one device, rand(3) on a second (it joins with its own key and
    # counter), then rand(2) on the first again; the first device to draw gets the first key, whichever it is
    first, second, third = ([0.8968576192855835, 0.8028112649917603, 0.7207217216491699],
                            [0.7731679677963257, 0.2931230068206787, 0.5739573240280151],
                            [0.7652723789215088, 0.3397097587585449])
    Tensor.manual_seed(21)
    assert _f64(Tensor.rand(3, device=device)) == first
    assert _f64(Tensor.rand(3, device=other)) == second
    assert _f64(Tensor.rand(2, device=device)) == third
    Tensor.manual_seed(21)
    assert _f64(Tensor.rand(3, device=other)) == first
    assert _f64(Tensor.rand(3, device=device)) == second


def test_random_bits_with_an_explicit_key(device):
    key = Tensor([1, 2], dtype=dtypes.uint32, device=device)
    counter = Tensor([3, 4], dtype=dtypes.uint32, device=device)
    # tinygrad 0.14 gives these
    assert Tensor.random_bits(key, counter, 5).tolist() == [1778726050, 3792530969, 484810714, 3427664344, 3744864161]


def test_draws_are_device_kernels_reused_across_calls(device):
    Tensor.manual_seed(1)
    Tensor.rand(33, 3, device=device).realize()
    GlobalCounters.reset()
    Tensor.rand(33, 3, device=device).realize()
    assert GlobalCounters.kernel_count == 1 and GlobalCounters.kernels_compiled == 0


def test_jit_replays_draw_the_eager_stream(device):
    f = TinyJit(lambda: Tensor.randint(4, high=1000, device=device).realize())
    Tensor.manual_seed(42)
    replays = [f().tolist() for _ in range(4)]
    Tensor.manual_seed(42)
    assert replays == [Tensor.randint(4, high=1000, device=device).tolist() for _ in range(4)]
    assert replays[0] == [533, 670, 763, 432]


def test_too_large_a_draw_raises():
    with pytest.raises(NotImplementedError, match="too large"):
        Tensor.rand(2 ** 32, dtype=dtypes.float64)
