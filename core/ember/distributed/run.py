"""``python -m ember.distributed.run -n 4 train.py args...``: start a job of ranks and supervise it.

On one machine (the default) the ranks are started by ``mpiexec`` from MPICH's wheel (next to this
interpreter, else on ``PATH``); ``--hostfile FILE`` passes a host file to it for several machines; under
Slurm (``--slurm``, or inside an allocation: ``SLURM_JOB_ID`` set) the job is forwarded to ``srun``.

Every line a rank prints is prefixed with ``[rank R]``. On one machine each rank gets ``OMP_NUM_THREADS`` =
cores / ranks unless it is set (the CPU device's kernels would otherwise oversubscribe the cores).

When a rank dies (an exception, a signal such as SIGKILL, the out-of-memory killer) the others are stopped at
once and the launcher ends with an error naming that rank and how it ended. Ctrl-C (or SIGTERM to the
launcher) stops every rank.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

#: How long the ranks get to stop after Ctrl-C or a failure before they are killed.
GRACE_S = 5.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The launcher's options; everything from the script on belongs to the script."""
    p = argparse.ArgumentParser(prog="python -m ember.distributed.run", description=__doc__.split("\n")[0])
    p.add_argument("-n", "--nproc", type=int, default=None, help="number of ranks (default: 1, or Slurm's tasks)")
    p.add_argument("--hostfile", default=None, help="a host file for mpiexec (one host per line, host:slots)")
    p.add_argument("--slurm", action="store_true", default=None, help="start the ranks with srun")
    p.add_argument("--local", dest="slurm", action="store_false", help="use mpiexec even inside a Slurm allocation")
    p.add_argument("--mpiexec", default=None, help="the mpiexec to run (default: the one next to this Python)")
    p.add_argument("--srun-args", default="--mpi=pmi2", help="extra srun options (default: --mpi=pmi2)")
    p.add_argument("-m", dest="module", default=None, help="run a module (as python -m) instead of a script")
    p.add_argument("--_rank", action="store_true", help=argparse.SUPPRESS)  # inside one rank: prefix, then run
    p.add_argument("script", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = p.parse_args(argv)
    if ns.module is None and ns.script is None:
        p.error("name a script to run (or -m module)")
    if ns.module is not None and ns.script is not None:
        ns.args = [ns.script, *ns.args]
        ns.script = None
    if ns.nproc is not None and ns.nproc < 1:
        p.error(f"-n must be at least 1, got {ns.nproc}")
    return ns


def find_mpiexec(explicit: str | None = None) -> str:
    """The mpiexec to use: ``explicit``, the one installed next to this interpreter (MPICH's wheel), or PATH's."""
    if explicit:
        return explicit
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise SystemExit("ember.distributed.run: no mpiexec found next to this Python or on PATH; "
                         "pip install 'ember[mpi]' (MPICH's wheel brings one)")
    return found


class _Prefixed:
    """A text stream that writes whole lines, each starting with ``prefix``: the ranks share one output, and a
    line written in one piece is never cut by another rank's (a partial line waits for its end or a flush)."""

    def __init__(self, stream: IO[str], prefix: str):
        self._stream, self._prefix, self._partial = stream, prefix, ""
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            text = self._partial + s
            cut = text.rfind("\n") + 1
            self._partial = text[cut:]
            if cut:
                self._stream.write("".join(self._prefix + line for line in text[:cut].splitlines(keepends=True)))
                self._stream.flush()  # a rank killed by a signal loses nothing it printed
        return len(s)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                self._stream.write(self._prefix + self._partial)
                self._partial = ""
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _run_rank(ns: argparse.Namespace) -> None:
    """Inside one rank: prefix this process's output with its rank, then run the script as ``__main__``."""
    import runpy

    from ember.distributed import launch_env

    env = launch_env()
    prefix = f"[rank {env[0]}] " if env is not None else "[rank ?] "
    sys.stdout = _Prefixed(sys.stdout, prefix)
    sys.stderr = _Prefixed(sys.stderr, prefix)
    try:
        if ns.module is not None:
            sys.argv = [ns.module, *ns.args]
            runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [ns.script, *ns.args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
            runpy.run_path(ns.script, run_name="__main__")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


class _Supervisor:
    """Runs the starter (mpiexec or srun), relays its output and works out which rank failed, and how."""

    _PID = re.compile(r"PID (\d+) RUNNING AT (\S+)")
    _CODE = re.compile(r"EXIT CODE: (\d+)")
    _SLURM = re.compile(r"error: .*task (\d+): (.*)")

    def __init__(self, cmd: list[str], env: dict[str, str], rundir: str, nproc: int):
        self.cmd, self.env, self.rundir, self.nproc = cmd, env, rundir, nproc
        self.failed: list[tuple[str, str, int | None]] = []  # (pid, host, exit code) from the starter's report
        self.slurm_failed: list[tuple[int, str]] = []
        self._pending: tuple[str, str] | None = None

    def _relay(self, stream: IO[str]) -> None:
        for line in stream:
            sys.stdout.write(line)
            sys.stdout.flush()
            if m := self._PID.search(line):
                self._pending = (m.group(1), m.group(2))
            elif (m := self._CODE.search(line)) and self._pending is not None:
                self.failed.append((*self._pending, int(m.group(1))))
                self._pending = None
            elif m := self._SLURM.search(line):
                self.slurm_failed.append((int(m.group(1)), m.group(2).strip()))

    def ranks_by_pid(self) -> dict[str, int]:
        out = {}
        for name in os.listdir(self.rundir):
            if m := re.fullmatch(r"rank(\d+)\.pid", name):
                try:
                    with open(os.path.join(self.rundir, name)) as f:
                        out[f.read().split()[0]] = int(m.group(1))
                except (OSError, IndexError):
                    pass
        return out

    def _local_ranks_alive(self) -> dict[int, int]:
        """rank -> pid of the ranks on this machine still running (from the files init() wrote)."""
        import socket

        alive = {}
        host = socket.gethostname()
        for name in os.listdir(self.rundir):
            if m := re.fullmatch(r"rank(\d+)\.pid", name):
                try:
                    with open(os.path.join(self.rundir, name)) as f:
                        pid, h = f.read().split()[:2]
                    if h == host:
                        os.kill(int(pid), 0)
                        alive[int(m.group(1))] = int(pid)
                except (OSError, ValueError):
                    pass
        return alive

    def describe_failure(self, rc: int) -> str:
        """The launcher's last line for a job that did not end well."""
        pids = self.ranks_by_pid()
        parts = []
        for pid, host, code in self.failed:
            who = f"rank {pids[pid]}" if pid in pids else "a rank"
            how = f"was killed by {_signal_name(code)}" if code in (6, 9, 11, 15) else f"exited with status {code}"
            parts.append(f"{who} (pid {pid} on {host}) {how}")
        for name in sorted(os.listdir(self.rundir)):
            if m := re.fullmatch(r"rank(\d+)\.error", name):
                try:
                    with open(os.path.join(self.rundir, name)) as f:
                        parts.insert(0, f"rank {m.group(1)} failed: {f.read().strip()}")
                except OSError:
                    pass
        for task, why in self.slurm_failed:
            parts.append(f"rank {task}: {why}")
        if not parts:
            return f"the job failed (the starter exited with status {rc})"
        return "; ".join(dict.fromkeys(parts)) + "; the other ranks were stopped"

    def stop(self, proc: subprocess.Popen[str], sig: int) -> None:
        """Send ``sig`` to the starter (mpiexec and srun pass it on to every rank); kill what is left after the
        grace period."""
        try:
            proc.send_signal(sig)
        except OSError:
            pass
        try:
            proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        for pid in self._local_ranks_alive().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()

    def run(self) -> int:
        proc = subprocess.Popen(self.cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # our own group: Ctrl-C reaches the ranks through us only
        assert proc.stdout is not None
        reader = threading.Thread(target=self._relay, args=(proc.stdout,), daemon=True)
        reader.start()
        stopping: list[int] = []

        def on_signal(signum: int, frame: Any) -> None:
            stopping.append(signum)

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while proc.poll() is None:
                if stopping:
                    print(f"ember.distributed.run: {_signal_name(stopping[0])}: stopping all {self.nproc} ranks",
                          file=sys.stderr, flush=True)
                    self.stop(proc, signal.SIGINT if stopping[0] == signal.SIGINT else signal.SIGTERM)
                    reader.join(2)
                    return 130 if stopping[0] == signal.SIGINT else 143
                time.sleep(0.05)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        reader.join(5)
        rc = proc.returncode
        leftover = self._local_ranks_alive()
        if leftover:  # the starter is gone but ranks are not: never leave them running
            self.stop(proc, signal.SIGTERM)
        if rc != 0:
            print(f"ember.distributed.run: {self.describe_failure(rc)}", file=sys.stderr, flush=True)
        return rc


def build_command(ns: argparse.Namespace) -> tuple[list[str], int]:
    """The starter's command line (mpiexec or srun) and the number of ranks."""
    slurm = ns.slurm if ns.slurm is not None else ("SLURM_JOB_ID" in os.environ and ns.hostfile is None)
    inner = [sys.executable, "-u", "-m", "ember.distributed.run", "--_rank"]
    inner += ["-m", ns.module, *ns.args] if ns.module is not None else [ns.script, *ns.args]
    if slurm:
        n = ns.nproc or int(os.environ.get("SLURM_NTASKS", "1"))
        srun = shutil.which("srun")
        if srun is None:
            raise SystemExit("ember.distributed.run: --slurm, but there is no srun on PATH")
        return [srun, "-n", str(n), "--kill-on-bad-exit=1", *ns.srun_args.split(), *inner], n
    n = ns.nproc or 1
    cmd = [find_mpiexec(ns.mpiexec), "-n", str(n)]
    if ns.hostfile is not None:
        if not os.path.isfile(ns.hostfile):
            raise SystemExit(f"ember.distributed.run: --hostfile {ns.hostfile}: no such file")
        cmd += ["-f", ns.hostfile]
    return [*cmd, *inner], n


def main(argv: list[str] | None = None) -> int:
    """Launch (or, with ``--_rank``, be one rank); returns the exit status."""
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    if ns._rank:
        _run_rank(ns)
        return 0
    if ns.script is not None and not os.path.isfile(ns.script):
        raise SystemExit(f"ember.distributed.run: {ns.script}: no such file")
    cmd, n = build_command(ns)
    rundir = tempfile.mkdtemp(prefix="ember-dist-")
    env = dict(os.environ, EMBER_DIST_RUNDIR=rundir, PYTHONUNBUFFERED="1")
    if "OMP_NUM_THREADS" not in env and cmd[0] != shutil.which("srun") and ns.hostfile is None:
        # n ranks on this machine, each with an OpenMP thread per core, would oversubscribe the cores n times
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    try:
        return _Supervisor(cmd, env, rundir, n).run()
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
