"""Every rewrite rule of ``ember.ir.symbolic`` keeps the value of what it rewrites, on every dtype it can match.

The rules are enumerated from the matcher itself (``symbolic.rules``), so a new rule is checked without a line
here. For each rule, nodes its pattern matches are grown from the pattern (free parts become random
expressions over variables with random bounds, or constants), and both sides are evaluated on random values
with the PYTHON device's own ALU functions (``_make_alu``, ``cast_value``): negative values, fractions, nan,
inf, -0.0 and the integer limits included. A rule that holds only for integers has to say so in its pattern.

Constant folding (``exec_alu``) is checked against the device op by op, and the bounds that folding by bounds
relies on are checked to contain every value. ``test_planted_wrong_rules_are_caught`` shows the checker
notices a rule that is wrong only for floats, or only at the integer limits.

``EMBER_RULE_SEED`` changes the seed (a failure message names the seed to replay with).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from ember.builtin_devices.python import _const_value, _make_alu, cast_value, round_to_bf16, to_np_dtype
from ember.dtype import DTYPES_ALL, DType, dtypes, truncate
from ember.ir.pattern import PatternMatcher, UPat
from ember.ir.symbolic import _const_fold, symbolic
from ember.ir.uop import GroupOp, Ops, UOp, exec_alu

SEED = int(os.environ.get("EMBER_RULE_SEED", "0"))
#: values each side is evaluated on, and nodes grown per rule
LANES = 48
SAMPLES = 240

_TRANSCENDENTAL = frozenset({Ops.EXP, Ops.EXP2, Ops.LOG, Ops.LOG2, Ops.SIN, Ops.POW})
_FLOAT_SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 6.75, -2.25, 2.5, -2.5, 0.1, 3.0, -3.0, 7.0, 1e30, -1e30,
                   65504.0, 3.0e38, 1e-40, 1e-300, math.inf, -math.inf, math.nan, 2.0 ** 24 + 1.0, 2.0 ** 53 + 2.0]
#: small constants of index arithmetic (share factors, so div/mod nesting and gcd rules apply)
_SMALL = [1, 2, 3, 4, 6, 8, 12, 16]


# ------------------------------------------------------------------------------------- the oracle
def _reg_np(dt: DType) -> np.dtype:
    return np.dtype(np.float32) if dt == dtypes.bfloat16 else np.dtype(to_np_dtype(dt))


def evaluate(root: UOp, env: dict[str, np.ndarray]) -> np.ndarray:
    """``root`` on the PYTHON device's semantics, each DEFINE_VAR taking its array from ``env`` (by name)."""
    return evaluate_all(root, env)[root]


def evaluate_all(root: UOp, env: dict[str, np.ndarray]) -> dict[UOp, np.ndarray]:
    """:func:`evaluate` for ``root`` and every node under it."""
    memo: dict[UOp, Any] = {}
    with np.errstate(all="ignore"):
        for n in root.toposort():
            dt = n.value_dtype
            if n.op is Ops.DEFINE_VAR:
                memo[n] = env[n.arg[0]]
            elif n.op is Ops.CONST:
                memo[n] = np.full(LANES, _const_value(dt, n.arg), dtype=_reg_np(dt))
            elif n.op is Ops.CAST:
                memo[n] = cast_value(memo[n.src[0]], n.src[0].value_dtype, dt)
            elif n.op in GroupOp.ALU:
                fn = _make_alu(n.op, dt, tuple(s.value_dtype for s in n.src))
                memo[n] = fn(*(memo[s] for s in n.src))
            else:
                raise AssertionError(f"no oracle for {n.op}")
            memo[n] = np.broadcast_to(np.asarray(memo[n]), (LANES,))
    return memo


def _same(got: np.ndarray, want: np.ndarray, dt: DType, ulps: int) -> np.ndarray:
    """Per lane: equal values, nan where nan, the same sign of zero (and within ``ulps`` when given)."""
    if dt.kind != "f":
        return np.asarray(got == want)
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    ok = ((g == w) & (np.signbit(g) == np.signbit(w))) | (np.isnan(g) & np.isnan(w))
    if ulps:
        spacing = np.spacing(np.abs(np.asarray(want, _reg_np(dt) if dt != dtypes.bfloat16 else np.float32)))
        if dt == dtypes.bfloat16:
            spacing = spacing * 65536.0
        ok |= np.isfinite(g) & np.isfinite(w) & (np.abs(g - w) <= ulps * np.asarray(spacing, np.float64))
    return ok


# ------------------------------------------------------------------------------ growing matching nodes
_OP_OK: dict[tuple[Ops, DType, tuple[DType, ...]], bool] = {}


def _op_ok(op: Ops, dt: DType, srcs: tuple[DType, ...]) -> bool:
    """Whether the device defines ``op`` giving ``dt`` from ``srcs``."""
    key = (op, dt, srcs)
    if key not in _OP_OK:
        try:
            _make_alu(op, dt, srcs)
            _OP_OK[key] = True
        except TypeError:
            _OP_OK[key] = False
    return _OP_OK[key]


def _arity(op: Ops) -> int:
    return 3 if op is Ops.WHERE else 1 if op in GroupOp.Unary or op is Ops.CAST else 2


def _allows(pat: UPat | None, dt: DType) -> bool:
    if pat is None:
        return True
    return (pat.dtype is None or pat.dtype == dt) and (pat.kinds is None or dt.kind in pat.kinds)


class Grower:
    """Random UOp graphs over DEFINE_VARs, and the random values of those variables."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.bounds: dict[str, tuple[DType, Any, Any]] = {}

    def choice(self, xs: list[Any] | tuple[Any, ...]) -> Any:
        return xs[int(self.rng.integers(len(xs)))]

    # leaves
    def const(self, dt: DType) -> UOp:
        if dt.kind == "b":
            return UOp.const(dt, bool(self.rng.integers(2)))
        if dt.kind == "f":
            return UOp.const(dt, self.choice(_FLOAT_SPECIALS) if self.rng.random() < 0.7 else
                             float(self.rng.standard_normal() * 10.0 ** int(self.rng.integers(-3, 4))))
        lo, hi = dtypes.min(dt), dtypes.max(dt)
        pool = [0, 1, -1, 2, -2, 7, -7, lo, hi, lo + 1, hi - 1, dt.bitsize - 1, dt.bitsize, *_SMALL, *_SMALL]
        return UOp.const(dt, self.choice(pool))

    def var(self, dt: DType) -> UOp:
        name = f"v{len(self.bounds)}"
        if dt.kind == "f":
            lo, hi = -math.inf, math.inf
        elif dt.kind == "b":
            lo, hi = False, True
        else:
            full = (dtypes.min(dt), dtypes.max(dt))
            k = self.choice([1, 3, 7, 16, 100, 1 << 20])
            lo, hi = self.choice([full, full, (0, k), (0, k), (0, k), (-k, k), (full[0], k), (0, full[1]), (k, k * 2),
                                  (full[1] - k, full[1]), (full[0], full[0] + k)])
            lo, hi = max(lo, full[0]), min(hi, full[1])
            if lo > hi:
                lo, hi = full
        self.bounds[name] = (dt, lo, hi)
        return UOp(Ops.DEFINE_VAR, dt, (), (name, lo, hi))

    def values(self) -> dict[str, np.ndarray]:
        """Random values for every variable made so far, inside its bounds, the bounds themselves included."""
        env = {}
        for name, (dt, lo, hi) in self.bounds.items():
            if dt.kind == "b":
                v = self.rng.random(LANES) < 0.5
            elif dt.kind == "f":
                special = np.array([self.choice(_FLOAT_SPECIALS) for _ in range(LANES)])
                scale = 10.0 ** self.rng.integers(-4, 6, LANES)
                normal = np.where(self.rng.random(LANES) < 0.3, self.rng.integers(-16, 17, LANES) / 4.0,
                                  self.rng.standard_normal(LANES) * scale)
                wide = np.where(self.rng.random(LANES) < 0.4, special, normal)
                v = round_to_bf16(wide.astype(np.float32)) if dt == dtypes.bfloat16 else \
                    wide.astype(to_np_dtype(dt))
            else:
                npdt = np.uint64 if dt.kind == "u" else np.int64
                v = self.rng.integers(lo, hi, LANES, endpoint=True, dtype=npdt)
                edges = [x for x in (lo, hi, 0, 1, -1, lo + 1, hi - 1) if lo <= x <= hi]
                v[: len(edges)] = np.array(edges, dtype=object).astype(npdt)
                self.rng.shuffle(v)
                v = v.astype(to_np_dtype(dt))
            env[name] = v
        return env

    # expressions
    def expr(self, dt: DType, depth: int) -> UOp:
        """A random expression of dtype ``dt``: a variable, a constant, or an op over smaller expressions."""
        r = self.rng.random()
        if depth <= 0 or r < 0.3:
            return self.var(dt)
        if r < 0.45:
            return self.const(dt)
        if dt.kind in "iu" and r < 0.75:
            return self.index_expr(dt, depth)
        if dt.kind == "f" and r < 0.6:  # float values with bounds (relu-like) and exact integers
            op = self.choice([Ops.MAX, Ops.ADD, Ops.MUL, Ops.TRUNC])
            x = self.expr(dt, depth - 1)
            return UOp(op, dt, (x,)) if op is Ops.TRUNC else UOp(op, dt, (x, self.const(dt)))
        out = self.op_node(None, dt, depth)
        return out if out is not None else self.var(dt)

    def index_expr(self, dt: DType, depth: int) -> UOp:
        """A sum of terms ``v * k``, ``v // k``, ``v % k`` and a constant, as views' indices are built."""
        terms = []
        f = self.choice([1, 1, 2, 3, 4])  # a common factor of every coefficient (comparisons divide it out)
        for _ in range(int(self.rng.integers(1, 4))):
            v = self.expr(dt, depth - 1) if self.rng.random() < 0.3 else self.var(dt)
            k = UOp.const(dt, f * self.choice(_SMALL + [-1, -2, 5]))
            kind = self.choice(["mul", "mul", "plain", "div", "mod"]) if f == 1 else "mul"
            terms.append(UOp(Ops.MUL, dt, (v, k)) if kind == "mul" else v if kind == "plain" else
                         UOp(Ops.IDIV if kind == "div" else Ops.MOD, dt, (v, UOp.const(dt, self.choice(_SMALL)))))
        if self.rng.random() < 0.5:
            terms.append(self.const(dt) if self.rng.random() < 0.3 else UOp.const(dt, f * self.choice(_SMALL)))
        out = terms[0]
        for t in terms[1:]:
            out = UOp(Ops.ADD, dt, (out, t))
        return out

    def op_node(self, ops: frozenset[Ops] | None, dt: DType, depth: int,
                srcs: tuple[UPat, ...] | None = None, bound: dict[str, UOp] | None = None) -> UOp | None:
        """A node of one of ``ops`` (any ALU op when None) giving ``dt``, its sources grown from ``srcs``."""
        cands = sorted(ops if ops is not None else GroupOp.ALU | {Ops.CAST}, key=lambda o: o.value)
        cands = [o for o in cands if o is not Ops.CONST and (srcs is None or len(srcs) == _arity(o))]
        if not cands:
            return None
        op = self.choice(cands)
        n = _arity(op)
        pats: tuple[UPat | None, ...] = srcs if srcs is not None else (None,) * n
        if op in GroupOp.Comparison:
            if dt != dtypes.bool:
                return None
            sd = self.dtype_for(pats)
            src_dts: tuple[DType, ...] = (sd, sd)
        elif op is Ops.WHERE:
            src_dts = (dtypes.bool, dt, dt)
        elif op is Ops.CAST:
            src_dts = (self.dtype_for(pats),)
        else:
            src_dts = (dt,) * n
        if op is not Ops.CAST and not _op_ok(op, dt, src_dts):
            return None
        if srcs is None and op is not Ops.CAST and self.rng.random() < 0.3:  # all-constant: constant folding
            return UOp(op, dt, tuple(self.const(d) for d in src_dts))
        built = []
        for p, d in zip(pats, src_dts):
            s = self.grow(p, d, depth - 1, bound if bound is not None else {})
            if s is None:
                return None
            built.append(s)
        if n == 2 and op in GroupOp.Commutative and self.rng.random() < 0.5:
            built.reverse()  # the matcher tries both orders
        return UOp(op, dt, tuple(built))

    def dtype_for(self, pats: tuple[UPat | None, ...]) -> DType:
        allowed = [d for d in DTYPES_ALL if all(_allows(p, d) for p in pats)]
        return self.choice(allowed or list(DTYPES_ALL))

    def grow(self, pat: UPat | None, dt: DType, depth: int, bound: dict[str, UOp]) -> UOp | None:
        """A node of dtype ``dt`` that ``pat`` matches (None when this try cannot make one)."""
        if pat is not None and pat.name is not None and pat.name in bound:
            hit = bound[pat.name]
            return hit if hit.dtype == dt else None
        if not _allows(pat, dt):
            return None
        if pat is None or (pat.ops is None and pat.src is None):
            # (a sum of several terms for an int: what most rules about ints look for)
            out = self.index_expr(dt, depth) if dt.kind in "iu" and self.rng.random() < 0.4 else self.expr(dt, depth)
        elif pat.ops == {Ops.CONST}:
            out = self.const(dt) if pat.arg is None else UOp.const(dt, pat.arg)
        else:
            out = self.op_node(pat.ops, dt, max(depth, 1), pat.src, bound)
        if out is not None and pat is not None and pat.name is not None:
            bound[pat.name] = out
        return out


# ------------------------------------------------------------------------------------ checking a rule
@dataclass
class RuleReport:
    """What checking one rule found: how often it fired, on which dtypes, and the counterexamples."""

    fired: int = 0
    dtypes: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)


def root_dtypes(pat: UPat) -> list[DType]:
    """The dtypes a node matching ``pat``'s root can have (a comparison's is bool)."""
    only_cmp = pat.ops is not None and pat.ops <= GroupOp.Comparison
    return [d for d in DTYPES_ALL if _allows(pat, d) and (d == dtypes.bool or not only_cmp)]


def check_rule(pat: UPat, fn: Callable[..., UOp | None], seed: int, samples: int = SAMPLES) -> RuleReport:
    """Grow ``samples`` nodes matching ``pat`` (cycling through every root dtype) and compare ``fn``'s rewrite
    with the node on random values; rewrites of transcendental constants may differ in the last bit."""
    g = Grower(seed)
    report = RuleReport()
    dts = root_dtypes(pat)
    for i in range(samples):
        dt = dts[i % len(dts)]
        g.bounds.clear()
        store: dict[str, UOp] = {}
        node = g.grow(pat, dt, 2, {})
        if node is None or not pat.match(node, store):
            continue
        try:
            new = fn(**store)
        except Exception as e:  # a rule must decline what it cannot rewrite, never raise
            report.failures.append(f"raised {type(e).__name__}: {e} on\n{node.pretty(4)}")
            continue
        if new is None or new is node:
            continue
        report.fired += 1
        report.dtypes.add(dt.name)
        if new.dtype != node.dtype:
            report.failures.append(f"changed the dtype {node.dtype} -> {new.dtype} of\n{node.pretty(4)}")
            continue
        env = g.values()
        want, got = evaluate(node, env), evaluate(new, env)
        ulps = 1 if node.op in _TRANSCENDENTAL and all(s.op is Ops.CONST for s in node.src) else 0
        bad = np.flatnonzero(~_same(got, want, node.value_dtype, ulps))
        if bad.size:
            lane = int(bad[0])
            at = {k: v[lane].item() for k, v in env.items() if f"'{k}'" in node.pretty(100)}
            report.failures.append(f"{node.value_dtype.name}: {node.pretty(4)}\n  -> {new.pretty(4)}\n  at {at}: "
                                   f"gives {got[lane]!r}, the node gives {want[lane]!r}")
    return report


def _rule_id(i: int) -> str:
    pat, fn = symbolic.rules[i]
    ops = "|".join(sorted(o.name for o in pat.ops)) if pat.ops is not None and len(pat.ops) < 4 else "ALU"
    return f"{i}-{ops}-{getattr(fn, '__name__', 'fn').strip('<>')}"


@pytest.mark.parametrize("index", range(len(symbolic.rules)), ids=_rule_id)
def test_rule_keeps_values_on_every_dtype(index: int):
    pat, fn = symbolic.rules[index]
    report = check_rule(pat, fn, SEED * 1000 + index)
    assert not report.failures, (f"rule {_rule_id(index)} is wrong in {len(report.failures)} of {report.fired} "
                                 f"rewrites (EMBER_RULE_SEED={SEED}); first:\n{report.failures[0]}")
    # a rule the growth never reaches would pass without being checked
    assert report.fired >= 3, f"rule {_rule_id(index)} fired {report.fired} times in {SAMPLES} nodes: grow more"


def test_every_rule_is_enumerated():
    # the test above is parametrized over the matcher's own list, so it cannot drift from it
    assert len(symbolic.rules) >= 25
    assert all(isinstance(p, UPat) and callable(f) for p, f in symbolic.rules)


def test_float_floor_div_and_mod_by_one_are_not_folded():
    x = UOp(Ops.DEFINE_VAR, dtypes.float32, (), ("x", -math.inf, math.inf))
    for op in (Ops.IDIV, Ops.MOD):
        node = UOp(op, dtypes.float32, (x, UOp.const(dtypes.float32, 1.0)))
        assert symbolic.rewrite(node) is None, op
    i = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("i", -5, 5))
    assert symbolic.rewrite(UOp(Ops.IDIV, dtypes.int32, (i, UOp.const(dtypes.int32, 1)))) is i
    assert symbolic.rewrite(UOp(Ops.MOD, dtypes.int32, (i, UOp.const(dtypes.int32, 1)))).arg == 0


# ----------------------------------------------------------------------------- the checker finds bugs
_PLANTED: dict[str, tuple[UPat, Callable[..., UOp | None]]] = {
    # the fold this file was written for: right for integers, wrong for 6.75 % 1.0
    "float mod 1": (UPat(Ops.MOD, src=(UPat.var("x"), UPat(Ops.CONST, arg=1)), kinds="f", name="m"),
                    lambda x, m: UOp.const(m.dtype, 0)),
    "floor div 1 without kinds": (UPat(Ops.IDIV, src=(UPat.var("x"), UPat(Ops.CONST, arg=1))), lambda x: x),
    # right for every integer but the ones whose double wraps around
    "x*2//2": (UPat(Ops.IDIV, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat(Ops.CONST, arg=2))),
                                   UPat(Ops.CONST, arg=2)), kinds="iu"), lambda x: x),
    # right for every float but -0.0
    "x+0.0": (UPat(Ops.ADD, src=(UPat.var("x"), UPat(Ops.CONST, arg=0)), kinds="f"), lambda x: x),
    # right for every float but nan
    "x==x": (UPat(Ops.CMPEQ, src=(UPat.var("x", kinds="f"), UPat.var("x"))), lambda x: UOp.const(dtypes.bool, True)),
}


@pytest.mark.parametrize("name", sorted(_PLANTED))
def test_planted_wrong_rules_are_caught(name: str):
    pat, fn = _PLANTED[name]
    report = check_rule(pat, fn, SEED)
    assert report.fired >= 3 and report.failures, f"the planted rule {name!r} passed: {report}"


def test_planted_rule_in_a_matcher_is_caught_like_the_real_ones():
    """A wrong rule added to (a copy of) the real matcher is enumerated and caught like the others."""
    pm = PatternMatcher(symbolic.rules + [_PLANTED["float mod 1"]])
    found = [i for i, (p, f) in enumerate(pm.rules) if check_rule(p, f, SEED, samples=60).failures]
    assert found == [len(pm.rules) - 1]


# --------------------------------------------------------------------- constant folding and bounds
def _grid(dt: DType) -> list[Any]:
    if dt.kind == "b":
        return [False, True]
    if dt.kind == "f":
        return [truncate(dt, v) for v in (0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 6.75, -2.25, 2.5, 0.1, 3.0, -7.0, 1e30,
                                          65504.0, 1e-40, 710.0, math.inf, -math.inf, math.nan, 2.0 ** 24 + 1.0)]
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    return sorted({truncate(dt, v) for v in (0, 1, -1, 2, -2, 3, -7, 5, lo, hi, lo + 1, hi - 1, dt.bitsize - 1,
                                             dt.bitsize, 64, -64)})


@pytest.mark.parametrize("dt", DTYPES_ALL, ids=lambda d: d.name)
def test_constant_folding_matches_the_python_device(dt: DType):
    """``exec_alu``, the folding rule's evaluator, gives the device's value for every op on a grid of values."""
    vals = _grid(dt)
    bad = []
    for op in sorted(GroupOp.ALU, key=lambda o: o.value):
        out_dt = dtypes.bool if op in GroupOp.Comparison else dt
        n = _arity(op)
        src_dts = (dtypes.bool, dt, dt) if op is Ops.WHERE else (dt,) * n
        if not _op_ok(op, out_dt, src_dts):
            continue
        pools = [[False, True], vals[:6], vals[-6:]] if op is Ops.WHERE else [vals] * n
        idx = np.array(np.meshgrid(*[np.arange(len(p)) for p in pools], indexing="ij")).reshape(n, -1)
        combos = [tuple(p[int(k)] for p, k in zip(pools, col)) for col in idx.T]
        with np.errstate(all="ignore"):
            want = np.asarray(_make_alu(op, out_dt, src_dts)(
                *(np.array([_const_value(d, c[j]) for c in combos]) for j, d in enumerate(src_dts)))).reshape(-1)
        got = np.array([_const_value(out_dt, exec_alu(op, out_dt, c)) for c in combos])
        ok = _same(got, want, out_dt, 1 if op in _TRANSCENDENTAL else 0)
        bad += [f"{op.name}{combos[k]}: folded {got[k]!r}, device {want[k]!r}" for k in np.flatnonzero(~ok)]
    assert not bad, f"{len(bad)} folds differ on {dt.name}; first: {bad[:5]}"


def test_the_folding_rule_folds_with_exec_alu():
    node = UOp(Ops.IDIV, dtypes.float32, (UOp.const(dtypes.float32, -6.75), UOp.const(dtypes.float32, 1.0)))
    assert _const_fold(node) is UOp.const(dtypes.float32, exec_alu(Ops.IDIV, dtypes.float32, (-6.75, 1.0)))


@pytest.mark.parametrize("dt", [d for d in DTYPES_ALL if d.kind != "f"] + [dtypes.float32], ids=lambda d: d.name)
def test_bounds_contain_every_value(dt: DType):
    """``vmin <= value <= vmax`` for random expressions (folding by bounds is only as right as this)."""
    g = Grower(SEED + 7)
    for _ in range(150):
        g.bounds.clear()
        node = g.expr(dt, 3) if g.rng.random() < 0.7 else g.op_node(None, dt, 3)
        if node is None:
            continue
        values = evaluate_all(node, g.values())
        for n, v in values.items():  # every subexpression's bounds too
            if n.value_dtype.kind == "f":
                v = np.asarray(v, np.float64)[~np.isnan(np.asarray(v, np.float64))]
            v = [x.item() for x in np.asarray(v).reshape(-1)]
            lo, hi = n.vmin, n.vmax
            out = [x for x in v if not lo <= x <= hi]
            assert not out, f"{n.pretty(3)}\nhas bounds [{lo}, {hi}] but takes {out[:3]}"


def test_exec_alu_is_the_folding_rules_evaluator():
    # the fold and exec_alu are one function: the device comparison above covers both
    assert exec_alu(Ops.IDIV, dtypes.float32, (6.75, 1.0)) == 6.0
    assert math.copysign(1, exec_alu(Ops.IDIV, dtypes.float32, (-0.5, 1.0))) == -1
    assert exec_alu(Ops.MOD, dtypes.float32, (-2.25, 1.0)) == -0.25
