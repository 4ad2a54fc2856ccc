"""Reading an AMD GPU code object (an ELF64 shared object for EM_AMDGPU), and adding ember's source section.

What a loader needs from a code object:

- the image: every ``PT_LOAD`` segment placed at its virtual address, ``p_memsz`` zero-filled
  (code objects are linked at address 0, so an offset in the image is an address relative to where
  the image is copied in GPU memory);
- per kernel, the offset of its 64-byte kernel descriptor (symbol ``NAME.kd``) and what the
  metadata note says: the kernel-argument block (size, alignment, each argument's offset, size
  and kind, hidden arguments included), LDS and scratch sizes, register counts, wave size.

The metadata is the ``NT_AMDGPU_METADATA`` note (owner ``AMDGPU``): a MessagePack map
(https://llvm.org/docs/AMDGPUUsage.html#code-object-v3-metadata and later).

:func:`add_section` appends a section that no segment covers (``.ember.source``: the kernel source,
UTF-8), so a cached code object still tells where it came from; loaders only copy ``PT_LOAD``
segments, so real GPUs never see it.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from ember_amd.msgpack_decode import unpackb

EM_AMDGPU = 224
ET_DYN = 3
PT_LOAD, PT_NOTE = 1, 4
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOTE, SHT_DYNSYM = 1, 2, 3, 7, 11
NT_AMDGPU_METADATA = 32
#: the section :mod:`ember_amd.compiler` adds with the kernel source
SOURCE_SECTION = ".ember.source"

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
#: more than this many bytes of image is not a kernel code object (a corrupt header, not a real request)
MAX_IMAGE = 1 << 30


@dataclass(frozen=True)
class ArgInfo:
    """One kernel argument as the metadata lists it (``value_kind`` ``global_buffer``, ``by_value``, ``hidden_*``)."""

    name: str
    offset: int
    size: int
    value_kind: str


@dataclass(frozen=True)
class KernelInfo:
    """What the runtime needs to dispatch one kernel of a code object."""

    name: str
    #: offset of the kernel descriptor (symbol ``NAME.kd``) in :attr:`CodeObject.image`
    descriptor_offset: int
    kernarg_size: int
    kernarg_align: int
    args: list[ArgInfo]
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    sgpr_count: int
    vgpr_count: int
    wavefront_size: int
    max_flat_workgroup_size: int
    #: the kernel's whole metadata map, for anything not named above
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def arg(self, value_kind: str) -> ArgInfo | None:
        """The first argument of kind ``value_kind`` (``hidden_group_size_x`` ...), or None."""
        return next((a for a in self.args if a.value_kind == value_kind), None)

    @property
    def explicit_args(self) -> list[ArgInfo]:
        """The arguments of the kernel's signature (everything but ``hidden_*``)."""
        return [a for a in self.args if not a.value_kind.startswith("hidden_")]


@dataclass(frozen=True)
class CodeObject:
    """A parsed code object: target, loadable image, kernels, and ember's source section when present."""

    arch: str
    image: bytes
    kernels: dict[str, KernelInfo]
    source: str | None
    #: the raw metadata map (``amdhsa.version``, ``amdhsa.target``, ``amdhsa.kernels`` ...)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


def _struct(s: struct.Struct, lib: bytes, offset: int, what: str) -> tuple[Any, ...]:
    if offset < 0 or offset + s.size > len(lib):
        raise ValueError(f"code object truncated: {what} at offset {offset} runs past the end ({len(lib)} bytes)")
    return s.unpack_from(lib, offset)


def _header(lib: bytes) -> tuple[Any, ...]:
    if len(lib) < _EHDR.size or lib[:4] != b"\x7fELF":
        raise ValueError("not an ELF file (no \\x7fELF magic): an AMD code object is an ELF shared object")
    if lib[4] != 2 or lib[5] != 1:
        raise ValueError(f"not a little-endian ELF64 file (class {lib[4]}, data {lib[5]}): AMD code objects are both")
    hdr = _EHDR.unpack_from(lib, 0)
    e_type, e_machine = hdr[1], hdr[2]
    if e_machine != EM_AMDGPU:
        raise ValueError(f"ELF machine is {e_machine}, not EM_AMDGPU ({EM_AMDGPU}): not an AMD GPU code object")
    if e_type != ET_DYN:
        raise ValueError(f"ELF type is {e_type}, not ET_DYN ({ET_DYN}): a relocatable object must be linked first")
    return hdr


def _sections(lib: bytes, hdr: tuple[Any, ...]) -> list[_Section]:
    shoff, shentsize, shnum, shstrndx = hdr[6], hdr[11], hdr[12], hdr[13]
    if shnum == 0:
        return []
    if shentsize != _SHDR.size:
        raise ValueError(f"section header size {shentsize}, expected {_SHDR.size}")
    raw = [_struct(_SHDR, lib, shoff + i * shentsize, f"section header {i}") for i in range(shnum)]
    if shstrndx >= shnum:
        raise ValueError(f"section name table index {shstrndx} out of range ({shnum} sections)")
    names = _bytes(lib, raw[shstrndx][4], raw[shstrndx][5], "section name table")
    return [_Section(_cstr(names, r[0], "section name"), r[1], r[2], r[3], r[4], r[5], r[6], r[9]) for r in raw]


def _bytes(lib: bytes, offset: int, size: int, what: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > len(lib):
        raise ValueError(f"code object truncated: {what} ({size} bytes at offset {offset}) runs past the end "
                         f"({len(lib)} bytes)")
    return lib[offset:offset + size]


def _cstr(table: bytes, offset: int, what: str) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise ValueError(f"{what} offset {offset} is outside its string table ({len(table)} bytes)")
    return table[offset:end].decode("utf-8", errors="replace")


def _image(lib: bytes, hdr: tuple[Any, ...]) -> tuple[bytes, list[bytes]]:
    """The loaded image and the contents of the PT_NOTE segments."""
    phoff, phentsize, phnum = hdr[5], hdr[9], hdr[10]
    if phnum and phentsize != _PHDR.size:
        raise ValueError(f"program header size {phentsize}, expected {_PHDR.size}")
    loads, notes = [], []
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = _struct(_PHDR, lib, phoff + i * phentsize,
                                                                        f"program header {i}")
        if p_type == PT_LOAD:
            if p_filesz > p_memsz:
                raise ValueError(f"PT_LOAD segment {i} has more file bytes ({p_filesz}) than memory ({p_memsz})")
            loads.append((p_vaddr, p_memsz, _bytes(lib, p_offset, p_filesz, f"PT_LOAD segment {i}")))
        elif p_type == PT_NOTE:
            notes.append(_bytes(lib, p_offset, p_filesz, f"PT_NOTE segment {i}"))
    if not loads:
        raise ValueError("code object has no PT_LOAD segment: nothing to load")
    end = max(vaddr + memsz for vaddr, memsz, _ in loads)
    if end > MAX_IMAGE:
        raise ValueError(f"code object image would be {end} bytes: its program headers are corrupt")
    image = bytearray(end)
    for vaddr, _, data in loads:
        image[vaddr:vaddr + len(data)] = data
    return bytes(image), notes


def _notes(blob: bytes) -> list[tuple[str, int, bytes]]:
    """``(owner, type, desc)`` of each note in a PT_NOTE segment (4-byte aligned fields)."""
    out, pos = [], 0
    while pos + 12 <= len(blob):
        namesz, descsz, ntype = struct.unpack_from("<III", blob, pos)
        pos += 12
        name_end = pos + namesz
        desc_start = (name_end + 3) & ~3
        desc_end = desc_start + descsz
        if desc_end > len(blob):
            raise ValueError(f"ELF note of type {ntype} runs past its segment ({desc_end} > {len(blob)} bytes)")
        out.append((blob[pos:name_end].rstrip(b"\0").decode(errors="replace"), ntype, blob[desc_start:desc_end]))
        pos = (desc_end + 3) & ~3
    return out


def _symbols(lib: bytes, sections: list[_Section], defined: bool = True) -> dict[str, int]:
    """Symbol name -> value, from ``.dynsym`` (or ``.symtab``): the defined symbols, or (``defined=False``)
    the undefined ones."""
    out: dict[str, int] = {}
    for sec in sections:
        if sec.type not in (SHT_DYNSYM, SHT_SYMTAB):
            continue
        if sec.link >= len(sections):
            raise ValueError(f"symbol table {sec.name} links to string table {sec.link}, which does not exist")
        strtab = sections[sec.link]
        strings = _bytes(lib, strtab.offset, strtab.size, f"string table {strtab.name}")
        data = _bytes(lib, sec.offset, sec.size, f"symbol table {sec.name}")
        for off in range(0, len(data) - _SYM.size + 1, _SYM.size):
            st_name, _, _, st_shndx, st_value, _ = _SYM.unpack_from(data, off)
            if st_name and (st_shndx != 0) == defined:
                out.setdefault(_cstr(strings, st_name, "symbol name"), st_value)
    return out


def _int(meta: dict[str, Any], key: str, kernel: str, default: int | None = None) -> int:
    value = meta.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"kernel {kernel!r}: metadata {key} is {value!r}, expected an integer")
    return value


def _kernel(meta: Any, symbols: dict[str, int], image_size: int) -> KernelInfo:
    if not isinstance(meta, dict) or not isinstance(meta.get(".name"), str):
        raise ValueError(f"amdhsa.kernels entry without a .name: {meta!r:.200}")
    name = meta[".name"]
    symbol = meta.get(".symbol", f"{name}.kd")
    if symbol not in symbols:
        raise ValueError(f"kernel {name!r}: its descriptor symbol {symbol!r} is not in the symbol table")
    descriptor = symbols[symbol]
    if descriptor + 64 > image_size:
        raise ValueError(f"kernel {name!r}: descriptor at {descriptor:#x} lies outside the image ({image_size} bytes)")
    args: list[ArgInfo] = []
    for i, a in enumerate(meta.get(".args", [])):
        if not isinstance(a, dict):
            raise ValueError(f"kernel {name!r}: argument {i} metadata is {a!r}, expected a map")
        args.append(ArgInfo(str(a.get(".name", "")), _int(a, ".offset", name), _int(a, ".size", name),
                            str(a.get(".value_kind", ""))))
    return KernelInfo(
        name=name, descriptor_offset=descriptor,
        kernarg_size=_int(meta, ".kernarg_segment_size", name),
        kernarg_align=_int(meta, ".kernarg_segment_align", name),
        args=args, group_segment_fixed_size=_int(meta, ".group_segment_fixed_size", name, 0),
        private_segment_fixed_size=_int(meta, ".private_segment_fixed_size", name, 0),
        sgpr_count=_int(meta, ".sgpr_count", name), vgpr_count=_int(meta, ".vgpr_count", name),
        wavefront_size=_int(meta, ".wavefront_size", name),
        max_flat_workgroup_size=_int(meta, ".max_flat_workgroup_size", name), metadata=meta)


def read_code_object(lib: bytes) -> CodeObject:
    """Parse a linked AMD code object; ``ValueError`` naming what is wrong for anything else."""
    lib = bytes(lib)
    hdr = _header(lib)
    sections = _sections(lib, hdr)
    image, note_blobs = _image(lib, hdr)
    if not note_blobs:  # a loader only needs the segments, but the notes may also be found through sections
        note_blobs = [_bytes(lib, s.offset, s.size, s.name) for s in sections if s.type == SHT_NOTE]
    metadata: Any = None
    for blob in note_blobs:
        for owner, ntype, desc in _notes(blob):
            if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
                try:
                    metadata = unpackb(desc)
                except ValueError as e:
                    raise ValueError(f"the AMDGPU metadata note is not valid MessagePack: {e}") from None
    if not isinstance(metadata, dict):
        raise ValueError("code object has no AMDGPU metadata note (NT_AMDGPU_METADATA): built for code-object v2, "
                         "or not by LLVM")
    target = metadata.get("amdhsa.target", "")
    if not isinstance(target, str) or "--gfx" not in target:
        raise ValueError(f"metadata amdhsa.target is {target!r}, expected amdgcn-amd-amdhsa--gfxNNNN")
    arch = target.split("--", 1)[1]
    symbols = _symbols(lib, sections)
    kernels = {k.name: k for k in (_kernel(m, symbols, len(image)) for m in metadata.get("amdhsa.kernels", []))}
    source = None
    for sec in sections:
        if sec.name == SOURCE_SECTION:
            raw = _bytes(lib, sec.offset, sec.size, SOURCE_SECTION)
            try:
                source = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"section {SOURCE_SECTION} is not UTF-8: {e}") from None
    return CodeObject(arch, image, kernels, source, metadata)


def undefined_symbols(lib: bytes) -> list[str]:
    """Names the code object uses but does not define: a loader cannot resolve them (there is no GPU library
    to link against), so a kernel calling a library function such as ``exp`` is unusable."""
    lib = bytes(lib)
    return sorted(_symbols(lib, _sections(lib, _header(lib)), defined=False))


def add_section(lib: bytes, name: str, data: bytes) -> bytes:
    """``lib`` with one more section, ``name`` holding ``data``, that no segment loads (flags 0).

    The data, a new section-name table (the old names plus ``name``) and a new section header table
    are appended; the header points to them. The old tables stay where they were, unreferenced, so
    no offset inside the loaded segments moves.
    """
    lib = bytes(lib)
    hdr = _header(lib)
    sections = _sections(lib, hdr)
    if not sections:
        raise ValueError("code object has no section headers to extend")
    if any(s.name == name for s in sections):
        raise ValueError(f"code object already has a section {name!r}")
    shoff, shentsize, shnum, shstrndx = hdr[6], hdr[11], hdr[12], hdr[13]
    out = bytearray(lib)

    def append(blob: bytes, align: int) -> int:
        out.extend(b"\0" * (-len(out) % align))
        start = len(out)
        out.extend(blob)
        return start

    data_off = append(data, 8)
    old_names = _bytes(lib, sections[shstrndx].offset, sections[shstrndx].size, "section name table")
    name_off = len(old_names)
    names = old_names + name.encode() + b"\0"
    names_off = append(names, 1)
    headers = bytearray(lib[shoff:shoff + shnum * shentsize])
    strtab_hdr = list(_SHDR.unpack_from(headers, shstrndx * shentsize))
    strtab_hdr[4], strtab_hdr[5] = names_off, len(names)
    _SHDR.pack_into(headers, shstrndx * shentsize, *strtab_hdr)
    headers += _SHDR.pack(name_off, SHT_PROGBITS, 0, 0, data_off, len(data), 0, 0, 1, 0)
    new_shoff = append(bytes(headers), 8)
    fields = list(hdr)
    fields[6], fields[12] = new_shoff, shnum + 1
    _EHDR.pack_into(out, 0, *fields)
    return bytes(out)
