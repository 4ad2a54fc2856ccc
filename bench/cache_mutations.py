"""Mutate ember's disk cache and check that nothing crashes, every result stays right, and bad entries are rebuilt.

A small program (elementwise, reduce, matmul, casts, integer ops, a gather) runs once to fill a private
cache. Then, round after round, entries of the ``compile`` and ``lowered`` tables are damaged and the
program runs again in a fresh process, which must exit normally with the numpy answers. Mutations:

- ``truncate``: the entry cut at a random length (a crash mid-write on a filesystem without atomic rename)
- ``flip``: one random byte flipped
- ``swap``: two entries' files exchanged (each is intact, but written for the other key)
- ``forge``: a well-formed entry for the right key whose payload is garbage (the checksum matches)
- ``foreign``: random bytes in place of an entry, a stray file with a key-like name, a stray file with
  another name, or a folder where an entry belongs

After each round every damaged entry the program uses must be a good entry again (rebuilt and rewritten).

Run: ``python bench/cache_mutations.py --mutations 1000`` (default 1000 mutations in rounds of 50).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = r"""
import json, sys
import numpy as np
from ember import GlobalCounters, Tensor, dtypes
a = np.arange(24, dtype=np.float32).reshape(4, 6) / 7 - 1
b = np.linspace(-2, 2, 18, dtype=np.float32).reshape(6, 3)
i = np.array([[3, 1, 0, 2, 1, 0]] * 4, dtype=np.int32)
ta, tb, ti = Tensor(a), Tensor(b), Tensor(i)
got = {
    "ew": ((ta * 2 + 1).relu().exp() - ta).numpy(),
    "red": ta.sum(1).numpy(),
    "mm": (ta @ tb).numpy(),
    "cast": (ta * 10).cast(dtypes.int32).cast(dtypes.float32).numpy(),
    "int": ((ti * 7 + 3) % 5).numpy(),
    "gather": ta.gather(1, ti).numpy(),
}
want = {
    "ew": np.exp(np.maximum(a * 2 + 1, 0)) - a,
    "red": a.sum(1),
    "mm": a @ b,
    "cast": np.trunc(a * 10).astype(np.int32).astype(np.float32),
    "int": (i * 7 + 3) % 5,
    "gather": np.take_along_axis(a, i, 1),
}
bad = [k for k in want if not np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5)]
print(json.dumps({"bad": bad, "compiled": GlobalCounters.kernels_compiled}))
"""

TABLES = ("compile", "lowered")
KINDS = ("truncate", "flip", "swap", "forge", "foreign")


def run_program(cache: Path) -> dict:
    """Run PROGRAM in a fresh interpreter with ``cache``; its JSON result plus the exit status."""
    env = {k: v for k, v in os.environ.items() if k not in ("CACHELEVEL", "DEBUG")}
    env.update(EMBER_CACHE_DIR=str(cache), DEV=env.get("DEV", "CPU"))
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["rc"] = 0
    return out


def entries(cache: Path) -> list[Path]:
    """The key-named entry files of the mutated tables."""
    return sorted(p for t in TABLES if (cache / t).is_dir() for p in (cache / t).iterdir()
                  if p.is_file() and len(p.name) == 64)


def mutate(cache: Path, rng: random.Random, kind: str, files: list[Path]) -> list[Path]:
    """Apply one mutation of ``kind`` to one of ``files`` (the program's real entries); returns the entries it
    damaged (to be rebuilt)."""
    from ember import diskcache

    p = rng.choice(files)
    if p.is_dir():  # a folder left by an earlier mutation of this round
        return []
    data = p.read_bytes() if p.exists() else b""
    if kind == "truncate":
        p.write_bytes(data[:rng.randrange(0, max(len(data), 1))])
    elif kind == "flip":
        if data:
            buf = bytearray(data)
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
            p.write_bytes(bytes(buf))
    elif kind == "swap":
        q = rng.choice(files)
        if q == p:
            return []
        if q.is_dir():
            return []
        qdata = q.read_bytes() if q.exists() else b""
        p.write_bytes(qdata)
        q.write_bytes(data)
        return [p, q]
    elif kind == "forge":
        garbage = rng.randbytes(rng.randrange(1, 4096))
        p.unlink(missing_ok=True)
        diskcache.write(p, garbage)  # a well-formed entry for this key with a useless payload
    else:
        how = rng.randrange(4)
        if how == 0:
            p.write_bytes(rng.randbytes(rng.randrange(0, 4096)))
        elif how == 1:
            (p.parent / rng.randbytes(32).hex()).write_bytes(rng.randbytes(100))
            return []
        elif how == 2:
            (p.parent / f"stray-{rng.randrange(10 ** 6)}.txt").write_text("not an entry")
            return []
        else:
            p.unlink()
            p.mkdir()
    return [p]


def good_entry(p: Path) -> bool:
    from ember import diskcache
    return p.is_file() and diskcache.read(p) is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutations", type=int, default=1000)
    ap.add_argument("--per-round", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="ember-cache-mut-") as tmp:
        cache = Path(tmp) / "cache"
        os.environ["EMBER_CACHE_DIR"] = str(cache)  # for diskcache.write/read in this process
        first = run_program(cache)
        assert first["rc"] == 0 and not first["bad"], first
        real = entries(cache)  # the entries the program uses (stray files added later are not rebuilt, by design)
        done, crashes, wrong, not_rebuilt, rounds = 0, 0, 0, 0, 0
        counts = {k: 0 for k in KINDS}
        while done < args.mutations:
            damaged: dict[Path, str] = {}
            for _ in range(min(args.per_round, args.mutations - done)):
                kind = rng.choice(KINDS)
                damaged.update((p, kind) for p in mutate(cache, rng, kind, real))
                counts[kind] += 1
                done += 1
            res = run_program(cache)
            rounds += 1
            if res["rc"] != 0:
                crashes += 1
                print(f"round {rounds}: exit status {res['rc']}\n{res['stderr']}")
                continue
            wrong += bool(res["bad"])
            missing = [p for p in damaged if not good_entry(p)]
            for p in missing:
                print(f"  not rebuilt: {p.parent.name}/{p.name[:12]} (last mutation: {damaged[p]}, "
                      f"{'a folder' if p.is_dir() else 'missing' if not p.exists() else 'a bad file'})")
            not_rebuilt += len(missing)
            print(f"round {rounds}: {len(damaged)} entries damaged, {res['compiled']} kernels rebuilt, "
                  f"wrong results {res['bad']}, not rebuilt {len(missing)}")
        print(json.dumps({"mutations": done, "by_kind": counts, "rounds": rounds, "crashes": crashes,
                          "rounds_with_wrong_results": wrong, "entries_not_rebuilt": not_rebuilt}))
        return 0 if crashes == wrong == not_rebuilt == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
