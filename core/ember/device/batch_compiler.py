"""Building the new kernels of a schedule as one program, for compilers with a high cost per build.

A driver build often costs far more than the kernels in it: a kernel-language compiler may parse a
built-in header of many thousand lines for every program (100-200 ms whether the program holds one
kernel or ten), and a C compiler pays process start-up, its back end's set-up and linking per shared
object (about 24 ms for gcc -O2, as much as 9,000 characters of kernel code).
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
import contextlib
import math
import re
import struct
import sys
import time
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import NamedTuple

from ember.device.compiler import CompileError, Compiler
from ember.helpers import carry_context

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
    #: the fixed cost of one build (process start, headers, the first function's set-up, linking), in the units
    #: of :meth:`build_cost`: a batch is cut into more programs only where that finishes sooner by more than this
    build_overhead: int = 8000
    #: a hedge against wrong estimates (one kernel may build far slower than its length says): a large batch is
    #: cut into up to this many programs per build slot, so a slow program holds up one slot for a while, not
    #: half the batch ...
    groups_per_build: int = 3
    #: ... each still holding at least this many builds' fixed costs of work (so the hedge costs little)
    hedge_work: int = 4

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
        """Build ``srcs`` as few programs as finish soonest (see :meth:`_groups`), ``max_batch`` kernels each at
        most, the costliest handed first to whichever build slot is free."""
        if not srcs:
            return []
        groups = [[srcs[i] for i in group] for group in self._groups(srcs)]
        if len(groups) == 1:
            built = [self._build_group(groups[0])]
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(groups), self.parallel_builds)) as pool:
                # the builds see this thread's knobs (CACHELEVEL, DEBUG set with Context)
                futures = [pool.submit(carry_context(self._build_group), group) for group in groups]
                built = [f.result() for f in futures]
        found = {src: binary for group, binaries in zip(groups, built) for src, binary in zip(group, binaries)}
        return [found[src] for src in srcs]

    def compile_cached_stream(self, srcs: Iterable[str]) -> list[bytes]:
        """Start building while ``srcs`` is still being produced (when builds run in parallel).

        Rendering a kernel (Python, one core) and building one (the compiler's own process) then overlap. While
        sources are still coming, ``parallel_builds - 1`` slots build (the last core renders): whenever one is
        free and the misses rendered so far are worth a build's fixed cost, it takes all of them as one program
        (they pile up while it builds, so programs grow as rendering outpaces the compiler, and each fixed cost
        is paid rarely). The misses left when ``srcs`` ends are spread over every slot as :meth:`compile_batch`
        does (:meth:`_hand_out_rest`). A ``srcs`` with a length (the engine's) says how much is still to come:
        near its end a free slot takes only its share of the pile (:func:`_share_while_streaming`), and when one
        source is left, what piled up waits for it rather than go to one slot. Every source is still cached on
        its own, as with :meth:`compile_cached_many`.
        """
        if self.parallel_builds <= 1:
            return super().compile_cached_stream(srcs)
        total = len(srcs) if isinstance(srcs, Sized) else None
        order: list[str] = []
        seen: set[str] = set()
        found: dict[str, bytes] = {}
        waiting: list[str] = []
        waiting_cost = missed_cost = 0
        builds: list[_Build] = []
        streaming_slots = max(1, self.parallel_builds - 1)
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.parallel_builds) as pool, _quick_handoffs():
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
                waiting_cost += (cost := self.build_cost(src))
                missed_cost += cost
                if waiting_cost >= self.build_overhead and \
                        sum(b.end is None for b in builds) < streaming_slots and \
                        not _tail_is_near(total, len(order)):
                    share = _share_while_streaming(waiting_cost, builds, total, len(order), started, missed_cost)
                    take, taken_cost = 0, 0
                    while take < min(len(waiting), self.max_batch) and (take == 0 or taken_cost < share):
                        taken_cost += self.build_cost(waiting[take])
                        take += 1
                    group, waiting = waiting[:take], waiting[take:]
                    waiting_cost = sum(map(self.build_cost, waiting))
                    builds.append(self._submit(pool, group))
            if waiting:
                self._hand_out_rest(pool, waiting, builds)
            for build in builds:
                for src, binary in zip(build.group, build.future.result()):
                    found[src] = self.store(src, binary)
        return [found[src] for src in order]

    def _hand_out_rest(self, pool: concurrent.futures.ThreadPoolExecutor, waiting: list[str],
                       builds: list[_Build]) -> None:
        """Build the sources left when a stream ends (appending their builds to ``builds``).

        With a slot still busy with the stream's last build, the free slots take their programs of a plan that
        has every slot free, and the rest is planned when a slot comes free. What a busy build has left is known
        only from the pace of the builds done, and the first of those runs while the program starts (at about
        60% of the later builds' pace, measured): planned with that pace, a free slot took two thirds of the
        rest while the other came free 2 ms later. A free slot never gets more than an even share this way, and
        when the busy one takes long after all, the second plan (with a better pace) gives it less."""
        running = [b for b in builds if not b.future.done()]
        free = self.parallel_builds - len(running)
        if running and free > 0:
            plan = [[waiting[i] for i in group] for group in self._groups(waiting)]
            builds += [self._submit(pool, group) for group in plan[:free]]
            waiting = [src for group in plan[free:] for src in group]
            if not waiting:
                return
            running = [b for b in builds if not b.future.done()]
            if len(running) >= self.parallel_builds:  # (the busy one may have ended meanwhile)
                concurrent.futures.wait([b.future for b in running], return_when=concurrent.futures.FIRST_COMPLETED)
        busy = _remaining([b for b in builds if not b.future.done()])
        builds += [self._submit(pool, [waiting[i] for i in group]) for group in self._groups(waiting, busy)]

    def _submit(self, pool: concurrent.futures.ThreadPoolExecutor, group: list[str]) -> _Build:
        cost = self.build_overhead + sum(map(self.build_cost, group))
        return _Build(group, pool.submit(carry_context(self._build_group), group), cost)

    def _groups(self, srcs: Sequence[str], busy: Sequence[float] = ()) -> list[list[int]]:
        """The programs :meth:`compile_batch` builds, as indices into ``srcs``, in the order to hand them out.

        Each count of programs is filled longest-first so their estimated costs (:meth:`build_cost`) are about
        equal, and the count whose builds finish soonest on the slots takes it, a count with more programs only
        where it saves more than half a build's fixed cost (``build_overhead``; a margin against wrong estimates:
        at the end of a stream a whole fixed cost kept the last kernels in one program while a slot that was
        about to be free idled, ~50 ms of an MLP's first step): cheap kernels share one program,
        a batch worth more than a fixed cost per slot is spread over the slots, and a kernel far costlier than
        the rest gets a program of its own. A large batch is cut further as a hedge (``groups_per_build``).

        ``busy``: the estimated work left in builds already under way, one per slot they hold. Programs that
        will wait for those slots get less work, and are handed out last."""
        n = len(srcs)
        slots = max(1, self.parallel_builds)
        busy = sorted(busy)[:slots - 1] if slots > 1 else []
        free = slots - len(busy)
        costs = [self.build_cost(src) for src in srcs]
        least = -(-n // self.max_batch)
        best = _fill(costs, least, self.max_batch, free, busy)
        if slots > 1:
            finish = _finish(best, costs, slots, self.build_overhead, busy)
            for more in range(least + 1, min(n, 2 * slots * self.groups_per_build) + 1):
                groups = _fill(costs, more, self.max_batch, free, busy)
                if (t := _finish(groups, costs, slots, self.build_overhead, busy)) < finish - self.build_overhead / 2:
                    best, finish = groups, t
            hedge = min(n, slots * self.groups_per_build, sum(costs) // (self.hedge_work * self.build_overhead))
            if hedge > len(best):
                best = _fill(costs, hedge, self.max_batch, free, busy)
        return best

    def build_cost(self, src: str) -> int:
        """An estimate of what building ``src`` costs beyond a build's fixed cost: the length of its text from
        its kernel on (the compiler's work grows with the code, and the unrolled tiles of a large kernel are
        long; the helper definitions before it are under include guards, read once per program)."""
        found = self.kernel_pattern.search(src)
        return len(src) - (found.start() if found else 0)

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


#: the interpreter's switch interval while a stream builds (the default is 5 ms): a build thread waits for the
#: interpreter at every step between two compiler processes (reading the result, starting the next), and with
#: the rendering thread holding it each wait took up to the whole interval (a slot idled 15-20 ms after a build)
STREAM_SWITCH_INTERVAL = 0.0005


@contextlib.contextmanager
def _quick_handoffs() -> Iterator[None]:
    """Let waiting threads take the interpreter sooner while the block runs (the previous interval after it)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, STREAM_SWITCH_INTERVAL))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class _Build:
    """A program handed to a build slot: its sources, its result, its estimated cost, when it started and ended."""

    def __init__(self, group: list[str], future: concurrent.futures.Future[list[bytes]], cost: float):
        self.group, self.future, self.cost = group, future, cost
        self.start = time.perf_counter()
        self.end: float | None = None
        future.add_done_callback(self._done)

    def _done(self, _: object) -> None:
        self.end = time.perf_counter()


def _tail_is_near(total: int | None, produced: int) -> bool:
    """Whether at most one source of the ``total`` is still to come: the waiting sources had better wait for it
    and be spread with it over every slot (a stream that ended just after one slot took everything left had that
    slot build alone while the others idled). Further from the end, the rendering pace says little about when it
    ends: a schedule's costliest kernels (the matmuls' register tiles) tend to come last."""
    return total is not None and total - produced <= 1


def _pace(builds: Sequence[_Build]) -> float | None:
    """Cost units built per second by the builds done so far (``None`` before one is done)."""
    ends = [(b, b.end) for b in builds if b.end is not None]
    spent = sum(end - b.start for b, end in ends)
    return sum(b.cost for b, _ in ends) / spent if ends and spent > 0 else None


def _remaining(builds: Sequence[_Build]) -> list[float]:
    """The estimated work left in each build still under way, in cost units: its estimate less what the time
    since it started is worth at the pace of the builds done so far (half its estimate before any is done)."""
    now, pace = time.perf_counter(), _pace(builds)
    return [max(0.0, b.cost - (now - b.start) * pace) if pace is not None else b.cost / 2
            for b in builds if b.end is None]


def _share_while_streaming(piled: float, builds: Sequence[_Build], total: int | None, produced: int,
                           started: float, missed: float) -> float:
    """How much of the ``piled`` cost a slot that comes free while sources still come should take (all of it when
    this is at least ``piled``): what makes it end with the slot that renders now, which starts building when the
    stream ends and then takes the rest and the sources still to come. Those are estimated at the averages so far
    of the ``total`` sources (``produced`` since ``started``, of which the compiler's misses cost ``missed``).

    A share smaller than the pile is at most half of it: the sources still to come are estimated at the average
    so far, while a schedule's costliest kernels (the matmuls' register tiles) tend to come last.

    The slot took all that piled up whenever it was free: when the compiler fell behind near the end, it built
    14 kernels alone (~190 ms) while the other slot had only the last two, rendered 15 ms later."""
    pace = _pace(builds)
    if total is None or pace is None or produced == 0:
        return math.inf  # nothing to go by (a stream of unknown length, no build done): take it all
    left = total - produced
    rendering_left = (time.perf_counter() - started) / produced * left
    to_come = missed / produced * left
    share = (piled + to_come + pace * rendering_left) / 2
    return share if share >= piled else min(share, piled / 2)


def _fill(costs: Sequence[int], count: int, most: int, free: int, busy: Sequence[float] = ()) -> list[list[int]]:
    """``count`` groups of at most ``most`` indices, filled costliest first into the cheapest group so far, in
    the order to hand them out: the costliest first. When ``free`` slots are idle and more groups than that
    are made, groups beyond them start after the ``busy`` loads (least first): they get less, and come last."""
    later = list(busy)[:max(0, count - free)]
    start = [0.0] * (count - len(later)) + sorted(later)
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = list(start)
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        g = min((g for g in range(count) if len(groups[g]) < most), key=lambda g: loads[g])
        groups[g].append(i)
        loads[g] += costs[i]
    now = sorted((g for g, s in zip(groups, start) if g and not s), key=lambda g: -sum(costs[i] for i in g))
    after = [g for g, s in zip(groups, start) if g and s]
    return [sorted(g) for g in now + after]


def _finish(groups: Sequence[Sequence[int]], costs: Sequence[int], slots: int, overhead: int,
            busy: Sequence[float] = ()) -> float:
    """When the last of ``groups`` is built, handed out in order, each to the first free of ``slots`` (of
    which some are ``busy`` with that much work first)."""
    ends = sorted(busy)[:slots] + [0.0] * max(0, slots - len(busy))
    for g in groups:
        ends[ends.index(min(ends))] += overhead + sum(costs[i] for i in g)
    return max(ends)
