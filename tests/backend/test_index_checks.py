"""Out-of-range index tensors and integer division by zero raise torch's exception types (at the next read).

Each case is run in torch first: ember must raise an exception of the builtin type torch raises, and its
message must name the bad index, the size and the dimension.
"""
from __future__ import annotations

import numpy as np
import pytest
from backend_utils import same_error

from ember import Context, Tensor, dtypes, nn
from ember.frontend import checks
from ember.helpers import GlobalCounters

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture(autouse=True)
def _no_leftover_checks():
    checks.discard()
    yield
    checks.discard()


def _i(data, device):
    return Tensor(np.array(data, dtype=np.int64), device=device)


def _t(data):
    return torch.tensor(data)


CASES = {
    "getitem 7": (lambda d: Tensor.arange(5, device=d)[_i([7], d)], lambda: torch.arange(5)[_t([7])],
                  ("7", "5", "dimension 0")),
    "getitem -6": (lambda d: Tensor.arange(5, device=d)[_i([-6], d)], lambda: torch.arange(5)[_t([-6])],
                   ("-6", "5", "dimension 0")),
    "setitem 9": (lambda d: Tensor.zeros(5, device=d).__setitem__(_i([9], d), 1.0),
                  lambda: torch.zeros(5).__setitem__(_t([9]), 1.0), ("9", "5", "dimension 0")),
    "gather -1": (lambda d: Tensor.ones(2, 3, device=d).gather(1, _i([[-1], [0]], d)),
                  lambda: torch.ones(2, 3).gather(1, _t([[-1], [0]])), ("-1", "3", "dimension 1")),
    "gather 7": (lambda d: Tensor.ones(2, 3, device=d).gather(1, _i([[7], [0]], d)),
                 lambda: torch.ones(2, 3).gather(1, _t([[7], [0]])), ("7", "3", "dimension 1")),
    "scatter 5": (lambda d: Tensor.zeros(3, device=d).scatter(0, _i([5], d), Tensor([1.0], device=d)),
                  lambda: torch.zeros(3).scatter(0, _t([5]), _t([1.0])), ("5", "3", "dimension 0")),
    "index_select 9": (lambda d: Tensor.ones(5, device=d).index_select(0, _i([9], d)),
                       lambda: torch.ones(5).index_select(0, _t([9])), ("9", "5", "dimension 0")),
    "one_hot 5 of 3": (lambda d: _i([5], d).one_hot(3), lambda: F.one_hot(_t([5]), 3), ("5", "3", "dimension 1")),
    "cross_entropy 7": (lambda d: Tensor.ones(2, 5, device=d).cross_entropy(_i([7, 0], d)),
                        lambda: F.cross_entropy(torch.ones(2, 5), _t([7, 0])), ("7", "5", "dimension 1")),
    "nll_loss 7": (lambda d: Tensor.ones(2, 5, device=d).nll_loss(_i([0, 7], d)),
                   lambda: F.nll_loss(torch.ones(2, 5), _t([0, 7])), ("7", "5", "dimension 1")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_index_raises_like_torch(device: str, name: str):
    ours, theirs, words = CASES[name]

    def run():
        out = ours(device)
        (out if out is not None else Tensor([0])).numpy()  # the error comes with the next read
    err = same_error(run, theirs)
    assert isinstance(err, IndexError) and all(w in str(err) for w in words), str(err)


def test_embedding_out_of_range_raises(device: str):
    emb = nn.Embedding(10, 4)
    emb.weight = emb.weight.to(device)
    temb = torch.nn.Embedding(10, 4)
    err = same_error(lambda: emb(_i([3, 12], device)).numpy(), lambda: temb(_t([3, 12])))
    assert "12" in str(err) and "10" in str(err) and "dimension 0" in str(err)


def test_in_range_and_ignored_indices_do_not_raise(device: str):
    x = Tensor(np.arange(10.0, dtype=np.float32), device=device)
    np.testing.assert_array_equal(x[_i([-10, 9], device)].numpy(), [0.0, 9.0])
    loss = Tensor.ones(2, 5, device=device).cross_entropy(_i([-100, 4], device))
    np.testing.assert_allclose(loss.numpy(), F.cross_entropy(torch.ones(2, 5), _t([-100, 4])).numpy(), rtol=1e-6)
    assert checks.pending() == 0


@pytest.mark.parametrize("op", ["//", "%"])
def test_integer_division_by_a_zero_element_raises(device: str, op: str):
    env = {"a": _i([7, 3], device), "b": _i([2, 0], device), "ok": _i([2, -2], device),
           "ta": _t([7, 3]), "tb": _t([2, 0]), "tok": _t([2, -2])}
    same_error(lambda: eval(f"a {op} b", env).numpy(), lambda: eval(f"ta {op} tb", env))  # noqa: S307
    np.testing.assert_array_equal(eval(f"a {op} ok", env).numpy(), eval(f"ta {op} tok", env).numpy())  # noqa: S307


def test_integer_division_by_constant_zero_raises_now(device: str):
    same_error(lambda: _i([3], device) // Tensor.zeros(1, dtype=dtypes.int64, device=device),
               lambda: _t([3]) // torch.zeros(1, dtype=torch.int64))
    assert checks.pending() == 0


@pytest.mark.parametrize("value, dtype", [(300, "int8"), (-129, "int8"), (256, "uint8"), (-256, "uint8"),
                                          (2 ** 31, "int32")])
def test_full_with_an_out_of_range_constant_raises(value: int, dtype: str):
    same_error(lambda: Tensor.full((2,), value, dtype=getattr(dtypes, dtype)),
               lambda: torch.full((2,), value, dtype=getattr(torch, dtype)))
    assert Tensor.full((2,), 127, dtype=dtypes.int8).numpy().tolist() == [127, 127]
    assert Tensor.full((2,), -1, dtype=dtypes.uint8).numpy().tolist() == [255, 255]  # torch wraps this one


def test_checks_can_be_turned_off(device: str):
    with Context(INDEX_CHECK=0):
        out = Tensor([1.0, 2.0, 3.0], device=device)[_i([0, 3], device)]
    np.testing.assert_array_equal(out.numpy(), [1.0, 0.0])  # the old behaviour: nothing selected


def test_pending_checks_are_bounded(device: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(checks, "MAX_PENDING", 4)
    x = Tensor([1.0, 2.0], device=device)
    for _ in range(3):
        x[_i([1], device)]
    assert checks.pending() == 3
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        x[_i([5], device)]  # the 4th check flushes all of them before any read
    assert checks.pending() == 0


def _message(fn) -> str | None:
    try:
        fn()
    except (IndexError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_host_and_device_summaries_give_the_same_error(device: str, name: str, monkeypatch: pytest.MonkeyPatch):
    """A small index tensor already in a buffer is checked on the host; forced to the summary kernel
    (``HOST_CHECK_MAX = 0``), the same error comes."""
    ours = CASES[name][0]

    def run():
        out = ours(device)
        (out if out is not None else Tensor([0])).numpy()

    on_host = _message(run)
    monkeypatch.setattr(checks, "HOST_CHECK_MAX", 0)
    assert on_host is not None and on_host == _message(run)


@pytest.mark.parametrize("dtype, values", [("int64", [3, -100, 4]), ("int32", [-100, 5]), ("uint8", [4, 200]),
                                           ("uint64", [1, 2 ** 63 + 5]), ("int16", [-7, 2])])
def test_host_path_matches_the_kernel_for_each_dtype(device: str, dtype: str, values: list[int],
                                                     monkeypatch: pytest.MonkeyPatch):
    """Ignored labels, negative values and uint64 above 2**63 (wraps to negative in the summary's cast)."""
    labels = Tensor(np.array(values, dtype=dtype), device=device).realize()

    def run():
        logits = Tensor.ones(len(values), 5, device=device)
        logits.cross_entropy(labels, ignore_index=-100 if dtype.startswith("int") else -1).numpy()

    on_host = _message(run)
    monkeypatch.setattr(checks, "HOST_CHECK_MAX", 0)
    assert on_host == _message(run)


def test_a_realized_label_tensor_is_checked_without_a_kernel(device: str):
    labels = Tensor(np.array([1, 4, 2], dtype=np.int32), device=device).realize()
    loss = Tensor.ones(3, 5, device=device).sparse_categorical_crossentropy(labels).realize()
    assert checks.pending() == 1
    before = GlobalCounters.kernel_count
    loss.numpy()  # the read runs the check: a copy of the labels, no summary kernel
    assert checks.pending() == 0 and GlobalCounters.kernel_count == before
    bad = Tensor(np.array([1, 5, 2], dtype=np.int32), device=device).realize()
    with pytest.raises(IndexError, match="5"):
        Tensor.ones(3, 5, device=device).sparse_categorical_crossentropy(bad).numpy()
