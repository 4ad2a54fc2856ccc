"""A mock KFD: a fake ``/dev/kfd`` and GPU that the AMD runtime drives exactly as it drives the real one.

``AMD_MOCK=1`` selects it (``AMD_MOCK_ARCH`` picks the gfx target, default gfx1100). It implements
:class:`ember_amd.kfd.OSInterface`:

- **ioctls** are checked as the driver checks them (structure size, gpu ids, flags, alignment,
  handles, mapped addresses); a wrong one fails with the errno the kernel would return.
- **memory** is real host memory at the GPU virtual address the runtime chose (GPU address ==
  host address), so copies and kernels act on it directly; the mock keeps the allocation and
  GPU-mapping table and faults any packet that touches memory not mapped to the GPU.
- **queues** (:mod:`ember_amd.mock_gpu`): each queue gets a worker thread polling its doorbell, as the GPU's command
  processor would. It parses the PM4 (compute) or SDMA (copy) packets between its read pointer
  and the doorbell's write pointer, executes copies, signal writes, waits and timestamps, and
  raises the KFD event an interrupt names.
- **dispatches** (:mod:`ember_amd.mock_gpu`) run the same kernel compiled for the CPU: the code object at the dispatched
  address (uploaded by the runtime, which tells the mock through the one mock-only hook
  :meth:`MockKFD.register_code_object`) carries its source in ``.ember.source``; the mock builds
  its host OpenCL form with PoCL and runs it with the work-group size and count of the packet, on
  the kernel-argument block the packet points at (hidden arguments checked against the packet).

What this checks: the ioctl sequence, memory maps, packet encoding and the synchronization
between queues, events and the host. What it does not check: the GPU's instructions (the
kernel's machine code never runs), cache coherence, and timing.
"""
from __future__ import annotations

import bisect
import ctypes
import errno
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from ember_amd import gfx, kfd
from ember_amd.mock_gpu import MockFault, MockGPU, MockQueue, read_u32, read_u64, write_u64

GPU_ID = 0x4A1D
RENDER_MINOR = 128
DOORBELL_MMAP_BASE = 1 << 44  # kfd mmap offsets of doorbell pages, as the driver tags them by type
DOORBELL_PAGE = 0x2000
#: the properties a topology node of each mock target reports
MOCK_PROPERTIES = {
    "gfx1100": {"gfx_target_version": 110000, "simd_count": 192, "simd_per_cu": 2, "max_waves_per_simd": 16,
                "lds_size_in_kb": 64, "wave_front_size": 32, "array_count": 12, "simd_arrays_per_engine": 2,
                "cu_per_simd_array": 8, "max_slots_scratch_cu": 32, "num_sdma_engines": 2, "local_mem_size": 1 << 34},
    "gfx942": {"gfx_target_version": 90402, "simd_count": 1216, "simd_per_cu": 4, "max_waves_per_simd": 8,
               "lds_size_in_kb": 64, "wave_front_size": 64, "array_count": 32, "simd_arrays_per_engine": 1,
               "cu_per_simd_array": 10, "max_slots_scratch_cu": 32, "num_sdma_engines": 2, "local_mem_size": 1 << 36},
}


#: what the mock's gfx1100 driver reports (and then requires) for the context-save area: 96 CUs * 32 waves
#: * 12 bytes + 48 rounded to pages; plus (0x60000 + 0x4000 + 0x10000 + 0x1000) per CU
MOCK_CTL_STACK = 0xA000
MOCK_CWSR = MOCK_CTL_STACK + 96 * 0x75000


@dataclass
class Allocation:
    va: int
    size: int
    flags: int
    handle: int
    mmap_offset: int
    mapped: bool = False

    @property
    def end(self) -> int:
        return self.va + self.size


@dataclass
class Event:
    event_id: int
    slot: int
    auto_reset: bool
    signaled: bool = False


class MockKFD:
    """The fake KFD and GPU (see the module docstring). ``errors`` lists every fault a queue hit."""

    mock = True

    def __init__(self, arch: str = "gfx1100"):
        if arch not in MOCK_PROPERTIES:
            raise ValueError(f"AMD_MOCK_ARCH={arch!r}: the mock models {', '.join(MOCK_PROPERTIES)}")
        self.arch = arch
        self.table = gfx.gfx_table(arch)
        self.properties = {**MOCK_PROPERTIES[arch], "drm_render_minor": RENDER_MINOR}
        if arch == "gfx1100":  # a kernel recent enough to export the context-save sizes it insists on
            self.properties.update(ctl_stack_size=MOCK_CTL_STACK, cwsr_size=MOCK_CWSR)
        self.render_path = f"/dev/dri/renderD{RENDER_MINOR}"
        self.lock = threading.RLock()
        self.event_cond = threading.Condition(self.lock)
        self.fds: dict[int, str] = {}
        self._next_fd = 1000
        self.vm_fd: int | None = None
        self.allocs: dict[int, Allocation] = {}
        self.vram_used = 0
        self._starts: list[int] = []  # sorted va of the allocations, for lookups by address
        self._by_start: dict[int, Allocation] = {}
        self.reservations: dict[int, int] = {}  # anonymous mappings made through the mock: va -> size
        self._next_handle = 1
        self.queues: dict[int, MockQueue] = {}
        self.doorbells = (ctypes.c_uint64 * (DOORBELL_PAGE // 8))()
        self.event_page: Allocation | None = None
        self.events: dict[int, Event] = {}
        self.errors: list[str] = []
        # kernel entry address -> (code object, kernel info, image address, kernel descriptor bytes)
        self.code_objects: dict[int, tuple[Any, Any, int, bytes]] = {}
        self._images: list[tuple[int, bytes]] = []
        self.gpu = MockGPU(self)
        self.dispatches = 0  # kernels run
        self.copied = 0  # bytes moved by SDMA copies

    # --- files and sysfs --------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        if path not in (kfd.KFD_PATH, self.render_path):
            raise FileNotFoundError(errno.ENOENT, f"mock: no such device {path}")
        with self.lock:
            fd = self._next_fd
            self._next_fd += 1
            self.fds[fd] = path
            return fd

    def close(self, fd: int) -> None:
        with self.lock:
            if self.fds.pop(fd, None) is None:
                raise OSError(errno.EBADF, f"mock: fd {fd} is not open")
            if self.fds and kfd.KFD_PATH not in self.fds.values():
                self._shutdown()

    def _node_dir(self, n: int) -> str:
        return f"{kfd.TOPOLOGY}/{n}"

    def read_text(self, path: str) -> str:
        if path == f"{self._node_dir(0)}/gpu_id":
            return "0\n"
        if path == f"{self._node_dir(0)}/properties":
            return "cpu_cores_count 2\nsimd_count 0\n"
        if path == f"{self._node_dir(1)}/gpu_id":
            return f"{GPU_ID}\n"
        if path == f"{self._node_dir(1)}/properties":
            return "".join(f"{k} {v}\n" for k, v in self.properties.items())
        if path == f"{self._node_dir(1)}/name":
            return f"{self.arch}\n"
        raise FileNotFoundError(errno.ENOENT, f"mock: no such file {path}")

    def listdir(self, path: str) -> list[str]:
        if path == kfd.TOPOLOGY:
            return ["0", "1"]
        raise FileNotFoundError(errno.ENOENT, f"mock: no such directory {path}")

    def exists(self, path: str) -> bool:
        return path in (kfd.KFD_PATH, self.render_path, kfd.TOPOLOGY)

    def access(self, path: str, mode: int) -> bool:
        return self.exists(path)

    # --- memory maps --------------------------------------------------------------------------------
    def mmap(self, addr: int, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
        if size <= 0 or size % kfd.PAGE:
            raise OSError(errno.EINVAL, f"mock mmap: size {size} is not a positive multiple of the page size")
        if fd == -1:
            va = kfd.libc_mmap(addr, size, prot, flags, -1, 0)
            with self.lock:
                self.reservations[va] = size
            return va
        path = self.fds.get(fd)
        if path is None:
            raise OSError(errno.EBADF, f"mock mmap: fd {fd} is not open")
        with self.lock:
            if path == kfd.KFD_PATH:
                if offset & ~(DOORBELL_PAGE - 1) != DOORBELL_MMAP_BASE or size != DOORBELL_PAGE:
                    raise OSError(errno.EINVAL, f"mock mmap of /dev/kfd: offset 0x{offset:x} size {size} is not the "
                                                f"doorbell page (0x{DOORBELL_MMAP_BASE:x}, {DOORBELL_PAGE} bytes)")
                return ctypes.addressof(self.doorbells)
            alloc = next((a for a in self.allocs.values() if a.mmap_offset == offset), None)
            if alloc is None:
                raise OSError(errno.EINVAL, f"mock mmap of the render node: no allocation has mmap offset 0x{offset:x}")
            if not flags & kfd.MAP_FIXED or addr != alloc.va or size > alloc.size or not flags & kfd.MAP_SHARED:
                raise OSError(errno.EINVAL, f"mock mmap: allocation {alloc.handle} must be mapped MAP_SHARED|MAP_FIXED "
                                            f"at its GPU address 0x{alloc.va:x} (got 0x{addr:x}, {size} bytes)")
            if alloc.flags & kfd.MEM_VRAM and not alloc.flags & kfd.MEM_PUBLIC:
                raise OSError(errno.EINVAL, "mock mmap: VRAM allocated without KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC is not "
                                            "host-visible")
            return addr  # already real memory at that address (see _alloc)

    def munmap(self, addr: int, size: int) -> None:
        if addr == ctypes.addressof(self.doorbells):
            return
        with self.lock:
            if any(a.va < addr + size and addr < a.end for a in self.allocs.values()):
                raise OSError(errno.EBUSY, f"mock munmap of 0x{addr:x}: GPU memory still allocated there "
                                           f"(free it with AMDKFD_IOC_FREE_MEMORY_OF_GPU first)")
            self.reservations.pop(addr, None)
        kfd.libc_munmap(addr, size)

    def _reserved(self, va: int, size: int) -> bool:
        return any(r <= va and va + size <= r + s for r, s in self.reservations.items())

    def find(self, addr: int, size: int = 1) -> Allocation | None:
        """The GPU-mapped allocation holding ``[addr, addr + size)``, or None."""
        with self.lock:
            i = bisect.bisect_right(self._starts, addr) - 1
            if i < 0:
                return None
            a = self._by_start[self._starts[i]]
            return a if a.mapped and addr + size <= a.end else None

    def check(self, addr: int, size: int, what: str) -> None:
        """Fault unless ``[addr, addr + size)`` is memory mapped to the GPU."""
        if self.find(addr, max(size, 1)) is None:
            raise MockFault(f"GPU page fault: {what} at 0x{addr:x} ({size} bytes) is not in memory mapped to the GPU")

    # --- ioctls ------------------------------------------------------------------------------------
    def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
        path = self.fds.get(fd)
        if path is None:
            raise OSError(errno.EBADF, f"mock ioctl: fd {fd} is not open")
        name = kfd.IOCTL_NAMES.get(request)
        if path != kfd.KFD_PATH or name is None:
            raise OSError(errno.ENOTTY, f"mock ioctl: request 0x{request:x} is not a KFD ioctl on {path}")
        _, expected = kfd.IOCTLS[name]
        if type(arg) is not expected or (request >> 16) & 0x3FFF != ctypes.sizeof(arg):
            raise OSError(errno.EINVAL, f"mock ioctl {name}: argument of {ctypes.sizeof(arg)} bytes, "
                                        f"expected struct of {ctypes.sizeof(expected)}")
        with self.lock:
            getattr(self, f"_{name.lower()}")(arg)

    @staticmethod
    def _fail(err: int, why: str) -> OSError:
        return OSError(err, f"mock: {why}")

    def _gpu(self, gpu_id: int) -> None:
        if gpu_id != GPU_ID:
            raise self._fail(errno.EINVAL, f"gpu_id 0x{gpu_id:x} is not a GPU (the mock GPU is 0x{GPU_ID:x})")

    def _get_version(self, a: Any) -> None:
        a.major_version, a.minor_version = kfd.KFD_MAJOR, 14

    def _acquire_vm(self, a: Any) -> None:
        self._gpu(a.gpu_id)
        if self.fds.get(a.drm_fd) != self.render_path:
            raise self._fail(errno.EBADF, f"drm_fd {a.drm_fd} is not the GPU's render node {self.render_path}")
        if self.vm_fd is not None and self.vm_fd != a.drm_fd:
            raise self._fail(errno.EBUSY, "the VM was acquired through another render-node file")
        self.vm_fd = a.drm_fd

    def _alloc_memory_of_gpu(self, a: Any) -> None:
        self._gpu(a.gpu_id)
        if self.vm_fd is None:
            raise self._fail(errno.EINVAL, "allocation before AMDKFD_IOC_ACQUIRE_VM")
        kinds = a.flags & kfd.MEM_TYPES
        if kinds not in (kfd.MEM_VRAM, kfd.MEM_GTT, kfd.MEM_USERPTR):
            raise self._fail(errno.EINVAL, f"flags 0x{a.flags:x}: exactly one of VRAM, GTT, USERPTR is required")
        if a.size == 0 or a.size % kfd.PAGE or a.va_addr == 0 or a.va_addr % kfd.PAGE:
            raise self._fail(errno.EINVAL, f"va 0x{a.va_addr:x} size {a.size}: both must be non-zero page multiples")
        if any(x.va < a.va_addr + a.size and a.va_addr < x.end for x in self.allocs.values()):
            raise self._fail(errno.EINVAL, f"va range 0x{a.va_addr:x}+{a.size} overlaps an allocation")
        if kinds == kfd.MEM_VRAM and self.vram_used + a.size > self.properties["local_mem_size"]:
            raise self._fail(errno.ENOMEM, f"out of VRAM: {self.vram_used} of {self.properties['local_mem_size']} "
                                           f"bytes in use, {a.size} more asked")
        if kinds == kfd.MEM_USERPTR:
            if a.mmap_offset != a.va_addr:
                raise self._fail(errno.EINVAL, "userptr: the CPU address (mmap_offset) must equal va_addr here")
        elif not self._reserved(a.va_addr, a.size):
            raise self._fail(errno.EINVAL, f"va 0x{a.va_addr:x}+{a.size} is not an address range this process "
                                           f"reserved (mmap it PROT_NONE first)")
        else:  # back the GPU memory with host memory at the same address
            kfd.libc_mmap(a.va_addr, a.size, kfd.PROT_READ | kfd.PROT_WRITE,
                          kfd.MAP_PRIVATE | kfd.MAP_ANONYMOUS | kfd.MAP_FIXED, -1, 0)
        handle = self._next_handle
        self._next_handle += 1
        offset = a.mmap_offset if kinds == kfd.MEM_USERPTR else handle << 16
        self.allocs[handle] = alloc = Allocation(a.va_addr, a.size, a.flags, handle, offset)
        self.vram_used += a.size if kinds == kfd.MEM_VRAM else 0
        self._by_start[alloc.va] = alloc
        bisect.insort(self._starts, alloc.va)
        a.handle, a.mmap_offset = handle, offset

    def _handle(self, handle: int) -> Allocation:
        alloc = self.allocs.get(handle)
        if alloc is None:
            raise self._fail(errno.EINVAL, f"handle {handle} is not an allocation")
        return alloc

    def _free_memory_of_gpu(self, a: Any) -> None:
        alloc = self._handle(a.handle)
        if alloc.mapped:
            raise self._fail(errno.EBUSY, f"handle {a.handle} is still mapped to the GPU: unmap it first")
        if self.event_page is alloc:
            raise self._fail(errno.EBUSY, f"handle {a.handle} is the event page")
        del self.allocs[a.handle], self._by_start[alloc.va]
        self.vram_used -= alloc.size if alloc.flags & kfd.MEM_VRAM else 0
        self._starts.remove(alloc.va)

    def _device_ids(self, a: Any) -> None:
        if a.n_devices < 1 or a.n_success > a.n_devices or a.device_ids_array_ptr == 0:
            raise self._fail(errno.EINVAL, f"n_devices {a.n_devices}, n_success {a.n_success}, device array "
                                           f"0x{a.device_ids_array_ptr:x}")
        for i in range(a.n_devices):
            self._gpu(read_u32(a.device_ids_array_ptr + 4 * i))

    def _map_memory_to_gpu(self, a: Any) -> None:
        alloc = self._handle(a.handle)
        self._device_ids(a)
        alloc.mapped = True
        a.n_success = a.n_devices

    def _unmap_memory_from_gpu(self, a: Any) -> None:
        alloc = self._handle(a.handle)
        self._device_ids(a)
        if not alloc.mapped:
            raise self._fail(errno.EINVAL, f"handle {a.handle} is not mapped")
        alloc.mapped = False
        a.n_success = a.n_devices

    def _create_queue(self, a: Any) -> None:
        self._gpu(a.gpu_id)
        if a.queue_type not in (kfd.QUEUE_TYPE_COMPUTE, kfd.QUEUE_TYPE_SDMA):
            raise self._fail(errno.EINVAL, f"queue_type {a.queue_type}: the mock runs PM4 compute (0) and SDMA (1)")
        if a.ring_size < 1024 or a.ring_size & (a.ring_size - 1):
            raise self._fail(errno.EINVAL, f"ring_size {a.ring_size} is not a power of two >= 1024")
        if a.queue_percentage > kfd.MAX_QUEUE_PERCENTAGE or a.queue_priority > kfd.MAX_QUEUE_PRIORITY:
            raise self._fail(errno.EINVAL, f"queue percentage {a.queue_percentage} / priority {a.queue_priority}")
        for what, addr, size in (("ring", a.ring_base_address, a.ring_size),
                                 ("read pointer", a.read_pointer_address, 8),
                                 ("write pointer", a.write_pointer_address, 8)):
            if addr % 8 or self.find(addr, size) is None:
                raise self._fail(errno.EINVAL, f"{what} 0x{addr:x} is not 8-byte aligned memory mapped to the GPU")
        if a.queue_type == kfd.QUEUE_TYPE_COMPUTE:
            if a.eop_buffer_size == 0 or self.find(a.eop_buffer_address, a.eop_buffer_size) is None:
                raise self._fail(errno.EINVAL, f"EOP buffer 0x{a.eop_buffer_address:x}+{a.eop_buffer_size}")
            if (a.ctx_save_restore_size < a.ctl_stack_size or a.ctl_stack_size == 0
                    or self.find(a.ctx_save_restore_address, a.ctx_save_restore_size) is None):
                raise self._fail(errno.EINVAL, f"context save area 0x{a.ctx_save_restore_address:x}"
                                               f"+{a.ctx_save_restore_size} (control stack {a.ctl_stack_size})")
            want = (self.properties.get("ctl_stack_size"), self.properties.get("cwsr_size"))
            if want[0] is not None and (a.ctl_stack_size, a.ctx_save_restore_size) != want:
                raise self._fail(errno.EINVAL, f"control stack {a.ctl_stack_size} and context-save size "
                                               f"{a.ctx_save_restore_size} differ from the topology's {want}")
        qid = next(i for i in range(len(self.doorbells)) if i not in self.queues)
        q = MockQueue(qid, a.queue_type, a.ring_base_address, a.ring_size, a.read_pointer_address,
                      a.write_pointer_address, ctypes.addressof(self.doorbells) + 8 * qid)
        self.doorbells[qid] = 0
        q.thread = threading.Thread(target=self.gpu.run_queue, args=(q,), name=f"mock-kfd queue {qid}", daemon=True)
        self.queues[qid] = q
        a.queue_id, a.doorbell_offset = qid, DOORBELL_MMAP_BASE + 8 * qid
        q.thread.start()

    def _destroy_queue(self, a: Any) -> None:
        q = self.queues.pop(a.queue_id, None)
        if q is None:
            raise self._fail(errno.EINVAL, f"queue_id {a.queue_id} is not a queue")
        q.stop = True

    def _create_event(self, a: Any) -> None:
        if a.event_type != kfd.EVENT_SIGNAL:
            raise self._fail(errno.EINVAL, f"event_type {a.event_type}: the mock has signal events only")
        if self.event_page is None:
            page = self.allocs.get(a.event_page_offset)
            if page is None or page.size < kfd.SIGNAL_EVENT_LIMIT * 8:
                raise self._fail(errno.EINVAL, f"the first signal event needs the handle of an allocation of at least "
                                               f"{kfd.SIGNAL_EVENT_LIMIT * 8} bytes (event_page_offset "
                                               f"{a.event_page_offset})")
            self.event_page = page
            ctypes.memset(page.va, 0xFF, kfd.SIGNAL_EVENT_LIMIT * 8)  # every slot unsignaled
        slot = next((i for i in range(kfd.SIGNAL_EVENT_LIMIT) if i not in self.events), None)
        if slot is None:
            raise self._fail(errno.ENOSPC, "no free event slot")
        self.events[slot] = Event(slot, slot, bool(a.auto_reset))
        a.event_id = a.event_slot_index = a.event_trigger_data = slot

    def _destroy_event(self, a: Any) -> None:
        if self.events.pop(a.event_id, None) is None:
            raise self._fail(errno.EINVAL, f"event_id {a.event_id} is not an event")

    def _wait_events(self, a: Any) -> None:
        if a.num_events < 1 or a.events_ptr == 0:
            raise self._fail(errno.EINVAL, f"num_events {a.num_events}, events_ptr 0x{a.events_ptr:x}")
        data = (kfd.EventData * a.num_events).from_address(a.events_ptr)
        events = []
        for d in data:
            if d.event_id not in self.events:
                raise self._fail(errno.EINVAL, f"event_id {d.event_id} is not an event")
            events.append(self.events[d.event_id])
        deadline = time.monotonic() + a.timeout / 1000
        while True:
            done = [e for e in events if e.signaled]
            if (len(done) == len(events)) if a.wait_for_all else done:
                for e in done:
                    if e.auto_reset:
                        e.signaled = False
                a.wait_result = kfd.WAIT_RESULT_COMPLETE
                return
            left = deadline - time.monotonic()
            if left <= 0:
                a.wait_result = kfd.WAIT_RESULT_TIMEOUT
                return
            self.event_cond.wait(left)  # releases the lock while waiting

    def interrupt(self, ctxid: int) -> None:
        """What the driver does on an end-of-pipe / trap interrupt: set the event the context id names when its
        slot was written, else (gfx9 sends no id) every event whose slot was written."""
        with self.lock:
            page = self.event_page
            if page is None:
                return
            named = self.events.get(ctxid)
            if named is not None and self._take_slot(page, named):
                named.signaled = True
            else:
                for event in self.events.values():
                    if self._take_slot(page, event):
                        event.signaled = True
            self.event_cond.notify_all()

    @staticmethod
    def _take_slot(page: Allocation, event: Event) -> bool:
        slot = page.va + 8 * event.slot
        if read_u64(slot) == 0xFFFFFFFFFFFFFFFF:
            return False
        write_u64(slot, 0xFFFFFFFFFFFFFFFF)
        return True

    # --- the mock-only hook ---------------------------------------------------------------------
    def register_code_object(self, address: int, lib: bytes) -> None:
        """Remember that code object ``lib`` was copied to GPU address ``address`` (dispatches find it there)."""
        from ember_amd.elf import read_code_object

        co = read_code_object(lib)
        with self.lock:
            self._images.append((address, co.image))
            for info in co.kernels.values():
                desc = co.image[info.descriptor_offset:info.descriptor_offset + 64]
                entry = address + info.descriptor_offset + struct.unpack_from("<q", desc, 16)[0]
                self.code_objects[entry] = (co, info, address, desc)

    def _shutdown(self) -> None:
        for q in self.queues.values():
            q.stop = True
