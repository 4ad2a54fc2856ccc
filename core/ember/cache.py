"""``python -m ember.cache``: show or clear ember's on-disk cache (compiled kernels, lowered programs).

    python -m ember.cache             # where it is, entries and bytes per table, the size limit
    python -m ember.cache clear       # delete every entry
    python -m ember.cache clear compile
    python -m ember.cache prune       # apply the size limit now (least recently used entries go first)

The folder is ``EMBER_CACHE_DIR`` (default ``~/.cache/ember``) and the limit ``EMBER_CACHE_MB`` (see
:mod:`ember.diskcache`).
"""
from __future__ import annotations

import argparse
import sys

from ember import diskcache
from ember.helpers import cache_dir


def _mb(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MB"


def describe() -> str:
    """A short report: the folder, each table's entries and size, the total and the limit."""
    use = diskcache.usage()
    limit = diskcache.limit_bytes()
    lines = [f"ember cache: {cache_dir()}"]
    for table, (n, size) in sorted(use.items()):
        lines.append(f"  {table:12s} {n:7d} entries {_mb(size):>10s}")
    total = sum(size for _, size in use.values())
    lines.append(f"  {'total':12s} {sum(n for n, _ in use.values()):7d} entries {_mb(total):>10s}"
                 f"   (limit {_mb(limit) if limit else 'none'}, EMBER_CACHE_MB)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m ember.cache", description="Show or clear ember's on-disk cache.")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("show", help="entries and size per table (the default)")
    clear = sub.add_parser("clear", help="delete entries")
    clear.add_argument("table", nargs="?", help="only this table (compile, lowered, ...)")
    sub.add_parser("prune", help="apply the size limit now")
    args = ap.parse_args(argv)
    if args.cmd == "clear":
        n = diskcache.clear(args.table)
        print(f"deleted {n} entries{f' from {args.table}' if args.table else ''} in {cache_dir()}")
    elif args.cmd == "prune":
        limit = diskcache.limit_bytes()
        print(f"deleted {diskcache.prune(limit) if limit else 0} least recently used entries")
    else:
        print(describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
