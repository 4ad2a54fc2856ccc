"""Bad input gets a clear error: the right exception type, naming the shapes, devices or source involved."""
from __future__ import annotations

import importlib.metadata
import re

import numpy as np
import pytest

from ember import Device, Tensor
from ember.device.compiler import CompileError
from ember.device.registry import ENTRY_POINT_GROUP, KNOWN_PLUGINS, _DeviceRegistry

try:
    import torch
    F = torch.nn.functional
except ImportError:  # the tests that compare with torch skip themselves
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def mentions_shape(message: str, shape: tuple[int, ...]) -> bool:
    """True when ``message`` names ``shape`` as (2, 3), [2, 3] or 2x3."""
    forms = (str(tuple(shape)), str(list(shape)), "x".join(map(str, shape)))
    return any(f in message for f in forms)


# --------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "mul", "lt", "where", "maximum"])
def test_elementwise_shape_mismatch_names_both_shapes(device, op):
    x, y = Tensor.zeros(2, 3, device=device), Tensor.ones(4, 3, device=device)
    fns = {"add": lambda: x + y, "mul": lambda: x * y, "lt": lambda: x < y, "maximum": lambda: x.maximum(y),
           "where": lambda: (x > 0).where(x, y)}
    with pytest.raises(RuntimeError) as info:
        fns[op]()
    msg = str(info.value)
    assert mentions_shape(msg, (2, 3)) and mentions_shape(msg, (4, 3)), msg


def test_broadcast_mismatch_in_trailing_dim(device):
    with pytest.raises(RuntimeError) as info:
        Tensor.zeros(5, 1, 3, device=device) - Tensor.zeros(4, 2, device=device)
    assert mentions_shape(str(info.value), (5, 1, 3)) and mentions_shape(str(info.value), (4, 2))


@pytest.mark.parametrize("a, b", [((2, 3), (4, 5)), ((3,), (2, 4)), ((2, 3), (2,)), ((2, 2, 3), (2, 4, 5))], ids=str)
def test_matmul_mismatch_names_both_shapes(device, a, b):
    with pytest.raises(RuntimeError) as info:
        Tensor.zeros(*a, device=device) @ Tensor.zeros(*b, device=device)
    msg = str(info.value)
    assert mentions_shape(msg, a[-2:] if len(a) > 1 else a) or mentions_shape(msg, a), msg
    assert mentions_shape(msg, b[-2:] if len(b) > 1 else b) or mentions_shape(msg, b), msg


def test_matmul_of_0d_is_an_error(device):
    with pytest.raises(RuntimeError, match="1D"):
        Tensor(2.0, device=device) @ Tensor.ones(2, device=device)


@pytest.mark.parametrize("shape", [(4, 2), (7,), (-1, 4), (2, -1, -1), (0, 6), (-2, -3)], ids=str)
def test_bad_reshape(device, shape):
    with pytest.raises(RuntimeError):
        Tensor.zeros(2, 3, device=device).reshape(shape)


def test_bad_reshape_message_names_size(device):
    with pytest.raises(RuntimeError, match="6"):
        Tensor.zeros(2, 3, device=device).reshape(4, 2)


def test_bad_movement_args(device):
    t = Tensor.zeros(2, 3, device=device)
    with pytest.raises(RuntimeError):
        t.permute(0, 0)
    with pytest.raises((RuntimeError, IndexError)):
        t.permute(0, 1, 2)
    with pytest.raises(RuntimeError):
        t.expand(4, 3)  # 2 is not 1, so it cannot be expanded
    with pytest.raises(RuntimeError):
        t.expand(3)
    with pytest.raises(RuntimeError):
        t.shrink(((0, 3), (0, 3)))
    with pytest.raises(RuntimeError):
        t.shrink(((1, 0), (0, 3)))
    with pytest.raises(RuntimeError):
        t.pad(((1, 1),))
    with pytest.raises(IndexError):
        t.flip(2)
    with pytest.raises(IndexError):
        t.transpose(0, 2)
    with pytest.raises(IndexError):
        t.unsqueeze(4)


@pytest.mark.parametrize("index", [5, -4, (0, 3), (1, -4), (0, 0, 0), (slice(None), 3)], ids=str)
def test_index_out_of_bounds(device, index):
    t = Tensor(np.zeros((3, 3), np.float32), device=device)
    with pytest.raises(IndexError):
        t[index]


def test_index_message_names_the_index(device):
    with pytest.raises(IndexError, match="5"):
        Tensor([1, 2, 3], device=device)[5]


def test_reduce_axis_out_of_range(device):
    t = Tensor.zeros(2, 3, device=device)
    with pytest.raises(IndexError):
        t.sum(2)
    with pytest.raises(IndexError):
        t.max((0, -3))


# --------------------------------------------------------------------------------------------
# values and types
# --------------------------------------------------------------------------------------------

def test_item_and_bool_need_one_element(device):
    t = Tensor([1.0, 2.0], device=device)
    with pytest.raises(RuntimeError):
        t.item()
    with pytest.raises(RuntimeError):
        bool(t)
    assert Tensor([[3.5]], device=device).item() == 3.5


def test_unsupported_construction(device):
    with pytest.raises(TypeError):
        Tensor({"a": 1}, device=device)
    with pytest.raises(TypeError):
        Tensor([1.0], device=device) + "2"
    with pytest.raises(ValueError):
        Tensor([[1, 2], [3]], device=device)


def test_negative_sizes_and_bad_arange(device):
    with pytest.raises(RuntimeError):
        Tensor.zeros(2, -1, device=device)
    with pytest.raises(RuntimeError):
        Tensor.arange(0, 5, 0, device=device)


def test_len_of_0d(device):
    with pytest.raises(TypeError):
        len(Tensor(1.0, device=device))
    assert len(Tensor.zeros(4, 2, device=device)) == 4


# --------------------------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------------------------

def test_unknown_device_names_it_and_the_installed_ones():
    with pytest.raises(RuntimeError) as info:
        Tensor([1], device="FOO")
    msg = str(info.value)
    assert "FOO" in msg
    for name in Device.specs():
        assert name in msg, f"installed device {name} is not listed in: {msg}"


def test_unknown_device_in_to():
    t = Tensor([1.0])
    with pytest.raises(RuntimeError, match="BAR"):
        t.to("BAR")


def test_unknown_device_in_creation_helpers():
    with pytest.raises(RuntimeError, match="FOO"):
        Tensor.rand(2, device="foo:1")
    with pytest.raises(RuntimeError, match="FOO"):
        Tensor.arange(3, device="FOO")


@pytest.mark.parametrize("make_tensor", [
    lambda: Tensor.zeros(2, device="FOO"), lambda: Tensor.ones(2, 3, device="foo"),
    lambda: Tensor.full((2,), 1.5, device="FOO:1"), lambda: Tensor.empty(4, device="FOO"),
], ids=["zeros", "ones", "full", "empty"])
def test_unknown_device_in_lazy_creation_fails_at_once(make_tensor):
    with pytest.raises(RuntimeError, match="FOO"):
        make_tensor()


def test_unknown_device_in_constant_creation_fails_by_realize():
    with pytest.raises(RuntimeError, match="FOO"):
        Tensor.ones(2, device="FOO").numpy()


def test_opencl_not_installed_names_the_pip_extra():
    # a registry of what is installed, minus the OpenCL plugin: as if `ember[opencl]` had not been installed
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
           if not (ep.dist is not None and ep.dist.name == "ember-opencl") and ep.name != "opencl"]
    registry = _DeviceRegistry(entry_points=eps)
    with pytest.raises(RuntimeError) as info:
        registry["CL"]
    msg = str(info.value)
    assert "ember[opencl]" in msg, msg
    assert "CL" in msg
    assert registry.probe("CL") is not None


@pytest.mark.parametrize("name", sorted(KNOWN_PLUGINS))
def test_missing_first_party_device_names_the_pip_extra(name):
    if name in Device.specs():
        pytest.skip(f"{name} is installed here")
    extra = KNOWN_PLUGINS[name][0]
    with pytest.raises(RuntimeError) as info:
        Tensor([1], device=name)
    assert f"ember[{extra}]" in str(info.value)
    assert name in str(info.value)


# --------------------------------------------------------------------------------------------
# compilation
# --------------------------------------------------------------------------------------------

def cpu_device():
    if "CPU" not in Device.available():
        pytest.skip(f"CPU is not usable here: {Device.probe('CPU')}")
    return Device["CPU"]


def test_compile_error_shows_source_and_compiler_output():
    broken = "void f( {"
    with pytest.raises(CompileError) as info:
        cpu_device().compiler.compile(broken)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.src == broken
    assert err.output.strip(), "the compiler's output is missing"
    msg = str(err)
    assert broken in msg
    assert err.output.strip().splitlines()[0] in msg
    assert re.search(r"error", msg, re.IGNORECASE)


def test_compile_error_through_the_cache_is_not_cached():
    compiler = cpu_device().compiler
    broken = "int g(void) { return undefined_name_xyz; }"
    for _ in range(2):
        with pytest.raises(CompileError, match="undefined_name_xyz"):
            compiler.compile_cached(broken)
    assert broken not in compiler.memory_cache


# --------------------------------------------------------------------------------------------
# argument errors: torch's exception type for the same call, and tinygrad's
# --------------------------------------------------------------------------------------------
# name: (ember call, torch call, a value the message must name). torch raises RuntimeError for these and
# tinygrad ValueError: ember raises ArgumentError, which is both.
BAD_ARGUMENTS = {
    "zeros_negative": (lambda d: Tensor.zeros(2, -1, device=d), lambda: torch.zeros(2, -1), "-1"),
    "full_negative": (lambda d: Tensor.full((-2,), 1.0, device=d), lambda: torch.full((-2,), 1.0), "-2"),
    "empty_negative": (lambda d: Tensor.empty(3, -4, device=d), lambda: torch.empty(3, -4), "-4"),
    "rand_negative": (lambda d: Tensor.rand(-2, device=d), lambda: torch.rand(-2), "-2"),
    "randn_negative": (lambda d: Tensor.randn(3, -5, device=d), lambda: torch.randn(3, -5), "-5"),
    "randint_negative": (lambda d: Tensor.randint(-3, high=5, device=d), lambda: torch.randint(0, 5, (-3,)), "-3"),
    "eye_negative": (lambda d: Tensor.eye(-2, device=d), lambda: torch.eye(-2), "-2"),
    "reshape_size": (lambda d: Tensor.zeros(2, 3, device=d).reshape(4, 2), lambda: torch.zeros(2, 3).reshape(4, 2),
                     "6"),
    "reshape_two_inferred": (lambda d: Tensor.zeros(2, 3, device=d).reshape(-1, -1),
                             lambda: torch.zeros(2, 3).reshape(-1, -1), "(-1, -1)"),
    "reshape_negative": (lambda d: Tensor.zeros(2, 3, device=d).reshape(-2, -3),
                         lambda: torch.zeros(2, 3).reshape(-2, -3), "-2"),
    "repeat_fewer_dims": (lambda d: Tensor.zeros(2, 3, device=d).repeat(2), lambda: torch.zeros(2, 3).repeat(2),
                          "(2,)"),
    "repeat_negative": (lambda d: Tensor.zeros(2, 3, device=d).repeat(2, -1), lambda: torch.zeros(2, 3).repeat(2, -1),
                        "-3"),
    "pad_odd": (lambda d: Tensor.zeros(2, 3, device=d).pad((1,)), lambda: F.pad(torch.zeros(2, 3), (1,)), "(1,)"),
    "pad_too_long": (lambda d: Tensor.zeros(2, 3, device=d).pad((1,) * 6), lambda: F.pad(torch.zeros(2, 3), (1,) * 6),
                     "2 dims"),
    "pad_crops_too_much": (lambda d: Tensor.zeros(2, 3, device=d).pad((-2, -2)),
                           lambda: F.pad(torch.zeros(2, 3), (-2, -2)), "(2, 3)"),
    "pad_reflect_too_big": (lambda d: Tensor.zeros(1, 2, 3, device=d).pad((3, 3), mode="reflect"),
                            lambda: F.pad(torch.zeros(1, 2, 3), (3, 3), mode="reflect"), "(3, 3)"),
    "pad_circular_wraps": (lambda d: Tensor.zeros(1, 2, 3, device=d).pad((4, 0), mode="circular"),
                           lambda: F.pad(torch.zeros(1, 2, 3), (4, 0), mode="circular"), "(4, 0)"),
    "expand_negative": (lambda d: Tensor.zeros(1, 3, device=d).expand(-2, 3),
                        lambda: torch.zeros(1, 3).expand(-2, 3), "(-2, 3)"),
    "expand_mismatch": (lambda d: Tensor.zeros(2, 3, device=d).expand(4, 3), lambda: torch.zeros(2, 3).expand(4, 3),
                        "4"),
    "flip_repeated_dim": (lambda d: Tensor.zeros(2, 3, device=d).flip((0, 0)), lambda: torch.zeros(2, 3).flip((0, 0)),
                          "dim 0"),
    "flip_same_dim_twice": (lambda d: Tensor.zeros(2, 3, device=d).flip((1, -1)),
                            lambda: torch.zeros(2, 3).flip((1, -1)), "dim 1"),
    "permute_repeated_dim": (lambda d: Tensor.zeros(2, 3, device=d).permute(0, 0),
                             lambda: torch.zeros(2, 3).permute(0, 0), "(0, 0)"),
    "stack_nothing": (lambda d: Tensor.stack([]), lambda: torch.stack([]), "non-empty"),
    "interpolate_negative": (lambda d: Tensor.zeros(1, 1, 4, device=d).interpolate((-1,)),
                             lambda: F.interpolate(torch.zeros(1, 1, 4), size=(-1,)), "-1"),
}


@needs_torch
@pytest.mark.parametrize("name", BAD_ARGUMENTS)
def test_bad_arguments_raise_torch_and_tinygrad_types(device, name):
    ours, theirs, named = BAD_ARGUMENTS[name]
    with pytest.raises(Exception) as want:
        theirs()
    with pytest.raises(ValueError) as got:  # tinygrad's type
        ours(device).numpy() if name == "stack_nothing" else ours(device)
    assert isinstance(got.value, type(want.value)), f"torch raises {type(want.value).__name__}: {want.value}"
    assert named in str(got.value), str(got.value)


@needs_torch
def test_cat_of_nothing_is_a_value_error_like_torch():
    with pytest.raises(ValueError):
        torch.cat([])
    with pytest.raises(ValueError, match="non-empty"):
        Tensor.cat([])


@needs_torch
@pytest.mark.parametrize("call", [
    lambda m: m.zeros(2.5), lambda m: m.zeros(2, 3).reshape(2.0, 3), lambda m: m.ones((2, 1.5)),
], ids=["zeros", "reshape", "ones"])
def test_float_sizes_are_type_errors(device, call):
    with pytest.raises(TypeError):
        call(torch)
    ember = type("EmberCalls", (), {"zeros": staticmethod(lambda *s: Tensor.zeros(*s, device=device)),
                                    "ones": staticmethod(lambda *s: Tensor.ones(*s, device=device))})
    with pytest.raises(TypeError, match="int"):
        call(ember)


# axis out of range raises IndexError, also on a 0-d tensor (where -1 and 0 are the valid axes)
AXIS_CALLS = {
    "sum": (lambda t: t.sum(1), lambda t: t.sum(1)),
    "max": (lambda t: t.max(-2), lambda t: t.amax(-2)),
    "mean": (lambda t: t.mean(2), lambda t: t.mean(2)),
    "argmax": (lambda t: t.argmax(2), lambda t: t.argmax(2)),
    "softmax": (lambda t: t.softmax(1), lambda t: t.softmax(1)),
    "cumsum": (lambda t: t.cumsum(1), lambda t: t.cumsum(1)),
    "cumprod": (lambda t: t.cumprod(-2), lambda t: t.cumprod(-2)),
    "cummax": (lambda t: t.cummax(3), lambda t: t.cummax(3)),
    "logcumsumexp": (lambda t: t.logcumsumexp(1), lambda t: t.logcumsumexp(1)),
    "flip": (lambda t: t.flip(1), lambda t: t.flip(1)),
    "transpose": (lambda t: t.transpose(0, 1), lambda t: t.transpose(0, 1)),
    "unsqueeze": (lambda t: t.unsqueeze(2), lambda t: t.unsqueeze(2)),
    "squeeze": (lambda t: t.squeeze(1), lambda t: t.squeeze(1)),
    "sort": (lambda t: t.sort(1), lambda t: t.sort(1)),
}


@needs_torch
@pytest.mark.parametrize("name", AXIS_CALLS)
@pytest.mark.parametrize("shape", [(), (3,)], ids=["0d", "1d"])
def test_axis_out_of_range_is_an_index_error(device, name, shape):
    ours, theirs = AXIS_CALLS[name]
    with pytest.raises(IndexError):
        theirs(torch.zeros(shape))
    with pytest.raises(IndexError, match="range"):
        ours(Tensor.zeros(*shape, device=device))


@needs_torch
def test_float_indices_are_index_errors(device):
    # torch rejects a float index tensor; ember (like tinygrad and numpy) also rejects a list of floats
    with pytest.raises(IndexError):
        torch.arange(5.0)[torch.tensor([0.5, 1.0])]
    t = Tensor(np.arange(5, dtype=np.float32), device=device)
    for idx in ([0.5, 1.0], [1.0], [[0.0, 2.0]], np.array([1.5])):
        with pytest.raises(IndexError, match="float"):
            t[idx]
    with pytest.raises(IndexError):
        t[1.0]
    np.testing.assert_array_equal(t[[1, 3]].numpy(), [1.0, 3.0])  # integer lists still work


# --------------------------------------------------------------------------------------------
# arguments torch refuses: the same builtin exception type, and a message naming the argument
# --------------------------------------------------------------------------------------------
_X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _conv(d, **kw):
    return Tensor.ones(1, 1, 5, 5, device=d).conv2d(Tensor.ones(1, 1, 3, 3, device=d), **kw)


def _tconv(**kw):
    return F.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3), **kw)


# name: (ember call given the device, the same call in torch, text the message must contain)
NAMED_ARGUMENTS = {
    # a float, bool or string where a dimension goes: int() would quietly pick dimension 0
    "sum float axis": (lambda d: Tensor(_X, device=d).sum(0.5), lambda: torch.tensor(_X).sum(0.5), "axis"),
    "sum bool axis": (lambda d: Tensor(_X, device=d).sum(True), lambda: torch.tensor(_X).sum(True), "axis"),
    "sum str axis": (lambda d: Tensor(_X, device=d).sum("a"), lambda: torch.tensor(_X).sum("a"), "axis"),
    "mean float in tuple": (lambda d: Tensor(_X, device=d).mean((0.0,)), lambda: torch.tensor(_X).mean((0.0,)),
                            "axis"),
    "max float axis": (lambda d: Tensor(_X, device=d).max(0.5), lambda: torch.tensor(_X).max(0.5), "axis"),
    "std float axis": (lambda d: Tensor(_X, device=d).std(0.5), lambda: torch.tensor(_X).std(0.5), "axis"),
    "logsumexp float axis": (lambda d: Tensor(_X, device=d).logsumexp(0.5),
                             lambda: torch.tensor(_X).logsumexp(0.5), "axis"),
    "softmax float axis": (lambda d: Tensor(_X, device=d).softmax(0.5), lambda: torch.tensor(_X).softmax(0.5),
                           "axis"),
    "argmax float dim": (lambda d: Tensor(_X, device=d).argmax(0.5), lambda: torch.tensor(_X).argmax(0.5), "dim"),
    "cumsum float dim": (lambda d: Tensor(_X, device=d).cumsum(0.5), lambda: torch.tensor(_X).cumsum(0.5), "dim"),
    "transpose float dim": (lambda d: Tensor(_X, device=d).transpose(0.0, 1),
                            lambda: torch.tensor(_X).transpose(0.0, 1), "dim"),
    "unsqueeze bool dim": (lambda d: Tensor(_X, device=d).unsqueeze(True),
                           lambda: torch.tensor(_X).unsqueeze(True), "dim"),
    "squeeze float dim": (lambda d: Tensor(_X, device=d).squeeze(0.5), lambda: torch.tensor(_X).squeeze(0.5), "dim"),
    "flatten float dim": (lambda d: Tensor(_X, device=d).flatten(0.5), lambda: torch.tensor(_X).flatten(0.5), "dim"),
    "flip float dim": (lambda d: Tensor(_X, device=d).flip(0.5), lambda: torch.tensor(_X).flip(0.5), "dim"),
    "roll float dim": (lambda d: Tensor(_X, device=d).roll(1, 0.5), lambda: torch.tensor(_X).roll(1, 0.5), "dim"),
    "cat float dim": (lambda d: Tensor(_X, device=d).cat(Tensor(_X, device=d), dim=0.5),
                      lambda: torch.cat([torch.tensor(_X)] * 2, 0.5), "dim"),
    "gather float dim": (lambda d: Tensor(_X, device=d).gather(1.0, Tensor([[0], [1]], device=d)),
                         lambda: torch.tensor(_X).gather(1.0, torch.tensor([[0], [1]])), "dim"),
    "sort float dim": (lambda d: Tensor(_X, device=d).sort(0.5), lambda: torch.tensor(_X).sort(0.5), "dim"),
    # sizes that are not ints
    "reshape None": (lambda d: Tensor(_X, device=d).reshape(None), lambda: torch.tensor(_X).reshape(None), "None"),
    "view None": (lambda d: Tensor(_X, device=d).view(None), lambda: torch.tensor(_X).view(None), "None"),
    "reshape bool": (lambda d: Tensor(_X, device=d).reshape((True, 6)),
                     lambda: torch.tensor(_X).reshape((True, 6)), "reshape size"),
    "zeros bool": (lambda d: Tensor.zeros(True, device=d), lambda: torch.zeros(True), "shape"),
    "repeat float": (lambda d: Tensor(_X, device=d).repeat((1.5, 1)), lambda: torch.tensor(_X).repeat((1.5, 1)),
                     "repeats"),
    "split float": (lambda d: Tensor(_X, device=d).split(1.5), lambda: torch.tensor(_X).split(1.5), "split_size"),
    "chunk float": (lambda d: Tensor(_X, device=d).chunk(1.5), lambda: torch.tensor(_X).chunk(1.5), "chunks"),
    "linspace float steps": (lambda d: Tensor.linspace(0, 1, 2.5, device=d), lambda: torch.linspace(0, 1, 2.5),
                             "steps"),
    "eye float": (lambda d: Tensor.eye(2.5, device=d), lambda: torch.eye(2.5), "n"),
    "one_hot float classes": (lambda d: Tensor([0, 1], device=d).one_hot(2.0),
                              lambda: F.one_hot(torch.tensor([0, 1]), 2.0), "num_classes"),
    "tril float diagonal": (lambda d: Tensor(_X, device=d).tril(0.5), lambda: torch.tensor(_X).tril(0.5),
                            "diagonal"),
    "diagonal float offset": (lambda d: Tensor(_X, device=d).diagonal(0.5), lambda: torch.tensor(_X).diagonal(0.5),
                              "offset"),
    "pad float": (lambda d: Tensor(_X, device=d).pad((1.5, 0)), lambda: F.pad(torch.tensor(_X), (1.5, 0)),
                  "padding"),
    "arange nan": (lambda d: Tensor.arange(float("nan"), device=d), lambda: torch.arange(float("nan")), "nan"),
    "arange str": (lambda d: Tensor.arange("5", device=d),
                    lambda: torch.arange("5"), "end"),
    "full None": (lambda d: Tensor.full((2,), None, device=d), lambda: torch.full((2,), None), "fill_value"),
    "multinomial float samples": (lambda d: Tensor([1.0, 2.0], device=d).multinomial(1.5),
                                  lambda: torch.tensor([1.0, 2.0]).multinomial(1.5), "num_samples"),
    # convolutions and pools: negative or non-int padding
    "conv2d negative padding": (lambda d: _conv(d, padding=-1), lambda: _tconv(padding=-1), "padding=-1"),
    "conv2d negative padding pair": (lambda d: _conv(d, padding=(0, -1)), lambda: _tconv(padding=(0, -1)),
                                     "padding=(0, -1)"),
    "conv2d float padding": (lambda d: _conv(d, padding=1.5), lambda: _tconv(padding=1.5), "padding"),
    "conv_transpose2d negative padding": (
        lambda d: Tensor.ones(1, 1, 5, 5, device=d).conv_transpose2d(Tensor.ones(1, 1, 3, 3, device=d), padding=-1),
        lambda: F.conv_transpose2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3), padding=-1), "padding=-1"),
    "max_pool2d negative padding": (lambda d: Tensor.ones(1, 1, 5, 5, device=d).max_pool2d(2, padding=-1),
                                    lambda: F.max_pool2d(torch.ones(1, 1, 5, 5), 2, padding=-1), "padding=-1"),
    "avg_pool2d negative padding": (lambda d: Tensor.ones(1, 1, 5, 5, device=d).avg_pool2d(2, padding=-1),
                                    lambda: F.avg_pool2d(torch.ones(1, 1, 5, 5), 2, padding=-1), "padding=-1"),
    "max_pool2d float kernel": (lambda d: Tensor.ones(1, 1, 5, 5, device=d).max_pool2d(2.5),
                                lambda: F.max_pool2d(torch.ones(1, 1, 5, 5), 2.5), "kernel_size"),
    # data that is not a number
    "tensor of None": (lambda d: Tensor([None], device=d), lambda: torch.tensor([None]), "None"),
    "tensor with a None inside": (lambda d: Tensor([[1.0, 2.0], [3.0, None]], device=d),
                                  lambda: torch.tensor([[1.0, 2.0], [3.0, None]]), "[1, 1]"),
    "stack of nothing": (lambda d: Tensor.stack(), lambda: torch.stack([]), "non-empty"),
    "cat of nothing": (lambda d: Tensor.cat(), lambda: torch.cat([]), "non-empty"),
    "cat of a number": (lambda d: Tensor.cat(Tensor(_X, device=d), 3), lambda: torch.cat([torch.tensor(_X), 3]),
                        "position 1"),
    # malformed device strings: each would be a device of its own
    "device CPU:abc": (lambda d: Tensor([1.0], device="CPU:abc"), lambda: torch.tensor([1.0], device="cpu:abc"),
                       "'CPU:abc'"),
    "device CPU:-1": (lambda d: Tensor([1.0], device="CPU:-1"), lambda: torch.tensor([1.0], device="cpu:-1"),
                      "'CPU:-1'"),
    "device CPU:": (lambda d: Tensor([1.0], device="CPU:"), lambda: torch.tensor([1.0], device="cpu:"), "'CPU:'"),
    "device CPU:01": (lambda d: Tensor([1.0], device="CPU:01"), lambda: torch.tensor([1.0], device="cpu:01"),
                      "'CPU:01'"),
    "device CPU:0:1": (lambda d: Tensor([1.0], device="CPU:0:1"), lambda: torch.tensor([1.0], device="cpu:0:1"),
                       "'CPU:0:1'"),
    "device empty": (lambda d: Tensor([1.0], device=""), lambda: torch.tensor([1.0], device=""), "''"),
    "device to": (lambda d: Tensor([1.0], device=d).to("CPU:x"), lambda: torch.tensor([1.0]).to("cpu:x"), "'CPU:x'"),
}


@needs_torch
@pytest.mark.parametrize("name", NAMED_ARGUMENTS)
def test_bad_argument_is_refused_like_torch_and_named(device, name):
    from backend_utils import builtin_error

    ours, theirs, named = NAMED_ARGUMENTS[name]
    with pytest.raises(Exception) as want:
        theirs()
    with pytest.raises(builtin_error(want.value)) as got:
        ours(device)
    assert named in str(got.value), str(got.value)


@pytest.mark.parametrize("weights, message", [
    ([[0.0, 0.0], [1.0, 1.0]], "sum of probabilities <= 0"),
    ([-1.0, 2.0], "element < 0"),
    ([float("nan"), 2.0], "nan"),
    ([float("inf"), 2.0], "inf"),
], ids=["zero row", "negative", "nan", "inf"])
@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial_refuses_invalid_weights_at_the_read(device, weights, message, replacement):
    from ember.frontend import checks

    checks.discard()
    samples = Tensor(weights, device=device).multinomial(1, replacement=replacement)  # lazy: nothing raises yet
    with pytest.raises(RuntimeError, match=message) as info:
        samples.numpy()
    assert isinstance(info.value, checks.InvalidDistribution) and "multinomial" in str(info.value)
    assert checks.pending() == 0


def test_multinomial_of_valid_weights_still_samples(device):
    from ember.frontend import checks

    checks.discard()
    w = Tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.5]], device=device)
    got = w.multinomial(2, replacement=True).numpy()
    assert (got[0] == 1).all() and set(got[1].tolist()) <= {0, 2}
    assert sorted(Tensor([0.0, 3.0, 1.0], device=device).multinomial(2).numpy().tolist()) == [1, 2]


def test_valid_dims_sizes_and_devices_still_work(device):
    t = Tensor(_X, device=device)
    assert t.sum(np.int64(1)).tolist() == [3.0, 12.0] and t.sum((0, -1)).item() == 15.0
    assert t.softmax(-1).shape == (2, 3) and t.flip((0, 1)).tolist() == [[5.0, 4.0, 3.0], [2.0, 1.0, 0.0]]
    assert t.reshape(np.int64(3), 2).shape == (3, 2) and t.reshape(2, None).shape == (2, 3)  # None keeps a dim
    assert t.squeeze((0, 1)).shape == (2, 3) and t.roll((1,), (1,)).tolist() == [[2.0, 0.0, 1.0], [5.0, 3.0, 4.0]]
    assert [p.shape for p in t.split([1, 2], 1)] == [(2, 1), (2, 2)] and len(t.chunk(2, 1)) == 2
    assert Tensor.stack(t, t).shape == (2, 2, 3) and Tensor.cat([t, t], dim=1).shape == (2, 6)
    assert t.pad((-1, 0)).shape == (2, 2)  # pad (unlike a convolution) crops with a negative value, as in torch
    assert _conv(device, padding=(1, 0)).shape == (1, 1, 5, 3)
    for name, canonical in (("CPU", "CPU"), ("cpu", "CPU"), ("CPU:0", "CPU"), ("CPU:1", "CPU:1"),
                            ("cuda:12", "CUDA:12"), ("DISK:/tmp/x:y", "DISK:/tmp/x:y")):
        assert Device.canonicalize(name) == canonical
    assert Tensor([1.0, float("nan")], device=device).numpy()[1] != 0  # a real nan is data, not a None


def test_non_string_device_is_a_type_error():
    with pytest.raises(TypeError, match="device must be a string"):
        Tensor([1.0], device=5)


def test_bad_environment_knob_names_the_variable(monkeypatch):
    from ember.helpers import getenv

    monkeypatch.setenv("EMBER_CACHE_MB", "abc")
    with pytest.raises(ValueError, match="EMBER_CACHE_MB='abc' must be an integer"):
        getenv("EMBER_CACHE_MB", 1024)
    monkeypatch.setenv("EMBER_PLUGIN_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="EMBER_PLUGIN_TIMEOUT='soon' must be a number"):
        getenv("EMBER_PLUGIN_TIMEOUT", 10.0)
    monkeypatch.setenv("EMBER_CACHE_MB", "")  # empty counts as unset
    assert getenv("EMBER_CACHE_MB", 1024) == 1024
    monkeypatch.setenv("EMBER_CACHE_MB", " 64 ")
    assert getenv("EMBER_CACHE_MB", 1024) == 64


def test_cache_size_knob_error_names_the_variable(monkeypatch):
    from ember import diskcache

    monkeypatch.setenv("EMBER_CACHE_MB", "12MB")
    with pytest.raises(ValueError, match="EMBER_CACHE_MB='12MB'"):
        diskcache.limit_bytes()


def test_host_copy_memory_error_names_bytes_shape_dtype_and_device(monkeypatch):
    from ember.device import buffer as buffer_mod

    t = Tensor.ones(3, 4, device="CPU").contiguous().realize()

    def no_memory(n: int) -> bytearray:
        raise MemoryError

    monkeypatch.setattr(buffer_mod, "bytearray", no_memory, raising=False)
    with pytest.raises(MemoryError) as info:
        t.numpy()
    msg = str(info.value)
    assert all(s in msg for s in ("48 bytes", "12 elements", "float", "CPU", "(3, 4)")), msg
