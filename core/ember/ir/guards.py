"""Range guards for symbolic windows that only some values of their variables keep in bounds.

A shrink like ``arange(ctx).shrink(((pos, pos + n),))`` with ``pos`` in ``[0, ctx - 1]`` is in bounds only while
``pos <= ctx - n``. The frontend accepts it (as tinygrad does) when the values bound now fit, and reads it through
a masked padding so no value can read outside the buffer. A jitted function replays its kernels with new values
without running the frontend again, so the windows built while it was captured are recorded here and checked
against every replay's values: a value that puts a window out of bounds raises instead of reading zeros.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from ember.ir.symbolic import bound_vals, sint_eval, sint_str
from ember.ir.uop import UOp


@dataclass(frozen=True)
class Window:
    """``0 <= lo <= hi <= size`` must hold (any of them symbolic) for the values a kernel runs with."""

    lo: int | UOp
    hi: int | UOp
    size: int | UOp

    def violation(self, var_vals: dict[str, int]) -> str | None:
        """A message when ``var_vals`` (over the bound values) put the window out of bounds, else None."""
        vals: dict[str, int] = {}
        for x in (self.lo, self.hi, self.size):
            vals.update(bound_vals(x))
        vals.update(var_vals)
        lo, hi, size = (sint_eval(x, vals) for x in (self.lo, self.hi, self.size))
        if 0 <= lo <= hi <= size:
            return None
        names = ", ".join(f"{k}={v}" for k, v in sorted(vals.items()))
        return (f"the window [{sint_str(self.lo)}, {sint_str(self.hi)}) of a dimension of size {sint_str(self.size)} "
                f"is [{lo}, {hi}) of {size} at {names}: out of bounds")


_recording: contextvars.ContextVar[list[Window] | None] = contextvars.ContextVar("ember_guards", default=None)


def record(lo: int | UOp, hi: int | UOp, size: int | UOp) -> None:
    """Note a window that some values of its variables put out of bounds (kept while :func:`recording`)."""
    out = _recording.get()
    if out is not None:
        out.append(Window(lo, hi, size))


@contextlib.contextmanager
def recording() -> Iterator[list[Window]]:
    """Collect the windows :func:`record` notes while the block runs (a jitted function's capture)."""
    out: list[Window] = []
    token = _recording.set(out)
    try:
        yield out
    finally:
        _recording.reset(token)


def first_violation(windows: list[Window], var_vals: dict[str, int]) -> str | None:
    """The message of the first window ``var_vals`` put out of bounds, or None."""
    for w in windows:
        if (msg := w.violation(var_vals)) is not None:
            return msg
    return None
