"""The MSL renderer: hand-built linear programs for every dtype, op and cast render as MSL that passes
clang's syntax and type check with the stand-in header; the checker itself rejects broken MSL.

What this cannot show: that Apple's compiler accepts the source, or that a kernel computes the right
answer on a GPU (no Mac is available; see docs in the plugin's README section of docs/plugins.md).
"""
from __future__ import annotations

import itertools

import pytest
from ember_metal.renderer import VALS_INDEX, MetalRenderer, tensor_cores, wmma_helper, wmma_name
from metal_msl_check import check_msl
from metal_programs import ALL, FLOATS, every_program, program, threadgroup_sum_program

from ember.renderer import Ops, dtypes


def test_every_dtype_op_and_cast_type_checks(clang: str) -> None:
    renderer = MetalRenderer()
    sources = [renderer.render(name, uops) for name, uops in every_program()]
    assert len(sources) > 50
    assert check_msl(sources) == 1  # one translation unit for all of them


def test_kernel_signature() -> None:
    """Address spaces and attributes: stored buffers are device, read-only ones const device, variables
    arrive at VALS_INDEX, global loops read thread_position_in_grid (x = innermost)."""
    src = MetalRenderer().render("k", program([(Ops.ADD, dtypes.float32)], (dtypes.float32, dtypes.bfloat16), dims=2,
                                              var=True))
    head = src[src.index("kernel void"):].splitlines()[0]
    assert "device float* data0 [[buffer(0)]]" in head and "const device float* data0" not in head
    assert "const device float* data1 [[buffer(1)]]" in head
    assert "const device ushort* data2 [[buffer(2)]]" in head  # bfloat16 as bit patterns
    assert f"constant long* ember_vals [[buffer({VALS_INDEX})]]" in head
    assert "uint3 gid [[thread_position_in_grid]]" in head
    assert "const int n = (int)ember_vals[0];" in src
    assert "(int)gid.y;" in src and "(int)gid.x;" in src
    assert src.index("gid.y") < src.index("gid.x")  # the outer loop is launch dimension 1


def test_renderer_capabilities() -> None:
    r = MetalRenderer()
    assert dtypes.float64 not in r.supported_dtypes and dtypes.float16 in r.supported_dtypes
    assert r.has_local and r.has_shared and r.global_max == (2 ** 32 - 1,) * 3
    shapes = {(tc.dims, tc.dtype_in, tc.dtype_out, tc.threads) for tc in r.tensor_cores}
    assert ((8, 8, 8), dtypes.float16, dtypes.float32, 32) in shapes
    assert all(tc.intrinsic == "simdgroup_multiply_accumulate" for tc in r.tensor_cores)
    assert any(tc.dtype_in == dtypes.bfloat16 for tc in tensor_cores(bfloat=True))
    assert MetalRenderer(bfloat_tensor_cores=True).variant != r.variant  # a different source: a different cache key


def test_float64_is_refused_with_the_reason() -> None:
    with pytest.raises(NotImplementedError, match="Metal has no double"):
        MetalRenderer().render("k", program([(Ops.ADD, dtypes.float64)], (dtypes.float64, dtypes.float64)))


def test_too_many_buffers_is_refused() -> None:
    uops = program([(Ops.CAST, dtypes.float32)] * VALS_INDEX, (dtypes.float32,))
    with pytest.raises(ValueError, match="at most 30 buffers"):
        MetalRenderer().render("k", uops)


def test_threadgroup_memory_and_barriers_type_check(clang: str) -> None:
    renderer = MetalRenderer()
    sources = [renderer.render(f"group_sum_{dt.name}", threadgroup_sum_program(dt)) for dt in (*FLOATS, dtypes.int32)]
    src = sources[1]  # bfloat16: threadgroup memory holds the bit patterns too
    assert "threadgroup ushort temp0[16];" in src and "threadgroup_barrier(mem_flags::mem_threadgroup);" in src
    assert "uint3 lid [[thread_position_in_threadgroup]]" in src
    assert "uint3 group [[threadgroup_position_in_grid]]" in src
    assert "gid [[" not in src  # no grid position needed
    assert check_msl(sources) == 1


def simdgroup_kernel(tc) -> str:
    """A kernel around the tensor-core helper: threadgroup scratch per SIMD group, a threadgroup barrier,
    and the simdgroup_matrix multiply (what a kernel using ``tc`` contains)."""
    names = {dtypes.bfloat16: "bfloat", dtypes.float16: "half", dtypes.float32: "float"}
    ti, to = names[tc.dtype_in], names[tc.dtype_out]
    return f"""#include <metal_stdlib>
using namespace metal;
{wmma_helper(tc)}
kernel void tc_{tc.dtype_in.name}_{tc.dtype_out.name}(device {to}* data0 [[buffer(0)]],
    const device {ti}* data1 [[buffer(1)]], uint3 gid [[thread_position_in_grid]],
    ushort lane [[thread_index_in_simdgroup]], ushort sg [[simdgroup_index_in_threadgroup]]) {{
  threadgroup {ti} tc_a[4 * 64];
  threadgroup {ti} tc_b[4 * 64];
  threadgroup {to} tc_c[4 * 64];
  threadgroup float temp0[128];
  temp0[gid.x % 128] = (float)data1[gid.x];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  {ti}2 a = {ti}2(data1[2 * gid.x], data1[2 * gid.x + 1]);
  {to}2 c = {to}2(({to})0, ({to})temp0[0]);
  c = {wmma_name(tc)}(a, a, c, tc_a + sg * 64, tc_b + sg * 64, tc_c + sg * 64, lane);
  data0[2 * gid.x] = c.x;
  data0[2 * gid.x + 1] = c.y;
}}
"""


def test_simdgroup_matrix_helpers_type_check(clang: str) -> None:
    """Every declared tensor core's helper (bfloat16 included) in a kernel with threadgroup memory and barriers."""
    cores = tensor_cores(bfloat=True)
    assert check_msl([simdgroup_kernel(tc) for tc in cores]) == 1


# --- the checker itself: broken MSL must fail ------------------------------------------------------------
GOOD = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float* data0 [[buffer(0)]], const device half* data1 [[buffer(1)]],
    uint3 gid [[thread_position_in_grid]]) {
  threadgroup float temp[16];
  temp[gid.x % 16] = (float)data1[gid.x];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  data0[gid.x] = precise::sin(temp[0]) + as_type<float>(gid.x);
}
"""
BROKEN = {
    "a threadgroup array used as a device pointer": ("  data0[gid.x] =", "  device float* p = temp; data0[gid.x] ="),
    "a store through a const device pointer": ("  data0[gid.x] =", "  data1[0] = (half)1.0f; data0[gid.x] ="),
    "double (Metal has none)": ("  data0[gid.x] =", "  double d = 1.0; data0[gid.x] ="),
    "an undeclared function": ("precise::sin(", "precise::sinh("),
    "a type error": ("  data0[gid.x] =", "  float4 v = 1.0f; float w = v; data0[gid.x] ="),
    "as_type between sizes": ("as_type<float>(gid.x)", "as_type<float>((ushort)gid.x)"),
    "an unknown attribute": ("[[thread_position_in_grid]]", "[[thread_positon_in_grid]]"),
}


def test_checker_accepts_the_good_kernel(clang: str) -> None:
    assert check_msl([GOOD]) == 1


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_checker_rejects(clang: str, what: str) -> None:
    old, new = BROKEN[what]
    assert old in GOOD
    with pytest.raises(AssertionError):
        check_msl([GOOD.replace(old, new, 1)])


def test_every_cast_pair_is_covered() -> None:
    """The cast programs above cover every ordered pair of supported dtypes (so the check is not partial)."""
    programs = dict(every_program())
    for src_dt, dst_dt in itertools.product(ALL, ALL):
        stores = [u for u in programs[f"cast_from_{src_dt.name}"] if u.op is Ops.CAST]
        assert any(u.dtype == dst_dt and u.src[0].dtype == src_dt for u in stores)
