"""Creation ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): ranges, identity, random numbers.

Random numbers come from a counter-based generator, Threefry-2x32 with 20 rounds, evaluated on the
device with 32-bit unsigned integer ALU ops (wrapping ADD, XOR, shifts). Every element hashes its own
counter ``(element index, call number)`` under the key ``(seed low word, seed high word)``, so a draw
depends only on the seed, how many draws came before it since :meth:`CreationMixin.manual_seed`, and
the element's position: the same seed gives bit-identical ``rand`` on every device.

The seed and the call number travel in a small uploaded buffer rather than as constants in the
kernel, so every draw of one shape reuses one compiled kernel. :meth:`CreationMixin.random_bits`
exposes the same generator with an explicit key and counter, tinygrad's stateless interface.
"""
from __future__ import annotations

import array
import math
from typing import TYPE_CHECKING, Any, Sequence

from ember.device.registry import Device
from ember.dtype import STRUCT_CODES, DType, dtypes, to_dtype
from ember.engine.jit import record_upload
from ember.frontend import checks
from ember.frontend.base import TensorBase
from ember.frontend.util import ArgumentError, Scalar, make_const, shape_arg, size_arg
from ember.helpers import is_int_like, loaded_numpy, prod
from ember.ir.symbolic import Variable
from ember.ir.uop import Ops, UOp

if TYPE_CHECKING:
    import numpy as np

    from ember.tensor import Tensor
else:
    from ember.helpers import lazy_numpy as np

_MASK32 = 0xFFFFFFFF
_THREEFRY_PARITY = 0x1BD11BDA
_THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _shape_of_args(shape: Sequence[Any]) -> tuple[int, ...]:
    """``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` all mean the shape (2, 3) (negative sizes raise)."""
    return shape_arg(shape)


# array module codes of the dtypes whose host values arange may build without numpy (importing numpy costs
# ~37 ms; a small range of a plain type does not need it)
_ARRAY_CODES = {dt: code for dt, code in STRUCT_CODES.items()
                if dt.kind != "b" and code in array.typecodes and array.array(code).itemsize == dt.itemsize}


def _without_numpy(dt: DType, n: int) -> bool:
    """Whether host values of ``n`` elements of ``dt`` are built with the array module: numpy is not imported
    yet, the range is small, and the dtype has an array code."""
    return loaded_numpy() is None and n <= 1 << 16 and dt in _ARRAY_CODES


class CreationMixin(TensorBase):
    """Creation methods; see the module docstring."""

    __slots__ = ()

    #: how many random draws ran since the last :meth:`manual_seed` (the second counter word)
    _rng_counter: int = 0
    #: uint32 ramps ``[0, 2**k)`` kept per (device, 2**k) for :meth:`_ramp`
    _ramps: dict[tuple[str, int], Any] = {}

    # --- constants and ranges -------------------------------------------------------------------
    def full_like(self, fill_value: Scalar, **kwargs: Any) -> Tensor:
        """A tensor of self's shape filled with ``fill_value`` (dtype and device default to self's)."""
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        requires_grad = kwargs.pop("requires_grad", None)
        return type(self)._leaf(type(self).full(self.shape, fill_value, **kwargs), requires_grad)

    @classmethod
    def _leaf(cls, t: Tensor, requires_grad: bool | None) -> Tensor:
        """``t``'s value as a fresh leaf tensor (no history) with ``requires_grad``."""
        return cls(t.lazydata, requires_grad=requires_grad)

    def const_like(self, b: Scalar, dtype: DType | str | None = None) -> Tensor:
        """``b`` broadcast to self's shape on self's device, in self's dtype unless ``dtype`` (no buffer)."""
        return type(self).full(self.shape, b, dtype=dtype if dtype is not None else self.dtype, device=self.device)

    def zeros_like(self, **kwargs: Any) -> Tensor:
        """Zeros of self's shape (dtype and device default to self's)."""
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        """Ones of self's shape (dtype and device default to self's)."""
        return self.full_like(1, **kwargs)

    def empty_like(self, **kwargs: Any) -> Tensor:
        """An uninitialized tensor of self's shape (dtype and device default to self's)."""
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return type(self).empty(*self.shape, **kwargs)

    @classmethod
    def arange(cls, start: Scalar, stop: Scalar | None = None, step: Scalar = 1, **kwargs: Any) -> Tensor:
        """Values from ``start`` to ``stop`` (exclusive) by ``step``, like ``torch.arange``.

        The dtype is the default float when any argument is a float, else the default int (int32, as in
        tinygrad). For an integer dtype
        the arguments are truncated to integers first, as torch does.
        """
        if stop is None:
            start, stop = 0, start
        if any(isinstance(v, (UOp, Variable)) for v in (start, stop, step)):
            raise NotImplementedError(f"arange({start}, {stop}, {step}): a range whose size depends on a Variable "
                                      "is not supported; take arange of the variable's max and shrink it")
        dtype = kwargs.pop("dtype", None)
        if dtype is not None:
            dt = to_dtype(dtype)
        elif any(isinstance(v, float) for v in (start, stop, step)):
            dt = dtypes.default_float
        else:
            dt = dtypes.default_int
        for name, v in (("start", start), ("end", stop), ("step", step)):
            if not isinstance(v, (int, float)) and not is_int_like(v) and not hasattr(v, "__float__"):
                raise TypeError(f"arange: {name} must be a number, got {type(v).__name__} {v!r}")
        if step == 0:
            raise RuntimeError("step must be nonzero")
        if not all(math.isfinite(float(v)) for v in (start, stop, step)):  # before the sign test: nan fails both
            raise RuntimeError(f"unsupported range: {start} -> {stop}")
        if not ((step > 0 and stop >= start) or (step < 0 and stop <= start)):
            raise RuntimeError("upper bound and lower bound inconsistent with step sign")
        if dt.kind in "iub":
            istart, istop, istep = int(start), int(stop), int(step)
            if istep == 0:
                raise RuntimeError("step must be nonzero")
            if dt == dtypes.int64 or dtype is None:  # torch sizes int64 ranges from the truncated bounds
                sign = 1 if istep > 0 else -1
                n = max(0, (istop - istart + istep - sign) // istep)
            else:
                n = max(0, math.ceil((float(stop) - float(start)) / float(step)))
            ints = range(istart, istart + n * istep, istep)
            if ints and dt.kind in "iu" and not (dtypes.min(dt) <= min(ints) and max(ints) <= dtypes.max(dt)):
                # like tinygrad, a range of ints past the default int's is int64, and one past a given dtype an
                # OverflowError; tinygrad bounds it by stop - step, ember by its real last value (so a step past
                # int32's max is int64 here, where tinygrad's int32 values wrap)
                if dtype is None and dtypes.min(dtypes.int64) <= min(ints) and max(ints) <= dtypes.max(dtypes.int64):
                    dt = dtypes.int64
                else:
                    raise OverflowError(f"arange [{start}, {stop}) step {step} is not representable in dtype {dt}")
            if _without_numpy(dt, n) and (not ints or (dtypes.min(dt) <= min(ints) and max(ints) <= dtypes.max(dt))):
                return cls._arange_upload(array.array(_ARRAY_CODES[dt], ints), dt, n, kwargs)
            values: np.ndarray = istart + np.arange(n, dtype=np.int64) * istep
        else:
            n = max(0, math.ceil((float(stop) - float(start)) / float(step)))
            fstart, fstep = float(start), float(step)
            if _without_numpy(dt, n):  # the same double arithmetic numpy's would do, rounded to dt as its cast
                return cls._arange_upload(array.array(_ARRAY_CODES[dt], [fstart + i * fstep for i in range(n)]),
                                          dt, n, kwargs)
            values = fstart + np.arange(n, dtype=np.float64) * fstep
        return cls(values, dtype=dt, **kwargs)

    @classmethod
    def _arange_upload(cls, values: array.array, dt: DType, n: int, kwargs: dict[str, Any]) -> Tensor:
        """``arange``'s values, computed on the host without numpy, as a tensor with ``kwargs``."""
        device = kwargs.pop("device", None)
        requires_grad = kwargs.pop("requires_grad", None)
        if kwargs:
            raise TypeError(f"arange() got unexpected keyword arguments {sorted(kwargs)}")
        t = cls(cls._from_host(values, dt, (n,), device))
        return cls._leaf(t, requires_grad) if requires_grad is not None else t

    @classmethod
    def linspace(cls, start: Scalar, stop: Scalar, steps: int, **kwargs: Any) -> Tensor:
        """``steps`` evenly spaced values from ``start`` to ``stop`` inclusive (default float dtype)."""
        if size_arg(steps, "steps") < 0:
            raise RuntimeError("number of steps must be non-negative")
        dt = to_dtype(kwargs.pop("dtype", None) or dtypes.default_float)
        if dt == dtypes.bool:  # tinygrad refuses it (torch gives True for every nonzero value)
            raise ValueError("linspace with bool dtype is not supported")
        i = np.arange(steps, dtype=np.float64)
        if steps == 1:
            values = np.array([float(start)])
        else:
            delta = (float(stop) - float(start)) / max(steps - 1, 1)
            # fill from both ends so that ``stop`` comes out exactly and the ramp is symmetric
            values = np.where(i < steps // 2, float(start) + i * delta, float(stop) - (steps - 1 - i) * delta)
        if dt.kind in "iu":
            values = np.trunc(values)
        return cls(values, dtype=dt, **kwargs)

    @classmethod
    def eye(cls, n: int, m: int | None = None, **kwargs: Any) -> Tensor:
        """The identity matrix with ``n`` rows and ``m`` (default ``n``) columns."""
        n = size_arg(n, "n")
        m = n if m is None else size_arg(m, "m")
        if n < 0 or m < 0:
            raise ArgumentError(f"n and m must be greater or equal to 0, got {n} and {m}")
        kwargs.setdefault("dtype", dtypes.default_float)
        requires_grad = kwargs.pop("requires_grad", None)
        if n == 0 or m == 0:
            return cls._leaf(cls.zeros(n, m, **kwargs), requires_grad)
        # rows of a one followed by n zeros, read back n wide: the one walks one column per row
        diag = cls.ones(n, 1, **kwargs).pad(((0, 0), (0, n))).reshape(n * (n + 1))[: n * n].reshape(n, n)
        return cls._leaf(diag[:, :m] if m <= n else diag.pad(((0, 0), (0, m - n))), requires_grad)

    # --- the random number generator --------------------------------------------------------------
    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Seed the random number generator and restart its draw counter."""
        cls._seed = int(seed)
        cls._rng_counter = 0

    @classmethod
    def _ramp(cls, n: int, device: str) -> Tensor:
        """``[0, n)`` on ``device`` without an ``n``-sized upload: uint32, or uint64 past 2**32 entries.

        Up to 65536 entries it is a view of a cached power-of-two ramp. Longer ramps are computed in
        the consuming kernel as ``(i // b) * b + i % b`` from two broadcast views of a ramp of
        ``b >= sqrt(n)`` entries.
        """
        if n > 1 << 16:
            b = 1 << math.isqrt(n - 1).bit_length()  # the power of two >= ceil(sqrt(n))
            rows = -(-n // b)
            hi = cls._ramp(rows, device).reshape(rows, 1).expand(rows, b)
            lo = cls._ramp(b, device).reshape(1, b).expand(rows, b)
            if rows * b > 1 << 32:  # the entries past 2**32 do not fit uint32
                hi, lo = hi.cast(dtypes.uint64), lo.cast(dtypes.uint64)
            return (hi * b + lo).reshape(rows * b)[:n]
        size = max(16, 1 << (n - 1).bit_length()) if n > 1 else 16
        key = (device, size)
        if key not in CreationMixin._ramps:
            CreationMixin._ramps[key] = cls._from_host(array.array("I", range(size)), dtypes.uint32, (size,), device)
        ramp = cls(CreationMixin._ramps[key])
        return ramp if n == size else ramp[:n]

    @classmethod
    def _next_rng_words(cls) -> array.array:
        """The key and counter words of the next draw (uint32 ``[k0, k1, k0 ^ k1 ^ parity, call]``); counts it."""
        seed = int(cls._seed)
        k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
        call = cls._rng_counter & _MASK32
        cls._rng_counter += 1
        return array.array("I", [k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY, call])

    @classmethod
    def _random_bits(cls, shape: tuple[int, ...], device: str) -> tuple[Tensor, Tensor]:
        """Two independent uint32 tensors of ``shape`` from one Threefry-2x32 block per element."""
        n = prod(shape)
        params = cls(cls._from_host(cls._next_rng_words(), dtypes.uint32, (4,), device))
        record_upload(params, cls._next_rng_words)  # a jit uploads fresh words here before every replay
        if n == 0:
            empty = cls.zeros(*shape, dtype=dtypes.uint32, device=device)
            return empty, empty
        words = [params[i:i + 1].expand(n) for i in range(4)]
        x0, x1 = _threefry2x32(words[:3], cls._ramp(n, device), words[3])
        return x0.reshape(shape), x1.reshape(shape)

    @classmethod
    def random_bits(cls, key: Tensor, counter: Tensor, num: int) -> Tensor:
        """``num`` random uint32 words from Threefry-2x32-20 under an explicit key, like tinygrad's.

        ``key`` and ``counter`` hold two uint32 words each (low word first). The pair ``(key, counter)``
        first hashes into a per-call key; then word pair ``j`` of the output is the block of counter
        ``(j, j + ceil(num / 2))`` under that key, its first words filling the first half of the result and
        its second words the second half. Computed on the key's device; the same inputs give the same bits
        on every device.
        """
        if not isinstance(num, int) or num < 0:
            raise ValueError(f"random_bits: num must be a non-negative int, got {num!r}")
        for name, t in (("key", key), ("counter", counter)):
            if t.shape != (2,):
                raise ValueError(f"random_bits: {name} must hold two uint32 words (shape (2,)), got shape {t.shape}")
        k, c = key.detach().cast(dtypes.uint32), counter.detach().cast(dtypes.uint32)
        low, high = c[0:1], c[1:2]
        chunks = []
        for start in range(0, num, _MASK32):  # a counter block covers at most 2**32 - 1 words
            size = min(num - start, _MASK32)
            c_low = low + (start & _MASK32)
            c_high = high + (start >> 32) + (c_low < low).cast(dtypes.uint32)  # carry out of the low word
            sub0, sub1 = _threefry2x32(_key_schedule(k[0:1], k[1:2]), c_low, c_high)
            half = -(-size // 2)
            ctr = cls._ramp(half, key.device)
            x0, x1 = _threefry2x32(_key_schedule(sub0, sub1), ctr, ctr + half)
            chunks.append(x0.cat(x1)[:size])  # type: ignore[misc]
        return chunks[0].cat(*chunks[1:]) if chunks else c[0:0]  # type: ignore[misc]

    @staticmethod
    def _bits_to_unit(bits: Tensor, dtype: DType, bits2: Tensor | None = None) -> Tensor:
        """Exact uniform values in [0, 1) of ``dtype`` from the top bits of uint32 words (never 1.0)."""
        mantissa = {dtypes.float16: 11, dtypes.bfloat16: 8}.get(dtype, 24)
        if dtype == dtypes.float64 and bits2 is not None:
            hi = _shift(bits, Ops.SHR, 5).cast(dtypes.float64)
            lo = _shift(bits2, Ops.SHR, 6).cast(dtypes.float64)
            return (hi * float(2 ** 26) + lo) * float(2.0 ** -53)
        unit = _shift(bits, Ops.SHR, 32 - mantissa).cast(dtypes.float32) * float(2.0 ** -mantissa)
        return unit.cast(dtype)

    @staticmethod
    def _random_dtype(dtype: DType | str | None, name: str) -> DType:
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if dt.kind != "f":
            raise NotImplementedError(f"\"{name}\" is only implemented for floating point dtypes, not {dt.name}")
        return dt

    @classmethod
    def _finish_random(cls, out: Tensor, contiguous: bool, requires_grad: bool | None) -> Tensor:
        return cls._leaf(out.contiguous() if contiguous else out, requires_grad)

    @classmethod
    def rand(cls, *shape: Any, device: str | None = None, dtype: DType | str | None = None, contiguous: bool = True,
             requires_grad: bool | None = None) -> Tensor:
        """Uniform random values in [0, 1) (default float dtype)."""
        shp = _shape_of_args(shape)
        dt = cls._random_dtype(dtype, "rand")
        dev = cls._device_name(device)
        b0, b1 = cls._random_bits(shp, dev)
        return cls._finish_random(cls._bits_to_unit(b0, dt, b1), contiguous, requires_grad)

    @classmethod
    def randn(cls, *shape: Any, dtype: DType | str | None = None, requires_grad: bool | None = None,
              device: str | None = None, contiguous: bool = True) -> Tensor:
        """Standard normal random values (Box-Muller on two uniforms from one Threefry block)."""
        shp = _shape_of_args(shape)
        dt = cls._random_dtype(dtype, "normal")
        dev = cls._device_name(device)
        b0, b1 = cls._random_bits(shp, dev)
        work = dtypes.float64 if dt == dtypes.float64 else dtypes.float32
        u0 = cls._bits_to_unit(b0, dtypes.float32).cast(work)
        u1 = cls._bits_to_unit(b1, dtypes.float32).cast(work)
        radius = ((1.0 - u0).log() * -2.0).sqrt()  # 1 - u0 is in (0, 1]: the log is finite
        angle = u1 * (2.0 * math.pi)
        if work == dtypes.float32:
            # cos of an angle in [0, 2 pi) as sin(pi/2 - angle) in float64: one sine where Tensor.cos (exact for
            # any argument) takes three (the randn kernel ran 2.5x longer); within the float32 result's rounding
            # everywhere, the angle being a float32 value a double's error away from the zeros at most
            cosine = ((math.pi / 2) - angle.cast(dtypes.float64)).sin().cast(work)
        else:
            cosine = angle.cos()
        out = (radius * cosine).cast(dt)
        return cls._finish_random(out, contiguous, requires_grad)

    @classmethod
    def randint(cls, *args: Any, low: int = 0, high: int = 10, dtype: DType | str | None = None,
                device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        """Uniform random integers in ``[low, high)``.

        Both calling conventions work: tinygrad's ``randint(*shape, low=0, high=10)`` (int32 by
        default) and torch's ``randint([low,] high, size)`` with a tuple or list ``size`` (int64).
        """
        if args and isinstance(args[-1], (tuple, list)):
            bounds, shp = args[:-1], _shape_of_args((args[-1],))
            if len(bounds) == 1:
                low, high = 0, bounds[0]
            elif len(bounds) == 2:
                low, high = bounds
            elif bounds:
                raise TypeError(f"randint() takes [low,] high, size; got {len(args)} positional arguments")
            default_dt = dtypes.int64
        else:
            shp, default_dt = _shape_of_args(args), dtypes.int32
        dt = to_dtype(dtype) if dtype is not None else default_dt
        if not is_int_like(low) or not is_int_like(high):
            raise TypeError(f"randint bounds must be integers, got {low!r} and {high!r}")
        low, high = int(low), int(high)
        if high <= low:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
        dev = cls._device_name(device)
        b0, b1 = cls._random_bits(shp, dev)
        span = high - low
        if span <= 1 << 32:
            # multiply-shift: floor(bits * span / 2^32) maps 32 random bits onto [0, span)
            wide = b0.cast(dtypes.uint64) * span
            offset = _shift(wide, Ops.SHR, 32).cast(dtypes.int64)
        else:
            wide = _shift(b0.cast(dtypes.uint64), Ops.SHL, 32)._alu(Ops.OR, b1.cast(dtypes.uint64))
            offset = (wide._alu(Ops.MOD, cls.full(shp, span, dtype=dtypes.uint64, device=dev))).cast(dtypes.int64)
        out = (offset + low).cast(dt)
        return cls(out.contiguous().lazydata, requires_grad=requires_grad)

    @classmethod
    def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DType | str | None = None,
                requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        """Uniform random values in ``[low, high)``."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        work = dt if dt.kind == "f" else dtypes.default_float
        kwargs.pop("contiguous", None)
        unit = cls.rand(*shape, dtype=work, contiguous=False, **kwargs)
        out = (unit * (high - low) + low).cast(dt)
        return cls(out.contiguous().lazydata, requires_grad=requires_grad)

    @classmethod
    def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, requires_grad: bool | None = None,
               **kwargs: Any) -> Tensor:
        """Normal random values with ``mean`` and standard deviation ``std``."""
        kwargs.pop("contiguous", None)
        out = cls.randn(*shape, contiguous=False, **kwargs) * std + mean
        return cls(out.contiguous().lazydata, requires_grad=requires_grad)

    @classmethod
    def scaled_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
        """Uniform in [-1, 1) scaled by ``1 / sqrt(numel)``."""
        n = prod(_shape_of_args(shape))
        scale = n ** -0.5 if n else 1.0
        return cls.uniform(*shape, low=-scale, high=scale, **kwargs)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
        """Glorot/Xavier uniform: bound ``sqrt(6 / (fan_out + fan_in))`` with ``fan_in = prod(shape[1:])``."""
        shp = _shape_of_args(shape)
        fans = (shp[0] if shp else 1) + prod(shp[1:])
        bound = math.sqrt(6.0 / fans) if fans else 1.0
        return cls.uniform(*shp, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """He uniform for a leaky relu of slope ``a``: bound ``sqrt(3) * gain / sqrt(fan_in)``."""
        shp = _shape_of_args(shape)
        fan_in = max(1, prod(shp[1:]))
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a * a)) / math.sqrt(fan_in)
        return cls.uniform(*shp, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """He normal for a leaky relu of slope ``a``: std ``gain / sqrt(fan_in)``."""
        shp = _shape_of_args(shape)
        fan_in = max(1, prod(shp[1:]))
        std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(fan_in)
        return cls.normal(*shp, mean=0.0, std=std, **kwargs)

    def rand_like(self, **kwargs: Any) -> Tensor:
        """:meth:`rand` with self's shape (dtype and device default to self's)."""
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return type(self).rand(*self.shape, **kwargs)

    def randn_like(self, **kwargs: Any) -> Tensor:
        """:meth:`randn` with self's shape (dtype and device default to self's)."""
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return type(self).randn(*self.shape, **kwargs)

    @classmethod
    def randperm(cls, n: int, device: str | None = None, dtype: DType | str = dtypes.int32,
                 requires_grad: bool | None = None) -> Tensor:
        """A random permutation of ``0 .. n-1``.

        Each element draws a 32-bit key; its value is the rank of its key (ties broken by position).
        Up to 2048 elements the ranking is one on-device kernel; longer permutations rank the device's
        keys with a host sort, which gives the same result.
        """
        if n < 0:
            raise RuntimeError(f"n must be non-negative, got {n}")
        dev = cls._device_name(device)
        dt = to_dtype(dtype)
        keys, _ = cls._random_bits((n,), dev)
        if n <= 2048:
            pos = cls._ramp(n, dev)
            out = _ranks(keys.reshape(1, n), pos.reshape(1, n)).reshape(n).cast(dt)
        else:
            order = np.argsort(keys.numpy(), kind="stable")
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n)
            out = cls(rank, device=dev, dtype=dt)
        return cls(out.lazydata, requires_grad=requires_grad)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Draw category indices from the rows of self, read as (unnormalized, non-negative) weights.

        Self is 1-D (one distribution) or 2-D (one per row). With replacement, each draw inverts the
        cumulative weights at a uniform point; without, the ``num_samples`` smallest exponential race
        times ``E / w`` give the categories in order (zero weights come last). Returns int32 indices.
        Negative, nan or inf weights and a row of zeros raise :class:`~ember.frontend.checks.InvalidDistribution`
        at the next read (a deferred check, as for index tensors: the weights are lazy).
        """
        if self.ndim not in (1, 2):
            raise RuntimeError("prob_dist must be 1 or 2 dim")
        if self.dtype.kind != "f":
            raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {self.dtype.name}")
        if size_arg(num_samples, "num_samples") <= 0:
            raise RuntimeError(f"cannot sample n_sample <= 0 samples, got {num_samples}")
        k = self.shape[-1]
        if k == 0:
            raise RuntimeError("multinomial: number of categories cannot be zero")
        if not replacement and num_samples > k:
            raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
        checks.valid_distribution(self.detach())
        w = (self if self.ndim == 2 else self.reshape(1, k)).cast(dtypes.float32).detach()
        rows = w.shape[0]
        cls = type(self)
        pos = cls._ramp(k, self.device).cast(dtypes.int32)
        if replacement:
            upto = (pos.reshape(k, 1) <= pos.reshape(1, k)).cast(dtypes.float32)  # [j, i]: j <= i
            cdf = (w.reshape(rows, k, 1) * upto.reshape(1, k, k)).sum(1)  # (rows, k)
            total = cdf[:, k - 1:k]
            u = cls.rand(rows, num_samples, device=self.device, contiguous=False) * total
            below = cdf[:, : k - 1].reshape(rows, 1, k - 1) <= u.reshape(rows, num_samples, 1)
            out = below.cast(dtypes.int32).sum(2, dtype=dtypes.int32)
        else:
            e = -(1.0 - cls.rand(rows, k, device=self.device, contiguous=False)).log()
            race = (w > 0).where(e / w, math.inf).contiguous()
            rank = _ranks(race, pos.reshape(1, k))
            slot = cls._ramp(num_samples, self.device).cast(dtypes.int32).reshape(1, 1, num_samples)
            hit = rank.reshape(rows, k, 1) == slot
            out = hit.where(pos.reshape(1, k, 1), 0).sum(1, dtype=dtypes.int32)
        return out if self.ndim == 2 else out.reshape(num_samples)

    @staticmethod
    def _device_name(device: str | None) -> str:
        return Device.canonicalize(device) if device is not None else Device.DEFAULT


def _both(a: Tensor, b: Tensor, op: Ops) -> Tensor:
    """Bool ``a AND b`` (op AND) or ``a OR b`` (op OR), broadcast together."""
    x, y = a._broadcasted(b)
    return x._alu(op, y)


def _ranks(keys: Tensor, pos: Tensor) -> Tensor:
    """int32 rank of each key within its row of ``keys`` (rows, n); ties go by ``pos`` (1, n)."""
    rows, n = keys.shape
    kj, ki = keys.reshape(rows, 1, n), keys.reshape(rows, n, 1)
    pj, pi = pos.reshape(1, 1, n), pos.reshape(1, n, 1)
    before = _both(kj < ki, _both(kj == ki, pj < pi, Ops.AND), Ops.OR)
    return before.cast(dtypes.int32).sum(2, dtype=dtypes.int32)


def _amount(x: Tensor, n: int) -> Tensor:
    """``n`` as a tensor of ``x``'s dtype, device and shape (a shift's right operand)."""
    return type(x)(make_const(n, x.dtype, x.device))._broadcast_to(x.shape)


def _shift(x: Tensor, op: Ops, amount: int) -> Tensor:
    """``x << amount`` (op SHL) or ``x >> amount`` (op SHR) in x's own dtype."""
    return x._alu(op, _amount(x, amount))


def _key_schedule(k0: Tensor, k1: Tensor) -> list[Tensor]:
    """Threefry's three key words ``[k0, k1, k0 ^ k1 ^ parity]`` from two uint32 tensors."""
    return [k0, k1, k0._alu(Ops.XOR, k1) ^ _THREEFRY_PARITY]


def _threefry2x32(key: list[Tensor], ctr0: Tensor, ctr1: Tensor) -> tuple[Tensor, Tensor]:
    """Threefry-2x32, 20 rounds. ``key`` is ``[k0, k1, k0 ^ k1 ^ parity]``; all operands are uint32."""
    x0, x1 = ctr0 + key[0], ctr1 + key[1]
    # The rounds are built on the graph's nodes: every operand is a uint32 of x0's shape with no gradient, so the
    # Tensor ops' broadcasting, promotion and autograd checks would change nothing (the graph is the same) and
    # cost ~3 ms per draw. Each key word and constant is broadcast once.
    dt, shape = x0.dtype, x0.shape
    keys = [k._broadcast_to(shape).lazydata for k in key]
    consts: dict[int, UOp] = {}

    def const(n: int) -> UOp:
        if n not in consts:
            consts[n] = _amount(x0, n).lazydata
        return consts[n]

    def alu(op: Ops, a: UOp, b: UOp) -> UOp:
        return UOp(op, dt, (a, b))

    a, b = x0.lazydata, x1.lazydata
    for r in range(20):
        a = alu(Ops.ADD, a, b)
        rot = _THREEFRY_ROTATIONS[r % 8]
        b = alu(Ops.XOR, alu(Ops.OR, alu(Ops.SHL, b, const(rot)), alu(Ops.SHR, b, const(32 - rot))), a)
        if r % 4 == 3:
            s = r // 4 + 1
            a = alu(Ops.ADD, a, keys[s % 3])
            b = alu(Ops.ADD, alu(Ops.ADD, b, keys[(s + 1) % 3]), const(s))
    return type(x0)(a), type(x0)(b)
