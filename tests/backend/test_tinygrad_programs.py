"""Programs written the way tinygrad's README and docs teach, run on ember by changing only the import.

Each test is one such program (``from tinygrad import Tensor, nn, dtypes`` became the import below), and
checks its results against numpy or against the same program written for torch: Tensor basics, integer
results (tinygrad's int32 default), ``gradient()`` on plain tensors, ``backward()``, ``nn`` layers with
``nn.optim``, ``Tensor.train()``, and a small MNIST-style training loop on random data.
"""
from __future__ import annotations

import numpy as np
import pytest

from ember import Device, Tensor, dtypes, nn  # the only line that differs from the tinygrad program

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _on_device(device: str):
    """The programs create tensors without ``device=``: run them on the device under test (as ``DEV=`` would)."""
    prev = Device._default  # an explicit choice made before this test, or None
    Device.DEFAULT = device
    try:
        yield
    finally:
        Device.DEFAULT = prev


def test_tensor_basics_like_the_quickstart():
    t = Tensor([1, 2, 3, 4])
    assert t.dtype == dtypes.int32 and t.shape == (4,)
    f = Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert f.dtype == dtypes.float32
    z, o = Tensor.zeros(2, 3), Tensor.ones(2, 3)
    full = Tensor.full((2, 3), 7)
    eye = Tensor.eye(3)
    r = Tensor.rand(2, 3)
    out = Tensor.stack(z, o, full.float(), dim=0)
    np.testing.assert_array_equal(out.numpy(), np.stack([np.zeros((2, 3)), np.ones((2, 3)), np.full((2, 3), 7)]))
    assert full.dtype == dtypes.int32
    np.testing.assert_array_equal(eye.numpy(), np.eye(3, dtype=np.float32))
    rv = r.numpy()
    assert rv.dtype == np.float32 and ((rv >= 0) & (rv < 1)).all()
    # arithmetic, matmul, reductions
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    got = ((f + 1) * 2 - f / 2).numpy()
    np.testing.assert_allclose(got, (a + 1) * 2 - a / 2)
    np.testing.assert_allclose(f.dot(f).numpy(), a @ a)
    np.testing.assert_allclose((f @ f.T).relu().sum(axis=1).numpy(), (a @ a.T).sum(axis=1))
    assert f.sum().item() == 10.0 and isinstance(f.mean().item(), float)
    np.testing.assert_array_equal((t * 2 + 1).numpy(), np.array([3, 5, 7, 9], np.int32))
    assert (t * 2).dtype == dtypes.int32
    # dtype limits, as tinygrad spells them
    assert (dtypes.int32.min, dtypes.int32.max) == (-2 ** 31, 2 ** 31 - 1)
    assert (dtypes.uint8.min, dtypes.uint8.max) == (0, 255)
    assert (dtypes.float32.min, dtypes.float32.max) == (-float("inf"), float("inf"))
    assert (dtypes.bool.min, dtypes.bool.max) == (False, True)
    assert dtypes.default_int == dtypes.int32 and dtypes.default_float == dtypes.float32


def test_integer_results_are_int32():
    x = np.array([[3.0, -1.0, 7.0, 0.5], [2.0, 9.0, -4.0, 9.0]], np.float32)
    t = Tensor(x)
    results = {
        "arange": (Tensor.arange(5), np.arange(5)),
        "arange_step": (Tensor.arange(2, 11, 3), np.arange(2, 11, 3)),
        "argmax": (t.argmax(axis=1), x.argmax(axis=1)),
        "argmax_flat": (t.argmax(), np.array(x.argmax())),
        "argmin": (t.argmin(axis=0), x.argmin(axis=0)),
        "argsort": (t.argsort(dim=1), np.argsort(x, axis=1, kind="stable")),
        "topk": (t.topk(2)[1], torch.tensor(x).topk(2)[1].numpy()),
        "nonzero": (Tensor([[1, 0], [0, 2]]).nonzero(), np.argwhere(np.array([[1, 0], [0, 2]]))),
        "one_hot": (Tensor([0, 2, 1]).one_hot(3), np.eye(3)[[0, 2, 1]]),
        "cummax": (t.cummax(1)[1], torch.tensor(x).cummax(1)[1].numpy()),
        "sum_of_bool": ((t > 0).sum(), np.array((x > 0).sum())),
    }
    for name, (got, want) in results.items():
        assert got.dtype == dtypes.int32, f"{name}: {got.dtype}"
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)
    # accuracy: (pred == y).mean() is a float, as in tinygrad's MNIST tutorial
    pred, y = Tensor([1, 2, 3, 4]), Tensor([1, 0, 3, 0])
    acc = (pred == y).mean()
    assert acc.dtype == dtypes.float32 and acc.item() == 0.5
    assert isinstance((pred == y).mean().item(), float)


def test_autograd_readme_example_matches_torch():
    x = Tensor.eye(3, requires_grad=True)
    y = Tensor([[2.0, 0, -2.0]], requires_grad=True)
    z = y.matmul(x).sum()
    z.backward()
    tx = torch.eye(3, requires_grad=True)
    ty = torch.tensor([[2.0, 0, -2.0]], requires_grad=True)
    ty.matmul(tx).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy())


def test_gradient_of_plain_tensors_like_the_docs():
    # the Tensor.gradient docstring's example: no requires_grad anywhere
    x = Tensor.eye(3)
    y = Tensor([[2.0, 0, -2.0]])
    z = y.matmul(x).sum()
    dx, dy = z.gradient(x, y)
    assert dx.tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [-2.0, -2.0, -2.0]]
    assert dy.tolist() == [[1.0, 1.0, 1.0]]
    # an intermediate tensor can be a target too; torch's answer for the same graph
    a = np.array([0.5, -1.5, 2.0], np.float32)
    t = Tensor(a)
    h = t.exp()
    loss = (h * t).sum()
    dh, dt = loss.gradient(h, t)
    ta = torch.tensor(a, requires_grad=True)
    th = ta.exp()
    th.retain_grad()
    (th * ta).sum().backward()
    np.testing.assert_allclose(dh.numpy(), th.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(dt.numpy(), ta.grad.numpy(), rtol=1e-6)


def test_backward_on_plain_tensors_fills_grad():
    # tinygrad's backward() docstring: t has no requires_grad, yet t.grad is filled
    t = Tensor([1.0, 2.0, 3.0, 4.0])
    (t * t).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [2.0, 4.0, 6.0, 8.0])
    # once a leaf is marked True, only marked leaves get a gradient (data stays untouched)
    w = Tensor([1.0, -1.0], requires_grad=True)
    d = Tensor([3.0, 5.0])
    (w * d).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 5.0])
    assert d.grad is None
    # requires_grad=False still excludes a tensor
    frozen = Tensor([2.0, 2.0], requires_grad=False)
    p = Tensor([1.0, 4.0])
    (frozen * p).sum().backward()
    assert frozen.grad is None
    np.testing.assert_array_equal(p.grad.numpy(), [2.0, 2.0])
    with pytest.raises(RuntimeError, match="does not require grad"):
        (frozen * p).sum().gradient(frozen)


class LinearNet:
    """The model of tinygrad's README."""

    def __init__(self):
        self.l1 = Tensor.kaiming_uniform(784, 128)
        self.l2 = Tensor.kaiming_uniform(128, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return x.flatten(1).dot(self.l1).relu().dot(self.l2)


def test_readme_training_loop_matches_torch():
    Tensor.manual_seed(0)
    model = LinearNet()
    optim = nn.optim.Adam([model.l1, model.l2], lr=0.001)
    x, y = Tensor.rand(4, 1, 28, 28), Tensor([2, 4, 3, 7])
    # the same program in torch, from the same starting values
    w1, w2 = (torch.tensor(p.numpy(), requires_grad=True) for p in (model.l1, model.l2))
    topt = torch.optim.Adam([w1, w2], lr=0.001)
    tx, ty = torch.tensor(x.numpy()), torch.tensor(y.numpy()).long()
    losses = []
    with Tensor.train():
        for _ in range(4):
            optim.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            optim.step()
            losses.append(loss.item())  # the README prints (i, loss.item()) here
            topt.zero_grad()
            torch.nn.functional.cross_entropy(tx.flatten(1).matmul(w1).relu().matmul(w2), ty).backward()
            topt.step()
            np.testing.assert_allclose(model.l1.numpy(), w1.detach().numpy(), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(model.l2.numpy(), w2.detach().numpy(), rtol=1e-4, atol=1e-6)
    assert not Tensor.training
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses


def test_nn_layers_with_nn_optim_sgd_match_torch():
    lin = nn.Linear(6, 3)
    opt = nn.optim.SGD(nn.state.get_parameters(lin), lr=0.1, momentum=0.9)
    tl = torch.nn.Linear(6, 3)
    with torch.no_grad():
        tl.weight.copy_(torch.tensor(lin.weight.numpy()))
        tl.bias.copy_(torch.tensor(lin.bias.numpy()))
    topt = torch.optim.SGD(tl.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(3)
    xs, ys = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)

    @Tensor.train()
    def step() -> Tensor:
        assert Tensor.training
        opt.zero_grad()
        loss = ((lin(Tensor(xs)) - Tensor(ys)) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step()
        topt.zero_grad()
        ((tl(torch.tensor(xs)) - torch.tensor(ys)) ** 2).mean().backward()
        topt.step()
        np.testing.assert_allclose(lin.weight.numpy(), tl.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lin.bias.numpy(), tl.bias.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert not Tensor.training


class Model:
    """The MNIST tutorial's model, at a smaller size (14x14 images, fewer channels)."""

    def __init__(self):
        self.l1 = nn.Conv2d(1, 8, kernel_size=(3, 3))
        self.l2 = nn.Conv2d(8, 16, kernel_size=(3, 3))
        self.l3 = nn.Linear(64, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.l1(x).relu().max_pool2d((2, 2))
        x = self.l2(x).relu().max_pool2d((2, 2))
        return self.l3(x.flatten(1).dropout(0.5))


def test_mnist_style_training_loop_decreases_the_loss(device):
    if device == "PYTHON":
        pytest.skip("30 training steps of a conv net take minutes on the PYTHON interpreter")
    rng = np.random.default_rng(0)
    n = 256
    # learnable random data: each class has its own pattern, plus noise; uint8 images as mnist() gives
    patterns = rng.integers(0, 256, size=(10, 1, 14, 14))
    labels = rng.integers(0, 10, size=n)
    images = np.clip(patterns[labels] * 0.9 + rng.integers(0, 25, size=(n, 1, 14, 14)), 0, 255).astype(np.uint8)
    X_train, Y_train = Tensor(images), Tensor(labels.astype(np.uint8))
    X_test, Y_test = X_train[:64], Y_train[:64]
    Tensor.manual_seed(1)
    model = Model()
    optim = nn.optim.Adam(nn.state.get_parameters(model), lr=0.03)
    batch_size = 32

    def step() -> Tensor:
        Tensor.training = True  # makes dropout work
        samples = Tensor.randint(batch_size, high=X_train.shape[0])
        X, Y = X_train[samples] / 255.0, Y_train[samples]
        optim.zero_grad()
        loss = model(X).sparse_categorical_crossentropy(Y).backward()
        optim.step()
        return loss

    try:
        losses = [step().item() for _ in range(30)]
    finally:
        Tensor.training = False
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses
    logits = model(X_test / 255.0)
    acc = (logits.argmax(axis=1) == Y_test).mean().item()
    assert isinstance(acc, float)
    assert acc == np.mean(logits.numpy().argmax(axis=1) == labels[:64])
    assert acc > 0.5, acc  # a random model is at ~0.1
