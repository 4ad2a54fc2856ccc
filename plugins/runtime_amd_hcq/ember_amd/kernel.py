"""AMD kernels: a code object's kernel uploaded to GPU memory, its launch shape, and its argument blocks."""
from __future__ import annotations

import ctypes
import functools
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ember.device import KernelArgs
from ember_amd.memory import AMDBuffer, round_up

if TYPE_CHECKING:
    from ember_amd.device import AMDDevice

#: kernel_code_properties bits of the kernel descriptor -> user SGPRs they take, in the order the hardware loads them
USER_SGPRS = ((0, "private_segment_buffer", 4), (1, "dispatch_ptr", 2), (2, "queue_ptr", 2),
               (3, "kernarg_segment_ptr", 2), (4, "dispatch_id", 2), (5, "flat_scratch_init", 2),
               (6, "private_segment_size", 1))
DISPATCH_PACKET_BYTES = 64


class AMDKernel:
    """One kernel of a code object uploaded to GPU memory: its descriptor's registers and argument layout."""

    def __init__(self, dev: AMDDevice, name: str, lib: bytes):
        from ember_amd.elf import read_code_object

        co = read_code_object(lib)
        if name not in co.kernels:
            raise ValueError(f"code object has no kernel {name!r} (it has {', '.join(co.kernels) or 'none'})")
        if co.arch != dev.arch:
            raise ValueError(f"kernel {name!r} was built for {co.arch}, the device is {dev.arch}")
        self.name, self.info = name, co.kernels[name]
        self.image_mem = dev.upload_code_object(lib, co.image)
        desc = co.image[self.info.descriptor_offset:self.info.descriptor_offset + 64]
        entry_offset = struct.unpack_from("<q", desc, 16)[0]
        self.rsrc3, self.rsrc1, self.rsrc2, self.properties = struct.unpack_from("<IIIH", desc, 44)
        self.entry = self.image_mem.va + self.info.descriptor_offset + entry_offset
        if self.entry % 256:
            raise ValueError(f"kernel {name!r}: entry 0x{self.entry:x} is not 256-byte aligned (COMPUTE_PGM_LO "
                             f"holds address >> 8)")
        if self.info.private_segment_fixed_size and not dev.os.mock:
            raise NotImplementedError(f"kernel {name!r} needs {self.info.private_segment_fixed_size} bytes of scratch "
                                      f"per work-item: scratch memory is not set up by this runtime yet")
        self.wave32 = self.info.wavefront_size == 32
        self.args_bytes = round_up(self.info.kernarg_size, 64)
        self.block_bytes = self.args_bytes + DISPATCH_PACKET_BYTES
        self.buffer_args = [a for a in self.info.explicit_args if a.value_kind == "global_buffer"]
        self.value_args = [a for a in self.info.explicit_args if a.value_kind == "by_value"]
        self.max_threads = self.info.max_flat_workgroup_size or 1024

    @functools.lru_cache(maxsize=64)  # noqa: B019 - few distinct launch shapes per kernel
    def launch_dims(self, global_size: tuple[int, ...], local_size: tuple[int, ...] | None
                    ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """``(groups, work-group)`` covering ``global_size`` work-items exactly (3 dimensions, innermost first).

        Without a ``local_size`` each dimension takes the largest divisor of its size that still fits
        (256 work-items in all), so no partial work-groups exist.
        """
        g = [int(x) for x in global_size] + [1] * (3 - len(global_size))
        if local_size is not None:
            loc = [int(x) for x in local_size] + [1] * (3 - len(local_size))
            if any(x % n for x, n in zip(g, loc)) or loc[0] * loc[1] * loc[2] > self.max_threads:
                raise ValueError(f"kernel {self.name}: local size {tuple(loc)} must divide the global size {tuple(g)} "
                                 f"and hold at most {self.max_threads} work-items")
        else:
            budget, loc = min(256, self.max_threads), []
            for size in g:
                b = next(d for d in range(min(size, budget), 0, -1) if size % d == 0) if size else 1
                loc.append(b)
                budget //= b
        groups = (g[0] // loc[0], g[1] // loc[1], g[2] // loc[2])
        return groups, (loc[0], loc[1], loc[2])


class KernargPool:
    """Argument blocks in host-visible GTT memory; a freed block is reused once the timeline passed its last use."""

    CHUNK = 1 << 20

    def __init__(self, dev: AMDDevice):
        self.dev = dev
        self.free: dict[int, list[tuple[int, int]]] = {}  # size class -> [(address, timeline value it waits for)]
        self.cursor, self.end = 0, 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[int, int]:
        size = max(256, 1 << (nbytes - 1).bit_length())
        with self.lock:
            done = self.dev.timeline.signal.value
            bucket = self.free.get(size, [])
            for i, (addr, tag) in enumerate(bucket):
                if tag <= done:
                    bucket.pop(i)
                    return addr, size
            if self.cursor + size > self.end:
                mem = self.dev.mem_alloc(max(self.CHUNK, size), vram=False, host=True, uncached=True)
                self.cursor, self.end = mem.va, mem.va + mem.size
            addr, self.cursor = self.cursor, self.cursor + size
            return addr, size

    def give(self, addr: int, size: int, tag: int) -> None:
        with self.lock:
            self.free.setdefault(size, []).append((addr, tag))


class AMDKernelArgs(KernelArgs):
    """The kernarg segment of one launch in GTT: explicit arguments at the metadata's offsets, hidden arguments
    (work-group sizes and counts, grid dimensions) written when the launch is encoded, then a dispatch packet."""

    def __init__(self, kernel: AMDKernel, dev: AMDDevice, bufs: Sequence[AMDBuffer], vals: Sequence[int] = ()):
        # buffers past the kernel's parameters are ones its code never touches (the renderer left them out)
        if len(bufs) < len(kernel.buffer_args) or len(vals) != len(kernel.value_args):
            raise ValueError(f"kernel {kernel.name} takes {len(kernel.buffer_args)} buffers and "
                             f"{len(kernel.value_args)} values, got {len(bufs)} and {len(vals)}")
        super().__init__(bufs, vals)
        self.kernel, self.dev = kernel, dev
        self.address, size = dev.kernargs.take(kernel.block_bytes)
        weakref.finalize(self, _release_kernargs, dev, self.address, size)
        ctypes.memset(self.address, 0, kernel.block_bytes)
        self.launch: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
        self.last_use = 0  # the timeline value of the latest submission that launches with this block
        for i, b in enumerate(bufs):
            self.update_buffer(i, b)
        for i, v in enumerate(vals):
            self.update_var(i, v)

    def _put(self, offset: int, size: int, value: int) -> None:
        ctypes.memmove(self.address + offset, (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), size)

    def update_buffer(self, index: int, buf: Any) -> None:
        if not 0 <= index < len(self.bufs):
            raise IndexError(f"kernel {self.kernel.name} has {len(self.bufs)} buffers, no buffer {index}")
        super().update_buffer(index, buf)
        if index < len(self.kernel.buffer_args):
            a = self.kernel.buffer_args[index]
            self._put(a.offset, a.size, buf.va)

    def update_var(self, index: int, value: int) -> None:
        if not 0 <= index < len(self.vals):
            raise IndexError(f"kernel {self.kernel.name} has {len(self.vals)} runtime values, no value {index}")
        super().update_var(index, value)
        a = self.kernel.value_args[index]
        self._put(a.offset, a.size, int(value))

    def set_launch(self, groups: tuple[int, int, int], local: tuple[int, int, int]) -> None:
        """Write the hidden arguments and the dispatch packet for this launch shape (once per shape)."""
        if self.launch == (groups, local):
            return
        if self.launch is not None and self.last_use:  # a queued launch of another shape may still read this block
            self.dev.timeline.signal.wait(self.last_use, timeout=self.dev.timeout)
        self.launch = (groups, local)
        values: dict[str, int] = {"hidden_grid_dims": 3}
        for i, axis in enumerate("xyz"):
            values[f"hidden_block_count_{axis}"] = groups[i]
            values[f"hidden_group_size_{axis}"] = local[i]
            values[f"hidden_remainder_{axis}"] = 0
            values[f"hidden_global_offset_{axis}"] = 0
        for a in self.kernel.info.args:
            if a.value_kind.startswith("hidden_"):  # those without a defined meaning here stay zero
                self._put(a.offset, a.size, values.get(a.value_kind, 0))
        # hsa_kernel_dispatch_packet_t, for kernels that read their sizes through the dispatch pointer
        k = self.kernel
        packet = struct.pack("<HHHHHHIIIIIQQQQ", 0, 3, *local, 0, *(g * n for g, n in zip(groups, local)),
                             k.info.private_segment_fixed_size, k.info.group_segment_fixed_size,
                             k.image_mem.va + k.info.descriptor_offset, self.address, 0, 0)
        ctypes.memmove(self.address + k.args_bytes, packet, len(packet))


def _release_kernargs(dev: AMDDevice, address: int, size: int) -> None:
    # a queued launch may still read the block: it is reused only once the timeline passed what was handed out
    dev.kernargs.give(address, size, dev.timeline.last)
