"""Render every kernel of a recorded corpus for several renderers and write the sources to one file.

A change meant only to make codegen faster must not change what it generates: run this with
the code before and after the change (``PYTHONPATH`` selects which) and compare the two files
byte for byte. It also reports how long lowering, linearizing and rendering took.

Record a corpus, then render it::

    KERNEL_CORPUS=/tmp/corpus python -m pytest -p no:xdist -q tests/backend/test_reduce_matmul.py
    python bench/render_corpus.py /tmp/corpus -o /tmp/sources.txt
    cmp /tmp/sources_before.txt /tmp/sources.txt

Renderers that cannot be built here (a plugin that is not installed) are skipped with a note.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable

from ember.codegen import get_program
from ember.engine.corpus import load_corpus
from ember.renderer import Renderer


def _cpu() -> Renderer:
    from ember_cpu.renderer import CPURenderer

    return CPURenderer()


def _cl() -> Renderer:
    from ember_opencl.renderer import CLRenderer

    return CLRenderer(fp16=True, fp64=True)


def _cuda() -> Renderer:
    from ember_cuda.renderer import CUDARenderer

    return CUDARenderer("sm_80")


def _metal() -> Renderer:
    from ember_metal.renderer import MetalRenderer

    return MetalRenderer()


def _amd() -> Renderer:
    from ember_amd.renderer import AMDRenderer

    return AMDRenderer("gfx1100")


def _python() -> Renderer:
    from ember.builtin_devices.python import PythonRenderer

    return PythonRenderer()


RENDERERS: dict[str, Callable[[], Renderer]] = {"cpu": _cpu, "cl": _cl, "cuda": _cuda, "metal": _metal, "amd": _amd,
                                                "python": _python}


def main(argv: list[str] | None = None) -> int:
    """Render the corpus folders given on the command line; write the sources to ``-o``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="+", help="folders recorded with KERNEL_CORPUS")
    ap.add_argument("-o", "--out", required=True, help="file the sources are written to")
    ap.add_argument("-r", "--renderers", default="cpu,cl", help=f"comma-separated, of {', '.join(RENDERERS)}")
    ap.add_argument("-n", "--limit", type=int, default=0, help="only the first N kernels of each folder")
    ap.add_argument("--opts", action="store_true", help="write each kernel's chosen opts above its source")
    args = ap.parse_args(argv)
    asts = []
    for folder in args.corpus:
        found = load_corpus(folder)
        asts += found[: args.limit] if args.limit else found
    with open(args.out, "w") as out:
        for key in args.renderers.split(","):
            if key not in RENDERERS:
                ap.error(f"unknown renderer {key!r}; known: {', '.join(RENDERERS)}")
            try:
                renderer = RENDERERS[key]()
            except ImportError as e:
                print(f"{key}: skipped ({e})", file=sys.stderr)
                continue
            start, digest = time.perf_counter(), hashlib.sha256()
            for i, ast in enumerate(asts):
                try:
                    spec = get_program(ast, renderer, f"k{i}")
                    text = f"opts {list(spec.opts)}\n{spec.src}" if args.opts else spec.src
                except Exception as e:  # noqa: BLE001 - an error is an output too: it must stay the same
                    text = f"ERROR {type(e).__name__}: {e}"
                out.write(f"### {key} {i}\n{text}\n")
                digest.update(text.encode())
            took = time.perf_counter() - start
            print(f"{key}: {len(asts)} kernels in {took:.2f} s, sha256 {digest.hexdigest()[:16]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
