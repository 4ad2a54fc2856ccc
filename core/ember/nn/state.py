"""Weights I/O and model state: safetensors, PyTorch checkpoints, GGUF, and state dicts.

Loading never reads a file whole. A file is memory-mapped through the built-in DISK device
(:mod:`ember.builtin_devices.disk`) and each stored tensor becomes a zero-copy DISK view of its own bytes:
``safe_load(fn)["w"].to("CPU")`` (or :func:`load_state_dict`) reads only that tensor's pages.
DISK tensors cannot be computed on; move them to a compute device first.

* :func:`safe_load`, :func:`safe_save`, :func:`safe_load_metadata`: the safetensors format, checked
  as strictly as the reference implementation (header, dtypes, offsets, sizes, no holes).
* :func:`torch_load`: ``.pt``/``.pth`` files written by ``torch.save`` (zip and legacy formats),
  read without torch by a restricted unpickler that only rebuilds tensors and plain containers.
* :func:`gguf_load`: GGUF v2/v3 metadata and tensors. Quantized tensors (Q4_0, Q4_1, Q5_0, Q5_1,
  Q8_0, Q2_K ... Q8_K, IQ4_NL) are dequantized to float32 with numpy on the host.
* :func:`get_state_dict`, :func:`get_parameters`, :func:`load_state_dict`: name a model's tensors by
  walking its attributes, lists and dicts; load a state dict all-or-nothing.

A malformed file raises a :class:`WeightsFormatError` (a ``ValueError``) whose message names the file
and the tensor, and says what is wrong.
"""
from __future__ import annotations

import time
import types
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ember.helpers import DEBUG
from ember.nn.gguf import GGML_TYPES, ggml_data_to_tensor, ggml_dequantize, gguf_load  # noqa: F401
from ember.nn.safetensors import from_file, safe_load, safe_load_metadata, safe_save  # noqa: F401
from ember.nn.torch_load import torch_load  # noqa: F401
from ember.nn.weights import (  # noqa: F401
    GGUFError,
    SafetensorsError,
    StateDictError,
    TorchLoadError,
    WeightsFormatError,
    _disk_view,
    _host_tensor,
    _is_int,
    _map_file,
    _Source,
    _tensor_bytes,
    _ViewFile,
)
from ember.tensor import Tensor, no_grad

# =============================================================================================
# state dicts
# =============================================================================================

_LEAF_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), np.ndarray, np.generic, type,
               types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _walk_state(obj: Any, prefix: str, tensor_type: type, out: dict[str, Any], active: set[int]) -> None:
    if isinstance(obj, tensor_type):
        out[prefix.strip(".")] = obj
        return
    if isinstance(obj, _LEAF_TYPES) or id(obj) in active:
        return  # plain values, and cycles (a layer that points back at its parent)
    active.add(id(obj))
    try:
        items: Iterable[tuple[Any, Any]]
        if hasattr(obj, "_asdict") and isinstance(obj, tuple):  # namedtuple
            items = getattr(obj, "_asdict")().items()  # noqa: B009  (a namedtuple's method, unknown to the checker)
        elif isinstance(obj, Mapping):
            items = obj.items()
        elif isinstance(obj, (list, tuple)):
            items = enumerate(obj)
        elif hasattr(obj, "__dict__"):
            items = vars(obj).items()
        else:
            return
        for k, v in list(items):
            _walk_state(v, f"{prefix}{k}.", tensor_type, out, active)
    finally:
        active.discard(id(obj))


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every tensor reachable from ``obj`` by a dotted name: attributes, list/tuple indices, dict keys.

    ``model.l1.weight`` is ``"l1.weight"``, ``model.layers[0].bias`` is ``"layers.0.bias"``. A tensor
    reachable under two names (tied weights) appears under both.
    """
    out: dict[str, Tensor] = {}
    _walk_state(obj, prefix, tensor_type, out, set())
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of :func:`get_state_dict`, each once (tied weights are not repeated)."""
    seen: set[int] = set()
    out: list[Tensor] = []
    for t in get_state_dict(obj).values():
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _describe_problems(model: Any, missing: list[str], unexpected: list[str], bad: list[str], strict: bool) -> str:
    lines = [f"the state dict does not fit {type(model).__name__}; nothing was loaded:"]
    if strict and missing:
        lines.append(f"  missing keys (in the model, not in the state dict): {', '.join(missing)}")
    if strict and unexpected:
        lines.append(f"  unexpected keys (in the state dict, not in the model): {', '.join(unexpected)}")
    if bad:
        lines.append("  shape mismatches:")
        lines.extend(f"    {b}" for b in bad)
    if strict and (missing or unexpected):
        lines.append("  (load_state_dict(..., strict=False) skips missing and unexpected keys)")
    return "\n".join(lines)


def load_state_dict(model: Any, state_dict: Mapping[str, Tensor], strict: bool = True, verbose: bool = False,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:
    """Copy ``state_dict`` into the tensors of ``model`` (named as :func:`get_state_dict` names them).

    Values are moved to each parameter's device and cast to its dtype. Nothing is applied unless
    everything fits: every shape mismatch (both shapes), and with ``strict`` every missing and
    unexpected key, is listed in one :class:`StateDictError`. With ``realize`` the new values are
    computed (copied off the disk) before any parameter changes, so a failure leaves the model as it
    was. ``consume`` deletes loaded entries from ``state_dict``. Returns the updated tensors.
    """
    start = time.perf_counter()
    model_state = get_state_dict(model)
    missing = [k for k in model_state if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_state]
    bad: list[str] = []
    for k, v in model_state.items():
        if k not in state_dict:
            continue
        new = state_dict[k]
        if not isinstance(new, Tensor):
            bad.append(f"{k}: model {v.shape}, state dict has a {type(new).__name__}, not a Tensor")
        elif new.shape != v.shape:
            bad.append(f"{k}: model {v.shape}, state dict {new.shape}")
    if bad or (strict and (missing or unexpected)):
        raise StateDictError(_describe_problems(model, missing, unexpected, bad, strict))
    if unexpected and (verbose or DEBUG >= 1):
        print(f"load_state_dict: ignoring {len(unexpected)} unused keys: {', '.join(unexpected)}")
    if missing and verbose:
        print(f"load_state_dict: {len(missing)} model tensors are not in the state dict: {', '.join(missing)}")
    with no_grad():
        pairs = [(v, state_dict[k].detach().to(v.device).cast(v.dtype)) for k, v in model_state.items()
                 if k in state_dict]
        if realize and pairs:
            Tensor.realize_all(*[new for _, new in pairs])
        for param, new in pairs:
            param.assign(new)
    if consume:
        for k in model_state:
            if k in state_dict:
                del state_dict[k]  # type: ignore[attr-defined]
    if verbose:
        nbytes = sum(p.nbytes() for p, _ in pairs)
        print(f"load_state_dict: loaded {len(pairs)} tensors ({nbytes / 1e6:.2f} MB) into {type(model).__name__} "
              f"in {time.perf_counter() - start:.3f} s")
    return [p for p, _ in pairs]


__all__ = [
    "GGML_TYPES", "GGUFError", "SafetensorsError", "StateDictError", "TorchLoadError", "WeightsFormatError",
    "from_file", "get_parameters", "get_state_dict", "ggml_data_to_tensor", "ggml_dequantize", "gguf_load",
    "load_state_dict", "safe_load", "safe_load_metadata", "safe_save", "torch_load",
]
