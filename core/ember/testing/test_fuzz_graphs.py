"""Random op graphs (:mod:`ember.testing.fuzz`) on the device under test against the PYTHON device and numpy.

Seeds start at 0 unless ``--fuzz-seed N`` (or ``EMBER_FUZZ_SEED``) says otherwise; ``--fuzz-seed random``
draws a new start each run (CI does), printed in the header and in every failure with the option that
replays it. The message holds a shrunk graph as a script to paste. ``--fuzz-graphs N`` changes how many
graphs run (forward; a third as many gradient graphs); ``--fuzz-large`` adds the large graphs
(:mod:`ember.testing.graphgen`); ``bench/fuzz.py`` runs thousands.
"""
from __future__ import annotations

import pytest

from ember import Device
from ember.testing import fuzz
from ember.testing.plugin import fuzz_large, fuzz_seed

#: graphs realized together: one schedule and one batched compile per chunk
CHUNK = 40
GRAD_SEED_BASE = 1_000_000


def _pool(device: str) -> tuple[str, ...]:
    """The fuzzer's dtypes that both the device under test and the reference support."""
    ours = Device[device].renderer.supported_dtypes
    ref = Device[fuzz.REFERENCE].renderer.supported_dtypes
    from ember.dtype import to_dtype
    return tuple(d for d in fuzz.DEFAULT_DTYPES if to_dtype(d) in ours and to_dtype(d) in ref)


def _run(device: str, seeds: range, grad: bool, config: pytest.Config) -> None:
    pool = _pool(device)
    base, large = fuzz_seed(config), fuzz_large(config)
    # gradient graphs make several kernels per op: keep them shorter
    graphs = [fuzz.generate(base + s, pool=pool, grad=grad, size=3 + s % (4 if grad else 6), large=large)
              for s in seeds]
    failures = [r for r in fuzz.check_many(graphs, device, grad=grad) if not r.ok]
    if failures:
        first = failures[0]
        small = fuzz.shrink(first.graph, device, grad)
        report = fuzz.check(small, device, grad).report() if small is not first.graph else first.report()
        seeds_failed = ", ".join(str(r.graph.seed) for r in failures)
        replay = f"--fuzz-seed={base}{' --fuzz-large' if large else ''}"
        pytest.fail(f"{len(failures)} of {len(graphs)} random graphs differ on {device} (seeds {seeds_failed}; "
                    f"this run's first seed {base}: replay with {replay}); the first, shrunk:\n{report}",
                    pytrace=False)


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


def test_random_graphs_forward(device: str, seeds: range, request: pytest.FixtureRequest) -> None:
    """Outputs of random graphs match the PYTHON device (and numpy where every op has a numpy twin)."""
    _run(device, seeds, grad=False, config=request.config)


def test_random_graphs_gradients(device: str, seeds: range, request: pytest.FixtureRequest) -> None:
    """Gradients of a weighted sum of random graphs' outputs match the PYTHON device."""
    _run(device, seeds, grad=True, config=request.config)
