"""The disk cache trusts nothing it reads: entries bound to their key, private folders, a size bound with
least-recently-used eviction, ``python -m ember.cache``, and a run over mutated entries (bench/cache_mutations.py)."""
from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
import warnings
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


# --- ownership: only the current user's own folders and entries are used --------------------------------
OTHER_UID = 65534  # "nobody": stands for another user on this machine


@pytest.fixture
def fresh_state(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache fixture with the process-wide memory of refused folders and warnings emptied too."""
    for name in ("_unreadable_dirs", "_unwritable_dirs", "_warned"):
        monkeypatch.setattr(diskcache, name, set())
    return cache


needs_chown = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                 reason="making a file owned by another user takes root")


@needs_chown
@pytest.mark.parametrize("which", ["root", "table"])
def test_a_private_folder_of_another_user_is_refused_even_by_root(fresh_state: Path, which: str):
    """Mode 0700 does not make another user's folder ours: root may read it, but its entries are theirs."""
    good = _put("compile", "k", b"binary")  # an intact entry, made by us
    folder = fresh_state if which == "root" else fresh_state / "compile"
    os.chown(folder, OTHER_UID, OTHER_UID)
    os.chmod(folder, 0o700)
    diskcache._checked_dirs.clear()
    with pytest.warns(RuntimeWarning, match=f"cannot trust .*owned by uid {OTHER_UID}, not by this user"):
        assert diskcache.read(good) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: later reads and writes are silent
        assert diskcache.read(good) is None
        diskcache.write(diskcache.entry_path("compile", "k2"), b"x")
    assert [p.name for p in (fresh_state / "compile").iterdir()] == [good.name], "nothing written there"


@needs_chown
def test_entries_planted_while_our_folder_was_open_are_refused(fresh_state: Path):
    """Our folder was world-writable (an old umask): closing it is not enough, each entry another user made (an
    intact copy of a real entry, even mode 0600), one writable by others, or a link is refused and deleted."""
    table = fresh_state / "compile"
    table.mkdir(parents=True)
    os.chmod(fresh_state, 0o777)
    os.chmod(table, 0o777)
    theirs, writable, linked, ours = (_put("compile", k, b"payload " + k.encode())
                                      for k in ("theirs", "writable", "linked", "ours"))
    assert stat.S_IMODE(table.stat().st_mode) == 0o700  # closed on first use
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.chmod(writable, 0o666)
    target = fresh_state.parent / "elsewhere"
    target.write_bytes(linked.read_bytes())
    linked.unlink()
    linked.symlink_to(target)
    for p in (theirs, writable, linked):
        assert diskcache.read(p) is None, p
        assert not p.exists() and not p.is_symlink(), "deleted, so it is rebuilt"
    assert target.exists(), "a link's target is left alone"
    assert diskcache.read(ours) == b"payload ours"


def test_a_read_only_cache_warns_once_and_never_raises(fresh_state: Path, monkeypatch: pytest.MonkeyPatch):
    """A cache folder of ours that cannot be changed (mode 0755 on a read-only disk: chmod fails with EROFS) is
    read, not written: one warning, no OSError reaches the caller."""
    import errno

    entry = _put("compile", "old", b"binary")
    os.chmod(fresh_state, 0o755)
    os.chmod(fresh_state / "compile", 0o755)
    diskcache._checked_dirs.clear()

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    for name in ("chmod", "mkdir"):
        monkeypatch.setattr(os, name, read_only)
    monkeypatch.setattr(diskcache.tempfile, "mkstemp", read_only)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert diskcache.read(entry) == b"binary"  # a 0755 folder of ours is not open to others' writes
        for i in range(3):
            diskcache.write(diskcache.entry_path("compile", f"new{i}"), b"x")
            diskcache.write(diskcache.entry_path("lowered", f"new{i}"), b"x")
            assert diskcache.read(diskcache.entry_path("lowered", f"new{i}")) is None
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "cannot write" in said[0] and "Read-only" in said[0], said


def test_an_open_folder_that_cannot_be_closed_is_not_used(fresh_state: Path, monkeypatch: pytest.MonkeyPatch):
    import errno

    entry = _put("compile", "k", b"binary")
    os.chmod(fresh_state / "compile", 0o777)
    diskcache._checked_dirs.clear()
    monkeypatch.setattr(os, "chmod", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EPERM, "not permitted")))
    with pytest.warns(RuntimeWarning, match="other users may write to it .mode 777. and it cannot be closed"):
        assert diskcache.read(entry) is None
    assert entry.exists()


@needs_chown
def test_as_another_user_the_folder_of_root_is_refused(fresh_state: Path, monkeypatch: pytest.MonkeyPatch):
    """Seen from a user who is not root (the effective uid is all the cache consults), root's private folder is
    someone else's; the user's own folder, made read-only by the user (0500), is read and never written."""
    entry = _put("compile", "k", b"binary")
    monkeypatch.setattr(os, "geteuid", lambda: OTHER_UID)
    diskcache._checked_dirs.clear()
    with pytest.warns(RuntimeWarning, match=f"owned by uid 0, not by this user .uid {OTHER_UID}"):
        assert diskcache.read(entry) is None
    for name in ("_unreadable_dirs", "_unwritable_dirs", "_warned"):
        monkeypatch.setattr(diskcache, name, set())
    diskcache._checked_dirs.clear()
    for d in (fresh_state, fresh_state / "compile", entry):
        os.chown(d, OTHER_UID, OTHER_UID)
    os.chmod(fresh_state / "compile", 0o555)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert diskcache.read(entry) == b"binary"
    assert stat.S_IMODE((fresh_state / "compile").stat().st_mode) == 0o500, "closed, still read-only"


def _runs_as(uid: int) -> bool:
    """Whether this interpreter can be started by user ``uid`` (its install may sit in root's private home)."""
    try:
        return subprocess.run([sys.executable, "-c", "pass"], preexec_fn=lambda: os.setuid(uid), timeout=60,
                              capture_output=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@needs_chown
def test_a_real_other_user_computes_with_a_read_only_cache(tmp_path: Path):
    """End to end, as a real other user: their cache folder is read-only (0555): ``.numpy()`` works, compiling in
    memory, with one warning."""
    if not _runs_as(OTHER_UID):
        pytest.skip(f"uid {OTHER_UID} cannot start {sys.executable}")
    if "CPU" not in Device.available():
        pytest.skip(f"CPU is not usable here: {Device.probe('CPU')}")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(cache, OTHER_UID, OTHER_UID)
    os.chmod(cache, 0o555)
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache), "DEV": "CPU", "HOME": str(tmp_path)}
    code = "from ember import Tensor; print((Tensor.ones(4) + 1).numpy().tolist(), (Tensor.ones(3) * 3).tolist())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.setuid(OTHER_UID))
    assert proc.returncode == 0, proc.stderr
    assert "[2.0, 2.0, 2.0, 2.0] [3.0, 3.0, 3.0]" in proc.stdout
    assert proc.stderr.count("disk cache: cannot") == 1, proc.stderr
