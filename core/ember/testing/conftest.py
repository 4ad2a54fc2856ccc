"""The ``device`` fixture of the conformance suite (the ``--device`` option comes from ``ember.testing.plugin``)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The device under test; skips the suite with the reason when it is not usable."""
    from ember import Device

    name = request.config.getoption("--device") or Device.DEFAULT
    name = Device.canonicalize(name)
    reason = Device.probe(name)
    if reason is not None:
        pytest.skip(f"device {name} is not usable: {reason}")
    return name
