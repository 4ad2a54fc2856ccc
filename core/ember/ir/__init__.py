"""The IR: UOps (the one DAG node type of every stage), pattern rewriting, symbolic integers and shape tracking."""
from ember.ir.uop import GroupOp, Ops, UOp, exec_alu, toposort

__all__ = ["GroupOp", "Ops", "UOp", "exec_alu", "toposort"]
