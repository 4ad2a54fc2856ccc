"""Random op graphs for the fuzzer (:mod:`ember.testing.fuzz`): what a graph is and how a seed makes one.

A :class:`FuzzGraph` is a short straight-line program over tensors: inputs of random shapes and
dtypes, then elementwise ops (transcendental included), broadcasting binaries, comparisons and
``where``, casts, reductions, scans, movement ops and matmuls; constant and broadcast (stride-0) tensors,
``//`` and ``%`` by small constants (floats included), and long chains of elementwise ops in one line. Each
node is a line of Python (``v4 = v1.maximum(v3)``) with, where numpy can mirror it, a numpy twin: the twin
is what catches a wrong rewrite rule, which the device under test and the PYTHON reference share.

``large=True`` adds reductions over more than 2**24 elements (made by ``expand``, so nothing that size is
allocated) and chains of hundreds of ops. It is off by default: those graphs need float accumulators that
stay exact past 2**24 and deep graphs without recursion, which are not there yet.

Graphs are generated from a seed alone (plus the dtype pool), so ``generate(seed)`` is a complete
reproducer. Generation builds the graph lazily on the PYTHON device to read each node's shape and
dtype from ember itself, never from a second model of its rules; a candidate op ember rejects is
simply not used.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ember import Tensor, dtypes
from ember.dtype import DType, to_dtype

#: the device graphs are built on while generating (lazily: nothing runs)
GENERATOR_DEVICE = "PYTHON"

#: dtypes the generator draws from, float32 most often
DEFAULT_DTYPES: tuple[str, ...] = ("float32", "float32", "float32", "float16", "bfloat16", "float64", "int32",
                                   "int8", "uint8", "int64", "int16", "uint32", "bool")

# ops on one float tensor, kept inside their domains so results stay finite and well conditioned
_FLOAT_UNARY: dict[str, tuple[str, str | None]] = {
    "exp": ("{0}.clip(-8, 8).exp()", "np.exp(np.clip({0}, -8, 8))"),
    "exp2": ("{0}.clip(-10, 10).exp2()", "np.exp2(np.clip({0}, -10, 10))"),
    "log": ("({0}.abs() + 0.5).log()", "np.log(np.abs({0}) + 0.5)"),
    "log2": ("({0}.abs() + 0.5).log2()", "np.log2(np.abs({0}) + 0.5)"),
    "sqrt": ("({0}.abs() + 0.1).sqrt()", "np.sqrt(np.abs({0}) + 0.1)"),
    "recip": ("({0}.abs() + 0.5).reciprocal()", "1 / (np.abs({0}) + 0.5)"),
    "sin": ("{0}.clip(-50, 50).sin()", "np.sin(np.clip({0}, -50, 50))"),
    "cos": ("{0}.clip(-50, 50).cos()", "np.cos(np.clip({0}, -50, 50))"),
    "tanh": ("{0}.tanh()", "np.tanh({0})"),
    "sigmoid": ("{0}.sigmoid()", "1 / (1 + np.exp(-{0}))"),
    "relu": ("{0}.relu()", "np.maximum({0}, 0)"),
    "gelu": ("{0}.gelu()", "0.5 * {0} * (1 + np.tanh(0.7978845608028654 * ({0} + 0.044715 * {0} ** 3)))"),
    "silu": ("{0}.silu()", "{0} / (1 + np.exp(-{0}))"),
    "softplus": ("{0}.clip(-20, 20).softplus()", "np.log1p(np.exp(np.clip({0}, -20, 20)))"),
    "erf": ("{0}.erf()", "_erf({0})"),
    "atan": ("{0}.atan()", "np.arctan({0})"),
    "floor": ("{0}.floor()", "np.floor({0})"),
    "round": ("{0}.round()", "np.round({0})"),
    "square": ("{0}.clip(-30, 30).square()", "np.square(np.clip({0}, -30, 30))"),
    "pow": ("({0}.abs() + 0.5).pow(1.5)", "(np.abs({0}) + 0.5) ** 1.5"),
    "sign": ("{0}.sign()", "np.where(np.isnan({0}), 0.0, np.sign({0}))"),  # torch (and ember): sign(nan) = 0
    "ceil": ("{0}.ceil()", "np.ceil({0})"),
    "trunc": ("{0}.trunc()", "np.trunc({0})"),
}
# ops on one tensor of any numeric dtype
_ANY_UNARY: dict[str, tuple[str, str | None]] = {
    "neg": ("-{0}", "-{0}"), "abs": ("{0}.abs()", "np.abs({0})"), "mul_const": ("{0} * 3", "{0} * 3"),
    "add_const": ("{0} + 2", "{0} + 2"), "scale": ("{0} * 0.75", "{0} * 0.75"),
}
# ``//`` and ``%`` by small constants (floor semantics, as Python and torch): folding them as integer ops is
# the mistake these catch (``6.75 // 1`` is 6, ``-2.25 % 1`` is 0.75)
_FLOAT_DIVMOD: dict[str, tuple[str, str | None]] = {
    f"{name}_{k}": (f"({{0}} {sym} {k})", f"np.{fn}({{0}}, {k})")
    for k in ("1", "2", "0.5", "0.25", "3", "-1", "-1.5")
    for name, sym, fn in (("floordiv", "//", "floor_divide"), ("mod", "%", "mod"))}
_INT_DIVMOD: dict[str, tuple[str, str | None]] = {
    f"{name}_{k}": (f"({{0}} {sym} {k})", None) for k in ("1", "2", "3", "7") for name, sym in (("floordiv", "//"),
                                                                                               ("mod", "%"))}
# the links of a chain: ember's and numpy's form of one op on ``{x}``, per kind of value
_CHAIN_LINKS: dict[str, list[tuple[str, str | None]]] = {
    "f": [("({x} + 0.75)", "({x} + 0.75)"), ("({x} * 0.5)", "({x} * 0.5)"), ("({x} - 1.25)", "({x} - 1.25)"),
          ("({x} * -2)", "({x} * -2)"), ("{x}.maximum(-3)", "np.maximum({x}, -3)"), ("(-{x})", "(-{x})"),
          ("{x}.minimum(5)", "np.minimum({x}, 5)"), ("({x} // 1)", "np.floor_divide({x}, 1)"),
          ("({x} % 2)", "np.mod({x}, 2)"), ("{x}.abs()", "np.abs({x})")],
    "iu": [("({x} + 3)", None), ("({x} * 3)", None), ("({x} - 5)", None), ("({x} // 2)", None), ("({x} % 7)", None),
           ("({x} ^ 5)", None), ("{x}.maximum(1)", None)],
}
#: chain lengths: usual, and with ``large``
CHAIN_LENGTHS = (8, 48)
LONG_CHAIN_LENGTHS = (200, 800)
#: links per line of a chain
CHAIN_LINE = 48
#: reductions over expanded tensors with ``large``: at least this many elements each
LARGE_ELEMENTS = 2 ** 24 + 1

# binary ops with broadcasting; templates that only make sense for some kinds say so
_BINARY: dict[str, tuple[str, str | None, str]] = {
    "add": ("{0} + {1}", "{0} + {1}", "fi"), "sub": ("{0} - {1}", "{0} - {1}", "fi"),
    "mul": ("{0} * {1}", "{0} * {1}", "fi"), "maximum": ("{0}.maximum({1})", "np.maximum({0}, {1})", "fib"),
    "minimum": ("{0}.minimum({1})", "np.minimum({0}, {1})", "fib"),
    # _r rounds to the node's dtype: ember computes the divisor in it before dividing
    "div": ("{0} / ({1}.abs() + 0.5)", "{0} / _r(np.abs({1}) + 0.5)", "f"),
    "fmod": ("{0} % ({1}.abs() + 0.5)", "np.mod({0}, _r(np.abs({1}) + 0.5))", "f"),
    "idiv": ("{0} // (({1} & 7) + 1)", None, "i"), "mod": ("{0} % (({1} & 7) + 1)", None, "i"),
    "and": ("{0} & {1}", None, "ib"), "or": ("{0} | {1}", None, "ib"), "xor": ("{0} ^ {1}", None, "ib"),
    "lt": ("{0} < {1}", None, "fib"), "eq": ("{0} == {1}", None, "fib"), "ne": ("{0} != {1}", None, "fib"),
}


@dataclass(frozen=True)
class Node:
    """One line of a graph: ``expr`` with ``{0}``, ``{1}`` ... standing for the nodes in ``srcs``.

    An input node has ``expr == "input"`` and no sources. ``diff`` names the sources that
    gradients flow through (a comparison or a cast to an integer has none).
    """

    expr: str
    srcs: tuple[int, ...] = ()
    np_expr: str | None = None
    diff: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    key: int = 0  # an input's data is seeded by (graph seed, key), so shrinking a graph keeps it


@dataclass(frozen=True)
class FuzzGraph:
    """A generated program: its seed, nodes in order, and which nodes are outputs."""

    seed: int
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    specials: bool = False
    large: bool = False

    def inputs(self) -> list[int]:
        """Indices of the input nodes."""
        return [i for i, n in enumerate(self.nodes) if n.expr == "input"]

    def source(self) -> str:
        """The graph as Python lines (``v0 = input(...)``, ``v3 = v0 + v2`` ...)."""
        lines = []
        for i, n in enumerate(self.nodes):
            if n.expr == "input":
                lines.append(f"v{i} = Tensor(inputs[{i}], dtype=dtypes.{n.dtype}, device=DEVICE)  # {n.shape}")
            else:
                lines.append(f"v{i} = {n.expr.format(*[f'v{s}' for s in n.srcs])}")
        lines.append(f"outputs = [{', '.join(f'v{o}' for o in self.outputs)}]")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------ inputs
def input_array(graph: FuzzGraph, index: int) -> np.ndarray:
    """The data of input node ``index`` (float64 for floats, so narrower dtypes see real rounding)."""
    node = graph.nodes[index]
    rng = np.random.default_rng([graph.seed, node.key])
    dt = to_dtype(node.dtype)
    shape = node.shape
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        lo, hi = (dtypes.min(dt), dtypes.max(dt)) if rng.random() < 0.2 else (0 if dt.kind == "u" else -20, 20)
        return rng.integers(lo, hi, shape, endpoint=True, dtype=np.int64 if dt != dtypes.uint64 else np.uint64)
    if rng.random() < 0.3:  # exact values: ties in round/floor/cmp, exact sums
        out = rng.integers(-16, 17, shape) / 4.0
    else:
        out = rng.standard_normal(shape) * (3.0 if rng.random() < 0.5 else 1.0)
    if graph.specials and out.size:
        out = out.reshape(-1)
        picks = rng.random(out.size) < 0.15
        out[picks] = rng.choice([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, 70000.0], int(picks.sum()))
        out = out.reshape(shape)
    return np.asarray(out, dtype=np.float64)


# -------------------------------------------------------------------------------------- generation
class _Builder:
    """Grows one graph, keeping a lazy PYTHON tensor per node to learn shapes and dtypes from ember."""

    def __init__(self, seed: int, pool: Sequence[str], grad: bool, large: bool = False):
        self.rng = random.Random(seed)
        self.pool, self.grad, self.large = tuple(pool), grad, large
        self.float_pool = tuple(d for d in self.pool if to_dtype(d).kind == "f") or ("float32",)
        self.nodes: list[Node] = []
        self.lazy: list[Tensor] = []

    def inputs(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.expr == "input"]

    def add_input(self, shape: tuple[int, ...], dtype: str) -> int:
        self.nodes.append(Node("input", shape=shape, dtype=dtype, key=len(self.nodes)))
        self.lazy.append(Tensor.zeros(*shape, dtype=dtype, device=GENERATOR_DEVICE) if shape else
                         Tensor(0, dtype=dtype, device=GENERATOR_DEVICE))
        return len(self.nodes) - 1

    def try_add(self, expr: str, srcs: Sequence[int], np_expr: str | None = None,
                diff: Sequence[int] | None = None) -> int | None:
        """Append ``expr`` if ember accepts it on the sources' shapes and dtypes, else return None."""
        try:
            out = eval(expr.format(*[f"_v[{s}]" for s in srcs]), {"dtypes": dtypes, "Tensor": Tensor},
                       {"_v": self.lazy})
        except (ValueError, TypeError, RuntimeError, IndexError, AssertionError, NotImplementedError):
            return None
        if not isinstance(out, Tensor) or out.numel() > 4096:
            return None
        dt = dtype_name(out.dtype)
        float_out = out.dtype.kind == "f"
        diff_srcs = tuple(srcs if diff is None else diff) if float_out else ()
        self.nodes.append(Node(expr, tuple(srcs), np_expr, diff_srcs, tuple(out.shape), dt))
        self.lazy.append(out)
        return len(self.nodes) - 1

    # the op families ---------------------------------------------------------------------------
    def random_shape(self) -> tuple[int, ...]:
        rank = self.rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4])
        return tuple(self.rng.choice([1, 1, 2, 3, 4, 5, 7, 8, 13]) for _ in range(rank))

    def random_dtype(self) -> str:
        return self.rng.choice(self.float_pool if self.grad else self.pool)

    def pick(self, kinds: str = "fiub") -> int | None:
        cands = [i for i, n in enumerate(self.nodes) if to_dtype(n.dtype).kind in kinds]
        if not cands:
            return None
        # favour recent nodes so graphs grow deep rather than wide
        return cands[-1] if self.rng.random() < 0.5 else self.rng.choice(cands)

    def partner(self, a: int, kinds: str) -> int:
        """A node that broadcasts with ``a``: an existing one, or a new input with some dims set to 1."""
        shape = self.nodes[a].shape
        cands = [i for i, n in enumerate(self.nodes) if i != a and to_dtype(n.dtype).kind in kinds
                 and _broadcastable(n.shape, shape)]
        if cands and self.rng.random() < 0.6:
            return self.rng.choice(cands)
        new = tuple(1 if self.rng.random() < 0.3 else d for d in shape)
        if new and self.rng.random() < 0.2:
            new = new[self.rng.randrange(len(new)):]  # fewer dims: broadcast from the left
        kind_pool = [d for d in (self.float_pool if self.grad else self.pool) if to_dtype(d).kind in kinds]
        return self.add_input(new, self.rng.choice(kind_pool or [self.nodes[a].dtype]))

    def step(self) -> None:
        family = self.rng.choices(["unary", "binary", "where", "cast", "reduce", "scan", "movement", "matmul",
                                   "divmod_const", "constant", "chain", "large"],
                                  [5, 5, 1, 0 if self.grad else 2, 2, 1, 4, 1, 2, 1, 1, 1 if self.large else 0])[0]
        getattr(self, f"gen_{family}")()

    def gen_unary(self) -> None:
        a = self.pick("f" if self.rng.random() < 0.7 else "fiu")
        if a is None:
            return
        table = _FLOAT_UNARY if self.nodes[a].dtype in self.float_pool else _ANY_UNARY
        expr, np_expr = table[self.rng.choice(sorted(table))]
        self.try_add(expr, [a], np_expr)

    def gen_divmod_const(self) -> None:
        """``x // k`` or ``x % k`` for a small constant ``k``."""
        a = self.pick("f" if self.rng.random() < 0.7 else "fiu")
        if a is None:
            return
        table = _FLOAT_DIVMOD if to_dtype(self.nodes[a].dtype).kind == "f" else _INT_DIVMOD
        expr, np_expr = table[self.rng.choice(sorted(table))]
        self.try_add(expr, [a], np_expr)

    def gen_constant(self) -> None:
        """A constant tensor (``Tensor.full``) or one value broadcast to a shape (a stride-0 view of a buffer),
        shaped like an existing node; constants are what folding rules rewrite."""
        a = self.pick()
        if a is None:
            return
        shape = self.nodes[a].shape
        dt = self.random_dtype()
        kind = to_dtype(dt).kind
        values: dict[str, list[float | int | bool]] = {
            "f": [6.75, -2.25, 0.5, -0.0, 1.0, 3.0, -1.5, 0.0], "b": [True, False], "i": [0, 1, -1, 7, 2, -3],
            "u": [0, 1, 7, 2, 200]}
        value = self.rng.choice(values[kind])
        if self.rng.random() < 0.5:
            expr = f"Tensor.full({shape!r}, {value!r}, dtype=dtypes.{dt}, device={{0}}.device)"
        else:  # one value in a buffer, expanded
            expr = (f"Tensor([{value!r}], dtype=dtypes.{dt}, device={{0}}.device)"
                    f".reshape({(1,) * len(shape)!r}).expand({shape!r})")
        self.try_add(expr, [a], f"np.full({shape!r}, {value!r})", diff=[])

    def gen_chain(self) -> None:
        """A chain of elementwise ops on one value, written as one line (``((v2 + 0.75) * 0.5) ...``)."""
        a = self.pick("f" if self.rng.random() < 0.7 else "fiu")
        if a is None:
            return
        links = _CHAIN_LINKS["f" if to_dtype(self.nodes[a].dtype).kind == "f" else "iu"]
        lo, hi = LONG_CHAIN_LENGTHS if self.large and self.rng.random() < 0.3 else CHAIN_LENGTHS
        left = self.rng.randint(lo, hi)
        while left > 0 and a is not None:  # lines of at most CHAIN_LINE links (Python nests 200 parentheses)
            expr, np_expr = "{0}", "{0}"  # type: str, str | None
            for _ in range(min(left, CHAIN_LINE)):
                link, np_link = self.rng.choice(links)
                expr = link.format(x=expr)
                np_expr = np_link.format(x=np_expr) if np_link is not None and np_expr is not None else None
            left -= CHAIN_LINE
            a = self.try_add(expr, [a], np_expr)

    def gen_large(self) -> None:
        """A reduction over a node broadcast to more than :data:`LARGE_ELEMENTS` elements (stride 0: nothing of
        that size is allocated), its numpy twin computed exactly in float64."""
        a = self.pick("f" if self.rng.random() < 0.8 else "fi")
        if a is None:
            return
        n = max(1, math.prod(self.nodes[a].shape))
        rows = self.rng.choice([4096, 8192, 1 << 14])
        cols = -(-LARGE_ELEMENTS // (n * rows)) + self.rng.randrange(3)
        op = self.rng.choice(["sum", "sum", "mean", "max"])
        np_op = {"sum": f"* {rows * cols}", "mean": "* 1", "max": "* 1"}[op]
        self.try_add(f"{{0}}.reshape({n}, 1, 1).expand({n}, {rows}, {cols}).{op}((1, 2))", [a],
                     f"(np.reshape({{0}}, ({n},)) {np_op})")

    def gen_binary(self) -> None:
        name = self.rng.choice(sorted(_BINARY))
        expr, np_expr, kinds = _BINARY[name]
        if self.grad and name in ("lt", "eq", "ne", "and", "or", "xor", "idiv", "mod"):
            return
        kinds = kinds.replace("i", "iu")
        a = self.pick(kinds)
        if a is None:
            return
        self.try_add(expr, [a, self.partner(a, kinds)], np_expr)

    def gen_where(self) -> None:
        x = self.pick()
        if x is None:
            return
        cond = self.partner(x, "fiub")
        y = self.partner(x, to_dtype(self.nodes[x].dtype).kind)
        cmp = self.rng.choice(["({0} > 0)", "({0} < 1)", "{0}"])
        self.try_add(cmp.format("{0}") + ".where({1}, {2})", [cond, x, y],
                     "np.where(" + cmp.format("{0}") + " != 0, {1}, {2})", diff=[x, y])

    def gen_cast(self) -> None:
        a = self.pick()
        if a is not None:
            target = self.rng.choice(self.pool)
            np_expr = {"float32": "{0}.astype(np.float32).astype(np.float64)", "float64": "{0}"}.get(target)
            self.try_add(f"{{0}}.cast(dtypes.{target})", [a], np_expr)

    def gen_reduce(self) -> None:
        a = self.pick()
        if a is None or not self.nodes[a].shape:
            return
        ndim = len(self.nodes[a].shape)
        axis = self.rng.choice([None, *range(ndim), -1, (0, ndim - 1)])
        keep = self.rng.random() < 0.4
        op = self.rng.choice(["sum", "max", "min", "mean", "prod", "argmax"] if not self.grad else
                             ["sum", "max", "min", "mean"])
        if op == "prod" and math.prod(self.nodes[a].shape) > 16:
            op = "sum"
        if op == "argmax":
            axis = axis if isinstance(axis, int) else None
            self.try_add(f"{{0}}.argmax({axis}, keepdim={keep})", [a])
            return
        np_fn = {"sum": "np.sum", "max": "np.max", "min": "np.min", "mean": "np.mean", "prod": "np.prod"}[op]
        self.try_add(f"{{0}}.{op}({axis!r}, keepdim={keep})", [a], f"{np_fn}({{0}}, axis={axis!r}, keepdims={keep})")

    def gen_scan(self) -> None:
        a = self.pick("fi" if not self.grad else "f")
        if a is None or not self.nodes[a].shape:
            return
        axis = self.rng.randrange(len(self.nodes[a].shape))
        self.try_add(f"{{0}}.cumsum({axis})", [a], f"np.cumsum({{0}}, axis={axis})")

    def gen_movement(self) -> None:
        a = self.pick()
        if a is None:
            return
        shape = self.nodes[a].shape
        r = self.rng
        nd = len(shape)
        kind = r.choice(["reshape", "permute", "expand", "pad", "shrink", "flip", "slice", "transpose"])
        if kind == "reshape":
            n = math.prod(shape)
            new = _random_factorization(n, r)
            self.try_add(f"{{0}}.reshape{new!r}", [a], f"{{0}}.reshape({new!r})")
        elif kind == "permute" and nd >= 2:
            perm = list(range(nd))
            r.shuffle(perm)
            self.try_add(f"{{0}}.permute{tuple(perm)!r}", [a], f"np.transpose({{0}}, {tuple(perm)!r})")
        elif kind == "expand":
            pos = r.randrange(nd + 1)
            new = (*shape[:pos], r.choice([2, 3, 5]), *shape[pos:])
            self.try_add(f"{{0}}.unsqueeze({pos}).expand{new!r}", [a],
                         f"np.broadcast_to(np.expand_dims({{0}}, {pos}), {new!r})")
        elif kind == "pad" and nd:
            pads = tuple((r.randrange(3), r.randrange(3)) for _ in shape)
            self.try_add(f"{{0}}.pad({pads!r})", [a], f"np.pad({{0}}, {pads!r})")
        elif kind == "shrink" and nd:
            box = []
            for d in shape:
                lo = r.randrange(d) if d else 0
                box.append((lo, r.randrange(lo, d) + 1 if d else 0))
            slc = ", ".join(f"{lo}:{hi}" for lo, hi in box)
            self.try_add(f"{{0}}.shrink({tuple(box)!r})", [a], f"{{0}}[{slc}]")
        elif kind == "flip" and nd:
            axes = tuple(sorted(r.sample(range(nd), r.randint(1, nd))))
            self.try_add(f"{{0}}.flip({axes!r})", [a], f"np.flip({{0}}, {axes!r})")
        elif kind == "slice" and nd:
            step = r.choice([2, 3, -1, -2])
            self.try_add(f"{{0}}[::{step}]", [a], f"{{0}}[::{step}]")
        elif kind == "transpose" and nd >= 2:
            self.try_add("{0}.transpose(-1, -2)", [a], "np.swapaxes({0}, -1, -2)")

    def gen_matmul(self) -> None:
        a = self.pick("f" if self.rng.random() < 0.85 else "fi")
        if a is None or not self.nodes[a].shape:
            return
        k = self.nodes[a].shape[-1]
        n = self.rng.choice([1, 3, 4, 8])
        shape_b = (k, n) if self.rng.random() < 0.8 or len(self.nodes[a].shape) < 2 else (2, k, n)
        b = self.add_input(shape_b, self.nodes[a].dtype)
        self.try_add("{0} @ {1}", [a, b], "np.matmul({0}, {1})")


def dtype_name(dt: DType) -> str:
    """The torch-style name of ``dt`` (``"float64"``), as graphs record dtypes."""
    for name, d in dtypes.fields().items():
        if d == dt:
            return name
    raise TypeError(f"no name for dtype {dt}")


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """True when ``a`` broadcasts to ``b`` (the result keeps ``b``'s shape)."""
    return len(a) <= len(b) and all(x in (1, y) for x, y in zip(reversed(a), reversed(b)))


def _random_factorization(n: int, r: random.Random) -> tuple[int, ...]:
    dims: list[int] = []
    rest = n
    while rest > 1 and len(dims) < 3:
        divs = [d for d in range(2, rest + 1) if rest % d == 0]
        d = r.choice(divs)
        dims.append(d)
        rest //= d
    if rest != 1 or n == 0:
        dims.append(rest)
    while r.random() < 0.3:
        dims.insert(r.randrange(len(dims) + 1), 1)
    return tuple(dims) if dims else (1,)


def generate(seed: int, pool: Sequence[str] = DEFAULT_DTYPES, grad: bool = False, size: int | None = None,
             large: bool = False) -> FuzzGraph:
    """The graph for ``seed``: 1-3 inputs and ``size`` (default 3-12) ops drawn from every family.

    ``pool`` lists the dtype names inputs and casts may use (keep it to what both devices
    support); ``grad`` restricts the graph to float tensors so every output is differentiable;
    ``large`` adds reductions over more than 2**24 elements and chains of hundreds of ops (see the module's
    docstring: off until those are exact).
    """
    b = _Builder(seed, pool, grad, large)
    r = b.rng
    for _ in range(r.randint(1, 3)):
        b.add_input(b.random_shape(), b.random_dtype())
    target = size if size is not None else r.randint(3, 12)
    attempts = 0
    while len(b.nodes) - len(b.inputs()) < target and attempts < 20 * target:
        b.step()
        attempts += 1
    sinks = [i for i in range(len(b.nodes)) if not any(i in n.srcs for n in b.nodes) and b.nodes[i].expr != "input"]
    if grad:
        sinks = [i for i in sinks if b.nodes[i].dtype in b.float_pool and diff_inputs(b.nodes, i)]
    outputs = tuple(sinks[-3:]) or (len(b.nodes) - 1,)
    return FuzzGraph(seed, tuple(b.nodes), outputs, tuple(pool), specials=not grad and r.random() < 0.1, large=large)


def diff_inputs(nodes: Sequence[Node], i: int) -> set[int]:
    """Inputs that node ``i`` depends on through differentiable edges."""
    seen: set[int] = set()
    out: set[int] = set()
    stack = [i]
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        if nodes[j].expr == "input":
            out.add(j)
        stack.extend(nodes[j].diff)
    return out
