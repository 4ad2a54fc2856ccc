"""Execution: ExecItem, run_schedule, and (later) the jit."""
