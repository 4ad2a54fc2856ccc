"""The random-graph fuzzer: graphs (:mod:`ember.testing.graphgen`) run on a device under test and on the
PYTHON reference device (and numpy where every op has a numpy twin), compared with tolerances that
follow the least precise float dtype a value was computed from.

A mismatch prints as a script anyone can paste (:func:`reproducer`), after :func:`shrink` cut the
graph down to the few lines that still differ.

    from ember.testing.fuzz import generate, check
    g = generate(17)
    result = check(g, "CPU")           # forward: CPU against PYTHON (and numpy for float graphs)
    result = check(g, "CPU", grad=True)
    if not result.ok: print(result.report())
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember import Tensor, dtypes
from ember.testing.graphgen import DEFAULT_DTYPES, FuzzGraph, Node, diff_inputs, dtype_name, generate, input_array

__all__ = ["CONFORMANCE_GRAPHS", "DEFAULT_DTYPES", "REFERENCE", "TOLERANCE", "CheckResult", "Evaluation", "FuzzGraph",
           "Node", "build", "check", "check_many", "compare", "evaluate", "evaluate_numpy", "generate", "input_array",
           "mismatch", "numpy_values", "reproducer", "shrink"]

REFERENCE = "PYTHON"
#: forward graphs the conformance suite runs by default (a third as many for gradients)
CONFORMANCE_GRAPHS = 120

#: (rtol, atol relative to the largest reference magnitude) per float dtype
TOLERANCE: dict[str, tuple[float, float]] = {"float64": (1e-7, 1e-9), "float32": (2e-4, 2e-5),
                                             "float16": (2e-2, 4e-3), "bfloat16": (8e-2, 3e-2)}


# -------------------------------------------------------------------------------------- evaluation
@dataclass
class Evaluation:
    """What one device computed for a graph: output arrays (or gradients), or the exception raised."""

    arrays: list[np.ndarray] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    error: BaseException | None = None


def build(graph: FuzzGraph, device: str, grad: bool = False) -> tuple[list[Tensor], list[Tensor]]:
    """The graph's output tensors on ``device`` (lazy) and, with ``grad``, the gradients of a weighted
    sum of its float outputs with respect to the float inputs they depend on."""
    ns: dict[str, Any] = {"dtypes": dtypes, "Tensor": Tensor, "_v": []}
    values: list[Tensor] = ns["_v"]
    for i, n in enumerate(graph.nodes):
        if n.expr == "input":
            t = Tensor(input_array(graph, i), dtype=n.dtype, device=device, requires_grad=True if grad else None)
        else:
            t = eval(n.expr.format(*[f"_v[{s}]" for s in n.srcs]), ns)
        values.append(t)
    outs = [values[o] for o in graph.outputs]
    if not grad:
        return outs, []
    targets = _grad_targets(graph)
    rng = np.random.default_rng([graph.seed, 999])
    loss: Tensor | None = None
    for o in graph.outputs:
        w = Tensor(rng.standard_normal(graph.nodes[o].shape), dtype=graph.nodes[o].dtype, device=device)
        term = (values[o] * w).float().sum()
        loss = term if loss is None else loss + term
    assert loss is not None and targets, "a gradient graph needs a float output that depends on an input"
    return outs, list(loss.gradient(*[values[t] for t in targets]))


def evaluate(graph: FuzzGraph, device: str, grad: bool = False) -> Evaluation:
    """Run the graph on ``device``; returns outputs (or gradients) as numpy arrays, or the error."""
    try:
        outs, grads = build(graph, device, grad)
        result = grads if grad else outs
        Tensor.realize_all(*result)
        return Evaluation([t.numpy() for t in result], [dtype_name(t.dtype) for t in result])
    except Exception as e:  # a crash is a finding: the caller compares it with the reference
        return Evaluation(error=e)


def evaluate_numpy(graph: FuzzGraph) -> list[np.ndarray | None] | None:
    """The outputs computed by numpy (each node in float64, then rounded to its dtype): for each output whose
    every ancestor is a float32/float64 op numpy can mirror, else None there; None when no output is.

    The device under test and the PYTHON reference share ember's rewrite rules: only this twin notices a
    rule that is wrong, so it covers every output it can rather than only all-float graphs."""
    vals = numpy_values(graph)
    outs = [vals[o] for o in graph.outputs]
    return outs if any(o is not None for o in outs) else None


def numpy_values(graph: FuzzGraph) -> list[np.ndarray | None]:
    """Every node's value computed by numpy, or None where numpy cannot mirror it (see :func:`evaluate_numpy`)."""
    vals: list[np.ndarray | None] = []
    exact: list[bool] = []  # whether a node's value is the correctly rounded one (no order- or libm-dependent bits)
    for i, n in enumerate(graph.nodes):
        exact.append(n.expr == "input" or (all(exact[s] for s in n.srcs) and not _INEXACT.search(n.expr)))
        if n.dtype not in ("float32", "float64") or (n.expr != "input" and (
                n.np_expr is None or any(vals[s] is None for s in n.srcs))):
            vals.append(None)
            continue
        if n.expr == "input":
            vals.append(input_array(graph, i).astype(np.float32 if n.dtype == "float32" else np.float64)
                        .astype(np.float64))
            continue
        if _ILL_CONDITIONED.search(str(n.np_expr)) and not all(exact[s] for s in n.srcs):
            # x % k and x // k of a large x turn the last bit of x (a sum's order, a libm's exp) into a large
            # change of the result: the PYTHON reference, which computes like the device, still checks it
            vals.append(None)
            continue
        r = (lambda a: np.float64(np.float32(a)) if np.ndim(a) == 0 else np.asarray(a, np.float32).astype(np.float64)) \
            if n.dtype == "float32" else (lambda a: a)
        with np.errstate(all="ignore"):
            expr = str(n.np_expr).format(*[f"_v[{s}]" for s in n.srcs])
            out = np.asarray(eval(expr, {"np": np, "_v": vals, "_erf": _erf, "_r": r}), dtype=np.float64)
            # round as a float32 result is stored: tanh(10) is 1.0 in float32, and trunc must then see 1.0
            vals.append(out.astype(np.float32).astype(np.float64) if n.dtype == "float32" else out)
    return vals


_erf = np.vectorize(math.erf, otypes=[np.float64])
#: ops whose float result depends on the order of a sum or on a math library's last bit
_INEXACT = re.compile(r"\.(sum|mean|prod|std|var|exp|exp2|log|log2|sin|cos|tan|tanh|sigmoid|softmax|log_softmax|erf|"
                      r"gelu|silu|swish|elu|softplus|cumsum|cumprod|pow|matmul|dot|logsumexp)\b|@|\*\*")
#: ops that magnify the last bit of their input
_ILL_CONDITIONED = re.compile(r"np\.mod|np\.floor_divide|np\.fmod|%|//")

# -------------------------------------------------------------------------------------- comparison
def mismatch(got: np.ndarray, want: np.ndarray, dtype: str, scale: float = 1.0) -> str | None:
    """Why ``got`` differs from ``want`` beyond ``dtype``'s tolerance (times ``scale``), or None."""
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if dtype not in TOLERANCE:
        bad = got != want
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return f"{int(bad.sum())} of {bad.size} differ; first at {idx}: {got[idx]!r} != {want[idx]!r}"
        return None
    g, w = got.astype(np.float64), want.astype(np.float64)
    rtol, atol = TOLERANCE[dtype]
    finite = np.isfinite(w)
    peak = float(np.abs(w[finite]).max()) if finite.any() else 0.0
    with np.errstate(all="ignore"):
        close = np.abs(g - w) <= scale * (rtol * np.abs(w) + atol * max(1.0, peak))
    same_special = (np.isnan(g) & np.isnan(w)) | ((g == w) & ~finite)
    bad = ~np.where(finite, close & np.isfinite(g), same_special)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return f"{int(bad.sum())} of {bad.size} differ; first at {idx}: {g[idx]!r} != {w[idx]!r}"
    return None


@dataclass
class CheckResult:
    """The outcome of one graph on one device: empty ``problems`` means it matched."""

    graph: FuzzGraph
    device: str
    grad: bool
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> str:
        """The mismatches and a script that reproduces them."""
        what = "gradients" if self.grad else "outputs"
        head = [f"seed {self.graph.seed} on {self.device} ({what}):", *[f"  {p}" for p in self.problems]]
        repro = reproducer(self.graph, self.device, self.grad)
        return "\n".join(head) + "\n--- reproducer ---\n" + repro


def compare(graph: FuzzGraph, ours: Evaluation, ref: Evaluation,
            np_ref: Sequence[np.ndarray | None] | None = None, grad: bool = False) -> list[str]:
    """The differences between a device's evaluation and the reference ones."""
    if ours.error is not None or ref.error is not None:
        if ours.error is not None and ref.error is not None and type(ours.error) is type(ref.error):
            return []
        return [f"{who} raised {type(e).__name__}: {e}" for who, e in (("device", ours.error),
                                                                      (REFERENCE, ref.error)) if e is not None]
    problems = []
    # a float64 result computed from float16 values is only as exact as float16
    precision = [_least_precise(graph, o) for o in graph.outputs]
    if grad:
        precision = [_least_precise(graph, *graph.outputs)] * len(ours.arrays)
    for k, (got, want) in enumerate(zip(ours.arrays, ref.arrays)):
        what = f"gradient {k}" if grad else f"output {k} (v{graph.outputs[k]})"
        if ours.dtypes[k] != ref.dtypes[k]:
            problems.append(f"{what}: dtype {ours.dtypes[k]} != {ref.dtypes[k]}")
            continue
        tol = precision[k] if ours.dtypes[k] in TOLERANCE else ours.dtypes[k]
        # gradients sum many products: give them more room than forward values
        if (why := mismatch(got, want, tol, scale=4.0 if grad else 1.0)) is not None:
            truncated = None if grad else _truncated_from(graph, graph.outputs[k])
            if truncated is None or (why := truncation_mismatch(got, want, truncated)) is not None:
                problems.append(f"{what} vs {REFERENCE}: {why}")
    if np_ref is not None and not grad:
        for k, (got, twin) in enumerate(zip(ours.arrays, np_ref)):
            if twin is None:
                continue
            if (why := mismatch(got, twin.astype(got.dtype), precision[k], scale=10.0)) is not None:
                problems.append(f"output {k} (v{graph.outputs[k]}) vs numpy: {why}")
    return [p for p in problems if p]


def truncation_mismatch(got: np.ndarray, want: np.ndarray, float_dtype: str) -> str | None:
    """Why integers cast from computed ``float_dtype`` values differ beyond what the floats' rounding allows, or None.

    Two devices may round a float sum differently within ``float_dtype``'s tolerance (another summation order, a
    fused multiply-add); the cast to an integer keeps that difference (64 at 8e8 in float32) or moves a value
    across an integer (a difference of 1). Anything more is a finding."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    rtol, atol = TOLERANCE[float_dtype]
    peak = float(np.abs(w).max()) if w.size else 0.0
    bad = np.abs(g - w) > np.maximum(1.0, rtol * np.abs(w) + atol * max(1.0, peak))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{int(bad.sum())} of {bad.size} differ beyond {float_dtype} rounding before the cast to an "
                f"integer; first at {idx}: {got[idx]!r} != {want[idx]!r}")
    return None


def _truncated_from(graph: FuzzGraph, node: int) -> str | None:
    """The least precise float dtype of the computed float values an integer ``node`` was cast from (through any
    integer ops after the cast), or None when its value never passed through a float to integer cast."""
    if graph.nodes[node].dtype in TOLERANCE or graph.nodes[node].dtype == "bool":
        return None
    found: list[int] = []
    seen: set[int] = set()
    stack = [node]
    while stack:
        j = stack.pop()
        if j in seen or graph.nodes[j].dtype in TOLERANCE or graph.nodes[j].dtype == "bool":
            continue
        seen.add(j)
        for src in graph.nodes[j].srcs:
            if graph.nodes[src].dtype in TOLERANCE and graph.nodes[src].expr != "input":
                found.append(src)
            else:
                stack.append(src)
    return _least_precise(graph, *found) if found else None


def _least_precise(graph: FuzzGraph, *nodes: int) -> str:
    """The float dtype with the largest tolerance among ``nodes`` and everything they are computed from."""
    worst = "float64"
    seen: set[int] = set()
    stack = list(nodes)
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        dt = graph.nodes[j].dtype
        if dt in TOLERANCE and TOLERANCE[dt][0] > TOLERANCE[worst][0]:
            worst = dt
        stack.extend(graph.nodes[j].srcs)
    return worst


def check(graph: FuzzGraph, device: str, grad: bool = False, use_numpy: bool = True) -> CheckResult:
    """Evaluate ``graph`` on ``device`` and on the PYTHON device (and numpy where it can) and compare."""
    ours = evaluate(graph, device, grad)
    ref = evaluate(graph, REFERENCE, grad)
    np_ref = evaluate_numpy(graph) if use_numpy and not grad else None
    return CheckResult(graph, device, grad, compare(graph, ours, ref, np_ref, grad))


def check_many(graphs: Sequence[FuzzGraph], device: str, grad: bool = False,
               use_numpy: bool = True) -> list[CheckResult]:
    """:func:`check` for many graphs, realized together per device (one batched compile) when possible."""
    built_ours = _evaluate_batch(graphs, device, grad)
    built_ref = _evaluate_batch(graphs, REFERENCE, grad)
    results = []
    for g, ours, ref in zip(graphs, built_ours, built_ref):
        np_ref = evaluate_numpy(g) if use_numpy and not grad else None
        results.append(CheckResult(g, device, grad, compare(g, ours, ref, np_ref, grad)))
    return results


def _evaluate_batch(graphs: Sequence[FuzzGraph], device: str, grad: bool) -> list[Evaluation]:
    try:
        per_graph = []
        for g in graphs:
            outs, grads = build(g, device, grad)
            per_graph.append(grads if grad else outs)
        Tensor.realize_all(*[t for ts in per_graph for t in ts])
        return [Evaluation([t.numpy() for t in ts], [dtype_name(t.dtype) for t in ts]) for ts in per_graph]
    except Exception:  # find which graph failed: one at a time
        return [evaluate(g, device, grad) for g in graphs]


# --------------------------------------------------------------------------------------- reporting
def reproducer(graph: FuzzGraph, device: str, grad: bool = False) -> str:
    """A standalone script that rebuilds ``graph`` with its input data and prints it on ``device`` and PYTHON."""
    lines = ["import numpy as np", "from ember import Tensor, dtypes", "inputs = {"]
    lines += [f"    {i}: np.array({input_array(graph, i).tolist()!r}).reshape({graph.nodes[i].shape!r}),"
              for i in graph.inputs()]
    lines += ["}", f"for DEVICE in ({device!r}, {REFERENCE!r}):"]
    lines += ["    " + line for line in graph.source().splitlines()]
    if grad:
        lines += [f"    rng = np.random.default_rng([{graph.seed}, 999])",
                  "    loss = sum((o * Tensor(rng.standard_normal(o.shape), dtype=o.dtype, device=DEVICE))"
                  ".float().sum() for o in outputs)",
                  "    targets = [" + ", ".join(f"v{t}" for t in _grad_targets(graph)) + "]",
                  "    outputs = loss.gradient(*targets)"]
    lines.append("    print(DEVICE, [o.numpy().tolist() for o in outputs])")
    return "\n".join(lines).replace("inf,", "float('inf'),").replace("nan,", "float('nan'),")


def _grad_targets(graph: FuzzGraph) -> list[int]:
    return sorted(set().union(*[diff_inputs(graph.nodes, o) for o in graph.outputs]))


def shrink(graph: FuzzGraph, device: str, grad: bool = False) -> FuzzGraph:
    """A smaller graph that still mismatches: one failing output, then nodes bypassed (uses rewired to a
    source of the same shape and dtype) or cut (replaced by a fresh input) while the mismatch persists."""
    def failing(g: FuzzGraph) -> bool:
        try:
            return not check(g, device, grad).ok
        except AssertionError:  # a cut left a gradient graph with nothing to differentiate
            return False

    if not failing(graph):
        return graph
    for o in graph.outputs:
        candidate = _rewired(graph, {}, (o,))
        if failing(candidate):
            graph = candidate
            break
    changed = True
    while changed:
        changed = False
        for i in range(len(graph.nodes) - 1, -1, -1):
            n = graph.nodes[i]
            if n.expr == "input":
                continue
            options = [_rewired(graph, {i: s}, graph.outputs) for s in n.srcs
                       if graph.nodes[s].shape == n.shape and graph.nodes[s].dtype == n.dtype]
            if n.srcs:  # cut: this node's value becomes an input of its own
                nodes = list(graph.nodes)
                nodes[i] = Node("input", shape=n.shape, dtype=n.dtype, key=1000 + i)
                options.append(_rewired(FuzzGraph(graph.seed, tuple(nodes), graph.outputs, graph.dtypes,
                                                  graph.specials, graph.large), {}, graph.outputs))
            for candidate in options:
                if len(candidate.nodes) < len(graph.nodes) and failing(candidate):
                    graph, changed = candidate, True
                    break
            if changed:
                break
    return graph


def _rewired(graph: FuzzGraph, replace: dict[int, int], outputs: tuple[int, ...]) -> FuzzGraph:
    """The graph with uses of node ``k`` replaced by node ``replace[k]``, keeping only what ``outputs`` need."""
    def fix(j: int) -> int:
        while j in replace:
            j = replace[j]
        return j

    nodes = [dataclasses.replace(n, srcs=tuple(fix(s) for s in n.srcs), diff=tuple(fix(s) for s in n.diff))
             for n in graph.nodes]
    outputs = tuple(fix(o) for o in outputs)
    keep: set[int] = set()
    stack = list(outputs)
    while stack:
        j = stack.pop()
        if j not in keep:
            keep.add(j)
            stack.extend(nodes[j].srcs)
    order = sorted(keep)
    new_index = {old: new for new, old in enumerate(order)}
    out_nodes = tuple(dataclasses.replace(nodes[j], srcs=tuple(new_index[s] for s in nodes[j].srcs),
                                          diff=tuple(new_index[s] for s in nodes[j].diff)) for j in order)
    return FuzzGraph(graph.seed, out_nodes, tuple(new_index[o] for o in outputs), graph.dtypes, graph.specials,
                     graph.large)
