"""Lowering ScheduleItems to runnable ExecItems, and running them.

A kernel AST is compiled once per device: ``method_cache`` maps (device, ast) to a
:class:`CompiledRunner`, and the device's compiler keeps its own memory + disk cache keyed by
source, so a second process compiles nothing. :func:`lower_schedule` lowers a whole schedule
before anything runs and hands the device compiler all its new kernels together
(:meth:`~ember.device.compiler.Compiler.compile_cached_stream`), so a driver with a high cost per
build pays it once per schedule rather than once per kernel, and one that builds in other processes
overlaps the builds with rendering.

Under ``BEAM`` a kernel that was never searched is lowered when its turn to run comes instead
(:func:`run_schedule_searching`): the kernels before it have computed its inputs by then, so the search
times its candidates on copies of the real buffers. The rest of the schedule is still compiled in one batch.
"""
from __future__ import annotations

import dataclasses
import pathlib
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ember import diskcache
from ember.codegen import ProgramSpec, get_program, search
from ember.codegen.cachekey import lowering_key as _lowering_key
from ember.device.buffer import Buffer
from ember.device.collective import reduce_through_host
from ember.device.registry import Device
from ember.dtype import dtypes
from ember.engine import corpus, runtime_consts, tiers
from ember.helpers import BEAM, DEBUG, NOOPT, GlobalCounters, colored, gc_paused, getenv
from ember.ir.shapetracker import ShapeTracker
from ember.ir.uop import Ops, UOp
from ember.schedule import ScheduleItem


class Runner:
    """Something an ExecItem can run: a compiled kernel or a copy."""

    display_name: str = ""
    device: str = ""
    estimated_ops: int = 0
    estimated_mem: int = 0

    def __call__(self, bufs: list[Buffer], wait: bool = False, var_vals: dict[str, int] | None = None) -> float | None:
        raise NotImplementedError


class CompiledRunner(Runner):
    """A kernel compiled for one device."""

    def __init__(self, device: str, spec: ProgramSpec, binary: bytes | None = None, var_names: tuple[str, ...] = ()):
        """Load ``spec``'s kernel on ``device`` from ``binary`` (compiled here, through the caches, when not given).

        ``var_names`` are the kernel's symbolic variables in launch order (``vals``): sorted by name.
        """
        self.device, self.spec, self.var_names = device, spec, var_names
        self.display_name = spec.name
        self.estimated_ops, self.estimated_mem = spec.estimated_ops, spec.estimated_mem
        dev = Device[device]
        if DEBUG >= 4:
            print(spec.src)
        self.binary = dev.compiler.compile_cached(spec.src) if binary is None else binary
        try:
            self.program = dev.runtime(spec.name, self.binary)
        except Exception:  # noqa: BLE001
            # an intact cache entry the runtime will not load (planted, or left by a broken build): build it
            # again, once; a fresh binary that fails to load raises
            dev.compiler.invalidate(spec.src)
            self.binary = dev.compiler.compile_cached(spec.src)
            self.program = dev.runtime(spec.name, self.binary)

    def load(self, binary: bytes) -> bool:
        """Run ``binary`` (another build of this kernel's source) from now on; False when the runtime refuses it
        (the current program stays)."""
        try:
            program = Device[self.device].runtime(self.spec.name, binary)
        except Exception:  # noqa: BLE001  (a build the runtime will not load: keep the one that works)
            return False
        self.binary, self.program = binary, program
        return True

    def __call__(self, bufs: list[Buffer], wait: bool = False, var_vals: dict[str, int] | None = None) -> float | None:
        return self.program(*[b._buf for b in bufs], global_size=self.spec.global_size,
                            local_size=self.spec.local_size, vals=self.vals(var_vals), wait=wait)

    def vals(self, var_vals: dict[str, int] | None) -> tuple[int, ...]:
        """The launch values of this kernel's variables, from a name -> value map."""
        if not self.var_names:
            return ()
        try:
            return tuple(var_vals[n] for n in self.var_names)  # type: ignore[index]
        except (KeyError, TypeError):
            raise RuntimeError(f"kernel {self.display_name} needs values for {', '.join(self.var_names)}; "
                               f"got {var_vals or {}}") from None


class BufferCopy(Runner):
    """Copy between devices: ``nbytes`` from ``src_offset`` bytes into the source buffer, to ``dest_offset`` bytes
    into the destination (the whole destination unless a gathering copy places several sources in it).

    Between two devices of one plugin (``CL`` and ``CL:1``) the destination allocator's ``transfer``
    copies without the host when it can (from a range of the source through the source allocator's
    ``offset``). Otherwise the bytes go through host memory once: straight from (or into) the zero-copy
    host view of whichever side has one (``as_buffer``), and through a staging copy only when neither has.
    """

    def __init__(self, nbytes: int, dest_device: str, src_device: str, src_offset: int = 0, dest_offset: int = 0):
        self.nbytes, self.device, self.src_device, self.src_offset = nbytes, dest_device, src_device, src_offset
        self.dest_offset = dest_offset
        at = f"@{src_offset}" if src_offset else ""
        into = f"@{dest_offset}" if dest_offset else ""
        self.display_name = f"copy {nbytes:8d}, {dest_device[:7]:>7s}{into} <- {src_device[:7]}{at:7s}"
        self.estimated_mem = nbytes
        self.same_plugin = Device.origin(dest_device) == Device.origin(src_device)

    def __call__(self, bufs: list[Buffer], wait: bool = False, var_vals: dict[str, int] | None = None) -> float | None:
        dest, src = bufs
        n = self.nbytes
        if self.src_offset + n > src.nbytes or self.dest_offset + n > dest.nbytes:
            raise ValueError(f"copy of {n} bytes from offset {self.src_offset} of a {src.nbytes}-byte buffer on "
                             f"{src.device} to offset {self.dest_offset} of a {dest.nbytes}-byte buffer on "
                             f"{dest.device}")
        st = time.perf_counter()
        dest.allocate()
        src_dev, dest_dev = Device[src.device], Device[dest.device]
        src_dev.synchronize()
        whole = dest
        target: Buffer | None = dest
        if self.dest_offset or n != dest.nbytes:  # a range of the destination: through a view of it
            try:
                target = Buffer(dest.device, n, dtypes.uint8, dest.allocator.offset(dest.opaque, self.dest_offset, n))
            except NotImplementedError:  # (no view of that range: patch the whole buffer through the host)
                data = bytearray(whole.as_bytes())
                data[self.dest_offset:self.dest_offset + n] = memoryview(src.as_bytes())[self.src_offset:
                                                                                         self.src_offset + n]
                whole.copyin(memoryview(data))
                target = None
        if target is not None and not (self.same_plugin
                                       and _transfer(target, src, src_dev, dest_dev, self.src_offset)):
            _copy_through_host(target, src, dest_dev, self.src_offset)
        if wait:
            Device[whole.device].synchronize()
            return time.perf_counter() - st
        return None


class AllreduceRunner(Runner):
    """An allreduce by the devices' native collective (:mod:`ember.device.collective`): the buffers are the n
    outputs (one per device of the group, in order), then the n partials. A driver that raises
    ``NotImplementedError`` (a dtype or op it lacks) has the buffers combined through host memory instead."""

    def __init__(self, op: str, devices: list[str], nbytes: int):
        self.op, self.devices, self.device = op, devices, devices[0]
        self.n_outputs = len(devices)  # (the jit's input checks: every output buffer is written)
        self.display_name = f"allreduce {op} {nbytes:8d} over {len(devices)}"
        self.estimated_mem = 2 * nbytes * len(devices)

    def __call__(self, bufs: list[Buffer], wait: bool = False, var_vals: dict[str, int] | None = None) -> float | None:
        n = len(self.devices)
        dests, srcs = bufs[:n], bufs[n:]
        st = time.perf_counter()
        devs = [Device[d] for d in self.devices]
        for b in bufs:
            b.allocate()
        for d in devs:
            d.synchronize()
        try:
            devs[0].allreduce([b.opaque for b in srcs], [b.opaque for b in dests], devs, srcs[0].dtype, self.op)
        except NotImplementedError:
            reduce_through_host(srcs, dests, srcs[0].dtype, self.op)
        if wait:
            for d in devs:
                d.synchronize()
            return time.perf_counter() - st
        return None


def _host_view(buf: Buffer) -> memoryview | None:
    """The zero-copy host view of ``buf``'s memory, or None when its allocator has none."""
    try:
        return buf.allocator.as_buffer(buf.opaque)
    except (NotImplementedError, AttributeError):
        return None


def _source_range(dest: Buffer, src: Buffer, offset: int) -> Any:
    """The source allocator's handle of the ``dest.nbytes`` bytes of ``src`` from ``offset`` (NotImplementedError
    when its allocator makes no sub-buffers)."""
    if offset == 0:
        return src.opaque
    return src.allocator.offset(src.opaque, offset, dest.nbytes)


def _transfer(dest: Buffer, src: Buffer, src_dev: Any, dest_dev: Any, offset: int = 0) -> bool:
    """Copy with the plugin's own ``Allocator.transfer``; False when it has none (``NotImplementedError``)."""
    try:
        dest.allocator.transfer(dest.opaque, _source_range(dest, src, offset), dest.nbytes, src_dev, dest_dev)
    except NotImplementedError:
        return False
    return True


def _copy_through_host(dest: Buffer, src: Buffer, dest_dev: Any, offset: int = 0) -> None:
    """One pass through host memory: from the source's host view, into the destination's, or via a staging copy."""
    n = dest.nbytes
    if (view := _host_view(src)) is not None:
        dest.copyin(view[offset:offset + n])
        return
    if (view := _host_view(dest)) is not None:
        try:
            part = _source_range(dest, src, offset)
        except NotImplementedError:
            part = None
        if part is not None:
            dest_dev.synchronize()  # kernels queued on the destination may still read the old contents
            Device[src.device].synchronize()
            if n:
                src.allocator.copyout(view, part)
            return
    dest.copyin(memoryview(src.as_bytes())[offset:offset + n])


class KernelCache(OrderedDict):
    """The process's compiled kernels by (device, ast), bounded: least recently used first out.

    A loaded kernel holds process resources (a CPU kernel is a shared library: a handful of memory
    mappings, of which a process may have only about 65,000), so a long run that builds ever new kernels
    (random graphs, changing shapes) would otherwise fail to load one after some ten thousand. An evicted
    kernel is unloaded once nothing uses it (a TinyJit keeps its own), and built again from the disk cache
    if it comes back. ``KERNEL_CACHE_SIZE`` (default 2048) sets the bound; 0 means no bound.
    """

    def __init__(self, maxsize: int | None = None):
        super().__init__()
        self.maxsize = int(getenv("KERNEL_CACHE_SIZE", 2048)) if maxsize is None else maxsize

    def get(self, key: Any, default: Any = None) -> Any:
        """The kernel for ``key`` (now the most recently used), or ``default``."""
        if key in self:
            self.move_to_end(key)
            return super().__getitem__(key)
        return default

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while self.maxsize > 0 and len(self) > self.maxsize:
            self.popitem(last=False)


method_cache: KernelCache = KernelCache()


def get_runner(device: str, ast: UOp) -> CompiledRunner:
    """The compiled kernel for ``ast`` on ``device`` (lowered and compiled at most once per process;
    both steps are also cached on disk, so a new process with a warm cache does neither)."""
    key = (device, ast)
    if (hit := method_cache.get(key)) is not None:
        return hit
    runner = method_cache[key] = CompiledRunner(device, program_for(device, ast), var_names=ast_var_names(ast))
    return runner


def ast_var_names(ast: UOp) -> tuple[str, ...]:
    """The names of the symbolic variables a kernel AST takes, in launch order (sorted)."""
    names = {u.arg[0] for u in ast.toposort() if u.op is Ops.DEFINE_VAR}
    for u in ast.toposort():
        if u.op in (Ops.VIEW, Ops.STORE) and isinstance(u.arg, ShapeTracker):
            names |= u.arg.var_names()
    return tuple(sorted(names))


def program_for(device: str, ast: UOp) -> ProgramSpec:
    """The rendered program for ``ast`` on ``device`` (from the disk lowering cache when possible)."""
    corpus.record(ast)
    renderer = Device[device].renderer
    entry = _lowered_entry(renderer, ast)  # (its key serializes the AST and the renderer: made once)
    spec = None if DEBUG >= 5 else _load_lowered(entry)
    if spec is None:
        with gc_paused():  # (until the linear program is dropped: a collection would walk all of its nodes)
            spec = get_program(ast, renderer)
            _store_lowered(entry, spec)
            # a runner needs the source, not the linear program (a spec read from the cache has none either):
            # its thousands of nodes (a register tile's) would outlive the step, each collection walking them
            spec = dataclasses.replace(spec, uops=())
    elif DEBUG >= 3:
        print(f"{spec.name:32s} opts {list(spec.opts)} (cached)")
    return spec


def _compile_new_kernels(schedule: Sequence[ScheduleItem]) -> None:
    """Lower every kernel of ``schedule`` missing from ``method_cache`` and compile them, one batch per device.

    The device compiler gets the sources as they are rendered
    (:meth:`~ember.device.compiler.Compiler.compile_cached_stream`): one that builds in other
    processes starts on the first kernels while Python renders the rest."""
    new_keys = dict.fromkeys((si.bufs[0].device, si.ast) for si in schedule
                           if si.ast.op not in (Ops.COPY, Ops.ALLREDUCE))
    pending = [key for key in new_keys if key not in method_cache]
    for device in dict.fromkeys(dev for dev, _ in pending):
        keys = [key for key in pending if key[0] == device]
        compiler = Device[device].compiler
        specs: list[ProgramSpec] = []
        slow: list[int] = []  # kernels running from a quick build, to upgrade
        clock = _BatchClock()
        if tiers.enabled() and compiler.quick_tier() is not None:
            binaries, slow = tiers.quick_binaries(compiler, _Rendering(keys, specs, clock))
        else:
            binaries = compiler.compile_cached_stream(_Rendering(keys, specs, clock))
        if DEBUG >= 2:
            print(clock.report(device, len(keys)))
        runners = [CompiledRunner(device, spec, binary, ast_var_names(key[1]))
                   for key, spec, binary in zip(keys, specs, binaries)]
        for key, runner in zip(keys, runners):
            method_cache[key] = runner
        if slow:  # from the list, not the cache: a schedule larger than the cache's bound evicts its own kernels
            tiers.upgrade_later(compiler, [runners[i] for i in slow])


class _Rendering:
    """Each kernel's source, rendered when asked for; its program spec is appended to ``specs``. It has a length
    (the number of kernels), so a compiler that builds while sources still come knows how many are left."""

    def __init__(self, keys: Sequence[tuple[str, UOp]], specs: list[ProgramSpec], clock: _BatchClock):
        self.keys, self.specs, self.clock = keys, specs, clock

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[str]:
        for key in self.keys:
            start = time.perf_counter()
            self.specs.append(program_for(*key))
            self.clock.rendering += time.perf_counter() - start
            yield self.specs[-1].src


def _children_cpu() -> float:
    """CPU seconds of this process's finished child processes (the compiler's), or 0 where that is unknown."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class _BatchClock:
    """Where the time of getting a batch of new kernels ready goes (printed under ``DEBUG>=2``): lowering and
    rendering in Python, waiting for the compiler after that, and the compiler processes' CPU time."""

    def __init__(self) -> None:
        self.start, self.children, self.built = time.perf_counter(), _children_cpu(), GlobalCounters.kernels_compiled
        self.rendering = 0.0

    def report(self, device: str, kernels: int) -> str:
        total = time.perf_counter() - self.start
        built = GlobalCounters.kernels_compiled - self.built
        children = _children_cpu() - self.children  # (a compiler that builds in this process has none)
        processes = f" ({children:.2f} s CPU in compiler processes)" if children >= 0.005 else ""
        return (f"{device}: {kernels} new kernel{'s' if kernels != 1 else ''} ready in {total:.3f} s: lowering and "
                f"rendering {self.rendering:.3f} s, then {max(0.0, total - self.rendering):.3f} s waiting for the "
                f"compiler; {built} built{processes}, {kernels - built} from the cache")


def _lowered_entry(renderer: Any, ast: UOp) -> pathlib.Path | None:
    """Where the lowering of ``ast`` for ``renderer`` is cached on disk (``None``: the disk cache is off)."""
    return diskcache.entry_path("lowered", _lowering_key(renderer, ast))


def _load_lowered(path: pathlib.Path | None) -> ProgramSpec | None:
    payload = diskcache.read(path) if path is not None else None
    if payload is None:
        return None
    try:
        fields = diskcache.restricted_loads(payload)  # ember's own classes only: an entry never runs code
        return ProgramSpec(**fields, uops=())
    except Exception:  # noqa: BLE001  (an entry from an incompatible version: lower again)
        diskcache.invalidate(path)
        return None


def _store_lowered(path: pathlib.Path | None, spec: ProgramSpec) -> None:
    if path is not None:
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "uops"}
        diskcache.write(path, pickle.dumps(fields))


@dataclass
class ExecItem:
    """A runner bound to its buffers."""

    prg: Runner
    bufs: list[Buffer]
    metadata: list[str] = field(default_factory=list)
    var_vals: dict[str, int] = field(default_factory=dict)

    def run(self, wait: bool = False) -> float | None:
        for b in self.bufs:
            b.allocate()
        et = self.prg(self.bufs, wait=wait or DEBUG >= 2, var_vals=self.var_vals)
        GlobalCounters.kernel_count += isinstance(self.prg, CompiledRunner)
        GlobalCounters.global_ops += self.prg.estimated_ops
        GlobalCounters.global_mem += self.prg.estimated_mem
        if et is not None:
            GlobalCounters.time_sum_s += et
        if DEBUG >= 2:
            t = et or 1e-9
            name = self.prg.display_name
            moves = isinstance(self.prg, (BufferCopy, AllreduceRunner))
            color = "yellow" if moves else ("green" if name.startswith("r_") else "cyan")
            print(f"*** {self.prg.device[:7]:7s} {GlobalCounters.kernel_count:4d} {colored(f'{name:32s}', color)} "
                  f"arg {len(self.bufs):2d} mem {GlobalCounters.mem_used / 1e9:5.2f} GB "
                  f"tm {t * 1e6:9.2f}us/{GlobalCounters.time_sum_s * 1e3:9.2f}ms "
                  f"({self.prg.estimated_ops / t / 1e9:8.2f} GFLOPS {self.prg.estimated_mem / t / 1e9:7.2f} GB/s)")
        return et


def lower_schedule_item(si: ScheduleItem) -> ExecItem:
    """Turn one ScheduleItem into an ExecItem (compiling on first sight)."""
    bufs = list(si.bufs)
    if si.ast.op is Ops.ALLREDUCE:
        op, n = si.ast.arg
        return ExecItem(AllreduceRunner(op, [b.device for b in bufs[:n]], bufs[0].nbytes), bufs)
    if si.ast.op is Ops.COPY:
        # (size, src_offset) or, for a piece of a gathering copy, (size, src_offset, dest_offset), in elements
        size, offset, into = (*si.ast.arg, 0)[:3] if isinstance(si.ast.arg, tuple) else (bufs[0].size, 0, 0)
        item = bufs[1].dtype.itemsize
        return ExecItem(BufferCopy(size * item, bufs[0].device, bufs[1].device, offset * item, into * item), bufs)
    return ExecItem(get_runner(bufs[0].device, si.ast), bufs, var_vals=dict(si.var_vals))


def lower_schedule(schedule: Sequence[ScheduleItem]) -> list[ExecItem]:
    """Turn a whole schedule into ExecItems, compiling its new kernels together (one batch per device).

    Float constants that changed since an earlier kernel of the same shape become input buffers first
    (:mod:`ember.engine.runtime_consts`), so a Python float that changes every step compiles once."""
    if tiers.pending:
        tiers.apply()
    schedule = [runtime_consts.parameterize(si) for si in schedule]
    _compile_new_kernels(schedule)
    return [lower_schedule_item(si) for si in schedule]


#: callbacks that see every ExecItem :func:`run_schedule` runs (the jit records a function's kernels)
capturing: list[Callable[[ExecItem], None]] = []


def run_schedule(schedule: list[ScheduleItem], wait: bool = False) -> None:
    """Lower every item (compiling what is new), then run them in order.

    Under ``BEAM`` a kernel not searched before is searched when its turn comes, after the kernels before it
    have computed its inputs, so its candidates are timed and checked on copies of its real buffers
    (:func:`run_schedule_searching`)."""
    if BEAM >= 1 and not NOOPT:
        run_schedule_searching(schedule, wait)
        return
    for ei in lower_schedule(schedule):
        ei.run(wait=wait)
        for capture in capturing:
            capture(ei)


def run_schedule_searching(schedule: Sequence[ScheduleItem], wait: bool = False) -> None:
    """Run ``schedule`` under ``BEAM``: kernels whose opts are known (compiled in this process, lowered or
    searched in any) are compiled together first, as :func:`lower_schedule` does; each of the others is
    searched (:func:`~ember.codegen.search.beam_search`) just before it runs, on copies of its buffers."""
    if tiers.pending:
        tiers.apply()
    items = [runtime_consts.parameterize(si) for si in schedule]
    to_search = {(si.bufs[0].device, si.ast) for si in items
                 if si.ast.op not in (Ops.COPY, Ops.ALLREDUCE) and _needs_search(si)}
    _compile_new_kernels([si for si in items if (si.bufs[0].device, si.ast) not in to_search])
    for si in items:
        if (si.bufs[0].device, si.ast) in to_search and (si.bufs[0].device, si.ast) not in method_cache:
            _search_and_compile(si)
        ei = lower_schedule_item(si)
        ei.run(wait=wait)
        for capture in capturing:
            capture(ei)


def _needs_search(si: ScheduleItem) -> bool:
    """Whether lowering ``si``'s kernel would run a BEAM search: nothing compiled, lowered or searched for it
    before, and sizes BEAM can time."""
    device = si.bufs[0].device
    if (device, si.ast) in method_cache or not search.searchable(si.ast):
        return False
    renderer = Device[device].renderer
    if DEBUG < 5 and _load_lowered(_lowered_entry(renderer, si.ast)) is not None:
        return False
    return search.cached_opts(si.ast, renderer) is None


def _search_and_compile(si: ScheduleItem) -> None:
    """Search ``si``'s kernel on copies of its buffers (whose inputs are computed by now), then compile the
    winner into ``method_cache`` and the disk lowering cache."""
    device = si.bufs[0].device
    corpus.record(si.ast)
    renderer = Device[device].renderer
    opts = search.beam_search(si.ast, renderer, int(BEAM.value), bufs=list(si.bufs), runner=CompiledRunner)
    spec = get_program(si.ast, renderer, opts=opts)
    _store_lowered(_lowered_entry(renderer, si.ast), spec)
    method_cache[(device, si.ast)] = CompiledRunner(device, spec, var_names=ast_var_names(si.ast))
