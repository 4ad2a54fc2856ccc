"""The AMD renderer, compiler and code-object reader, without an AMD GPU.

Kernels are rendered and compiled by clang for gfx1100 (RDNA3) and gfx942 (CDNA3); the code objects
are read back and checked against LLVM's own tools (llvm-readelf, llvm-objdump). The kernel text is
also built for the CPU with PoCL (:func:`ember_amd.renderer.host_opencl_source`) and run against
numpy: that checks what the renderer writes and the helper library's arithmetic, not AMD's
instructions (nothing here runs on an AMD GPU).
"""
from __future__ import annotations

import os
import re
import struct

import numpy as np
import pytest
from amd_test_tools import llvm_tool_output, require_clang
from ember_amd import elf, toolchain
from ember_amd.compiler import KERNEL_PATTERN, AMDCompiler
from ember_amd.kernel_lib import helpers_for
from ember_amd.msgpack_decode import unpackb
from ember_amd.renderer import (
    MAX_INLINE_MATH,
    PRELUDE_BEGIN,
    PRELUDE_END,
    AMDRenderer,
    host_opencl_source,
    wave_size_for,
)

from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.device import CompileError
from ember.helpers import GlobalCounters
from ember.ir.uop import Ops

DEVICE = "PYTHON"


def _program(t: Tensor, arch: str = "gfx1100", name: str = "k"):
    [si] = [si for si in t.schedule() if si.ast.op is not Ops.COPY]
    return get_program(si.ast, AMDRenderer(arch), name)


def _x(shape=(8, 16), seed=0) -> Tensor:
    return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=DEVICE).realize()


# --- renderer -----------------------------------------------------------------------------------

def test_capabilities_per_target():
    rdna, cdna = AMDRenderer("gfx1100"), AMDRenderer("gfx942")
    assert (rdna.wave_size, cdna.wave_size) == (32, 64)
    assert rdna.has_local and rdna.has_shared and rdna.local_max == (1024,) * 3 and rdna.shared_max == 65536
    assert {(tc.dims, tc.dtype_in, tc.threads) for tc in rdna.tensor_cores} == \
        {((16, 16, 16), dtypes.float16, 32), ((16, 16, 16), dtypes.bfloat16, 32)}
    assert all(tc.dtype_out == dtypes.float32 and "wmma" in tc.intrinsic for tc in rdna.tensor_cores)
    assert cdna.tensor_cores == ()
    assert rdna.variant != cdna.variant != AMDRenderer("gfx1100", max_workgroup=256).variant
    assert wave_size_for("gfx90a") == 64 and wave_size_for("gfx1201") == 32


def test_from_kfd_properties():
    r = AMDRenderer.from_properties({"gfx_target_version": 90402, "wave_front_size": 64, "lds_size_in_kb": 64})
    assert (r.arch, r.wave_size, r.shared_max) == ("gfx942", 64, 65536)
    rdna = AMDRenderer.from_properties({"gfx_target_version": 110000, "wave_front_size": 64, "lds_size_in_kb": 64})
    assert (rdna.arch, rdna.wave_size) == ("gfx1100", 32)  # clang's default for RDNA, whatever KFD reports
    assert AMDRenderer.from_properties({"gfx_target_version": 90010}).arch == "gfx90a"
    with pytest.raises(ValueError, match="gfx_target_version"):
        AMDRenderer.from_properties({"gfx_target_version": 0, "simd_count": 0})


@pytest.mark.parametrize("arch", ["sm_80", "gfx", "GFX1100", ""])
def test_bad_target_names(arch):
    with pytest.raises(ValueError, match="gfx"):
        AMDRenderer(arch)


def test_source_uses_no_opencl_library_and_ids_only_through_the_prelude():
    src = _program((_x() * 2 + 1).exp().sum(axis=1)).src
    body = src.split(PRELUDE_END, 1)[1]
    assert src.count(PRELUDE_BEGIN) == 1 and src.startswith(PRELUDE_BEGIN)
    for name in ("get_global_id", "get_group_id", "get_local_id", "get_local_size", "barrier(", "__builtin_amdgcn"):
        assert name not in body, name
    assert "EMBER_GLOBAL_ID(0)" in body and re.search(r"if \(gidx0 < 8\) \{", body)
    assert "amdgpu_flat_work_group_size(1, 1024)" in src


def test_host_opencl_source_swaps_only_the_prelude():
    src = _program(_x() + 1).src
    host = host_opencl_source(src)
    assert host.split(PRELUDE_END, 1)[1] == src.split(PRELUDE_END, 1)[1]
    prelude = host.split(PRELUDE_END, 1)[0]
    assert "get_group_id(d)" in prelude and "get_local_size(d)" in prelude and "__builtin_amdgcn" not in prelude
    joined = host_opencl_source(src + "\n" + src.replace("void k(", "void k2("))
    assert joined.count("get_group_id(d)") == 2 and "__builtin_amdgcn" not in joined
    with pytest.raises(ValueError, match="prelude"):
        host_opencl_source("__kernel void f() {}")


# --- compiler and code objects ------------------------------------------------------------------

@pytest.fixture(scope="module")
def add_lib() -> bytes:
    require_clang("gfx1100")
    return AMDCompiler("gfx1100").compile(_program(_x() + _x(seed=1).flip(0), name="add").src)


def test_code_object_header_and_kernel(add_lib):
    assert add_lib[:4] == b"\x7fELF" and struct.unpack_from("<HH", add_lib, 16) == (elf.ET_DYN, elf.EM_AMDGPU)
    code = elf.read_code_object(add_lib)
    assert code.arch == "gfx1100" and list(code.kernels) == ["add"]
    k = code.kernels["add"]
    assert [a.value_kind for a in k.explicit_args] == ["global_buffer"] * 3
    assert [(a.offset, a.size) for a in k.explicit_args] == [(0, 8), (8, 8), (16, 8)]
    assert k.arg("hidden_group_size_x") is not None and k.arg("hidden_block_count_x") is not None
    assert k.kernarg_size >= max(a.offset + a.size for a in k.args) and k.kernarg_align >= 8
    assert (k.wavefront_size, k.max_flat_workgroup_size, k.private_segment_fixed_size) == (32, 1024, 0)
    # the 64-byte kernel descriptor: its first word is the LDS size, and it points at code inside the image
    group_size, _, _, entry = struct.unpack_from("<IIQQ", code.image, k.descriptor_offset)
    assert group_size == k.group_segment_fixed_size
    assert 0 < k.descriptor_offset + entry < len(code.image)


def _readelf_notes(lib: bytes, tmp_path) -> str:
    path = tmp_path / "k.hsaco"
    path.write_bytes(lib)
    return llvm_tool_output("llvm-readelf", "--notes", "--dyn-syms", "-S", str(path))


def test_reader_agrees_with_llvm_readelf(add_lib, tmp_path):
    out = _readelf_notes(add_lib, tmp_path)
    k = elf.read_code_object(add_lib).kernels["add"]
    for key, value in ((".kernarg_segment_size", k.kernarg_size), (".sgpr_count", k.sgpr_count),
                       (".vgpr_count", k.vgpr_count), (".wavefront_size", k.wavefront_size),
                       (".private_segment_fixed_size", k.private_segment_fixed_size)):
        assert re.search(rf"{re.escape(key)}:\s+{value}\b", out), (key, value)
    assert "amdhsa.target:   amdgcn-amd-amdhsa--gfx1100" in out
    kd = re.search(r"([0-9a-f]{16})\s+64\s+OBJECT\s+GLOBAL\s+PROTECTED\s+\d+\s+add\.kd", out)
    assert kd and int(kd.group(1), 16) == k.descriptor_offset


def test_source_section_round_trip(add_lib, tmp_path):
    code = elf.read_code_object(add_lib)
    assert code.source is not None and "EMBER_KERNEL void add(" in code.source
    out = _readelf_notes(add_lib, tmp_path)  # llvm-readelf still reads the file, and lists the section
    assert re.search(r"\.ember\.source\s+PROGBITS", out)
    bare = elf.read_code_object(_without_source(add_lib))
    # the first PT_LOAD segment starts with the ELF header, whose section-table fields differ
    assert bare.source is None and bare.image[64:] == code.image[64:] and bare.kernels == code.kernels
    with pytest.raises(ValueError, match="already has a section"):
        elf.add_section(add_lib, elf.SOURCE_SECTION, b"x")


def _without_source(lib: bytes) -> bytes:
    """``lib`` with the last section header (``.ember.source``, which add_section appends) dropped."""
    shnum, = struct.unpack_from("<H", lib, 0x3C)
    out = bytearray(lib)
    struct.pack_into("<H", out, 0x3C, shnum - 1)  # the source's header is the last one
    return bytes(out)


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b"not an elf" + b[10:], "not an ELF"),
    (lambda b: b[:40], "truncated|not an ELF"),
    (lambda b: b[:18] + struct.pack("<H", 62) + b[20:], "EM_AMDGPU"),
    (lambda b: b[:16] + struct.pack("<H", 1) + b[18:], "ET_DYN"),
    (lambda b: b[:4] + b"\x01" + b[5:], "ELF64"),
    (lambda b: b[:0x3C] + struct.pack("<H", 500) + b[0x3E:], "truncated|out of range"),
])
def test_malformed_code_objects_raise(add_lib, mutate, message):
    with pytest.raises(ValueError, match=message):
        elf.read_code_object(mutate(add_lib))


def test_corrupt_metadata_note_raises(add_lib):
    code = elf.read_code_object(add_lib)
    start = add_lib.find(b"amdhsa.target")  # inside the msgpack map: break a type byte before it
    assert start > 0 and code.kernels
    broken = bytearray(add_lib)
    broken[start - 1] = 0xC1  # "never used" in MessagePack
    with pytest.raises(ValueError, match="MessagePack"):
        elf.read_code_object(bytes(broken))


def test_compile_errors_name_the_source_and_clang_log():
    require_clang("gfx1100")
    bad = _program(_x() + 1).src.replace("alu0", "alu0 +", 1)
    with pytest.raises(CompileError) as e:
        AMDCompiler("gfx1100").compile(bad)
    assert "--- source ---" in str(e.value) and "error:" in e.value.output


def test_library_calls_are_rejected():
    require_clang("gfx1100")
    src = _program(_x() + 1).src.replace("EMBER_KERNEL void k(", "float exp(float);\nEMBER_KERNEL void k(")
    src = re.sub(r"= \((val0 \+ 1\.0f)\);", r"= exp(\1);", src)
    assert "exp(val0" in src
    with pytest.raises(CompileError, match="undefined (hidden symbol|symbols): exp"):
        AMDCompiler("gfx1100").compile(src)


def test_batches_keep_kernel_names_and_split_repeats():
    require_clang("gfx1100")
    comp = AMDCompiler("gfx1100")
    srcs = [_program(t, name=n).src for t, n in ((_x() + 1, "a"), (_x() * 3, "b"), (_x() - 2, "a"))]
    assert comp.plan(srcs) == [[0, 1], [2]]  # two programs (two builds at once), "a" twice never in one
    before = GlobalCounters.kernels_compiled
    libs = comp.compile_cached_many(srcs)
    assert GlobalCounters.kernels_compiled - before == 3
    codes = [elf.read_code_object(lib) for lib in libs]
    assert set(codes[0].kernels) == {"a", "b"} and libs[0] == libs[1]
    assert set(codes[2].kernels) == {"a"} and codes[2].source == srcs[2]
    assert comp.compile_cached(srcs[1]) == libs[1] and GlobalCounters.kernels_compiled - before == 3


def test_gfx942_code_objects_are_wave64():
    require_clang("gfx942")
    code = elf.read_code_object(AMDCompiler("gfx942").compile(_program(_x() + 1, "gfx942").src))
    assert code.arch == "gfx942" and code.kernels["k"].wavefront_size == 64


# --- golden disassembly -------------------------------------------------------------------------

def _disassemble(lib: bytes, arch: str, tmp_path) -> str:
    path = tmp_path / f"{arch}.hsaco"
    path.write_bytes(lib)
    out = llvm_tool_output("llvm-objdump", "-d", f"--mcpu={arch}", str(path))
    if "s_endpgm" not in out:
        pytest.skip(f"llvm-objdump printed no {arch} code")
    return out


def test_small_matmul_uses_no_scratch(tmp_path):
    require_clang("gfx1100")
    a = _x((16, 16))
    lib = AMDCompiler("gfx1100").compile(_program(a @ a.T, name="mm").src)
    k = elf.read_code_object(lib).kernels["mm"]
    assert k.private_segment_fixed_size == 0
    asm = _disassemble(lib, "gfx1100", tmp_path)
    assert "scratch_" not in asm and "buffer_store" not in asm and "global_load" in asm
    assert re.search(r"v_(fma|fmac|mul)_f32", asm)


def test_elementwise_add_is_global_loads_and_a_store(tmp_path):
    require_clang("gfx1100")
    lib = AMDCompiler("gfx1100").compile(_program(_x() + _x(seed=1).flip(0), name="add").src)
    asm = _disassemble(lib, "gfx1100", tmp_path)
    assert asm.count("global_load_b32") == 2 and asm.count("global_store_b32") == 1
    assert "v_add_f32" in asm and "s_endpgm" in asm


def test_gfx942_disassembly_is_wave64(tmp_path):
    require_clang("gfx942")
    lib = AMDCompiler("gfx942").compile(_program(_x() + 1, "gfx942", name="inc").src)
    asm = _disassemble(lib, "gfx942", tmp_path)
    # wave64: lane masks are 64-bit (exec, vcc and s[n:n+1] pairs); GFX9 spells loads global_load_dword
    assert "global_load_dword" in asm and "global_store_dword" in asm and "exec" in asm
    assert "_saveexec_b64" in asm and "_saveexec_b32" not in asm


# --- MessagePack ---------------------------------------------------------------------------------

def test_msgpack_decodes_every_type_the_note_uses():
    data = bytes([0x8A,  # map of 10
                  0xA1, ord("a"), 0x07,  # positive fixint
                  0xA1, ord("b"), 0xFF,  # negative fixint -1
                  0xA1, ord("c"), 0xCD, 0x01, 0x00,  # uint16 256
                  0xA1, ord("d"), 0xD2, 0xFF, 0xFF, 0xFF, 0x00,  # int32 -256
                  0xA1, ord("e"), 0xCB, *struct.pack(">d", 1.5),  # float64
                  0xA1, ord("f"), 0xC0,  # nil
                  0xA1, ord("g"), 0x92, 0xC3, 0xC2,  # [true, false]
                  0xA1, ord("h"), 0xD9, 3, *b"xyz",  # str8
                  0xA1, ord("i"), 0xC4, 2, 1, 2,  # bin8
                  0xA1, ord("j"), 0xDC, 0, 1, 0xCF, *struct.pack(">Q", 2 ** 63)])  # array16 of one uint64
    assert unpackb(data) == {"a": 7, "b": -1, "c": 256, "d": -256, "e": 1.5, "f": None, "g": [True, False],
                             "h": "xyz", "i": b"\x01\x02", "j": [2 ** 63]}


@pytest.mark.parametrize("data, message", [
    (b"\x92\x01", "truncated"), (b"\x01\x02", "after the MessagePack value"), (b"\xc7\x01\x00\x00", "0xc7"),
    (b"\xa2\xff\xfe", "UTF-8"), (b"\x81\x90\x01", "map key"), (b"\x91" * 100 + b"\x01", "nested"),
])
def test_msgpack_rejects_malformed_data(data, message):
    with pytest.raises(ValueError, match=message):
        unpackb(data)


# --- the kernel text on the CPU (PoCL) ------------------------------------------------------------

def _ulps(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> float:
    """The largest error in units of the last place; the nans and infinities must be the same."""
    fin = np.isfinite(want) & np.isfinite(got)
    wrong = ~fin & ~((got == want) | (np.isnan(got) & np.isnan(want)))
    wrong |= (want == 0) & (got == 0) & (np.signbit(got) != np.signbit(want))  # sin(-0.0) is -0.0
    assert not wrong.any(), list(zip(x[wrong][:5], got[wrong][:5], want[wrong][:5]))
    return float(np.max(np.abs(got[fin] - want[fin]) / np.spacing(np.abs(want[fin])), initial=0))


def test_math_helpers_against_numpy(cl_cpu_context):
    fns = ["ember_exp", "ember_exp2", "ember_log", "ember_log2", "ember_sin", "ember_pow", "ember_fmod"]
    body = "".join(f"  o[{i} * n + i] = {f}(x[i]{', y[i]' if f in ('ember_pow', 'ember_fmod') else ''});\n"
                   for i, f in enumerate(fns))
    src = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + helpers_for(" ".join(fns)) +
           "\n__kernel void t(__global const double* x, __global const double* y, __global double* o, long n) {\n"
           "  long i = get_global_id(0);\n" + body + "}\n")
    rng = np.random.default_rng(1)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, 0.5, 1e-310, -1e-310, 709.7, -745.0, 3.0, -3.0]
    x = np.concatenate([special, rng.uniform(-60, 60, 4000), rng.standard_normal(4000) * 3,
                        np.exp(rng.uniform(-700, 700, 4000)), -np.exp(rng.uniform(-700, 700, 2000))])
    y = np.concatenate([special[::-1], rng.uniform(-6, 6, len(x) - len(special))])
    x = np.concatenate([x, [-0.0, -0.0, -0.0, -0.0, -np.inf, -np.inf]])  # pow(-0.0 or -inf, y): signs by C's rules
    y = np.concatenate([y, [1.7, -1.7, 3.0, -3.0, 1.7, 3.0]])
    out = _run_cl(cl_cpu_context, src, "t", [x, y], len(fns) * len(x), np.float64, extra=[np.int64(len(x))])
    out = out.reshape(len(fns), len(x))
    with np.errstate(all="ignore"):
        want = [np.exp(x), np.exp2(x), np.log(x), np.log2(x), np.sin(x), np.power(x, y), np.fmod(x, y)]
    limits = {"ember_exp": 1, "ember_exp2": 1, "ember_log": 1, "ember_log2": 1, "ember_sin": 2, "ember_pow": 1,
              "ember_fmod": 0}
    for name, got, ref in zip(fns, out, want):
        assert _ulps(got, ref, x) <= limits[name], name
    powers = np.ldexp(1.0, np.arange(-1074, 1024)).astype(np.float64)  # log2 of a power of two is exact
    out = _run_cl(cl_cpu_context, src, "t", [powers, powers], len(fns) * len(powers), np.float64,
                  extra=[np.int64(len(powers))])
    assert np.array_equal(out.reshape(len(fns), -1)[3], np.arange(-1074, 1024))


def test_half_conversions_against_numpy(cl_cpu_context):
    src = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + helpers_for("ember_f16_ ember_f64_to_f16") +
           "\n__kernel void t(__global const float* x, __global const double* d, __global ushort* o,"
           " __global const ushort* h, __global float* back) {\n  long i = get_global_id(0);\n"
           "  o[2 * i] = ember_f32_to_f16(x[i]); o[2 * i + 1] = ember_f64_to_f16(d[i]);\n"
           "  back[i] = ember_f16_to_f32(h[i]); }\n")
    rng = np.random.default_rng(2)
    n = 65536
    x = np.concatenate([rng.standard_normal(n // 2) * 1000, np.exp(rng.uniform(-20, 12, n // 2))]).astype(np.float32)
    x[:6] = [np.inf, -np.inf, 65519.996, 65520.0, 2.0 ** -25, -(2.0 ** -24) * 1.5]
    d = x.astype(np.float64) * (1 + 2.0 ** -30)  # halfway float values: one rounding differs from two
    h = np.arange(n, dtype=np.uint16)
    got = _run_cl_multi(cl_cpu_context, src, [x, d, h], [(2 * n, np.uint16), (n, np.float32)], n)
    pairs, back = got
    with np.errstate(over="ignore"):  # numpy warns about the values that round to infinity
        assert np.array_equal(pairs[0::2], x.astype(np.float16).view(np.uint16))
        assert np.array_equal(pairs[1::2], d.astype(np.float16).view(np.uint16))
    want = h.view(np.float16).astype(np.float32)
    assert np.array_equal(np.isnan(back), np.isnan(want)) and np.array_equal(back[~np.isnan(want)],
                                                                              want[~np.isnan(want)])


def _run_cl(ctx, src: str, kernel: str, inputs: list[np.ndarray], out_size: int, out_dtype, extra=()) -> np.ndarray:
    import pyopencl as cl

    queue = cl.CommandQueue(ctx)
    mf = cl.mem_flags
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a)) for a in inputs]
    out = np.empty(out_size, out_dtype)
    out_buf = cl.Buffer(ctx, mf.WRITE_ONLY, max(out.nbytes, 1))
    prog = cl.Program(ctx, src).build()
    getattr(prog, kernel)(queue, (len(inputs[0]),), None, *bufs, out_buf, *extra)
    cl.enqueue_copy(queue, out, out_buf)
    queue.finish()
    return out


def _run_cl_multi(ctx, src: str, inputs: list[np.ndarray], outs: list[tuple[int, object]], n: int) -> list:
    import pyopencl as cl

    queue = cl.CommandQueue(ctx)
    mf = cl.mem_flags
    in_bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a)) for a in inputs]
    results = [np.empty(size, dt) for size, dt in outs]
    out_bufs = [cl.Buffer(ctx, mf.WRITE_ONLY, r.nbytes) for r in results]
    prog = cl.Program(ctx, src).build()
    # kernel parameters: x, d, o, h, back
    prog.t(queue, (n,), None, in_bufs[0], in_bufs[1], out_bufs[0], in_bufs[2], out_bufs[1])
    for r, b in zip(results, out_bufs):
        cl.enqueue_copy(queue, r, b)
    queue.finish()
    return results


def test_many_math_calls_go_out_of_line():
    require_clang("gfx1100")
    x = _x()
    many = sum(((x * (i + 1)).exp() for i in range(MAX_INLINE_MATH + 1)), x)
    src = _program(many).src
    assert src.split("EMBER_KERNEL void")[1].count("ember_exp_call(") == MAX_INLINE_MATH + 1
    few = _program(x.exp() + x.sin()).src
    assert "_call(" not in few.split(PRELUDE_END)[1].split("EMBER_KERNEL")[1]
    for s in (src, few):
        elf.read_code_object(AMDCompiler("gfx1100").compile(s))


@pytest.mark.parametrize("case", ["math", "half", "sum", "matmul", "int", "many_calls"])
def test_rendered_kernels_on_the_cpu_match_numpy(cl_cpu_context, case):
    """The AMD kernel text, built for the CPU (host_opencl_source), computes what numpy does."""
    import pyopencl as cl

    a = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    x = Tensor(a, device=DEVICE).realize()
    t, want = {
        "math": (((x * 2 + 1).relu().exp() + x.sin()), np.exp(np.maximum(a * 2 + 1, 0)) + np.sin(a)),
        "half": (((x.cast(dtypes.float16) * 3) + 1).cast(dtypes.float32),
                 ((a.astype(np.float16) * np.float16(3)) + np.float16(1)).astype(np.float32)),
        "sum": (x.sum(axis=1), a.sum(axis=1)),
        "matmul": (x @ x.T, a @ a.T),
        "int": ((x.cast(dtypes.int32) * 7) // 3 % 5, (a.astype(np.int32) * 7) // 3 % 5),
        "many_calls": (sum(((x * (i + 1)).sin() for i in range(MAX_INLINE_MATH + 1)), x),
                       sum((np.sin(a * np.float32(i + 1)) for i in range(MAX_INLINE_MATH + 1)), a)),
    }[case]
    [si] = [si for si in t.schedule() if si.ast.op is not Ops.COPY]
    spec = get_program(si.ast, AMDRenderer("gfx1100"), "k")
    assert spec.ins and len(spec.outs) == 1 and len(spec.ins) == 1
    src = host_opencl_source(spec.src)
    params = re.search(r"void k\(([^)]*)\)", src).group(1).split(",")
    assert len(params) == 2 and KERNEL_PATTERN.search(spec.src)
    queue = cl.CommandQueue(cl_cpu_context)
    mf = cl.mem_flags
    out = np.empty(want.size, want.dtype)
    out_buf = cl.Buffer(cl_cpu_context, mf.WRITE_ONLY, out.nbytes)
    in_buf = cl.Buffer(cl_cpu_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    args = {spec.outs[0]: out_buf, spec.ins[0]: in_buf}
    prog = cl.Program(cl_cpu_context, src).build()
    global_size = tuple(spec.global_size) or (1,)
    prog.k(queue, global_size, None, *[args[i] for i in range(2)])
    cl.enqueue_copy(queue, out, out_buf)
    queue.finish()
    np.testing.assert_allclose(out.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


# --- toolchain ----------------------------------------------------------------------------------

def test_clang_15_builds_gfx1100_with_a_newer_lld(monkeypatch):
    """clang-15 links code-object v5 through a newer lld (Debian's default ld.lld 14 rejects it)."""

    clang15 = "/usr/lib/llvm-15/bin/clang"
    if not os.path.isfile(clang15):
        pytest.skip("no clang-15 at /usr/lib/llvm-15/bin/clang (apt install clang-15)")
    monkeypatch.setenv("EMBER_AMD_CLANG", clang15)
    toolchain.find_toolchain.cache_clear()
    try:
        try:
            tc = toolchain.find_toolchain("gfx1100")
        except toolchain.ToolchainError as e:
            pytest.skip(str(e))
        if tc.clang != clang15:
            pytest.skip(f"clang-15 cannot link code-object v5 here: {tc}")
        assert tc.link_options[0] == "-B" and "clang version 15" in tc.version
        comp = AMDCompiler("gfx1100")
        assert comp.toolchain == tc and comp.cachekey is not None and "15" in comp.cachekey
        k = elf.read_code_object(comp.compile(_program(_x() + 1).src)).kernels["k"]
        assert k.arg("hidden_group_size_x") is not None and k.wavefront_size == 32
    finally:
        toolchain.find_toolchain.cache_clear()


def test_unknown_targets_say_what_to_install():
    problem = toolchain.toolchain_problem("gfx950")  # clang-19 rejects it; a newer clang may know it
    assert problem is None or ("gfx950" in problem and "apt install clang-19" in problem)
    with pytest.raises(toolchain.ToolchainError, match="invalid AMD GPU target"):
        toolchain.find_toolchain("sm_80")


def test_index_type_is_64_bits_only_where_32_could_wrap():
    """A kernel reading the far end of a view of 3.5e9 elements indexes with ``long``, a small one with ``int``;
    both build for the GPU."""
    x7 = Tensor(np.arange(7, dtype=np.float32), device=DEVICE).realize()

    def tail(rows: int) -> str:
        return _program(x7.reshape(1, 7).expand(rows, 7).reshape(rows * 7)[-3:].contiguous(), name="tail").src

    big, small = tail(5 * 10 ** 8), tail(1000)
    assert "const long gidx0 = (long)EMBER_GLOBAL_ID(0);" in big and "int alu" not in big
    assert "const int gidx0 = (int)EMBER_GLOBAL_ID(0);" in small and "long alu" not in small
    require_clang("gfx1100")
    for src in (big, small):
        assert elf.read_code_object(AMDCompiler("gfx1100").compile(src))
