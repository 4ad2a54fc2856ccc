"""The device layer, and the public facade for device plugins.

A plugin imports what it needs from here (and renderers from :mod:`ember.renderer`), never from a
submodule: the submodules are core's own layout and may move. What is exported is the contract
of ``PLUGIN_API`` (see ``docs/contracts.md``):

* discovery: :data:`PLUGIN_API`, :class:`DeviceSpec`, :data:`hookimpl` (and :data:`hookspec`),
  the registry :data:`Device` and its errors;
* the device object and its parts: :class:`Compiled` (the device base class),
  :class:`Allocator` / :class:`LRUAllocator` with :class:`BufferSpec` options and the copy checks
  :func:`copyin_source` / :func:`copyout_dest`, :class:`Compiler` / :class:`BatchCompiler` with
  :class:`KernelBinary`, :func:`join_sources` and :class:`CompileError`, and the Protocols :class:`Renderer`,
  :class:`Program` and :class:`Graph` (with :data:`GraphCall`, :data:`GraphFactory`), and the optional
  capability :class:`NCCLMemory`;
* what a plugin reads from the environment: :func:`getenv`, :data:`DEBUG`,
  :class:`GlobalCounters`, :func:`cache_dir`, and :mod:`~ember.diskcache` (crash-safe cache
  entries, for a plugin that caches its own probe results);
* for a plugin's tool that compiles a recorded kernel corpus without the hardware: :func:`corpus_sources`,
  :func:`compile_batches`, :func:`first_failure` and :func:`corpus_main` (imported when first asked for).

This module must stay import-light: plugins import it, and it never imports the tensor layer.
"""
from typing import TYPE_CHECKING, Any

from ember import diskcache
from ember.device.allocator import Allocator, LRUAllocator, copyin_source, copyout_dest
from ember.device.batch_compiler import BatchCompiler, KernelBinary, join_sources
from ember.device.collective import host_allreduce
from ember.device.compiled import Compiled
from ember.device.compiler import CompileError, Compiler
from ember.device.contracts import BufferSpec, Graph, GraphCall, GraphFactory, NCCLMemory, Program, Renderer
from ember.device.hookspecs import PLUGIN_API, hookimpl, hookspec
from ember.device.registry import Device, DeviceNotFoundError, DevicePluginError, DeviceUnavailableError
from ember.device.spec import DeviceSpec
from ember.helpers import DEBUG, GlobalCounters, cache_dir, getenv, sha256

if TYPE_CHECKING:
    from ember.device.corpus_check import compile_batches, corpus_main, corpus_sources, first_failure
    from ember.device.hcq import (
        DEFAULT_TIMEOUT_S,
        Copy,
        Exec,
        HCQCommandError,
        HCQDevice,
        HCQGraph,
        HCQProgram,
        HCQTimeoutError,
        HostSignal,
        HWQueue,
        KernelArgs,
        MemoryBarrier,
        Signal,
        SignalCmd,
        Timeline,
        Timestamp,
        Wait,
        profiled_copy,
        profiled_exec,
    )

#: the base for queue-driven devices (docs/hcq.md), imported when first asked for: a process that only uses
#: the CPU or OpenCL device never needs it (its import is ~2 ms of every start)
_HCQ_NAMES = frozenset({
    "DEFAULT_TIMEOUT_S", "Copy", "Exec", "HCQCommandError", "HCQDevice", "HCQGraph", "HCQProgram", "HCQTimeoutError",
    "HostSignal", "HWQueue", "KernelArgs", "MemoryBarrier", "Signal", "SignalCmd",
    "Timeline", "Timestamp", "Wait", "profiled_copy", "profiled_exec",
})


#: compiling a recorded corpus without the hardware (a GPU plugin's corpus_check tool), imported when first asked
#: for: it imports codegen
_CORPUS_NAMES = frozenset({"compile_batches", "corpus_main", "corpus_sources", "first_failure"})


def __getattr__(name: str) -> Any:
    if name in _CORPUS_NAMES:
        from ember.device import corpus_check

        value = getattr(corpus_check, name)
        globals()[name] = value
        return value
    if name in _HCQ_NAMES:
        from ember.device import hcq

        value = getattr(hcq, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ember.device' has no attribute {name!r}")


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Copy",
    "Exec",
    "HCQCommandError",
    "HCQDevice",
    "HCQGraph",
    "HCQProgram",
    "HCQTimeoutError",
    "HWQueue",
    "HostSignal",
    "KernelArgs",
    "MemoryBarrier",
    "Signal",
    "SignalCmd",
    "Timeline",
    "Timestamp",
    "Wait",
    "profiled_copy",
    "profiled_exec",
    "host_allreduce",
    "DEBUG",
    "sha256",
    "PLUGIN_API",
    "Allocator",
    "BatchCompiler",
    "BufferSpec",
    "CompileError",
    "Compiled",
    "Compiler",
    "Device",
    "DeviceNotFoundError",
    "DevicePluginError",
    "DeviceSpec",
    "DeviceUnavailableError",
    "GlobalCounters",
    "Graph",
    "GraphCall",
    "GraphFactory",
    "KernelBinary",
    "LRUAllocator",
    "NCCLMemory",
    "Program",
    "Renderer",
    "cache_dir",
    "copyin_source",
    "copyout_dest",
    "diskcache",
    "getenv",
    "hookimpl",
    "hookspec",
    "join_sources",
    "compile_batches",
    "corpus_main",
    "corpus_sources",
    "first_failure",
]
