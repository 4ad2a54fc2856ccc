"""tinygrad 0.14's idioms, as its model and example files write them: training mode through
``Context(TRAINING=1)``, keyword arguments of movement ops, the ``tinygrad.helpers`` names they import, the
``is_param_`` marker, ``renderer.supported_dtypes()``, bool matmuls and broadcast binary cross-entropy targets.

Expected values are tinygrad 0.14's, written here as literals (tinygrad is not a test dependency).
"""
from __future__ import annotations

import functools
import gzip
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest

from ember import Context, Device, Tensor, dtypes, nn
from ember.helpers import TRAINING, Timing, fetch, get_child, partition, trange


# --- training mode -------------------------------------------------------------------------------------------
def test_context_training_is_training_mode():
    assert not Tensor.training
    with Context(TRAINING=1):
        assert Tensor.training and Tensor([1.0]).training
        with Context(TRAINING=0):
            assert not Tensor.training
        assert Tensor.training
    assert not Tensor.training

    @Context(TRAINING=1)
    def step() -> bool:
        return Tensor.training

    assert step() and not Tensor.training
    with Tensor.train():  # ember's own spelling keeps working, and is the same mode
        assert Tensor.training and TRAINING.value == 1
    Tensor.training = True
    try:
        assert TRAINING.value == 1
        seen: list[bool] = []
        worker = threading.Thread(target=lambda: seen.append(Tensor.training))
        worker.start()
        worker.join()
        assert seen == [False]  # a new thread starts in eval mode
    finally:
        Tensor.training = False
    assert TRAINING.value == 0


def test_dropout_follows_context_training(device):
    x = Tensor.ones(64, device=device)
    assert x.dropout(0.5).tolist() == [1.0] * 64
    with Context(TRAINING=1):
        kept = x.dropout(0.5).numpy()
    assert 0 < (kept == 0).sum() < 64 and set(kept.tolist()) <= {0.0, 2.0}


def test_tinygrad_style_training_script(device):
    # a BatchNorm + Dropout model trained with a step decorated by @Context(TRAINING=1), then the with-form
    x = Tensor([[[[1.0, 2.0], [3.0, 4.0]], [[-1.0, 0.5], [2.0, 0.0]]],
                [[[0.0, 1.0], [1.0, 1.0]], [[2.0, -2.0], [1.5, 3.0]]]], device=device)
    bn = nn.BatchNorm2d(2)
    for t in nn.state.get_parameters(bn):
        t.to_(device)
    w = Tensor([[1.0, 0.5], [-0.5, 2.0]], device=device)

    def model(x: Tensor) -> Tensor:
        return bn(x.permute(0, 2, 3, 1).matmul(w).permute(0, 3, 1, 2)).dropout(0.5)

    opt = nn.optim.SGD([w, bn.weight, bn.bias], lr=0.1)

    @Context(TRAINING=1)
    def step() -> Tensor:
        out = model(x)
        opt.zero_grad()
        (out * out).mean().backward()
        Tensor.realize(bn.running_mean, bn.running_var, out)
        opt.step()
        return out

    out = step()
    # tinygrad 0.14 gives running_mean [0.125, 0.23125], running_var [1.1589285, 2.0495534] after this step
    np.testing.assert_allclose(bn.running_mean.numpy(), [0.125, 0.23125], rtol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), [1.1589285135269165, 2.049553394317627], rtol=1e-6)
    assert bn.num_batches_tracked.item() == 1
    assert 0 < (out.numpy() == 0).sum() < 16  # dropout zeroed some of the 16 outputs

    with Context(TRAINING=1):
        out = model(x)
        opt.zero_grad()
        (out * out).mean().backward()
        opt.step()
    assert bn.num_batches_tracked.item() == 2
    stats = bn.running_mean.numpy(), bn.running_var.numpy()
    assert not np.allclose(stats[0], [0.125, 0.23125])

    # outside the context: eval mode, the running statistics normalize and nothing is dropped or updated
    ev = model(x).numpy()
    h = x.numpy().transpose(0, 2, 3, 1) @ w.numpy()
    want = (h - stats[0]) / np.sqrt(stats[1] + 1e-5) * bn.weight.numpy() + bn.bias.numpy()
    np.testing.assert_allclose(ev, want.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(bn.running_mean.numpy(), stats[0])
    assert bn.num_batches_tracked.item() == 2


def test_grad_loop_without_detach_trains_like_tinygrad(device):
    # w = w - w.grad * lr with no detach: tinygrad 0.14 gives the plain gradient-descent steps below
    x = Tensor([[1.0, 2.0], [3.0, -1.0]], device=device)
    w = Tensor([[0.5], [-0.25]], device=device)
    losses = []
    for _ in range(4):
        loss = ((x @ w) ** 2).sum()
        loss.backward()
        losses.append(loss.item())
        assert w.grad is not None and w.grad._ctx is None  # a .grad carries no gradient history
        w = w - w.grad * 0.01
    np.testing.assert_allclose(losses, [3.0625, 1.9612252712249756, 1.259508728981018, 0.8117256164550781],
                               rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), [[0.19330228865146637], [-0.1398124396800995]], rtol=1e-6)


def test_backward_fills_unmarked_intermediates_and_realize_stops_gradients(device):
    # tinygrad 0.14: every float tensor of the graph gets its gradient; a realized one is where gradients stop
    x, w = Tensor([1.0, 2.0], device=device), Tensor([3.0, 4.0], device=device)
    y = x * w
    loss = (y * y).sum()
    loss.backward()
    assert (x.grad.tolist(), w.grad.tolist(), y.grad.tolist(), loss.grad.item()) == \
        ([18.0, 64.0], [6.0, 32.0], [6.0, 16.0], 1.0)
    loss.backward()  # a second pass accumulates, as in tinygrad
    assert x.grad.tolist() == [36.0, 128.0]
    x = Tensor([1.0, 2.0], device=device)
    y = (x * 2).realize()
    (y * y).sum().backward()
    assert x.grad is None and y.grad.tolist() == [4.0, 8.0]


# --- movement ops with keywords --------------------------------------------------------------------------------
def test_movement_keywords(device):
    t = Tensor.arange(6, device=device)
    assert t.reshape(shape=(2, 3)).shape == (2, 3) and t.reshape(shape=[3, -1]).shape == (3, 2)
    assert t.view(shape=(3, 2)).shape == (3, 2)
    assert t.reshape(2, 3).permute(order=[1, 0]).tolist() == [[0, 3], [1, 4], [2, 5]]
    assert t.reshape(1, 6).expand(shape=(2, 6)).shape == (2, 6)
    assert t.flip(axis=0).tolist() == [5, 4, 3, 2, 1, 0]
    assert t.reshape(2, 3).flip(axis=(0, 1)).tolist() == [[5, 4, 3], [2, 1, 0]]
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        t.reshape(shape=(2, 3), foo=1)
    with pytest.raises(TypeError, match="multiple values for argument 'shape'"):
        t.reshape((2, 3), shape=(2, 3))


# --- tinygrad.helpers names ------------------------------------------------------------------------------------
def test_helpers_partition_get_child_trange_timing(capsys):
    assert partition([1, 2, 3, 4, 5], lambda v: v % 2 == 0) == ([2, 4], [1, 3, 5])
    model = {"layers": [nn.Linear(2, 3), nn.Linear(3, 1)]}
    assert get_child(model, "layers.1.weight") is model["layers"][1].weight
    assert list(trange(4, disable=True)) == [0, 1, 2, 3]
    with Timing("step: ", on_exit=lambda ns: f" ({ns >= 0})"):
        pass
    out = capsys.readouterr().out
    assert out.startswith("step: ") and out.rstrip().endswith("ms (True)")

    @Timing("call ", enabled=False)
    def f() -> int:
        return 7

    assert f() == 7 and capsys.readouterr().out == ""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_fetch_downloads_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    served = tmp_path / "served"
    served.mkdir()
    (served / "w.bin").write_bytes(b"weights")
    (served / "w.gz").write_bytes(gzip.compress(b"unzipped", mtime=0))
    # a server on the loopback interface only: no network
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        p = fetch(f"{base}/w.bin")
        assert p.read_bytes() == b"weights" and (tmp_path / "cache" / "downloads") in p.parents
        (served / "w.bin").unlink()
        assert fetch(f"{base}/w.bin") == p  # cached: not asked again
        assert fetch(f"{base}/w.gz", name="w", subdir="sub", gunzip=True).read_bytes() == b"unzipped"
        with pytest.raises(RuntimeError, match="sha256"):
            fetch(f"{base}/w.gz", name="checked", sha256="0" * 64)
        with pytest.raises(ConnectionError, match="put the file at"):
            fetch(f"{base}/missing.bin")
    finally:
        server.shutdown()
        server.server_close()
    assert fetch((served / "w.gz").as_uri(), name="local").read_bytes() == gzip.compress(b"unzipped", mtime=0)
    assert fetch(str(served / "w.gz")) == served / "w.gz"  # a local path is returned as it is


def test_tensor_from_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    served = tmp_path / "served"
    served.mkdir()
    raw = np.array([1.5, -2.0, 3.25], np.float32).tobytes() + b"\x07"  # 13 bytes: 3 floats and one byte over
    (served / "h.bin").write_bytes(raw)
    (served / "h.gz").write_bytes(gzip.compress(raw, mtime=0))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        t = Tensor.from_url(f"{base}/h.bin", device=device)
        # tinygrad 0.14 gives dtypes.uchar (13,) [0, 0, 192, 63, 0, 0, 0, 192, 0, 0, 80, 64, 7]
        assert t.dtype == dtypes.uint8 and t.shape == (13,) and t.device == device
        assert t.tolist() == [0, 0, 192, 63, 0, 0, 0, 192, 0, 0, 80, 64, 7]
        (served / "h.bin").unlink()  # cached: the second call does not ask the server
        f = Tensor.from_url(f"{base}/h.bin", dtype=dtypes.float32, device=device)
        assert f.dtype == dtypes.float32 and f.tolist() == [1.5, -2.0, 3.25]  # tinygrad 0.14: (3,), the 7 dropped
        h = Tensor.from_url(f"{base}/h.gz", gunzip=True, dtype="float16", device=device)
        assert h.dtype == dtypes.float16 and h.tolist() == [0.0, 1.9375, 0.0, -2.0, 0.0, 2.15625]  # tinygrad 0.14
        with pytest.raises(ConnectionError, match="put the file at"):
            Tensor.from_url(f"{base}/missing.bin")
    finally:
        server.shutdown()
        server.server_close()
    assert Tensor.from_url(str(served / "h.gz"), device=device).shape == (len(gzip.compress(raw, mtime=0)),)
    with pytest.raises(TypeError, match="unexpected keyword"):
        Tensor.from_url(str(served / "h.gz"), requires_grad=True)


# --- markers and capabilities ----------------------------------------------------------------------------------
def test_is_param_marks_buffers(device):
    w, stat = Tensor.ones(3, device=device), Tensor.zeros(3, device=device).is_param_(False)
    assert w.is_param and not stat.is_param and stat.requires_grad is False
    opt = nn.optim.SGD([w, stat], lr=0.1)
    assert opt.params == [w] and opt.buffers == [stat]
    assert stat.is_param_().is_param and stat.requires_grad is None


def test_renderer_supported_dtypes_is_callable(device):
    r = Device[device].renderer
    got = r.supported_dtypes()
    assert isinstance(got, set) and got == set(r.supported_dtypes) and dtypes.float32 in got
    assert dtypes.int32 in Device[device].supported_dtypes


# --- bool matmul and binary cross-entropy targets --------------------------------------------------------------
def test_matmul_of_bools(device):
    # tinygrad 0.14: bool @ float is float, bool @ bool is bool (True where any pair is True)
    bm = Tensor([[True, False], [True, True]], device=device)
    f = Tensor([[1.5, 2.0], [3.0, -1.0]], device=device)
    assert (bm @ f).dtype == dtypes.float32 and (bm @ f).tolist() == [[1.5, 2.0], [4.5, 1.0]]
    assert (f @ bm).dtype == dtypes.float32 and (f @ bm).tolist() == [[3.5, 2.0], [2.0, -1.0]]
    assert (bm @ Tensor([[1, 2], [3, 4]], device=device)).tolist() == [[1, 2], [4, 6]]
    none = Tensor([[False, False], [True, False]], device=device)
    assert (bm @ none).dtype == dtypes.bool and (bm @ none).tolist() == [[False, False], [True, False]]
    assert (Tensor([True, False, True], device=device) @ Tensor([0.5, 2.0, 4.0], device=device)).item() == 4.5


def test_binary_crossentropy_logits_broadcasts_its_target(device):
    x = Tensor([[-1.0, 2.0, 0.5], [0.0, -3.0, 1.0]], device=device)
    # tinygrad 0.14 gives these for targets of shapes (3,), (2, 1) and ()
    np.testing.assert_allclose(x.binary_crossentropy_logits(Tensor([1.0, 0.0, 1.0], device=device)).item(),
                               0.8282105326652527, rtol=1e-6)
    np.testing.assert_allclose(
        x.binary_crossentropy_logits(Tensor([[1.0], [0.0]], device=device), reduction="none").numpy(),
        [[1.31326162815094, 0.12692804634571075, 0.4740769863128662],
         [0.6931471824645996, 0.04858732968568802, 1.31326162815094]], rtol=1e-5)
    np.testing.assert_allclose(x.binary_crossentropy_logits(Tensor(1.0, device=device), reduction="sum").item(),
                               5.969262599945068, rtol=1e-6)
    np.testing.assert_allclose(x.binary_crossentropy_logits(Tensor([1.0, 0.0, 1.0], device=device),
                                                            pos_weight=Tensor([2.0], device=device),
                                                            reduction="sum").item(), 7.763010501861572, rtol=1e-6)
    mask = Tensor([True, False, True], device=device)
    np.testing.assert_allclose(x.binary_crossentropy_logits(mask).item(), 0.8282105326652527, rtol=1e-6)
    assert x[0].binary_crossentropy_logits(Tensor.zeros(2, 3, device=device), reduction="none").shape == (2, 3)
    with pytest.raises(ValueError, match=r"does not broadcast"):
        x.binary_crossentropy_logits(Tensor([1.0, 0.0], device=device))
    p = Tensor([0.2, 0.7, 0.9], device=device)
    np.testing.assert_allclose(p.binary_crossentropy(Tensor([[1.0], [0.0]], device=device), reduction="none").numpy(),
                               [[1.6094378232955933, 0.3566749691963196, 0.10536054521799088],
                                [0.2231435477733612, 1.2039728164672852, 2.3025848865509033]], rtol=1e-5)
