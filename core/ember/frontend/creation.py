"""Creation ops of the Tensor API (a mixin of :class:`ember.tensor.Tensor`): ranges, identity, random numbers.

Random numbers come from a counter-based generator, Threefry-2x32 with 20 rounds, evaluated on the
device with 32-bit unsigned integer ALU ops (wrapping ADD, XOR, shifts), in tinygrad's layout, so a
seed gives tinygrad's numbers. Each device has its own stream: a base key made of a hash of the order in
which the device first drew and the seed, and a counter of the 32-bit words drawn on it so far. A draw
of ``num`` words hashes its counter under the base key into a draw key, and word ``j`` of the draw is
one half of the Threefry block of ``(j mod h, j mod h + h)`` under the draw key, ``h = ceil(num / 2)``.
:meth:`CreationMixin.manual_seed` restarts every device's stream. Floats take the top mantissa bits of
their share of the words, exactly ``m / 2**mantissa``; randn, randint, uniform, randperm, multinomial and
dropout are built on :meth:`CreationMixin.rand` in tinygrad's way.

The draw key travels in a small uploaded buffer rather than as constants in the kernel, so every draw of
one shape reuses one compiled kernel. :meth:`CreationMixin.random_bits` exposes the same generator with
an explicit key and counter, tinygrad's stateless interface.
"""
from __future__ import annotations

import array
import hashlib
import math
from typing import TYPE_CHECKING, Any, Sequence

from ember.device.registry import Device
from ember.dtype import STRUCT_CODES, DType, dtypes, to_dtype
from ember.engine.jit import record_upload
from ember.frontend import checks
from ember.frontend.base import TensorBase
from ember.frontend.util import ArgumentError, Scalar, make_const, shape_arg, size_arg
from ember.helpers import is_int_like, loaded_numpy, prod
from ember.ir.lazy import base_of, ramps
from ember.ir.symbolic import Variable
from ember.ir.uop import Ops, UOp

if TYPE_CHECKING:
    import numpy as np

    from ember.tensor import Tensor
else:
    from ember.helpers import lazy_numpy as np

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
_THREEFRY_PARITY = 0x1BD11BDA
_THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
# explicit mantissa bits of the float dtypes rand draws: how many random bits an element's fraction gets
_MANTISSA = {dtypes.float16: 10, dtypes.bfloat16: 7, dtypes.float32: 23, dtypes.float64: 52}


def _shape_of_args(shape: Sequence[Any]) -> tuple[int, ...]:
    """``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` all mean the shape (2, 3) (negative sizes raise)."""
    return shape_arg(shape)


# array module codes of the dtypes whose host values arange may build without numpy (importing numpy costs
# ~37 ms; a small range of a plain type does not need it)
_ARRAY_CODES = {dt: code for dt, code in STRUCT_CODES.items()
                if dt.kind != "b" and code in array.typecodes and array.array(code).itemsize == dt.itemsize}


#: the longest integer ``arange`` built on the host and uploaded; longer ones are computed in their kernels
_ARANGE_HOST_MAX = 1 << 20


def _without_numpy(dt: DType, n: int) -> bool:
    """Whether host values of ``n`` elements of ``dt`` are built with the array module: numpy is not imported
    yet, the range is small, and the dtype has an array code."""
    return loaded_numpy() is None and n <= 1 << 16 and dt in _ARRAY_CODES


class CreationMixin(TensorBase):
    """Creation methods; see the module docstring."""

    __slots__ = ()

    #: each device's random stream since the last :meth:`manual_seed`: [base key word 0, base key word 1,
    #: words drawn]
    _rng_devices: dict[str, list[int]] = {}
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
            # the extremes of a range are its ends (min() and max() would walk all n values)
            least, most = (min(ints[0], ints[-1]), max(ints[0], ints[-1])) if ints else (0, 0)
            if ints and dt.kind in "iu" and not (dtypes.min(dt) <= least and most <= dtypes.max(dt)):
                # like tinygrad, a range of ints past the default int's is int64, and one past a given dtype an
                # OverflowError; tinygrad bounds it by stop - step, ember by its real last value (so a step past
                # int32's max is int64 here, where tinygrad's int32 values wrap)
                if dtype is None and dtypes.min(dtypes.int64) <= least and most <= dtypes.max(dtypes.int64):
                    dt = dtypes.int64
                else:
                    raise OverflowError(f"arange [{start}, {stop}) step {step} is not representable in dtype {dt}")
            if n > _ARANGE_HOST_MAX and dt.kind in "iu":  # computed where it is used: no n-sized host array
                return cls._arange_lazy(istart, istep, n, dt, kwargs)
            if _without_numpy(dt, n) and (not ints or (dtypes.min(dt) <= least and most <= dtypes.max(dt))):
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
    def _arange_lazy(cls, start: int, step: int, n: int, dt: DType, kwargs: dict[str, Any]) -> Tensor:
        """An integer ``arange`` of ``n`` values (known to fit ``dt``) as ``start + ramp * step``, computed in the
        kernels that read it (2**31 int64 values would be 16 GiB built on the host and uploaded)."""
        device = cls._device_name(kwargs.pop("device", None))
        requires_grad = kwargs.pop("requires_grad", None)
        if kwargs:
            raise TypeError(f"arange() got unexpected keyword arguments {sorted(kwargs)}")
        wide = dtypes.int64 if dt.itemsize < 8 or dt.kind == "i" else dt  # start + i * step without overflow
        # on the (rows, b) grid of the ramp's two parts, reshaped last: a slice of the result then computes only
        # its elements (an elementwise op over the reshaped ramp would be a second view over a computed value)
        b = 1 << math.isqrt(n - 1).bit_length()
        rows = -(-n // b)
        hi = cls._ramp(rows, device).reshape(rows, 1).expand(rows, b).cast(wide)
        lo = cls._ramp(b, device).reshape(1, b).expand(rows, b).cast(wide)
        t = ((hi * b + lo) * step + start).cast(dt).reshape(rows * b)[:n]
        return cls._leaf(t, requires_grad) if requires_grad is not None else t

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

    @classmethod
    def from_url(cls, url: str, gunzip: bool = False, *, dtype: DType | str | None = None,
                 device: str | None = None) -> Tensor:
        """The bytes at ``url`` as a 1-D tensor: ``uint8``, or read as ``dtype`` (a trailing part item dropped).

        The file is downloaded once into the cache (:func:`ember.helpers.fetch`; a local path is read as it
        is); ``gunzip`` stores and reads the decompressed bytes. Where tinygrad keeps the tensor on a disk
        device, ember reads the bytes into ``device`` (the default device when ``None``).
        """
        from ember.helpers import fetch  # the download machinery is needed only here

        dt = dtypes.uint8 if dtype is None else to_dtype(dtype)
        bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(dt.itemsize)
        if bits is None:
            raise TypeError(f"from_url cannot read items of {dt} ({dt.itemsize} bytes each)")
        data = fetch(url, gunzip=gunzip).read_bytes()
        raw = cls(np.frombuffer(data, dtype=bits, count=len(data) // dt.itemsize), device=device)
        return raw if raw.dtype == dt else raw.bitcast(dt)

    # --- the random number generator --------------------------------------------------------------
    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Seed the random number generator: every device's stream restarts from the beginning."""
        cls._seed = int(seed)
        cls._rng_devices = {}

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
            node = cls._from_host(array.array("I", range(size)), dtypes.uint32, (size,), device)
            if base_of(node).op is Ops.BUFFER:  # its loads become index arithmetic in the kernels reading it
                ramps.add(base_of(node))
            CreationMixin._ramps[key] = node
        ramp = cls(CreationMixin._ramps[key])
        return ramp if n == size else ramp[:n]

    @classmethod
    def _next_draw_key(cls, device: str, num: int) -> array.array:
        """The key schedule ``[k0, k1, k0 ^ k1 ^ parity]`` of the next draw of ``num`` words on ``device``.

        A device joins the generator at its first draw: its base key is ``(low word of sha256 of its join
        index, low word of the seed)``, and its counter (a 64-bit count of the words drawn on it) starts at 0.
        A draw's key is the Threefry block of the counter under the base key; the counter then moves on by
        ``num``. This one block per draw is hashed here on the host; the words themselves are computed on the
        device.
        """
        devices = cls._rng_devices
        if device not in devices:
            digest = hashlib.sha256(len(devices).to_bytes(4, "big")).digest()
            devices[device] = [int.from_bytes(digest[-4:], "big"), int(cls._seed) & _MASK32, 0]
        state = devices[device]
        ctr = state[2]
        state[2] = (ctr + num) & _MASK64
        k0, k1 = _threefry_host(state[0], state[1], ctr & _MASK32, ctr >> 32)
        return array.array("I", [k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY])

    @classmethod
    def _draw_key(cls, device: str, num: int, n: int) -> list[Tensor]:
        """The next draw's three key words on ``device``, each broadcast to ``n`` elements.

        They travel in a small uploaded buffer, not as kernel constants, so every draw of one shape reuses
        one compiled kernel; a captured jit uploads fresh words (the draw after) before every replay.
        """
        if max(num, n) > _MASK32:
            raise NotImplementedError(f"a random draw of {n} elements ({num} 32-bit words) is too large "
                                      f"(at most {_MASK32} of each)")
        params = cls(cls._from_host(cls._next_draw_key(device, num), dtypes.uint32, (3,), device))
        record_upload(params, lambda: cls._next_draw_key(device, num))
        return [params[i:i + 1].expand(n) for i in range(3)]

    @staticmethod
    def _words_at(key: list[Tensor], idx: Tensor, half: int) -> Tensor:
        """Word ``idx`` (uint32 indices) of a draw of ``2 * half`` words (or one fewer).

        Block ``j`` hashes the counter ``(j, j + half)``; its first word is word ``j`` of the draw and its
        second word is word ``j + half``.
        """
        upper = idx >= half
        ctr = upper.where(idx - half, idx)
        x0, x1 = _threefry2x32(key, ctr, ctr + half)
        return upper.where(x1, x0)

    @classmethod
    def _random_units(cls, shape: tuple[int, ...], dtype: DType, device: str) -> Tensor:
        """Uniform values in [0, 1) of float ``dtype``: each element's bits are its share of the draw's
        words (two per element for 8-byte floats, half a word for 2-byte ones, low half first), and its
        top mantissa-many bits are the fraction ``m / 2**mantissa``."""
        if dtype not in _MANTISSA:
            raise NotImplementedError(f"random values of dtype {dtype.name} are not supported")
        n = prod(shape)
        num = -(-n * dtype.itemsize // 4)
        key = cls._draw_key(device, num, n)
        if n == 0:
            return cls.zeros(*shape, dtype=dtype, device=device)
        half, mant = -(-num // 2), _MANTISSA[dtype]
        pos = cls._ramp(n, device)
        if dtype.itemsize == 8:
            lo = cls._words_at(key, pos * 2, half)
            hi = cls._words_at(key, pos * 2 + 1, half)
            unit = (hi.cast(dtypes.float64) * 2.0 ** -32 + _shift(lo, Ops.SHR, 64 - mant).cast(dtypes.float64)
                    * 2.0 ** -mant)
        elif dtype.itemsize == 2:
            word = cls._words_at(key, _shift(pos, Ops.SHR, 1), half)
            odd = pos._alu(Ops.AND, _amount(pos, 1)) != 0
            low_half = _shift(word, Ops.SHR, 16 - mant)._alu(Ops.AND, _amount(word, (1 << mant) - 1))
            unit = (odd.where(_shift(word, Ops.SHR, 32 - mant), low_half).cast(dtypes.float32) * 2.0 ** -mant)
        else:
            unit = _shift(cls._words_at(key, pos, half), Ops.SHR, 32 - mant).cast(dtypes.float32) * 2.0 ** -mant
        return unit.cast(dtype).reshape(shape)

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
        """Uniform random values in [0, 1) (default float dtype); a draw of ``ceil(numel * itemsize / 4)`` words."""
        shp = _shape_of_args(shape)
        dt = cls._random_dtype(dtype, "rand")
        out = cls._random_units(shp, dt, cls._device_name(device))
        return cls._finish_random(out, contiguous, requires_grad)

    @classmethod
    def randn(cls, *shape: Any, dtype: DType | str | None = None, requires_grad: bool | None = None,
              device: str | None = None, contiguous: bool = True) -> Tensor:
        """Standard normal random values: Box-Muller in float32 on a float32 draw of shape ``(2, *shape)``.

        The first half of that draw gives the angle and the second the radius; with ``n`` elements, element
        ``i`` reads words ``i`` and ``n + i``, the two words of Threefry block ``i``.
        """
        shp = _shape_of_args(shape)
        dt = cls._random_dtype(dtype, "normal")
        dev = cls._device_name(device)
        n = prod(shp)
        key = cls._draw_key(dev, 2 * n, n)
        if n == 0:
            return cls._finish_random(cls.zeros(*shp, dtype=dt, device=dev), contiguous, requires_grad)
        pos = cls._ramp(n, dev)
        x0, x1 = _threefry2x32(key, pos, pos + n)
        u0, u1 = (_shift(x, Ops.SHR, 9).cast(dtypes.float32) * 2.0 ** -23 for x in (x0, x1))
        angle = u0 * (2.0 * math.pi)
        # cos of an angle in [0, 2 pi) as sin(pi/2 - angle) in float64: one sine where Tensor.cos (exact for any
        # argument) takes three (the randn kernel ran 2.5x longer); within the float32 result's rounding
        # everywhere, the angle being a float32 value a double's error away from the zeros at most
        cosine = ((math.pi / 2) - angle.cast(dtypes.float64)).sin().cast(dtypes.float32)
        radius = ((1.0 - u1).log() * -2.0).sqrt()  # 1 - u1 is in (0, 1]: the log is finite
        out = (cosine * radius).cast(dt).reshape(shp)
        return cls._finish_random(out, contiguous, requires_grad)

    @classmethod
    def randint(cls, *args: Any, low: int = 0, high: int = 10, dtype: DType | str | None = None,
                device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        """Uniform random integers in ``[low, high)``: ``low + trunc((high - low) * rand())``, rand in float32.

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
        unit = cls.rand(*shp, device=device, contiguous=False)
        out = (unit * (high - low)).cast(dt) + low
        return cls(out.contiguous().lazydata, requires_grad=requires_grad)

    @classmethod
    def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DType | str | None = None,
                requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        """Uniform random values in ``[low, high)``: ``(high - low) * rand()`` in the default float, cast to
        ``dtype``, plus ``low``."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        kwargs.pop("contiguous", None)
        unit = cls.rand(*shape, contiguous=False, **kwargs)
        out = (unit * (high - low)).cast(dt) + low
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
        """Uniform in [-1, 1), then scaled by ``1 / sqrt(numel)``."""
        n = prod(_shape_of_args(shape))
        requires_grad = kwargs.pop("requires_grad", None)
        out = cls.uniform(*shape, low=-1.0, high=1.0, **kwargs) * (n ** -0.5 if n else 1.0)
        return cls(out.lazydata, requires_grad=requires_grad)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
        """Glorot/Xavier uniform: bound ``sqrt(6 / (fan_out + fan_in))`` with ``fan_in = prod(shape[1:])``."""
        shp = _shape_of_args(shape)
        fans = (shp[0] if shp else 1) + prod(shp[1:])
        bound = (6 / fans) ** 0.5 if fans else 1.0
        return cls.uniform(*shp, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """He uniform for a leaky relu of slope ``a``: bound ``sqrt(6 / (1 + a**2) / fan_in)``."""
        shp = _shape_of_args(shape)
        fan_in = max(1, prod(shp[1:]))
        bound = (6 / (1 + a ** 2) / fan_in) ** 0.5
        return cls.uniform(*shp, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """He normal for a leaky relu of slope ``a``: std ``sqrt(2 / (1 + a**2) / fan_in)``."""
        shp = _shape_of_args(shape)
        fan_in = max(1, prod(shp[1:]))
        std = (2 / (1 + a ** 2) / fan_in) ** 0.5
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
        """A random permutation of ``0 .. n-1``: the stable argsort of :meth:`rand` ``(n)``.

        Up to 2048 elements the sort is one on-device ranking; longer permutations sort the device's values
        on the host (numpy's stable sort), which gives the same result.
        """
        if n < 0:
            raise RuntimeError(f"n must be non-negative, got {n}")
        dev = cls._device_name(device)
        dt = to_dtype(dtype)
        keys = cls.rand(n, device=dev, contiguous=False)
        if n <= 2048:
            out = keys.argsort().cast(dt)
        else:
            out = cls(np.argsort(keys.numpy(), kind="stable"), device=dev, dtype=dt)
        return cls(out.lazydata, requires_grad=requires_grad)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Draw category indices from the rows of self, read as (unnormalized, non-negative) weights.

        Self is 1-D (one distribution) or 2-D (one per row). With replacement (or one sample), each draw
        counts the entries of the normalized cumulative weights at or below a uniform value, drawn as
        :meth:`rand` ``(num_samples, rows, 1)`` on the default device. Without, the ``num_samples`` largest
        ``log2(u) / w`` (u uniform per weight, zero weights last) give the categories in order. Returns
        int32 indices. Negative, nan or inf weights and a row of zeros raise
        :class:`~ember.frontend.checks.InvalidDistribution` at the next read (a deferred check, as for index
        tensors: the weights are lazy).
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
        w = (self if self.ndim == 2 else self.reshape(1, k)).detach()
        rows = w.shape[0]
        cls = type(self)
        if replacement or num_samples == 1:
            cw = w.cumsum(1).cast(dtypes.float32)
            cdf = cw / cw[:, k - 1:k]
            u = cls.rand(num_samples, rows, 1, contiguous=False).to(self.device)
            out = (u >= cdf).cast(dtypes.int32).sum(2, dtype=dtypes.int32).permute(1, 0)
        else:
            race = cls.rand(rows, k, device=self.device, contiguous=False).log2() / w
            out = race.topk(num_samples, dim=1)[1].cast(dtypes.int32)
        return out if self.ndim == 2 else out.reshape(num_samples)

    @staticmethod
    def _device_name(device: str | None) -> str:
        if isinstance(device, tuple):  # tinygrad's refusal: draw on one device, then shard or replicate
            raise ValueError(f"random numbers are drawn on a single device, got device={device!r}: draw on one and "
                             f"use .shard() or .to() to place them on several")
        return Device.canonicalize(device) if device is not None else Device.DEFAULT


def _amount(x: Tensor, n: int) -> Tensor:
    """``n`` as a tensor of ``x``'s dtype, device and shape (a shift's right operand)."""
    return type(x)(make_const(n, x.dtype, x.device))._broadcast_to(x.shape)


def _shift(x: Tensor, op: Ops, amount: int) -> Tensor:
    """``x << amount`` (op SHL) or ``x >> amount`` (op SHR) in x's own dtype."""
    return x._alu(op, _amount(x, amount))


def _key_schedule(k0: Tensor, k1: Tensor) -> list[Tensor]:
    """Threefry's three key words ``[k0, k1, k0 ^ k1 ^ parity]`` from two uint32 tensors."""
    return [k0, k1, k0._alu(Ops.XOR, k1) ^ _THREEFRY_PARITY]


def _threefry_host(k0: int, k1: int, c0: int, c1: int) -> tuple[int, int]:
    """One Threefry-2x32-20 block of the counter ``(c0, c1)`` under the key ``(k0, k1)``, in Python ints."""
    mask = _MASK32
    ks = (k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY)
    a, b = (c0 + k0) & mask, (c1 + k1) & mask
    for r in range(20):
        rot = _THREEFRY_ROTATIONS[r % 8]
        a = (a + b) & mask
        b = (((b << rot) | (b >> (32 - rot))) & mask) ^ a
        if r % 4 == 3:
            s = r // 4 + 1
            a = (a + ks[s % 3]) & mask
            b = (b + ks[(s + 1) % 3] + s) & mask
    return a, b


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
