"""Batched builds: the new kernels of a schedule are built as one OpenCL program.

Sources that collide (same kernel name, same helper functions) must still build together, each
kernel must load and run alone from its cache entry, and a bad source must be named on its own.
"""
from __future__ import annotations

import numpy as np
import pytest
from ember_opencl.renderer import CLRenderer

from ember import Tensor
from ember.device.batch_compiler import KernelBinary, join_sources
from ember.device.compiler import CompileError
from ember.helpers import GlobalCounters

# two different kernels with the same name, each with the same guarded helper (as the renderer emits it)
HELPER = "#ifndef EMBER_TEST_HELPER\n#define EMBER_TEST_HELPER\nfloat twice(float x) { return 2.0f * x; }\n#endif\n"
SRC_A = HELPER + """__kernel void E_4(__global float* restrict out, __global const float* restrict a) {
  const int i = get_global_id(0);
  out[i] = twice(a[i]) + 1.0f;
}
"""
SRC_B = HELPER + """__kernel void E_4(__global float* restrict out, __global const float* restrict a) {
  const int i = get_global_id(0);
  out[i] = twice(a[i]) * a[i];
}
"""


def run(dev, binary: bytes, name: str, a: np.ndarray) -> np.ndarray:
    prg = dev.runtime(name, binary)
    out, inp = dev.allocator.alloc(a.nbytes), dev.allocator.alloc(a.nbytes)
    dev.allocator.copyin(inp, memoryview(a).cast("B"))
    prg(out, inp, global_size=(a.size, 1, 1))
    got = np.empty_like(a)
    dev.allocator.copyout(memoryview(got).cast("B"), out)
    return got


def test_join_renames_each_kernel(dev):
    pattern = type(dev.compiler).kernel_pattern
    text, symbols = join_sources([SRC_A, SRC_B], pattern)
    assert symbols == ["ember_b0_E_4", "ember_b1_E_4"]
    assert text.count("#define E_4 ") == 2 and text.count("#undef E_4") == 2
    assert join_sources([SRC_A, "int x;"], pattern) is None  # not one kernel per source: built one by one
    assert join_sources([SRC_A, SRC_A + SRC_B], pattern) is None


def test_colliding_sources_build_once_and_each_runs(dev, monkeypatch):
    builds = []
    real_build = type(dev.compiler).build
    monkeypatch.setattr(type(dev.compiler), "build", lambda self, src: builds.append(src) or real_build(self, src))
    binaries = dev.compiler.compile_batch([SRC_A, SRC_B])
    assert len(builds) == 1, "two kernels should be one driver build"
    a = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(run(dev, binaries[0], "E_4", a), 2 * a + 1)
    np.testing.assert_array_equal(run(dev, binaries[1], "E_4", a), 2 * a * a)
    ka, kb = KernelBinary.unpack(binaries[0]), KernelBinary.unpack(binaries[1])
    assert ka.program == kb.program and ka.symbol != kb.symbol
    assert dev.runtime("E_4", binaries[0]).program is dev.runtime("E_4", binaries[1]).program  # loaded once


def test_bad_source_in_a_batch_is_named_alone(dev):
    bad = "__kernel void E_5(__global float* out) { out[0] = not_declared_anywhere; }\n"
    with pytest.raises(CompileError) as info:
        dev.compiler.compile_batch([SRC_A, bad])
    assert info.value.src == bad  # the error shows the failing source, not the joined program
    assert "not_declared_anywhere" in info.value.output


def test_a_foreign_binary_is_refused_with_the_kernel_name(dev):
    with pytest.raises(ValueError, match="kernel E_4: not an ember kernel binary"):
        dev.runtime("E_4", b"\x7fELF not ours")
    with pytest.raises(ValueError, match="truncated"):
        KernelBinary.unpack(KernelBinary("long_symbol", b"").pack()[:-3])


def test_renderer_helpers_are_guarded():
    r = CLRenderer(fp16=False)
    pre = r._preamble("ember_f32_to_bf16(x); ember_f16_to_f32(y);")
    assert pre.count("#ifndef EMBER_") == 2 and pre.count("#endif") == 2


def test_a_schedule_with_new_kernels_is_one_build(dev, monkeypatch):
    builds = []
    real_build = type(dev.compiler).build
    monkeypatch.setattr(type(dev.compiler), "build", lambda self, src: builds.append(src) or real_build(self, src))
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="CL")
    # three independent outputs of different shapes: three kernels, all new (unusual constants)
    outs = [(x * 1.2345).sum(0), (x - 7.125).exp2().max(1), (x + 0.0625).sqrt()]
    before = GlobalCounters.kernels_compiled
    Tensor.realize(*outs)
    assert GlobalCounters.kernels_compiled - before == 3
    assert len(builds) == 1
    xn = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(outs[0].numpy(), (xn * np.float32(1.2345)).sum(0), rtol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), np.exp2(xn - 7.125).max(1), rtol=1e-6)
    np.testing.assert_allclose(outs[2].numpy(), np.sqrt(xn + 0.0625), rtol=1e-6)


def test_a_build_with_compiler_warnings_prints_nothing(dev, capfd):
    # an int compared with itself draws a clang warning in PoCL, which would print its count to fd 2
    src = ("__kernel void selfcmp(__global int* restrict data0, __global int* restrict data1) {\n"
           "  int v = data1[get_global_id(0)];\n  data0[get_global_id(0)] = (v == v);\n}\n")
    assert dev.compiler.build(src)
    out, err = capfd.readouterr()
    assert "warning" not in out + err
