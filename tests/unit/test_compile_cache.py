"""The Compiler base class: memory cache, disk cache (atomic, checksummed), CACHELEVEL and IO failures."""
from __future__ import annotations

import hashlib
import os
import pickle
import warnings

import pytest

from ember.device.compiler import MAGIC, CompileError, Compiler
from ember.helpers import Context, GlobalCounters


class CountingCompiler(Compiler):
    """Compiles by reversing the source; counts real compiles."""

    def __init__(self, cachekey: str | None = "fake-cc -O2"):
        super().__init__(cachekey)
        self.calls = 0

    def compile(self, src: str) -> bytes:
        self.calls += 1
        return b"BIN:" + src[::-1].encode()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder for this test; returns the folder holding compile entries."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "compile"


def entry_path(folder, cachekey: str, src: str):
    return folder / hashlib.sha256(f"{cachekey}\0{src}".encode()).hexdigest()


def test_memory_hit(cache):
    c = CountingCompiler()
    before = GlobalCounters.kernels_compiled
    assert c.compile_cached("int a;") == b"BIN:;a tni"
    assert c.compile_cached("int a;") == b"BIN:;a tni"
    assert c.calls == 1
    assert GlobalCounters.kernels_compiled == before + 1


def test_disk_hit_in_new_instance(cache):
    CountingCompiler().compile_cached("int b;")
    path = entry_path(cache, "fake-cc -O2", "int b;")
    assert path.exists()
    data = path.read_bytes()
    assert data.startswith(MAGIC) and data.endswith(b"BIN:;b tni")
    before = GlobalCounters.kernels_compiled
    fresh = CountingCompiler()
    assert fresh.compile_cached("int b;") == b"BIN:;b tni"
    assert fresh.calls == 0
    assert GlobalCounters.kernels_compiled == before
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp")]


def test_cachekey_separates_entries(cache):
    CountingCompiler("cc-1").compile_cached("int c;")
    other = CountingCompiler("cc-2")
    other.compile_cached("int c;")
    assert other.calls == 1
    assert len(list(cache.iterdir())) == 2


def test_none_cachekey_disables_disk(cache):
    c = CountingCompiler(None)
    c.compile_cached("int d;")
    assert not cache.exists() or not list(cache.iterdir())
    assert CountingCompiler(None).compile_cached("int d;") == b"BIN:;d tni"


@pytest.mark.parametrize("damage", ["truncate_payload", "truncate_header", "empty", "flip_payload", "flip_digest",
                                    "flip_magic"])
def test_corrupt_entry_is_recompiled(cache, damage):
    src = "float e;"
    CountingCompiler().compile_cached(src)
    path = entry_path(cache, "fake-cc -O2", src)
    data = bytearray(path.read_bytes())
    if damage == "truncate_payload":
        data = data[:-3]
    elif damage == "truncate_header":
        data = data[:len(MAGIC) + 5]
    elif damage == "empty":
        data = bytearray()
    elif damage == "flip_payload":
        data[-1] ^= 0x01
    elif damage == "flip_digest":
        data[len(MAGIC) + 3] ^= 0x80
    else:
        data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    before = GlobalCounters.kernels_compiled
    c = CountingCompiler()
    assert c.compile_cached(src) == b"BIN:;e taolf"
    assert c.calls == 1 and GlobalCounters.kernels_compiled == before + 1
    # the bad entry was replaced by a good one
    assert CountingCompiler().compile_cached(src) == b"BIN:;e taolf"
    assert path.read_bytes().startswith(MAGIC)


def test_cachelevel_zero_disables_disk(cache):
    with Context(CACHELEVEL=0):
        c = CountingCompiler()
        c.compile_cached("int f;")
        assert not cache.exists() or not list(cache.iterdir())
    CountingCompiler().compile_cached("int f;")  # now cached on disk
    with Context(CACHELEVEL=0):
        c = CountingCompiler()
        c.compile_cached("int f;")
        assert c.calls == 1  # the disk entry is not read either


def test_unwritable_cache_dir_warns_once(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(blocker / "cache"))
    c = CountingCompiler()
    with pytest.warns(RuntimeWarning, match="disk cache"):
        assert c.compile_cached("int g;") == b"BIN:;g tni"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.compile_cached("int h;") == b"BIN:;h tni"
        assert CountingCompiler().compile_cached("int i;") == b"BIN:;i tni"


def test_full_disk_warns_and_leaves_no_temp_file(cache, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    c = CountingCompiler()
    with pytest.warns(RuntimeWarning, match="No space left"):
        assert c.compile_cached("int j;") == b"BIN:;j tni"
    assert list(cache.iterdir()) == []


def test_compile_error_message():
    src = "void f(void) {\n  int x = ;\n}\n"
    err = CompileError(src, "kernel.c:2:11: error: expected expression", "C compile failed")
    text = str(err)
    assert "C compile failed" in text
    assert "2 |   int x = ;" in text
    assert "expected expression" in text
    assert isinstance(err, RuntimeError)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == text and again.src == src


class BatchCompiler(CountingCompiler):
    """Records the sources of every compile_batch call."""

    def __init__(self, cachekey: str | None = "fake-cc -O2"):
        super().__init__(cachekey)
        self.batches: list[list[str]] = []

    def compile_batch(self, srcs):
        self.batches.append(list(srcs))
        return super().compile_batch(srcs)


def test_compile_cached_many_builds_only_the_misses_in_one_batch(cache):
    c = BatchCompiler()
    assert c.compile_cached("int a;") == b"BIN:;a tni"
    before = GlobalCounters.kernels_compiled
    got = c.compile_cached_many(["int b;", "int a;", "int c;", "int b;"])
    assert got == [b"BIN:;b tni", b"BIN:;a tni", b"BIN:;c tni", b"BIN:;b tni"]
    assert c.batches == [["int b;", "int c;"]]  # the hit and the repeat are not compiled again
    assert GlobalCounters.kernels_compiled - before == 2
    fresh = BatchCompiler()  # each source of the batch has its own disk entry
    assert fresh.compile_cached_many(["int c;", "int b;"]) == [b"BIN:;c tni", b"BIN:;b tni"]
    assert fresh.calls == 0 and fresh.batches == []


def test_compile_batch_must_return_one_binary_per_source(cache):
    class Short(CountingCompiler):
        def compile_batch(self, srcs):
            return [b"x"]

    with pytest.raises(RuntimeError, match="returned 1 binaries for 2 sources"):
        Short().compile_cached_many(["int y;", "int z;"])


def test_a_schedule_compiles_its_new_kernels_in_one_batch(cache, monkeypatch):
    import numpy as np

    from ember import Device, Tensor

    compiler = Device["CPU"].compiler
    batches: list[list[str]] = []
    real = type(compiler).compile_cached_stream

    def recorded(self, srcs):
        srcs = list(srcs)
        batches.append(srcs)
        return real(self, srcs)

    monkeypatch.setattr(type(compiler), "compile_cached_stream", recorded)
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="CPU")
    outs = [(x * 3.0625).sum(1), (x - 1.03125).exp(), (x + 2.5).max(0)]  # three kernels no other test makes
    Tensor.realize(*outs)
    assert [len(b) for b in batches] == [3]
    np.testing.assert_allclose(outs[1].numpy(), np.exp(np.arange(6, dtype=np.float32).reshape(2, 3) - 1.03125),
                               rtol=1e-6)
