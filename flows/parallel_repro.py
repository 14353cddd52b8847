"""``make repro`` on N cores: ``dvc repro`` of N papers at a time in one checkout, then the summary.

    python -m flows.parallel_repro --jobs 2          # what `make repro` runs (REPRO_JOBS=2)
    python -m flows.parallel_repro --jobs 1          # plain `dvc repro --keep-going`

Most stages here are single-threaded, so one ``dvc repro`` leaves a core of two idle. DVC releases the
repository lock while a stage's command runs (``dvc/stage/run.py``: ``unlocked_repo``) and guards each
running stage's dependencies and outputs with its read/write locks (``.dvc/tmp/rwlock``), so separate
``dvc repro`` processes can reproduce disjoint pipelines of one checkout at the same time; with
``--wait-for-lock`` each waits for the repository lock while the other checks or records a stage,
instead of failing. The papers' pipelines share only what they read (``stages/common``, ``kernels``,
``stages/__main__.py``, params.yaml) and each writes only its own ``data/<slug>`` and ``reports/<slug>``.

1. ``jobs`` lanes take the papers longest first (the committed ``runtime_s`` in
   ``reports/<slug>/metrics.json``; greedy longest-processing-time, so the lanes end close together).
   Each runs ``dvc --wait-for-lock repro --keep-going report@<slug>``: DVC decides what is stale,
   restores what its cache or run-cache holds, runs and records the rest, exactly as a serial run would.
   Its lines are tagged ``[<slug>]``; stage commands get ``OMP_NUM_THREADS`` = cores // jobs unless it
   is set (the committed runs used one intra-op thread per stage), and ``STAGES_MAX_WORKERS`` = cores // jobs
   caps the stages' process pools (``stages.common.jobs``; same results), so two lanes on two cores run two
   processes, not four.
2. A paper whose ``dvc repro`` fails stops only itself: its stage's ``error:`` line and DVC's
   ``failed to reproduce '<stage>@<slug>'`` line are repeated untagged for ``python -m stages
   repro-failures``. The other papers go on.
3. Finally ``dvc repro --keep-going`` runs over every paper that did not fail (``summary`` too when
   none failed): it finds them current and runs only what is left.
4. When every paper ran, ``flows.verdicts`` prints how many of the committed verdicts (git HEAD's
   ``reports/*/claims.json``) this run reproduced, the ones that moved, and the machine it ran on.

Ctrl-C or SIGTERM stops every lane's ``dvc repro`` (its stage removes its temporary outputs) and starts
no other. Two papers' stage times are measured while they share the cores.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Sequence

from flows.proc import ROOT, CommandFailed, dvc, run_streaming, tool_env
from flows.verdicts import summary_lines
from stages.common.config import ConfigError, read_params, registered_papers

def expected_runtime(root: Path, slug: str) -> float:
    """Seconds the paper's committed run took (sum of its stages); 0 when unknown."""
    try:
        runtime = json.loads((root / "reports" / slug / "metrics.json").read_text()).get("runtime_s") or {}
        return float(sum(v for v in runtime.values() if isinstance(v, (int, float))))
    except (OSError, ValueError, AttributeError):
        return 0.0


def longest_first(slugs: Iterable[str], expected: Callable[[str], float]) -> list[str]:
    """Papers in the order the workers take them: longest expected run first, ties by name."""
    return sorted(slugs, key=lambda s: (-expected(s), s))


class Printer:
    """Whole lines from several lanes, each tagged with its paper, never interleaved mid-line."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()

    def lines(self, *lines: str) -> None:
        with self._lock:
            try:
                for line in lines:
                    self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):   # the reader went away (`| tee` killed by Ctrl-C): keep going quietly
                pass


class _Tagged(logging.Logger):
    """run_streaming's logger: each output line to the printer, after ``[tag] `` (none: as DVC wrote it)."""

    def __init__(self, tag: str | None, printer: Printer):
        super().__init__(f"lane.{tag}")
        self.prefix, self.printer = (f"[{tag}] " if tag else ""), printer

    def info(self, msg, *args, **kwargs):  # run_streaming's one call
        self.printer.lines(self.prefix + (msg % args if args else msg))


class Commands:
    """The stage commands running now, so that an interrupt (Ctrl-C, SIGTERM) stops them all."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopped = threading.Event()

    def run(self, cmd: Sequence[str], root: Path, env: dict[str, str], printer: Printer, tag: str,
            hold: Callable[[str], bool] = lambda line: False) -> tuple[int, str]:
        """Run ``cmd`` in ``root`` (``run_streaming``), each output line to ``printer`` after ``[tag] `` (not
        the ``hold`` ones: only in the tail); returns (exit code, output tail)."""
        if self.stopped.is_set():
            return -15, "error: interrupted"
        started: list[subprocess.Popen] = []

        def register(proc: subprocess.Popen) -> None:
            with self._lock:
                self.running.add(proc)
                started.append(proc)
                if self.stopped.is_set():   # stop() ran while this one was starting
                    os.killpg(proc.pid, signal.SIGTERM)

        try:
            return 0, run_streaming(cmd, root, _Tagged(tag, printer), env=env, what=" ".join(cmd[2:]),
                                    drop=hold, on_start=register)
        except CommandFailed as err:
            return err.returncode, err.tail
        finally:
            with self._lock:
                self.running.difference_update(started)

    def stop(self) -> None:
        """SIGTERM to every running command's process group (stages remove their temporary outputs),
        SIGKILL to what is left 15 s later; no command starts after this."""
        with self._lock:
            self.stopped.set()
            running = list(self.running)
        for proc in running:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def run_paper(slug: str, root: Path, printer: Printer, commands: Commands, threads: int = 1) -> str | None:
    """``dvc --wait-for-lock repro --keep-going report@<slug>``; returns None, or its failure's error line."""
    env = tool_env()
    env.setdefault("OMP_NUM_THREADS", str(threads))   # the cores shared out among the lanes
    env.setdefault("STAGES_MAX_WORKERS", str(threads))  # and the pool processes (stages.common.jobs): no lane
    #                                                     starts more processes than its share of the cores
    cmd = dvc("--wait-for-lock", "repro", "--keep-going", f"report@{slug}")
    start = time.perf_counter()
    # DVC's failure line is printed once, untagged, after the error it follows (see below); without a
    # DVC remote its closing "Use `dvc push` ..." hint is noise
    code, tail = commands.run(cmd, root, env, printer, slug,
                              hold=lambda line: "failed to reproduce" in line or line.startswith("Use `dvc push`"))
    if commands.stopped.is_set():
        return "error: interrupted"
    if code == 0:
        printer.lines(f"[{slug}] dvc repro report@{slug}: done ({time.perf_counter() - start:.0f} s)")
        return None
    lines = tail.splitlines()
    ours = [line for line in lines if line.startswith("error: ")]   # the stage's own one-line error
    dvcs = [line for line in lines if "failed to reproduce" in line]
    error = ours[-1] if ours else f"error: dvc repro report@{slug} exited with {code}"
    # untagged and together, as a serial run prints them: what `python -m stages repro-failures` reads
    printer.lines(error, *(dvcs or [f"ERROR: failed to reproduce 'report@{slug}': exit status {code}"]))
    return error


def parallel_repro(root: Path, jobs: int, papers: Sequence[str] | None = None, printer: Printer | None = None,
                   final: bool = True) -> int:
    """Run the lanes, then ``dvc repro --keep-going`` over what did not fail; returns an exit status.
    Each lane's stage commands get (cores // jobs) intra-op threads and pool processes unless OMP_NUM_THREADS /
    STAGES_MAX_WORKERS are set."""
    printer = printer or Printer()
    slugs = list(papers) if papers is not None else registered_papers(read_params(root / "params.yaml"))
    failed: dict[str, str] = {}
    if jobs > 1 and slugs:
        order = longest_first(slugs, lambda s: expected_runtime(root, s))
        printer.lines(f"parallel repro: {len(order)} papers, {jobs} at a time, longest first: {', '.join(order)}")
        commands = Commands()
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="lane")
        threads = max(1, (os.cpu_count() or 1) // jobs)
        futures = [pool.submit(run_paper, s, root, printer, commands, threads) for s in order]
        try:
            results = {s: f.result() for s, f in zip(order, futures)}
        except BaseException:   # Ctrl-C / SIGTERM (or a bug): stop the running lanes first, start no other
            commands.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            printer.lines("parallel repro: interrupted; the running stages were stopped")
            raise
        pool.shutdown()
        failed = {s: why for s, why in results.items() if why is not None}
    if not final:
        return 1 if failed else 0
    targets: list[str] = []
    if failed:
        targets = [f"report@{s}" for s in slugs if s not in failed]
        printer.lines(f"parallel repro: {len(failed)} paper(s) failed ({', '.join(failed)}); "
                      "dvc repro runs the others only")
    elif papers is not None:
        targets = [f"report@{s}" for s in slugs]
    if failed and not targets:
        return 1
    cmd = dvc("repro", "--keep-going", *targets)
    printer.lines("$ dvc repro --keep-going" + "".join(f" {t}" for t in targets))
    try:
        run_streaming(cmd, root, _Tagged(None, printer), env=tool_env(), what="dvc repro",
                      drop=lambda line: line.startswith("Use `dvc push`"))
    except CommandFailed as err:   # its output is in the log already
        return err.returncode or 1
    if papers is None and not failed:   # every paper ran: how its verdicts compare with the committed ones
        printer.lines("", *summary_lines(root))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.parallel_repro", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="papers at a time (1: plain dvc repro)")
    parser.add_argument("--papers", nargs="*", default=None, help="a subset of the registered papers (no summary)")
    parser.add_argument("--root", default=str(ROOT), help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    if args.jobs < 1:
        print(f"error: --jobs: expected a positive number of papers at a time (got {args.jobs})", file=sys.stderr)
        return 2
    if args.papers is not None and not args.papers:
        print("error: --papers: name at least one paper (or leave --papers out for all)", file=sys.stderr)
        return 2
    try:
        known = registered_papers(read_params(root / "params.yaml"))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    unknown = sorted(set(args.papers or []) - set(known))
    if unknown:
        print(f"error: --papers: unknown paper {unknown[0]!r} (registered: {', '.join(known)})", file=sys.stderr)
        return 2
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # SIGTERM unwinds like Ctrl-C
    try:
        return parallel_repro(root, args.jobs, args.papers)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
