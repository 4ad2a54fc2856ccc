"""The CPU plugin's C dialect: one uniform entry point per kernel, OpenMP on the outer loop."""
from __future__ import annotations

import os

from ember.dtype import DType, PtrDType
from ember.graph.uop import UOp
from ember.renderer.cstyle import C_PREAMBLE, CStyleRenderer


class CPURenderer(CStyleRenderer):
    """Plain C for the host compiler.

    Every kernel has the signature ``void NAME(void** bufs, const long long* vals)`` so the
    runtime and the batched graph call all kernels the same way.
    """

    device = "CPU"
    preamble = C_PREAMBLE
    has_local = False
    parallel_threads = os.cpu_count() or 1

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        head: list[str] = []
        nvar = 0
        for pname, dt in params:
            if isinstance(dt, PtrDType):
                t = self.storage_type(dt.base)
                head.append(f"  {t}* {self.restrict} {pname} = ({t}*)bufs[{pname[4:]}];")
            else:
                t = self.render_dtype(dt)
                head.append(f"  const {t} {pname} = ({t})vals[{nvar}];")
                nvar += 1
        return "\n".join([self.preamble, f"void {name}(void** bufs, const long long* vals) {{", *head, *body, "}", ""])

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        loop = f"for ({self.render_dtype(u.dtype)} {var} = {start}; {var} < {end}; {var}++) {{"
        return ["#pragma omp parallel for schedule(static)", loop] if parallel else [loop]
