"""Device memory allocators.

An allocator hands out *opaque* buffer handles: whatever object the device's runtime
understands (a host address wrapper, a ``CUdeviceptr``, a ``cl.Buffer`` ...). Core code
never looks inside a handle; it only passes it back to the same device's allocator and
programs.

Subclasses implement the raw operations ``_alloc`` and ``_free`` plus ``copyin`` and
``copyout``; the public ``alloc`` and ``free`` add argument checks and keep
``GlobalCounters.mem_used`` up to date. :class:`LRUAllocator` adds a cache of freed
buffers, which makes the allocate/free churn of a training loop nearly free.

``options`` is a :class:`~ember.device.BufferSpec` (host-visible, uncached, CPU access) or
``None`` for ordinary device memory.
"""
from __future__ import annotations

import abc
from collections import defaultdict
from typing import Any

from ember.device.contracts import BufferSpec
from ember.helpers import DEBUG, GlobalCounters, getenv


def copyin_source(src: Any, dest_nbytes: int) -> memoryview:
    """``src`` as a contiguous memoryview, checked to fit a buffer of ``dest_nbytes`` (for ``copyin``)."""
    view = _contiguous(src)
    if view.nbytes > dest_nbytes:
        raise ValueError(f"copyin of {view.nbytes} bytes into a buffer of {dest_nbytes} bytes")
    return view


def copyout_dest(dest: Any, src_nbytes: int) -> memoryview:
    """``dest`` as a writable contiguous memoryview, checked to fit in a buffer of ``src_nbytes`` (for ``copyout``)."""
    view = _contiguous(dest)
    if view.readonly:
        raise ValueError("copyout needs a writable memoryview")
    if view.nbytes > src_nbytes:
        raise ValueError(f"copyout of {view.nbytes} bytes from a buffer of {src_nbytes} bytes")
    return view


def _check_options(options: object) -> None:
    if options is not None and not isinstance(options, BufferSpec):
        raise TypeError(f"buffer options must be an ember.device.BufferSpec or None, got {options!r}")


def _contiguous(mem: Any) -> memoryview:
    view = memoryview(mem)
    if not view.c_contiguous:
        raise ValueError("device copies need a C-contiguous memoryview")
    return view


class Allocator(abc.ABC):
    """Allocate, free and copy device buffers.

    Required: ``_alloc``, ``_free``, ``copyin``, ``copyout``. Optional (raise
    ``NotImplementedError`` unless the device supports them): ``as_buffer``, ``transfer``,
    ``offset``.

    ``device`` is the device object the allocator belongs to: :class:`~ember.device.Compiled`
    sets it when the device is built (an allocator may also set it itself, earlier).
    """

    #: the device object this allocator serves (a :class:`~ember.device.Compiled`, set by its ``__init__``
    #: when left ``None``); typed loosely so a plugin's allocator can use its own device class's attributes
    device: Any = None
    #: ``copyout`` itself waits for all work queued on the device before it (a blocking read on an in-order
    #: queue): :meth:`~ember.device.Buffer.copyout` then skips ``synchronize``, one wait for the driver instead of two
    copyout_waits: bool = False

    def alloc(self, nbytes: int, options: BufferSpec | None = None) -> Any:
        """Allocate ``nbytes`` bytes (0 is allowed) and return an opaque handle.

        ``options`` says what kind of memory (see :class:`~ember.device.BufferSpec`); ``None``
        means ordinary device memory. An allocator without a special kind ignores the flags.
        """
        _check_options(options)
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes!r} bytes: the size must be an int >= 0")
        opaque = self._alloc(nbytes, options)
        GlobalCounters.mem_used += nbytes
        return opaque

    def free(self, opaque: Any, nbytes: int, options: BufferSpec | None = None) -> None:
        """Give back a buffer from :meth:`alloc` with the same ``nbytes`` and ``options``.

        Views made by :meth:`offset` are never freed: they share their base's memory.
        """
        GlobalCounters.mem_used -= nbytes
        self._free(opaque, nbytes, options)

    @abc.abstractmethod
    def _alloc(self, nbytes: int, options: BufferSpec | None) -> Any:
        """Really allocate device memory; raise ``MemoryError`` (or the device's OOM error) on failure."""

    @abc.abstractmethod
    def _free(self, opaque: Any, nbytes: int, options: BufferSpec | None) -> None:
        """Really release device memory."""

    @abc.abstractmethod
    def copyin(self, dest: Any, src: memoryview) -> None:
        """Copy the bytes of the host memoryview ``src`` into the start of buffer ``dest``."""

    @abc.abstractmethod
    def copyout(self, dest: memoryview, src: Any) -> None:
        """Copy ``dest.nbytes`` bytes from the start of buffer ``src`` into the writable memoryview ``dest``."""

    def as_buffer(self, opaque: Any) -> memoryview:
        """A zero-copy host memoryview of the buffer (only for host-visible memory)."""
        raise NotImplementedError(f"{type(self).__name__} has no zero-copy host view; use copyout instead")

    def transfer(self, dest: Any, src: Any, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        """Copy the first ``nbytes`` of ``src`` (on ``src_dev``) into ``dest`` (on ``dest_dev``).

        Core calls it on the destination's allocator when both devices come from the same plugin
        (``CL`` and ``CL:1``, ``CUDA:0`` and ``CUDA:1``), after ``src_dev.synchronize()``; the
        devices are the device objects. Copy without a host round trip where the hardware can
        (peer copy, same context); raise ``NotImplementedError`` to let core copy through the host.
        """
        raise NotImplementedError(f"{type(self).__name__} has no direct transfer; copy through the host instead")

    def offset(self, opaque: Any, byte_offset: int, nbytes: int) -> Any:
        """A handle to ``nbytes`` bytes starting ``byte_offset`` into ``opaque``, sharing its memory.

        Core reads ranges through it (a copy out of a slice) and writes them (a multi-device gather copies each
        piece into its range of one buffer); raise ``NotImplementedError`` for a range the device cannot view.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support sub-buffers (offset views)")


class LRUAllocator(Allocator):
    """An allocator that keeps freed buffers and hands them out again for the same size and options.

    Set ``LRU=0`` in the environment to turn the cache off. When a real allocation fails
    with one of ``oom_errors`` the cache is emptied and the allocation retried once.
    """

    #: Exceptions that mean "out of device memory"; a device plugin adds its own.
    oom_errors: tuple[type[BaseException], ...] = (MemoryError,)

    def __init__(self) -> None:
        self.cache: defaultdict[tuple[int, BufferSpec | None], list[Any]] = defaultdict(list)
        self.cached_bytes = 0

    def alloc(self, nbytes: int, options: BufferSpec | None = None) -> Any:
        """Reuse a cached buffer of the same size and options, else allocate (freeing the cache on OOM)."""
        _check_options(options)
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes!r} bytes: the size must be an int >= 0")
        bucket = self.cache.get((nbytes, options))
        if bucket:
            opaque = bucket.pop()
            self.cached_bytes -= nbytes
        else:
            try:
                opaque = self._alloc(nbytes, options)
            except self.oom_errors:
                if not any(self.cache.values()):
                    raise
                if DEBUG >= 1:
                    print(f"{type(self).__name__}: allocation of {nbytes} bytes failed, freeing "
                          f"{self.cached_bytes} cached bytes and retrying")
                self.free_cache()
                opaque = self._alloc(nbytes, options)
        GlobalCounters.mem_used += nbytes
        return opaque

    def free(self, opaque: Any, nbytes: int, options: BufferSpec | None = None) -> None:
        """Keep the buffer for reuse (or release it at once when the cache is off)."""
        GlobalCounters.mem_used -= nbytes
        if getenv("LRU", 1):
            self.cache[(nbytes, options)].append(opaque)
            self.cached_bytes += nbytes
            return
        self._free(opaque, nbytes, options)

    def free_cache(self) -> None:
        """Really release every cached buffer."""
        for (nbytes, options), opaques in self.cache.items():
            for opaque in opaques:
                self._free(opaque, nbytes, options)
        self.cache.clear()
        self.cached_bytes = 0
