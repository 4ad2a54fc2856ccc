"""Kernel optimizations as data: a list of :class:`Opt` reshapes a kernel's iteration space before lowering.

A kernel's *full shape* is the shape of the tensor its (first) reduction reads, or its output shape when it
has no reduction; the output has the same rank, with 1 on the reduced axes. An ``Opt(op, axis, arg)`` names
one axis of that full shape:

- ``UPCAST`` (output axis): each loop iteration computes ``arg`` neighbouring outputs (a register tile).
- ``UNROLL`` (reduce axis): each reduction step handles ``arg`` neighbouring elements.
- ``LOCAL`` (output axis, work-group targets): ``arg`` work-items of a group run along the axis.
- ``PADTO`` (output axis): the loop runs to the next multiple of ``arg``; the extra iterations store nothing,
  so a later UPCAST or LOCAL of a size that does not divide the axis becomes possible.
- ``THREAD`` (reduce axis of a full reduction, loop targets with several cores): the reduction is split into
  ``arg`` parts that run on different cores and are combined at the end.
- ``GROUP`` / ``GROUPTOP`` (reduce axis, targets with local memory): ``arg`` work-items of a group share
  the reduction. Each computes a partial result over its share (GROUP: interleaved, so neighbouring
  work-items read neighbouring elements; GROUPTOP: one contiguous block each), writes it to local memory,
  and after a barrier every work-item combines the ``arg`` partials; one of them stores the result. The
  group's work-items run along launch dimension 0; the output axes take the dimensions above it.
- ``TC`` (the reduce axis of a matmul; ``arg`` indexes the renderer's ``tensor_cores``): the matmul runs on
  tensor-core instructions, a group of work-items (a warp) per tile of outputs (see :mod:`ember.codegen.tc`).
  It is applied alone.

``arg`` 0 means "the whole remaining axis" for UPCAST and UNROLL. :func:`apply_opts` checks every opt in
order and returns the :class:`KernelPlan` the lowerer reads; a bad opt raises :class:`OptError` naming the
opt, the axis and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ember.codegen.access import KernelShape, full_shape, kernel_shape
from ember.codegen.matmul import match_matmul
from ember.codegen.tc import TCMatmul
from ember.dtype import DType
from ember.helpers import prod
from ember.ir.uop import Ops, UOp
from ember.renderer import Renderer, TensorCore

OPT_OPS = ("UPCAST", "UNROLL", "LOCAL", "GROUP", "GROUPTOP", "PADTO", "THREAD", "TC")
_OUTPUT_OPS = ("UPCAST", "LOCAL", "PADTO")
_REDUCE_OPS = ("UNROLL", "GROUP", "GROUPTOP")
#: opts this codegen can lower; the rest are checked and refused with a clear reason
_LOWERED = ("UPCAST", "UNROLL", "LOCAL", "PADTO", "THREAD", "GROUP", "GROUPTOP", "TC")
#: the largest register tile (outputs times unrolled reduce steps) an opt list may build
MAX_UPCAST = 1024


class OptError(ValueError):
    """An optimization that cannot be applied to a kernel (the message names the opt, the axis and why)."""


@dataclass(frozen=True)
class Opt:
    """One optimization: ``op`` (one of :data:`OPT_OPS`) on ``axis`` of the kernel's full shape with ``arg``."""

    op: str
    axis: int
    arg: int

    @property
    def amount(self) -> int:
        """``arg`` (the split factor for every op but TC, where it indexes the renderer's tensor cores)."""
        return self.arg

    def __repr__(self) -> str:
        return f"Opt({self.op}, {self.axis}, {self.arg})"


@dataclass
class KernelPlan:
    """What the lowerer needs from an opt list: per-axis factors, the padded sizes and the thread split."""

    full_shape: tuple[int, ...]
    reduce_axes: tuple[int, ...]
    opts: tuple[Opt, ...] = ()
    upcast: dict[int, int] = field(default_factory=dict)
    unroll: dict[int, int] = field(default_factory=dict)
    local: dict[int, int] = field(default_factory=dict)
    padded: dict[int, int] = field(default_factory=dict)
    thread: tuple[int, int] | None = None
    #: (reduce axis, work-items sharing it, whether each takes a contiguous block: GROUPTOP) or None
    group: tuple[int, int, bool] | None = None
    #: the tensor core and the matmul it computes (a TC opt), or None
    tc: tuple[TensorCore, TCMatmul] | None = None
    #: reduce axis -> the axis of the reduction's input it splits
    reduce_src: dict[int, int] = field(default_factory=dict)

    def src_split(self, src_axis: int, size: int) -> tuple[int, int]:
        """(unroll, threads) for axis ``src_axis`` (of extent ``size``) of a reduction's input."""
        for ax, s in self.reduce_src.items():
            if s == src_axis and self.full_shape[ax] == size:
                threads = self.thread[1] if self.thread is not None and self.thread[0] == ax else 1
                return self.unroll.get(ax, 1), threads
        return 1, 1

    def src_group(self, src_axis: int, size: int) -> tuple[int, bool] | None:
        """(work-items, top) when axis ``src_axis`` (of extent ``size``) of a reduction's input is grouped."""
        if self.group is None:
            return None
        ax, n, top = self.group
        return (n, top) if self.reduce_src.get(ax) == src_axis and self.full_shape[ax] == size else None

    def size(self, axis: int) -> int:
        """The loop extent of ``axis`` after padding."""
        return self.padded.get(axis, self.full_shape[axis])

    def remaining(self, axis: int) -> int:
        """What is left of ``axis`` to split after the opts applied so far."""
        left = self.size(axis) // self.upcast.get(axis, 1) // self.unroll.get(axis, 1) // self.local.get(axis, 1)
        if self.thread is not None and self.thread[0] == axis:
            left //= self.thread[1]
        if self.group is not None and self.group[0] == axis:
            left //= self.group[1]
        return left


def _reduce_ops(ast: UOp) -> set[Ops]:
    return {n.arg[0] for n in ast.toposort() if n.op is Ops.REDUCE_AXIS}


def launch_dim(plan: KernelPlan, axis: int, renderer: Renderer) -> int | None:
    """The launch dimension (0 = innermost) an output axis's loop gets on a grid target; None when the axis has
    no loop of its own (merged with others because the grid has too few dimensions, or fully upcast)."""
    dims = [i for i, d in enumerate(plan.full_shape)
            if i not in plan.reduce_axes and plan.size(i) // plan.upcast.get(i, 1) != 1]
    # a group's (or a tensor core's) work-items take launch dimension 0; the output loops the ones above it
    grouped = int(plan.group is not None or plan.tc is not None)
    limit = len(renderer.global_max) - grouped if renderer.global_max is not None else len(dims)
    # lower_ast merges the leading dims into one loop when there are more than the grid has
    ranges: list[int | None] = list(dims) if len(dims) <= limit else [None, *dims[len(dims) - limit + 1:]]
    if axis not in ranges:
        return None
    return len(ranges) - 1 - ranges.index(axis) + grouped


def _check(ok: bool, opt: Opt, why: str) -> None:
    if not ok:
        raise OptError(f"{opt.op} on axis {opt.axis} (arg {opt.arg}): {why}")


def apply_opts(ast: UOp, renderer: Renderer, opts: list[Opt] | tuple[Opt, ...]) -> KernelPlan:
    """Check ``opts`` in order against ``ast`` and ``renderer``; the plan the lowerer follows."""
    ks = kernel_shape(ast)
    shape, reduce_axes = ks.full_shape, ks.reduce_axes
    plan = KernelPlan(shape, reduce_axes, tuple(opts), reduce_src=dict(ks.reduce_src))
    for opt in opts:
        if not isinstance(opt, Opt) or opt.op not in OPT_OPS:
            raise OptError(f"unknown optimization {opt!r}; expected Opt(op, axis, arg) with op in {OPT_OPS}")
        _check(0 <= opt.axis < len(shape), opt, f"the kernel has {len(shape)} axes (full shape {shape})")
        _check(isinstance(opt.arg, int) and opt.arg >= 0, opt, "arg must be a non-negative int")
        axis, is_reduce = opt.axis, opt.axis in reduce_axes
        _check(isinstance(shape[axis], int), opt, "the axis's size depends on a variable (symbolic axes are not split)")
        if opt.op in _OUTPUT_OPS:
            _check(not is_reduce, opt, f"{opt.op} applies to output axes; axis {axis} is reduced")
        if opt.op in _REDUCE_OPS:
            _check(is_reduce, opt, f"{opt.op} applies to reduce axes; reduced axes are {list(reduce_axes)}")
        _check(opt.op in _LOWERED, opt, "not supported by this codegen yet")
        if opt.op == "PADTO":
            _check(opt.arg > 1, opt, "pad to a multiple of at least 2")
            _check(axis not in plan.padded and plan.remaining(axis) == shape[axis], opt,
                   "PADTO must come before any other opt on the axis, once")
            padded = -(-shape[axis] // opt.arg) * opt.arg
            _check(padded - shape[axis] < opt.arg and padded <= 2 * shape[axis], opt,
                   f"padding {shape[axis]} to {padded} would waste more than half the work")
            plan.padded[axis] = padded
            continue
        if opt.op == "TC":
            plan.tc = _check_tc(ast, renderer, plan, opt)
            continue
        left = plan.remaining(axis)
        amt = left if opt.arg == 0 and opt.op in ("UPCAST", "UNROLL") else opt.arg
        _check(amt > 1, opt, "the split factor must be at least 2")
        _check(left % amt == 0, opt, f"{amt} does not divide what is left of the axis ({left})")
        if opt.op in ("UPCAST", "UNROLL"):
            table = plan.upcast if opt.op == "UPCAST" else plan.unroll
            table[axis] = table.get(axis, 1) * amt
            tile = prod(plan.upcast.values()) * prod(plan.unroll.values())
            _check(tile <= MAX_UPCAST, opt, f"the register tile would hold {tile} values (at most {MAX_UPCAST})")
        elif opt.op == "LOCAL":
            _check(renderer.has_local and renderer.local_max is not None, opt,
                   f"{type(renderer).__name__} has no work-groups")
            _check(plan.upcast.get(axis, 1) == 1, opt, "LOCAL must come before UPCAST on the same axis")
            dim = launch_dim(plan, axis, renderer)
            _check(dim is not None and renderer.local_max is not None and dim < len(renderer.local_max), opt,
                   "the axis shares its launch dimension with others")
            assert dim is not None and renderer.local_max is not None
            size = plan.local.get(axis, 1) * amt
            _check(size <= renderer.local_max[dim], opt,
                   f"work-group size {size} exceeds the device's {renderer.local_max[dim]} in dimension {dim}")
            _check(prod(plan.local.values()) * amt <= prod(renderer.local_max), opt, "work-group too large")
            plan.local[axis] = size
        elif opt.op in ("GROUP", "GROUPTOP"):
            _check(renderer.has_shared and renderer.shared_max > 0, opt,
                   f"{type(renderer).__name__} has no local memory")
            _check(plan.group is None, opt, "only one GROUP or GROUPTOP per kernel")
            _check(plan.thread is None, opt, "a reduction split by THREAD cannot also be grouped")
            _check(renderer.global_max is None or len(renderer.global_max) >= 2 or not any(
                plan.size(i) > 1 for i in range(len(shape)) if i not in reduce_axes), opt,
                "the launch grid has no dimension left for the group")
            plan.group = (axis, amt, opt.op == "GROUPTOP")
            # the output loops move up a launch dimension: the LOCALs already applied must keep theirs
            for ax in plan.local:
                _check(launch_dim(plan, ax, renderer) is not None, opt,
                       f"the LOCAL axis {ax} would share its launch dimension with others")
        elif opt.op == "THREAD":
            _check(not renderer.has_local and renderer.parallel_threads > 1, opt,
                   f"{type(renderer).__name__} does not run loops on several cores")
            _check(plan.thread is None, opt, "only one THREAD opt per kernel")
            _check(is_reduce, opt, "output loops already run across cores; THREAD splits a full reduction")
            _check(all(d == 1 for i, d in enumerate(shape) if i not in reduce_axes), opt,
                   "THREAD needs a full reduction (one output)")
            _check(_reduce_ops(ast) <= {Ops.ADD, Ops.MAX, Ops.MUL} and len(_reduce_ops(ast)) == 1, opt,
                   "THREAD combines one ADD, MUL or MAX reduction")
            _check(not plan.unroll.get(axis) and not plan.upcast, opt, "THREAD must come before UNROLL")
            _check(amt <= 4 * renderer.parallel_threads, opt,
                   f"more parts than 4x the {renderer.parallel_threads} cores")
            plan.thread = (axis, amt)
    if plan.group is not None:
        _check_group(ast, renderer, plan)
    return plan


def _check_tc(ast: UOp, renderer: Renderer, plan: KernelPlan, opt: Opt) -> tuple[TensorCore, TCMatmul]:
    """The tensor core ``opt`` picks and the matmul it computes, or OptError."""
    tcs = renderer.tensor_cores
    _check(len(tcs) > 0, opt, f"{type(renderer).__name__} has no tensor cores")
    _check(opt.arg < len(tcs), opt, f"the renderer has {len(tcs)} tensor cores (arg indexes them)")
    _check(len(plan.opts) == 1, opt, "TC is applied alone")
    tc = tcs[opt.arg]
    mm = match_matmul(ast, tc)
    _check(not isinstance(mm, str), opt, f"{tc.name}: {mm}")
    assert isinstance(mm, TCMatmul)
    _check(opt.axis == mm.k, opt, f"TC names the reduce axis of the matmul ({mm.k})")
    shape = plan.full_shape
    for name, ax, d in (("M", mm.m, tc.dims[0]), ("N", mm.n, tc.dims[1]), ("K", mm.k, tc.dims[2])):
        _check(shape[ax] % d == 0, opt, f"{tc.name}: {name} (axis {ax}, {shape[ax]}) is not a multiple of {d}")
    _check(renderer.global_max is None or len(renderer.global_max) >= 2, opt,
           "the launch grid has no dimension left for the tensor core's work-items")
    _check(renderer.local_max is None or tc.threads <= renderer.local_max[0], opt,
           f"{tc.threads} work-items per instruction exceed the work-group limit {renderer.local_max}")
    try:
        renderer.tensor_core_layout(tc, "A", 0, 0)
    except NotImplementedError as e:
        _check(False, opt, str(e))
    return tc, mm


def _check_group(ast: UOp, renderer: Renderer, plan: KernelPlan) -> None:
    """What a GROUP needs of the whole opt list: the work-group fits the device and the partials fit local
    memory (one slot per work-item, per reduction, per upcast copy)."""
    assert plan.group is not None
    n = plan.group[1]
    opt = next(o for o in plan.opts if o.op in ("GROUP", "GROUPTOP"))
    for ax, size in plan.local.items():
        dim = launch_dim(plan, ax, renderer)
        _check(dim is not None, opt, f"the LOCAL axis {ax} would share its launch dimension with others")
        assert dim is not None
        _check(renderer.local_max is None or (dim < len(renderer.local_max) and size <= renderer.local_max[dim]),
               opt, f"the LOCAL axis {ax} moves to launch dimension {dim}, where its {size} work-items exceed "
                    f"the device's limit")
    items = prod(plan.local.values()) * n
    if renderer.local_max is not None:
        _check(n <= renderer.local_max[0], opt,
               f"work-group size {n} exceeds the device's {renderer.local_max[0]} in dimension 0")
        most = prod(renderer.local_max) if renderer.max_threads_per_block is None else \
            min(prod(renderer.local_max), renderer.max_threads_per_block)
        _check(items <= most, opt, f"the work-group would have {items} work-items, more than the device allows")
    reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE_AXIS]
    itemsize = max(u.dtype.itemsize for u in reduces if isinstance(u.dtype, DType))
    need = items * len(reduces) * prod(plan.upcast.values()) * max(4, itemsize)
    _check(need <= renderer.shared_max, opt,
           f"the partial results need {need} bytes of local memory, more than the device's {renderer.shared_max}")


def local_size(plan: KernelPlan, renderer: Renderer) -> tuple[int, int, int] | None:
    """The work-group size the LOCAL opts ask for, innermost launch dimension first (None: the driver picks)."""
    if plan.tc is not None:
        return (plan.tc[0].threads, 1, 1)
    if not plan.local and plan.group is None:
        return None
    out = [1, 1, 1]
    for axis, n in plan.local.items():
        dim = launch_dim(plan, axis, renderer)
        if dim is None:
            raise OptError(f"LOCAL on axis {axis} (arg {n}): a later opt left the axis without a loop of its own")
        out[dim] = n
    if plan.group is not None:
        out[0] = plan.group[1]
    return (out[0], out[1], out[2])


__all__ = ["Opt", "OptError", "KernelPlan", "KernelShape", "kernel_shape", "apply_opts", "full_shape", "launch_dim",
           "local_size", "OPT_OPS"]
