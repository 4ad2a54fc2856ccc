"""The METAL device's Objective-C calls, against a recording fake of the runtime (no Mac, no GPU).

These tests check what the device sends: selectors, argument order, buffer offsets, the encoder
sequence, ownership (every owned object released, autoreleased ones inside a pool) and how Metal's
errors surface. The fake runs no kernel, so nothing here shows that a kernel computes the right
answer on Apple hardware.
"""
from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
from ember_metal.device import MetalDevice
from ember_metal.objc import ObjCError
from ember_metal.renderer import VALS_INDEX
from metal_fake_objc import FakeMetalError, FakeObjC

from ember.codegen import get_program
from ember.device import CompileError, KernelBinary
from ember.renderer import Ops, UOp, dtypes

N = 16


def add_kernel(var: bool = False) -> list[UOp]:
    """``data0[i] = data1[i] + data2[i]`` over N threads (bounded by an int variable with ``var``)."""
    idx = dtypes.int32
    g = [UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), (i, N)) for i in range(3)]
    start, end = UOp.const(idx, 0), UOp.const(idx, N)
    rng = UOp(Ops.RANGE, idx, (start, end), (0, "global"))
    uops: list[UOp] = [*g, start, end]
    gate: tuple[UOp, ...] = ()
    if var:
        n = UOp(Ops.DEFINE_VAR, idx, (), ("n", 1, N))
        uops.insert(3, n)
        gate = (UOp(Ops.CMPLT, dtypes.bool, (rng, n)),)
    loads = [UOp(Ops.LOAD, dtypes.float32, (g[i], rng)) for i in (1, 2)]
    value = UOp(Ops.ADD, dtypes.float32, tuple(loads))
    return [*uops, rng, *gate, *loads, value, UOp(Ops.STORE, None, (g[0], rng, value, *gate)),
            UOp(Ops.ENDRANGE, None, (rng,)), UOp(Ops.SINK, None, ())]


@pytest.fixture
def fake() -> FakeObjC:
    return FakeObjC()


@pytest.fixture
def dev(fake: FakeObjC) -> MetalDevice:
    return MetalDevice("METAL", objc=fake)


def test_device_setup(fake: FakeObjC, dev: MetalDevice) -> None:
    assert dev.gpu_name == "Fake Apple GPU"
    assert len(fake.live("MTLCommandQueue")) == 1
    assert dev.renderer.shared_max == 32768 and dev.renderer.device == "METAL"
    options = fake.objects[dev.compiler.options]
    assert options.kind == "MTLCompileOptions" and options.data == {"math_mode": 0}  # MTLMathModeSafe
    assert "Fake Apple GPU" in dev.compiler.cachekey


def test_fast_math_off_before_macos_15() -> None:
    fake = FakeObjC(math_mode=False)
    dev = MetalDevice("METAL", objc=fake)
    assert fake.objects[dev.compiler.options].data == {"fast_math": False}


def test_gpu_families() -> None:
    """An old Intel-Mac GPU (no non-uniform threadgroups) is refused with the reason; a GPU without
    simdgroup_matrix declares no tensor cores."""
    with pytest.raises(ObjCError, match="non-uniform threadgroup"):
        MetalDevice("METAL", objc=FakeObjC(families=()))
    assert MetalDevice("METAL", objc=FakeObjC(families=(1004,))).renderer.tensor_cores == ()
    assert len(MetalDevice("METAL", objc=FakeObjC(families=(1004, 1007))).renderer.tensor_cores) == 3


def test_no_device_and_other_indices() -> None:
    with pytest.raises(ObjCError, match="MTLCreateSystemDefaultDevice"):
        MetalDevice("METAL", objc=FakeObjC(has_device=False))
    with pytest.raises(ValueError, match="only METAL"):
        MetalDevice("METAL:1", objc=FakeObjC())


def test_copies_and_offset_views(dev: MetalDevice, fake: FakeObjC) -> None:
    alloc = dev.allocator
    data = np.arange(32, dtype=np.float32)
    buf = alloc.alloc(data.nbytes)
    assert fake.calls("MTLDevice")[-1][1:] == ("newBufferWithLength:options:", (128, 0))  # shared storage
    alloc.copyin(buf, memoryview(data).cast("B"))
    view = alloc.offset(buf, 40, 24)  # elements 10..15
    out = np.zeros(6, np.float32)
    alloc.copyout(memoryview(out).cast("B"), view)
    np.testing.assert_array_equal(out, data[10:16])
    alloc.copyin(alloc.offset(view, 8, 8), memoryview(np.array([-1, -2], np.float32)).cast("B"))
    whole = np.zeros(32, np.float32)
    alloc.copyout(memoryview(whole).cast("B"), buf)
    want = data.copy()
    want[12:14] = [-1, -2]
    np.testing.assert_array_equal(whole, want)
    assert view.mtl == buf.mtl and view.offset == 40
    with pytest.raises(ValueError, match="outside a buffer of 128 bytes"):
        alloc.offset(buf, 120, 16)
    with pytest.raises(ValueError, match="copyin of 132 bytes"):
        alloc.copyin(buf, memoryview(bytes(132)))
    np.testing.assert_array_equal(np.frombuffer(alloc.as_buffer(view), np.float32), want[10:16])


def test_zero_byte_buffer_is_backed_and_released(dev: MetalDevice, fake: FakeObjC) -> None:
    buf = dev.allocator.alloc(0)
    assert fake.objects[buf.mtl].data["length"] == 1  # Metal has no empty buffers
    dev.allocator._free(buf, 0, None)
    assert fake.objects[buf.mtl].refs == 0


def test_launch_sequence(dev: MetalDevice, fake: FakeObjC) -> None:
    """One launch: pipeline, each buffer at its index with its view offset, the variables as int64 at
    VALS_INDEX, the grid and threadgroup, end, commit; with wait the GPU time."""
    src = dev.renderer.render("add", add_kernel(var=True))
    prg = dev.runtime("add", dev.compiler.compile_cached(src))
    out, a, b = (dev.allocator.alloc(4 * N + 64) for _ in range(3))
    a_view = dev.allocator.offset(a, 64, 4 * N)
    seconds = prg(out, a_view, b, global_size=(N, 1, 1), local_size=(8, 1, 1), vals=(11,), wait=True)
    assert seconds == pytest.approx(0.25)
    encoder_calls = [c[1] for c in fake.calls("MTLComputeCommandEncoder")]
    assert encoder_calls == ["setComputePipelineState:", "setBuffer:offset:atIndex:", "setBuffer:offset:atIndex:",
                             "setBuffer:offset:atIndex:", "setBytes:length:atIndex:",
                             "dispatchThreads:threadsPerThreadgroup:", "endEncoding"]
    [(function, bound, grid, group)] = fake.dispatches()
    assert function == "add"
    assert bound[0] == (out.mtl, 0) and bound[1] == (a.mtl, 64) and bound[2] == (b.mtl, 0)
    assert bound[VALS_INDEX] == ("bytes", struct.pack("<q", 11))
    assert grid == (N, 1, 1) and group == (8, 1, 1)
    buffer_calls = [c[1] for c in fake.calls("MTLCommandBuffer")]
    assert buffer_calls[:3] == ["retain", "computeCommandEncoder", "commit"]
    assert "waitUntilCompleted" in buffer_calls and buffer_calls[-1] == "release"


def test_launch_without_local_size_and_empty_grid(dev: MetalDevice, fake: FakeObjC) -> None:
    prg = dev.runtime("add", dev.compiler.compile_cached(dev.renderer.render("add", add_kernel())))
    bufs = [dev.allocator.alloc(4 * 3000) for _ in range(3)]
    assert prg(*bufs, global_size=(3000, 5, 1)) is None  # not waited for: still in flight
    assert len(dev._in_flight) == 1
    dev.synchronize()
    assert not dev._in_flight and not fake.live("MTLCommandBuffer")
    [(_, _, grid, group)] = fake.dispatches()
    assert grid == (3000, 5, 1) and group == (1024, 1, 1)  # capped by maxTotalThreadsPerThreadgroup
    assert prg(*bufs, global_size=(0, 1, 1), wait=True) == 0.0
    assert len(fake.dispatches()) == 1  # nothing encoded for an empty grid


def test_bad_launches_name_the_kernel(dev: MetalDevice) -> None:
    prg = dev.runtime("add", dev.compiler.compile_cached(dev.renderer.render("add", add_kernel())))
    bufs = [dev.allocator.alloc(4 * N) for _ in range(3)]
    with pytest.raises(ValueError, match="kernel add: local size .* 2048 threads"):
        prg(*bufs, global_size=(N, 1, 1), local_size=(32, 64, 1))
    with pytest.raises(ValueError, match="kernel add: 31 buffers"):
        prg(*(bufs * 11)[:31], global_size=(N, 1, 1))


def test_batched_kernels_share_one_library(dev: MetalDevice, fake: FakeObjC) -> None:
    """A schedule's kernels build as one library; each program finds its renamed symbol in it."""
    # names no other test uses: the compile cache of the session would serve those
    srcs = [dev.renderer.render("batched", add_kernel()), dev.renderer.render("batched", add_kernel(var=True))]
    binaries = dev.compiler.compile_cached_many(srcs)
    kbs = [KernelBinary.unpack(b) for b in binaries]
    assert kbs[0].program == kbs[1].program and kbs[0].symbol != kbs[1].symbol
    assert len([c for c in fake.calls("MTLDevice") if c[1].startswith("newLibraryWithSource")]) == 1
    progs = [dev.runtime("batched", b) for b in binaries]
    assert [fake.objects[p.pipeline].data["function"] for p in progs] == [kb.symbol for kb in kbs]
    assert len(fake.live("MTLLibrary")) == 1  # the compile check's library was released; one kept to load from


def test_compile_error_shows_source_and_log(dev: MetalDevice) -> None:
    src = dev.renderer.render("add", add_kernel()) + "#error planted\n"
    with pytest.raises(CompileError, match="fake failure") as info:
        dev.compiler.compile(src)
    assert "#error planted" in str(info.value) and "Metal library build failed" in str(info.value)


def test_missing_function_is_an_error(dev: MetalDevice) -> None:
    binary = dev.compiler.compile(dev.renderer.render("add", add_kernel()))
    with pytest.raises(ValueError, match="no function mul"):
        dev.runtime("mul", binary)


def test_failed_command_buffer_raises_metal_error() -> None:
    fake = FakeObjC(fail_command_buffers=True)
    dev = MetalDevice("METAL", objc=fake)
    prg = dev.runtime("add", dev.compiler.compile_cached(dev.renderer.render("add", add_kernel())))
    bufs = [dev.allocator.alloc(4 * N) for _ in range(3)]
    with pytest.raises(RuntimeError, match="Metal command buffer failed: Internal Error"):
        prg(*bufs, global_size=(N, 1, 1), wait=True)
    assert not fake.live("MTLCommandBuffer")  # released even when it failed


def test_graph_is_one_command_buffer(dev: MetalDevice, fake: FakeObjC) -> None:
    """Replay encodes every call into one encoder of one command buffer; update_buffer and update_vals
    change what the next replay binds."""
    prg = dev.runtime("add", dev.compiler.compile_cached(dev.renderer.render("add", add_kernel(var=True))))
    bufs = [dev.allocator.alloc(4 * N) for _ in range(4)]
    graph = dev.graph([(prg, bufs[:3], (5,), (N, 1, 1)),
                       (prg, [bufs[3], bufs[0], bufs[0]], (7,), (N, 1, 1), (4, 1, 1))])
    assert len(graph) == 2
    assert graph(wait=True) == pytest.approx(0.25)
    assert len([c for c in fake.calls("MTLCommandQueue") if c[1] == "commandBuffer"]) == 1
    first, second = fake.dispatches()
    assert first[1][0] == (bufs[0].mtl, 0) and first[1][VALS_INDEX][1] == struct.pack("<q", 5)
    assert second[1][0] == (bufs[3].mtl, 0) and second[3] == (4, 1, 1)
    graph.update_buffer(1, 0, bufs[2])
    graph.update_vals(0, (9,))
    graph()
    dev.synchronize()
    third, fourth = fake.dispatches()[2:]
    assert third[1][VALS_INDEX][1] == struct.pack("<q", 9) and fourth[1][0] == (bufs[2].mtl, 0)
    with pytest.raises(ValueError, match="takes 1 int variables, got 2"):
        graph.update_vals(0, (1, 2))
    with pytest.raises(TypeError, match="expected a MetalProgram"):
        dev.graph([(object(), [], (), (1, 1, 1))])


def test_through_codegen_and_ownership(dev: MetalDevice, fake: FakeObjC) -> None:
    """A real kernel AST (from a tensor program) lowers, builds and launches; afterwards nothing Metal
    handed out is leaked: autoreleased objects were made inside a pool, owned ones are released."""
    from ember import Tensor

    t = (Tensor(np.ones((4, 4), np.float32), device="PYTHON") * 2).sum(axis=1)
    ast = t.schedule()[-1].ast
    spec = get_program(ast, dev.renderer)
    prg = dev.runtime(spec.name, dev.compiler.compile_cached(spec.src))
    bufs = [dev.allocator.alloc(64) for _ in range(2)]
    prg(*bufs, global_size=spec.global_size, local_size=spec.local_size, wait=True)
    for b in bufs:
        dev.allocator._free(b, 64, None)
    del prg
    assert not fake.live("MTLBuffer") and not fake.live("MTLCommandBuffer") and not fake.live("MTLComputePipelineState")
    assert not fake.live("NSString") and not fake.live("MTLComputeCommandEncoder")


def test_the_fake_enforces_the_api(fake: FakeObjC) -> None:
    """The rules the tests rely on hold in the fake itself (so a wrong sequence would fail above)."""
    queue = fake.send(fake.default_device(), "newCommandQueue")
    with pytest.raises(FakeMetalError, match="no pool"):
        fake.send(queue, "commandBuffer")
    with fake.pool():
        cb = fake.send(queue, "commandBuffer")
        enc = fake.send(cb, "computeCommandEncoder")
        with pytest.raises(FakeMetalError, match="commit before endEncoding"):
            fake.send(cb, "commit")
        fake.send(enc, "endEncoding")
        with pytest.raises(FakeMetalError, match="after endEncoding"):
            fake.send(enc, "endEncoding")
    with pytest.raises(FakeMetalError, match="released"):
        fake.send(cb, "commit")


def test_finalize_releases_what_the_device_owns(fake: FakeObjC, dev: MetalDevice) -> None:
    prg = dev.runtime("add", dev.compiler.compile_cached(dev.renderer.render("add", add_kernel())))
    bufs = [dev.allocator.alloc(4 * N) for _ in range(3)]
    prg(*bufs, global_size=(N, 1, 1))
    dev.synchronize()
    dev.finalize()
    assert not fake.live("MTLCommandQueue") and not fake.live("MTLLibrary") and not fake.live("MTLDevice")


def test_system_layer_marshals_arguments_like_objc_msgsend() -> None:
    """SystemObjC's call path with a C callback standing in for objc_msgSend (no libobjc here): object and
    integer arguments, an MTLSize by value, an NSError** out-pointer written by the callee, and the results."""
    from ember_metal.objc import MTLSize, SystemObjC, obj, size3, uint

    layer = SystemObjC.__new__(SystemObjC)  # the frameworks cannot load here: only the calling convention
    layer._selectors, layer._functions = {"dispatch": 0x51, "build": 0x52}, {}
    seen: list[tuple] = []

    dispatch_proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, MTLSize, MTLSize, ctypes.c_ulong)
    dispatch = dispatch_proto(lambda rcv, sel, grid, group, n: seen.append(
        (rcv, sel, (grid.width, grid.height, grid.depth), (group.width, group.height, group.depth), n)))
    layer._msgsend = ctypes.cast(dispatch, ctypes.c_void_p).value
    assert layer.send(0x1234, "dispatch", size3((7, 3)), size3((4, 1, 1)), uint(9), restype=None) is None
    assert seen == [(0x1234, 0x51, (7, 3, 1), (4, 1, 1), 9)]

    def build(rcv, sel, source, error):
        error[0] = 0xE440  # the callee reports an NSError through the out-pointer
        return None

    build_proto = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.POINTER(ctypes.c_void_p))
    callback = build_proto(build)
    layer._msgsend = ctypes.cast(callback, ctypes.c_void_p).value
    error = ctypes.c_void_p(None)
    assert layer.send(0x1234, "build", obj(0x99), ctypes.byref(error)) is None
    assert error.value == 0xE440
