"""Execution: lowering schedules to ExecItems and running them (realize), and TinyJit capture/replay (jit)."""
