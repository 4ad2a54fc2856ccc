"""Random op graphs (:mod:`ember.testing.fuzz`) on the device under test against the PYTHON device and numpy.

Seeds are fixed, so a failure here fails the same way on every run; the message holds a shrunk
graph as a script to paste. ``--fuzz-graphs N`` changes how many graphs run (forward; a third as
many gradient graphs); ``bench/fuzz.py`` runs thousands.
"""
from __future__ import annotations

import pytest

from ember import Device
from ember.testing import fuzz

#: graphs realized together: one schedule and one batched compile per chunk
CHUNK = 40
GRAD_SEED_BASE = 1_000_000


def _pool(device: str) -> tuple[str, ...]:
    """The fuzzer's dtypes that both the device under test and the reference support."""
    ours = Device[device].renderer.supported_dtypes
    ref = Device[fuzz.REFERENCE].renderer.supported_dtypes
    from ember.dtype import to_dtype
    return tuple(d for d in fuzz.DEFAULT_DTYPES if to_dtype(d) in ours and to_dtype(d) in ref)


def _run(device: str, seeds: range, grad: bool) -> None:
    pool = _pool(device)
    # gradient graphs make several kernels per op: keep them shorter
    graphs = [fuzz.generate(s, pool=pool, grad=grad, size=3 + s % (4 if grad else 6)) for s in seeds]
    failures = [r for r in fuzz.check_many(graphs, device, grad=grad) if not r.ok]
    if failures:
        first = failures[0]
        small = fuzz.shrink(first.graph, device, grad)
        report = fuzz.check(small, device, grad).report() if small is not first.graph else first.report()
        seeds_failed = ", ".join(str(r.graph.seed) for r in failures)
        pytest.fail(f"{len(failures)} of {len(graphs)} random graphs differ on {device} (seeds {seeds_failed}); "
                    f"the first, shrunk:\n{report}", pytrace=False)


def _chunks(request_count: int) -> list[range]:
    return [range(i, min(i + CHUNK, request_count)) for i in range(0, request_count, CHUNK)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Split the requested number of graphs (``--fuzz-graphs``) into chunks, one test each."""
    if "seeds" not in metafunc.fixturenames:
        return
    total = metafunc.config.getoption("--fuzz-graphs", default=None) or fuzz.CONFORMANCE_GRAPHS
    if metafunc.function.__name__.endswith("gradients"):
        chunks = [range(GRAD_SEED_BASE + r.start, GRAD_SEED_BASE + r.stop) for r in _chunks(max(1, total // 3))]
    else:
        chunks = _chunks(total)
    metafunc.parametrize("seeds", chunks, ids=[f"{r.start}-{r.stop - 1}" for r in chunks])


def test_random_graphs_forward(device: str, seeds: range) -> None:
    """Outputs of random graphs match the PYTHON device (and numpy where every op has a numpy twin)."""
    _run(device, seeds, grad=False)


def test_random_graphs_gradients(device: str, seeds: range) -> None:
    """Gradients of a weighted sum of random graphs' outputs match the PYTHON device."""
    _run(device, seeds, grad=True)
