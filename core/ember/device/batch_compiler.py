"""Building the new kernels of a schedule as one program, for compilers with a high cost per build.

A driver build often costs far more than the kernels in it: a kernel-language compiler may parse a
built-in header of many thousand lines for every program (100-200 ms whether the program holds one
kernel or ten), and a C compiler pays process start-up and linking per shared object (~50 ms).
:class:`BatchCompiler` joins the sources of a batch into one program text and builds it once:

- each source keeps its text; its kernel is renamed to a symbol unique in the batch by a
  ``#define`` around the source (``#define E_4 ember_b1_E_4`` ... ``#undef E_4``), so sources with
  the same kernel name can share a program;
- helper definitions a renderer emits must be under include guards, so repeats are harmless;
- every source still gets its own binary (and compile-cache entry): a :class:`KernelBinary`
  holding the shared program and the kernel's symbol in it. A device runtime reads it with
  :meth:`KernelBinary.unpack` and should load each distinct program once.

When a joined build fails, each source of the group is built alone, so the
:class:`~ember.device.compiler.CompileError` shows the source at fault with its own log.
"""
from __future__ import annotations

import abc
import concurrent.futures
import re
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ember.device.compiler import CompileError, Compiler

#: names the packed format; in every binary's header and in the compile-cache key
FORMAT = "ember-kernel-binary-1"
_MAGIC = FORMAT.encode() + b"\0"


class KernelBinary(NamedTuple):
    """One kernel's binary: the program holding it and the kernel's symbol there ("" = its own name)."""

    symbol: str
    program: bytes

    def pack(self) -> bytes:
        """The bytes a compiler returns and the compile cache stores: a header, the symbol, the program."""
        sym = self.symbol.encode()
        return _MAGIC + struct.pack("<I", len(sym)) + sym + self.program

    @staticmethod
    def unpack(data: bytes) -> KernelBinary:
        """Read bytes made by :meth:`pack`; ``ValueError`` for anything else."""
        start = len(_MAGIC) + 4
        if not data.startswith(_MAGIC) or len(data) < start:
            raise ValueError("not an ember kernel binary (made by another compiler, or damaged)")
        (n,) = struct.unpack_from("<I", data, len(_MAGIC))
        if len(data) < start + n:
            raise ValueError("truncated ember kernel binary")
        return KernelBinary(data[start:start + n].decode(), data[start + n:])

    def kernel_symbol(self, name: str) -> str:
        """The symbol to look up for the kernel called ``name``."""
        return self.symbol or name


def join_sources(srcs: Sequence[str], kernel_pattern: re.Pattern[str]) -> tuple[str, list[str]] | None:
    """One program text holding every source, and the symbol of each source's kernel in it.

    ``kernel_pattern``'s first group is a kernel's name. ``None`` when the sources cannot be
    joined safely: a source without exactly one kernel, or a chosen symbol already in some source.
    """
    names: list[str] = []
    for src in srcs:
        found = kernel_pattern.findall(src)
        if len(found) != 1:
            return None
        names.append(found[0])
    symbols = [f"ember_b{i}_{name}" for i, name in enumerate(names)]
    if any(sym in src for sym in symbols for src in srcs):
        return None
    parts: list[str] = []
    for src, name, sym in zip(srcs, names, symbols):
        parts += [f"#define {name} {sym}", src.rstrip("\n"), f"#undef {name}"]
    return "\n".join(parts) + "\n", symbols


class BatchCompiler(Compiler):
    """A compiler that builds a batch of single-kernel sources as one program.

    Subclasses implement :meth:`build` (source text to the driver's program binary) and set
    ``kernel_pattern``; :meth:`compile` and :meth:`compile_batch` return packed
    :class:`KernelBinary` bytes.
    """

    #: a regular expression whose first group is the name of a kernel defined in a source
    kernel_pattern: re.Pattern[str]
    #: the most kernels built as one program (a build's cost grows with its size, and its binary is
    #: stored once per kernel)
    max_batch: int = 32
    #: how many builds may run at once (a compiler in its own process can use every core; a driver
    #: that serializes its builds gains nothing from more than 1)
    parallel_builds: int = 1
    #: with several builds at once, a batch is cut into about this many groups per build slot, each taken
    #: by whichever slot is free: build times vary a lot (one C kernel can take a second, its neighbours
    #: 50 ms), and one slow group then holds up one slot for a while instead of half the batch
    groups_per_build: int = 3
    #: ... but no smaller than this many kernels (each program pays the build's fixed cost once)
    min_group: int = 2

    def __init__(self, cachekey: str | None):
        # the packed format is part of what a cache entry holds: entries of plain binaries never match
        super().__init__(None if cachekey is None else f"{FORMAT}|{cachekey}")

    @abc.abstractmethod
    def build(self, src: str) -> bytes:
        """The program binary for ``src``; raise :class:`CompileError` on failure."""

    def compile(self, src: str) -> bytes:
        """Build ``src`` alone; its kernels keep their names."""
        return KernelBinary("", self.build(src)).pack()

    def compile_batch(self, srcs: Sequence[str]) -> list[bytes]:
        """Build ``srcs`` as few programs as possible: ``max_batch`` kernels each at most, and, when
        ``parallel_builds`` > 1, about ``groups_per_build`` programs per build slot (of ``min_group``
        kernels at least, or more programs when that finishes sooner by the cost estimate), the costliest
        handed first to whichever slot is free."""
        if not srcs:
            return []
        groups = [[srcs[i] for i in group] for group in self._groups(srcs)]
        if len(groups) == 1:
            built = [self._build_group(groups[0])]
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(groups), self.parallel_builds)) as pool:
                built = list(pool.map(self._build_group, groups))
        found = {src: binary for group, binaries in zip(groups, built) for src, binary in zip(group, binaries)}
        return [found[src] for src in srcs]

    def compile_cached_stream(self, srcs: Iterable[str]) -> list[bytes]:
        """Start building while ``srcs`` is still being produced (when builds run in parallel).

        Rendering a kernel (Python) and building one (the compiler's own process) then overlap.
        Whenever a build slot is free, the next few misses rendered so far go to it as one program;
        the misses left when ``srcs`` ends are spread over the slots as :meth:`compile_batch` does.
        Every source is still cached on its own, as with :meth:`compile_cached_many`.
        """
        if self.parallel_builds <= 1:
            return super().compile_cached_stream(srcs)
        order: list[str] = []
        seen: set[str] = set()
        found: dict[str, bytes] = {}
        waiting: list[str] = []
        builds: list[tuple[Sequence[str], concurrent.futures.Future[list[bytes]]]] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.parallel_builds) as pool:
            # leaving the block (also on an error while rendering) waits for the builds under way
            for src in srcs:
                order.append(src)
                if src in seen:
                    continue
                seen.add(src)
                if (binary := self.cached(src)) is not None:
                    found[src] = binary
                    continue
                waiting.append(src)
                if sum(not fut.done() for _, fut in builds) < self.parallel_builds:
                    group, waiting = self._next_few(waiting)
                    builds.append((group, pool.submit(self._build_group, group)))
            if waiting:
                tail = [[waiting[i] for i in group] for group in self._groups(waiting)]
                builds += [(group, pool.submit(self._build_group, group)) for group in tail]
            for built, fut in builds:
                for src, binary in zip(built, fut.result()):
                    found[src] = self.store(src, binary)
        return [found[src] for src in order]

    def _next_few(self, waiting: list[str]) -> tuple[list[str], list[str]]:
        """The program a free build slot takes while sources are still being rendered, and those left waiting:
        the costliest waiting source, with the next costliest while the program stays under a few builds'
        fixed costs (``min_group`` + 1 kernels at most). A long source is built alone: joined with another
        long one, it would hold its slot for both while the other slot may have nothing left to do."""
        order = sorted(waiting, key=self.build_cost, reverse=True)
        group, load = [order[0]], self.build_cost(order[0])
        for src in order[1:min(self.max_batch, self.min_group + 1)]:
            if load + self.build_cost(src) > self.heavy_build:
                break
            group.append(src)
            load += self.build_cost(src)
        taken = set(group)
        return group, [src for src in waiting if src not in taken]

    def _groups(self, srcs: Sequence[str]) -> list[list[int]]:
        """The programs :meth:`compile_batch` builds, as indices into ``srcs``, costliest first.

        About ``groups_per_build`` per build slot of ``min_group`` kernels at least (see the class), each
        filled longest-first so their estimated costs (:meth:`build_cost`) are about equal. When a few
        kernels are far costlier than the rest (a large matrix multiplication among elementwise kernels),
        more and smaller programs can finish sooner on the slots: the count with the shortest estimated
        finish is taken, if it saves more than one build's fixed cost (the estimate is rough)."""
        n = len(srcs)
        slots = self.parallel_builds if self.parallel_builds > 1 else 1
        spread = slots * self.groups_per_build if slots > 1 else 1
        count = max(-(-n // self.max_batch), min(spread, -(-n // self.min_group)))
        costs = [self.build_cost(src) for src in srcs]
        best = _fill(costs, count, self.max_batch)
        if slots > 1:
            finish = _finish(best, costs, slots, self.build_overhead)
            for more in range(count + 1, min(n, 2 * spread) + 1):  # beyond that, more builds only add fixed costs
                groups = _fill(costs, more, self.max_batch)
                if (t := _finish(groups, costs, slots, self.build_overhead)) < finish - self.build_overhead:
                    best, finish = groups, t
        return sorted(best, key=lambda g: -sum(costs[i] for i in g))

    #: the fixed cost of one build (process start, headers, linking), in the units of :meth:`build_cost`
    build_overhead: int = 8000
    #: a program costlier than this gains little from having more kernels joined (a few fixed costs)
    heavy_build: int = 4 * build_overhead

    def build_cost(self, src: str) -> int:
        """An estimate of what building ``src`` costs beyond a build's fixed cost: its length (the compiler's
        work grows with the code, and the unrolled tiles of a large kernel are long)."""
        return len(src)

    def _build_group(self, group: Sequence[str]) -> list[bytes]:
        """One program for ``group`` (or one per source when they cannot be joined or the joined build fails)."""
        joined = join_sources(group, self.kernel_pattern) if len(group) > 1 else None
        if joined is not None:
            try:
                program = self.build(joined[0])
            except CompileError:
                pass  # built one by one below, so the error names the source at fault
            else:
                return [KernelBinary(sym, program).pack() for sym in joined[1]]
        return [self.compile(src) for src in group]


def _fill(costs: Sequence[int], count: int, most: int) -> list[list[int]]:
    """``count`` groups of at most ``most`` indices, filled costliest first into the cheapest group so far."""
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        g = min((g for g in range(count) if len(groups[g]) < most), key=lambda g: loads[g])
        groups[g].append(i)
        loads[g] += costs[i]
    return [sorted(g) for g in groups if g]


def _finish(groups: Sequence[Sequence[int]], costs: Sequence[int], slots: int, overhead: int) -> int:
    """When the last of ``groups`` is built, costliest first, each by the first free of ``slots``."""
    ends = [0] * slots
    for load in sorted((overhead + sum(costs[i] for i in g) for g in groups), reverse=True):
        ends[ends.index(min(ends))] += load
    return max(ends)
