"""FOO's C dialect: ember's C-family renderer with one calling convention for every kernel.

Every kernel is ``void NAME(void **bufs, const long long *vals)``: buffer ``i`` is ``bufs[i]`` and
int variable ``j`` is ``vals[j]``, so the runtime calls all kernels the same way through ctypes.
"""
from __future__ import annotations

from ember.renderer import C_PREAMBLE, CStyleRenderer, DType, Ops, PtrDType, UOp, dtypes


class FooRenderer(CStyleRenderer):
    """C with vector types; float16 is C's ``_Float16`` when the compiler has it (else FOO does not offer float16).

    Capabilities and tuning policy (register-tile sizes, layout-copy thresholds) are the defaults of
    :class:`ember.renderer.Renderer`, those of a loop-based target on a C compiler; a plugin sets any of them
    as a class attribute (docs/contracts.md lists them all). The values each op and cast must give are
    ``CStyleRenderer``'s already."""

    device = "FOO"
    preamble = C_PREAMBLE
    #: FOO's compilers have C's vector extension: declaring the widths and the vector ops is all it takes for
    #: codegen to hand this renderer vector loads, stores, arithmetic and accumulators (an upcast axis that is
    #: contiguous and aligned), which ``CStyleRenderer`` writes as ``__attribute__((vector_size))`` types
    vector_widths = {dtypes.float32: (4,), dtypes.float64: (2,)}
    vector_alu = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX})

    def __init__(self, float16: bool = True):
        if not float16:
            self.supported_dtypes = self.supported_dtypes - {dtypes.float16}
            self.supports_float16 = False

    def render_cast(self, u: UOp, x: str) -> str:
        """C for converting ``x`` to ``u.dtype``: every value conversion FOO renders goes through here.

        Conversions to float16 are one C cast to ``_Float16`` (a single rounding, also from float64);
        everything else is the C-family renderer's (bool, bfloat16, and float -> int where an
        out-of-range value gives 0 on every ember device).
        """
        if u.dtype == dtypes.float16:
            return f"((_Float16)({x}))"
        return super().render_cast(u, x)

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        """The uniform signature, unpacking ``bufs`` and ``vals`` into the names the body uses."""
        head: list[str] = []
        nvals = 0
        for pname, dt in params:
            if isinstance(dt, PtrDType):
                t = self.storage_type(dt.base)
                index = pname.removeprefix("data")  # the C-family renderer names buffer i "data<i>"
                head.append(f"  {t}* restrict {pname} = ({t}*)bufs[{index}];")
            else:
                t = self.render_dtype(dt)
                head.append(f"  const {t} {pname} = ({t})vals[{nvals}];")
                nvals += 1
        return "\n".join([self.preamble, f"void {name}(void** bufs, const long long* vals) {{", *head, *body, "}", ""])
