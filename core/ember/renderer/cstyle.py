"""The C-family renderer shared by the CPU (C), OpenCL, CUDA and Metal dialects.

A dialect subclasses :class:`CStyleRenderer` and overrides the few hooks where the languages
differ: type names, the kernel signature, how a parallel loop and a barrier are spelled, and
math function names. Everything else (naming values, loops, accumulators, gated loads and
stores, literals) is shared.
"""
from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Callable

from ember.dtype import DType, PtrDType, dtypes
from ember.ir.uop import GroupOp, Ops, UOp
from ember.renderer import Renderer


class CStyleRenderer(Renderer):
    """Renders linear UOps to C-like source. Dialects override the class attributes and hooks."""

    kernel_prefix: str = ""
    buffer_prefix: str = ""
    restrict: str = "restrict"
    type_map: dict[DType, str] = {
        dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
        dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int",
        dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "_Float16",
        dtypes.bfloat16: "float", dtypes.float32: "float", dtypes.float64: "double"}
    #: float32 math function names; float64 drops the ``f`` suffix
    math_fns: dict[Ops, str] = {Ops.SQRT: "sqrtf", Ops.EXP: "expf", Ops.LOG: "logf", Ops.EXP2: "exp2f",
                                Ops.LOG2: "log2f", Ops.SIN: "sinf", Ops.TRUNC: "truncf", Ops.POW: "powf",
                                Ops.MOD: "ember_fmodf"}  # MOD of floats is C fmod (exact at any quotient)
    preamble: str = ""
    #: how a dialect declares work-group local memory and waits for the work-group at a barrier (renderers
    #: with ``has_shared``): ``"__local "`` / ``"barrier(CLK_LOCAL_MEM_FENCE);"`` in OpenCL,
    #: ``"__shared__ "`` / ``"__syncthreads();"`` in CUDA, ``"threadgroup "`` and
    #: ``"threadgroup_barrier(mem_flags::mem_threadgroup);"`` in Metal
    local_prefix: str = ""
    barrier: str = ""
    #: loads and accumulators a dialect writes another way (a CPU vector tile's): named, never declared
    _undeclared: AbstractSet[UOp] = frozenset()

    # --- hooks ---------------------------------------------------------------------------------
    def render_dtype(self, dt: DType) -> str:
        if dt.count != 1:
            return self.render_vector_dtype(dt)
        return self.type_map[dt]

    # --- vectors (dialects that declare ``vector_widths``) ---------------------------------------
    # The defaults are C with the GCC/clang vector extension: a typedef per vector type at the top of the kernel,
    # loads and stores through memcpy (any alignment; the compiler emits one vector move), lanes by subscript.
    def render_vector_dtype(self, dt: DType) -> str:
        """The name of the vector type ``dt`` (C: ``ember_float4``, declared by :meth:`render_vector_typedef`;
        dialects with built-in vector types name them, ``float4``)."""
        return f"ember_{dt.scalar().name}{dt.count}"

    def render_vector_typedef(self, dt: DType) -> str | None:
        """The declaration a kernel using the vector type ``dt`` starts with (None: the dialect has the type)."""
        return f"typedef {self.type_map[dt.scalar()]} {self.render_vector_dtype(dt)} " \
               f"__attribute__((vector_size({dt.itemsize})));"

    def render_vector_max(self, a: str, b: str, dt: DType, b_const: bool = False) -> str:
        """MAX of two float vectors, each lane as the scalar MAX (``(a > b || a != a) ? a : b``: a nan in ``a``
        kept). C has no vector ``?:``: a lane mask from the comparisons selects the bits of ``a`` or ``b``
        (casting between vector types of one size keeps the bits, in gcc and clang alike). Against a constant
        that is no nan (``b_const``: relu's 0) one compare says it all: a nan ``a`` fails ``a <= b`` and is kept."""
        t = self.render_vector_dtype(dt)
        if b_const:
            return (f"({{ {t} a_ = {a}, b_ = {b}; __typeof__(a_ > b_) m_ = a_ <= b_; "
                    f"({t})((~m_ & (__typeof__(m_))a_) | (m_ & (__typeof__(m_))b_)); }})")
        return (f"({{ {t} a_ = {a}, b_ = {b}; __typeof__(a_ > b_) m_ = (a_ > b_) | (a_ != a_); "
                f"({t})((m_ & (__typeof__(m_))a_) | (~m_ & (__typeof__(m_))b_)); }})")

    def render_vector_load(self, buf: str, idx: str, dt: DType) -> str:
        """Reading the ``dt.count`` elements from ``buf[idx]`` on (``idx`` a multiple of the count) as one
        ``dt`` value."""
        t = self.render_vector_dtype(dt)
        return f"({{ {t} v_; __builtin_memcpy(&v_, {buf} + {idx}, sizeof(v_)); v_; }})"

    def render_vector_store(self, buf: str, idx: str, value: str, dt: DType) -> str:
        """The statement writing the ``dt`` vector ``value`` to ``buf[idx]`` on (``idx`` a multiple of its
        lane count)."""
        return f"{{ {self.render_vector_dtype(dt)} v_ = {value}; __builtin_memcpy({buf} + {idx}, &v_, sizeof(v_)); }}"

    def render_vectorize(self, vals: list[str], dt: DType) -> str:
        """A ``dt`` vector of the lanes ``vals`` (default: a C compound literal)."""
        return f"(({self.render_dtype(dt)}){{{', '.join(vals)}}})"

    def render_gep(self, vec: str, lane: int, dt: DType) -> str:
        """Lane ``lane`` of the ``dt`` vector named ``vec`` (default: a subscript)."""
        return f"{vec}[{lane}]"

    def render_kernel(self, name: str, params: list[tuple[str, DType | PtrDType]], body: list[str],
                      uops: list[UOp]) -> str:
        """Wrap the body in a kernel signature; each dialect has its own."""
        args = ", ".join(f"{self.buffer_prefix}{self.storage_type(dt.base)}* {self.restrict} {n}"
                         if isinstance(dt, PtrDType) else f"const {self.render_dtype(dt)} {n}" for n, dt in params)
        return "\n".join([self.preamble, f"{self.kernel_prefix}void {name}({args}) {{", *body, "}", ""])

    def render_range_open(self, u: UOp, var: str, start: str, end: str, parallel: bool) -> list[str]:
        return [f"for ({self.render_dtype(u.value_dtype)} {var} = {start}; {var} < {end}; {var}++) {{"]

    def render_range_close(self, u: UOp) -> list[str]:
        """The lines that end the loop opened for RANGE ``u`` (at its ENDRANGE)."""
        return ["}"]

    def render_loop_results(self, accs: list[str], dts: list[DType]) -> tuple[list[str], list[str]]:
        """Lines after a loop whose accumulators are ``accs``, and the names later code reads their results by
        (default: none, the accumulators themselves)."""
        return [], accs

    def render_reg(self, name: str, dt: DType, size: int, vals: list[tuple[str, DType]]) -> list[str]:
        """The lines declaring the private array ``name`` of ``size`` ``dt`` values and filling it with the lanes of
        ``vals`` (each a named scalar or vector, in order; see ``Ops.DEFINE_REG``)."""
        lines = [f"{self.render_dtype(dt)} {name}[{size}];"]
        at = 0
        for v, vdt in vals:
            lanes = [v] if vdt.count == 1 else [self.render_gep(v, k, vdt) for k in range(vdt.count)]
            lines += [f"{name}[{at + k}] = {lane};" for k, lane in enumerate(lanes)]
            at += vdt.count
        return lines

    def render_load_value(self, buf: str, idx: str, dt: DType) -> str:
        """Reading one element; bfloat16 is stored as 16-bit patterns and widened to float."""
        if dt == dtypes.bfloat16:
            return f"ember_bf16_to_f32({buf}[{idx}])"
        return f"{buf}[{idx}]"

    def render_local(self, name: str, dt: DType, size: int) -> str:
        """The declaration of a work-group's local array (at the top of the kernel body: some dialects allow
        it nowhere else). It holds elements as a buffer does (:meth:`storage_type`), loaded and stored alike."""
        if not self.has_shared or not self.barrier:
            raise NotImplementedError(f"{type(self).__name__} has no work-group local memory")
        return f"{self.local_prefix}{self.storage_type(dt)} {name}[{size}];"

    def render_store_value(self, value: str, dt: DType) -> str:
        if dt == dtypes.bfloat16:
            return f"ember_f32_to_bf16({value})"
        return value

    def storage_type(self, dt: DType) -> str:
        """The C type of a buffer element (bfloat16 lives in 16-bit unsigned storage)."""
        return "unsigned short" if dt == dtypes.bfloat16 else self.render_dtype(dt)

    # --- literals and ops -------------------------------------------------------------------
    def render_const(self, value: object, dt: DType) -> str:
        if dt.count != 1:  # a vector constant (an accumulator vector's start): every lane the scalar's value
            return self.render_vectorize([self.render_const(value, dt.scalar())] * dt.count, dt)
        if dt.kind == "b":
            return "1" if value else "0"
        if dt.kind == "f":
            v = float(value)  # type: ignore[arg-type]
            if math.isnan(v):
                lit = "NAN"
            elif math.isinf(v):
                lit = "INFINITY" if v > 0 else "(-INFINITY)"
            else:
                lit = repr(v) + ("f" if dt != dtypes.float64 else "")
            if dt in (dtypes.float32, dtypes.float64, dtypes.bfloat16):
                return lit
            return f"(({self.render_dtype(dt)}){lit})"
        iv = int(value)  # type: ignore[call-overload]
        if dt.kind == "i" and iv == -(2 ** (dt.bitsize - 1)):
            return f"(({self.render_dtype(dt)})({iv + 1}ll - 1))"
        if dt.itemsize == 8:
            suffix = "ull" if dt.kind == "u" else "ll"
        else:
            suffix = "u" if dt.kind == "u" else ""
        return f"(({self.render_dtype(dt)}){iv}{suffix})" if dt.itemsize < 4 else f"{iv}{suffix}"

    def math_fn(self, op: Ops, dt: DType) -> Callable[..., str]:
        fn = self.math_fns[op]
        if dt == dtypes.float64:
            fn = fn[:-1]
        if dt == dtypes.float16:
            cast = self.render_dtype(dt)
            return lambda *a: f"(({cast}){fn}({', '.join(f'(float){x}' for x in a)}))"
        return lambda *a: f"{fn}({', '.join(a)})"

    def render_alu(self, u: UOp, a: list[str]) -> str:
        op, dt = u.op, u.dtype
        sdt = u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if op in self.math_fns and sdt.kind == "f":
            return self.math_fn(op, dt)(*a)
        if op is Ops.NEG:
            return f"(!{a[0]})" if dt.kind == "b" else f"(-{a[0]})"
        if op is Ops.RECIP:
            return f"(1/{a[0]})"
        if op is Ops.MAX and dt.count != 1:
            return self.render_vector_max(a[0], a[1], dt, _non_nan_const(u.src[1]))
        if op is Ops.MAX:
            if dt.kind == "f":
                # against a constant that is not nan (relu's 0) one compare says it all, and it vectorizes:
                # a nan x fails x <= c, so it is kept; equal values give c, as the general form does
                if u.src[1].op is Ops.CONST and not math.isnan(float(u.src[1].arg)):
                    return f"(!({a[0]} <= {a[1]}) ? {a[0]} : {a[1]})"
                return f"(({a[0]} > {a[1]} || {a[0]} != {a[0]}) ? {a[0]} : {a[1]})"
            return f"(({a[0]} > {a[1]}) ? {a[0]} : {a[1]})"
        if op in (Ops.IDIV, Ops.MOD) or (op is Ops.FDIV and dt.kind in "iub"):
            sym = "%" if op is Ops.MOD else "/"
            if u.src[1].op is Ops.CONST and u.src[1].arg not in (0, -1):
                return f"({a[0]} {sym} {a[1]})"
            if dt.kind != "i":  # unsigned: only x/0 traps (defined as 0)
                return f"(({a[1]} == 0) ? 0 : ({a[0]} {sym} {a[1]}))"
            # no trap on x/0 or INT_MIN/-1: x/0 is 0, x/-1 is -x (wrapping), x%-1 is 0
            return f"(({a[1]} == 0 || {a[1]} == -1) ? ({a[1]} == 0 ? 0 : {'-(' + a[0] + ')' if sym == '/' else '0'}) " \
                   f": ({a[0]} {sym} {a[1]}))"
        if op in (Ops.SHL, Ops.SHR) and not (u.src[1].op is Ops.CONST and 0 <= u.src[1].arg < dt.bitsize):
            # shifting by the bit width or more is undefined in C: 0 (or -1 for a negative value shifted right)
            out = "0" if op is Ops.SHL or dt.kind != "i" else f"({a[0]} < 0 ? -1 : 0)"
            shifted = f"({a[0]} {'<<' if op is Ops.SHL else '>>'} {a[1]})"
            return f"((({a[1]}) >= 0 && ({a[1]}) < {dt.bitsize}) ? {shifted} : {out})"
        if op is Ops.WHERE:
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if op in _BINOPS:
            return f"({a[0]} {_BINOPS[op]} {a[1]})"
        raise NotImplementedError(f"{type(self).__name__} cannot render {op} on {dt}")

    def render_cast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        if dt.kind == "b":
            return f"({x} != 0)"
        if dt == dtypes.bfloat16:
            # float64 and wide integers do not fit float exactly: narrowing through float would round twice
            if sdt == dtypes.float64:
                return f"ember_bf16_from_f64({x})"
            if sdt.kind in "iu" and sdt.itemsize >= 4:
                u64 = self.render_dtype(dtypes.uint64)
                if sdt.kind == "u":
                    return f"ember_bf16_from_u64(({u64}){x}, 0)"
                return f"ember_bf16_from_u64(({x} < 0) ? ({u64})0 - ({u64}){x} : ({u64}){x}, {x} < 0)"
            return f"ember_bf16_round((float){x})"
        if sdt.kind == "f" and dt.kind in "iu":
            # out-of-range and nan conversions are undefined in C: every ember device gives 0
            lo = "0.0" if dt.kind == "u" else f"-{2.0 ** (dt.bitsize - 1)!r}"
            hi = f"{2.0 ** (dt.bitsize if dt.kind == 'u' else dt.bitsize - 1)!r}"
            t = f"((double){x})"
            return f"(({t} > {lo} - 1.0 && {t} < {hi}) ? (({self.render_dtype(dt)}){x}) : 0)"
        if sdt.kind in "iu" and dt in (dtypes.float32, dtypes.float64):
            # gcc under -fno-trapping-math folds (float)(int)x into truncf(x), which keeps the sign of a
            # zero (-0.5 -> -0.0); an integer converts to +0.0, and this select survives that fold
            t = self.render_dtype(dt)
            return f"((({t}){x} == 0) ? ({t})0 : (({t}){x}))"
        return f"(({self.render_dtype(dt)}){x})"

    def render_bitcast(self, u: UOp, x: str) -> str:
        dt, sdt = u.dtype, u.src[0].dtype
        assert isinstance(dt, DType) and isinstance(sdt, DType)
        src_t = self.storage_type(sdt)
        dst_t = self.storage_type(dt)
        val = f"ember_f32_to_bf16({x})" if sdt == dtypes.bfloat16 else x
        out = f"({{ {src_t} s_ = {val}; {dst_t} d_; __builtin_memcpy(&d_, &s_, sizeof(d_)); d_; }})"
        return f"ember_bf16_to_f32({out})" if dt == dtypes.bfloat16 else out

    # --- the driver ----------------------------------------------------------------------
    def render_program(self, name: str, uops: list[UOp]) -> str:
        """The kernel's source. Runs on a per-kernel copy of the renderer (see :meth:`Renderer.render`): the
        attributes set here and by the hooks (``acc_ops``, ``open_accs``, ``loop_accs``, ``live_accs``, a
        dialect's own) describe this kernel only."""
        r: dict[UOp, str] = {}
        params: list[tuple[str, DType | PtrDType]] = []
        body: list[str] = []
        depth = 1
        counts: dict[str, int] = {}
        work = 1
        for u in uops:
            if u.op is Ops.RANGE and u.arg[1] != "loop":  # (an epilogue's loop runs per output, not over outputs)
                # a symbolic bound counts at its maximum (the loop may run that long)
                work *= max(1, (u.src[1].arg if u.src[1].op is Ops.CONST else int(u.src[1].vmax)) - u.src[0].arg)
        first_global = True
        locals_declared = 0
        wmma_results: dict[tuple[UOp, ...], str] = {}
        address_uops = _address_uops(uops)
        # the accumulators declared for each loop, named again when the loop ends (see render_loop_results)
        range_accs: dict[UOp, list[UOp]] = {}
        # which reduction updates each accumulator (a dialect may vectorize sum loops)
        self.acc_ops = {u.src[0]: u.src[1].op for u in uops if u.op is Ops.ASSIGN}
        self.open_accs: list[UOp] = []

        def fresh(prefix: str) -> str:
            counts[prefix] = counts.get(prefix, 0) + 1
            return f"{prefix}{counts[prefix] - 1}"

        def line(s: str) -> None:
            body.append("  " * depth + s)

        def declare_vector(dt: DType) -> None:
            nonlocal locals_declared
            decl = self.render_vector_typedef(dt)
            if decl is not None and "  " + decl not in body[:locals_declared]:
                body.insert(locals_declared, "  " + decl)
                locals_declared += 1

        for u in uops:
            op = u.op
            if op in _VALUE_OPS:  # the most common uops first (the branches are exclusive)
                srcs = [r[s] for s in u.src]
                if u.value_dtype.count != 1:
                    declare_vector(u.value_dtype)
                if op is Ops.CAST:
                    expr = self.render_cast(u, srcs[0])
                elif op is Ops.BITCAST:
                    expr = self.render_bitcast(u, srcs[0])
                elif (op in _WRAPPING_OPS and isinstance(u.dtype, DType) and u.dtype.kind == "i"
                      and u.dtype.itemsize >= 4 and u not in address_uops):
                    expr = self.render_wrapping(u, srcs)
                else:
                    expr = self.render_alu(u, srcs)
                    # (the name first: a plain string compare rules out all but bfloat16 itself)
                    if (getattr(u.dtype, "name", None) == "bfloat16" and u.dtype == dtypes.bfloat16
                            and op not in (Ops.MAX, Ops.WHERE, Ops.NEG, Ops.TRUNC)
                            and not expr.startswith("ember_bf16_round(")):
                        # bfloat16 values live in float registers: round each result, as storing it would, so a
                        # value recomputed in a later kernel equals the stored one (argmax, max's gradient)
                        expr = f"ember_bf16_round({expr})"
                r[u] = fresh("alu")
                line(f"{self.render_dtype(u.value_dtype)} {r[u]} = {expr};")
            elif op is Ops.DEFINE_GLOBAL:
                r[u] = f"data{u.arg[0]}"
                params.append((r[u], u.pointer_dtype))
            elif op is Ops.DEFINE_VAR:
                r[u] = u.arg[0]
                params.append((r[u], u.value_dtype))
            elif op is Ops.CONST:
                r[u] = self.render_const(u.arg, u.value_dtype)
            elif op is Ops.RANGE:
                kind = u.arg[1]
                var = f"{'gidx' if kind == 'global' else 'ridx'}{u.arg[0]}"
                r[u] = var
                parallel = (kind == "global" and first_global and self.parallel_threads > 1
                            and work >= self.parallel_min_work)
                if kind == "global":
                    first_global = False
                self.loop_accs = [(r[a], self.acc_ops.get(a), a.value_dtype) for a in self.open_accs]
                # every accumulator a loop opened here may update: those of the enclosing loops too
                self.live_accs = [(r[a], self.acc_ops.get(a), a.value_dtype) for accs in range_accs.values()
                                  for a in accs] + self.loop_accs
                range_accs[u] = self.open_accs
                self.open_accs = []
                for s in self.render_range_open(u, var, r[u.src[0]], r[u.src[1]], parallel):
                    line(s)
                depth += 1
            elif op is Ops.ENDRANGE:
                depth -= 1
                for s in self.render_range_close(u.src[0]):
                    line(s)
                if accs := range_accs.pop(u.src[0], []):
                    lines, names = self.render_loop_results([r[a] for a in accs], [a.value_dtype for a in accs])
                    for s in lines:
                        line(s)
                    r.update(zip(accs, names))
            elif op is Ops.DEFINE_ACC:
                if u.value_dtype.count != 1:
                    declare_vector(u.value_dtype)
                self.open_accs.append(u)
                r[u] = fresh("acc")
                if u not in self._undeclared:
                    line(f"{self.render_dtype(u.value_dtype)} {r[u]} = {r[u.src[0]]};")
            elif op is Ops.ASSIGN:
                line(f"{r[u.src[0]]} = {r[u.src[1]]};")
                r[u] = r[u.src[0]]
            elif op is Ops.GEP:
                r[u] = self.render_gep(r[u.src[0]], u.arg, u.src[0].value_dtype)
            elif op is Ops.VECTORIZE:
                declare_vector(u.value_dtype)
                r[u] = fresh("vec")
                line(f"{self.render_dtype(u.value_dtype)} {r[u]} = "
                     f"{self.render_vectorize([r[s] for s in u.src], u.value_dtype)};")
            elif op is Ops.LOAD and u.value_dtype.count != 1:
                if len(u.src) != 2:
                    raise NotImplementedError(f"{type(self).__name__}: a gated vector load")
                declare_vector(u.value_dtype)
                r[u] = fresh("val")
                line(f"{self.render_dtype(u.value_dtype)} {r[u]} = "
                     f"{self.render_vector_load(r[u.src[0]], r[u.src[1]], u.value_dtype)};")
            elif op is Ops.LOAD and u.src[0].op is Ops.DEFINE_REG:
                r[u] = fresh("val")
                line(f"{self.render_dtype(u.value_dtype)} {r[u]} = {r[u.src[0]]}[{r[u.src[1]]}];")
            elif op is Ops.DEFINE_REG:
                r[u] = fresh("reg")
                for s in self.render_reg(r[u], u.pointer_dtype.base, u.arg[1],
                                         [(r[s], s.value_dtype) for s in u.src]):
                    line(s)
            elif op is Ops.LOAD:
                # a BARRIER source only orders the load after it
                ins = [s for s in u.src if s.op is not Ops.BARRIER]
                buf, idx = r[ins[0]], r[ins[1]]
                val = self.render_load_value(buf, idx, u.value_dtype)
                if len(ins) > 2:
                    val = f"({r[ins[2]]} ? {val} : {self.render_const(0, u.value_dtype)})"
                if u in self._undeclared:
                    r[u] = val
                    continue
                r[u] = fresh("val")
                line(f"{self.render_dtype(u.value_dtype)} {r[u]} = {val};")
            elif op is Ops.STORE:
                buf, idx, val = r[u.src[0]], r[u.src[1]], r[u.src[2]]
                vdt = u.src[2].dtype
                if isinstance(vdt, DType) and vdt.count != 1:
                    stmt = self.render_vector_store(buf, idx, val, vdt)
                else:
                    stmt = f"{buf}[{idx}] = {self.render_store_value(val, u.src[0].pointer_dtype.base)};"
                line(f"if ({r[u.src[3]]}) {stmt}" if len(u.src) > 3 else stmt)
            elif op is Ops.DEFINE_LOCAL:
                r[u] = f"temp{u.arg[0]}"
                body.insert(locals_declared, "  " + self.render_local(r[u], u.pointer_dtype.base, u.arg[1]))
                locals_declared += 1
            elif op is Ops.BARRIER:
                r[u] = ""
                line(self.barrier)
            elif op is Ops.WMMA:
                # one instruction for every element of D it gives this lane (the elements share their sources)
                if u.src not in wmma_results:
                    result, lines, head = self.render_wmma(u, [r[s] for s in u.src], fresh)
                    for s in lines:
                        line(s)
                    for s in head:
                        if "  " + s not in body[:locals_declared]:
                            body.insert(locals_declared, "  " + s)
                            locals_declared += 1
                    wmma_results[u.src] = result
                r[u] = f"{wmma_results[u.src]}[{u.arg[5]}]"
            elif op is Ops.SINK:
                pass
            else:  # an op only some dialects have (hardware ids, local memory, barriers, matrix instructions)
                r[u], lines = self.render_extra(u, [r[s] for s in u.src], fresh)
                for s in lines:
                    line(s)
        return self.render_kernel(name, params, body, uops)

    def render_wrapping(self, u: UOp, a: list[str]) -> str:
        """Signed 32/64-bit ADD, SUB, MUL, NEG on values, computed in the unsigned type.

        Signed overflow is undefined in C: compilers fold ``x + 7 < x`` to false. ember's integers wrap (as
        torch's and the PYTHON device's do), and unsigned arithmetic converted back keeps the bits.
        Address arithmetic is left signed, so the compiler can still widen and vectorize it.
        """
        assert isinstance(u.dtype, DType)
        t = self.render_dtype(u.dtype)
        ut = self.render_dtype(dtypes.uint32 if u.dtype.itemsize == 4 else dtypes.uint64)
        if u.op is Ops.NEG:
            return f"(({t})(({ut})0 - ({ut}){a[0]}))"
        sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*"}[u.op]
        return f"(({t})(({ut}){a[0]} {sym} ({ut}){a[1]}))"

    def render_wmma(self, u: UOp, srcs: list[str], fresh: Callable[[str], str]) -> tuple[str, list[str], list[str]]:
        """A tensor-core instruction (see :mod:`ember.codegen.tc`): the name of an array holding this lane's
        elements of D (``name[i]`` is element i), the lines computing it, and declarations for the top of the
        kernel. ``srcs`` name the lane's elements of A, then of B, then the lane index."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor-core instructions")

    def render_extra(self, u: UOp, srcs: list[str], fresh: Callable[[str], str]) -> tuple[str, list[str]]:
        """How a dialect renders an op the shared loop does not handle: the name later uops use for ``u``'s
        value ("" if none) and the lines to emit. ``srcs`` name its sources; ``fresh(prefix)`` makes a name."""
        raise NotImplementedError(f"{type(self).__name__} cannot render {u.op}")


def _non_nan_const(u: UOp) -> bool:
    """Whether ``u`` is a constant that is no nan in every lane (a vector CONST, or a VECTORIZE of one CONST)."""
    if u.op is Ops.VECTORIZE and all(s is u.src[0] for s in u.src):
        u = u.src[0]
    return u.op is Ops.CONST and not math.isnan(float(u.arg))


@dataclass(frozen=True)
class VectorSyntax:
    """How a C dialect with built-in vector types spells its vector accesses: format strings over ``{t}`` (the
    vector type, ``float4``), ``{n}`` (its lane count), ``{buf}`` and ``{idx}`` (where a load or store starts),
    ``{value}`` (the vector stored), ``{vals}`` (the lanes, comma-separated), ``{vec}`` and ``{lane}`` (a vector
    and a lane number; ``{xyzw}`` is the lane's letter, for lanes 0 to 3)."""

    load: str
    store: str
    vectorize: str = "(({t})({vals}))"
    gep: str = "{vec}.s{lane:x}"


class BuiltinVectorRenderer(CStyleRenderer):
    """A C dialect whose vector types are built in and named ``<element><lanes>`` (OpenCL C, CUDA, MSL): no
    typedef, and the vector hooks spelled by the table :attr:`vector_syntax`. ``vector_names`` names the element
    part where it differs from :attr:`type_map` (CUDA's ``longlong2``)."""

    vector_syntax: VectorSyntax
    vector_names: dict[DType, str] | None = None

    def render_vector_dtype(self, dt: DType) -> str:
        return f"{(self.vector_names or self.type_map)[dt.scalar()]}{dt.count}"

    def render_vector_typedef(self, dt: DType) -> str | None:
        return None

    def render_vector_load(self, buf: str, idx: str, dt: DType) -> str:
        return self.vector_syntax.load.format(t=self.render_dtype(dt), n=dt.count, buf=buf, idx=idx)

    def render_vector_store(self, buf: str, idx: str, value: str, dt: DType) -> str:
        return self.vector_syntax.store.format(t=self.render_dtype(dt), n=dt.count, buf=buf, idx=idx, value=value)

    def render_vectorize(self, vals: list[str], dt: DType) -> str:
        return self.vector_syntax.vectorize.format(t=self.render_dtype(dt), n=dt.count, vals=", ".join(vals))

    def render_gep(self, vec: str, lane: int, dt: DType) -> str:
        return self.vector_syntax.gep.format(vec=vec, lane=lane, xyzw="xyzw"[lane:lane + 1])


#: the ops C spells as an infix operator
_BINOPS = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "==",
           Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}

#: the uops that compute a value from others (ALU ops and conversions)
_VALUE_OPS = GroupOp.ALU | {Ops.CAST, Ops.BITCAST}

#: integer ops whose signed overflow C leaves undefined (see CStyleRenderer.render_wrapping)
_WRAPPING_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG})


def _address_uops(uops: list[UOp]) -> set[UOp]:
    """The uops that compute buffer indices and loop bounds (they never overflow: lowering indexes with 64-bit
    integers wherever 32 bits could), so they stay plain signed C arithmetic."""
    out: set[UOp] = set()
    stack = [u.src[1] for u in uops if u.op in (Ops.LOAD, Ops.STORE) and len(u.src) > 1]
    stack += [s for u in uops if u.op is Ops.RANGE for s in u.src]
    while stack:
        x = stack.pop()
        if x not in out:
            out.add(x)
            stack.extend(x.src)
    return out


C_PREAMBLE = """#ifndef EMBER_MATH_DECLS
#define EMBER_MATH_DECLS
/* the C library's math functions kernels call, declared here: including math.h costs ~5 ms per compile */
float sqrtf(float); double sqrt(double); float expf(float); double exp(double); float logf(float); double log(double);
float exp2f(float); double exp2(double); float log2f(float); double log2(double); float sinf(float); double sin(double);
float truncf(float); double trunc(double); float powf(float, float); double pow(double, double);
float fmodf(float, float); double fmod(double, double); double fabs(double); float ldexpf(float, int);
float copysignf(float, float);
#ifndef NAN
#define NAN (__builtin_nanf (""))
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff ())
#endif
#endif
#ifndef EMBER_BF16_HELPERS
#define EMBER_BF16_HELPERS
static inline float ember_bf16_to_f32(unsigned short b) { unsigned int u = ((unsigned int)b) << 16; float f;
  __builtin_memcpy(&f, &u, 4); return f; }
static inline unsigned short ember_f32_to_bf16(float f) { unsigned int u; __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (u & 0xffffu) ? (unsigned short)((u >> 16) | 0x40u) : (unsigned short)(u >> 16);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
static inline float ember_bf16_round(float f) { return ember_bf16_to_f32(ember_f32_to_bf16(f)); }
/* float64 and 32/64-bit integers to bfloat16 with one rounding: narrow to float rounding to odd (the last
   kept bit records anything dropped), then round to nearest even once; plain (float) would round twice */
static inline float ember_bf16_from_f64(double d) { float f = (float)d; unsigned int u; __builtin_memcpy(&u, &f, 4);
  if (f == f && (double)f != d) { if (fabs((double)f) > fabs(d)) u -= 1u; u |= 1u; }
  __builtin_memcpy(&f, &u, 4); return ember_bf16_round(f); }
static inline float ember_bf16_from_u64(unsigned long long m, int neg) {
  int s = (m >> 24) ? 40 - __builtin_clzll(m) : 0;
  unsigned long long q = (m >> s) | (unsigned long long)((m & ((1ull << s) - 1ull)) != 0ull);
  float f = ldexpf((float)q, s); return ember_bf16_round(neg ? -f : f); }
#endif
#ifndef EMBER_FMOD
#define EMBER_FMOD
/* C's fmodf, exact, without the C library's bit-by-bit loop when |a / b| < 2**29: trunc(q) * b is then exact
   in double, and a quotient that rounded up to an integer leaves r with the wrong sign (one |b| corrects it) */
static inline float ember_fmodf(float a, float b) {
  double q = (double)a / (double)b;
  if (!(fabs(q) < 536870912.0)) return fmodf(a, b);
  double t = trunc(q);
  if (t == 0.0) return a;  /* |a| < |b|, also for an infinite b (where t * b would be nan) */
  double r = (double)a - t * (double)b;
  if (r != 0.0 && ((r < 0.0) != (a < 0.0))) r += (a < 0.0) ? -fabs((double)b) : fabs((double)b);
  return copysignf((float)r, a); }
static inline double ember_fmod(double a, double b) { return fmod(a, b); }
#endif
"""
