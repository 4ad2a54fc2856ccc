"""ember.nn.datasets (digits, MNIST idx files, CIFAR-10 batches) and ember.progress."""
from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ember import dtypes
from ember.nn import datasets
from ember.progress import SimpleProgress, progress


# --- digits --------------------------------------------------------------------------------------
def _have_sklearn_digits() -> bool:
    try:
        datasets.digits_csv_path()
    except FileNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _have_sklearn_digits(), reason="scikit-learn (which ships the digits file) is not installed")
def test_digits_from_sklearn_package_data() -> None:
    import sys

    x_train, y_train, x_test, y_test = datasets.digits()
    assert "sklearn" not in sys.modules or "sklearn.datasets" not in sys.modules  # read without importing it
    assert x_train.shape == (1437, 1, 8, 8) and x_test.shape == (360, 1, 8, 8)
    assert y_train.shape == (1437,) and y_test.shape == (360,)
    assert x_train.dtype == dtypes.float32 and y_train.dtype == dtypes.int64
    xs, ys = x_train.numpy(), y_train.numpy()
    assert xs.min() == 0.0 and xs.max() == 1.0
    assert set(np.unique(ys)) == set(range(10)) and set(np.unique(y_test.numpy())) == set(range(10))
    # deterministic, and a different seed gives a different split of the same images
    again = datasets.digits()
    np.testing.assert_array_equal(again[1].numpy(), ys)
    other = datasets.digits(seed=1)
    assert not np.array_equal(other[1].numpy(), ys)
    images, labels = datasets.load_digits_numpy()
    assert images.shape == (1797, 8, 8) and np.bincount(labels).sum() == 1797
    assert sorted(map(tuple, np.concatenate([xs, x_test.numpy()]).reshape(-1, 64).tolist())) == \
        sorted(map(tuple, (images.reshape(-1, 64) / 16.0).astype(np.float32).tolist()))


def test_digits_from_a_given_csv(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.integers(0, 17, (20, 64)), np.arange(20).reshape(-1, 1) % 10], axis=1)
    path = tmp_path / "digits.csv.gz"
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    x_train, y_train, x_test, y_test = datasets.digits(path=path, test_size=5)
    assert x_train.shape == (15, 1, 8, 8) and x_test.shape == (5, 1, 8, 8)
    got = np.concatenate([y_train.numpy(), y_test.numpy()])
    assert sorted(got.tolist()) == sorted((np.arange(20) % 10).tolist())
    with pytest.raises(ValueError):
        datasets.digits(path=path, test_size=20)
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2,3\n4,5,6\n")
    with pytest.raises(ValueError, match="65 columns"):
        datasets.digits(path=bad)


# --- MNIST ---------------------------------------------------------------------------------------
def _idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _write_mnist(folder: Path, gz: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (6, 28, 28)), "train-labels-idx1-ubyte":
              rng.integers(0, 10, 6), "t10k-images-idx3-ubyte": rng.integers(0, 256, (3, 28, 28)),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, 3)}
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        data = _idx_bytes(arr)
        if gz:
            (folder / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_from_path(tmp_path: Path, gz: bool) -> None:
    arrays = _write_mnist(tmp_path, gz)
    x_train, y_train, x_test, y_test = datasets.mnist(path=tmp_path)
    assert x_train.shape == (6, 1, 28, 28) and x_train.dtype == dtypes.uint8
    # tinygrad 0.14 gives uint8 labels (the files' bytes)
    assert y_train.shape == (6,) and y_train.dtype == dtypes.uint8 and x_test.shape == (3, 1, 28, 28)
    np.testing.assert_array_equal(x_train.numpy()[:, 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])


def test_mnist_from_env_dir_and_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(datasets, "MNIST_URLS", {False: (tmp_path / "nowhere").as_uri() + "/"})  # no network
    with pytest.raises(FileNotFoundError) as err:
        datasets.mnist()
    msg = str(err.value)
    assert str(tmp_path / "mnist") in msg and "train-images-idx3-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg
    assert "EMBER_DATA_DIR" in msg
    _write_mnist(tmp_path / "mnist", gz=True)
    assert datasets.mnist()[0].shape == (6, 1, 28, 28)


def test_mnist_downloads_missing_files_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the mirror is a local folder reached through a file:// URL: no network
    arrays = _write_mnist(tmp_path / "mirror", gz=True)
    monkeypatch.setenv("EMBER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(datasets, "MNIST_URLS", {True: (tmp_path / "mirror").as_uri() + "/"})
    x_train, y_train, x_test, y_test = datasets.mnist(fashion=True)
    assert sorted(p.name for p in (tmp_path / "data" / "fashion-mnist").iterdir()) == \
        sorted(n + ".gz" for n in datasets.MNIST_FILES)
    # tinygrad 0.14's mnist() gives uint8 images (N, 1, 28, 28) and uint8 labels (N,)
    assert (x_train.shape, x_train.dtype, y_train.shape, y_train.dtype) == ((6, 1, 28, 28), dtypes.uint8, (6,),
                                                                            dtypes.uint8)
    np.testing.assert_array_equal(y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])
    for f in (tmp_path / "mirror").iterdir():  # a second call reads the downloaded copies
        f.unlink()
    np.testing.assert_array_equal(datasets.mnist(fashion=True)[0].numpy()[:, 0], arrays["train-images-idx3-ubyte"])


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    bad_magic = tmp_path / "bad"
    bad_magic.write_bytes(b"\x01\x02\x03\x04" + bytes(8))
    with pytest.raises(ValueError, match="magic"):
        datasets.read_idx(bad_magic)
    truncated = tmp_path / "short"
    truncated.write_bytes(_idx_bytes(np.zeros((4, 2, 2)))[:-3])
    with pytest.raises(ValueError, match="bytes"):
        datasets.read_idx(truncated)


# --- CIFAR ---------------------------------------------------------------------------------------
def _cifar_batch(n: int, seed: int, protocol: int) -> tuple[bytes, np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
    labels = rng.integers(0, 10, n).tolist()
    return pickle.dumps({b"batch_label": b"x", b"data": data, b"labels": labels}, protocol=protocol), data, labels


@pytest.mark.parametrize("layout", ["folder", "parent", "archive"])
def test_cifar(tmp_path: Path, layout: str) -> None:
    blobs = {name: _cifar_batch(2, i, protocol=2 if i % 2 else 4) for i, name in enumerate(datasets.CIFAR_BATCHES)}
    folder = tmp_path / datasets.CIFAR_DIR
    if layout == "archive":
        archive = tmp_path / datasets.CIFAR_ARCHIVE
        with tarfile.open(archive, "w:gz") as tar:
            for name, (raw, _, _) in blobs.items():
                info = tarfile.TarInfo(f"{datasets.CIFAR_DIR}/{name}")
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
        target = archive
    else:
        folder.mkdir()
        for name, (raw, _, _) in blobs.items():
            (folder / name).write_bytes(raw)
        target = folder if layout == "folder" else tmp_path
    x_train, y_train, x_test, y_test = datasets.cifar(path=target)
    # tinygrad 0.14 gives uint8 labels (the label byte of each record of the binary version)
    assert x_train.shape == (10, 3, 32, 32) and x_train.dtype == dtypes.uint8 and y_train.dtype == dtypes.uint8
    assert x_test.shape == (2, 3, 32, 32) and y_test.dtype == dtypes.uint8 and y_train.shape == (10,)
    np.testing.assert_array_equal(x_train.numpy()[:2].reshape(2, -1), blobs["data_batch_1"][1])
    np.testing.assert_array_equal(y_train.numpy()[8:], blobs["data_batch_5"][2])
    np.testing.assert_array_equal(y_test.numpy(), blobs["test_batch"][2])


@pytest.mark.parametrize("layout", ["folder", "archive"])
def test_cifar_binary_version(tmp_path: Path, layout: str) -> None:
    """The binary version (what tinygrad downloads): records of a label byte and 3072 pixel bytes."""
    rng = np.random.default_rng(0)
    records = {f"{b}.bin": rng.integers(0, 256, (3, 3073)).astype(np.uint8) for b in datasets.CIFAR_BATCHES}
    for r in records.values():
        r[:, 0] %= 10
    if layout == "archive":
        target = tmp_path / datasets.CIFAR_BIN_ARCHIVE
        with tarfile.open(target, "w:gz") as tar:
            for name in reversed(list(records)):  # the archive's order is not the batches' order
                info = tarfile.TarInfo(f"{datasets.CIFAR_BIN_DIR}/{name}")
                info.size = records[name].nbytes
                tar.addfile(info, io.BytesIO(records[name].tobytes()))
        target = tmp_path  # found by its standard name in the folder
    else:
        target = tmp_path / datasets.CIFAR_BIN_DIR
        target.mkdir()
        for name, r in records.items():
            (target / name).write_bytes(r.tobytes())
    x_train, y_train, x_test, y_test = datasets.cifar(path=target)
    assert x_train.shape == (15, 3, 32, 32) and y_train.dtype == dtypes.uint8 and x_test.dtype == dtypes.uint8
    np.testing.assert_array_equal(y_train.numpy(), np.concatenate([records[f"data_batch_{i}.bin"][:, 0]
                                                                   for i in range(1, 6)]))
    np.testing.assert_array_equal(x_test.numpy().reshape(3, -1), records["test_batch.bin"][:, 1:])
    np.testing.assert_array_equal(y_test.numpy(), records["test_batch.bin"][:, 0])
    if layout == "folder":
        (target / "test_batch.bin").write_bytes(bytes(3074))
        with pytest.raises(ValueError, match="3073-byte records"):
            datasets.cifar(path=target)


def test_cifar_missing_and_malicious(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        datasets.cifar(path=tmp_path)
    assert "data_batch_1" in str(err.value) and datasets.CIFAR_ARCHIVE in str(err.value)
    folder = tmp_path / datasets.CIFAR_DIR
    folder.mkdir()
    for name in datasets.CIFAR_BATCHES:
        (folder / name).write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]}))

    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("should not run",))

    (folder / "test_batch").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ValueError, match="builtins.print"):
        datasets.cifar(path=folder)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [256]}))
    with pytest.raises(ValueError, match="do not fit in a byte"):
        datasets.cifar(path=folder)


# --- progress ------------------------------------------------------------------------------------
def test_simple_progress_reports_count_rate_and_postfix() -> None:
    out = io.StringIO()
    bar = SimpleProgress(range(5), desc="train", unit="step", file=out)
    seen = []
    for i in bar:
        seen.append(i)
        bar.set_postfix(loss=0.5)
    assert seen == list(range(5))
    text = out.getvalue()
    assert "train:" in text and "5/5" in text and "step/s" in text and "loss=0.5" in text and "100%" in text
    quiet = io.StringIO()
    for _ in SimpleProgress(range(3), file=quiet, disable=True):
        pass
    assert quiet.getvalue() == ""
    manual = io.StringIO()
    with SimpleProgress(total=4, file=manual) as b:
        b.update(4)
    assert "4/4" in manual.getvalue()


def test_progress_picks_tqdm_or_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    bar = progress(range(2), disable=True)
    assert list(bar) == [0, 1]
    try:
        import tqdm
    except ImportError:
        assert isinstance(bar, SimpleProgress)
    else:
        assert isinstance(bar, tqdm.tqdm)
    monkeypatch.setenv("EMBER_PROGRESS", "0")
    assert progress(range(2)).disable
