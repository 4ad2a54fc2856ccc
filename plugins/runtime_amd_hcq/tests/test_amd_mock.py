"""The mock KFD rejects what the driver or the GPU would reject, and the probe explains what is missing.

The mock checks ioctl arguments, memory maps, packets and synchronization, not the GPU's
instructions (kernels run on the CPU through PoCL); nothing here runs on an AMD GPU.
"""
from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import time

import pytest
from ember_amd import kfd, pm4, sdma
from ember_amd.mock_kfd import GPU_ID, MockKFD
from ember_amd.plugin import problem


@pytest.fixture
def mock():
    return MockKFD("gfx1100")


def _open_vm(mock: MockKFD) -> int:
    fd = mock.open(kfd.KFD_PATH, os.O_RDWR)
    drm = mock.open(mock.render_path, os.O_RDWR)
    kfd.ioctl(mock, fd, "ACQUIRE_VM", drm_fd=drm, gpu_id=GPU_ID)
    return fd


def _reserve(mock: MockKFD, size: int) -> int:
    return mock.mmap(0, size, kfd.PROT_NONE, kfd.MAP_PRIVATE | kfd.MAP_ANONYMOUS | kfd.MAP_NORESERVE, -1, 0)


def _wait_for_error(mock: MockKFD, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while not mock.errors and time.monotonic() < deadline:
        time.sleep(0.005)
    assert mock.errors, "the mock accepted the packet"
    return mock.errors[-1]


def test_ioctl_with_a_wrong_structure_size_is_einval(mock):
    fd = mock.open(kfd.KFD_PATH, os.O_RDWR)
    request, _ = kfd.IOCTLS["ALLOC_MEMORY_OF_GPU"]
    with pytest.raises(OSError) as e:
        mock.ioctl(fd, request, kfd.FreeMemoryArgs(handle=1))
    assert e.value.errno == errno.EINVAL


def test_allocation_checks_vm_size_alignment_and_flags(mock):
    fd = mock.open(kfd.KFD_PATH, os.O_RDWR)
    va = _reserve(mock, 1 << 16)
    good = {"va_addr": va, "size": 1 << 16, "gpu_id": GPU_ID, "flags": kfd.MEM_VRAM | kfd.MEM_WRITABLE}
    with pytest.raises(kfd.KFDError, match=r"AMDKFD_IOC_ALLOC_MEMORY_OF_GPU failed: errno 22 EINVAL.*ACQUIRE_VM"):
        kfd.ioctl(mock, fd, "ALLOC_MEMORY_OF_GPU", **good)
    fd = _open_vm(mock)
    for bad, why in ((dict(size=100), "page multiples"), (dict(va_addr=va + 1), "page multiples"),
                     (dict(flags=kfd.MEM_VRAM | kfd.MEM_GTT), "exactly one of"), (dict(gpu_id=7), "not a GPU")):
        with pytest.raises(kfd.KFDError, match=why) as e:
            kfd.ioctl(mock, fd, "ALLOC_MEMORY_OF_GPU", **{**good, **bad})
        assert e.value.errno == errno.EINVAL
    a = kfd.ioctl(mock, fd, "ALLOC_MEMORY_OF_GPU", **good)
    with pytest.raises(kfd.KFDError, match="overlaps"):
        kfd.ioctl(mock, fd, "ALLOC_MEMORY_OF_GPU", **good)
    ids = (ctypes.c_uint32 * 1)(GPU_ID)
    kfd.ioctl(mock, fd, "MAP_MEMORY_TO_GPU", handle=a.handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1)
    with pytest.raises(kfd.KFDError, match="EBUSY.*unmap it first"):
        kfd.ioctl(mock, fd, "FREE_MEMORY_OF_GPU", handle=a.handle)
    with pytest.raises(kfd.KFDError, match="handle 999 is not an allocation"):
        kfd.ioctl(mock, fd, "MAP_MEMORY_TO_GPU", handle=999, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1)


def test_queue_creation_checks_ring_and_memory(mock):
    fd = _open_vm(mock)
    va = _reserve(mock, 1 << 16)
    a = kfd.ioctl(mock, fd, "ALLOC_MEMORY_OF_GPU", va_addr=va, size=1 << 16, gpu_id=GPU_ID,
                  flags=kfd.MEM_GTT | kfd.MEM_WRITABLE)
    ids = (ctypes.c_uint32 * 1)(GPU_ID)
    kfd.ioctl(mock, fd, "MAP_MEMORY_TO_GPU", handle=a.handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1)
    args = dict(ring_base_address=va, ring_size=4096, gpu_id=GPU_ID, queue_type=kfd.QUEUE_TYPE_SDMA,
                read_pointer_address=va + 8192, write_pointer_address=va + 8200)
    with pytest.raises(kfd.KFDError, match="ring_size 3000 is not a power of two"):
        kfd.ioctl(mock, fd, "CREATE_QUEUE", **{**args, "ring_size": 3000})
    with pytest.raises(kfd.KFDError, match="ring 0x.* not 8-byte aligned memory mapped to the GPU"):
        kfd.ioctl(mock, fd, "CREATE_QUEUE", **{**args, "ring_base_address": va + (1 << 16)})
    with pytest.raises(kfd.KFDError, match="EOP buffer"):
        kfd.ioctl(mock, fd, "CREATE_QUEUE", **{**args, "queue_type": kfd.QUEUE_TYPE_COMPUTE})
    q = kfd.ioctl(mock, fd, "CREATE_QUEUE", **args)
    kfd.ioctl(mock, fd, "DESTROY_QUEUE", queue_id=q.queue_id)
    with pytest.raises(kfd.KFDError, match="is not a queue"):
        kfd.ioctl(mock, fd, "DESTROY_QUEUE", queue_id=q.queue_id)


def test_first_event_needs_an_event_page(mock):
    fd = _open_vm(mock)
    with pytest.raises(kfd.KFDError, match="first signal event needs the handle"):
        kfd.ioctl(mock, fd, "CREATE_EVENT", event_page_offset=0, event_type=kfd.EVENT_SIGNAL, auto_reset=1)


@pytest.fixture
def dev(mock):
    from ember_amd.device import AMDDevice

    d = AMDDevice("AMD", osif=mock)
    yield d
    d.finalize()  # stops the mock's queue workers


def test_malformed_pm4_packet_faults_the_queue(mock, dev):
    dev.rings["compute"].submit([0x12345678])  # a type-0 header: not something the runtime writes
    assert "not a PM4 type-3 packet header" in _wait_for_error(mock)


def test_unknown_pm4_opcode_faults(mock, dev):
    dev.rings["compute"].submit([pm4.header(0x7F, 1), 0])
    assert "unknown PM4 opcode 0x7f" in _wait_for_error(mock)


def test_dispatch_of_code_never_uploaded_faults(mock, dev):
    dev.rings["compute"].submit(pm4.dispatch_direct((1, 1, 1), 1))
    assert "DISPATCH_DIRECT: no kernel entry at 0x0" in _wait_for_error(mock)


def test_sdma_copy_of_unmapped_memory_is_a_page_fault(mock, dev):
    dev.rings["copy"].submit(sdma.copy(0x10000, 0x20000, 64))
    assert "GPU page fault: SDMA copy source at 0x20000" in _wait_for_error(mock)


def test_signal_wait_for_a_faulted_queue_times_out(mock, dev):
    from ember.device import HCQTimeoutError

    sig = dev.new_signal("behind the fault")
    dev.rings["copy"].submit(sdma.copy(0x10000, 0x20000, 64) + sdma.fence(sig.address, 1))
    with pytest.raises(HCQTimeoutError, match="behind the fault"):
        sig.wait(1, timeout=0.3)


# --- the probe ---------------------------------------------------------------------------------------------
def test_probe_on_this_machine():
    reason = problem(kfd.RealOS())
    if os.path.exists(kfd.KFD_PATH):
        pytest.skip("this machine has /dev/kfd: the no-driver reason cannot be checked here")
    assert reason is not None and reason.startswith("no /dev/kfd") and "AMD_MOCK=1" in reason


def test_probe_without_kfd_never_imports_the_runtime():
    """The plugin's own path is the runtime's, and its quick answer is the one the full check gives."""
    import ember_amd.plugin as plugin

    assert plugin.KFD_PATH == kfd.KFD_PATH
    if os.path.exists(kfd.KFD_PATH) or os.environ.get("AMD_MOCK"):
        pytest.skip("this machine has /dev/kfd (or AMD_MOCK is set): the probe goes on to the runtime")
    code = ("import sys; from ember_amd.plugin import probe; reason = probe(); "
            "print(reason.startswith('no /dev/kfd'), 'ember_amd.device' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stderr
    assert plugin.probe() == problem(kfd.RealOS())


def test_probe_on_the_mock_says_so_or_passes():
    from ember_amd.toolchain import toolchain_problem

    reason, clang = problem(MockKFD("gfx1100")), toolchain_problem("gfx1100")
    if clang is None:
        assert reason is None
    else:
        assert reason is not None and clang in reason and reason.startswith("mock KFD (AMD_MOCK=1)")


def test_probe_names_the_group_without_permission():
    class NoAccess(MockKFD):
        def access(self, path: str, mode: int) -> bool:
            return False

    reason = problem(NoAccess("gfx1100"))
    assert reason is not None and "no permission to open /dev/kfd" in reason and "usermod -aG" in reason


def test_probe_rejects_an_unsupported_target():
    old = MockKFD("gfx1100")
    old.properties["gfx_target_version"] = 80003  # gfx803 (Polaris): no tables for it
    reason = problem(old)
    assert reason is not None and "unsupported AMD GPU target 'gfx803'" in reason and "mock KFD" in reason


def test_probe_without_a_gpu_node():
    class CPUOnly(MockKFD):
        def listdir(self, path: str) -> list[str]:
            return ["0"]

    reason = problem(CPUOnly("gfx1100"))
    assert reason is not None and "no GPU node" in reason


# --- the real OS side that runs without a GPU ------------------------------------------------------------
def test_ioctl_structures_and_numbers_follow_the_header():
    """Sizes summed by hand from kfd_ioctl.h's fields (no padding in any of them), and request numbers as
    _IOWR('K', nr, struct) encodes them."""
    sizes = {"GET_VERSION": 8, "CREATE_QUEUE": 88, "DESTROY_QUEUE": 8, "CREATE_EVENT": 32, "DESTROY_EVENT": 8,
             "WAIT_EVENTS": 24, "ACQUIRE_VM": 8, "ALLOC_MEMORY_OF_GPU": 40, "FREE_MEMORY_OF_GPU": 8,
             "MAP_MEMORY_TO_GPU": 24, "UNMAP_MEMORY_FROM_GPU": 24}
    assert {name: ctypes.sizeof(struct) for name, (_, struct) in kfd.IOCTLS.items()} == sizes
    assert ctypes.sizeof(kfd.EventData) == 48
    assert kfd.IOCTLS["ALLOC_MEMORY_OF_GPU"][0] == 0xC0284B16  # read|write, 40 bytes, 'K', 0x16
    assert kfd.IOCTLS["GET_VERSION"][0] == 0x80084B01  # read, 8 bytes, 'K', 0x01
    assert kfd.IOCTLS["ACQUIRE_VM"][0] == 0x40084B15  # write, 8 bytes, 'K', 0x15


def test_real_os_maps_memory():
    real = kfd.RealOS()
    va = real.mmap(0, 2 * kfd.PAGE, kfd.PROT_READ | kfd.PROT_WRITE, kfd.MAP_PRIVATE | kfd.MAP_ANONYMOUS, -1, 0)
    ctypes.memset(va, 7, 2 * kfd.PAGE)
    assert ctypes.string_at(va + kfd.PAGE, 4) == b"\x07" * 4
    real.munmap(va, 2 * kfd.PAGE)
    with pytest.raises(OSError, match="mmap of .* failed"):
        real.mmap(0, kfd.PAGE, kfd.PROT_READ, kfd.MAP_SHARED, 987654, 0)  # not an open file


def test_errors_name_the_ioctl_errno_and_meaning():
    e = kfd.kfd_error("CREATE_QUEUE", errno.ENOSPC)
    assert e.errno == errno.ENOSPC
    assert e.strerror == "AMDKFD_IOC_CREATE_QUEUE failed: errno 28 ENOSPC: no free slot (too many queues or events)"


def test_copy_after_a_wait_without_cache_invalidation_faults(mock, dev):
    """On gfx10+ a copy behind a wait must invalidate the caches first (GCR_REQ), or it may copy stale data."""
    sig = dev.new_signal("ready", 1)
    src = dev.mem_alloc(4096, vram=False, host=True)
    dev.rings["copy"].submit(sdma.poll_regmem_ge(sig.address, 1) + sdma.copy(src.va + 2048, src.va, 64))
    assert "SDMA copy after POLL_REGMEM with no GCR_REQ" in _wait_for_error(mock)


def test_dispatch_after_a_wait_without_acquire_mem_faults(mock, dev):
    sig = dev.new_signal("ready", 1)
    dev.rings["compute"].submit(pm4.wait_reg_mem_ge(sig.address, 1) + pm4.dispatch_direct((1, 1, 1), 1))
    assert "DISPATCH_DIRECT after WAIT_REG_MEM with no ACQUIRE_MEM" in _wait_for_error(mock)
