"""The disk cache trusts nothing it reads: entries bound to their key, private folders, a size bound with
least-recently-used eviction, ``python -m ember.cache``, and a run over mutated entries (bench/cache_mutations.py)."""
from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ember import Device, diskcache
from ember.cache import main as cache_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    diskcache._checked_dirs.clear()
    return tmp_path / "cache"


def _put(table: str, key: str, payload: bytes) -> Path:
    path = diskcache.entry_path(table, key)
    assert path is not None
    diskcache.write(path, payload)
    return path


def test_entries_swapped_between_keys_are_refused_and_deleted(cache: Path):
    a, b = _put("t", "key a", b"payload a"), _put("t", "key b", b"payload b")
    assert diskcache.read(a) == b"payload a"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    assert diskcache.read(a) is None and diskcache.read(b) is None
    assert not a.exists() and not b.exists()  # deleted, so the caller rebuilds and rewrites them


def test_a_folder_or_stray_file_in_place_of_an_entry_is_a_miss(cache: Path):
    p = _put("t", "k", b"x")
    p.unlink()
    p.mkdir()
    assert diskcache.read(p) is None and not p.exists()
    (p.parent / "stray.txt").write_text("not an entry")
    assert diskcache.read(p.parent / "stray.txt") is None
    diskcache.write(p.parent / "stray.txt", b"refused: no key has this name")
    assert not (p.parent / "stray.txt").exists()


def test_folders_are_private_whatever_the_umask(cache: Path):
    old = os.umask(0)
    try:
        _put("compile", "k", b"binary")
    finally:
        os.umask(old)
    for d in (cache, cache / "compile"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, oct(d.stat().st_mode)
    (f,) = (cache / "compile").iterdir()
    assert stat.S_IMODE(f.stat().st_mode) == 0o600


def test_an_open_folder_of_ours_is_closed(cache: Path):
    (cache / "compile").mkdir(parents=True)
    os.chmod(cache, 0o777)
    os.chmod(cache / "compile", 0o777)
    _put("compile", "k", b"binary")
    assert stat.S_IMODE((cache / "compile").stat().st_mode) == 0o700


def test_lowered_payloads_never_load_code(cache: Path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        diskcache.restricted_loads(pickle.dumps(Evil()))
    assert diskcache.restricted_loads(pickle.dumps({"a": (1, 2.0, "s", [b"x"])})) == {"a": (1, 2.0, "s", [b"x"])}


def test_payloads_cannot_call_embers_own_functions(cache: Path, tmp_path: Path):
    """A forged entry may name only the allowed data classes: not even an ember function (here one that
    writes a file of the payload's choosing) is reachable."""
    target = tmp_path / "written"

    class Forged:
        def __reduce__(self):
            return (diskcache.write, (target, b"forged"))

    with pytest.raises(pickle.UnpicklingError, match="refusing to load ember.diskcache.write"):
        diskcache.restricted_loads(pickle.dumps(Forged()))
    assert not target.exists()
    from ember.codegen.opts import Opt

    opts = [Opt("UPCAST", 0, 4), Opt("UNROLL", 0, 2)]
    assert diskcache.restricted_loads(pickle.dumps(opts)) == opts


def test_size_limit_evicts_the_least_recently_used(cache: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EMBER_CACHE_MB", "1")
    blob = b"x" * (200 * 1024)
    paths = [_put("t", f"k{i}", blob) for i in range(4)]
    for age, p in enumerate(paths):  # k0 oldest ... k3 newest
        os.utime(p, (1_000_000 + age, 1_000_000 + age))
    assert diskcache.read(paths[0]) == blob  # a hit: k0 becomes the most recently used
    for i in range(4, 6):  # the second write goes over 1 MB: the two least recently used entries go
        _put("t", f"k{i}", blob)
    total = sum(f.stat().st_size for f in (cache / "t").iterdir())
    assert total <= 1024 * 1024 * 9 // 10
    assert [p.exists() for p in paths] == [True, False, False, True]


def test_cache_command_shows_and_clears(cache: Path, capsys: pytest.CaptureFixture[str]):
    _put("compile", "k1", b"a" * 10)
    _put("lowered", "k2", b"b" * 10)
    assert cache_main([]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and "compile" in out and "lowered" in out and "limit" in out
    assert cache_main(["clear", "lowered"]) == 0
    assert diskcache.usage() == {"compile": (1, diskcache.usage()["compile"][1])}
    cache_main(["clear"])
    assert diskcache.usage() == {}


def test_mutated_entries_never_crash_and_are_rebuilt():
    if "CPU" not in Device.available():
        pytest.skip(f"CPU is not usable here: {Device.probe('CPU')}")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "cache_mutations.py"), "--mutations", "40",
                           "--per-round", "20", "--seed", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert '"crashes": 0' in proc.stdout and '"entries_not_rebuilt": 0' in proc.stdout
