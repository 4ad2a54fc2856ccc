"""The pytest plugin ember installs (entry point ``pytest11``): adds ``--device``, ``--fuzz-graphs``,
``--fuzz-seed`` and ``--fuzz-large`` to pytest."""
from __future__ import annotations

import os
import random

import pytest

#: the environment variables that stand in for ``--fuzz-seed`` and ``--fuzz-large``
SEED_ENV, LARGE_ENV = "EMBER_FUZZ_SEED", "EMBER_FUZZ_LARGE"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", action="store", default=None,
                     help="ember device for the conformance suite (default: DEV= or the best usable device)")
    parser.addoption("--fuzz-graphs", action="store", type=int, default=None,
                     help="random graphs the conformance suite runs forward (a third as many for gradients)")
    parser.addoption("--fuzz-seed", action="store", default=None,
                     help="first seed of the conformance suite's random graphs: an int, or 'random' for a new one "
                          f"each run (printed in the header, to replay a failure); default ${SEED_ENV} or 0")
    parser.addoption("--fuzz-large", action="store_true", default=None,
                     help="random graphs also reduce over more than 2**24 elements and chain hundreds of ops "
                          f"(default ${LARGE_ENV}=1 or off)")


def fuzz_seed(config: pytest.Config) -> int:
    """The first seed of the random graphs this session (``random`` is drawn once per session)."""
    cached = getattr(config, "_ember_fuzz_seed", None)
    if cached is not None:
        return cached
    raw = config.getoption("--fuzz-seed", default=None) or os.environ.get(SEED_ENV) or "0"
    if raw.strip().lower() == "random":
        seed = random.SystemRandom().randrange(1, 2 ** 31)
    else:
        try:
            seed = int(raw)
        except ValueError:
            raise pytest.UsageError(f"--fuzz-seed / {SEED_ENV} must be an int or 'random', got {raw!r}") from None
    config._ember_fuzz_seed = seed  # type: ignore[attr-defined]
    return seed


def fuzz_large(config: pytest.Config) -> bool:
    """Whether the random graphs include the large ones (``--fuzz-large`` or ``EMBER_FUZZ_LARGE=1``)."""
    return bool(config.getoption("--fuzz-large", default=None)) or os.environ.get(LARGE_ENV, "") == "1"


def pytest_report_header(config: pytest.Config) -> str | None:
    """The fuzz seed, when one was asked for, so that a run can be replayed."""
    if config.getoption("--fuzz-seed", default=None) is None and SEED_ENV not in os.environ:
        return None
    return (f"ember fuzz seed: {fuzz_seed(config)} (replay: --fuzz-seed={fuzz_seed(config)})"
            f"{' with --fuzz-large' if fuzz_large(config) else ''}")
