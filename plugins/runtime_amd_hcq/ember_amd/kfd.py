"""The KFD interface: ioctl argument structures, request numbers, flags, and the OS access object.

Written by hand from the Linux UAPI header ``include/uapi/linux/kfd_ioctl.h`` (the amdkfd
driver's user interface; struct layouts and numbers below follow it field for field). Only the
calls the AMD device makes are declared.

Every access the runtime makes to the operating system (open, close, ioctl, mmap, munmap, sysfs
reads) goes through one :class:`OSInterface` object, so the same runtime runs on the real
``/dev/kfd`` (:class:`RealOS`) or on :class:`ember_amd.mock_kfd.MockKFD`.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from dataclasses import dataclass
from typing import Protocol

KFD_PATH = "/dev/kfd"
TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"
#: the KFD ioctl ABI major version this runtime speaks (KFD_IOCTL_MAJOR_VERSION)
KFD_MAJOR = 1
PAGE = 4096

# --- mmap constants (Linux, x86-64 and arm64 alike) ---
PROT_NONE, PROT_READ, PROT_WRITE = 0, mmap.PROT_READ, mmap.PROT_WRITE
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS = mmap.MAP_SHARED, mmap.MAP_PRIVATE, mmap.MAP_ANONYMOUS
MAP_FIXED = 0x10
MAP_NORESERVE = 0x4000

# --- kfd_ioctl.h: queue types, event types and results, allocation flags ---
QUEUE_TYPE_COMPUTE, QUEUE_TYPE_SDMA, QUEUE_TYPE_COMPUTE_AQL = 0, 1, 2
MAX_QUEUE_PERCENTAGE, MAX_QUEUE_PRIORITY = 100, 15
EVENT_SIGNAL = 0
WAIT_RESULT_COMPLETE, WAIT_RESULT_TIMEOUT, WAIT_RESULT_FAIL = 0, 1, 2
SIGNAL_EVENT_LIMIT = 4096  # slots of 8 bytes in the event page
MEM_VRAM, MEM_GTT, MEM_USERPTR, MEM_DOORBELL = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MEM_WRITABLE, MEM_EXECUTABLE, MEM_PUBLIC, MEM_NO_SUBSTITUTE = 1 << 31, 1 << 30, 1 << 29, 1 << 28
MEM_AQL_QUEUE_MEM, MEM_COHERENT, MEM_UNCACHED = 1 << 27, 1 << 26, 1 << 25  # UNCACHED: header of Linux 5.x+
MEM_TYPES = MEM_VRAM | MEM_GTT | MEM_USERPTR | MEM_DOORBELL


class GetVersionArgs(ctypes.Structure):
    _fields_ = [("major_version", ctypes.c_uint32), ("minor_version", ctypes.c_uint32)]


class CreateQueueArgs(ctypes.Structure):
    _fields_ = [("ring_base_address", ctypes.c_uint64), ("write_pointer_address", ctypes.c_uint64),
                ("read_pointer_address", ctypes.c_uint64), ("doorbell_offset", ctypes.c_uint64),
                ("ring_size", ctypes.c_uint32), ("gpu_id", ctypes.c_uint32), ("queue_type", ctypes.c_uint32),
                ("queue_percentage", ctypes.c_uint32), ("queue_priority", ctypes.c_uint32),
                ("queue_id", ctypes.c_uint32), ("eop_buffer_address", ctypes.c_uint64),
                ("eop_buffer_size", ctypes.c_uint64), ("ctx_save_restore_address", ctypes.c_uint64),
                ("ctx_save_restore_size", ctypes.c_uint32), ("ctl_stack_size", ctypes.c_uint32)]


class DestroyQueueArgs(ctypes.Structure):
    _fields_ = [("queue_id", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class CreateEventArgs(ctypes.Structure):
    _fields_ = [("event_page_offset", ctypes.c_uint64), ("event_trigger_data", ctypes.c_uint32),
                ("event_type", ctypes.c_uint32), ("auto_reset", ctypes.c_uint32), ("node_id", ctypes.c_uint32),
                ("event_id", ctypes.c_uint32), ("event_slot_index", ctypes.c_uint32)]


class DestroyEventArgs(ctypes.Structure):
    _fields_ = [("event_id", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class EventData(ctypes.Structure):
    """``struct kfd_event_data``: a 32-byte exception union (unused for signal events), an extension pointer, the id."""

    _fields_ = [("exception_data", ctypes.c_uint8 * 32), ("kfd_event_data_ext", ctypes.c_uint64),
                ("event_id", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class WaitEventsArgs(ctypes.Structure):
    _fields_ = [("events_ptr", ctypes.c_uint64), ("num_events", ctypes.c_uint32), ("wait_for_all", ctypes.c_uint32),
                ("timeout", ctypes.c_uint32), ("wait_result", ctypes.c_uint32)]


class AcquireVMArgs(ctypes.Structure):
    _fields_ = [("drm_fd", ctypes.c_uint32), ("gpu_id", ctypes.c_uint32)]


class AllocMemoryArgs(ctypes.Structure):
    _fields_ = [("va_addr", ctypes.c_uint64), ("size", ctypes.c_uint64), ("handle", ctypes.c_uint64),
                ("mmap_offset", ctypes.c_uint64), ("gpu_id", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class FreeMemoryArgs(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_uint64)]


class MapMemoryArgs(ctypes.Structure):
    """``kfd_ioctl_map_memory_to_gpu_args``, also the unmap call's arguments."""

    _fields_ = [("handle", ctypes.c_uint64), ("device_ids_array_ptr", ctypes.c_uint64),
                ("n_devices", ctypes.c_uint32), ("n_success", ctypes.c_uint32)]


# _IOC encoding of asm-generic/ioctl.h: dir(2 bits) << 30 | size(14) << 16 | type(8) << 8 | nr(8)
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, nr: int, struct: type[ctypes.Structure]) -> int:
    return (direction << 30) | (ctypes.sizeof(struct) << 16) | (ord("K") << 8) | nr


#: name -> (request number, argument structure), as AMDKFD_IOC_<name> in kfd_ioctl.h
IOCTLS: dict[str, tuple[int, type[ctypes.Structure]]] = {
    "GET_VERSION": (_ioc(_IOC_READ, 0x01, GetVersionArgs), GetVersionArgs),
    "CREATE_QUEUE": (_ioc(_IOC_READ | _IOC_WRITE, 0x02, CreateQueueArgs), CreateQueueArgs),
    "DESTROY_QUEUE": (_ioc(_IOC_READ | _IOC_WRITE, 0x03, DestroyQueueArgs), DestroyQueueArgs),
    "CREATE_EVENT": (_ioc(_IOC_READ | _IOC_WRITE, 0x08, CreateEventArgs), CreateEventArgs),
    "DESTROY_EVENT": (_ioc(_IOC_WRITE, 0x09, DestroyEventArgs), DestroyEventArgs),
    "WAIT_EVENTS": (_ioc(_IOC_READ | _IOC_WRITE, 0x0C, WaitEventsArgs), WaitEventsArgs),
    "ACQUIRE_VM": (_ioc(_IOC_WRITE, 0x15, AcquireVMArgs), AcquireVMArgs),
    "ALLOC_MEMORY_OF_GPU": (_ioc(_IOC_READ | _IOC_WRITE, 0x16, AllocMemoryArgs), AllocMemoryArgs),
    "FREE_MEMORY_OF_GPU": (_ioc(_IOC_WRITE, 0x17, FreeMemoryArgs), FreeMemoryArgs),
    "MAP_MEMORY_TO_GPU": (_ioc(_IOC_READ | _IOC_WRITE, 0x18, MapMemoryArgs), MapMemoryArgs),
    "UNMAP_MEMORY_FROM_GPU": (_ioc(_IOC_READ | _IOC_WRITE, 0x19, MapMemoryArgs), MapMemoryArgs),
}
#: request number -> name, for error messages and the mock's dispatch
IOCTL_NAMES = {req: name for name, (req, _) in IOCTLS.items()}

#: what an errno means when a KFD ioctl returns it (from the driver's argument checks in amdkfd)
ERRNO_MEANING = {
    errno.EINVAL: "an argument was rejected (a size, flag, alignment, handle or id the driver does not accept)",
    errno.ENOMEM: "the driver could not allocate memory (GPU memory or its own bookkeeping is exhausted)",
    errno.EFAULT: "a pointer passed to the driver is not mapped in this process",
    errno.ENODEV: "no GPU with this gpu_id (or the device went away)",
    errno.EBADF: "a file descriptor is not open (the render node or /dev/kfd)",
    errno.EACCES: "permission denied: the user must be in the group owning /dev/kfd (usually render)",
    errno.EPERM: "operation not permitted for this process",
    errno.EBUSY: "the resource is in use (a VM acquired by another process, a queue still active)",
    errno.ENOSPC: "no free slot (too many queues or events)",
    errno.ENOTTY: "the driver does not know this ioctl (KFD older than this runtime expects)",
    errno.ETIME: "the wait timed out",
}


class KFDError(OSError):
    """A KFD ioctl failed: the message names the call, the errno and what it means."""


def kfd_error(name: str, err: int, detail: str = "") -> KFDError:
    """The error for ioctl AMDKFD_IOC_``name`` failing with ``err``."""
    meaning = ERRNO_MEANING.get(err, os.strerror(err))
    extra = f" ({detail})" if detail else ""
    return KFDError(err, f"AMDKFD_IOC_{name} failed: errno {err} {errno.errorcode.get(err, '?')}: {meaning}{extra}")


class OSInterface(Protocol):
    """What the runtime needs from the operating system; :class:`RealOS` and the mock implement it."""

    #: True for the mock (the probe and doctor lines say so)
    mock: bool

    def open(self, path: str, flags: int) -> int: ...
    def close(self, fd: int) -> None: ...
    def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
        """Issue ``request`` with ``arg`` (read and written in place); raise ``OSError`` with the errno."""
    def mmap(self, addr: int, size: int, prot: int, flags: int, fd: int, offset: int) -> int: ...
    def munmap(self, addr: int, size: int) -> None: ...
    def read_text(self, path: str) -> str: ...
    def listdir(self, path: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def access(self, path: str, mode: int) -> bool: ...
    def register_code_object(self, address: int, lib: bytes) -> None:
        """The one mock-only hook: a code object was copied to GPU address ``address`` (a no-op on real KFD,
        where the GPU runs the instructions; the mock needs the code object to run the kernel on the CPU)."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def libc_mmap(addr: int, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
    """``mmap(2)``; raises ``OSError`` with the errno on failure."""
    ptr = _libc.mmap(addr or None, size, prot, flags, fd, offset)
    if ptr is None or ptr == MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes (fd {fd}, offset 0x{offset:x}) failed: {os.strerror(err)}")
    return int(ptr)


def libc_munmap(addr: int, size: int) -> None:
    """``munmap(2)``; raises ``OSError`` with the errno on failure."""
    if _libc.munmap(addr, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap of {size} bytes at 0x{addr:x} failed: {os.strerror(err)}")


class RealOS:
    """The operating system itself: ``/dev/kfd``, the render node and sysfs."""

    mock = False

    def open(self, path: str, flags: int) -> int:
        return os.open(path, flags | os.O_CLOEXEC)

    def close(self, fd: int) -> None:
        os.close(fd)

    def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
        fcntl.ioctl(fd, request, arg, True)  # ctypes structures are writable buffers: the driver fills them in place

    def mmap(self, addr: int, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
        return libc_mmap(addr, size, prot, flags, fd, offset)

    def munmap(self, addr: int, size: int) -> None:
        libc_munmap(addr, size)

    def read_text(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def access(self, path: str, mode: int) -> bool:
        return os.access(path, mode)

    def register_code_object(self, address: int, lib: bytes) -> None:
        pass  # the GPU runs the uploaded instructions itself


def ioctl(osif: OSInterface, fd: int, name: str, **fields: int) -> ctypes.Structure:
    """Issue AMDKFD_IOC_``name`` with the given fields; return the structure as the driver left it.

    Raises :class:`KFDError` naming the call, the errno and its meaning.
    """
    request, struct = IOCTLS[name]
    arg = struct(**fields)
    try:
        osif.ioctl(fd, request, arg)
    except OSError as e:
        raise kfd_error(name, e.errno or errno.EIO, e.strerror or "") from e
    return arg


# --- topology: /sys/devices/virtual/kfd/kfd/topology/nodes/N/{gpu_id,properties,name} ---
@dataclass(frozen=True)
class GPUNode:
    """One GPU of the KFD topology."""

    node: int
    gpu_id: int
    properties: dict[str, int]

    @property
    def arch(self) -> str:
        """The gfx target (``gfx_target_version`` 110000 is gfx1100, 90402 gfx942)."""
        v = self.properties.get("gfx_target_version", 0)
        return f"gfx{v // 10000}{(v // 100) % 100:x}{v % 100:x}"

    @property
    def render_node(self) -> str:
        """The DRM render node the driver pairs with this GPU."""
        return f"/dev/dri/renderD{self.properties.get('drm_render_minor', 0)}"

    def prop(self, name: str, default: int = 0) -> int:
        """A topology property (``default`` when the kernel does not report it)."""
        return self.properties.get(name, default)


def parse_properties(text: str) -> dict[str, int]:
    """A topology ``properties`` file: one ``name value`` per line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def gpu_nodes(osif: OSInterface) -> list[GPUNode]:
    """The GPUs in the KFD topology, in node order (CPU nodes, whose gpu_id is 0, are skipped)."""
    if not osif.exists(TOPOLOGY):
        return []
    nodes = []
    for entry in sorted(osif.listdir(TOPOLOGY), key=lambda s: int(s) if s.isdigit() else 1 << 30):
        if not entry.isdigit():
            continue
        try:
            gpu_id = int(osif.read_text(f"{TOPOLOGY}/{entry}/gpu_id").strip() or 0)
        except (OSError, ValueError):
            continue
        if gpu_id == 0:
            continue
        props = parse_properties(osif.read_text(f"{TOPOLOGY}/{entry}/properties"))
        nodes.append(GPUNode(int(entry), gpu_id, props))
    return nodes
