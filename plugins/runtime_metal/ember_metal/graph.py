"""Replay a captured list of kernel launches on one METAL device: one command buffer, one encoder.

A replay encodes every call into a single compute encoder (serial dispatch: each launch sees the
memory writes of the one before) and commits once, instead of one command buffer per kernel. The
arguments are checked at capture time, so a replay only sends the encoder messages.

Metal's indirect command buffers (encode once, replay without re-encoding) would also save the
encoding; they need pipelines built with ``supportIndirectCommandBuffers`` and buffers made
resident with ``useResource:``, and are left for when they can be measured on a Mac.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ember_metal.runtime import MetalProgram, check_launch, encode_dispatch, threadgroup_size


class MetalGraph:
    """A batch of kernel calls replayed in order by ``graph(wait=False)``.

    ``calls`` holds ``(program, bufs, vals, global_size)`` or ``(program, bufs, vals, global_size,
    local_size)`` tuples of :class:`~ember_metal.runtime.MetalProgram`\\ s of one device.
    """

    def __init__(self, calls: Sequence[Sequence[Any]]):
        self.programs: list[MetalProgram] = []
        self.bufs: list[list[Any]] = []
        self.vals: list[tuple[int, ...]] = []
        self.sizes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for i, call in enumerate(calls):
            if not 4 <= len(call) <= 5:
                raise ValueError(f"MetalGraph call {i}: expected (program, bufs, vals, global_size[, local_size]), "
                                 f"got {len(call)} items")
            prg, bufs, vals, global_size = call[:4]
            local_size = call[4] if len(call) == 5 else None
            if not isinstance(prg, MetalProgram):
                raise TypeError(f"MetalGraph call {i}: expected a MetalProgram, got {type(prg).__name__}")
            if self.programs and prg.device is not self.programs[0].device:
                raise ValueError(f"MetalGraph call {i}: program of {prg.device.device}, the graph runs on "
                                 f"{self.programs[0].device.device}")
            check_launch(prg.name, bufs, global_size, local_size, prg.max_threads)
            local = tuple(local_size) if local_size is not None else threadgroup_size(global_size, prg.max_threads)
            self.programs.append(prg)
            self.bufs.append(list(bufs))
            self.vals.append(tuple(int(v) for v in vals))
            self.sizes.append((tuple(int(s) for s in global_size), local))

    def __len__(self) -> int:
        return len(self.programs)

    def update_buffer(self, call_index: int, buf_index: int, opaque: Any) -> None:
        """Make argument ``buf_index`` of call ``call_index`` the buffer ``opaque``."""
        self.bufs[call_index][buf_index] = opaque

    def update_vals(self, call_index: int, vals: Sequence[int]) -> None:
        """Replace the int variables of call ``call_index`` (the same count)."""
        if len(vals) != len(self.vals[call_index]):
            raise ValueError(f"MetalGraph call {call_index} takes {len(self.vals[call_index])} int variables, "
                             f"got {len(vals)}")
        self.vals[call_index] = tuple(int(v) for v in vals)

    def __call__(self, wait: bool = False) -> float | None:
        """Encode and commit every call in one command buffer; with ``wait``, the GPU time in seconds."""
        if not self.programs:
            return 0.0 if wait else None
        device = self.programs[0].device
        objc = device.objc
        with objc.pool():
            command_buffer = objc.retain(objc.send(device.queue, "commandBuffer"))
            encoder = objc.send(command_buffer, "computeCommandEncoder")
            for prg, bufs, vals, (global_size, local) in zip(self.programs, self.bufs, self.vals, self.sizes):
                if 0 not in global_size:
                    encode_dispatch(objc, encoder, prg.pipeline, bufs, vals, global_size, local)
            objc.send(encoder, "endEncoding", restype=None)
            objc.send(command_buffer, "commit", restype=None)
        return device.track(command_buffer, wait)
