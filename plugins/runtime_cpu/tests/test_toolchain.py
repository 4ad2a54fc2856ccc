"""The CPU plugin's compiler probe and the float16 path it chooses.

The emulated float16 path is tested on every machine (whatever compiler is installed) by giving a
second CPU device the emulated renderer; results are compared bit for bit with numpy's float16.
"""
from __future__ import annotations

import platform
import shutil
import sys

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.device.registry import Device
from ember_cpu import plugin
from ember_cpu.compiler import host_cpu
from ember_cpu.renderer import CPURenderer
from ember_cpu.toolchain import Toolchain, find_compilers, probe_toolchain, select_toolchain

pytestmark = pytest.mark.skipif(not find_compilers(), reason="no C compiler found")

HALF_DEV = "CPU:3"


@pytest.fixture(scope="module")
def half_dev():
    """A CPU device whose renderer emulates float16 (16-bit storage, float arithmetic rounded to half)."""
    dev = Device[HALF_DEV]
    saved = dev.renderer
    dev.renderer = CPURenderer(float16="emulated")
    yield HALF_DEV
    dev.renderer = saved


def _fake_cc(tmp_path, rejects: str) -> str:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("needs gcc or cc to wrap")
    script = tmp_path / f"cc-without{rejects}"
    script.write_text("#!/bin/sh\n"
                      f'for a in "$@"; do [ "$a" = "{rejects}" ] && {{ echo "error: unsupported option {rejects}" >&2; '
                      "exit 1; }; done\n"
                      f'exec {gcc} "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("name", ["gcc", "clang"])
def test_probe_reports_float16_and_openmp(name):
    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} is not installed")
    tc = probe_toolchain((exe,))
    assert tc.float16 in ("native", "emulated") and (tc.float16 == "native") == (tc.float16_reason == "")
    assert tc.openmp == (tc.openmp_reason == "")
    # clang 14 has _Float16 on x86-64 only for CPUs with AVX512-FP16 (kernels build with -march=native)
    if name == "clang" and "clang version 14" in tc.version and platform.machine() == "x86_64" \
            and "avx512_fp16" not in host_cpu().get("flags", "").split():
        assert tc.float16 == "emulated" and "_Float16" in tc.float16_reason


@pytest.mark.parametrize("name", ["gcc", "clang"])
def test_one_program_probes_both_features_with_the_same_answers(name, tmp_path, monkeypatch):
    """Where the joint probe program builds, it is the only compiler process, and it finds what the two
    separate probes find; where it does not (clang 14 on x86-64 has no _Float16), each probe runs alone."""
    from ember_cpu import toolchain

    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} is not installed")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    runs: list[str] = []
    real = toolchain._build
    monkeypatch.setattr(toolchain, "_build", lambda *a: runs.append(a[4]) or real(*a))
    tc = toolchain._probe.__wrapped__((exe,))
    separate = toolchain._probe_half((exe,), str(tmp_path)), toolchain._probe_openmp((exe,), str(tmp_path))
    assert (tc.float16_reason, tc.openmp_reason) == separate
    lean = ["lean"] if not toolchain.is_clang((exe,)) and sys.platform.startswith("linux") else []
    joint = ["both"] if tc.float16 == "native" and tc.openmp else ["both", "half", "omp"]
    assert runs[:-2] == (lean if tc.link else lean + joint), runs


def test_lean_link_falls_back_to_the_default_when_its_program_fails(tmp_path, monkeypatch):
    """A lean link line the toolchain cannot use (here a library that does not exist) costs one failed build:
    the features are probed with the default link and no lean link is kept."""
    from ember_cpu import toolchain

    gcc = shutil.which("gcc")
    if gcc is None or not sys.platform.startswith("linux"):
        pytest.skip("the lean link is for gcc on Linux")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(toolchain, "LEAN_LINK", ("-nostdlib", "-lember_no_such_library"))
    tc = toolchain._probe.__wrapped__((gcc,))
    assert tc.link == () and tc.openmp == (tc.openmp_reason == "")


def test_kernels_linked_lean_compute_what_the_default_link_gives(monkeypatch):
    """The same kernels (OpenMP, the C library's expf and sinf, a register tile) built with the probed lean link
    and with the default one give the same bits."""
    gcc = shutil.which("gcc")
    if gcc is None or not probe_toolchain((gcc,)).link:
        pytest.skip("no lean link here (it is for gcc on Linux)")
    from ember.engine.realize import method_cache

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 80)).astype(np.float32)

    def run() -> np.ndarray:
        method_cache.clear()  # (built again by each compiler, not reused)
        x, y = Tensor(a, device="CPU"), Tensor(b, device="CPU")
        return ((x.exp() @ y.sin()).relu() + x.sum()).numpy()

    dev = Device["CPU"]
    saved = dev.compiler
    try:
        monkeypatch.setenv("CPU_LEAN_LINK", "1")
        dev._compiler = type(saved)([gcc])
        assert dev.compiler.link == probe_toolchain((gcc,)).link
        lean = run()
        monkeypatch.setenv("CPU_LEAN_LINK", "0")
        dev._compiler = type(saved)([gcc])
        assert "-nostdlib" not in dev.compiler.link
        np.testing.assert_array_equal(run(), lean)
    finally:
        dev._compiler = saved
        method_cache.clear()


def test_missing_openmp_names_the_remedy(tmp_path, monkeypatch):
    cc = _fake_cc(tmp_path, "-fopenmp")
    tc = probe_toolchain((cc,))
    assert not tc.openmp and "apt install" in tc.openmp_reason and "unsupported option" in tc.openmp_reason
    monkeypatch.setenv("CC", cc)
    lines = "\n".join(plugin.ember_report_header())
    assert "OpenMP: no" in lines and tc.openmp_reason in lines


def test_without_cc_the_best_compiler_is_chosen(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    best = select_toolchain()
    assert isinstance(best, Toolchain)
    assert best.score == max(probe_toolchain(tuple(cc)).score for cc in find_compilers())


def test_cc_that_does_not_exist_is_a_clear_probe_failure(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-ember")
    assert "CC=no-such-compiler-ember" in plugin.probe()


def test_emulated_source_has_no_float16_type():
    x = Tensor(np.ones(4, np.float16))
    ast = [si for si in (x * 3).schedule() if si.ast is not None][-1].ast
    src = get_program(ast, CPURenderer(float16="emulated")).src
    assert "_Float16" not in src and "ember_f32_to_f16" in src
    assert CPURenderer(float16="emulated").variant != CPURenderer(float16="native").variant


def test_bad_float16_mode_is_rejected():
    with pytest.raises(ValueError, match="float16"):
        CPURenderer(float16="fast")


TRICKY = np.array([0.0, -0.0, 1.0, 0.1, 1 / 3, 65504.0, 65519.99, 65520.0, 1e6, -1e6, 6.1e-5, 5.96e-8, 2.98e-8,
                   2.9802322387695312e-08, 1.00048828125, 1.000732421875, 2049.0, np.inf, -np.inf, np.nan, -7e-6])


@pytest.mark.parametrize("src_dtype", ["float64", "float32", "bfloat16", "int32", "int64", "uint8", "bool"])
def test_emulated_casts_to_float16_match_numpy(half_dev, src_dtype):
    if src_dtype == "bfloat16":
        values = TRICKY.astype(np.float32)
        t = Tensor(values, device=half_dev).cast(dtypes.bfloat16)
        want = Tensor(values, device="PYTHON").cast(dtypes.bfloat16).cast(dtypes.float16).numpy()
    else:
        npdt = np.dtype(src_dtype)
        with np.errstate(invalid="ignore"):
            values = TRICKY if npdt.kind == "f" else np.nan_to_num(TRICKY, posinf=0, neginf=0).astype(np.int64)
            values = values.astype(npdt) if npdt.kind != "u" else np.abs(values).astype(npdt)
        t = Tensor(values, device=half_dev)
        with np.errstate(over="ignore"):
            want = values.astype(np.float16)
    got = t.cast(dtypes.float16).numpy()
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


@pytest.mark.parametrize("dst_dtype", ["float64", "float32", "int32", "int8", "bool"])
def test_emulated_casts_from_float16_match_numpy(half_dev, dst_dtype):
    h = np.arange(0, 1 << 16, 37, dtype=np.uint32).astype(np.uint16).view(np.float16)
    if dst_dtype in ("int32", "int8"):
        h = h[np.isfinite(h) & (np.abs(h.astype(np.float32)) < (100 if dst_dtype == "int8" else 60000))]
    got = Tensor(h, device=half_dev).cast(getattr(dtypes, dst_dtype)).numpy()
    want = h.astype(dst_dtype)
    np.testing.assert_array_equal(got[~np.isnan(want)] if want.dtype.kind == "f" else got,
                                  want[~np.isnan(want)] if want.dtype.kind == "f" else want)


def test_emulated_arithmetic_rounds_like_half(half_dev):
    rng = np.random.default_rng(3)
    a = rng.normal(0, 50, 4096).astype(np.float16)
    b = rng.normal(0, 3, 4096).astype(np.float16)
    ta, tb = Tensor(a, device=half_dev), Tensor(b, device=half_dev)
    for got, want in [(ta + tb, a + b), (ta * tb, a * b), (ta / tb, a / b), (ta - tb * tb, a - b * b),
                      (ta.maximum(tb), np.maximum(a, b))]:
        np.testing.assert_array_equal(got.numpy(), want)
    with np.errstate(over="ignore"):
        want_exp = np.exp(b.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(tb.exp().numpy().astype(np.float32), want_exp.astype(np.float32), rtol=1e-3)
    small = (a[:256] / 64).astype(np.float16)
    np.testing.assert_allclose(Tensor(small, device=half_dev).sum().numpy(), small.astype(np.float32).sum(),
                               rtol=2e-2, atol=0.1)


def test_a_probe_asked_for_twice_at_once_runs_once(tmp_path, monkeypatch):
    """The plugin's background probe and the device's own request share one probe of a compiler."""
    import threading

    from ember_cpu import toolchain

    cc = (_fake_cc(tmp_path, "-no-such-flag"),)  # a compiler this process has not probed yet
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    runs: list[str] = []
    real = toolchain._build
    monkeypatch.setattr(toolchain, "_build", lambda *a: runs.append(a[4]) or real(*a))
    results: list[Toolchain] = []
    threads = [threading.Thread(target=lambda: results.append(probe_toolchain(cc))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 3 and results[0] is results[1] is results[2]
    assert runs[0] in ("lean", "both") and len(runs) == len(set(runs)), runs  # each probe program built once


def test_prefetch_starts_one_probe_thread(monkeypatch):
    from ember_cpu import toolchain

    calls: list[int] = []
    monkeypatch.setattr(toolchain, "_prefetch", None)
    monkeypatch.setattr(toolchain, "select_toolchain", lambda: calls.append(1))
    toolchain.prefetch_toolchain()
    first = toolchain._prefetch
    toolchain.prefetch_toolchain()
    assert first is not None and toolchain._prefetch is first
    first.join(10)
    assert calls == [1] and not first.daemon  # a process that ends meanwhile waits for it
