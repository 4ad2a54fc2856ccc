"""A small pattern matcher and bottom-up graph rewriter for UOps.

``UPat`` describes a shape of subgraph; ``PatternMatcher`` maps patterns to functions that
return a replacement (or None to decline); ``graph_rewrite`` applies a matcher everywhere in
a graph until nothing changes.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Iterator
from typing import Any, Callable

from ember.dtype import DType
from ember.ir.uop import GroupOp, Ops, UOp, toposort


class UPat:
    """A pattern over UOps. ``name`` binds the matched node for the rewrite function.

    ``op`` may be one op or a set; ``src`` a tuple of sub-patterns (commutative ops also try the
    swapped order); ``arg`` must equal when given; ``dtype`` may be a DType or a set of kinds
    (``"f"``, ``"i"`` ...).
    """

    __slots__ = ("ops", "src", "arg", "name", "dtype", "kinds")

    def __init__(self, op: Ops | frozenset[Ops] | set[Ops] | None = None, src: tuple[UPat, ...] | None = None,
                 arg: Any = None, name: str | None = None, dtype: DType | None = None, kinds: str | None = None):
        self.ops = None if op is None else (frozenset({op}) if isinstance(op, Ops) else frozenset(op))
        self.src, self.arg, self.name, self.dtype, self.kinds = src, arg, name, dtype, kinds

    @staticmethod
    def var(name: str | None = None, kinds: str | None = None) -> UPat:
        """Match any node."""
        return UPat(name=name, kinds=kinds)

    @staticmethod
    def cvar(name: str | None = None, kinds: str | None = None) -> UPat:
        """Match a constant."""
        return UPat(Ops.CONST, name=name, kinds=kinds)

    def match(self, u: UOp, store: dict[str, UOp]) -> bool:
        """Try to match ``u``; on success ``store`` holds the named bindings."""
        if self.ops is not None and u.op not in self.ops:
            return False
        if self.arg is not None and u.arg != self.arg:
            return False
        if self.dtype is not None and u.dtype != self.dtype:
            return False
        if self.kinds is not None and not (isinstance(u.dtype, DType) and u.dtype.kind in self.kinds):
            return False
        if self.name is not None:
            if self.name in store and store[self.name] is not u:
                return False
            store[self.name] = u
        if self.src is None:
            return True
        if len(self.src) != len(u.src):
            return False
        if len(self.src) != 2 or u.op not in GroupOp.Commutative:
            # one order: bindings made before a failing source are left in ``store``, which the caller then drops
            for p, s in zip(self.src, u.src):
                if not p.match(s, store):
                    return False
            return True
        s0, s1 = u.src
        for order in (self.src, (self.src[1], self.src[0])):
            p0, p1 = order
            # a source of another op fails at once: no bindings to copy
            if (p0.ops is not None and s0.op not in p0.ops) or (p1.ops is not None and s1.op not in p1.ops):
                continue
            trial = store.copy()
            if p0.match(s0, trial) and p1.match(s1, trial):
                store.update(trial)
                return True
        return False


RewriteFn = Callable[..., "UOp | None"]


#: a matcher's cache entry for a node that rewrites to itself (storing the node would make it refer to itself)
_SELF = None
_MISSING = object()
_matcher_ids = itertools.count()


class PatternMatcher:
    """An ordered list of (pattern, function) rules, indexed by root op (and dtype) for speed."""

    def __init__(self, rules: list[tuple[UPat, RewriteFn]]):
        self.rules = rules
        # rewriting is a pure function of the (immutable, hash-consed) node: each node remembers its result under
        # this matcher's key in its own ``__dict__`` (it lives as long as the node does, like a weak-keyed cache,
        # without a weak reference per entry)
        self.cache_key = f"_rw{next(_matcher_ids)}"
        self.by_op: dict[Ops, list[tuple[UPat, RewriteFn]]] = {}
        self.any_op: list[tuple[UPat, RewriteFn]] = []
        for pat, fn in rules:
            if pat.ops is None:
                self.any_op.append((pat, fn))
            else:
                for op in pat.ops:
                    self.by_op.setdefault(op, []).append((pat, fn))
        #: what :meth:`rewrite` tries for a node of each op: its op's rules, then the rules for any op
        self.for_op: dict[Ops, tuple[tuple[UPat, RewriteFn], ...]] = {op: tuple(self.by_op.get(op, ())) +
                                                                      tuple(self.any_op) for op in Ops}
        #: the rules of ``for_op`` whose root pattern accepts a node's dtype, by (op, dtype), filled as met; each
        #: with the name a pattern that checks nothing but the op binds the node to (it needs no matching)
        self._for_op_dtype: dict[tuple[Ops, Any], tuple[tuple[UPat, RewriteFn, str | None], ...]] = {}

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def _rules_for(self, op: Ops, dtype: Any) -> tuple[tuple[UPat, RewriteFn, str | None], ...]:
        rules = tuple((pat, fn, _bare_name(pat, fn)) for pat, fn in self.for_op[op] if _dtype_may_match(pat, dtype))
        self._for_op_dtype[(op, dtype)] = rules
        return rules

    def rewrite(self, u: UOp) -> UOp | None:
        """The first rule's replacement for ``u``, or None."""
        try:
            rules = self._for_op_dtype[(u.op, u.dtype)]
        except KeyError:
            rules = self._rules_for(u.op, u.dtype)
        for pat, fn, bare in rules:
            if bare is not None:
                out = fn(u) if bare is _POSITIONAL else fn(**{bare: u})
            else:
                store: dict[str, UOp] = {}
                if not pat.match(u, store):
                    continue
                out = fn(**store)
            if out is not None and out is not u:
                return out
        return None


#: a bare pattern's function that takes the node as its one positional argument
_POSITIONAL = "<positional>"


def _bare_name(pat: UPat, fn: RewriteFn) -> str | None:
    """The name ``pat`` binds when it checks nothing but the op (a node of its op always matches), else None;
    ``_POSITIONAL`` when ``fn(node)`` is the same call as ``fn(**{name: node})``."""
    if pat.name is None or pat.src is not None or pat.arg is not None or pat.dtype is not None or pat.kinds is not None:
        return None
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature: call it as matched
        return pat.name
    if params and params[0].name == pat.name and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and \
            all(p.default is not inspect.Parameter.empty for p in params[1:]
                if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)):
        return _POSITIONAL
    return pat.name


def _dtype_may_match(pat: UPat, dtype: Any) -> bool:
    """Whether ``pat``'s root checks on the dtype (:meth:`UPat.match`'s) accept ``dtype``."""
    if pat.dtype is not None and dtype != pat.dtype:
        return False
    return pat.kinds is None or (isinstance(dtype, DType) and dtype.kind in pat.kinds)


#: the rewrite tables of every graph_rewrite inside a :func:`keep_rewrites` block (None outside one)
_kept: list[dict[UOp, UOp]] | None = None


@contextlib.contextmanager
def keep_rewrites() -> Iterator[None]:
    """Keep every node a rewrite meets (and so its cached result) alive until the block ends.

    A node remembers its rewrite only while it lives. Lowering a kernel simplifies many small expressions
    that share subexpressions; kept alive, each is simplified once per kernel instead of once per use."""
    global _kept
    if _kept is not None:  # an enclosing block keeps them already
        yield
        return
    _kept = []
    try:
        yield
    finally:
        _kept = None


def graph_rewrite(root: UOp, pm: PatternMatcher, max_iters: int = 1000) -> UOp:
    """Rewrite every node bottom-up with ``pm`` until a fixed point; returns the new root."""
    key = pm.cache_key
    hit = root.__dict__.get(key, _MISSING)
    if hit is not _MISSING:
        return root if hit is _SELF else hit
    memo: dict[UOp, UOp] = {}
    table = pm._for_op_dtype
    # sources before users (toposort's order), not looking below a node rewritten before
    seen: set[UOp] = {root}
    stack = [(root, iter(root.src))]
    while stack:
        node, it = stack[-1]
        for s in it:
            if s not in seen:
                seen.add(s)
                stack.append((s, iter(() if key in s.__dict__ else s.src)))
                break
        else:
            stack.pop()
            hit = node.__dict__.get(key, _MISSING)
            if hit is not _MISSING:
                memo[node] = node if hit is _SELF else hit
                continue
            # what _rebuild does first, without its loop: most nodes have no rule for their op and dtype
            src = node.src
            new_src = tuple(map(memo.__getitem__, src))
            new = node if new_src == src else UOp(node.op, node.dtype, new_src, node.arg)
            rules = table.get((new.op, new.dtype))
            if rules is None:
                rules = pm._rules_for(new.op, new.dtype)
            memo[node] = _rebuild(node, memo, pm, max_iters) if rules else new
    for n, out in memo.items():
        n.__dict__[key] = _SELF if out is n else out
    if _kept is not None:
        _kept.append(memo)
    return memo[root]


def _rebuild(node: UOp, memo: dict[UOp, UOp], pm: PatternMatcher, max_iters: int) -> UOp:
    """``node`` with its sources' rewrites (from ``memo``), rewritten by ``pm`` until a rule no longer fires."""
    for _ in range(max_iters):
        new_src = tuple(map(memo.__getitem__, node.src))
        if new_src != node.src:  # UOps compare by identity
            node = UOp(node.op, node.dtype, new_src, node.arg)
        replaced = pm.rewrite(node)
        if replaced is None:
            return node
        fresh = replaced not in memo
        # the replacement may contain nodes not yet rewritten (a node in memo has its sources there too)
        for n in toposort([replaced], stop=memo.__contains__):
            if n not in memo:
                memo[n] = n  # placeholder so _rebuild sees its sources
                memo[n] = _rebuild(n, memo, pm, max_iters)
        node = memo[replaced]
        if fresh or pm.rewrite(node) is None:  # _rebuild(replaced) stopped at a fixed point itself
            return node
    raise RuntimeError(f"graph_rewrite did not converge on {node.op}")
