"""Buffer: a typed, sized allocation on one device, allocated lazily and freed when dropped."""
from __future__ import annotations

from typing import Any

from ember.device.allocator import Allocator
from ember.device.contracts import BufferSpec
from ember.device.registry import Device
from ember.dtype import DType


class Buffer:
    """``size`` elements of ``dtype`` on ``device``. Memory is taken on first use.

    ``options`` (a :class:`~ember.device.BufferSpec`, ``None`` for ordinary device memory) is
    passed to the allocator's ``alloc`` and ``free``.
    """

    def __init__(self, device: str, size: int, dtype: DType, opaque: Any = None, options: BufferSpec | None = None):
        self.device, self.size, self.dtype = Device.canonicalize(device), size, dtype
        self.options = options
        self._buf: Any = opaque
        # memory handed in (a view into another buffer, a mapped file) is not ours to free
        self._owned = opaque is None

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def allocator(self) -> Allocator:
        """The allocator of this buffer's device."""
        return Device[self.device].allocator

    def is_allocated(self) -> bool:
        return self._buf is not None

    @property
    def opaque(self) -> Any:
        """The allocator's handle of this buffer's memory (allocating it first): what programs and graphs take."""
        return self.allocate()._buf

    def allocate(self) -> Buffer:
        """Take device memory now (idempotent)."""
        if self._buf is None:
            try:
                self._buf = self.allocator.alloc(self.nbytes, self.options)  # it keeps GlobalCounters.mem_used
            except MemoryError as e:  # say what did not fit, and where (the allocator's error is often bare)
                detail = f": {e}" if str(e) else ""
                raise MemoryError(f"cannot allocate {self.nbytes} bytes ({self.nbytes / 2 ** 30:.2f} GiB) on "
                                  f"{self.device} for {self.size} elements of {self.dtype}{detail}") from e
        return self

    def __del__(self) -> None:
        buf = getattr(self, "_buf", None)
        if buf is None or not getattr(self, "_owned", False):
            return
        if Device.finalized:  # at exit, after the devices were finalized: do not create them again
            return
        try:
            self.allocator.free(buf, self.nbytes, self.options)
        except Exception:  # interpreter shutdown: the allocator may already be gone
            pass

    def copyin(self, mv: memoryview) -> Buffer:
        """Copy host bytes into this buffer (allocating it if needed)."""
        mv = memoryview(mv).cast("B")
        if mv.nbytes != self.nbytes:
            raise ValueError(f"copyin of {mv.nbytes} bytes into a {self.nbytes}-byte buffer on {self.device}")
        self.allocate()
        if self.nbytes:
            self.allocator.copyin(self._buf, mv)
        return self

    def copyout(self, mv: memoryview) -> memoryview:
        """Copy this buffer's bytes into host memory ``mv`` and return it."""
        self.allocate()
        if not self.allocator.copyout_waits:
            Device[self.device].synchronize()
        if self.nbytes:
            self.allocator.copyout(memoryview(mv).cast("B"), self._buf)
        return mv

    def as_bytes(self) -> bytearray:
        """A host copy of the contents."""
        try:
            out = bytearray(self.nbytes)
        except MemoryError as e:  # Python's error names nothing
            raise MemoryError(f"cannot allocate {self.nbytes} bytes ({self.nbytes / 2 ** 30:.2f} GiB) of host memory "
                              f"to copy {self.size} elements of {self.dtype} from {self.device}") from e
        self.copyout(memoryview(out))
        return out

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.size} {self.dtype}{'' if self._buf is not None else ' (unallocated)'}>"
