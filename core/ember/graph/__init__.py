"""The graph layer: UOps, pattern rewriting, symbolic integers and shape tracking."""
from ember.graph.uop import GroupOp, Ops, UOp, exec_alu, toposort

__all__ = ["GroupOp", "Ops", "UOp", "exec_alu", "toposort"]
