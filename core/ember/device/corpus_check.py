"""Compile a recorded kernel corpus for a target without its hardware: the machinery GPU plugins share.

A corpus (``KERNEL_CORPUS=<folder>``, read by :func:`ember.testing.load_corpus`) holds every kernel AST a
workload lowered. A plugin's ``corpus_check`` tool renders each AST with its renderer
(:func:`corpus_sources`), joins the sources into programs of a few hundred kernels, compiles the programs
on a thread pool (:func:`compile_batches`; a failing program is compiled kernel by kernel so the error names
the kernel at fault, :func:`first_failure`) and prints what it did (:func:`corpus_main`). What compiling
and checking one program means is the plugin's own (NVRTC and ptxas, clang and the code object's notes).

Exported lazily by :mod:`ember.device` (it imports codegen, which a device plugin's runtime never needs).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ember.ir.uop import UOp
    from ember.renderer import Renderer

T = TypeVar("T")


def corpus_sources(asts: Sequence[UOp], renderer: Renderer, first: int = 0, skip_too_large: bool = False
                   ) -> list[str]:
    """The source of every AST, lowered by codegen for ``renderer`` (kernel ``i`` is called ``k{first + i}``).

    ``skip_too_large``: leave out kernels whose launch is larger than the target's hardware ids count
    (:class:`~ember.codegen.LaunchTooLarge`: refused by design, recorded on a target with 64-bit loops)."""
    from ember.codegen import LaunchTooLarge, get_program

    srcs = []
    for i, ast in enumerate(asts):
        try:
            srcs.append(get_program(ast, renderer, f"k{first + i}").src)
        except LaunchTooLarge:
            if not skip_too_large:
                raise
    return srcs


def compile_batches(srcs: Sequence[str], batch: int, workers: int, build: Callable[[list[str]], T]) -> list[T]:
    """``build`` run on each run of ``batch`` sources (a program), ``workers`` at a time; the results in order.

    ``build`` raises :class:`~ember.device.CompileError` for a program that does not compile (see
    :func:`first_failure`); the first such error is raised here."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    groups = [list(srcs[i:i + batch]) for i in range(0, len(srcs), batch)]
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(build, groups))


def first_failure(srcs: Sequence[str], build_one: Callable[[str], object]) -> None:
    """Build each source of a program that failed as a whole: the first that fails raises with its own source and
    log (a program's error names a line of the joined source, which says little about the kernel)."""
    for src in srcs:
        build_one(src)


def corpus_main(argv: Sequence[str] | None, description: str, archs: Sequence[str], batch: int, compiler: str,
                check: Callable[[list[UOp], Sequence[str], int], Sequence[object]],
                describe: Callable[[object], str]) -> int:
    """The command line of a plugin's ``corpus_check``: ``DIR [--arch A ...] [--batch N]``.

    ``check(asts, archs, batch)`` compiles the corpus and returns one result per architecture, printed with
    ``describe``; a :class:`~ember.device.CompileError` is printed and gives exit status 1, as does an empty
    corpus."""
    from ember.device.compiler import CompileError
    from ember.engine.corpus import load_corpus

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("corpus", help="a folder recorded with KERNEL_CORPUS=<folder>")
    parser.add_argument("--arch", action="append", help=f"target (repeatable; default {' '.join(archs)})")
    parser.add_argument("--batch", type=int, default=batch, help=f"kernels per {compiler} program")
    args = parser.parse_args(argv)
    asts = load_corpus(args.corpus)
    if not asts:
        print(f"{args.corpus}: the corpus is empty", file=sys.stderr)
        return 1
    start = time.perf_counter()
    try:
        results = check(asts, args.arch or archs, args.batch)
    except CompileError as e:
        print(e, file=sys.stderr)
        return 1
    for r in results:
        print(describe(r))
    print(f"total {time.perf_counter() - start:.1f} s")
    return 0
