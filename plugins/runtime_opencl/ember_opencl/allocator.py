"""Device memory for the CL device: ``cl.Buffer`` objects, host copies (small uploads queued), sub-buffer views."""
from __future__ import annotations

from typing import Any

from ember.device import LRUAllocator, copyin_source, copyout_dest
from ember_opencl.platforms import import_pyopencl

#: host-to-device copies up to this many bytes are queued without waiting (larger ones block)
QUEUED_COPYIN_MAX = 1 << 16


class CLBuffer:
    """An opaque CL buffer handle.

    ``mem`` is the ``pyopencl.Buffer`` kernels receive and ``nbytes`` the usable size (a 0-byte
    buffer is backed by 1 byte: OpenCL has no empty buffers). An offset view keeps its
    ``root`` buffer alive and remembers where it starts in it (``offset``).
    """

    __slots__ = ("mem", "nbytes", "offset", "root")

    def __init__(self, mem: Any, nbytes: int, root: CLBuffer | None = None, offset: int = 0):
        self.mem, self.nbytes, self.root, self.offset = mem, nbytes, root, offset

    def __repr__(self) -> str:
        view = f" at offset {self.offset}" if self.root is not None else ""
        return f"<CLBuffer {self.nbytes} bytes{view}>"


class CLAllocator(LRUAllocator):
    """Allocates ``cl.Buffer``s in ``device``'s context; copies run on its queue and block until done."""

    copyout_waits = True  # see copyout

    def __init__(self, device: Any):
        super().__init__()
        self.cl = import_pyopencl()
        self.device = device
        self.oom_errors = (MemoryError, self.cl.MemoryError)
        info = device.cl_device
        self.max_alloc = int(info.max_mem_alloc_size)
        #: sub-buffers must start at a multiple of this many bytes (CL_DEVICE_MEM_BASE_ADDR_ALIGN is in bits)
        self.offset_alignment = max(1, int(info.mem_base_addr_align) // 8)

    def _alloc(self, nbytes: int, options: Any) -> CLBuffer:
        if nbytes > self.max_alloc:
            raise MemoryError(f"{self.device.device}: a buffer of {nbytes} bytes is larger than the device's "
                              f"largest allocation ({self.max_alloc} bytes, CL_DEVICE_MAX_MEM_ALLOC_SIZE)")
        mem = self.cl.Buffer(self.device.context, self.cl.mem_flags.READ_WRITE, size=max(nbytes, 1))
        return CLBuffer(mem, nbytes)

    def _free(self, opaque: CLBuffer, nbytes: int, options: Any) -> None:
        # The cl.Buffer is released (clReleaseMemObject) when its last reference goes, which is now unless an
        # offset view or a graph still uses it. An explicit release() here would turn such a later use into a
        # crash of the process instead of keeping the memory alive until then.
        pass

    def copyin(self, dest: CLBuffer, src: memoryview) -> None:
        """Copy the host bytes ``src`` into the start of ``dest``; ``src`` may be reused as soon as this returns.

        A copy of at most :data:`QUEUED_COPYIN_MAX` bytes is queued from a private copy of ``src`` without
        waiting: the queue runs in order, so whatever is queued later (kernels, copies out) sees the new bytes,
        and a decoding step's token upload costs no round trip to the driver's threads. Larger copies block.
        """
        src = copyin_source(src, dest.nbytes)
        if not src.nbytes:
            return
        if src.nbytes > QUEUED_COPYIN_MAX:
            self.cl.enqueue_copy(self.device.queue, dest.mem, src, is_blocking=True)
            return
        event = self.cl.enqueue_copy(self.device.queue, dest.mem, bytes(src), is_blocking=False)
        # pyopencl waits for a copy when its event is dropped: the device keeps the event until it synchronizes
        self.device.keep_until_synchronized(event)

    def copyout(self, dest: memoryview, src: CLBuffer) -> None:
        """Fill the writable memoryview ``dest`` from the start of ``src``; returns after all queued work.

        The read is queued behind that work (the queue runs in order) rather than after a separate wait for
        it: the driver's thread that ends the last kernel goes on to the read, one hand-over fewer.
        """
        dest = copyout_dest(dest, src.nbytes)
        if dest.nbytes:
            self.cl.enqueue_copy(self.device.queue, dest, src.mem, is_blocking=True)
            self.device.release_finished()
        else:
            self.device.synchronize()

    def transfer(self, dest: CLBuffer, src: CLBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        """Copy ``nbytes`` from ``src`` (on ``src_dev``) to ``dest`` (on ``dest_dev``).

        Devices of one context copy on the device side; devices of different platforms copy
        through host memory. The devices are CL device objects or their names.
        """
        if nbytes > src.nbytes or nbytes > dest.nbytes:
            raise ValueError(f"transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
        if not nbytes:
            return
        src_dev, dest_dev = _device_object(src_dev), _device_object(dest_dev)
        if src_dev.context == dest_dev.context:
            src_dev.synchronize()  # the source's queue may still be writing it
            self.cl.enqueue_copy(dest_dev.queue, dest.mem, src.mem, byte_count=nbytes).wait()
            return
        staging = bytearray(nbytes)
        src_dev.allocator.copyout(memoryview(staging), src)
        dest_dev.allocator.copyin(dest, memoryview(staging))

    def offset(self, opaque: CLBuffer, byte_offset: int, nbytes: int) -> CLBuffer:
        """A sub-buffer of ``nbytes`` bytes at ``byte_offset`` in ``opaque``, sharing its memory.

        OpenCL only makes sub-buffers that start at a multiple of the device's base address
        alignment; any other offset raises ``NotImplementedError`` (the data must be copied instead).
        """
        if byte_offset < 0 or nbytes < 0 or byte_offset + nbytes > opaque.nbytes:
            raise ValueError(f"offset view [{byte_offset}, {byte_offset + nbytes}) is outside a buffer of "
                             f"{opaque.nbytes} bytes")
        root = opaque.root if opaque.root is not None else opaque  # no sub-buffers of sub-buffers in OpenCL
        start = opaque.offset + byte_offset
        if nbytes == 0:  # nothing to address: no sub-buffer needed, any offset will do
            return CLBuffer(root.mem, 0, root, start)
        if start % self.offset_alignment:
            raise NotImplementedError(f"{self.device.device}: an offset view must start at a multiple of "
                                      f"{self.offset_alignment} bytes (CL_DEVICE_MEM_BASE_ADDR_ALIGN); "
                                      f"byte {start} is not")
        if start == 0 and nbytes == root.nbytes:  # the whole buffer
            return CLBuffer(root.mem, nbytes, root, 0)
        return CLBuffer(root.mem.get_sub_region(start, nbytes), nbytes, root, start)


def _device_object(dev: Any) -> Any:
    """A CL device object from itself or its name."""
    if isinstance(dev, str):
        from ember.device import Device

        return Device[dev]
    return dev

