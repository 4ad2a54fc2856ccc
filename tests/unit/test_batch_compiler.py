"""BatchCompiler: joining single-kernel sources into one program, grouping, fallback, the packed format."""
from __future__ import annotations

import re
import threading
import time

import pytest

from ember.device.batch_compiler import FORMAT, BatchCompiler, KernelBinary, _finish, join_sources
from ember.device.compiler import CompileError

PATTERN = re.compile(r"^kernel (\w+)\(", re.MULTILINE)


def src(name: str, body: str = "x") -> str:
    return f"kernel {name}() {{ {body} }}\n"


class FakeCompiler(BatchCompiler):
    """'Builds' by recording the text; a text containing BAD fails."""

    kernel_pattern = PATTERN

    def __init__(self, max_batch: int = 32, parallel: int = 1):
        super().__init__("fake")
        self.max_batch, self.parallel_builds = max_batch, parallel
        self.built: list[str] = []
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def build(self, text: str) -> bytes:
        with self.lock:
            self.built.append(text)
            self.threads.add(threading.get_ident())
        if "BAD" in text:
            raise CompileError(text, "BAD is not allowed")
        return text.encode()


def test_kernel_binary_round_trip_and_refusals():
    kb = KernelBinary("ember_b3_E_4", b"\x00\x01program")
    assert KernelBinary.unpack(kb.pack()) == kb
    assert KernelBinary("", b"p").kernel_symbol("E_4") == "E_4" and kb.kernel_symbol("E_4") == "ember_b3_E_4"
    with pytest.raises(ValueError, match="not an ember kernel binary"):
        KernelBinary.unpack(b"\x7fELF....")
    with pytest.raises(ValueError, match="truncated"):
        KernelBinary.unpack(kb.pack()[: len(FORMAT) + 8])


def test_cache_key_names_the_format():
    assert FakeCompiler().cachekey == f"{FORMAT}|fake"


def test_join_renames_each_kernel_in_its_own_source():
    text, symbols = join_sources([src("E_4", "a"), src("E_4", "b"), src("r_2")], PATTERN)
    assert symbols == ["ember_b0_E_4", "ember_b1_E_4", "ember_b2_r_2"]
    lines = text.splitlines()
    assert lines[:3] == ["#define E_4 ember_b0_E_4", "kernel E_4() { a }", "#undef E_4"]
    assert join_sources([src("E_4"), "no kernel here"], PATTERN) is None
    assert join_sources([src("E_4") + src("E_5")], PATTERN) is None
    assert join_sources([src("E_4", "ember_b0_E_4")], PATTERN) is None  # the symbol would clash


def test_a_batch_is_one_build_and_each_kernel_names_its_symbol():
    c = FakeCompiler()
    out = [KernelBinary.unpack(b) for b in c.compile_batch([src("E_4", "a"), src("E_4", "b")])]
    assert len(c.built) == 1
    assert [kb.symbol for kb in out] == ["ember_b0_E_4", "ember_b1_E_4"]
    assert out[0].program == out[1].program == c.built[0].encode()


def big(name: str, n: int = 1) -> str:
    """A source worth about ``n`` builds' fixed costs (FakeCompiler keeps the default ``build_overhead``)."""
    return src(name, "x" * (n * BatchCompiler.build_overhead))


def test_groups_respect_max_batch_and_parallel_builds():
    c = FakeCompiler(max_batch=3)
    c.compile_batch([src(f"k{i}") for i in range(7)])
    assert [t.count("kernel ") for t in c.built] == [3, 2, 2]  # as even as max_batch allows
    p = FakeCompiler(parallel=2)
    out = p.compile_batch([src(f"k{i}") for i in range(5)])
    assert [t.count("kernel ") for t in p.built] == [5] and len(out) == 5  # cheap kernels: one fixed cost
    for i, kb in enumerate(KernelBinary.unpack(b) for b in out):  # each binary holds its own kernel
        assert f"kernel k{i}(" in kb.program.decode()
        assert re.fullmatch(rf"(ember_b\d+_)?k{i}", kb.kernel_symbol(f"k{i}"))
    two = FakeCompiler(parallel=2)
    two.compile_batch([big(f"k{i}", 2) for i in range(4)])
    assert sorted(t.count("kernel ") for t in two.built) == [2, 2]  # worth a fixed cost per slot: spread
    many = FakeCompiler(parallel=2)
    many.compile_batch([big(f"k{i}") for i in range(30)])
    assert sorted(t.count("kernel ") for t in many.built) == [5] * 6  # the hedge: three programs per slot


def test_costly_kernels_build_alone_and_first():
    """Three long sources among short ones: each long one is its own program, built before the rest, so no
    long build starts last and waits for a slot (the sizes of an MLP step's first compile)."""
    sizes = [3953, 3885, 3666, 94371, 25315, 27856, 96381, 96969, 29447]
    srcs = [src(f"k{i}", "x" * n) for i, n in enumerate(sizes)]
    c = FakeCompiler(parallel=2)
    plan = [[sizes[i] for i in group] for group in c._groups(srcs)]
    assert plan[:3] == [[96969], [96381], [94371]]
    assert sorted(n for group in plan for n in group) == sorted(sizes)
    loads = [sum(group) + c.build_overhead for group in plan]
    assert loads == sorted(loads, reverse=True)
    out = [KernelBinary.unpack(b) for b in c.compile_batch(srcs)]
    for i, kb in enumerate(out):
        assert f"kernel k{i}(" in kb.program.decode()
    assert [len(g) for g in c._groups([src(f"k{i}") for i in range(10)])] == [10]  # cheap ones share one


def test_the_cost_of_a_source_is_its_kernel_not_the_helpers_before_it():
    c = FakeCompiler()
    helpers = "#ifndef H\n#define H\nstatic int helper(void) { return 1; }\n#endif\n"
    assert c.build_cost(helpers + src("k0", "abc")) == len(src("k0", "abc"))
    assert c.build_cost("no kernel here") == len("no kernel here")


def test_programs_that_wait_for_a_busy_slot_get_less_work_and_come_last():
    """When the rest of a stream is planned while one slot still builds, the idle slot's program takes more
    of it, so both slots end about together."""
    c = FakeCompiler(parallel=2)
    costs = [BatchCompiler.build_overhead] * 10
    srcs = [big(f"k{i}") for i in range(10)]
    busy = [4 * BatchCompiler.build_overhead]
    plan = c._groups(srcs, busy)
    assert len(plan) == 2 and sorted(i for g in plan for i in g) == list(range(10))
    assert len(plan[0]) == 7 and len(plan[1]) == 3  # handed out first: the idle slot's
    even = [list(range(5)), list(range(5, 10))]
    assert _finish(plan, costs, 2, c.build_overhead, busy) < _finish(even, costs, 2, c.build_overhead, busy)
    assert [len(g) for g in c._groups(srcs)] == [5, 5]  # no slot busy: an even split


def test_a_slow_group_holds_up_one_slot_not_half_the_batch():
    """While one program builds slowly, the other slot builds the rest of the batch."""
    built_while_slow: list[int] = []

    class SlowFirst(FakeCompiler):
        def build(self, text: str) -> bytes:
            if "SLOW" in text:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and sum(t.count("kernel ") for t in self.built) < 10:
                    time.sleep(0.005)
                built_while_slow.append(sum(t.count("kernel ") for t in self.built))
            return super().build(text)

    c = SlowFirst(parallel=2)
    out = c.compile_batch([src("k0", "SLOW" + "x" * 2 * c.build_overhead), *(big(f"k{i}", 2) for i in range(1, 12))])
    assert len(out) == 12 and built_while_slow == [10]  # the other five groups of two, all by the other slot


def test_a_failing_batch_is_rebuilt_alone_and_names_the_bad_source():
    c = FakeCompiler()
    bad = src("E_5", "BAD")
    with pytest.raises(CompileError) as info:
        c.compile_batch([src("E_4"), bad])
    assert info.value.src == bad
    assert c.built[0].count("#define") == 2 and c.built[1:] == [src("E_4"), bad]


def test_an_empty_batch_builds_nothing():
    c = FakeCompiler(parallel=4)
    assert c.compile_batch([]) == [] and c.built == []


def test_unjoinable_sources_are_built_one_by_one():
    c = FakeCompiler()
    out = c.compile_batch(["helper only", src("E_4")])
    assert c.built == ["helper only", src("E_4")]
    assert [KernelBinary.unpack(b).symbol for b in out] == ["", ""]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))


def test_a_stream_starts_building_before_it_ends(cache):
    """With two build slots the first kernels build while later ones are still being rendered."""
    c = FakeCompiler(parallel=2)
    started = threading.Event()
    real = c.build
    c.build = lambda text: started.set() or real(text)  # type: ignore[method-assign]
    seen_while_rendering: list[bool] = []

    def render():
        yield big("k0")  # worth a build's fixed cost: built at once
        seen_while_rendering.append(started.wait(5))
        yield from (big(f"k{i}") for i in (1, 2, 0, 3))  # k0 again: built once

    out = [KernelBinary.unpack(b) for b in c.compile_cached_stream(render())]
    assert seen_while_rendering == [True]
    assert len(out) == 5 and out[0] == out[3]
    assert sum(t.count("kernel ") for t in c.built) == 4
    for kb, name in zip(out, ("k0", "k1", "k2", "k0", "k3")):
        assert f"kernel {name}(" in kb.program.decode()
    again = FakeCompiler(parallel=2)  # every source has its own cache entry
    assert again.compile_cached_stream([big("k3"), big("k1")]) == [c.compile_cached(big("k3")),
                                                                   c.compile_cached(big("k1"))]
    assert again.built == []


def test_a_stream_that_fails_waits_for_its_builds_and_raises(cache):
    c = FakeCompiler(parallel=2)

    def render():
        yield big("k0")
        raise ValueError("cannot render k1")

    with pytest.raises(ValueError, match="cannot render k1"):
        c.compile_cached_stream(render())
    assert c.built == [big("k0")]  # finished, not abandoned
    bad = src("k2", "BAD")
    with pytest.raises(CompileError) as info:
        c.compile_cached_stream([src("k1"), bad, src("k3")])
    assert info.value.src == bad


def test_one_build_slot_streams_as_one_batch(cache):
    c = FakeCompiler(parallel=1)
    out = c.compile_cached_stream(src(f"k{i}") for i in range(3))
    assert len(c.built) == 1 and c.built[0].count("#define") == 3 and len(out) == 3


#: every build whose end a stream recorded, in order (see :func:`_ended_builds`)
_ENDED: list = []


@pytest.fixture(autouse=True)
def _ended_builds(monkeypatch: pytest.MonkeyPatch):
    """Record each build's end as the stream sees it (its future's done callback), so a test waits for that
    event itself rather than for a time after which it has usually happened."""
    import ember.device.batch_compiler as bc

    record = bc._Build._done

    def done(build: bc._Build, fut: object) -> None:
        record(build, fut)
        _ENDED.append(build)

    _ENDED.clear()
    monkeypatch.setattr(bc._Build, "_done", done)


class Gated(FakeCompiler):
    """Two build slots; the build holding kernel ``first`` waits for :meth:`let_first_finish` (then ``slow`` more
    seconds), so what is rendered meanwhile piles up."""

    def __init__(self, first: str, slow: float = 0.0):
        super().__init__(parallel=2)
        self.first, self.slow = f"{first}(", slow
        self.first_started, self.release = threading.Event(), threading.Event()

    def build(self, text: str) -> bytes:
        if self.first in text:
            self.first_started.set()
            self.release.wait(5)
            time.sleep(self.slow)
        return super().build(text)

    def let_first_finish(self) -> None:
        """Let the held build end and wait until the stream has recorded its end (its future's done callback),
        however loaded the machine is (see :func:`_ended_builds`)."""
        self.release.set()
        deadline = time.monotonic() + 60
        while not any(self.first in text for b in _ENDED for text in b.group):
            assert time.monotonic() < deadline, "the held build never ended"
            time.sleep(0.002)


def test_a_busy_slot_lets_rendered_sources_pile_up_into_one_program(cache):
    """While sources are still coming, one slot of two builds (the other core renders); what is rendered while
    it is busy becomes its next program, and a source worth less than a fixed cost waits for company."""
    c = Gated("k0")

    def render():
        yield big("k0")
        assert c.first_started.wait(5)
        yield from (big(f"k{i}") for i in range(1, 5))  # the slot is busy: they wait
        c.let_first_finish()
        yield src("k5")  # the slot is free: k1..k5 go together
        yield src("k6")  # cheap and last: built at the end

    c.compile_cached_stream(render())
    assert [re.findall(r"kernel (\w+)\(", t) for t in c.built] == [["k0"], [f"k{i}" for i in range(1, 6)], ["k6"]]


class Sized:
    """A stream of sources that knows how many it holds (as the engine's rendering of a schedule does)."""

    def __init__(self, n: int, gen):
        self.n, self.gen = n, gen

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.gen)


def test_sources_that_pile_up_near_the_end_of_a_stream_wait_to_be_spread_over_every_slot(cache):
    """A slot freed when the stream is about to end (here: with every source rendered but the last, at the
    rendering's pace so far) does not take everything that piled up alone: it all waits a moment, then goes to
    both slots. A stream of unknown length keeps the old way: the free slot takes the pile."""
    def run(sized: bool, p: str) -> list[list[str]]:  # p: a name prefix (each run builds, none is cached)
        c = Gated(f"{p}0")

        def render():
            yield big(f"{p}0")
            assert c.first_started.wait(5)
            yield from (big(f"{p}{i}") for i in range(1, 9))  # the slot is busy: they pile up
            c.let_first_finish()
            yield big(f"{p}9")  # the slot is free, and this is the last source

        c.compile_cached_stream(Sized(10, render()) if sized else render())
        return [re.findall(r"kernel (\w+)\(", t) for t in c.built]

    held = run(True, "a")
    assert held[0] == ["a0"] and len(held) >= 3 and sorted(sum(held[1:], [])) == sorted(f"a{i}" for i in range(1, 10))
    assert run(False, "b") == [["b0"], [f"b{i}" for i in range(1, 10)]]



def test_a_slot_free_at_the_end_of_a_stream_takes_an_even_share_while_the_other_is_busy(cache):
    """When a stream ends while one of its builds still runs, the free slot takes its share of a plan with every
    slot free (half, of two), not a share sized by a guess of when the busy build ends (from the pace of the
    builds done, which can be far off: here the one done was slow); the rest waits for the next free slot."""
    import concurrent.futures

    from ember.device.batch_compiler import _Build, _remaining

    c = FakeCompiler(parallel=2)
    done, busy = concurrent.futures.Future(), concurrent.futures.Future()
    slow = _Build([big("d0")], done, 4 * c.build_overhead)
    slow.start -= 10.0  # built at a tenth of the cost units per second the busy build will turn out to need
    done.set_result([b""])
    running = _Build([big("d1")], busy, 6 * c.build_overhead)
    waiting = [big(f"w{i}") for i in range(8)]
    guessed = c._groups(waiting, _remaining([slow, running]))
    assert len(guessed[0]) > 4  # what a guess of the busy build's end would give the free slot
    builds = [slow, running]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        threading.Timer(0.05, busy.set_result, ([b""],)).start()  # the busy build ends after the hand-out began
        c._hand_out_rest(pool, waiting, builds)
        for b in builds[2:]:
            b.future.result()
    handed = [b.group for b in builds[2:]]
    assert len(handed[0]) == 4  # the free slot's share: half
    assert sorted(sum(handed, [])) == sorted(waiting)


def test_a_slot_free_near_the_end_takes_its_share_of_the_pile_not_all_of_it(cache):
    """A slot freed while the last few sources are still being rendered takes what makes it end with the slot
    that renders now (which builds once the stream ends): part of what piled up, not all of it while the other
    slot gets only the last sources."""
    c = Gated("p0", slow=0.2)  # a slow build: the pace of the builds so far is low

    def render():
        yield big("p0")
        assert c.first_started.wait(5)
        yield from (big(f"p{i}") for i in range(1, 13))  # the slot is busy: 12 pile up
        c.let_first_finish()
        yield from (big(f"p{i}") for i in (13, 14, 15))  # the slot is free: 13 piled, two more to come

    c.compile_cached_stream(Sized(16, render()))
    groups = [re.findall(r"kernel (\w+)\(", t) for t in c.built]
    assert groups[0] == ["p0"] and sorted(sum(groups, [])) == sorted(f"p{i}" for i in range(16))
    # a share of the pile, in order (found by content: two builds at the end may finish in either order)
    (share,) = [g for g in groups if "p1" in g]
    assert share[0] == "p1" and 1 <= len(share) < 13, groups


def test_a_stream_hands_the_interpreter_over_quickly_while_it_builds(cache):
    """While a stream builds, a build thread waiting for the interpreter (to read its result and start the next
    compiler) gets it within STREAM_SWITCH_INTERVAL, not the default 5 ms per wait; the interval is restored
    after the stream, also when rendering fails."""
    import sys

    from ember.device.batch_compiler import STREAM_SWITCH_INTERVAL

    c = FakeCompiler(parallel=2)
    before = sys.getswitchinterval()
    seen: list[float] = []

    def render():
        seen.append(sys.getswitchinterval())
        yield big("s0")

    c.compile_cached_stream(render())
    assert seen == [min(before, STREAM_SWITCH_INTERVAL)] and sys.getswitchinterval() == before

    def failing():
        yield big("s1")
        raise ValueError("rendering failed")

    with pytest.raises(ValueError, match="rendering failed"):
        c.compile_cached_stream(failing())
    assert sys.getswitchinterval() == before
