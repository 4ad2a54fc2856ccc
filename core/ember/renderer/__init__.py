"""Renderers turn a linear UOp program into source code for one kind of device.

A device plugin gives its :class:`Renderer` the capabilities and tuning policy core needs (vector widths,
local memory, thread limits, supported dtypes, tile sizes, layout-copy thresholds). Core asks the renderer,
never a device name.

This module is also the public facade for renderer authors: besides :class:`Renderer`,
:class:`TensorCore` and the C-family :class:`CStyleRenderer` (with its :data:`C_PREAMBLE`, and
:class:`BuiltinVectorRenderer` with :class:`VectorSyntax` for dialects with built-in vector types), it
re-exports the IR a renderer walks (:class:`UOp`, :class:`Ops`, :class:`GroupOp`,
:func:`toposort`, and :func:`split_terms` / :func:`term_coeff` to read an index as a sum of
``coefficient * variable`` terms) and the dtypes (:class:`DType`, :class:`PtrDType`,
:data:`dtypes`), and :func:`round_result` (with :data:`EXACT_OPS`) for targets that compute 16-bit floats in
float. Plugins import these from here, not from ``ember.ir.*`` submodules.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ember.dtype import DType, dtypes
from ember.ir.uop import UOp


@dataclass(frozen=True)
class TensorCore:
    """One matrix-multiply-accumulate instruction a target offers: ``D[M,N] = A[M,K] @ B[K,N] + C[M,N]``.

    A renderer lists what it has in :attr:`Renderer.tensor_cores`; codegen's ``TC`` opt picks one whose
    dtypes match a matmul and tiles the kernel by ``dims``. The instruction is cooperative: ``threads``
    work-items (a warp / SIMD group / wave) share one tile, each holding ``elements_per_thread`` values
    of A, B and C/D in registers
    (a target may hold copies: RDNA3 keeps A and B twice per wave), in the order its intrinsic expects.

    Fields:
        dims: (M, N, K) of one instruction.
        dtype_in: element type of A and B.
        dtype_out: element type of the accumulator C/D.
        threads: work-items that execute one instruction together.
        elements_per_thread: (A, B, C) values each work-item holds.
        intrinsic: the name the renderer emits (``"__builtin_amdgcn_wmma_f32_16x16x16_f16_w32"``,
            ``"mma.sync.aligned.m16n8k16"``, ``"simdgroup_multiply_accumulate"``); opaque to core.
        layout: free-form per-target description of which lane holds which element (the renderer
            interprets it; e.g. ``(("row", 2), ("col", 4))`` for the lane -> (row, col) bits); opaque to core.
    """

    dims: tuple[int, int, int]
    dtype_in: DType
    dtype_out: DType
    threads: int
    elements_per_thread: tuple[int, int, int]
    intrinsic: str = ""
    layout: tuple = ()

    def __post_init__(self) -> None:
        if len(self.dims) != 3 or any(d <= 0 for d in self.dims):
            raise ValueError(f"TensorCore dims must be three positive sizes (M, N, K), got {self.dims}")
        if self.threads <= 0:
            raise ValueError(f"TensorCore threads must be positive, got {self.threads}")
        m, n, k = self.dims
        a, b, c = self.elements_per_thread
        # at least one copy of each matrix across the threads (RDNA3 WMMA holds A and B twice)
        if a * self.threads < m * k or b * self.threads < k * n or c * self.threads < m * n:
            raise ValueError(f"TensorCore {self.dims} with {self.threads} threads cannot hold A, B and C "
                             f"with {self.elements_per_thread} elements of each per thread")

    @property
    def name(self) -> str:
        """``WMMA_M_N_K_in_out``: used in kernel names and DEBUG output."""
        m, n, k = self.dims
        return f"WMMA_{m}_{n}_{k}_{self.dtype_in.name}_{self.dtype_out.name}"


class DTypeSet(frozenset):
    """A frozen set of dtypes that also answers a call with a set of them, as tinygrad programs ask a renderer:
    ``dtypes.half in Device[Device.DEFAULT].renderer.supported_dtypes()``."""

    def __call__(self) -> set[DType]:
        return set(self)


class _DTypeSetField:
    """A renderer's ``supported_dtypes``: any set assigned to it (a plugin's, in its ``__init__``) is kept as a
    :class:`DTypeSet`."""

    def __init__(self, default: frozenset[DType]):
        self.default = DTypeSet(default)

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> DTypeSet:
        return self.default if obj is None else obj.__dict__.get(self.slot, self.default)

    def __set__(self, obj: Any, value: frozenset[DType] | set[DType]) -> None:
        obj.__dict__[self.slot] = DTypeSet(value)


class Renderer:
    """Capabilities and tuning policy of a target, plus ``render(name, uops) -> source``.

    This class is the one definition of what core asks of a device's renderer: every field below is declared
    here with its type and default, and :class:`ember.device.contracts.Renderer` (the Protocol plugins are
    checked against) lists the same names (a test fails when the two drift). Core reads no other attribute.
    A plugin sets the values that are right for its target as class attributes or in ``__init__``; every
    field is part of the lowering cache key.

    The fields come in three groups. *Capabilities* say what the target can do (dtypes, work-groups, local
    memory, launch limits, tensor cores). *Codegen policy* sizes the opts the heuristic picks (register tiles,
    unrolls, thread splits, work-group sizes): the defaults are the values the CPU plugin (gcc or clang, AVX2 /
    AVX-512 / NEON, a few cores) was tuned with; a work-group target uses only the ``group_*`` and
    ``workgroup_*`` ones. *Frontend policy* says which layout copies the Tensor frontend makes before a matmul
    or a convolution so that the kernel reads its operands contiguously where its register tile wants them; a
    copy is an extra kernel and buffer, so a target whose kernels do not gain from it sets ``None`` / ``False``.
    """

    # --- capabilities ---------------------------------------------------------------------------------------
    device: str = ""
    #: dtypes this target can load, store and compute with
    supported_dtypes = _DTypeSetField(frozenset(dtypes.fields().values()))
    #: whether the target computes float16 natively (else float16 storage is converted around float arithmetic)
    supports_float16: bool = True
    #: True when the target launches a grid of threads (GPU-style); False for loop-based targets
    has_local: bool = False
    #: True when work-groups have local (shared) memory: GROUP / GROUPTOP opts need it
    has_shared: bool = False
    #: the largest launch grid per dimension (innermost first), or None for a loop-based target
    global_max: tuple[int, ...] | None = None
    #: the largest work-group per dimension (innermost first), or None for a loop-based target
    local_max: tuple[int, ...] | None = None
    #: the most work-items one work-group may have over all its dimensions; None: ``prod(local_max)``
    max_threads_per_block: int | None = None
    #: bytes of local memory one work-group may use
    shared_max: int = 0
    #: how many host threads a loop-based target may split its outermost loop across
    parallel_threads: int = 1
    #: minimum estimated work (loop iterations) before a kernel is worth running in parallel
    parallel_min_work: int = 1 << 15
    #: float32 lanes per vector register and vector registers per core: register tiles are sized from
    #: them (see :func:`ember.codegen.heuristic.heuristic_opts`)
    vector_floats: int = 4
    vector_registers: int = 16
    #: whether the renderer keeps a register tile of a float max along a non-contiguous axis in an array it
    #: vectorizes, so the heuristic may make such a tile wider than the register file
    vector_max_tiles: bool = False
    #: the vector loads and stores the target spells natively: for each element dtype, the lane counts it has
    #: (see :mod:`ember.codegen.vectorize`); empty: every access stays scalar. A renderer that declares widths
    #: renders LOAD and STORE of ``dt.vec(n)``, VECTORIZE and GEP. Read only, never written in place.
    vector_widths: dict[DType, tuple[int, ...]] = {}
    #: the float ALU ops the target computes on those vectors (a subset of
    #: :data:`ember.codegen.vectorize.VECTOR_FLOAT_OPS`; a reduction by one of them accumulates in vectors too);
    #: empty: arithmetic stays scalar and reads the lanes of vector loads
    vector_alu: frozenset = frozenset()
    #: a fused epilogue of at least this many scalar stores (a register tile stored across its accumulator vectors,
    #: each lane through the same ops) is one loop over the accumulators kept in an array (see
    #: :mod:`ember.codegen.epilogue`); 0: epilogues stay unrolled
    epilogue_loop_min: int = 0
    #: anything else that changes the rendered source for the same UOps (a dialect option such as
    #: how float16 is emulated); part of every cache key, like the capabilities above
    variant: str = ""
    #: matrix-multiply instructions the target has (see :class:`TensorCore`); empty: none
    tensor_cores: tuple[TensorCore, ...] = ()

    # --- codegen policy: loop targets (see ember.codegen.heuristic) ----------------------------------------
    #: the most operations in the unrolled body of a tiled reduction loop (bounds the source a register tile
    #: makes, and so its compile time); BEAM tries no larger tiles either
    max_tile_ops: int = 1536
    #: a reduction kernel with fewer steps than ``small_kernel_work`` gets at most ``small_kernel_tile`` outputs
    #: per register tile: it runs briefly whatever its tile, while a wide tile's body costs compile time
    small_kernel_work: int = 1 << 22
    small_kernel_tile: int = 64
    #: a reduction kernel with fewer steps than this gets no register tile or unrolling
    tiny_kernel_work: int = 1 << 13
    #: outputs per axis of the square-ish tile of a small product along the reduce axis (``x @ w.T``)
    small_shared_tile: int = 2
    #: a full reduction smaller than this runs on one thread
    thread_min_work: int = 1 << 17
    #: a column sum over at least this many elements gets a tile row wider than the register file
    wide_sum_min_work: int = 1 << 22
    #: a max along a contiguous axis is unrolled this much (independent compare chains)
    row_max_unroll: int = 2
    #: an elementwise kernel with at least this many outputs that reads an input across the axis it stores
    #: along (a transposing copy) gets a tile of ``transpose_tile`` (along the loaded rows, along the stored
    #: rows) outputs
    transpose_min_size: int = 1 << 14
    transpose_tile: tuple[int, int] = (8, 2)

    # --- codegen policy: work-group targets ---------------------------------------------------------------
    #: a reduction with fewer outputs than this shares each reduction among a group's work-items (GROUP);
    #: one that reads across rows (a column sum) is grouped up to ``group_across_outputs`` outputs
    group_max_outputs: int = 1024
    group_across_outputs: int = 16384
    #: the shortest reduce axis worth grouping
    group_min_reduce: int = 256
    #: the most work-items the heuristic gives one work-group
    workgroup_max_items: int = 256

    # --- frontend policy: layout copies (see ember.frontend.linalg and ember.frontend.conv) -----------------
    #: a matmul with at least this many multiply-adds (per batch element) whose operands pair badly for a
    #: register tile gets one operand copied into a layout that pairs well; None: never copied
    matmul_copy_min_macs: int | None = 1 << 21
    #: ... only when both output dims are at least this long
    matmul_copy_min_dim: int = 64
    #: operands both contiguous along their output axes are copied only for a reduction at least this long
    #: with at least ``matmul_copy_min_outputs_across`` outputs
    matmul_copy_min_k_across: int = 1024
    matmul_copy_min_outputs_across: int = 1 << 17
    #: a convolution input with at least this many elements (padded) is padded into a buffer of its own, so
    #: the convolution reads it ungated; None: the padding stays in the convolution's kernel
    conv_pad_copy_min: int | None = 1 << 16
    #: whether such a copied input is stored channels-last (the convolution then tiles along channels)
    conv_channels_last: bool = True

    def render(self, name: str, uops: list[UOp]) -> str:
        """Render the linear program ``uops`` as the source of a kernel called ``name``.

        The work is done by :meth:`render_program` on :meth:`for_kernel`'s per-kernel copy of this renderer:
        whatever a render records while it walks the kernel (names of values, open loops, register tiles) is
        that copy's and goes with it. A device's renderer is shared by every kernel and every thread, so state
        left on it would name nodes of a kernel long gone (a hash-consed node dies with its kernel, and an equal
        one made later is another object) or be overwritten by a render in another thread."""
        return self.for_kernel().render_program(name, uops)

    def for_kernel(self) -> Renderer:
        """A copy of this renderer for rendering one kernel: the capabilities are shared (never written while
        rendering), the attributes a render sets belong to the copy."""
        return copy.copy(self)

    def render_program(self, name: str, uops: list[UOp]) -> str:
        """Render ``uops`` (called on a per-kernel copy, see :meth:`render`); dialects implement this, or
        override :meth:`render` itself when they keep no state while rendering."""
        raise NotImplementedError(f"{type(self).__name__} does not implement render()")

    def tensor_core_layout(self, tc: TensorCore, operand: str, lane: Any, element: int) -> tuple[Any, Any]:
        """(row, col) of element ``element`` of ``operand`` (``"A"``, ``"B"`` or ``"C"``, the latter also D) that
        work-item ``lane`` of a ``tc`` instruction holds. ``lane`` is an int or an index UOp: only ``+``, ``*``,
        ``//`` and ``%`` by ints may be applied to it. Renderers that declare :attr:`tensor_cores` define it."""
        raise NotImplementedError(f"{type(self).__name__} does not say where its tensor cores' elements live")


# The facade for renderer authors (see the module docstring). Imported last: cstyle subclasses Renderer.
from ember.dtype import PtrDType  # noqa: E402
from ember.ir.symbolic import split_terms, term_coeff  # noqa: E402
from ember.ir.uop import GroupOp, Ops, toposort  # noqa: E402
from ember.renderer.cstyle import C_PREAMBLE, BuiltinVectorRenderer, CStyleRenderer, VectorSyntax  # noqa: E402
from ember.renderer.rounding import EXACT_OPS, ROUND_FNS, round_result  # noqa: E402

__all__ = ["C_PREAMBLE", "BuiltinVectorRenderer", "CStyleRenderer", "DType", "EXACT_OPS", "GroupOp", "Ops", "PtrDType",
           "ROUND_FNS", "Renderer", "TensorCore", "UOp", "VectorSyntax", "dtypes", "round_result", "split_terms",
           "term_coeff", "toposort"]
