"""A small MessagePack decoder: enough for the metadata note of an AMD code object.

The AMDGPU metadata note (``NT_AMDGPU_METADATA``) is one MessagePack map. Written here rather
than depending on the ``msgpack`` package: the note uses only nil, booleans, integers, floats,
strings, binaries, arrays and maps (the spec's extension types are rejected).
Format reference: https://github.com/msgpack/msgpack/blob/master/spec.md
"""
from __future__ import annotations

import struct
from typing import Any

# fixed-size scalars: type byte -> (struct format, size)
_SCALARS: dict[int, tuple[str, int]] = {
    0xCA: (">f", 4), 0xCB: (">d", 8),
    0xCC: (">B", 1), 0xCD: (">H", 2), 0xCE: (">I", 4), 0xCF: (">Q", 8),
    0xD0: (">b", 1), 0xD1: (">h", 2), 0xD2: (">i", 4), 0xD3: (">q", 8),
}
# length-prefixed values: type byte -> (kind, length format, length size)
_SIZED: dict[int, tuple[str, str, int]] = {
    0xD9: ("str", ">B", 1), 0xDA: ("str", ">H", 2), 0xDB: ("str", ">I", 4),
    0xC4: ("bin", ">B", 1), 0xC5: ("bin", ">H", 2), 0xC6: ("bin", ">I", 4),
    0xDC: ("array", ">H", 2), 0xDD: ("array", ">I", 4),
    0xDE: ("map", ">H", 2), 0xDF: ("map", ">I", 4),
}
#: nesting deeper than this is refused (a corrupt note must not exhaust the stack)
MAX_DEPTH = 64


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"MessagePack data truncated: need {n} bytes at offset {self.pos}, "
                             f"{len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, n: int) -> Any:
        return struct.unpack(fmt, self.take(n))[0]

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"MessagePack data nested deeper than {MAX_DEPTH} levels")
        t = self.take(1)[0]
        if t <= 0x7F:
            return t
        if t >= 0xE0:
            return t - 0x100
        if 0x80 <= t <= 0x8F:
            return self.map(t & 0x0F, depth)
        if 0x90 <= t <= 0x9F:
            return [self.value(depth + 1) for _ in range(t & 0x0F)]
        if 0xA0 <= t <= 0xBF:
            return self.string(t & 0x1F)
        if t == 0xC0:
            return None
        if t in (0xC2, 0xC3):
            return t == 0xC3
        if t in _SCALARS:
            return self.unpack(*_SCALARS[t])
        if t in _SIZED:
            kind, fmt, size = _SIZED[t]
            n = self.unpack(fmt, size)
            if kind == "str":
                return self.string(n)
            if kind == "bin":
                return self.take(n)
            if kind == "array":
                return [self.value(depth + 1) for _ in range(n)]
            return self.map(n, depth)
        raise ValueError(f"unsupported MessagePack type byte 0x{t:02x} at offset {self.pos - 1}")

    def string(self, n: int) -> str:
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"MessagePack string at offset {self.pos - n} is not UTF-8: {e}") from None

    def map(self, n: int, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for _ in range(n):
            key = self.value(depth + 1)
            if isinstance(key, (list, dict)):
                raise ValueError(f"MessagePack map key at offset {self.pos} is a {type(key).__name__}")
            out[key] = self.value(depth + 1)
        return out


def unpackb(data: bytes) -> Any:
    """Decode one MessagePack value that fills ``data``; ``ValueError`` for malformed or trailing bytes."""
    reader = _Reader(bytes(data))
    value = reader.value()
    if reader.pos != len(reader.data):
        raise ValueError(f"{len(reader.data) - reader.pos} bytes after the MessagePack value")
    return value
