"""Device-native collectives: the optional ``allreduce`` a device object may offer, and the host-memory one.

A multi-device reduction (a sum along the sharded axis) combines one partial result per device so that every
device holds the total. ember builds that from device-to-device copies and kernels (a ring, see
:mod:`ember.ir.multi`), which every device gets for free. A device whose driver does better (NCCL on CUDA, one
pass over shared memory for host devices) offers a method on its device object::

    def allreduce(self, srcs, dests, devices, dtype, op): ...

``srcs[i]`` and ``dests[i]`` are opaque buffers of ``devices[i]`` (device objects of that plugin, the group in
order; ``self`` is ``devices[0]``), all of one size and ``dtype``; ``op`` is ``"add"``, ``"max"`` or ``"mul"``.
After the call every ``dests[i]`` holds the elementwise combination of all ``srcs``, the same bits on every
device (compute each element once and copy it, or combine in one fixed order everywhere); ``srcs`` are left as
they were. Core calls it after synchronizing every device of the group, and uses it only when every device of
the group offers it and all come from one plugin; otherwise the graph gets the ring. Raising
``NotImplementedError`` (a dtype or op the driver lacks) makes core combine the buffers through host memory
instead (:func:`reduce_through_host`), which is correct but slow.

:func:`host_allreduce` is the implementation for devices whose buffers are host memory (an allocator with
``as_buffer``): one pass over the partials in cache-sized blocks, each block summed once and copied into every
destination, blocks split over threads (numpy releases the GIL), so it reads every partial once and writes every
destination once.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ember.dtype import DType, dtypes, to_np_dtype
from ember.helpers import getenv

#: the ops a collective combines with, by the names the contract uses
OPS = ("add", "max", "mul")
#: elements per block of :func:`host_allreduce` (a block of each partial and the total stay in cache)
_BLOCK = 1 << 15
_pool: ThreadPoolExecutor | None = None


def _ufunc(op: str) -> Any:
    import numpy as np

    if op not in OPS:
        raise ValueError(f"allreduce op must be one of {OPS}, got {op!r}")
    return {"add": np.add, "max": np.maximum, "mul": np.multiply}[op]


def _threads() -> int:
    return max(1, int(getenv("COLLECTIVE_THREADS", min(8, os.cpu_count() or 1))))


def combine_views(srcs: Sequence[Any], dests: Sequence[Any], op: str) -> None:
    """``dests[i][:] = op(srcs[0], srcs[1], ...)`` for numpy arrays of one shape and dtype, in blocks: each block
    is combined once, into ``dests[0]``, left to right, then copied into the other destinations. Blocks are split
    over up to ``COLLECTIVE_THREADS`` threads."""
    global _pool
    ufunc = _ufunc(op)
    n = len(srcs[0])

    def work(lo: int, hi: int) -> None:
        for a in range(lo, hi, _BLOCK):
            b = min(a + _BLOCK, hi)
            total = dests[0][a:b]
            if len(srcs) == 1:
                total[...] = srcs[0][a:b]
            else:
                ufunc(srcs[0][a:b], srcs[1][a:b], out=total)
            for s in srcs[2:]:
                ufunc(total, s[a:b], out=total)
            for d in dests[1:]:
                d[a:b] = total

    threads = min(_threads(), -(-n // _BLOCK))
    if threads <= 1:
        work(0, n)
        return
    if _pool is None or _pool._max_workers < threads:
        _pool = ThreadPoolExecutor(threads, thread_name_prefix="ember-collective")
    step = -(-n // threads)
    for f in [_pool.submit(work, i * step, min(n, (i + 1) * step)) for i in range(threads)]:
        f.result()


def _np_view(mem: Any, dtype: DType) -> Any:
    import numpy as np

    if dtype == dtypes.bfloat16:
        raise NotImplementedError("bfloat16 has no numpy type to combine in")
    return np.frombuffer(mem, dtype=to_np_dtype(dtype))


def host_allreduce(device: Any, srcs: Sequence[Any], dests: Sequence[Any], devices: Sequence[Any], dtype: DType,
                   op: str) -> None:
    """The ``allreduce`` of devices whose buffers are host memory (their allocator's ``as_buffer`` is a
    zero-copy view): set it as a method of the device class (``allreduce = host_allreduce``). ``device`` is the
    first device of the group."""
    src_views = [_np_view(d.allocator.as_buffer(b), dtype) for d, b in zip(devices, srcs)]
    dest_views = [_np_view(d.allocator.as_buffer(b), dtype) for d, b in zip(devices, dests)]
    for v in dest_views:
        if v.flags.writeable is False:
            raise ValueError("allreduce destinations must be writable host memory")
    combine_views(src_views, dest_views, op)


def reduce_through_host(srcs: Sequence[Any], dests: Sequence[Any], dtype: DType, op: str) -> None:
    """Combine the ember :class:`~ember.device.buffer.Buffer` ``srcs`` into every one of ``dests`` through host
    memory (the fallback when a device's native collective raises ``NotImplementedError``)."""
    import numpy as np

    np_dtype = np.uint16 if dtype == dtypes.bfloat16 else to_np_dtype(dtype)
    raw: list[np.ndarray] = [np.frombuffer(s.as_bytes(), dtype=np_dtype) for s in srcs]
    if dtype == dtypes.bfloat16:  # widen to float32 (exact), combine there, round back to nearest even
        wide = [(r.astype(np.uint32) << 16).view(np.float32) for r in raw]
        total = np.empty_like(wide[0])
        combine_views(wide, [total], op)
        bits = total.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        out = np.where(np.isnan(total), (bits >> 16).astype(np.uint16) | 0x40, rounded)
    else:
        out = np.empty_like(raw[0])
        combine_views(raw, [out], op)
    for d in dests:
        d.copyin(memoryview(np.ascontiguousarray(out)).cast("B"))


def native_allreduce_of(devices: Sequence[str]) -> Any:
    """The native ``allreduce`` the devices named ``devices`` share (the first device's bound method), or None
    when one of them offers none, they come from different plugins, or ``NATIVE_ALLREDUCE=0`` turns them off
    (then the graph gets the ring of copies and kernels)."""
    from ember.device.registry import Device

    if not getenv("NATIVE_ALLREDUCE", 1) or len(devices) < 2:
        return None
    objs = [Device[d] for d in devices]
    impl = getattr(type(objs[0]), "allreduce", None)
    if impl is None or any(getattr(type(o), "allreduce", None) is not impl for o in objs[1:]):
        return None
    if len({Device.origin(d) for d in devices}) != 1:
        return None
    return objs[0].allreduce


def kinds_offering(*methods: str) -> list[tuple[str, Any, str | None]]:
    """``(name, device class, why it is unusable or None)`` of each installed compute device kind whose device
    class defines every one of ``methods`` (an optional capability such as :class:`~ember.device.NCCLMemory`),
    highest priority first. Only those kinds are probed; a kind whose class cannot be imported is left out (the
    doctor reports it)."""
    from ember.device.registry import Device, DevicePluginError

    found = []
    for spec in sorted(Device.specs().values(), key=lambda s: (-s.priority, s.name)):
        if not spec.compute:
            continue
        try:
            cls = Device._resolve_factory(spec)
        except DevicePluginError:
            continue
        if all(callable(getattr(cls, m, None)) for m in methods):
            found.append((spec.name, cls, Device.probe(spec.name)))
    return found
