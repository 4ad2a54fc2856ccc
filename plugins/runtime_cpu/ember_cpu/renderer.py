"""The CPU plugin's C dialect: one uniform entry point per kernel, OpenMP on the outer loop."""
from __future__ import annotations

import os

from ember.dtype import DType, PtrDType, dtypes
from ember.graph.symbolic import split_terms, term_coeff
from ember.graph.uop import Ops, UOp
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

    def render(self, name: str, uops: list[UOp]) -> str:
        # loops along which every load that moves moves by one element: worth vectorizing as a reduction
        strides: dict[UOp, set[int]] = {}
        for u in uops:
            if u.op is Ops.LOAD:
                for t in split_terms(u.src[1]):
                    var, c = term_coeff(t)
                    if var is not None and var.op is Ops.RANGE:
                        strides.setdefault(var, set()).add(c)
        self.unit_stride_ranges = {r for r, cs in strides.items() if cs == {1}}
        return super().render(name, uops)

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        loop = f"for ({self.render_dtype(u.dtype)} {var} = {start}; {var} < {end}; {var}++) {{"
        if parallel:
            return ["#pragma omp parallel for schedule(static)", loop]
        sums = [name for name, op, dt in self.loop_accs if op is Ops.ADD and dt in (dtypes.float32, dtypes.float64)]
        if u.arg[1] == "reduce" and sums and len(sums) == len(self.loop_accs) and u in self.unit_stride_ranges:
            # let the compiler reorder this float sum into vector lanes (as BLAS and numpy do)
            return [f"#pragma omp simd reduction(+:{','.join(sums)})", loop]
        return [loop]
