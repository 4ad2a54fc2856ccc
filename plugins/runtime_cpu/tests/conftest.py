"""Fixtures for the CPU plugin tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Kernels compiled by a test module go to a folder of their own (out of the user's cache folder); a module
    asks for it with ``pytest.mark.usefixtures("private_cache_dir")``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("ember-cache")))
        yield
