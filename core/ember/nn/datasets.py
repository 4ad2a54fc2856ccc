"""Small datasets for examples and tests, read from local files.

- :func:`digits` — the 8x8 handwritten digits (1,797 images) that ship inside scikit-learn's
  package data, read directly from the CSV file (scikit-learn itself is not imported).
- :func:`mnist` — MNIST (or Fashion-MNIST) from the four standard ``idx-ubyte`` files, gzipped or not;
  downloaded once (:func:`ember.helpers.fetch`) when no ``path`` is given and the files are not there.
- :func:`cifar` — CIFAR-10 from the "python version" or "binary version" batches (folder or ``.tar.gz``).

Files are looked up under ``$EMBER_DATA_DIR`` (default ``~/.cache/ember/datasets``) unless a
``path`` is given; a missing file raises :class:`FileNotFoundError` naming each file to put where.
"""
from __future__ import annotations

import gzip
import importlib.util
import io
import os
import pathlib
import pickle
import tarfile
from typing import Any

import numpy as np

from ember.dtype import dtypes
from ember.helpers import fetch
from ember.tensor import Tensor

DATA_DIR_ENV = "EMBER_DATA_DIR"

Split = tuple[Tensor, Tensor, Tensor, Tensor]


def data_dir() -> pathlib.Path:
    """The folder datasets are read from: ``$EMBER_DATA_DIR`` or ``~/.cache/ember/datasets``."""
    env = os.environ.get(DATA_DIR_ENV)
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "ember" / "datasets"


# --- digits --------------------------------------------------------------------------------------
def digits_csv_path() -> pathlib.Path:
    """Where scikit-learn's bundled ``digits.csv.gz`` is (found without importing scikit-learn)."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the digits dataset is read from scikit-learn's package data, and scikit-learn is not "
                                "installed: `pip install scikit-learn` (or pass path= to a digits.csv.gz file)")
    for root in spec.submodule_search_locations:
        candidate = pathlib.Path(root) / "datasets" / "data" / "digits.csv.gz"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"scikit-learn is installed at {list(spec.submodule_search_locations)} but has no "
                            f"datasets/data/digits.csv.gz")


def load_digits_numpy(path: str | os.PathLike[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as numpy: images ``(N, 8, 8)`` uint8 in 0..16 and labels ``(N,)`` int64."""
    p = pathlib.Path(path) if path is not None else digits_csv_path()
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        try:
            table = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
        except ValueError as e:
            raise ValueError(f"{p} is not a digits CSV file (65 integer columns per row): {e}") from e
    if table.shape[1] != 65:
        raise ValueError(f"{p}: expected 65 columns (64 pixels and a label) per row, got {table.shape[1]}")
    return table[:, :64].reshape(-1, 8, 8).astype(np.uint8), table[:, 64].copy()


def digits(device: str | None = None, test_size: int = 360, seed: int = 0,
           path: str | os.PathLike[str] | None = None) -> Split:
    """The 8x8 digits split into train and test sets: ``(X_train, Y_train, X_test, Y_test)``.

    Images are float32 ``(N, 1, 8, 8)`` scaled to ``[0, 1]``, labels int64 ``(N,)``. The split is a
    fixed permutation drawn from ``seed`` (default: 1,437 train / 360 test images).
    """
    images, labels = load_digits_numpy(path)
    if not 0 < test_size < len(labels):
        raise ValueError(f"test_size must be between 1 and {len(labels) - 1}, got {test_size}")
    order = np.random.default_rng(seed).permutation(len(labels))
    test, train = order[:test_size], order[test_size:]
    x = (images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return (Tensor(x[train], device=device), Tensor(labels[train], device=device, dtype=dtypes.int64),
            Tensor(x[test], device=device), Tensor(labels[test], device=device, dtype=dtypes.int64))


# --- MNIST ---------------------------------------------------------------------------------------
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte")
#: where :func:`mnist` downloads the gzipped files from when they are not on disk (the public mirrors)
MNIST_URLS = {False: "https://storage.googleapis.com/cvdf-datasets/mnist/",
              True: "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"}

_IDX_DTYPES: dict[int, np.dtype] = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
                                    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one ``idx`` file (the MNIST format), gzipped or not, into a numpy array."""
    p = pathlib.Path(path)
    with open(p, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{p} is not an idx file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{p}: truncated idx header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dt = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != count * dt.itemsize:
        raise ValueError(f"{p}: idx header says shape {shape} ({count * dt.itemsize} bytes) but the file holds "
                         f"{len(raw) - header} bytes of data")
    return np.frombuffer(raw, dtype=dt, count=count, offset=header).reshape(shape).astype(dt.newbyteorder("="))


def _find_mnist_files(folder: pathlib.Path) -> list[pathlib.Path] | None:
    found = []
    for name in MNIST_FILES:
        hits = [folder / n for n in (name + ".gz", name) if (folder / n).is_file()]
        if not hits:
            return None
        found.append(hits[0])
    return found


def mnist(path: str | os.PathLike[str] | None = None, device: str | None = None, fashion: bool = False,
          download: bool = True) -> Split:
    """MNIST from ``idx-ubyte`` files: ``(X_train, Y_train, X_test, Y_test)``.

    Images are uint8 ``(N, 1, 28, 28)``, labels uint8 ``(N,)`` (the files' bytes, as tinygrad gives them).
    ``path`` is the folder with the four files (default ``$EMBER_DATA_DIR/mnist``, or ``fashion-mnist`` with
    ``fashion=True``); without ``path``, missing files are downloaded there first unless ``download=False``.
    """
    sub = "fashion-mnist" if fashion else "mnist"
    folders = [pathlib.Path(path).expanduser()] if path is not None else \
        [data_dir() / sub] + ([] if fashion else [data_dir()])
    files = next((f for f in map(_find_mnist_files, folders) if f is not None), None)
    reason = ""
    if files is None and path is None and download:
        try:
            for name in MNIST_FILES:
                fetch(MNIST_URLS[bool(fashion)] + name + ".gz", name=folders[0] / (name + ".gz"))
            files = _find_mnist_files(folders[0])
        except ConnectionError as e:
            reason = f" ({e})"
    if files is None:
        raise FileNotFoundError(
            f"MNIST files not found{reason}. Put these four files (gzipped .gz or not) in {folders[0]}: "
            f"{', '.join(MNIST_FILES)}; or pass path= to their folder, or set {DATA_DIR_ENV} to a folder whose "
            f"{sub}/ subfolder holds them.")
    x_train, y_train, x_test, y_test = (read_idx(f) for f in files)
    for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ValueError(f"MNIST {split} files disagree: images {x.shape}, labels {y.shape}")

    def images(x: np.ndarray) -> Tensor:
        return Tensor(x.reshape(x.shape[0], 1, *x.shape[1:]).astype(np.uint8), device=device)

    def labels(y: np.ndarray) -> Tensor:
        return Tensor(y.astype(np.uint8), device=device, dtype=dtypes.uint8)

    return images(x_train), labels(y_train), images(x_test), labels(y_test)


# --- CIFAR-10 ------------------------------------------------------------------------------------
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
#: the "binary version" (what tinygrad downloads): each record is a label byte and 3072 pixel bytes
CIFAR_BIN_DIR = "cifar-10-batches-bin"
CIFAR_BIN_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR_BIN_BATCHES = tuple(f"{b}.bin" for b in CIFAR_BATCHES)
_CIFAR_RECORD = 1 + 3 * 32 * 32


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only dicts, lists, strings, bytes and numpy arrays (what a CIFAR batch holds)."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"a CIFAR batch should not reference {module}.{name}")
        return super().find_class(module, name)


def _read_cifar_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 3, 32, 32)`` and labels ``(N,)``, both uint8, from a batch of either version."""
    if name.endswith(".bin"):
        if len(raw) % _CIFAR_RECORD:
            raise ValueError(f"CIFAR batch {name} holds {len(raw)} bytes, not a whole number of "
                             f"{_CIFAR_RECORD}-byte records")
        records = np.frombuffer(raw, np.uint8).reshape(-1, _CIFAR_RECORD)
        return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].copy()
    try:
        batch = _ArrayUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as e:
        raise ValueError(f"CIFAR batch {name} could not be read: {e}") from e
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR batch {name} should hold a dict, got {type(batch).__name__}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"CIFAR batch {name} has no 'data'/'labels' entries (keys: {list(batch)})")
    data = np.asarray(data, dtype=np.uint8)
    labels = np.asarray(labels, dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise ValueError(f"CIFAR batch {name}: data {data.shape} and labels {labels.shape} are not N x 3072 and N")
    if labels.size and not 0 <= labels.min() <= labels.max() <= 255:
        raise ValueError(f"CIFAR batch {name}: labels {labels.min()}..{labels.max()} do not fit in a byte")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.uint8)


def _cifar_from_archive(archive: pathlib.Path, batches: tuple[str, ...]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name.rsplit("/", 1)[-1]
            if name in batches and member.isfile():
                fileobj = tar.extractfile(member)
                if fileobj is not None:
                    out[name] = fileobj.read()
    missing = [b for b in batches if b not in out]
    if missing:
        raise ValueError(f"{archive} lacks CIFAR batches {missing}")
    return {b: out[b] for b in batches}  # in the batches' order, whatever the archive's


def _cifar_raw_batches(path: pathlib.Path | None) -> dict[str, bytes]:
    """The six batches' bytes, named as in their version (``test_batch`` or ``test_batch.bin``)."""
    base = path if path is not None else data_dir()
    for batches, sub in ((CIFAR_BATCHES, CIFAR_DIR), (CIFAR_BIN_BATCHES, CIFAR_BIN_DIR)):
        for folder in (base, base / sub):
            if folder.is_dir() and all((folder / b).is_file() for b in batches):
                return {b: (folder / b).read_bytes() for b in batches}
    if base.is_file():
        with tarfile.open(base, "r:gz") as tar:
            binary = any(m.name.endswith(".bin") for m in tar.getmembers())
        return _cifar_from_archive(base, CIFAR_BIN_BATCHES if binary else CIFAR_BATCHES)
    for batches, archive in ((CIFAR_BATCHES, CIFAR_ARCHIVE), (CIFAR_BIN_BATCHES, CIFAR_BIN_ARCHIVE)):
        if (base / archive).is_file():
            return _cifar_from_archive(base / archive, batches)
    raise FileNotFoundError(
        f"CIFAR-10 files not found. Put the 'python version' batches ({', '.join(CIFAR_BATCHES)}) in "
        f"{base / CIFAR_DIR}, or the archive {CIFAR_ARCHIVE} in {base} (the 'binary version', "
        f"{CIFAR_BIN_ARCHIVE} or its {CIFAR_BIN_DIR} folder, also works); or pass path= to either, or set "
        f"{DATA_DIR_ENV} to the folder that holds them.")


def cifar(path: str | os.PathLike[str] | None = None, device: str | None = None) -> Split:
    """CIFAR-10 from local files: ``(X_train, Y_train, X_test, Y_test)``, images uint8 ``(N, 3, 32, 32)``, labels
    uint8 ``(N,)`` (as tinygrad gives them).

    ``path`` may be the ``cifar-10-batches-py`` folder, a folder containing it, or the
    ``cifar-10-python.tar.gz`` archive; the binary version (``cifar-10-batches-bin``,
    ``cifar-10-binary.tar.gz``) is read the same way. Default: looked up in ``$EMBER_DATA_DIR``.
    """
    raw = _cifar_raw_batches(pathlib.Path(path).expanduser() if path is not None else None)
    parts = [_read_cifar_batch(data, name) for name, data in raw.items()]  # in CIFAR_BATCHES order
    x_train = np.concatenate([x for x, _ in parts[:5]])
    y_train = np.concatenate([y for _, y in parts[:5]])
    x_test, y_test = parts[5]
    return (Tensor(x_train, device=device), Tensor(y_train, device=device, dtype=dtypes.uint8),
            Tensor(x_test, device=device), Tensor(y_test, device=device, dtype=dtypes.uint8))


__all__ = ["cifar", "data_dir", "digits", "digits_csv_path", "load_digits_numpy", "mnist", "read_idx"]
