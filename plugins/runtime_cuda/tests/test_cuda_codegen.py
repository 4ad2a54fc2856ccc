"""CUDA rendering, NVRTC compiling, launch shapes and the probe: everything that needs no GPU."""
from __future__ import annotations

import ctypes
import re
import subprocess
import sys

import numpy as np
import pytest
from ember_cuda import compiler as cuda_compiler
from ember_cuda import driver as cuda_driver
from ember_cuda.compiler import CUDACompiler, compile_target, nvrtc_compile
from ember_cuda.renderer import CUDARenderer, parse_arch
from ember_cuda.runtime import KernelArgs, launch_dims

from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.device.batch_compiler import KernelBinary
from ember.device.compiler import CompileError
from ember.ir.uop import Ops
from ember.renderer import TensorCore

pytestmark = pytest.mark.usefixtures("nvrtc_available")

SRC_A = 'extern "C" __global__ void E_4(float* __restrict__ data0, float* __restrict__ data1) {\n' \
        '  data0[threadIdx.x] = data1[threadIdx.x] * 2.0f;\n}\n'
SRC_B = SRC_A.replace("* 2.0f", "+ 1.0f")


def kernel_src(t: Tensor, arch: str = "sm_80") -> str:
    """The CUDA source of the (last) kernel realizing ``t``."""
    asts = [si.ast for si in t.schedule() if si.ast.op is not Ops.COPY]
    return get_program(asts[-1], CUDARenderer(arch)).src


def x(dt=dtypes.float32, shape=(4, 8)) -> Tensor:
    return Tensor(np.arange(np.prod(shape), dtype=np.float32).reshape(shape), device="PYTHON").realize().cast(dt)


def test_parse_arch():
    assert parse_arch("sm_75") == (7, 5) and parse_arch("sm_90a") == (9, 0) and parse_arch("compute_120") == (12, 0)
    with pytest.raises(ValueError, match="invalid CUDA architecture 'ampere'"):
        parse_arch("ampere")


def test_capabilities_from_arch_and_from_device_attributes():
    r = CUDARenderer("sm_90")
    assert (r.compute_capability, r.shared_max, r.max_threads_per_block, r.warp_size) == ((9, 0), 48 * 1024, 1024, 32)
    assert r.local_max == (1024, 1024, 64) and r.has_local and len(r.global_max) == 3
    g = CUDARenderer.from_attributes((8, 6), 49152, 768, (768, 768, 64), (2 ** 31 - 1, 65535, 65535), 32, "CUDA:1")
    assert (g.arch, g.max_threads_per_block, g.local_max, g.device) == ("sm_86", 768, (768, 768, 64), "CUDA:1")


def test_tensor_cores_per_architecture():
    shapes = {a: {(tc.dims, tc.dtype_in) for tc in CUDARenderer(a).tensor_cores} for a in ("sm_75", "sm_80", "sm_90")}
    assert shapes["sm_75"] == {((16, 8, 8), dtypes.float16)}  # Turing: no bfloat16 mma
    assert shapes["sm_80"] == shapes["sm_90"] == {((16, 8, 16), dtypes.float16), ((16, 8, 16), dtypes.bfloat16),
                                                  ((16, 8, 8), dtypes.float16)}
    for tc in CUDARenderer("sm_80").tensor_cores:
        assert isinstance(tc, TensorCore) and tc.dtype_out == dtypes.float32 and tc.threads == 32
        assert tc.intrinsic.startswith("mma.sync.aligned.m16n8k") and tc.intrinsic.endswith(".f32")


def test_kernel_signature_and_grid_stride_loops():
    src = kernel_src(x() + x())
    assert re.search(r'extern "C" __global__ void \w+\(float\* __restrict__ data0, ', src)
    # both output dims map onto the grid: the inner one on x, the outer one on y
    assert "blockIdx.x * blockDim.x + threadIdx.x" in src and "blockIdx.y * blockDim.y + threadIdx.y" in src
    assert "gridDim.x * blockDim.x" in src
    assert "#include" not in src  # float32 needs no header


def test_16bit_floats_use_the_cuda_headers():
    half = kernel_src(x(dtypes.float16) * 3)
    assert "#include <cuda_fp16.h>" in half and "half* __restrict__ data0" in half
    assert "= ember_f32_to_f16(" in half  # stores keep NaN payloads as numpy does, finite values round to even
    assert "cuda_bf16.h" not in half
    bf = kernel_src(x(dtypes.bfloat16).exp())
    assert "#include <cuda_bf16.h>" in bf and "__nv_bfloat16* __restrict__" in bf and "ember_bf16_round" in bf


def test_wide_ints_round_once_to_16bit_floats():
    assert "__ll2bfloat16_rn(" in kernel_src(x().cast(dtypes.int64).cast(dtypes.bfloat16))
    assert "__uint2half_rn(" in kernel_src(x().cast(dtypes.uint32).cast(dtypes.float16))
    assert "__double2bfloat16(" in kernel_src(x(dtypes.float64).cast(dtypes.bfloat16))


def test_float32_transcendentals_round_once_from_float64():
    src = kernel_src(x().exp() + x().sin() + x().sqrt())
    assert "((float)exp((double)" in src and "((float)sin((double)" in src  # CUDA's expf, sinf: 2 ulp
    assert "sqrtf(" in src  # IEEE correctly rounded already
    assert "exp((double)" not in kernel_src(x(dtypes.float64).exp())


def test_special_float_constants_are_bit_patterns():
    src = kernel_src(x() + float("inf"))
    assert "__int_as_float(0x7f800000)" in src and "INFINITY" not in src


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_rendered_kernels_compile_to_cubin(arch):
    srcs = [kernel_src(t, arch) for t in (x() @ x(shape=(8, 4)), x(dtypes.float16).sum(axis=1),
                                          x(dtypes.bfloat16).max(axis=0), x().cast(dtypes.int64) // 3)]
    binaries = CUDACompiler(arch).compile_batch(srcs)
    assert len(binaries) == len(srcs)
    for b in binaries:
        kb = KernelBinary.unpack(b)
        assert kb.program[:4] == b"\x7fELF" and kb.symbol.encode() in kb.program


def test_unknown_architecture_gets_ptx_of_the_newest_known_one(monkeypatch):
    monkeypatch.setattr(cuda_compiler, "supported_archs", lambda: (75, 80, 90))
    assert compile_target("sm_80") == "sm_80"
    assert compile_target("sm_89") == "compute_80" and compile_target("sm_120") == "compute_90"
    with pytest.raises(RuntimeError, match="cannot compile for sm_70"):
        compile_target("sm_70")


def test_ptx_target_gives_loadable_ptx_text():
    out = nvrtc_compile(SRC_A, "compute_80")
    assert out.cubin is None and out.ptx.endswith(b"\0")  # cuModuleLoadData reads PTX as a C string
    assert b".target sm_80" in out.ptx and b".entry E_4" in out.ptx


def test_compile_error_shows_source_and_nvrtc_log():
    bad = SRC_A.replace("data1[threadIdx.x]", "undefined_thing")
    with pytest.raises(CompileError) as info:
        CUDACompiler("sm_80").compile(bad)
    msg = str(info.value)
    assert "NVRTC 13.0 could not compile for sm_80" in msg and "--- source ---" in msg
    assert "2 |   data0[threadIdx.x] = undefined_thing * 2.0f;" in msg and 'identifier "undefined_thing"' in msg


def test_missing_cuda_headers_are_named_with_the_fix(monkeypatch):
    monkeypatch.setattr(cuda_compiler, "cuda_include_dirs", lambda: ())
    with pytest.raises(CompileError, match='cuda_fp16.h(.|\n)*pip install "nvidia-cuda-runtime==13.0.\\*"'):
        nvrtc_compile(kernel_src(x(dtypes.float16) + 1), "sm_80")


def test_batch_builds_colliding_kernels_once(monkeypatch):
    builds: list[str] = []
    real_build = CUDACompiler.build
    monkeypatch.setattr(CUDACompiler, "build", lambda self, src: builds.append(src) or real_build(self, src))
    c = CUDACompiler("sm_80")
    c.parallel_builds = 1  # else two cores would build two programs at once
    a, b = c.compile_batch([SRC_A, SRC_B])
    ka, kb = KernelBinary.unpack(a), KernelBinary.unpack(b)
    assert len(builds) == 1 and ka.program == kb.program and ka.symbol != kb.symbol
    assert ka.symbol.encode() in ka.program and kb.symbol.encode() in kb.program


def test_batch_error_names_the_failing_source():
    bad = SRC_B.replace("1.0f", "nope")
    with pytest.raises(CompileError) as info:
        CUDACompiler("sm_80").compile_batch([SRC_A, bad])
    assert info.value.src == bad


def test_cache_key_names_nvrtc_version_and_target():
    c80, c90 = CUDACompiler("sm_80"), CUDACompiler("sm_90")
    assert "nvrtc|13.0|sm_80" in c80.cachekey and c80.cachekey != c90.cachekey


def test_cached_compile_is_served_from_disk(monkeypatch):
    first = CUDACompiler("sm_80").compile_cached(SRC_A + "// disk\n")
    monkeypatch.setattr(CUDACompiler, "build", lambda self, src: pytest.fail("compiled again"))
    assert CUDACompiler("sm_80").compile_cached(SRC_A + "// disk\n") == first


def test_launch_dims_cover_the_global_size():
    grid, block = launch_dims((1000, 3, 1), None, 1024, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))
    assert block == (256, 1, 1) and grid == (4, 3, 1)
    grid, block = launch_dims((5, 7, 2), None, 1024, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))
    assert block == (8, 8, 2) and grid == (1, 1, 1)
    # past the grid limit the kernels' grid-stride loops cover the rest
    grid, block = launch_dims((1, 10 ** 6, 1), None, 1024, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))
    assert block == (1, 256, 1) and grid == (1, 3907, 1)
    grid, _ = launch_dims((1, 1, 10 ** 8), None, 1024, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))
    assert grid == (1, 1, 65535)
    # a kernel that allows fewer threads (many registers) gets smaller blocks
    assert launch_dims((4096, 1, 1), None, 128, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))[1] == (128, 1, 1)


def test_launch_dims_with_a_local_size():
    grid, block = launch_dims((64, 6, 1), (16, 2, 1), 1024, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))
    assert (grid, block) == ((4, 3, 1), (16, 2, 1))
    with pytest.raises(ValueError, match="exceeds the GPU's block limits"):
        launch_dims((4096, 1, 1), (512, 1, 1), 256, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))
    with pytest.raises(ValueError, match="global size"):
        launch_dims((-1, 1, 1), None, 256, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535))


def test_kernel_args_put_int_variables_before_buffers():
    args = KernelArgs([0x1000, 0x2000], [-3])
    pointers = (ctypes.c_void_p * 3).from_address(args.address)
    read = [ctypes.c_uint64.from_address(p).value for p in pointers]
    assert read == [2 ** 64 - 3, 0x1000, 0x2000]
    args.set_buffer(1, 0x3000)
    assert ctypes.c_uint64.from_address(pointers[2]).value == 0x3000


def test_probe_names_missing_cuda_python(monkeypatch):
    def missing():
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr(cuda_driver, "libcuda_problem", lambda: None)
    monkeypatch.setattr(cuda_driver, "import_driver", missing)
    reason = cuda_driver.driver_problem.__wrapped__()
    assert reason.startswith("cuda-python is not installed") and 'pip install "ember[cuda]"' in reason


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads glibc's loader cache (Linux)")
def test_precheck_reads_the_loader_cache_and_search_path(monkeypatch, tmp_path):
    """The precheck answers "no driver" only when the library is in neither the loader's cache nor a folder it
    searches; anywhere the loader might find it, the (forked) probe decides. It loads nothing."""
    monkeypatch.setattr(cuda_driver, "LIBCUDA", "libcuda.so.1")
    monkeypatch.setattr(cuda_driver.ctypes, "CDLL", lambda name: pytest.fail("the precheck loaded a library"))
    monkeypatch.setattr(cuda_driver, "cuda_python_missing", lambda: None)
    monkeypatch.setattr(cuda_driver, "LOADER_DIRS", (str(tmp_path / "lib"),))
    # the interpreter's own library folders are searched too (on a machine with the driver, /usr/lib has it)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "base"))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    cache = tmp_path / "ld.so.cache"
    monkeypatch.setattr(cuda_driver, "LD_CACHE", str(cache))
    cache.write_bytes(b"glibc-ld.so.cache1.1\0libcudart.so.12\0libm.so.6\0")
    reason = cuda_driver.no_driver_problem()
    assert reason is not None and reason.startswith("no NVIDIA driver: libcuda.so.1 cannot be loaded (libcuda.so.1 "
                                                    "is not in the dynamic loader's cache"), reason
    cache.write_bytes(b"glibc-ld.so.cache1.1\0libcuda.so.1\0")
    assert cuda_driver.no_driver_problem() is None  # listed by ldconfig
    cache.write_bytes(b"")
    (tmp_path / "drv").mkdir()
    (tmp_path / "drv" / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nowhere:{tmp_path / 'drv'}")
    assert cuda_driver.no_driver_problem() is None  # on LD_LIBRARY_PATH
    monkeypatch.setattr(cuda_driver, "LD_CACHE", str(tmp_path / "absent"))
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert cuda_driver.no_driver_problem() is None  # no cache (not glibc): only the probe can tell
    monkeypatch.setattr(cuda_driver, "LD_CACHE", str(cache))
    monkeypatch.setattr(cuda_driver, "cuda_python_missing", lambda: "No module named 'cuda'")
    assert cuda_driver.no_driver_problem().startswith("cuda-python is not installed (No module named 'cuda')")


def never_imported():
    raise AssertionError("cuda-python was imported although the driver library cannot be loaded")


@pytest.mark.parametrize("missing, expect", [
    (None, "no NVIDIA driver: libcuda.so.1 cannot be loaded (OSError: libcuda.so.1: cannot open shared object"),
    ("No module named 'cuda'", "cuda-python is not installed (No module named 'cuda'): pip install"),
])
def test_probe_without_the_driver_library_never_imports_cuda_python(monkeypatch, missing, expect):
    """The dlopen of the driver library fails in ~2 ms; importing cuda-python first cost 20-50 ms on every
    machine without an NVIDIA GPU. The reason stays what it was: cuda-python first when it is missing too."""
    monkeypatch.setattr(cuda_driver, "LIBCUDA", "libcuda.so.1")
    monkeypatch.setattr(cuda_driver.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(
        OSError(f"{name}: cannot open shared object file: No such file or directory")))
    monkeypatch.setattr(cuda_driver, "cuda_python_missing", lambda: missing)
    monkeypatch.setattr(cuda_driver, "import_driver", never_imported)
    reason = cuda_driver.driver_problem.__wrapped__()
    assert reason.startswith(expect), reason


def test_cuda_python_missing_agrees_with_an_import():
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        assert cuda_driver.cuda_python_missing() is not None
    else:
        assert cuda_driver.cuda_python_missing() is None


class FakeDriver:
    """Stands in for cuda.bindings.driver: cuInit and the device count are what the test sets."""

    def __init__(self, init, count=1, version=13000):
        self.init, self.count, self.version = init, count, version

    def cuInit(self, flags):
        if isinstance(self.init, Exception):
            raise self.init
        return (self.init,)

    def cuDeviceGetCount(self):
        return (0, self.count)

    def cuDriverGetVersion(self):
        return (0, self.version)


class Status(int):
    def __new__(cls, value, name):
        s = super().__new__(cls, value)
        s.name = name
        return s


@pytest.mark.parametrize("init, count, version, expect", [
    (RuntimeError("Failed to dlopen libcuda.so.1"), 1, 13000, "no NVIDIA driver: libcuda.so.1 cannot be loaded"),
    (Status(100, "CUDA_ERROR_NO_DEVICE"), 0, 13000, "no CUDA GPU found (cuInit: CUDA_ERROR_NO_DEVICE"),
    (Status(35, "CUDA_ERROR_INSUFFICIENT_DRIVER"), 1, 13000, "the NVIDIA driver is too old"),
    (Status(0, "CUDA_SUCCESS"), 0, 13000, "no CUDA GPU found (the driver lists none"),
    (Status(0, "CUDA_SUCCESS"), 1, 12040, "the NVIDIA driver supports CUDA 12.4, older than NVRTC 13.0"),
    (Status(0, "CUDA_SUCCESS"), 1, 13000, None),
])
def test_probe_reason_for_each_driver_state(monkeypatch, init, count, version, expect):
    monkeypatch.setattr(cuda_driver, "libcuda_problem", lambda: None)  # the library loads; cuInit decides
    monkeypatch.setattr(cuda_driver, "import_driver", lambda: FakeDriver(init, count, version))
    reason = cuda_driver.driver_problem.__wrapped__()
    assert reason == expect if expect is None else reason.startswith(expect), reason


def test_device_name_parsing():
    assert cuda_driver.device_index("CUDA") == 0 and cuda_driver.device_index("CUDA:3") == 3
    with pytest.raises(ValueError, match="expected CUDA or CUDA:N"):
        cuda_driver.device_index("CUDA:x")


def test_doctor_lists_cuda_with_the_reason():
    from ember_cuda.plugin import no_driver_problem, probe

    reason = no_driver_problem() or probe()  # the registry's order: the precheck's reason, else the probe's
    if reason is None:
        pytest.skip("a GPU is usable here: the doctor shows CUDA as usable")
    out = subprocess.run([sys.executable, "-m", "ember.doctor"], capture_output=True, text=True, timeout=300).stdout
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("CUDA "))
    assert "ember-cuda==0.1.0" in line and f"unusable: {reason}" in line


def test_nvrtc_output_never_writes_into_shared_bytes():
    # A kernel with an empty log: NVRTC reports a 1-byte log. Its buffer must not be the interpreter's shared
    # one-byte ``b" "`` object, or every ``b" "`` in the process reads ``b"\0"`` afterwards.
    out = nvrtc_compile(SRC_A + "// shared bytes\n", "sm_80")
    assert out.log == "" and out.ptx.startswith(b"//")
    space = bytes([32])  # the shared object, built at run time so the compiler's constant is not the one checked
    assert space == b"\x20" and space[0] == 32


def _far_tail(rows: int) -> Tensor:
    """The last 3 of ``rows`` repeats of 0..6: a view of a 7-element buffer, its offset ``7 * rows - 3``."""
    x7 = Tensor(np.arange(7, dtype=np.float32), device="PYTHON").realize()
    return x7.reshape(1, 7).expand(rows, 7).reshape(rows * 7)[-3:].contiguous()


def test_index_type_is_64_bits_only_where_32_could_wrap():
    big = kernel_src(_far_tail(5 * 10 ** 8))
    assert "const long long gidx0 = (long long)gidx0_l;" in big
    assert re.search(r"long long alu\d+ = \(gidx0 \+ \d+ll\);", big) and not re.search(r"\bint (alu|gidx)", big)
    small = kernel_src(_far_tail(1000))
    assert "for (int gidx0 = (int)(" in small and "long long alu" not in small
    for src in (big, small):
        assert nvrtc_compile(src, "compute_80").ptx
