"""The pytest plugin ember installs (entry point ``pytest11``): adds ``--device`` and ``--fuzz-graphs`` to pytest."""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", action="store", default=None,
                     help="ember device for the conformance suite (default: DEV= or the best usable device)")
    parser.addoption("--fuzz-graphs", action="store", type=int, default=None,
                     help="random graphs the conformance suite runs forward (a third as many for gradients)")
