"""Fixtures for the METAL plugin tests (none of them needs a Mac)."""
from __future__ import annotations

import sys

import pytest
from metal_msl_check import find_clang


@pytest.fixture(scope="session")
def clang() -> str:
    """The clang that checks MSL; skip with the reason when there is none."""
    path = find_clang()
    if path is None:
        pytest.skip("no clang on PATH: the MSL syntax and type check needs clang >= 14 (apt install clang)")
    return path


@pytest.fixture(scope="session")
def host_clang(clang: str) -> str:
    """The clang that builds MSL for this CPU (tests/shim/host); its threadgroup barriers are pthread barriers,
    which macOS lacks (and a Mac runs the real device instead)."""
    if sys.platform == "darwin":
        pytest.skip("the host runs of MSL use pthread barriers (Linux); on macOS test the METAL device itself")
    return clang


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Keep the caches of these tests out of the user's cache folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("ember-cache")))
        yield
