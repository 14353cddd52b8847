"""``make repro`` on N cores: the stale papers' stages N papers at a time, recorded by DVC, then ``dvc repro``.

    python -m flows.parallel_repro --jobs 2          # what `make repro` runs (REPRO_JOBS=2)
    python -m flows.parallel_repro --jobs 1          # plain `dvc repro --keep-going`

``dvc repro`` holds the repository lock for its whole run, so one checkout reproduces one stage at a
time, and most stages here are single-threaded: on 2 cores the serial run leaves a core idle. This
driver keeps DVC as the judge of what is stale and the recorder of what ran, and only lets two papers'
commands run at once (the papers' pipelines share no files; each reads its own ``data/<slug>``):

1. ``jobs`` worker threads take papers longest first (the committed ``runtime_s`` in
   ``reports/<slug>/metrics.json``; greedy longest-processing-time, so the lanes end close together).
2. For each stage of its paper, in pipeline order, a worker asks DVC, under a lock held by this driver
   only, whether the stage changed (``Stage.changed``: what ``dvc repro`` and ``dvc status`` test), and if
   so removes its outputs (``Stage.remove_outs``, what ``dvc repro`` does first), then runs the stage's
   own ``cmd`` from dvc.yaml with DVC's environment (``DVC_ROOT``, ``DVC_STAGE``; ``OMP_NUM_THREADS`` =
   cores // jobs unless set: the committed runs used one thread per stage) and no lock held,
   then records it (hash the outputs, store them in the cache with a run-cache entry, write the stage's
   dvc.lock entry: what ``dvc repro`` does after the command). A stage that is
   current is skipped, so an unchanged upstream output leaves its downstream stages alone, as in DVC.
3. A failing stage stops its paper (its later stages stay stale); its one-line error is printed in
   ``dvc repro``'s words (``failed to reproduce '<stage>@<slug>'``) for ``python -m stages
   repro-failures``. The other papers go on.
4. Finally ``dvc repro --keep-going`` runs over every paper that did not fail (``summary`` too when none
   failed): DVC finds the recorded stages current and runs only what is left. A failed paper is not
   retried (its error is already in the log).

Each step calls the DVC method ``dvc repro`` calls for it (``Stage.changed``, ``Stage.remove_outs``,
``Stage.save`` with its run-cache entry, ``Stage.commit``, ``Stage.dump``). The difference: two papers'
stage times are measured while they share the cores.
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
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Sequence

from flows.proc import ROOT, CommandFailed, ProgressThrottle, _kill_group, dvc, run_streaming, tool_env

PIPELINE = ("prepare", "train", "evaluate", "report")


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
            for line in lines:
                self.stream.write(line + "\n")
            self.stream.flush()


class _Tagged(logging.Logger):
    """run_streaming's logger: each output line to the printer, after ``[tag] `` (none: as DVC wrote it)."""

    def __init__(self, tag: str | None, printer: Printer):
        super().__init__(f"lane.{tag}")
        self.prefix, self.printer = (f"[{tag}] " if tag else ""), printer

    def info(self, msg, *args, **kwargs):  # run_streaming's one call
        self.printer.lines(self.prefix + (msg % args if args else msg))


class DvcRecorder:
    """DVC's view of the checkout, one caller at a time (the workers' commands run outside this lock).

    The pipeline is collected once (DVC's index: dvc.yaml with its foreach over params, ~2 s here);
    each stage object holds its dvc.lock entry as read then. Only this driver writes dvc.lock, and a
    stage's own entry only after that stage ran, so each check sees what ``dvc repro`` would see.
    """

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._repo = None
        self._stages: dict = {}

    def _stage(self, target: str):
        from dvc.repo import Repo, lock_repo

        if self._repo is None:
            self._repo = Repo(str(self.root))
            with lock_repo(self._repo):
                self._stages = {stage.addressing: stage for stage in self._repo.index.stages}
        if target not in self._stages:
            raise KeyError(f"{target}: no such stage in dvc.yaml")
        return self._stages[target]

    def prepare(self, target: str) -> str | None:
        """The stage's command when DVC says the stage changed (its outputs then removed), else None:
        ``Stage.changed`` (cmd/params, deps, outs against the stage's dvc.lock entry) and
        ``Stage.remove_outs``, what ``dvc repro`` does before it runs a stage."""
        from dvc.repo import lock_repo

        with self._lock:
            stage = self._stage(target)
            with lock_repo(self._repo):
                if not stage.changed():
                    return None
                stage.remove_outs(ignore_remove=False, force=False)
            return stage.cmd

    def commit(self, target: str) -> None:
        """What ``dvc repro`` does after a stage's command: hash and cache the outputs (with a run-cache
        entry unless an output is uncached), then write the stage's dvc.lock entry."""
        from dvc.repo import lock_repo

        with self._lock:
            stage = self._stage(target)
            with lock_repo(self._repo):
                uncached = any(not out.use_cache for out in stage.outs if not (out.is_metric or out.is_plot))
                stage.save(run_cache=not uncached)
                stage.commit()
                stage.dump(update_pipeline=False)

    def close(self) -> None:
        with self._lock:
            if self._repo is not None:
                self._repo.close()
                self._repo = None


class Commands:
    """The stage commands running now, so that an interrupt (Ctrl-C, SIGTERM) stops them all."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopped = threading.Event()

    def run(self, cmd: str, root: Path, env: dict[str, str], printer: Printer, tag: str) -> tuple[int, str]:
        """Run ``cmd`` (bash) in ``root``, each output line to ``printer`` after ``[tag] ``; (exit code, tail)."""
        with self._lock:
            if self.stopped.is_set():
                return -15, "error: interrupted"
            proc = subprocess.Popen(["bash", "-c", cmd], cwd=str(root), env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                    errors="replace", start_new_session=True)
            self.running.add(proc)
        tail: deque[str] = deque(maxlen=200)
        throttle = ProgressThrottle()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:   # universal newlines: progress bars' '\r' splits lines too
                line = line.rstrip()
                if line:
                    tail.append(line)
                    if throttle.keep(line):
                        printer.lines(f"[{tag}] {line}")
            return proc.wait(), "\n".join(tail)
        finally:
            with self._lock:
                self.running.discard(proc)

    def stop(self) -> None:
        with self._lock:
            self.stopped.set()
            running = list(self.running)
        for proc in running:   # SIGTERM (stages remove their temporary outputs), SIGKILL after 10 s
            _kill_group(proc)


def run_paper(slug: str, root: Path, recorder: DvcRecorder, printer: Printer, commands: Commands,
              stages: Sequence[str] = PIPELINE, threads: int = 1) -> str | None:
    """Reproduce one paper's stale stages in order; returns None, or the failed stage's error line.
    Stage commands get ``OMP_NUM_THREADS=threads`` (torch's intra-op threads) unless it is set already."""
    for stage in stages:
        if commands.stopped.is_set():
            return "error: interrupted"
        target = f"{stage}@{slug}"
        try:
            cmd = recorder.prepare(target)
        except Exception as err:  # noqa: BLE001 - a DVC error about this paper stops this paper only
            return _failed(printer, target, f"error: {type(err).__name__}: {err}")
        if cmd is None:
            printer.lines(f"[{slug}] Stage '{target}' didn't change, skipping")
            continue
        printer.lines(f"[{slug}] Running stage '{target}':", f"[{slug}] > {cmd}")
        env = tool_env({"DVC_ROOT": str(root), "DVC_STAGE": target})   # what DVC gives a stage command
        env.setdefault("OMP_NUM_THREADS", str(threads))   # the cores shared out among the lanes
        start = time.perf_counter()
        code, tail = commands.run(cmd, root, env, printer, slug)
        if code != 0:
            ours = [line for line in tail.splitlines() if line.startswith("error: ")]
            last = tail.splitlines()[-1] if tail else ""
            return _failed(printer, target, ours[-1] if ours else f"error: {cmd} exited with {code}: {last}")
        try:
            recorder.commit(target)
        except Exception as err:  # noqa: BLE001
            return _failed(printer, target, f"error: {type(err).__name__}: {err}")
        printer.lines(f"[{slug}] Stage '{target}' ran and was recorded in dvc.lock ({time.perf_counter() - start:.0f} s)")
    return None


def _failed(printer: Printer, target: str, error_line: str) -> str:
    # the two lines `python -m stages repro-failures` reads: the stage's error, then DVC's failure line
    printer.lines(error_line, f"ERROR: failed to reproduce '{target}': {error_line.removeprefix('error: ')}")
    return error_line


def registered_papers(root: Path) -> list[str]:
    import yaml

    return list((yaml.safe_load((root / "params.yaml").read_text()) or {}).get("papers") or {})


def parallel_repro(root: Path, jobs: int, papers: Sequence[str] | None = None, printer: Printer | None = None,
                   final: bool = True) -> int:
    """Run the lanes, then ``dvc repro --keep-going`` over what did not fail; returns an exit status.
    Each lane's stage commands get (cores // jobs) intra-op threads unless OMP_NUM_THREADS is set."""
    printer = printer or Printer()
    cwd = os.getcwd()
    os.chdir(root)   # DVC resolves stage targets and paths against the working directory
    try:
        return _parallel_repro(root, jobs, papers, printer, final)
    finally:
        os.chdir(cwd)


def _parallel_repro(root: Path, jobs: int, papers: Sequence[str] | None, printer: Printer, final: bool) -> int:
    slugs = list(papers) if papers is not None else registered_papers(root)
    failed: dict[str, str] = {}
    if jobs > 1 and slugs:
        order = longest_first(slugs, lambda s: expected_runtime(root, s))
        printer.lines(f"parallel repro: {len(order)} papers, {jobs} at a time, longest first: {', '.join(order)}")
        recorder, commands = DvcRecorder(root), Commands()
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="lane")
        threads = max(1, (os.cpu_count() or 1) // jobs)
        futures = [pool.submit(run_paper, s, root, recorder, printer, commands, PIPELINE, threads) for s in order]
        try:
            results = {s: f.result() for s, f in zip(order, futures)}
        except BaseException:   # Ctrl-C / SIGTERM: stop the running stage commands, start no other
            printer.lines("parallel repro: interrupted; stopping the running stages")
            commands.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()
        recorder.close()   # the final dvc repro opens the repository itself
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
    known = registered_papers(root)
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
