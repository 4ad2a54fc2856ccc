"""The typed contract between core and a device plugin: buffer options and the Protocols a plugin implements.

A device object (:class:`ember.device.Compiled`) holds five parts. Two are base classes with
shared machinery (:class:`~ember.device.Allocator` and :class:`~ember.device.Compiler`); the
other three are duck-typed and described here as Protocols, so a type checker can check a
plugin against them without the plugin inheriting anything:

* :class:`Renderer` -- capabilities and tuning policy core reads, plus ``render(name, uops) -> source``
  (``ember.renderer.Renderer`` is a ready base class that satisfies it);
* :class:`Program` -- a loaded kernel, made by ``device.runtime(name, binary)``;
* :class:`Graph` -- an optional batch of kernel calls replayed as one, made by
  ``device.graph(calls)``.

Optional capabilities are methods a device class may define: ``allreduce`` (see
:mod:`ember.device.collective`) and the three of :class:`NCCLMemory` (buffers NCCL can address).

Everything here is re-exported by :mod:`ember.device`; plugins import it from there.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ember.dtype import DType
    from ember.renderer import TensorCore


@dataclass(frozen=True)
class BufferSpec:
    """What kind of memory a buffer needs, passed as ``options`` to ``Allocator.alloc`` and ``free``.

    ``None`` (the default everywhere) means ordinary device memory. An allocator that has no
    special kind for a flag ignores it: on a host device every buffer is host-visible anyway.
    Buffers are only reused by the LRU cache for the same size *and* the same spec.

    Attributes:
        host_visible: the host reads or writes this memory directly (pinned / mapped memory that
            ``Allocator.as_buffer`` can return a view of), e.g. a staging buffer for copies.
        uncached: the device should not cache it (memory another device or the host polls,
            such as a signal or a ring buffer).
        cpu_access: the host will access it often and the device rarely: place it where the
            host is fast (for a discrete GPU, system memory rather than VRAM).
    """

    host_visible: bool = False
    uncached: bool = False
    cpu_access: bool = False

    def __post_init__(self) -> None:
        for name in ("host_visible", "uncached", "cpu_access"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"BufferSpec.{name} must be a bool, got {getattr(self, name)!r}")


@runtime_checkable
class Program(Protocol):
    """A loaded kernel, made by ``device.runtime(name, binary)``.

    Calling it launches the kernel on opaque buffers (from the device's allocator, in the order of
    the kernel's ``DEFINE_GLOBAL`` parameters) with the int variables ``vals`` (in ``DEFINE_VAR``
    order). ``global_size`` and ``local_size`` are the launch grid (innermost dimension first,
    three entries); loop-based devices ignore them; ``local_size=None`` lets the driver choose.
    It returns the elapsed seconds when ``wait`` is true (after the kernel finished), else
    ``None`` (the kernel may still be running; ``device.synchronize()`` waits for it).
    """

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None: ...


#: One kernel call of a :class:`Graph`: ``(program, bufs, vals, global_size, local_size)``.
GraphCall = tuple[Program, Sequence[Any], Sequence[int], tuple[int, ...], "tuple[int, ...] | None"]


@runtime_checkable
class Graph(Protocol):
    """A list of kernel calls captured once and replayed as one (a CUDA graph, a prebuilt queue, a C loop).

    Made by ``device.graph(calls)`` from a sequence of :data:`GraphCall`; the programs all come
    from the same device. A graph keeps its programs and buffers alive. Launch sizes matter only
    to grid devices. The engine's JIT replays a captured function through it, swapping inputs
    with :meth:`update_buffer` and symbolic values with :meth:`update_vals`.
    """

    def __call__(self, wait: bool = False) -> float | None:
        """Run every call in order; with ``wait``, wait for the last and return the elapsed seconds."""
        ...

    def update_buffer(self, call_index: int, buf_index: int, opaque: Any) -> None:
        """Make argument ``buf_index`` of call ``call_index`` the buffer ``opaque`` (same size or larger)."""
        ...

    def update_vals(self, call_index: int, vals: Sequence[int]) -> None:
        """Replace the int variables of call ``call_index``; ``ValueError`` when the count differs."""
        ...

    def __len__(self) -> int:
        """The number of calls."""
        ...


#: What ``device.graph`` is: a class (or any callable) that builds a :class:`Graph` from calls.
GraphFactory = Callable[[Sequence[GraphCall]], Graph]


@runtime_checkable
class Renderer(Protocol):
    """What core reads from a device's renderer: capabilities, tuning policy, and ``render``.

    ``ember.renderer.Renderer`` is the one definition of these fields: it declares each with its type, default
    and meaning, and a test checks that this Protocol lists exactly its fields (the two cannot drift). Codegen
    and the frontend ask the renderer, never a device name, what the target can do and what pays on it; every
    field is part of the lowering cache key. ``ember.renderer.CStyleRenderer`` is a C-family renderer to
    subclass.
    """

    # read-only (properties): core only reads them, and a renderer may narrow a type (``global_max = None``)
    # --- capabilities
    @property
    def device(self) -> str: ...
    @property
    def supported_dtypes(self) -> frozenset[Any]: ...
    @property
    def supports_float16(self) -> bool: ...
    @property
    def has_local(self) -> bool: ...
    @property
    def has_shared(self) -> bool: ...
    @property
    def global_max(self) -> tuple[int, ...] | None: ...
    @property
    def local_max(self) -> tuple[int, ...] | None: ...
    @property
    def max_threads_per_block(self) -> int | None: ...
    @property
    def shared_max(self) -> int: ...
    @property
    def parallel_threads(self) -> int: ...
    @property
    def parallel_min_work(self) -> int: ...
    @property
    def vector_floats(self) -> int: ...
    @property
    def vector_registers(self) -> int: ...
    @property
    def vector_max_tiles(self) -> bool: ...
    @property
    def vector_widths(self) -> dict[DType, tuple[int, ...]]: ...
    @property
    def vector_alu(self) -> frozenset: ...
    @property
    def epilogue_loop_min(self) -> int: ...
    @property
    def variant(self) -> str: ...
    @property
    def tensor_cores(self) -> tuple[TensorCore, ...]: ...

    # --- codegen policy: loop targets
    @property
    def max_tile_ops(self) -> int: ...
    @property
    def small_kernel_work(self) -> int: ...
    @property
    def small_kernel_tile(self) -> int: ...
    @property
    def tiny_kernel_work(self) -> int: ...
    @property
    def small_shared_tile(self) -> int: ...
    @property
    def thread_min_work(self) -> int: ...
    @property
    def wide_sum_min_work(self) -> int: ...
    @property
    def row_max_unroll(self) -> int: ...
    @property
    def transpose_min_size(self) -> int: ...
    @property
    def transpose_tile(self) -> tuple[int, int]: ...

    # --- codegen policy: work-group targets
    @property
    def group_max_outputs(self) -> int: ...
    @property
    def group_across_outputs(self) -> int: ...
    @property
    def group_min_reduce(self) -> int: ...
    @property
    def workgroup_max_items(self) -> int: ...

    # --- frontend policy: layout copies
    @property
    def matmul_copy_min_macs(self) -> int | None: ...
    @property
    def matmul_copy_min_dim(self) -> int: ...
    @property
    def matmul_copy_min_k_across(self) -> int: ...
    @property
    def matmul_copy_min_outputs_across(self) -> int: ...
    @property
    def conv_pad_copy_min(self) -> int | None: ...
    @property
    def conv_channels_last(self) -> bool: ...

    def render(self, name: str, uops: list[Any]) -> str:
        """The source of a kernel called ``name`` computing the linear program ``uops``."""
        ...

    def tensor_core_layout(self, tc: Any, operand: str, lane: Any, element: int) -> tuple[Any, Any]:
        """(row, col) of element ``element`` of ``operand`` that work-item ``lane`` of a ``tc`` instruction holds
        (only renderers that declare ``tensor_cores`` define it)."""
        ...


@runtime_checkable
class NCCLMemory(Protocol):
    """Optional: a device class whose buffers NCCL can address directly (the CUDA plugin's does).

    ``ember.distributed``'s nccl backend looks, among the usable device kinds, for a class defining all three
    and runs its collectives on those devices' buffers, in place. Core names no device: a plugin whose driver
    shares NCCL's address space and streams declares it here.
    """

    @classmethod
    def nccl_device_count(cls) -> int:
        """How many devices of this kind (``FOO``, ``FOO:1`` ...) NCCL can address in this process; called
        before any device is opened, after the kind's probe said it is usable."""
        ...

    def nccl_pointer(self, opaque: Any) -> int:
        """The device address of the opaque buffer ``opaque`` (from this device's allocator, a view included),
        as NCCL takes it."""
        ...

    def nccl_stream(self) -> int:
        """The handle of the stream NCCL should queue on (0: the default stream); work queued there runs after
        the kernels and copies this device has queued, so a collective reads what they wrote."""
        ...
