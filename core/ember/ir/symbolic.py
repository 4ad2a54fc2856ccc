"""Symbolic simplification of integer index expressions and boolean validity masks.

Codegen builds indices like ``((r0*12 + r1*4 + r2) // 4) % 3`` from views; these rules use
each node's bounds (``vmin``/``vmax``, known exactly for loop variables) to fold such
expressions back to ``r1``. All rules are exact for the values the bounds allow.
"""
from __future__ import annotations

import math
import operator
from typing import Iterable

from ember.dtype import DType, dtypes, truncate
from ember.ir.pattern import PatternMatcher, UPat, graph_rewrite
from ember.ir.uop import GroupOp, Ops, UOp, exec_alu


def _is_int(u: UOp) -> bool:
    return u.dtype is not None and getattr(u.dtype, "kind", "") in "iu"


def _no_wrap(x: UOp) -> bool:
    """Whether ``x``'s bounds show that no sum or product inside it wrapped around: bounds are the dtype's whole
    range once anything may have (an unsigned value that wrapped still looks non-negative, so ``vmin >= 0`` alone
    does not say it)."""
    lo, hi = x.value_dtype._lo_hi  # type: ignore[attr-defined]
    return x.vmin > lo or x.vmax < hi


def split_terms(u: UOp) -> list[UOp]:
    """Flatten nested ADDs into their terms."""
    if u.op is Ops.ADD:
        return split_terms(u.src[0]) + split_terms(u.src[1])
    return [u]


def term_coeff(t: UOp) -> tuple[UOp | None, int]:
    """Split a term into (variable part, integer coefficient); constants give (None, c)."""
    if t.op is Ops.CONST:
        return None, t.arg
    if t.op is Ops.MUL and t.src[1].op is Ops.CONST:
        return t.src[0], t.src[1].arg
    if t.op is Ops.MUL and t.src[0].op is Ops.CONST:
        return t.src[1], t.src[0].arg
    return t, 1


def _sum(terms: list[UOp], dtype) -> UOp:
    if not terms:
        return UOp.const(dtype, 0)
    out = terms[0]
    for t in terms[1:]:
        out = UOp(Ops.ADD, dtype, (out, t))
    return out


def _mk(var: UOp | None, coeff: int, dtype) -> UOp:
    if var is None:
        return UOp.const(dtype, coeff)
    return var if coeff == 1 else UOp(Ops.MUL, dtype, (var, UOp.const(dtype, coeff)))


#: the key under which a canonical sum without a constant term keeps the variable parts of its terms
_CSUM = "_csum"


def _term_var(t: UOp, x: UOp) -> UOp | None:
    """The variable part of the non-constant term ``t`` of the sum ``x`` when ``_mk`` rebuilds ``t`` as it is."""
    v, c = term_coeff(t)
    if v is None or c == 0:
        return None
    if c == 1:
        return v if v is t else None
    if t.op is Ops.MUL and t.arg is None and t.dtype == x.dtype and t.src[0] is v and \
            _is_const_of(t.src[1], x.value_dtype, c):
        return v
    return None


def _is_canonical_sum(x: UOp) -> bool:
    """Whether :func:`_canonical_sum` would rebuild ``x`` as it is (checked without building anything new): a
    left-nested sum of distinct terms, each as ``_mk`` writes it, with a nonzero constant only last. False
    says nothing (the full rebuild decides). A sum extending one found canonical before (sums are rewritten
    sources first) checks only its last term."""
    a, t = x.src
    if x.arg is not None or t.op is Ops.ADD:
        return False
    if a.op is Ops.ADD:
        if a.dtype is not x.dtype:
            return False
        known: frozenset[UOp] | None = a.__dict__.get(_CSUM)
        if known is None:
            return _is_canonical_walk(x)
    else:
        v0 = None if a.op is Ops.CONST else _term_var(a, x)
        if v0 is None:
            return False
        known = frozenset((v0,))
    if t.op is Ops.CONST:
        return t.arg != 0 and UOp.const(x.value_dtype, 0 + t.arg) is t
    v = _term_var(t, x)
    if v is None or v in known:
        return False
    x.__dict__[_CSUM] = known | {v}
    return True


def _is_canonical_walk(x: UOp) -> bool:
    """:func:`_is_canonical_sum` by walking every term of ``x``."""
    terms: list[UOp] = []
    y = x
    while y.op is Ops.ADD:
        if y.dtype is not x.dtype or y.arg is not None or y.src[1].op is Ops.ADD:
            return False
        terms.append(y.src[1])
        y = y.src[0]
    terms.append(y)
    seen: set[UOp] = set()
    last = len(terms) - 1
    for i, t in enumerate(reversed(terms)):
        if t.op is Ops.CONST:
            # the constant term: last only, and rebuilt as the same node
            if i != last or t.arg == 0 or UOp.const(x.value_dtype, 0 + t.arg) is not t:
                return False
            continue
        v = _term_var(t, x)
        if v is None or v in seen:
            return False
        seen.add(v)
    if terms[0].op is not Ops.CONST:
        x.__dict__[_CSUM] = frozenset(seen)
    return True


def _is_const_of(k: UOp, dtype: DType, c: int) -> bool:
    """Whether ``UOp.const(dtype, c)`` is ``k`` (an int that needs no truncating is its own arg: no lookup)."""
    if k.op is Ops.CONST and not k.src and k.dtype == dtype and k.arg is c and truncate(dtype, c) is c:
        return True
    return UOp.const(dtype, c) is k


def _canonical_sum(x: UOp) -> UOp | None:
    """Combine like terms and constants of a nested sum; None when already canonical."""
    return None if _is_canonical_sum(x) else _rebuilt_sum(x)


def _rebuilt_sum(x: UOp) -> UOp | None:
    """``x`` rebuilt with its like terms and constants combined; None when that gives ``x`` itself."""
    terms = split_terms(x)
    if len(terms) < 2:
        return None
    coeffs: dict[UOp | None, int] = {}
    order: list[UOp | None] = []
    for t in terms:
        v, c = term_coeff(t)
        if v not in coeffs:
            order.append(v)
            coeffs[v] = 0
        coeffs[v] += c
    new_terms = [_mk(v, coeffs[v], x.dtype) for v in order if v is not None and coeffs[v] != 0]
    const = coeffs.get(None, 0)
    if const != 0:
        new_terms.append(UOp.const(x.value_dtype, const))
    out = _sum(new_terms, x.dtype)
    return None if out is x else out


def _div_mod_sum(x: UOp, c: UOp, is_mod: bool) -> UOp | None:
    """Pull terms whose coefficient is a multiple of c out of ``x // c`` / ``x % c``."""
    d = c.arg
    if not isinstance(d, int) or d <= 0 or x.vmin < 0 or not _no_wrap(x):
        return None
    terms = split_terms(x)
    outside: list[UOp] = []
    inside: list[UOp] = []
    changed = False
    for t in terms:
        v, k = term_coeff(t)
        if k % d == 0:
            if not is_mod:
                outside.append(_mk(v, k // d, x.dtype))
            changed = True
        elif k > d and not is_mod and v is not None and v.vmin >= 0:
            # k = q*d + r: move q*v out, keep r*v inside
            q, r = divmod(k, d)
            outside.append(_mk(v, q, x.dtype))
            inside.append(_mk(v, r, x.dtype))
            changed = True
        elif is_mod and k > d:
            inside.append(_mk(v, k % d, x.dtype))
            changed = True
        else:
            inside.append(t)
    if not changed:
        return None
    rest = _sum(inside, x.dtype)
    if rest.vmin < 0 or not _no_wrap(rest):
        return None
    if is_mod:
        return UOp(Ops.MOD, x.dtype, (rest, c))
    return _sum(outside + [UOp(Ops.IDIV, x.dtype, (rest, c))], x.dtype)


def _fold_by_bounds(x: UOp) -> UOp | None:
    """Replace an int/bool node whose bounds pin a single value with that constant."""
    if x.op is Ops.CONST or x.dtype is None or getattr(x.dtype, "kind", "") not in "iub":
        return None
    lo, hi = x.vmin, x.vmax
    if lo == hi and not (isinstance(lo, float) and math.isinf(lo)):
        return UOp.const(x.value_dtype, lo)
    return None


def _const_fold(x: UOp) -> UOp | None:
    if x.op not in GroupOp.ALU or not x.src or x.dtype is None:
        return None
    for s in x.src:  # (a loop: this runs for every node rewritten, and seldom gets past the first source)
        if s.op is not Ops.CONST:
            return None
    return UOp.const(x.value_dtype, exec_alu(x.op, x.value_dtype, tuple(s.arg for s in x.src)))


def _lt_sum(x: UOp, c: UOp) -> UOp | None:
    """``a*k + b < c`` with 0 <= b < k folds to ``a < ceil(c / k)`` style bounds checks."""
    if not isinstance(c.arg, int) or not _no_wrap(x):  # (x wrapped: x / g is not the scaled sum)
        return None
    terms = split_terms(x)
    if len(terms) < 2:
        return None
    parts = [term_coeff(t) for t in terms]
    g = 0
    for _, k in parts:
        g = math.gcd(g, k)
    if g <= 1:
        return None
    # all coefficients share g: x < c  <=>  x/g < ceil(c/g)
    if any(v is not None and v.vmin < 0 for v, _ in parts):
        return None
    scaled = _sum([_mk(v, k // g, x.dtype) for v, k in parts], x.dtype)
    return UOp(Ops.CMPLT, dtypes.bool, (scaled, UOp.const(x.value_dtype, -(-c.arg // g))))


_I = "iu"
#: ints and bools (bool arithmetic is done on 0/1): rules exact for integers but not for floats say so
_IB = "iub"

symbolic = PatternMatcher([
    (UPat(GroupOp.ALU, name="x"), _const_fold),
    (UPat(GroupOp.ALU | {Ops.CAST}, name="x"), _fold_by_bounds),
    # identities (ints and bools only: for floats x*0 is not 0 when x is nan or inf)
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat(Ops.CONST, arg=0)), kinds=_I), lambda x: x),
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat(Ops.CONST, arg=1)), kinds=_I), lambda x: x),
    # x * 1.0 is x for every float, nan, inf and -0.0 included (a gradient's ones times a value: without it the
    # compiler cannot fuse the remaining multiply and add)
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat(Ops.CONST, arg=1)), kinds="f"), lambda x: x),
    (UPat(Ops.MUL, src=(UPat(Ops.CONST, arg=1), UPat.var("x")), kinds="f"), lambda x: x),
    (UPat(Ops.MUL, src=(UPat.var("x", kinds=_I), UPat(Ops.CONST, arg=0)), name="m"),
     lambda x, m: UOp.const(m.dtype, 0)),
    # (floats: IDIV is trunc(x / 1) and MOD is fmod(x, 1), the fraction: 6.75 // 1 is not 6.75, 6.75 % 1 not 0)
    (UPat(Ops.IDIV, src=(UPat.var("x"), UPat(Ops.CONST, arg=1)), kinds=_IB), lambda x: x),
    (UPat(Ops.MOD, src=(UPat.var("x"), UPat(Ops.CONST, arg=1)), kinds=_IB, name="m"),
     lambda x, m: UOp.const(m.dtype, 0)),
    # nested sums and products of constants; sums only for signed ints (index arithmetic): unsigned values are
    # data (Threefry's words), where regrouping folds nothing and rebuilds the chain each time a term repeats
    (UPat(Ops.ADD, kinds="i", name="x"), _canonical_sum),
    (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2")), kinds=_I),
     lambda x, c1, c2: UOp(Ops.MUL, x.dtype, (x, UOp.const(x.dtype, c1.arg * c2.arg)))),
    (UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), UPat.cvar("c")), kinds=_I),
     lambda x, y, c: UOp(Ops.ADD, x.dtype, (UOp(Ops.MUL, x.dtype, (x, c)), UOp(Ops.MUL, x.dtype, (y, c))))),
    # div and mod by bounds
    (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c")), kinds=_I),
     lambda x, c: x if isinstance(c.arg, int) and 0 <= x.vmin and x.vmax < c.arg else None),
    (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c")), kinds=_I),
     lambda x, c: UOp.const(x.dtype, 0) if isinstance(c.arg, int) and 0 <= x.vmin and x.vmax < c.arg else None),
    (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c")), kinds=_I), lambda x, c: _div_mod_sum(x, c, False)),
    (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c")), kinds=_I), lambda x, c: _div_mod_sum(x, c, True)),
    (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b")), kinds=_I),
     lambda x, a, b: UOp(Ops.IDIV, x.dtype, (x, UOp.const(x.dtype, a.arg * b.arg)))
     if x.vmin >= 0 and a.arg > 0 and b.arg > 0 and a.arg * b.arg <= dtypes.max(x.value_dtype) else None),
    (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b")), kinds=_I),
     lambda x, a, b: UOp(Ops.MOD, x.dtype, (x, b))
     if x.vmin >= 0 and a.arg > 0 and b.arg > 0 and a.arg % b.arg == 0 else None),
    (UPat(Ops.IDIV, src=(UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b")), kinds=_I),
     lambda x, a, b: UOp(Ops.MOD, x.dtype, (UOp(Ops.IDIV, x.dtype, (x, b)), UOp.const(x.dtype, a.arg // b.arg)))
     if x.vmin >= 0 and b.arg > 0 and a.arg % b.arg == 0 else None),
    # comparisons and boolean algebra
    (UPat(Ops.CMPLT, src=(UPat.var("x", kinds=_I), UPat.cvar("c"))), _lt_sum),
    (UPat(Ops.AND, src=(UPat.var("x"), UPat(Ops.CONST, arg=True)), dtype=dtypes.bool), lambda x: x),
    (UPat(Ops.AND, src=(UPat.var("x"), UPat(Ops.CONST, arg=False)), dtype=dtypes.bool),
     lambda x: UOp.const(dtypes.bool, False)),
    (UPat(Ops.AND, src=(UPat.var("x"), UPat.var("x")), dtype=dtypes.bool), lambda x: x),
    (UPat(Ops.WHERE, src=(UPat(Ops.CONST, arg=True), UPat.var("a"), UPat.var("b"))), lambda a, b: a),
    (UPat(Ops.WHERE, src=(UPat(Ops.CONST, arg=False), UPat.var("a"), UPat.var("b"))), lambda a, b: b),
    (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("a"))), lambda c, a: a),
])


#: the key under which a node records its simplification (see :func:`known_simplified`)
_SIMPLIFIED = symbolic.cache_key
_MISSING = object()


def simplify(u: UOp) -> UOp:
    """Simplify an expression graph with the symbolic rules."""
    out = graph_rewrite(u, symbolic)
    if out is not u:  # a result is a fixed point: recorded, so graphs built on it know (see known_simplified)
        out.__dict__.setdefault(_SIMPLIFIED, None)
    return out


#: float nodes no rule rewrites when no source is a constant: every float rule needs one (constant folding,
#: ``x * 1.0``), except ``WHERE``'s ``c ? a : a``. A float rule that does not must leave its op out of this set
#: (tests/unit/test_lowering_fast_paths.py tries every op of it on non-constant sources)
_FLOAT_INERT = (GroupOp.ALU - {Ops.WHERE}) | {Ops.CAST}


def is_simplified(u: UOp) -> bool:
    """Whether ``u`` is recorded as a fixed point of :func:`simplify` (a result of it, or see
    :func:`known_simplified`)."""
    return u.__dict__.get(_SIMPLIFIED, _MISSING) is None


def mark_simplified(u: UOp) -> UOp:
    """Record ``u`` as a fixed point of :func:`simplify`; only for a node its builder made in simplify's own form
    from simplified parts (lowering's ``x + c`` of a simplified sum ``x``, see ``ember.codegen.lowerer``)."""
    u.__dict__[_SIMPLIFIED] = None
    return u


def known_simplified(u: UOp) -> bool:
    """Whether ``u`` is certainly a fixed point of :func:`simplify` without trying the rules, recording it as one
    when so (as a simplification would): every source is one, and ``u`` is an op with no rules at all (a load, a
    reduction, a buffer) or a float node of :data:`_FLOAT_INERT` without a constant source.

    Lowering records the value graph it builds (a register tile's thousands of float multiply-adds, loads and
    reductions): simplifying the kernel at the end then stops at those nodes, where trying every rule on each
    of them found nothing and took a third of a tile's lowering."""
    hit = u.__dict__.get(_SIMPLIFIED, _MISSING)
    if hit is not _MISSING:
        return hit is None  # (a matcher's entry for "rewrites to itself")
    # the sources in order, each settled before the next (the first that is not known ends its user's walk), with
    # a stack rather than recursion: a chain of any length
    answer: dict[UOp, bool] = {}
    stack = [(u, iter(u.src))] if _inert(u) else []
    if not stack:
        return False
    while stack:
        n, it = stack[-1]
        ok = True
        for s in it:
            if s.op is Ops.CONST:
                continue
            known = s.__dict__.get(_SIMPLIFIED, _MISSING)
            if known is not _MISSING:
                if known is not None:
                    ok = False
                    break
                continue
            if s in answer:
                if not answer[s]:
                    ok = False
                    break
                continue
            if not _inert(s):
                answer[s] = ok = False
                break
            stack.append((s, iter(s.src)))
            break
        else:
            stack.pop()
            n.__dict__[_SIMPLIFIED] = None
            answer[n] = True
            continue
        if not ok:  # each open node waits on the one above it: none of them is known either
            for m, _ in stack:
                answer[m] = False
            break
    return answer[u]


def _inert(u: UOp) -> bool:
    """Whether no rule applies to ``u`` itself (an op with no rules, or see :data:`_FLOAT_INERT`)."""
    op = u.op
    if symbolic.for_op[op]:
        dt = u.dtype
        if op not in _FLOAT_INERT or not isinstance(dt, DType) or dt.kind != "f" or \
                any(s.op is Ops.CONST for s in u.src):
            return False
    return True


# --- symbolic ints: an int, or an int expression (UOp) over bound variables ---------------------------

def _u(x: int | UOp) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(dtypes.int32, x)


def sint_of(x: object) -> int | UOp:
    """``x`` as a symbolic int: ints stay ints, a bound :class:`Variable` becomes its bound node, an
    expression is simplified (to an int when it folds to a constant)."""
    if isinstance(x, Variable):
        return x.bound_uop
    if isinstance(x, UOp):
        y = simplify(_sub_as_sum(x))
        return y.arg if y.op is Ops.CONST else _ordered_sum(y)
    return operator.index(x)  # type: ignore[arg-type]


def _ordered_sum(x: UOp) -> UOp:
    """A simplified sum with its variable terms in one order (by their text) and the constant last, so
    ``i + j`` and ``j + i`` are the same node."""
    if x.op is not Ops.ADD:
        return x
    terms = split_terms(x)
    const = [t for t in terms if t.op is Ops.CONST]
    ordered = sorted((t for t in terms if t.op is not Ops.CONST), key=sint_str) + const
    out = _sum(ordered, x.dtype)
    return out


def _sub_as_sum(x: UOp) -> UOp:
    """``x`` with every integer ``a - b`` written ``a + b*-1``: sums simplify (like terms cancel), differences
    do not, and sizes computed with ``-`` (``n - lo``) must compare equal to the same size built with ``+``."""
    if not any(n.op is Ops.SUB for n in x.toposort()):
        return x
    memo: dict[UOp, UOp] = {}
    for n in x.toposort():
        src = tuple(memo[s] for s in n.src)
        if n.op is Ops.SUB and _is_int(n):
            memo[n] = UOp(Ops.ADD, n.dtype, (src[0], UOp(Ops.MUL, n.dtype, (src[1], UOp.const(n.value_dtype, -1)))))
        else:
            memo[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
    return memo[x]


def sadd(a: int | UOp, b: int | UOp) -> int | UOp:
    """a + b."""
    return a + b if isinstance(a, int) and isinstance(b, int) else sint_of(_u(a) + _u(b))


def ssub(a: int | UOp, b: int | UOp) -> int | UOp:
    """a - b (kept as a sum, so like terms cancel)."""
    return a - b if isinstance(a, int) and isinstance(b, int) else sint_of(_u(a) + _u(b) * -1)


def sym_le(a: int | UOp, b: int | UOp) -> bool:
    """Whether a <= b holds for every value the variables may take."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    d = ssub(b, a)
    return d >= 0 if isinstance(d, int) else d.vmin >= 0


def smax(a: int | UOp, b: int | UOp) -> int | UOp:
    """max(a, b)."""
    if sym_le(a, b):
        return b
    if sym_le(b, a):
        return a
    return _u(a).maximum(_u(b))


def smin(a: int | UOp, b: int | UOp) -> int | UOp:
    """min(a, b)."""
    if sym_le(a, b):
        return a
    if sym_le(b, a):
        return b
    return ssub(0, smax(ssub(0, a), ssub(0, b)))


def smul(a: int | UOp, b: int | UOp) -> int | UOp:
    """a * b (a symbolic factor first, the int coefficient last, so equal products are the same node)."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int):
        a, b = b, a
    if isinstance(b, int):
        return 0 if b == 0 else a if b == 1 else sint_of(a * b)
    return sint_of(a * b)


def sprod(xs: Iterable[int | UOp]) -> int | UOp:
    """The product of symbolic ints: the int factors multiplied first, then the symbolic ones in order."""
    xs = tuple(xs)
    if not any(isinstance(x, UOp) for x in xs):
        return math.prod(xs)
    const, syms = 1, []
    for x in xs:
        if isinstance(x, UOp):
            syms.append(x)
        else:
            const *= x
    if not syms or const == 0:
        return const
    out: int | UOp = syms[0]
    for x in syms[1:]:
        out = sint_of(_u(out) * x)
    return smul(out, const)


def is_sym(x: object) -> bool:
    """Whether ``x`` is a symbolic int (an expression over variables, not a plain int)."""
    return isinstance(x, UOp)


def sint_max(x: int | UOp) -> int:
    """The largest value ``x`` takes over its variables' ranges (what a buffer for it is sized by)."""
    if isinstance(x, int):
        return x
    hi = x.vmax
    if not isinstance(hi, int):
        raise ValueError(f"the size {sint_str(x)} has no known upper bound")
    return hi


def bound_vals(x: int | UOp) -> dict[str, int]:
    """The values of the bound variables in ``x`` (by name); a variable bound to two values is an error."""
    out: dict[str, int] = {}
    if isinstance(x, UOp):
        unbind_uop(x, out)
    return out


def sint_eval(x: int | UOp, var_vals: dict[str, int] | None = None) -> int:
    """The value of ``x``: its variables at ``var_vals``, or at the values they are bound to."""
    if isinstance(x, int):
        return x
    vals = bound_vals(x) if var_vals is None else var_vals
    memo: dict[UOp, int] = {}
    for n in x.toposort():
        if n.op is Ops.DEFINE_VAR:
            if n.arg[0] not in vals:
                raise ValueError(f"variable {n.arg[0]!r} has no value (bind it: Variable(...).bind(n))")
            memo[n] = vals[n.arg[0]]
        elif n.op is Ops.CONST:
            memo[n] = n.arg
        elif n.op is Ops.CAST:
            memo[n] = memo[n.src[0]]
        else:
            memo[n] = exec_alu(n.op, n.value_dtype, tuple(memo[s] for s in n.src))
    return int(memo[x])


def binding_conflict(*xs: int | UOp) -> str | None:
    """A message when symbolic ints ``xs`` bind one variable to different values (``n`` to 3 and to 4), else
    None."""
    seen: dict[str, int] = {}
    for x in xs:
        if isinstance(x, UOp):
            for n in x.toposort():
                if n.op is Ops.DEFINE_VAR and len(n.arg) == 4:
                    if seen.setdefault(n.arg[0], n.arg[3]) != n.arg[3]:
                        return (f"variable {n.arg[0]!r} is bound to both {seen[n.arg[0]]} and {n.arg[3]}; use one "
                                "value of a variable at a time")
    return None


def sint_str(x: int | UOp) -> str:
    """A short readable form of a symbolic int, e.g. ``n``, ``n+1`` or ``n*4`` (a bound variable shows its value:
    ``n=7``)."""
    if isinstance(x, int):
        return str(x)
    names = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.SUB: "-"}
    memo: dict[UOp, str] = {}
    for n in x.toposort():
        if n.op is Ops.DEFINE_VAR:
            memo[n] = f"{n.arg[0]}={n.arg[3]}" if len(n.arg) == 4 else n.arg[0]
        elif n.op is Ops.CONST:
            memo[n] = str(n.arg)
        elif n.op is Ops.CAST:
            memo[n] = memo[n.src[0]]
        elif n.op in names and len(n.src) == 2:
            memo[n] = f"({memo[n.src[0]]}{names[n.op]}{memo[n.src[1]]})" if n is not x else \
                f"{memo[n.src[0]]}{names[n.op]}{memo[n.src[1]]}"
        else:
            memo[n] = f"{n.op.name.lower()}({', '.join(memo[s] for s in n.src)})"
    return memo[x]


def unbind_uop(x: int | UOp, var_vals: dict[str, int]) -> int | UOp:
    """``x`` with every bound variable replaced by the plain DEFINE_VAR kernels take; values go to ``var_vals``."""
    if isinstance(x, int):
        return x
    memo: dict[UOp, UOp] = {}
    for n in x.toposort():
        if n.op is Ops.DEFINE_VAR and len(n.arg) == 4:
            name, lo, hi, val = n.arg
            if var_vals.setdefault(name, val) != val:
                raise ValueError(f"variable {name!r} is bound to both {var_vals[name]} and {val} in one computation; "
                                 "use one value of a variable at a time")
            memo[n] = UOp(Ops.DEFINE_VAR, n.dtype, (), (name, lo, hi))
        else:
            src = tuple(memo[s] for s in n.src)
            memo[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
    return memo[x]


def rebind_uop(x: int | UOp, var_vals: dict[str, int]) -> int | UOp:
    """``x`` with the variables named in ``var_vals`` bound to those values (bound or not before)."""
    if isinstance(x, int) or not var_vals:
        return x
    memo: dict[UOp, UOp] = {}
    for n in x.toposort():
        if n.op is Ops.DEFINE_VAR and n.arg[0] in var_vals:
            memo[n] = UOp(Ops.DEFINE_VAR, n.dtype, (), (*n.arg[:3], var_vals[n.arg[0]]))
        else:
            src = tuple(memo[s] for s in n.src)
            memo[n] = n if all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, n.arg)
    return memo[x]


class Variable:
    """A named integer in ``[min, max]`` that kernels take at launch (a DEFINE_VAR), like tinygrad's.

    ``Variable("n", 1, 128).bind(7)`` is the same variable bound to 7: a tensor op given it
    (reshape, shrink, pad) builds a graph whose kernels read ``n`` at run time, so a jitted
    function captured with one value replays for any other without compiling.
    """

    __slots__ = ("name", "min", "max", "val")

    def __init__(self, name: str, min: int, max: int, val: int | None = None):  # noqa: A002 - tinygrad's names
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a Variable name must be an identifier, got {name!r}")
        if not (isinstance(min, int) and isinstance(max, int)) or min > max:
            raise ValueError(f"Variable {name!r}: needs int bounds with min <= max, got [{min}, {max}]")
        if val is not None and not (isinstance(val, int) and min <= val <= max):
            raise ValueError(f"Variable {name!r}: value {val!r} is outside [{min}, {max}]")
        self.name, self.min, self.max, self.val = name, min, max, val

    def bind(self, val: int) -> Variable:
        """This variable bound to ``val`` (checked against its range)."""
        try:
            v = operator.index(val)
        except TypeError:
            raise TypeError(f"Variable {self.name!r}: can only bind an int, got {type(val).__name__}") from None
        return Variable(self.name, self.min, self.max, v)

    def unbind(self) -> tuple[Variable, int]:
        """(the unbound variable, its value)."""
        if self.val is None:
            raise ValueError(f"Variable {self.name!r} is not bound")
        return Variable(self.name, self.min, self.max), self.val

    @property
    def uop(self) -> UOp:
        """The DEFINE_VAR node kernels read (the same for every value)."""
        return UOp(Ops.DEFINE_VAR, dtypes.int32, (), (self.name, self.min, self.max))

    @property
    def bound_uop(self) -> UOp:
        """The node a tensor graph holds: DEFINE_VAR with the value as a fourth arg (stripped for kernels)."""
        if self.val is None:
            raise ValueError(f"Variable {self.name!r} must be bound to a value (.bind(n)) before a tensor uses it")
        return UOp(Ops.DEFINE_VAR, dtypes.int32, (), (self.name, self.min, self.max, self.val))

    # arithmetic builds symbolic ints (bound expressions), e.g. ``x.shrink(((v, v + 1),))``
    def __add__(self, x: object) -> int | UOp:
        return sadd(self.bound_uop, sint_of(x))

    __radd__ = __add__

    def __sub__(self, x: object) -> int | UOp:
        return ssub(self.bound_uop, sint_of(x))

    def __rsub__(self, x: object) -> int | UOp:
        return ssub(sint_of(x), self.bound_uop)

    def __mul__(self, x: int) -> int | UOp:
        return sint_of(self.bound_uop * operator.index(x))

    __rmul__ = __mul__

    def __neg__(self) -> int | UOp:
        return ssub(0, self.bound_uop)

    def __int__(self) -> int:
        if self.val is None:
            raise ValueError(f"Variable {self.name!r} is not bound")
        return self.val

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Variable) and (self.name, self.min, self.max, self.val) == \
            (other.name, other.min, other.max, other.val)

    def __hash__(self) -> int:
        return hash((self.name, self.min, self.max, self.val))

    def __repr__(self) -> str:
        bound = f"={self.val}" if self.val is not None else ""
        return f"Variable({self.name!r}, {self.min}, {self.max}){bound}"

