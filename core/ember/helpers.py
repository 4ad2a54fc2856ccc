"""Small shared utilities: environment knobs, counters, caching paths and tiny functional helpers.

Nothing here imports from the rest of ember, so every layer may use it.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import gc
import math
import os
import pathlib
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, TypeVar

if TYPE_CHECKING:
    import numpy
    from typing_extensions import TypeIs

T = TypeVar("T")


class _LazyNumpy:
    """numpy, imported when an attribute is first read: ``import numpy`` costs ~37 ms, as much as ember's own
    import, and a program that neither passes nor asks for numpy arrays never needs it. Modules bind it as
    ``np`` (with the real module for type checkers); each attribute, once read, is kept on the instance."""

    def __getattr__(self, name: str) -> Any:
        import numpy

        value = getattr(numpy, name)
        setattr(self, name, value)
        return value


#: numpy on first use (see :class:`_LazyNumpy`)
lazy_numpy: Any = _LazyNumpy()


def loaded_numpy() -> Any:
    """The numpy module if the process has imported it, else None. A value can only be a numpy array or scalar
    once numpy is imported, so a type check asks this instead of importing numpy."""
    return sys.modules.get("numpy")


def is_np_scalar(x: object) -> TypeIs[numpy.generic]:
    """Whether ``x`` is a numpy scalar (``np.generic``), without importing numpy."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.generic)


def is_np_array(x: object) -> TypeIs[numpy.ndarray]:
    """Whether ``x`` is a numpy array, without importing numpy."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def is_int_like(x: object) -> TypeIs[int]:
    """``isinstance(x, (int, np.integer))`` without importing numpy (bools count, as for ``int``)."""
    if isinstance(x, int):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.integer)


def getenv(key: str, default: Any = 0) -> Any:
    """Read an environment knob, converting it to the type of ``default``.

    Values set through :class:`Context` (in the running thread or task) take precedence over the process
    environment. An empty value counts as unset; one that does not convert is a ValueError naming the
    variable and its value.
    """
    knob = ContextVar.by_key.get(key)
    if knob is not None and (value := knob._var.get()) is not _UNSET:
        return value
    raw = os.environ.get(key)
    if raw is None:
        return default
    if isinstance(default, bool):
        return raw not in ("", "0", "false", "False")
    if isinstance(default, (int, float)) and not raw.strip():
        return default
    try:
        return type(default)(raw)
    except ValueError:
        kind = {int: "an integer", float: "a number"}.get(type(default), type(default).__name__)
        raise ValueError(f"environment variable {key}={raw!r} must be {kind}") from None


#: the value of a knob that :class:`Context` created and that the running thread has not set
_UNSET: Any = type("_Unset", (), {"__repr__": lambda self: "<unset>"})()


class ContextVar:
    """A knob such as ``DEBUG``, overridable with ``with Context(DEBUG=2):``.

    The value read from the environment when the knob is made is the process-wide default. A value set with
    :class:`Context` or by assigning ``.value`` holds in the running thread (and asyncio task) only, as a
    :class:`contextvars.ContextVar`: a new thread starts from the defaults, an asyncio task from a copy of
    the values where it was created. ember's own worker threads (kernel builds, plugin calls) run with the
    values of the thread that handed them the work.
    """

    by_key: dict[str, ContextVar] = {}

    def __init__(self, key: str, default: Any):
        self.key = key
        self.default = getenv(key, default)
        self._var: contextvars.ContextVar[Any] = contextvars.ContextVar(f"ember.{key}", default=self.default)
        ContextVar.by_key[key] = self

    @classmethod
    def _unset(cls, key: str) -> ContextVar:
        """A knob for a key that ember does not declare (``Context(TIERED=1)`` for a :func:`getenv` read):
        where no Context set it, :func:`getenv` reads the environment and the reader's default as before."""
        knob = cls.__new__(cls)
        knob.key, knob.default = key, _UNSET
        knob._var = contextvars.ContextVar(f"ember.{key}", default=_UNSET)
        cls.by_key[key] = knob
        return knob

    @property
    def value(self) -> Any:
        """The value in the running thread or task."""
        return self._var.get()

    @value.setter
    def value(self, value: Any) -> None:
        self._var.set(value)

    # the comparisons read the contextvars directly: ``if DEBUG >= 2`` sits on hot paths
    def __bool__(self) -> bool:
        return bool(self._var.get())

    def __ge__(self, other: int) -> bool:
        return self._var.get() >= other

    def __gt__(self, other: int) -> bool:
        return self._var.get() > other

    def __lt__(self, other: int) -> bool:
        return self._var.get() < other

    def __le__(self, other: int) -> bool:
        return self._var.get() <= other

    def __eq__(self, other: object) -> bool:
        return self._var.get() == other

    def __hash__(self) -> int:
        return hash(self.key)

    def __int__(self) -> int:
        return int(self._var.get())

    def __repr__(self) -> str:
        return f"ContextVar({self.key}={self.value})"


DEBUG = ContextVar("DEBUG", 0)
NOOPT = ContextVar("NOOPT", 0)
BEAM = ContextVar("BEAM", 0)
CACHELEVEL = ContextVar("CACHELEVEL", 2)
PARALLEL = ContextVar("PARALLEL", 1)
#: training mode (dropout drops, batch norm uses and updates batch statistics), per thread as every knob:
#: ``with Context(TRAINING=1):`` or ``@Context(TRAINING=1)``; ``Tensor.training`` and ``Tensor.train()`` read
#: and set this same value
TRAINING = ContextVar("TRAINING", 0)


class Context(contextlib.ContextDecorator):
    """Temporarily override knobs in the running thread (or asyncio task): ``with Context(DEBUG=2): ...``.

    Other threads keep their own values (see :class:`ContextVar`). As a decorator each call enters afresh, so
    one decorated function may run in several threads at once."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self._saved: list[list[tuple[ContextVar, Any]]] = []  # one frame per entry: ``with c: with c:`` nests

    def _recreate_cm(self) -> Context:
        return type(self)(**self.kwargs)

    def __enter__(self) -> Context:
        frame: list[tuple[ContextVar, Any]] = []
        for k, v in self.kwargs.items():
            knob = ContextVar.by_key[k] if k in ContextVar.by_key else ContextVar._unset(k)
            frame.append((knob, knob._var.get()))
            knob._var.set(v)
        self._saved.append(frame)
        return self

    def __exit__(self, *exc: object) -> None:
        # set back rather than ContextVar.reset: a generator may leave the block in another task than it entered
        for knob, v in reversed(self._saved.pop()):
            knob._var.set(v)


def carry_context(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, to be called in another thread with the knobs and modes of the thread calling this now (a new
    thread starts from the defaults). Each call of this makes one copy, which one call at a time may run in."""
    return functools.partial(contextvars.copy_context().run, fn)


class GlobalCounters:
    """Counters that tests and benchmarks read: kernels run and compiled, ops, memory moved."""

    kernel_count: int = 0
    kernels_compiled: int = 0
    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0
    mem_used: int = 0

    @staticmethod
    def reset() -> None:
        """Zero the per-run counters (not ``mem_used``, which tracks live allocations)."""
        GlobalCounters.kernel_count = GlobalCounters.kernels_compiled = 0
        GlobalCounters.global_ops = GlobalCounters.global_mem = 0
        GlobalCounters.time_sum_s = 0.0


def prod(xs: Iterable[int]) -> int:
    """Product of an iterable of ints (1 for an empty one)."""
    return math.prod(xs)


def argsort(xs: Sequence[Any]) -> list[int]:
    """Indices that sort ``xs``."""
    return sorted(range(len(xs)), key=xs.__getitem__)


def dedup(xs: Iterable[T]) -> list[T]:
    """Remove duplicates, keeping order."""
    return list(dict.fromkeys(xs))


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
    """Flatten one level of nesting."""
    return [x for xs in xss for x in xs]


def sha256(data: bytes = b"") -> Any:
    """A SHA-256 hash object of ``data`` (``hashlib.sha256``'s interface), from CPython's built-in module where
    there is one: importing :mod:`hashlib` loads OpenSSL first, about 2 ms of every program's start."""
    global _sha256
    if _sha256 is None:
        try:
            from _sha2 import sha256 as found  # type: ignore[import-not-found,unused-ignore]  # CPython >= 3.12
        except ImportError:
            try:
                from _sha256 import sha256 as found  # type: ignore[import-not-found,unused-ignore]  # 3.10, 3.11
            except ImportError:
                from hashlib import sha256 as found
        _sha256 = found
    return _sha256(data)


_sha256: Any = None


def cache_dir() -> pathlib.Path:
    """Where compiled kernels and other caches live (``EMBER_CACHE_DIR`` overrides)."""
    base = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ember")
    return pathlib.Path(base)


@contextlib.contextmanager
def timed(label: str = "", enabled: bool = True) -> Iterator[None]:
    """Print how long the block took when ``enabled``."""
    st = time.perf_counter()
    yield
    if enabled:
        print(f"{label} {(time.perf_counter() - st) * 1e3:.2f} ms")


def colored(s: str, color: str | None) -> str:
    """Wrap ``s`` in an ANSI colour when stdout is a terminal-like sink (always, it is cheap)."""
    codes = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "white": 37}
    return s if color is None else f"\033[{codes[color]}m{s}\033[0m"


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off inside the block (on again after it, if it was on).

    Used around ``import ember``: the import's burst of allocations set off collections that found nothing
    (~8 ms); and around lowering one kernel in the engine, until its linear program is dropped. Not around
    realizing: there the pause changed which kernels the runtime-constant cache built in a full CL test run (an
    interaction not yet understood)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


# --- tinygrad.helpers names that model and example files use ---------------------------------------------------
def partition(items: Iterable[T], pred: Callable[[T], bool]) -> tuple[list[T], list[T]]:
    """``(those for which pred is true, the others)``, each in the original order."""
    yes: list[T] = []
    no: list[T] = []
    for x in items:
        (yes if pred(x) else no).append(x)
    return yes, no


def get_child(obj: Any, key: str) -> Any:
    """The object at a dotted path such as ``"layers.0.attn.wq"``: a number indexes, a name looks up a dict key
    or else an attribute (how state-dict names map to a model's members)."""
    for part in key.split("."):
        if part.isnumeric():
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj


class Timing(contextlib.ContextDecorator):
    """Print how long the block (or each call of a decorated function) took: ``{prefix}  12.34 ms``, followed by
    ``on_exit(elapsed_ns)`` when given. The elapsed nanoseconds stay in ``.et``."""

    def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True):
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
        self.et = 0

    def _recreate_cm(self) -> Timing:
        return self  # .et of the last call stays readable on the decorator's object

    def __enter__(self) -> Timing:
        self.st = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.et = time.perf_counter_ns() - self.st
        if self.enabled:
            print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


def trange(n: int, **kwargs: Any) -> Any:
    """``range(n)`` with a progress bar (:func:`ember.progress.progress`; tqdm's keywords)."""
    from ember.progress import progress  # imports nothing else of ember
    return progress(range(n), total=n, **kwargs)


def fetch(url: str, name: str | os.PathLike[str] | None = None, subdir: str | None = None, gunzip: bool = False,
          allow_caching: bool = True, headers: dict[str, str] | None = None, sha256: str | None = None,
          extract: bool = False) -> pathlib.Path:
    """Download ``url`` once into ``cache_dir()/downloads`` and return the local file's path.

    A URL that is already a local path (starting with ``/`` or ``.``) is returned as it is. ``name`` names the
    cached file (a path with a ``/`` is used as it is), else a hash of the URL does; ``gunzip`` stores the
    decompressed bytes; ``sha256`` checks the download (and re-downloads a cached file that does not match);
    ``extract`` unpacks a tar archive into a folder beside it and returns that folder. Without a network the
    error names the URL and the file to put in place instead."""
    import gzip
    import shutil
    import tarfile
    import tempfile
    import urllib.error
    import urllib.request

    if url.startswith(("/", ".")):
        return pathlib.Path(url)
    headers = dict(headers or {})
    if name is not None and (isinstance(name, os.PathLike) or "/" in str(name)):
        fp = pathlib.Path(name)
    else:
        # different request headers may get different bytes, so they are part of the cached file's name
        joined = "\n".join(f"{k.strip()}:{v.strip()}" for k, v in sorted(headers.items()))
        tag = "_" + _sha256_hex(joined.encode())[:16] if headers else ""
        fp = cache_dir() / "downloads" / (subdir or "") / (f"{name or _sha256_hex(url.encode())[:32]}{tag}"
                                                              f"{'.gunzip' if gunzip else ''}")
    out_dir = fp.parent / f"{fp.name}.extract"
    stale = sha256 is not None and fp.is_file() and _sha256_hex(fp.read_bytes()) != sha256
    if not fp.is_file() or not allow_caching or stale:
        fp.parent.mkdir(parents=True, exist_ok=True)
        if extract:
            shutil.rmtree(out_dir, ignore_errors=True)
        request = urllib.request.Request(url, headers={"User-Agent": "ember", **headers})
        try:
            with urllib.request.urlopen(request, timeout=10) as r, \
                    tempfile.NamedTemporaryFile(dir=fp.parent, delete=False) as f:
                data = r.read()
                if gunzip:
                    data = gzip.decompress(data)
                f.write(data)
        except (urllib.error.URLError, OSError) as e:
            raise ConnectionError(f"fetch: could not download {url} ({getattr(e, 'reason', e)}); without a network, "
                                  f"put the file at {fp}") from e
        if sha256 is not None and (got := _sha256_hex(data)) != sha256:
            os.unlink(f.name)
            raise RuntimeError(f"fetch: {url} has sha256 {got}, expected {sha256}")
        os.replace(f.name, fp)  # whole files only: a reader never sees a partial download
    if not extract:
        return fp
    if not out_dir.is_dir():
        tmp = tempfile.mkdtemp(dir=fp.parent)
        try:
            with tarfile.open(fp) as t:
                t.extractall(tmp, filter="data")
            os.replace(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _sha256_hex(data: bytes) -> str:
    return sha256(data).hexdigest()
