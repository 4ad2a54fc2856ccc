"""GROUP / GROUPTOP: a reduction shared by the work-items of a work-group through local memory and a barrier.

Every grouped lowering, alone and with LOCAL, UPCAST and UNROLL, on reductions along each axis, full reductions,
all matmul layouts and a small convolution, gives the NOOPT result on the PYTHON oracle (which keeps one array
of local memory per work-group) and on CL (``DEV=CL``); the CPU has no local memory and refuses it; invalid
group opts raise naming the opt, the axis and why; the heuristic groups reductions with few outputs.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_opts import cases, last_kernel, randf, run_opts

from ember import Device, Tensor
from ember.builtin_devices.python import PythonCompiler, PythonProgram
from ember.codegen import get_program
from ember.codegen.cachekey import lowering_key
from ember.codegen.heuristic import heuristic_opts
from ember.codegen.opts import Opt, OptError, apply_opts, kernel_shape
from ember.ir.uop import Ops
from ember.renderer import Renderer

#: the kernels with a reduction (the elementwise case has nothing to group)
REDUCE_CASES = ["sum axis 0", "sum axis 1", "max axis 0", "max axis 1", "full sum", "full max", "a@b", "a@b.T",
                "a.T@b", "a.T@b.T", "conv2d"]
#: what a slow-building device (CL) checks
CL_SET = ("sum axis 0", "max axis 1", "full sum", "a@b.T")


class WorkGroupPython(Renderer):
    """The PYTHON device's renderer claiming a GPU's work-groups (a 3-dimensional grid, LOCAL sizes, local
    memory): LOCAL with GROUP, and output axes merged into fewer launch dimensions, run on the oracle."""

    def __init__(self, base: Renderer, local_max: tuple[int, int, int] = (64, 64, 64), shared_max: int = 1 << 16):
        self.base = base
        self.has_local, self.has_shared = True, True
        self.local_max, self.shared_max = local_max, shared_max
        self.global_max = (1 << 20,) * 3

    def render(self, name, uops):  # noqa: ANN001, ANN201
        return self.base.render(name, uops)


def _small(size: int) -> int | None:
    return next((f for f in (4, 3, 2) if size % f == 0), None)


def group_candidates(si, renderer: Renderer) -> list[list[Opt]]:
    """GROUP and GROUPTOP on each reduce axis, alone and combined with UNROLL of the same axis, UPCAST and (on
    work-group renderers) LOCAL of an output axis; the combinations the renderer refuses are left out."""
    ks = kernel_shape(si.ast)
    outs = [a for a, d in enumerate(ks.full_shape) if a not in ks.reduce_axes and d > 1 and _small(d)]
    found: list[list[Opt]] = []
    for axis in ks.reduce_axes:
        size = ks.full_shape[axis]
        n = _small(size)
        if n is None:
            continue
        for op in ("GROUP", "GROUPTOP"):
            g = Opt(op, axis, n)
            extra: list[list[Opt]] = [[]]
            if size // n % 2 == 0:
                extra.append([Opt("UNROLL", axis, 2)])
            for o in outs[-1:]:
                if renderer.has_local:
                    extra.append([Opt("LOCAL", o, _small(ks.full_shape[o]) or 2)])
                extra.append([Opt("UPCAST", o, _small(ks.full_shape[o]) or 2)])
            together = [o for e in extra[1:] for o in e]
            for e in extra + ([together] if len(extra) > 2 else []):
                # LOCAL before the group, the tile after it: both orders are valid
                candidate = [o for o in e if o.op == "LOCAL"] + [g] + [o for o in e if o.op != "LOCAL"]
                try:
                    apply_opts(si.ast, renderer, candidate)
                except OptError:
                    # each opt fits alone; all together may split one output axis too finely
                    assert e is together, candidate
                    continue
                found.append(candidate)
    return found


@pytest.mark.parametrize("name", REDUCE_CASES)
def test_grouped_reductions_match_noopt(device: str, name: str):
    if device == "CL" and name not in CL_SET:
        pytest.skip("CL builds are slow: a small set of kernels runs there")
    found = [c for c in cases(device) if c[0] == name]
    if not found:
        pytest.skip(f"{name}: its reference needs torch")
    _, out, ref = found[0]
    si = last_kernel(out)
    plain = run_opts(si, device, [])
    np.testing.assert_allclose(plain.reshape(np.shape(ref)), ref, rtol=1e-4, atol=1e-4)
    if device == "CPU":
        ks = kernel_shape(si.ast)
        axis = ks.reduce_axes[0]
        with pytest.raises(OptError, match=f"GROUP on axis {axis} .*has no local memory"):
            get_program(si.ast, Device["CPU"].renderer, opts=[Opt("GROUP", axis, _small(ks.full_shape[axis]) or 2)])
        return
    renderers = [Device[device].renderer]
    if device == "PYTHON":
        renderers.append(WorkGroupPython(Device[device].renderer))
    tried = 0
    for renderer in renderers:
        for opts in group_candidates(si, renderer):
            got = run_opts(si, device, opts, renderer)
            np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5, err_msg=f"{name} with {opts}")
            tried += 1
    assert tried >= 2


def test_group_launch_and_local_memory():
    """The group's work-items run along launch dimension 0, the output axes above it; the kernel declares one
    local array per reduction copy and waits at a barrier before combining."""
    a = Tensor(randf(24, 20), device="PYTHON").realize()
    si = last_kernel(a.sum(1))
    grid = WorkGroupPython(Device["PYTHON"].renderer)
    spec = get_program(si.ast, grid, opts=[Opt("LOCAL", 0, 4), Opt("GROUP", 1, 5), Opt("UPCAST", 0, 2)])
    assert spec.local_size == (5, 4, 1)
    assert spec.global_size == (5, 12, 1)
    ops = [u.op for u in spec.uops]
    assert ops.count(Ops.DEFINE_LOCAL) == 2 and Ops.BARRIER in ops
    assert all(u.arg[1] == 4 * 5 for u in spec.uops if u.op is Ops.DEFINE_LOCAL)  # LOCAL x GROUP work-items
    # a full reduction: the group is the only launch dimension
    spec = get_program(last_kernel(a.max()).ast, grid, opts=[Opt("GROUPTOP", 1, 4)])
    assert spec.global_size == (4, 1, 1) and spec.local_size == (4, 1, 1)


def test_group_on_a_grid_of_three_output_axes():
    """Three output axes and a group: the two outer output axes share a launch dimension (the oracle runs it)."""
    x = randf(3, 4, 5, 8)
    t = Tensor(x, device="PYTHON").realize()
    si = last_kernel(t.sum(3))
    grid = WorkGroupPython(Device["PYTHON"].renderer)
    spec = get_program(si.ast, grid, opts=[Opt("GROUP", 3, 4)])
    assert spec.global_size == (4, 5, 12)
    got = run_opts(si, "PYTHON", [Opt("LOCAL", 2, 5), Opt("GROUP", 3, 4)], grid)
    np.testing.assert_allclose(got.reshape(3, 4, 5), x.sum(3), rtol=1e-5, atol=1e-5)


def test_oracle_needs_the_local_size():
    a = Tensor(randf(8, 8), device="PYTHON").realize()
    si = last_kernel(a.sum(1))
    spec = get_program(si.ast, Device["PYTHON"].renderer, opts=[Opt("GROUP", 1, 4)])
    prg = PythonProgram(spec.name, PythonCompiler().compile(spec.src))
    out, inp = np.zeros(8, np.float32), a.numpy()
    with pytest.raises(ValueError, match="uses local memory"):
        prg(out, inp)
    with pytest.raises(ValueError, match="work-group size 3 does not divide"):
        prg(out, inp, local_size=(3, 1, 1))
    prg(out, inp, local_size=spec.local_size)
    np.testing.assert_allclose(out, inp.sum(1), rtol=1e-5)


@pytest.mark.parametrize("opts,why,local_max", [
    ([Opt("GROUP", 0, 4)], "applies to reduce axes", (16, 16, 4)),
    ([Opt("GROUPTOP", 1, 3)], "3 does not divide what is left of the axis", (16, 16, 4)),
    ([Opt("GROUP", 1, 2), Opt("GROUPTOP", 1, 2)], "only one GROUP or GROUPTOP per kernel", (16, 16, 4)),
    ([Opt("GROUP", 1, 1)], "at least 2", (16, 16, 4)),
    ([Opt("GROUP", 1, 10), Opt("UNROLL", 1, 4)], "4 does not divide what is left", (16, 16, 4)),  # 20 / 10 = 2
    ([Opt("GROUP", 1, 20)], "work-group size 20 exceeds the device's 16 in dimension 0", (16, 16, 4)),
    # the output axis moves up to launch dimension 1 when the group takes dimension 0
    ([Opt("LOCAL", 0, 8), Opt("GROUP", 1, 10)], "LOCAL axis 0 moves to launch dimension 1", (16, 4, 4)),
    ([Opt("LOCAL", 0, 8), Opt("GROUP", 1, 10)], "work-group would have 80 work-items", (16, 16, 4)),
    ([Opt("UPCAST", 0, 8), Opt("GROUP", 1, 10)], "need 320 bytes of local memory, more than the device's 256",
     (16, 16, 4)),
])
def test_invalid_group_opts_raise(opts: list[Opt], why: str, local_max: tuple[int, int, int]):
    a = Tensor(randf(24, 20), device="PYTHON").realize()
    si = last_kernel(a.sum(1))
    small = WorkGroupPython(Device["PYTHON"].renderer, local_max=local_max, shared_max=256)
    small.max_threads_per_block = 64  # type: ignore[attr-defined]  # a device's work-group limit (CUDA's name)
    with pytest.raises(OptError, match=why) as e:
        apply_opts(si.ast, small, opts)
    bad = next(o for o in reversed(opts) if str(e.value).startswith(f"{o.op} on axis {o.axis}"))
    assert bad.op in ("GROUP", "GROUPTOP", "UNROLL")


def test_no_local_memory_no_group():
    """The CPU renderer has no local memory; a renderer without ``has_shared`` refuses too."""
    a = Tensor(randf(24, 20), device="CPU").realize()
    si = last_kernel(a.sum(0))
    with pytest.raises(OptError, match="GROUPTOP on axis 0 .*has no local memory"):
        get_program(si.ast, Device["CPU"].renderer, opts=[Opt("GROUPTOP", 0, 4)])
    r = WorkGroupPython(Device["PYTHON"].renderer)
    r.has_shared = False
    with pytest.raises(OptError, match="has no local memory"):
        apply_opts(si.ast, r, [Opt("GROUP", 0, 4)])


def test_the_cache_key_sees_local_memory():
    """Whether a renderer has local memory, how much, and how it spells it and its barrier all change what
    codegen produces: each is part of the lowering key."""
    a = Tensor(randf(8, 8), device="PYTHON").realize()
    ast = last_kernel(a.sum(1)).ast
    base = WorkGroupPython(Device["PYTHON"].renderer)
    keys = {lowering_key(base, ast)}
    for name, value in (("has_shared", False), ("shared_max", 1024), ("local_prefix", "__shared__ "),
                        ("barrier", "__syncthreads();")):
        r = WorkGroupPython(Device["PYTHON"].renderer)
        setattr(r, name, value)
        keys.add(lowering_key(r, ast))
    assert len(keys) == 5


@pytest.mark.parametrize("shape,axis,grouped", [
    ((1 << 14,), None, True),         # a full sum: one output
    ((4096, 16), 0, True),            # a column sum of a tall matrix: 16 outputs
    ((256, 1024), 0, True),           # a column sum with more outputs: a small GROUPTOP
    ((1024, 64), 1, False),           # many outputs, each a short row: no group
])
def test_heuristic_groups_reductions_with_few_outputs(shape: tuple[int, ...], axis: int | None, grouped: bool):
    x = randf(*shape)
    t = Tensor(x, device="PYTHON").realize()
    out, ref = (t.sum(), x.sum()) if axis is None else (t.sum(axis), x.sum(axis))
    si = last_kernel(out)
    target = WorkGroupPython(Device["PYTHON"].renderer, local_max=(256, 256, 64), shared_max=32768)
    opts = heuristic_opts(si.ast, target)
    assert any(o.op in ("GROUP", "GROUPTOP") for o in opts) == grouped, opts
    got = run_opts(si, "PYTHON", opts, target)
    np.testing.assert_allclose(got.reshape(np.shape(ref)), ref, rtol=1e-4, atol=1e-3)
    # a target without local memory never gets a group
    target.has_shared = False
    assert not any(o.op in ("GROUP", "GROUPTOP") for o in heuristic_opts(si.ast, target))


def test_beam_tries_groups_on_work_group_targets():
    from ember.codegen.search import actions

    a = Tensor(randf(64, 64), device="PYTHON").realize()
    ast = last_kernel(a.sum()).ast
    grid = WorkGroupPython(Device["PYTHON"].renderer, local_max=(32, 32, 32))
    found = {(o.op, o.arg) for o in actions(ast, grid) if o.op in ("GROUP", "GROUPTOP")}
    assert found == {(op, n) for op in ("GROUP", "GROUPTOP") for n in (4, 8, 16, 32)}  # up to local_max[0]
    assert not any(o.op in ("GROUP", "GROUPTOP") for o in actions(ast, Device["CPU"].renderer))


def test_beam_on_cl_keeps_a_correct_kernel():
    """A tiny BEAM search on CL (where grouped candidates are timed) returns opts whose kernel matches numpy."""
    from ember.codegen import search

    if "CL" not in Device.available():
        pytest.skip(f"no CL device: {Device.probe('CL')}")
    x = randf(4096)
    si = last_kernel(Tensor(x, device="CL").realize().sum())
    renderer = Device["CL"].renderer
    opts = search._search(si.ast, renderer, 2, budget_s=2.0)  # the search itself, not its disk cache
    got = run_opts(si, "CL", opts)
    np.testing.assert_allclose(got[0], x.sum(), rtol=1e-4)
