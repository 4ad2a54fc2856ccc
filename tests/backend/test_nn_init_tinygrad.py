"""Default initialization of ember.nn layers is tinygrad 0.14's: after the same ``Tensor.manual_seed``, each
layer's parameters, their dtypes and the position of the random stream after it are tinygrad's.

Every expected value is a literal from tinygrad 0.14.0 on its CPU device. Uniform draws are ``rand() * scale +
shift``; on ember's CPU device they equal tinygrad's bit for bit, elsewhere within the product's rounding,
hence ``atol`` beside ``rtol`` (values near zero).

tinygrad's values were read with all of a layer's tensors realized together (or in the order they were drawn):
its draw counter is a lazily assigned tensor, so realizing a later draw before an earlier one shifts the
earlier one's values there. ember advances its counter on the host at each draw, so its values do not depend
on realization order and equal tinygrad's in-order ones.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from ember import Tensor, dtypes, nn
from ember.dtype import to_dtype
from ember.nn.state import get_state_dict

CLOSE = dict(rtol=1e-6, atol=5e-7)


def _f64(t: Tensor) -> np.ndarray:
    return np.asarray(t.numpy()).astype(np.float64)


# name -> (make, {state-dict key: (shape, dtype, first four values, sum)}, the next Tensor.rand(3))
# tinygrad 0.14 gives these, each built right after Tensor.manual_seed(0)
LAYERS: dict[str, tuple[Callable[[], Any], dict[str, tuple], list[float]]] = {
    "conv2d_groups2": (lambda: nn.Conv2d(8, 16, 3, groups=2), {
        "weight": ((16, 4, 3, 3), "float32", [0.03625402, 0.040942237, 0.11525019, 0.06129256], -0.048033714745542966),
        "bias": ((16,), "float32", [0.116804175, 0.0455107, -0.09362442, 0.023273883], 0.06655652000335976),
    }, [0.9617877, 0.46305358, 0.91484845]),
    "conv2d_depthwise": (lambda: nn.Conv2d(4, 4, (3, 2), groups=4, bias=False), {
        "weight": ((4, 1, 3, 2), "float32", [-0.08351339, 0.10756933, 0.08465005, 0.062125556], 0.04323798813857138),
    }, [0.8205589, 0.86314535, 0.17638123]),
    "conv2d_groups3": (lambda: nn.Conv2d(6, 9, 2, groups=3), {
        "weight": ((9, 2, 2, 2), "float32", [-0.1826878, 0.17791289, 0.051317297, -0.08730371], -1.6146722321864218),
        "bias": ((9,), "float32", [0.02038198, -0.20401305, -0.009370245, 0.057821542], -0.8311642110347748),
    }, [0.3740095, 0.76193607, 0.9270586]),
    "conv1d_groups2": (lambda: nn.Conv1d(4, 8, 4, groups=2), {
        "weight": ((8, 2, 4), "float32", [0.043887258, -0.07164079, 0.031851888, -0.2161153], -0.1236945390701294),
        "bias": ((8,), "float32", [-0.12897897, 0.20916033, -0.110621154, -0.19128585], -0.2770625948905945),
    }, [0.8000455, 0.49868858, 0.12261057]),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(8, 4, 3), {
        "weight": ((8, 4, 3, 3), "float32", [-0.024119517, -0.057253264, 0.10821257, 0.078449674], 2.9967832931288285),
        "bias": ((4,), "float32", [-0.08913013, 0.11291543, 0.0056803836, 0.08593467], 0.11540034553036094),
    }, [0.3986627, 0.34054196, 0.6255529]),
    "conv_transpose2d_groups2": (lambda: nn.ConvTranspose2d(4, 6, (3, 2), groups=2), {
        "weight": ((4, 3, 3, 2), "float32", [-0.019253537, -0.13929772, -0.0134791015, 0.15859419], 0.7335139724891633),
        "bias": ((6,), "float32", [0.07623947, 0.13977316, -0.17452334, 0.02516317], 0.09302709624171257),
    }, [0.053940654, 0.689504, 0.75251865]),
    "conv_transpose2d_nobias": (lambda: nn.ConvTranspose2d(3, 5, 2, bias=False), {
        "weight": ((3, 5, 2, 2), "float32", [0.10913758, -0.28510502, 0.07610664, -0.052216817], 0.8704109686077572),
    }, [0.28218985, 0.17670095, 0.4129187]),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(4, 6, 3, groups=2), {
        "weight": ((4, 3, 3), "float32", [-0.18167217, 0.10087329, 0.021572532, -0.19239877], -0.0605881130322814),
        "bias": ((6,), "float32", [-0.008149147, -0.1333888, 0.046014056, 0.027094403], 0.07582873292267323),
    }, [0.045031667, 0.26865673, 0.8786943]),
    "embedding": (lambda: nn.Embedding(10, 4), {
        "weight": ((10, 4), "float32", [0.2456281, 0.52211964, -0.046048597, -0.051293876], 0.3795931860804558),
    }, [0.8751731, 0.05797422, 0.4350655]),
    "embedding_big": (lambda: nn.Embedding(200, 16), {
        "weight": ((200, 16), "float32", [0.09782803, -0.16037679, 0.06187197, -0.12950477], -3.4872224748469307),
    }, [0.5449507, 0.1214416, 0.6841805]),
    "lstm": (lambda: nn.LSTMCell(8, 16), {
        "weight_ih": ((64, 8), "float32", [0.1762318, -0.1332671, 0.008575916, 0.16915041], 1.659301221370697),
        "weight_hh": ((64, 16), "float32", [0.020883024, -0.02488941, 0.23831695, 0.03680992], -0.28328216075897217),
        "bias_ih": ((64,), "float32", [0.0, 0.0, 0.0, 0.0], 0.0),
        "bias_hh": ((64,), "float32", [0.0, 0.0, 0.0, 0.0], 0.0),
    }, [0.70896435, 0.98967695, 0.8234767]),
    "lstm_nobias": (lambda: nn.LSTMCell(4, 5, bias=False), {
        "weight_ih": ((20, 4), "float32", [0.30282342, -0.072464675, 0.32474917, 0.14472805], -1.1255660490132868),
        "weight_hh": ((20, 5), "float32", [-0.42699513, -0.3896007, -0.003993923, 0.20813042], -1.8249511667527258),
    }, [0.7078215, 0.32714665, 0.94497013]),
    "linear": (lambda: nn.Linear(7, 3), {
        "weight": ((3, 7), "float32", [0.019450061, -0.3050601, -0.123798095, -0.12283468], -0.10568196699023247),
        "bias": ((3,), "float32", [0.3405294, -0.03484014, 0.3326715], 0.6383607648313046),
    }, [0.8205589, 0.86314535, 0.17638123]),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_init_and_stream_position(name: str) -> None:
    make, want, next_rand = LAYERS[name]
    Tensor.manual_seed(0)
    layer = make()
    got = get_state_dict(layer)
    assert list(got) == list(want)  # same parameters, same names, same order
    for key, (shape, dtype, first, total) in want.items():
        t = got[key]
        assert t.shape == shape and t.dtype == to_dtype(dtype), (key, t.shape, t.dtype)
        vals = _f64(t).reshape(-1)
        np.testing.assert_allclose(vals[:4], first, err_msg=key, **CLOSE)
        np.testing.assert_allclose(vals.sum(), total, rtol=1e-6, atol=5e-7 * vals.size, err_msg=key)
    # the stream moved on by exactly the words tinygrad's layer drew (ConvTranspose's thrown-away weight
    # included, LSTM biases drawing none)
    np.testing.assert_allclose(_f64(Tensor.rand(3)), next_rand, **CLOSE)


class _Model:
    def __init__(self) -> None:
        self.conv1 = nn.Conv2d(2, 4, 2)
        self.conv2 = nn.Conv2d(4, 4, 2, groups=2)
        self.bn = nn.BatchNorm(4)
        self.lin = nn.Linear(4, 3)
        self.emb = nn.Embedding(5, 3)


# tinygrad 0.14 gives these for the same model built after Tensor.manual_seed(0): every parameter and buffer
MODEL: dict[str, tuple] = {
    "conv1.weight": ((4, 2, 2, 2), "float32", [-0.17224708, -0.29966348, 0.1463561, -0.115139626, -0.2358546,
                                               -0.21837057, -0.32720292, -0.24500409, 0.24590747, -0.14674959,
                                               0.19677529, -0.21073845, 0.27582675, 0.026543241, 0.036152553,
                                               0.030232355, 0.10230734, 0.088636674, 0.10346444, -0.025949476,
                                               0.14272287, -0.17315552, -0.23254988, -0.109943844, -0.29160848,
                                               0.12879942, -0.21067743, 0.3304375, 0.33490205, -0.19766434,
                                               -0.23734854, -0.04263592]),
    "conv1.bias": ((4,), "float32", [-0.16325438, 0.012716884, 0.29140365, -0.16742523]),
    "conv2.weight": ((4, 2, 2, 2), "float32", [-0.21923119, 0.064474344, 0.0769614, -0.06653124, -0.12095362,
                                               0.030837178, -0.2279594, 0.2483415, -0.16812152, -0.20209998, 0.1854909,
                                               0.12026572, -0.23319453, 0.07576752, -0.07928866, 0.13520074,
                                               0.09470898, 0.21206802, -0.24042004, 0.17998105, 0.058475554,
                                               0.19264174, 0.18782163, 0.17308044, -0.16095674, -0.19766814,
                                               -0.18922114, -0.24865532, 0.0074168444, 0.016760409, 0.09238404,
                                               -0.1365878]),
    "conv2.bias": ((4,), "float32", [-0.050285578, -0.12256706, -0.039188147, 0.118582845]),
    "bn.weight": ((4,), "float32", [1.0, 1.0, 1.0, 1.0]),
    "bn.bias": ((4,), "float32", [0.0, 0.0, 0.0, 0.0]),
    "bn.num_batches_tracked": ((), "int64", [0]),
    "bn.running_mean": ((4,), "float32", [0.0, 0.0, 0.0, 0.0]),
    "bn.running_var": ((4,), "float32", [1.0, 1.0, 1.0, 1.0]),
    "lin.weight": ((3, 4), "float32", [-0.006621003, -0.12313104, 0.4694165, 0.21635401, -0.086058974, 0.25607336,
                                       0.43601584, 0.038404226, -0.030927062, -0.08164954, -0.38610923, -0.3453796]),
    "lin.bias": ((3,), "float32", [0.014541149, 0.0698576, 0.09441507]),
    "emb.weight": ((5, 3), "float32", [0.43867096, -0.27021936, 0.093343504, 0.045033153, 0.19144216, 0.69819236,
                                       0.41168264, -0.6998502, 0.83533925, -0.72906166, 0.6312017, 0.030936174,
                                       -0.06656184, 0.4185482, -0.3489026]),
}


def test_small_model_built_in_sequence_matches() -> None:
    Tensor.manual_seed(0)
    got = get_state_dict(_Model())
    assert list(got) == list(MODEL)
    for key, (shape, dtype, values) in MODEL.items():
        t = got[key]
        assert t.shape == shape and t.dtype == to_dtype(dtype), (key, t.shape, t.dtype)
        np.testing.assert_allclose(_f64(t).reshape(-1), values, err_msg=key, **CLOSE)


def test_norms_draw_nothing_and_use_the_default_float() -> None:
    Tensor.manual_seed(0)
    norms = [nn.BatchNorm(4), nn.LayerNorm((3, 4)), nn.LayerNorm2d(3), nn.GroupNorm(2, 6), nn.InstanceNorm(3),
             nn.RMSNorm(5), nn.BatchNorm(3, affine=False, track_running_stats=False)]
    # tinygrad 0.14 gives this first draw after the seed: the norms above took nothing from the stream
    np.testing.assert_allclose(_f64(Tensor.rand(3)), [0.82807267, 0.6228509, 0.55728984], **CLOSE)
    for layer in norms:
        for key, t in get_state_dict(layer).items():
            want = dtypes.int64 if key == "num_batches_tracked" else dtypes.float32
            assert t.dtype == want, (type(layer).__name__, key, t.dtype)
            fill = 1.0 if key in ("weight", "running_var") else 0.0
            np.testing.assert_array_equal(t.numpy(), np.full(t.shape, fill), err_msg=f"{type(layer).__name__}.{key}")


def test_default_float_half(monkeypatch: pytest.MonkeyPatch) -> None:
    # tinygrad 0.14 with DEFAULT_FLOAT=HALF gives these after Tensor.manual_seed(0): parameters and norm
    # buffers in half, random draws of two bytes an element
    monkeypatch.setattr(dtypes, "default_float", dtypes.float16)
    Tensor.manual_seed(0)
    lin, bn, emb = nn.Linear(3, 2), nn.BatchNorm(2), nn.Embedding(3, 2)
    lstm, convt = nn.LSTMCell(2, 1), nn.ConvTranspose2d(2, 2, 1)
    want = {
        "lin.weight": [0.08343505859375, 0.377685546875, -0.388916015625, 0.140869140625, 0.056365966796875,
                       0.06536865234375],
        "lin.bias": [0.138671875, 0.3076171875],
        "emb.weight": [0.93310546875, 0.03424072265625, -0.67822265625, -0.68896484375, 0.50732421875, 0.0],
        "lstm.weight_ih": [-0.9765625, -0.837890625, -0.01171875, -0.046875, 0.98046875, -0.232421875,
                           -0.9609375, -0.478515625],
        "lstm.weight_hh": [-0.794921875, -0.521484375, 0.53515625, 0.521484375],
        "lstm.bias_ih": [0.0] * 4,
        "convt.weight": [0.4736328125, 0.48046875, -0.69189453125, 0.0621337890625],
        "convt.bias": [0.1422119140625, 0.2388916015625],
    }
    layers = {"lin": lin, "emb": emb, "lstm": lstm, "convt": convt}
    for key, values in want.items():
        owner, attr = key.split(".")
        t = getattr(layers[owner], attr)
        assert t.dtype == dtypes.float16, (key, t.dtype)
        np.testing.assert_allclose(_f64(t).reshape(-1), values, rtol=1e-3, atol=1e-3, err_msg=key)
    assert bn.weight.dtype == bn.running_var.dtype == dtypes.float16 and bn.num_batches_tracked.dtype == dtypes.int64
    np.testing.assert_allclose(_f64(Tensor.rand(3)), [0.9414, 0.785, 0.2158], rtol=0, atol=1e-3)
