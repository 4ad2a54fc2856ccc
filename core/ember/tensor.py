"""The Tensor frontend: a PyTorch/tinygrad-like API that only builds lazy graph nodes.

Nothing executes until ``realize()``/``numpy()``/``item()``: then the scheduler cuts the
graph into kernels and the engine runs them on the tensor's device.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ember.autograd import ALU_RULES, GradFn, Rule, backward_targets, run_backward, toposort_tape
from ember.device.registry import Device
from ember.dtype import (
    DType,
    bf16_to_f32,
    dtypes,
    f32_to_bf16,
    from_np_dtype,
    least_upper_dtype,
    result_type_scalar,
    scalar_from_bytes,
    to_dtype,
    to_np_dtype,
    truncate,
)
from ember.engine.realize import run_schedule
from ember.frontend import retain
from ember.frontend.activations import ActivationMixin
from ember.frontend.arithmetic import ArithmeticMixin
from ember.frontend.attention import AttentionMixin
from ember.frontend.bitwise import BitwiseMixin
from ember.frontend.casts import CastMixin
from ember.frontend.checks import flush as flush_checks
from ember.frontend.comparison import ComparisonMixin
from ember.frontend.conv import ConvMixin
from ember.frontend.creation import CreationMixin
from ember.frontend.elementwise import ElementwiseMixin
from ember.frontend.indexing import IndexingMixin
from ember.frontend.linalg import LinalgMixin
from ember.frontend.losses import LossMixin
from ember.frontend.movement import MovementMixin
from ember.frontend.multi import MultiMixin, canonical_devices
from ember.frontend.normalization import NormalizationMixin
from ember.frontend.pool import PoolMixin
from ember.frontend.reduce import ReduceMixin
from ember.frontend.resample import ResampleMixin
from ember.frontend.selection import SelectionMixin
from ember.frontend.sorting import SortingMixin
from ember.frontend.transcendental import TranscendentalMixin
from ember.frontend.util import (
    ArgumentError,
    Scalar,
    Shape,
    broadcast_shape,
    check_numel,
    dim_arg,
    make_const,
    shape_arg,
    size_arg,
)
from ember.helpers import TRAINING, is_int_like, is_np_array, is_np_scalar, prod
from ember.ir import guards
from ember.ir.lazy import base_of, buffer_view, buffers, device_of, new_buffer, shape_of
from ember.ir.shapetracker import ShapeTracker
from ember.ir.symbolic import Variable, sadd, sint_eval, sint_max, sint_of, sint_str, sprod, ssub, sym_le
from ember.ir.uop import Ops, UOp
from ember.schedule import create_schedule, mark_realized

if TYPE_CHECKING:
    import numpy as np
else:
    from ember.helpers import lazy_numpy as np


#: grad mode and training mode, per thread and asyncio task (torch keeps its grad mode per thread): a new
#: thread starts with gradients recorded and training off, whatever the thread that started it has set.
#: Training mode is the TRAINING knob's own variable, so ``Context(TRAINING=1)`` turns it on as in tinygrad.
_NO_GRAD: contextvars.ContextVar[bool] = contextvars.ContextVar("ember.no_grad", default=False)
_TRAINING: contextvars.ContextVar[Any] = TRAINING._var


def _keyword_arg(args: tuple[Any, ...], kw: dict[str, Any], name: str, op: str) -> tuple[Any, ...]:
    """The sizes or axes of a movement op given either as positional arguments or as the one keyword ``name``
    (tinygrad's ``reshape(shape=...)``, ``permute(order=...)``)."""
    if not kw:
        return args
    unknown = [k for k in kw if k != name]
    if unknown:
        raise TypeError(f"{op}() got an unexpected keyword argument {unknown[0]!r}")
    if args:
        raise TypeError(f"{op}() got multiple values for argument {name!r}")
    return (kw[name],)


class _TensorType(type):
    """Tensor's metaclass: ``Tensor.training`` and ``Tensor.no_grad`` read and set the running thread's modes.

    tinygrad programs set them as class attributes (``Tensor.training = True``); as properties of the metaclass
    that spelling keeps working, for the thread (or task) that runs it only."""

    @property
    def training(cls) -> bool:
        """Whether dropout and batch norm run in training mode in this thread (default False)."""
        return bool(_TRAINING.get())

    @training.setter
    def training(cls, mode: bool) -> None:
        _TRAINING.set(int(bool(mode)))

    @property
    def no_grad(cls) -> bool:
        """Whether ops skip recording gradients in this thread (default False)."""
        return _NO_GRAD.get()

    @no_grad.setter
    def no_grad(cls, off: bool) -> None:
        _NO_GRAD.set(bool(off))


class Tensor(CreationMixin, ElementwiseMixin, ArithmeticMixin, ComparisonMixin, BitwiseMixin, TranscendentalMixin,
             ActivationMixin, CastMixin, ReduceMixin, MovementMixin, IndexingMixin, LinalgMixin, ConvMixin, PoolMixin,
             ResampleMixin, NormalizationMixin, AttentionMixin, LossMixin, SortingMixin, SelectionMixin, MultiMixin,
             metaclass=_TensorType):
    """An n-dimensional array on a device, with lazy evaluation.

    ``Tensor(data, device=None, dtype=None, requires_grad=None)`` accepts Python scalars,
    (nested) lists and tuples, numpy arrays, ``bytes`` (as uint8) and graph nodes. Python ints
    become the default int (int32, as in tinygrad; int64 when a value needs it), floats float32.

    ``requires_grad`` follows tinygrad: None ("not decided", the default) lets ``gradient()`` and
    ``backward()`` differentiate the tensor, True marks it trainable, False excludes it.
    """

    __slots__ = ("lazydata", "requires_grad", "grad", "_ctx", "__weakref__")
    __hash__ = object.__hash__  # __eq__ builds a tensor, so hash by identity
    # read through an instance (``t.training``) too; set them on the class (``Tensor.training = True``)
    training = property(lambda self: bool(_TRAINING.get()), doc="Whether this thread is in training mode.")
    no_grad = property(lambda self: _NO_GRAD.get(), doc="Whether this thread records no gradients.")
    _seed: int = 0

    def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None,
                 requires_grad: bool | None = None):
        if requires_grad:  # build it, then refuse a gradient for integers and bools, as torch does
            Tensor.__init__(self, data, device, dtype)
            if self.dtype.kind != "f":
                raise RuntimeError(f"Only Tensors of floating point dtype can require gradients, got {self.dtype}")
            self.requires_grad = True
            return
        # a graph node or a tensor has its device: the default device (a lock and an environment read) is
        # looked up only for data that needs one (ops build a tensor from a UOp thousands of times per step)
        dev = _device(device) if device is not None or not isinstance(data, (UOp, Tensor)) else ""
        dt = to_dtype(dtype) if dtype is not None else None
        self.grad: Tensor | None = None
        self.requires_grad = requires_grad
        self._ctx: Any = None
        if isinstance(data, UOp):
            self.lazydata = data
            if dt is not None and data.dtype != dt:
                self.lazydata = (data.cast(dt) if data.op is not Ops.CONST
                                 else UOp(Ops.CONST, dt, data.src, truncate(dt, data.arg)))
            return
        if isinstance(data, Tensor):
            self.lazydata = (data.to(dev) if device is not None else data).lazydata
            if dt is not None:
                self.lazydata = Tensor(self.lazydata).cast(dt).lazydata
            return
        if isinstance(data, (bool, int, float)):
            self.lazydata = make_const(data, dt or dtypes.from_py(data), dev)
            return
        if is_np_scalar(data):
            self.lazydata = make_const(data.item(), dt or from_np_dtype(data.dtype), dev)
            return
        if isinstance(data, (bytes, bytearray, memoryview)):
            arr = np.frombuffer(bytes(data), dtype=np.uint8)
            dt = dt or dtypes.uint8
        elif isinstance(data, (list, tuple)):
            dt = dt or dtypes.from_py(data)
            try:
                arr = np.array(data, dtype=np.float64 if dt.kind == "f" else to_np_dtype(dt) if dt != dtypes.bfloat16
                               else np.float32)
            except OverflowError as e:  # torch: a value that does not fit the dtype is a RuntimeError
                raise RuntimeError(f"value cannot be converted to type {dt.name} without overflow ({e})") from e
            except ValueError as e:
                raise ValueError(f"cannot build a {dt} tensor from {type(data).__name__}: {e}") from e
            except TypeError as e:  # None or another object where an int is expected
                raise TypeError(f"cannot build a {dt} tensor from {type(data).__name__}: {e}") from e
            if arr.dtype.kind == "f" and arr.size and np.isnan(arr).any() and (at := _none_at(data)) is not None:
                # numpy reads None as nan for a float array: refuse it, as torch does, rather than invent a value
                raise ArgumentError(f"Could not infer dtype of NoneType: the data holds None at index {at}")
        elif is_np_array(data):
            arr = data
            if dt is None:
                dt = from_np_dtype(arr.dtype)
        elif data is None:
            arr = np.zeros((0,), np.float32)
            dt = dt or dtypes.default_float
        else:
            raise TypeError(f"can't create a Tensor from {type(data).__name__}")
        self.lazydata = _from_numpy(arr, dt, dev)

    # --- properties ----------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return shape_of(self.lazydata)

    @property
    def dtype(self) -> DType:
        return self.lazydata.value_dtype

    @property
    def device(self) -> str:
        return device_of(self.lazydata)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        """Number of elements (a symbolic int when a size depends on a variable)."""
        return sprod(self.shape)  # type: ignore[return-value]

    def size(self, dim: int | None = None) -> Shape | int:
        """The shape, or the size of one dimension."""
        return self.shape if dim is None else self.shape[self._axis(dim)]

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    def __repr__(self) -> str:
        shape = _shape_str(self.shape) if _symbolic_shape(self.shape) else self.shape
        return f"<Tensor {shape} {self.dtype} on {self.device}>"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # --- realization and data out -----------------------------------------------------------
    @staticmethod
    def realize_all(*tensors: Tensor) -> None:
        """Realize several tensors with one schedule (shared work runs once)."""
        roots = [t.lazydata for t in tensors]
        schedule, becomes = create_schedule(roots)
        run_schedule(schedule)
        mark_realized(becomes)
        for t in tensors:
            t.lazydata = becomes[t.lazydata] if t.lazydata in becomes else t.lazydata
            if t.requires_grad is None:  # as in tinygrad, gradients of unmarked graphs stop at a realized tensor,
                t._ctx = None  # so a loop realizing its weights each step keeps no chain of earlier steps

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and ``others``) now; returns self."""
        Tensor.realize_all(self, *others)
        return self

    def schedule(self, *others: Tensor) -> list[Any]:
        """The ScheduleItems that realizing would run (nothing runs)."""
        return create_schedule([t.lazydata for t in (self, *others)])[0]

    @staticmethod
    def _from_host(data: Any, dt: DType, shape: tuple[int, ...], device: str | None) -> UOp:
        """The graph node of a new buffer on ``device`` holding ``data``'s bytes (``dt``'s elements, row-major)."""
        return _from_host_bytes(data, dt, shape, _device(device))

    def _buffer(self) -> Any:
        """The realized contiguous Buffer holding exactly this tensor's elements."""
        if isinstance(self.device, tuple):  # gathered onto the first device
            return self.to(self.device[0])._buffer()
        x = self.lazydata
        if x.op is Ops.BUFFER or (x.op is Ops.VIEW and x.src[0].op is Ops.BUFFER and x.arg.contiguous
                                  and x.arg.size == x.src[0].arg[2]):
            return buffers[base_of(x)]
        # a computed base realizes straight into a contiguous buffer; a view needs a copy kernel
        t = Tensor(x if x.op is not Ops.VIEW else UOp(Ops.CONTIGUOUS, x.dtype, (x,))).realize()
        if x.op is not Ops.VIEW:
            self.lazydata = t.lazydata
            if x.op is Ops.ASSIGN:  # written into a view of its buffer: that view may need a copy
                return self._buffer()
        return buffers[base_of(t.lazydata)]

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values (bfloat16 comes back as float32).

        Reading is when pending index checks run (:mod:`ember.frontend.checks`): a bad index raises here."""
        flush_checks(self)
        if _symbolic_shape(self.shape):
            return self._numpy_symbolic()
        if self.numel() == 0:
            return np.zeros(self.shape, dtype=np.float32 if self.dtype == dtypes.bfloat16 else to_np_dtype(self.dtype))
        buf = self._buffer()
        try:
            raw: np.ndarray = np.frombuffer(buf.as_bytes(), dtype=to_np_dtype(self.dtype))
        except MemoryError as e:
            raise MemoryError(f"{e} (reading a tensor of shape {self.shape})") from e
        if self.dtype == dtypes.bfloat16:
            raw = bf16_to_f32(raw)
        return raw.reshape(self.shape).copy()

    def _numpy_symbolic(self) -> np.ndarray:
        """numpy() of a tensor with symbolic sizes: its values at the sizes its variables are bound to (the
        realized buffer is sized for the variables' maxima; the elements lie row-major at its start)."""
        shape = tuple(sint_eval(s) for s in self.shape)
        npdt = np.float32 if self.dtype == dtypes.bfloat16 else to_np_dtype(self.dtype)
        if prod(shape) == 0:
            return np.zeros(shape, dtype=npdt)
        x = self.lazydata
        if not (x.op is Ops.VIEW and x.src[0].op is Ops.BUFFER and x.arg.contiguous):
            x = self.contiguous().realize().lazydata
        raw: np.ndarray = np.frombuffer(buffers[base_of(x)].as_bytes(), dtype=to_np_dtype(self.dtype))[:prod(shape)]
        if self.dtype == dtypes.bfloat16:
            raw = bf16_to_f32(raw)
        return raw.reshape(shape).copy()

    def tolist(self) -> Any:
        """Nested Python lists (a scalar for 0-d tensors)."""
        return self.numpy().tolist()

    def item(self) -> Scalar:
        """The single value of a one-element tensor as a Python scalar."""
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
        if _symbolic_shape(self.shape):
            return self.numpy().reshape(()).item()
        flush_checks(self)  # as numpy() does: a pending bad index raises here
        return scalar_from_bytes(self.dtype, self._buffer().as_bytes())

    def data(self) -> memoryview:
        return memoryview(self.numpy())

    def to(self, device: str | tuple[str, ...] | None) -> Tensor:
        """This tensor on ``device`` (a lazy copy; the same tensor when already there); a tuple of devices
        shards or replicates it (see :meth:`shard`)."""
        dev = _device(device)
        if dev == self.device:
            return self
        if isinstance(dev, tuple) or isinstance(self.device, tuple):
            return self._to_multi(dev)
        Device[dev]  # fail now, naming the device, rather than at realize time
        x = self.lazydata
        if base_of(x).op is Ops.CONST:
            return Tensor(_retarget_const(x, dev))
        src_dev = self.device
        out = Tensor(UOp(Ops.COPY, x.dtype, (x, UOp(Ops.DEVICE, None, (), dev))))
        return out._record((self,), lambda g, o, p: (g.to(src_dev),), "copy")

    def contiguous(self) -> Tensor:
        """A tensor whose elements are laid out row-major in their own buffer."""
        x = self.lazydata
        if x.op is Ops.BUFFER or (x.op is Ops.VIEW and x.src[0].op is Ops.BUFFER and x.arg.contiguous
                                  and sint_max(x.arg.size) == x.src[0].arg[2]):  # (symbolic: sized for the max)
            return self
        return Tensor(UOp(Ops.CONTIGUOUS, x.dtype, (x,)))._record((self,), lambda g, o, p: (g,), "contiguous")

    def contiguous_backward(self) -> Tensor:
        """The same values; in the backward pass the incoming gradient is made contiguous (as in tinygrad)."""
        return Tensor(self.lazydata)._record((self,), lambda g, o, p: (g.contiguous(),), "contiguous_backward")

    def replace(self, x: Tensor) -> Tensor:
        """Give this tensor ``x``'s data, dtype and device (same shape), dropping its history; returns self.

        Unlike :meth:`assign` nothing is cast or written in place: self simply becomes a new leaf
        holding ``x``'s value (tinygrad's ``replace``).
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"replace() takes a Tensor, got {type(x).__name__}")
        if x.shape != self.shape:
            raise RuntimeError(f"replace: the new value's shape {x.shape} does not match the tensor's shape "
                               f"{self.shape}")
        self.lazydata, self._ctx = x.lazydata, None
        return self

    def detach(self) -> Tensor:
        """The same values with no gradient history."""
        return Tensor(self.lazydata, requires_grad=False)

    def clone(self) -> Tensor:
        """A copy in its own buffer."""
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.lazydata,)))._record((self,), lambda g, o, p: (g,), "clone")

    # --- in-place updates -------------------------------------------------------------
    def assign(self, x: Tensor | Scalar) -> Tensor:
        """Write a new value into this tensor (same shape; cast to its dtype, moved to its device); returns self.

        When the tensor lives in a buffer (or a view of one) the value is written into that buffer
        in place when realized, like tinygrad: views made earlier and anything computed from the
        buffer afterwards see the new value, and a jitted step can update its parameters. A tensor
        that is still lazy math (no buffer yet) simply takes the new value.
        """
        if not isinstance(x, Tensor):
            x = Tensor.full(self.shape, x, dtype=self.dtype, device=self.device)
        if x.shape != self.shape:
            x = x._broadcast_to(broadcast_shape(self.shape, x.shape)) if x.ndim <= self.ndim else x
            if x.shape != self.shape:
                raise RuntimeError(f"assign: the value's shape {x.shape} does not match the tensor's shape "
                                   f"{self.shape}")
        if not _NO_GRAD.get() and self.requires_grad and self._ctx is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        x = x.to(self.device).cast(self.dtype)
        if x.lazydata is self.lazydata:
            return self
        if isinstance(self.device, tuple):
            return self._assign_multi(x)
        target, after = _assign_target(self.lazydata)
        in_place = _assignable(target)
        if x._ctx is not None:
            # the new history may mention self; point those edges at a tensor holding the old value
            # (a copy when the buffer is overwritten, so a later backward reads what was used)
            old = Tensor(self.lazydata, requires_grad=self.requires_grad)
            from ember.autograd import toposort_tape

            users = [t for t in toposort_tape(x) if t._ctx is not None and any(p is self for p in t._ctx.parents)]
            if users and in_place:
                old = Tensor(UOp(Ops.CONTIGUOUS, target.dtype, (target,)), requires_grad=self.requires_grad).realize()
            old._ctx = self._ctx
            for t in users:
                t._ctx.parents = tuple(old if p is self else p for p in t._ctx.parents)
        value = x.lazydata
        # every ASSIGN node is unique: two equal updates are two writes
        self.lazydata = (UOp(Ops.ASSIGN, target.dtype, (target, value, *after), next(_assign_ids)) if in_place
                         else value)
        self._ctx = x._ctx
        return self

    def __iadd__(self, y: Tensor | Scalar) -> Tensor:
        return self.assign(self + y)

    def __isub__(self, y: Tensor | Scalar) -> Tensor:
        return self.assign(self - y)

    def __imul__(self, y: Tensor | Scalar) -> Tensor:
        return self.assign(self * y)

    def __itruediv__(self, y: Tensor | Scalar) -> Tensor:
        return self.assign(self / y)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and self.dtype.kind != "f":
            raise RuntimeError(f"only Tensors of floating point dtype can require gradients, got {self.dtype}")
        self.requires_grad = requires_grad
        return self

    @property
    def is_param(self) -> bool:
        """tinygrad's name for "an optimizer given this tensor trains it": ``requires_grad`` is not False."""
        return self.requires_grad is not False

    @is_param.setter
    def is_param(self, is_param: bool) -> None:
        if not is_param:
            self.requires_grad = False
        elif self.requires_grad is False:
            self.requires_grad = None

    def is_param_(self, is_param: bool = True) -> Tensor:
        """tinygrad's marker: ``is_param_(False)`` makes a buffer (running statistics) that an optimizer realizes
        but never trains, as ``requires_grad_(False)`` does; ``is_param_(True)`` undoes it. Returns self."""
        self.is_param = is_param
        return self

    class train(contextlib.ContextDecorator):
        """``with Tensor.train():`` (or as a decorator) sets ``Tensor.training`` for dropout and norms, in the
        running thread (or asyncio task) only."""

        def __init__(self, mode: bool = True):
            self.mode = mode
            self._prev: list[Any] = []

        def _recreate_cm(self) -> Tensor.train:
            # a decorated function entering afresh on each call may run in several threads at once
            return Tensor.train(self.mode)

        def __enter__(self) -> None:
            self._prev.append(_TRAINING.get())
            _TRAINING.set(int(bool(self.mode)))

        def __exit__(self, *exc: object) -> None:
            _TRAINING.set(self._prev.pop())

    class test(train):
        """``with Tensor.test():`` evaluation mode (``Tensor.training = False``)."""

        def __init__(self) -> None:
            super().__init__(False)

        def _recreate_cm(self) -> Tensor.test:
            return Tensor.test()

    # --- autograd ------------------------------------------------------------------------
    def backward(self, gradient: Tensor | None = None, retain_graph: bool = False) -> Tensor:
        """Accumulate d(self)/d(leaf) into ``.grad`` of the float leaves of self's graph.

        Those are the leaves with ``requires_grad=True``; when no leaf is marked (tinygrad's default
        ``None``), every leaf not marked False. An optimizer marks its parameters True, so a
        training step fills only theirs. As in torch, a second backward through a node that needed
        saved values raises unless the first passed ``retain_graph=True`` (:mod:`ember.frontend.retain`).

        When nothing is marked (tinygrad's way) every float tensor of the graph gets its ``.grad``, not only
        the leaves, and a graph may be gone through again, as in tinygrad: ``w = w - w.grad * lr`` then trains
        the new ``w``. A ``.grad`` carries no gradient history (torch's ``backward`` without ``create_graph``;
        :meth:`gradient` gives differentiable gradients).
        """
        gradient = self._seed_gradient(gradient)
        order = toposort_tape(self)
        leaves = backward_targets(order)
        if not leaves:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        undecided = leaves[0].requires_grad is None  # backward_targets gives the marked leaves when there are any
        if undecided:
            leaves = [t for t in order if t.dtype.kind == "f" and t.requires_grad is None]
        else:
            retain.check_reusable(self)
        got = run_backward(self, gradient, leaves)
        for leaf in leaves:
            if id(leaf) in got:
                g = got[id(leaf)]
                leaf.grad = (g if leaf.grad is None else leaf.grad + g).detach()
        if not retain_graph and not undecided:
            retain.release(self)
        return self

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """d(self)/d(target) for each target, without touching ``.grad``.

        Any float tensor used to compute self can be a target, whether or not it was created with
        ``requires_grad=True`` (as in tinygrad); one created with ``requires_grad=False`` cannot.
        """
        gradient = self._seed_gradient(gradient)
        for i, t in enumerate(targets):
            if not isinstance(t, Tensor):
                raise TypeError(f"gradient(): target {i} is a {type(t).__name__}, not a Tensor")
            if t.dtype.kind != "f":
                raise RuntimeError(f"only float Tensors have a gradient; target {i} is {t.dtype}")
            if t.requires_grad is False:
                raise RuntimeError(f"One of the differentiated Tensors (index {i}) does not require grad: it was "
                                   f"created with requires_grad=False")
        got = run_backward(self, gradient, targets)
        missing = [i for i, t in enumerate(targets) if id(t) not in got]
        if missing:
            raise RuntimeError(f"One of the differentiated Tensors (index {missing[0]}) appears to not have been used "
                               f"in the graph")
        return [got[id(t)] for t in targets]

    def _seed_gradient(self, gradient: Tensor | None) -> Tensor:
        """The gradient of self to start from: ones for a one-element tensor, else the given one (same shape)."""
        if self.dtype.kind != "f":
            raise RuntimeError(f"only float Tensors have a gradient; this one is {self.dtype}")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            return Tensor.ones(*self.shape, dtype=self.dtype, device=self.device)
        if gradient.shape != self.shape:
            raise RuntimeError(f"Mismatch in shape: grad_output has a shape of {gradient.shape} and output has a shape "
                               f"of {self.shape}")
        return gradient

    # --- creation -----------------------------------------------------------------------
    @staticmethod
    def _shape_arg(shape: Sequence[Any]) -> Shape:
        """A shape argument's sizes: ints, or symbolic ints where a size is a bound Variable."""
        if _symbolic_arg(shape):  # sizes that are bound Variables (or expressions of them) stay symbolic
            flat = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
            out = tuple(sint_of(s) if _is_symbolic_int(s) else shape_arg((s,))[0] for s in flat)
            check_numel(out)
            return out  # type: ignore[return-value]
        return shape_arg(shape)

    @staticmethod
    def full(shape: Shape | int, fill_value: Scalar, dtype: DType | str | None = None, device: str | None = None,
             **kwargs: Any) -> Tensor:
        """A tensor of ``shape`` filled with ``fill_value``."""
        shp = Tensor._shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
        if fill_value is None or isinstance(fill_value, (str, bytes)):
            raise TypeError(f"fill_value must be a number, got {type(fill_value).__name__} {fill_value!r}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        numeric = isinstance(fill_value, (int, float)) or (is_np_scalar(fill_value)
                                                             and isinstance(fill_value, np.number))
        if dt.kind in "iu" and numeric and math.isfinite(fill_value):
            info = np.iinfo(to_np_dtype(dt))
            low = -info.max if dt.kind == "u" else info.min  # torch lets a negative wrap into an unsigned type
            if not low <= fill_value <= info.max:  # torch refuses to wrap a constant (300 -> int8 would be 44)
                raise RuntimeError(f"value cannot be converted to type {info.dtype.name} without overflow: "
                                   f"{fill_value}")
        if isinstance(device, tuple):  # replicated on several devices, as tinygrad does
            return Tensor(Tensor.full(shp, fill_value, dt, device[0]).to(device).lazydata, **kwargs)
        dev = _device(device)
        c = Tensor(make_const(fill_value, dt, dev))
        if shp:
            c = c.reshape((1,) * len(shp)).expand(shp)
        return Tensor(c.lazydata, **kwargs)  # a fresh leaf, so requires_grad=True gets a .grad

    @staticmethod
    def zeros(*shape: Any, **kwargs: Any) -> Tensor:
        """A tensor of zeros (float32 unless ``dtype`` is given)."""
        kwargs.setdefault("dtype", dtypes.default_float)
        return Tensor.full(Tensor._shape_arg(shape), 0, **kwargs)

    @staticmethod
    def ones(*shape: Any, **kwargs: Any) -> Tensor:
        """A tensor of ones (float32 unless ``dtype`` is given)."""
        kwargs.setdefault("dtype", dtypes.default_float)
        return Tensor.full(Tensor._shape_arg(shape), 1, **kwargs)

    @staticmethod
    def empty(*shape: Any, dtype: DType | str | None = None, device: str | None = None, **kwargs: Any) -> Tensor:
        """An uninitialized tensor (its own buffer, contents unspecified)."""
        shp = Tensor._shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if isinstance(device, tuple):  # one buffer on each device
            return Tensor(Tensor.empty(*shp, dtype=dt, device=device[0]).to(device).lazydata, **kwargs)
        dev = _device(device)
        return Tensor(buffer_view(new_buffer(dev, sint_max(sprod(shp)), dt), shp), **kwargs)

    # --- movement ------------------------------------------------------------------------
    def _axis(self, ax: int, ndim: int | None = None, what: str = "dim") -> int:
        ax = dim_arg(ax, what)
        nd = self.ndim if ndim is None else ndim
        lo, hi = (-1, 0) if nd == 0 else (-nd, nd - 1)
        if not lo <= ax <= hi:
            raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {ax})")
        return ax + nd if ax < 0 else ax

    def _view(self, fn: Callable[[ShapeTracker], ShapeTracker], backward: Callable[[Tensor], Tensor]) -> Tensor:
        x = self.lazydata
        if type(device_of(x)) is tuple:
            return self._multi_view(fn, backward)
        base, st = (x.src[0], x.arg) if x.op is Ops.VIEW else (x, ShapeTracker.from_shape(shape_of(x)))
        new = fn(st)
        check_numel(new.shape)
        if new.contiguous and new.shape == shape_of(base):
            out = Tensor(base)
        else:
            out = Tensor(UOp(Ops.VIEW, x.dtype, (base,), new))
        return out._record((self,), lambda g, o, p: (backward(g),), "view")

    def _record(self, parents: tuple[Tensor, ...], rule: Rule, name: str = "") -> Tensor:
        """Remember how self was made when a parent may need a gradient (and grad mode is on).

        self's ``requires_grad`` follows tinygrad: True if a parent's is, else None if a parent's is
        None, else False (all parents excluded, so self is too).
        """
        if _NO_GRAD.get():
            return self
        flags = [p.requires_grad for p in parents]
        if any(f is not False for f in flags):
            self._ctx = GradFn(parents, rule, name)
            self.requires_grad = True if any(flags) else None
        else:
            self.requires_grad = False
        return self

    def reshape(self, *shape: Any, **kw: Any) -> Tensor:
        """Same elements, new shape (one dimension may be -1); ``reshape(shape=...)`` too, as in tinygrad."""
        shape = _keyword_arg(shape, kw, "shape", "reshape")
        shp = list(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
        if (none_at := next((i for i, s in enumerate(shp) if s is None), None)) is not None \
                and (len(shp) == 1 or none_at >= self.ndim):
            # None keeps the size of the same dimension, among other sizes; reshape(None) has no shape
            raise TypeError(f"reshape: shape entry {none_at} is None in {tuple(shp)}: give a size, or None only among "
                            f"other sizes to keep one of the {self.ndim} dimensions of {self.shape}")
        if _symbolic_arg(shp) or _symbolic_shape(self.shape):
            return self._reshape_symbolic(shp)
        shp = [size_arg(s, "reshape size") if s is not None else self.shape[i] for i, s in enumerate(shp)]
        if shp.count(-1) > 1:
            raise ArgumentError(f"only one dimension can be inferred, got shape {tuple(shp)}")
        bad = [(i, s) for i, s in enumerate(shp) if s < -1]
        if bad:
            raise ArgumentError(f"invalid shape dimension {bad[0][1]} at index {bad[0][0]} of shape {tuple(shp)}")
        if -1 in shp:
            known = prod(s for s in shp if s != -1)
            if known == 0 or self.numel() % known:
                raise ArgumentError(f"shape '{list(shp)}' is invalid for input of size {self.numel()}")
            shp[shp.index(-1)] = self.numel() // known
        if prod(shp) != self.numel():
            raise ArgumentError(f"shape '{list(shp)}' is invalid for input of size {self.numel()}")
        new = tuple(shp)
        old = self.shape
        return self if new == old else self._view(lambda st: st.reshape(new), lambda g: g.reshape(old))

    def _reshape_symbolic(self, shp: list[Any]) -> Tensor:
        """reshape where a size is symbolic (a bound Variable or an expression of one), in the new shape or the
        old. The element counts must be the same expression, or the old count a plain int equal to the new
        one's value at its variables' bindings (``x.reshape(v, 4)`` of a (7, 4) tensor with ``v`` bound to 7)."""
        new = tuple(self.shape[i] if s is None else sint_of(s) if _is_symbolic_int(s) else size_arg(s, "reshape size")
                    for i, s in enumerate(shp))
        if any(isinstance(s, int) and s < 0 for s in new):
            raise ArgumentError(f"reshape to {_shape_str(new)}: -1 and negative sizes are not supported with "
                                "symbolic sizes; give every size")
        old, count = self.shape, self.numel()
        got = sprod(new)
        if got != count:  # (symbolic sizes: equal expressions are one node)
            same_value = isinstance(count, int) and sint_eval(got) == count
            if not same_value or _symbolic_shape(old):
                raise ArgumentError(f"cannot reshape {_shape_str(old)} to {_shape_str(new)}: the element counts "
                                    f"{sint_str(count)} and {sint_str(got)} differ for some value of the variables")
        return self if new == old else self._reshape_unchecked(new)

    def _reshape_unchecked(self, new: tuple[Any, ...]) -> Tensor:
        """reshape to ``new`` whose element count was checked (the gradient goes back the same way: a size
        made symbolic becomes the plain size again)."""
        old = self.shape
        return self._view(lambda st: st.reshape(new), lambda g: g._reshape_unchecked(old))

    def view(self, *shape: Any, **kw: Any) -> Tensor:
        """reshape (``view(shape=...)`` too)."""
        return self.reshape(*_keyword_arg(shape, kw, "shape", "view"))

    def permute(self, *order: Any, **kw: Any) -> Tensor:
        """Reorder dimensions (``permute(order=...)`` too)."""
        order = _keyword_arg(order, kw, "order", "permute")
        o = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else tuple(order)
        o = tuple(self._axis(a) for a in o)
        if sorted(o) != list(range(self.ndim)):
            raise ArgumentError(f"permute order {o} is not a permutation of the {self.ndim} dims of {self.shape}")
        inv = tuple(sorted(range(len(o)), key=o.__getitem__))
        return self if o == tuple(range(self.ndim)) else self._view(lambda st: st.permute(o), lambda g: g.permute(inv))

    def expand(self, *shape: Any, **kw: Any) -> Tensor:
        """Broadcast size-1 dimensions to ``shape`` (-1 keeps a size; ``expand(shape=...)`` too)."""
        shape = _keyword_arg(shape, kw, "shape", "expand")
        shp = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if len(shp) < self.ndim:
            raise ArgumentError(f"expand: the number of sizes provided ({len(shp)}) must be >= the number of "
                                f"dimensions of the tensor ({self.ndim})")
        lead = len(shp) - self.ndim
        shp = tuple(sint_of(n) if _is_symbolic_int(n) else n for n in shp)
        if any(not isinstance(n, UOp) and size_arg(n, "expand size") < (0 if i < lead else -1)
               for i, n in enumerate(shp)):
            raise ArgumentError(f"expand: invalid size in {tuple(shp)} (sizes must be >= 0, or -1 to keep an "
                                f"existing dimension) for a tensor of shape {self.shape}")
        x = self.reshape((1,) * lead + self.shape) if lead else self
        new = tuple(s if n == -1 else n for s, n in zip(x.shape, shp))
        for s, n in zip(x.shape, new):
            if s != n and s != 1:
                raise ArgumentError(f"expand: the expanded size {sint_str(n)} must match the existing size "
                                    f"{sint_str(s)} of shape {_shape_str(self.shape)} (target {_shape_str(shp)})")
        axes = tuple(i for i, (s, n) in enumerate(zip(x.shape, new)) if s != n)
        return x if new == x.shape else x._view(lambda st: st.expand(new), lambda g: g.sum(axes, keepdim=True))

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: Scalar = 0.0) -> Tensor:
        """Pad with ``value`` (or reflect/replicate/circular ``mode``).

        ``padding`` is per-dim ``((before, after), ...)`` or torch's flat form (last dim first).
        """
        if mode != "constant":
            return self._pad_mode(padding, mode)
        if _symbolic_arg(padding) or _symbolic_shape(self.shape):
            return self._pad_symbolic(padding, value)
        if padding and not isinstance(padding[0], (tuple, list)) and padding[0] is not None:
            flat = [size_arg(p, "padding entry") for p in padding]
            if len(flat) % 2 or len(flat) // 2 > self.ndim:
                raise ArgumentError(f"padding {tuple(flat)} does not fit a tensor of {self.ndim} dims: it needs an "
                                    f"even number of entries, at most {2 * self.ndim}")
            pairs = [(0, 0)] * (self.ndim - len(flat) // 2) + [(flat[i], flat[i + 1]) for i in
                                                                range(len(flat) - 2, -1, -2)]
        else:
            if len(padding) != self.ndim or any(p is not None and len(p) != 2 for p in padding):
                raise ArgumentError(f"padding {tuple(padding)} needs one (before, after) pair or None per dim of a "
                                    f"tensor of {self.ndim} dims")
            pairs = [(0, 0) if p is None else (size_arg(p[0], "padding"), size_arg(p[1], "padding")) for p in padding]
        if all(b == 0 and a == 0 for b, a in pairs):
            return self
        x = self
        if any(b < 0 or a < 0 for b, a in pairs):  # negative padding crops
            for (b, a), s in zip(pairs, x.shape):
                if s + min(b, 0) + min(a, 0) < 0:
                    raise ArgumentError(f"padding {tuple(pairs)} crops more than the size of shape {x.shape}")
            x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, x.shape)))
            pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
        arg = tuple(pairs)
        inner = tuple((b, b + s) for (b, _), s in zip(arg, x.shape))
        out = x._view(lambda st: st.pad(arg), lambda g: g.shrink(inner))
        if value == 0:
            return out
        mask = Tensor.ones(*x.shape, dtype=dtypes.bool, device=x.device)._view(lambda st: st.pad(arg), lambda g: g)
        return mask.where(out, out.full_like(value))

    def shrink(self, arg: Sequence[tuple[int | UOp | Variable, int | UOp | Variable] | None]) -> Tensor:
        """Keep ``[lo, hi)`` of each dimension (None keeps a dimension whole); bounds may use bound Variables."""
        if _symbolic_arg(arg) or _symbolic_shape(self.shape):
            return self._shrink_symbolic(arg)
        a = tuple((0, s) if r is None else (_int_bound(r[0]), _int_bound(r[1])) for r, s in zip(arg, self.shape))
        for (lo, hi), s in zip(a, self.shape):
            if not 0 <= lo <= hi <= s:
                raise ArgumentError(f"shrink {a} is out of bounds for shape {self.shape}")
        back = tuple((lo, s - hi) for (lo, hi), s in zip(a, self.shape))
        return self if all(r == (0, s) for r, s in zip(a, self.shape)) else \
            self._view(lambda st: st.shrink(a), lambda g: g.pad(back))

    def _shrink_symbolic(self, arg: Sequence[Any]) -> Tensor:
        """shrink with bounds that use bound Variables, or of a tensor with symbolic sizes (the kept sizes may
        depend on the variables)."""
        if len(arg) != self.ndim:
            raise ArgumentError(f"shrink needs one (lo, hi) pair or None per dim of a tensor of {self.ndim} dims")
        a = tuple((0, s) if r is None else (sint_of(r[0]), sint_of(r[1])) for r, s in zip(arg, self.shape))
        guard: list[tuple[int, int]] = []
        for (lo, hi), s in zip(a, self.shape):
            if sym_le(0, lo) and sym_le(hi, s) and sym_le(lo, hi):
                guard.append((0, 0))
                continue
            # A window in bounds for the values bound now but not for every value of the variables' ranges, as
            # GPT-2's arange(ctx).shrink((None, (pos, pos + seqlen))) with pos in [0, ctx - 1]: tinygrad accepts
            # it (it refuses only a window that is out of bounds for every value) and a later value can read
            # past the buffer there. ember accepts it too, but the values bound now must fit (else an error),
            # and the window reads through a zero padding as wide as the variables' ranges can overflow: its
            # loads are masked, so a later binding (a jitted call replayed with another value) can never read
            # outside the buffer; a jitted function checks each replay's values against the window (ir/guards).
            bad = (f"shrink ({', '.join(f'({sint_str(lo)}, {sint_str(hi)})' for lo, hi in a)}) ")
            if not sym_le(lo, hi):
                raise ArgumentError(bad + f"can have a negative size for shape {_shape_str(self.shape)} (for some "
                                          f"value of its variables)")
            if not 0 <= sint_eval(lo) <= sint_eval(hi) <= sint_eval(s):
                raise ArgumentError(bad + f"is out of bounds for shape {_shape_str(self.shape)} at the values its "
                                          f"variables are bound to")
            guards.record(lo, hi, s)
            after = ssub(hi, s)
            guard.append((max(0, -int(lo if isinstance(lo, int) else lo.vmin)),
                          max(0, int(after if isinstance(after, int) else after.vmax))))
        if any(g != (0, 0) for g in guard):
            return self.pad(guard)._shrink_symbolic(tuple((sadd(lo, b), sadd(hi, b)) for (lo, hi), (b, _) in
                                                          zip(a, guard)))
        if all(lo == 0 and hi == s for (lo, hi), s in zip(a, self.shape)):
            return self
        back = tuple((lo, ssub(s, hi)) for (lo, hi), s in zip(a, self.shape))
        return self._view(lambda st: st.shrink(a), lambda g: g.pad(back))

    def _pad_symbolic(self, padding: Sequence[Any], value: Scalar) -> Tensor:
        """pad by amounts that use bound Variables, or a tensor with symbolic sizes, per dim
        ``((before, after), ...)`` (or torch's flat form of ints); amounts must be non-negative."""
        if padding and all(isinstance(p, int) for p in padding) and len(padding) % 2 == 0 and \
                len(padding) // 2 <= self.ndim:
            flat = list(padding)
            padding = [None] * (self.ndim - len(flat) // 2) + [(flat[i], flat[i + 1])
                                                               for i in range(len(flat) - 2, -1, -2)]
        if len(padding) != self.ndim or any(p is not None and len(p) != 2 for p in padding):
            raise ArgumentError(f"a symbolic padding needs one (before, after) pair or None per dim of a tensor of "
                                f"{self.ndim} dims")
        arg = tuple((0, 0) if p is None else (sint_of(p[0]), sint_of(p[1])) for p in padding)
        if any(not (sym_le(0, b) and sym_le(0, a)) for b, a in arg):
            raise ArgumentError(f"padding {arg} can be negative (for some value of its variables)")
        inner = tuple((b, sadd(b, s)) for (b, _), s in zip(arg, self.shape))
        out = self._view(lambda st: st.pad(arg), lambda g: g._shrink_symbolic(inner))
        if value == 0:
            return out
        ones = Tensor.ones(*(1,) * self.ndim, dtype=dtypes.bool, device=self.device).expand(self.shape)
        mask = ones._view(lambda st: st.pad(arg), lambda g: g)
        return mask.where(out, out.full_like(value))

    def flip(self, *axis: Any, **kw: Any) -> Tensor:
        """Reverse the order of elements along ``axis`` (``flip(axis=...)`` too)."""
        axis = _keyword_arg(axis, kw, "axis", "flip")
        ax = tuple(axis[0]) if len(axis) == 1 and isinstance(axis[0], (tuple, list)) else tuple(axis)
        axes = tuple(self._axis(a) for a in ax)
        for a in axes:
            if axes.count(a) > 1:
                raise ArgumentError(f"dim {a} appears multiple times in the list of dims {ax}")
        return self._view(lambda st: st.flip(axes), lambda g: g.flip(axes)) if axes else self

    def __getitem__(self, indices: Any) -> Tensor:
        """Basic indexing: ints, slices (any step), None and ``...``.

        A bound :class:`Variable` (or an expression of one) may stand for an int or a slice bound when the
        result's size is still a known int, as in a KV cache's ``cache[:, pos:pos + 1]``: the kernel reads the
        position at run time. Symbolic positions count from the start (no negative wrap-around).
        """
        idx = list(indices) if isinstance(indices, tuple) else [indices]
        if any(not (i is None or i is Ellipsis or isinstance(i, slice) or _is_symbolic_int(i) or
                    (is_int_like(i) and not isinstance(i, bool))) for i in idx):
            return self._getitem_advanced(indices)
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
        if sum(1 for i in idx if i is Ellipsis) > 1:
            raise IndexError("indices can only have a single ellipsis ('...')")
        if Ellipsis in idx:
            e = idx.index(Ellipsis)
            idx = idx[:e] + [slice(None)] * (self.ndim - n_real) + idx[e + 1:]
        else:
            idx += [slice(None)] * (self.ndim - n_real)
        x = self
        out_shape: list[int | UOp] = []
        shrink: list[tuple[int | UOp, int | UOp]] = []
        flips: list[int] = []
        strides: list[int] = []
        dim = 0
        for i in idx:
            if i is None:
                out_shape.append(-1)  # placeholder for a new axis
                continue
            size = self.shape[dim]
            if _is_symbolic_int(i) or (isinstance(i, slice) and any(map(_is_symbolic_int, (i.start, i.stop)))) or \
                    isinstance(size, UOp):
                lo, hi = _symbolic_bounds(i, size, dim)
                shrink.append((lo, hi))
                strides.append(1)
                out_shape.append(-2 if not isinstance(i, slice) else ssub(hi, lo))
            elif is_int_like(i) and not isinstance(i, bool):
                j = int(i)
                if not -size <= j < size:
                    raise IndexError(f"index {j} is out of bounds for dimension {dim} with size {size}")
                j += size if j < 0 else 0
                shrink.append((j, j + 1))
                strides.append(1)
                out_shape.append(-2)  # dropped
            elif isinstance(i, slice):
                start, stop, step = i.indices(size)
                if step > 0:
                    n = max(0, math.ceil((stop - start) / step))
                    lo, hi = (start, start + (n - 1) * step + 1) if n else (0, 0)
                else:
                    n = max(0, math.ceil((stop - start) / step))
                    lo, hi = (start + (n - 1) * step, start + 1) if n else (0, 0)
                    flips.append(dim)
                shrink.append((lo, hi))
                strides.append(abs(step))
                out_shape.append(n)
            else:
                raise TypeError(f"invalid index type {type(i).__name__}")
            dim += 1
        x = x.shrink(shrink) if shrink else x
        if flips:
            x = x.flip(flips)
        if any(s != 1 for s in strides):
            # take every s-th element: pad to a multiple of s, split the dim, keep offset 0
            for d, s in enumerate(strides):
                if s == 1 or x.shape[d] == 0:
                    continue
                n = (x.shape[d] + s - 1) // s
                x = x.pad(tuple((0, n * s - x.shape[d]) if k == d else (0, 0) for k in range(x.ndim)))
                x = x.reshape(x.shape[:d] + (n, s) + x.shape[d + 1:])
                x = x.shrink(tuple((0, 1) if k == d + 1 else (0, sz) for k, sz in enumerate(x.shape)))
                x = x.reshape(x.shape[:d + 1] + x.shape[d + 2:])
        final: list[int] = []
        it = iter(x.shape)
        for o in out_shape:
            if isinstance(o, int) and o == -1:
                final.append(1)
            elif isinstance(o, int) and o == -2:
                next(it)
            else:
                final.append(next(it))
        final.extend(it)
        return x.reshape(tuple(final))

    # --- elementwise ---------------------------------------------------------------------
    def _alu(self, op: Ops, *srcs: Tensor, dtype: DType | None = None) -> Tensor:
        dt = dtype or self.dtype
        out = Tensor(UOp(op, dt, (self.lazydata, *(s.lazydata for s in srcs))))
        rule = ALU_RULES.get(op)
        if rule is not None and dt.kind == "f":
            out._record((self, *srcs), rule, op.name)
        return out

    def _broadcasted(self, y: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x = self
        if isinstance(y, Tensor):
            if y.device != x.device:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found {x.device} and "
                                   f"{y.device}")
            if isinstance(x.device, tuple):
                x._check_sharding(y)
            dt = least_upper_dtype(x.dtype, y.dtype)
        elif _is_symbolic_int(y):
            y = _sint_tensor(sint_of(y), x.device)
            dt = least_upper_dtype(x.dtype, y.dtype)
        else:
            if not (isinstance(y, (int, float, bool)) or is_np_scalar(y)):
                raise TypeError(f"unsupported operand type {type(y).__name__} for a Tensor op")
            dt = result_type_scalar(x.dtype, y)
            y = Tensor(make_const(y, dt, x.device), requires_grad=False)  # a Python number never needs a gradient
        if reverse:
            x, y = y, x
        x, y = x.cast(dt), y.cast(dt)
        shape = broadcast_shape(x.shape, y.shape)
        return x._broadcast_to(shape), y._broadcast_to(shape)

    def _broadcast_to(self, shape: Shape) -> Tensor:
        if self.shape == shape:
            return self
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if len(shape) > self.ndim else self
        return x.expand(shape)

    def cast(self, dtype: DType | str) -> Tensor:
        """Convert values to ``dtype``."""
        dt = to_dtype(dtype)
        if dt == self.dtype:
            return self
        x = self.lazydata
        if x.op is Ops.CONST or (x.op is Ops.VIEW and x.src[0].op is Ops.CONST):
            c = base_of(x)
            newc = UOp(Ops.CONST, dt, c.src, truncate(dt, c.arg))
            return Tensor(newc if x is c else UOp(Ops.VIEW, dt, (newc,), x.arg))
        src_dt = self.dtype
        out = Tensor(UOp(Ops.CAST, dt, (x,)))
        if dt.kind == "f" and src_dt.kind == "f":
            out._record((self,), lambda g, o, p: (g.cast(src_dt),), "cast")
        return out

    def bitcast(self, dtype: DType | str) -> Tensor:
        """Reinterpret the bits as ``dtype`` (same item size)."""
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise RuntimeError(f"bitcast from {self.dtype} to {dt} needs equal item sizes")
        return Tensor(UOp(Ops.BITCAST, dt, (self.lazydata,)))

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    # --- reductions ----------------------------------------------------------------------

    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
        axes = self._reduce_axes(axis)
        if self.ndim == 0:
            return self
        red = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.lazydata,), (op, axes)))
        if self.dtype.kind == "f":
            shape = self.shape
            if op is Ops.ADD:
                red._record((self,), lambda g, o, p: (g.expand(shape),), "sum")
            elif op is Ops.MAX:
                def max_rule(g: Tensor, o: Tensor, p: Sequence[Tensor]) -> tuple[Tensor]:
                    hit = (p[0] == o.detach().expand(shape)).cast(g.dtype)
                    return (hit * g.expand(shape) / hit.sum(axes, keepdim=True).expand(shape),)
                red._record((self,), max_rule, "max")
        if keepdim:
            return red
        return red.reshape(tuple(s for i, s in enumerate(red.shape) if i not in axes))

    # --- linear algebra ------------------------------------------------------------------

    # --- indexing helpers kept small here; the full API grows in later modules ----------

class no_grad(contextlib.ContextDecorator):
    """``with no_grad():`` (or as a decorator): build graphs without recording gradients.

    Grad mode belongs to the running thread (and asyncio task), as in torch: other threads keep recording, and
    a thread started inside the block records gradients."""

    def __init__(self) -> None:
        self._prev: list[bool] = []

    def _recreate_cm(self) -> no_grad:
        # a decorated function entering afresh on each call may run in several threads at once
        return no_grad()

    def __enter__(self) -> None:
        self._prev.append(_NO_GRAD.get())
        _NO_GRAD.set(True)

    def __exit__(self, *exc: object) -> None:
        # set back rather than ContextVar.reset: a generator may leave the block in another task than it entered
        _NO_GRAD.set(self._prev.pop())

def _device(device: Any) -> Any:
    """The canonical device name (a tuple of them for several devices), failing now (naming the device and what
    is installed) if it is unknown."""
    if device is None:
        return Device.DEFAULT
    if isinstance(device, (tuple, list)):
        return canonical_devices(device) if len(device) != 1 else _device(device[0])
    dev = Device.canonicalize(device)
    Device[dev]
    return dev


_assign_ids = itertools.count()


def _assign_target(x: UOp) -> tuple[UOp, tuple[UOp, ...]]:
    """Where an assign to a tensor whose graph is ``x`` writes, and the pending assign it must follow.

    A tensor assigned before and not realized since is an ASSIGN node (or a view of one): the new
    write goes to the same buffer view, after the pending one.
    """
    base = x.src[0] if x.op is Ops.VIEW else x
    if base.op is not Ops.ASSIGN:
        return x, ()
    tv = base.src[0]
    if x is base:
        return tv, (base,)
    st = tv.arg if tv.op is Ops.VIEW else ShapeTracker.from_shape(shape_of(tv))
    return UOp(Ops.VIEW, x.dtype, (tv.src[0] if tv.op is Ops.VIEW else tv,), st + x.arg), (base,)


def _int_bound(x: int | UOp | Variable) -> int:
    """A shrink bound of an argument without symbolic bounds (those take the symbolic path)."""
    assert not isinstance(x, UOp), "a symbolic shrink bound on the integer path"
    return int(x)


def _symbolic_arg(arg: Any) -> bool:
    """Whether a shrink/pad argument mentions a Variable or a symbolic int."""
    if isinstance(arg, (Variable, UOp)):
        return True
    return isinstance(arg, (tuple, list)) and any(_symbolic_arg(a) for a in arg)


def _assignable(x: UOp) -> bool:
    """Whether ``x`` is a buffer, or a view of one in which every element has its own place (no padding,
    no broadcast), so an assign can write into it in place."""
    if x.op is Ops.BUFFER:
        return True
    if x.op is not Ops.VIEW or x.src[0].op is not Ops.BUFFER or prod(shape_of(x)) == 0:
        return False
    v = x.arg.views[-1] if len(x.arg.views) == 1 else None
    return v is not None and v.mask is None and all(st != 0 or s == 1 for s, st in zip(v.shape, v.strides))


def _retarget_const(x: UOp, device: str) -> UOp:
    c = base_of(x)
    newc = UOp(Ops.CONST, c.dtype, (UOp(Ops.DEVICE, None, (), device),), c.arg)
    return newc if x is c else UOp(Ops.VIEW, x.dtype, (newc,), x.arg)


def _from_host_bytes(data: Any, dt: DType, shape: tuple[int, ...], device: str) -> UOp:
    """A new buffer of ``shape`` on ``device`` holding ``data``: an object with the buffer protocol whose bytes
    are already ``dt``'s elements, row-major (numpy is not needed for this)."""
    if isinstance(device, tuple):  # made on the first device, then copied to the others
        first = _from_host_bytes(data, dt, shape, device[0])
        return UOp(Ops.COPY, dt, (first, UOp(Ops.DEVICE, None, (), device)))
    raw = memoryview(data).cast("B")
    if raw.nbytes != prod(shape) * dt.itemsize:
        raise ValueError(f"{raw.nbytes} bytes of host data for a {dt} tensor of shape {shape} "
                         f"({prod(shape) * dt.itemsize} bytes)")
    node = new_buffer(device, prod(shape), dt)
    if raw.nbytes:
        buffers[node].copyin(raw)
    return buffer_view(node, shape)


def _from_numpy(arr: np.ndarray, dt: DType, device: str) -> UOp:
    shape = tuple(arr.shape)
    if dt == dtypes.bfloat16:
        host = f32_to_bf16(np.asarray(arr, dtype=np.float32))
    else:
        with np.errstate(over="ignore"):  # a float too large for the dtype becomes inf, silently, as in torch
            host = np.asarray(arr).astype(to_np_dtype(dt), copy=False)
    return _from_host_bytes(np.ascontiguousarray(host).reshape(-1), dt, shape, device)

__all__ = ["Tensor", "no_grad"]


def _is_symbolic_int(x: object) -> bool:
    """A bound Variable or an integer expression of variables (what symbolic shrink bounds are)."""
    return isinstance(x, Variable) or (isinstance(x, UOp) and getattr(x.dtype, "kind", "") in "iu")


def _none_at(data: Any) -> list[int] | None:
    """The index of the first None in nested lists, or None when there is none."""
    for i, v in enumerate(data):
        if v is None:
            return [i]
        if isinstance(v, (list, tuple)) and (inner := _none_at(v)) is not None:
            return [i, *inner]
    return None


def _symbolic_bounds(i: Any, size: int | UOp, dim: int) -> tuple[int | UOp, int | UOp]:
    """The (start, stop) a symbolic index or step-1 slice keeps along a dimension of ``size`` (either may be
    symbolic; the kept length may depend on a variable, as in ``cache[:, :pos + 1]``)."""
    def bound(x: Any) -> int | UOp:
        v = sint_of(x)
        if isinstance(v, int) and v < 0:
            raise IndexError(f"a negative index {v} in dimension {dim} of symbolic size {sint_str(size)} or with a "
                             "symbolic bound: symbolic positions count from the start")
        return v

    if not isinstance(i, slice):
        lo = bound(i)
        return lo, sadd(lo, 1)
    if i.step not in (None, 1):
        raise IndexError(f"a slice with a symbolic bound or size must have step 1, got step {i.step} in dimension "
                         f"{dim}")
    lo = 0 if i.start is None else bound(i.start)
    hi = size if i.stop is None else bound(i.stop)
    return lo, hi


def _sint_tensor(x: int | UOp, device: str) -> Tensor:
    """A 0-d int32 tensor holding the value of the symbolic int ``x`` (``x.mean()`` over a variable length
    divides by it): the sum of ``x`` ones, so kernels read the value at run time like any symbolic size."""
    if isinstance(x, int):
        return Tensor(x, device=device, dtype=dtypes.int32)
    if not sym_le(0, x):
        raise ValueError(f"the symbolic int {sint_str(x)} can be negative: only sizes become tensors")
    return Tensor.ones(x, dtype=dtypes.int32, device=device).sum()


def _symbolic_shape(shape: tuple[Any, ...]) -> bool:
    """Whether a size of ``shape`` depends on a variable."""
    return any(isinstance(s, UOp) for s in shape)


def _shape_str(shape: tuple[Any, ...]) -> str:
    """A shape for messages, symbolic sizes written out (``(n=7, 4)``)."""
    return "(" + ", ".join(sint_str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
