"""torch's rule for a second ``backward()`` through the same graph.

torch frees the values a graph saved for its backward pass when ``backward()`` runs; a second
``backward()`` through a node that needed saved values raises, unless the first call passed
``retain_graph=True``. A node that saved nothing (an addition, a reshape, a sum, a cast ...) can be
gone through again, and gradients accumulate. ember's gradient rules keep their inputs alive, so
nothing is freed here: the nodes are only marked, to give the same answers and the same error.
"""
from __future__ import annotations

from typing import Any

from ember.autograd import toposort_tape

#: gradient rules that read no saved value (names as recorded: ALU op names and the frontend's own)
SAVE_FREE = frozenset({"ADD", "SUB", "NEG", "copy", "contiguous", "contiguous_backward", "clone", "view", "cast",
                       "sum"})

_SECOND_TIME = ("Trying to backward through the graph a second time (or directly access saved tensors after they "
                "have already been freed). Saved intermediate values of the graph are freed when you call "
                ".backward(). Specify retain_graph=True if you need to backward through the graph a second time.")


def check_reusable(root: Any) -> None:
    """Raise torch's RuntimeError when the graph of ``root`` goes through a node an earlier backward released."""
    for t in toposort_tape(root):
        if t._ctx is not None and getattr(t._ctx, "released", False):
            raise RuntimeError(_SECOND_TIME)


def release(root: Any) -> None:
    """Mark the nodes of ``root``'s graph whose gradient rule needs saved values as used up."""
    for t in toposort_tape(root):
        if t._ctx is not None and t._ctx.name not in SAVE_FREE:
            t._ctx.released = True
