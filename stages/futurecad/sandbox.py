"""The CAD sandbox: scripts run in worker processes, never in the stage's own process.

A script that makes the CAD kernel crash (a native segfault cannot be caught in-process) or hang kills
only its worker: the request is recorded as a failed script and a fresh worker takes the next one.

Workers are plain ``python -m stages.futurecad.sandbox --worker`` processes (no multiprocessing spawn
machinery and no resource tracker) talking over a socket pair with pickled messages. They die with the
stage: each sets ``PR_SET_PDEATHSIG(SIGKILL)`` (Linux, through ctypes) and checks that its parent is
still the stage, and a watchdog thread exits when the parent pid changes (other platforms). Every worker
is recorded in ``$TMPDIR/papers-futurecad-<uid>/<stage pid>.json``; a new sandbox first kills the
workers recorded by stages that no longer run (SIGKILLed before they could clean up). ``close()`` (also
on SIGTERM/SIGINT, which the dispatcher turns into an exception) kills the workers at once.

Requests are routed to a worker by the script's part (the calls before its first ``edges(...)``), so
each worker's cache (``cad.run_script(cache=...)``) builds a part and grounds a query once.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import OrderedDict
from multiprocessing.connection import Connection, wait
from pathlib import Path

PR_SET_PDEATHSIG = 1
REPO = Path(__file__).resolve().parents[2]          # the code (the data root may be elsewhere: PAPERS_ROOT)


class LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


# ----------------------------------------------------------------------------------------------
# process bookkeeping
# ----------------------------------------------------------------------------------------------
def registry_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"papers-futurecad-{os.getuid()}"


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22); None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, ticks: int | None) -> bool:
    now = start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def reap_stale(directory: Path | None = None) -> list[int]:
    """Kill workers recorded by stage processes that no longer run; returns the pids killed."""
    directory = directory or registry_dir()
    killed = []
    for rec in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = json.loads(rec.read_text())
            parent, pticks = int(data["parent"]), data.get("parent_ticks")
            workers = {int(k): v for k, v in data.get("workers", {}).items()}
        except (OSError, ValueError, KeyError, TypeError):
            rec.unlink(missing_ok=True)
            continue
        if _alive(parent, pticks):
            continue                                          # its stage still runs: leave it alone
        for pid, ticks in workers.items():
            if _alive(pid, ticks):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        rec.unlink(missing_ok=True)
    return killed


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# ----------------------------------------------------------------------------------------------
# the worker
# ----------------------------------------------------------------------------------------------
def _execute(text: str, state: dict, target_brep: bytes | None, n_points: int) -> dict:
    import io

    from stages.futurecad import cad

    try:
        solid = cad.run_script(text, state.get("grounder"), cache=state["cache"]).solid
        out = {"ok": True, "error": "", "points": cad.surface_points(solid, n_points), "iou": None}
        if target_brep:
            import cadquery as cq

            target = cq.Shape.importBrep(io.BytesIO(target_brep))
            out["iou"] = cad.volume_iou(solid, target)
        return out
    except cad.ScriptError as err:
        return {"ok": False, "error": str(err)}
    except Exception as err:  # anything else the kernel throws is a failed script, not a failed run
        return {"ok": False, "error": f"execution failed: {type(err).__name__}"}


def worker_main(fd: int, parent: int, n_points: int, cache_size: int) -> int:
    _set_pdeathsig()
    if os.getppid() != parent:                                # the stage died before prctl took effect
        return 1

    def watchdog():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watchdog, daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)              # the stage decides; Ctrl-C goes to the group
    import torch

    torch.set_num_threads(1)
    conn = Connection(fd)
    state: dict = {"cache": LRU(cache_size)}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        kind = msg[0]
        if kind == "quit":
            return 0
        if kind == "grounder":
            state["grounder"] = _load_grounder(msg[1])
            state["cache"] = LRU(cache_size)
            conn.send(("ok",))
        elif kind == "run":
            _, text, target_brep = msg
            conn.send(("result", _execute(text, state, target_brep, n_points)))


def _load_grounder(spec):
    """spec: ("oracle",) | ("model", checkpoint path) | ("callable", module:function) (tests)."""
    if spec is None:
        return None
    if spec[0] == "oracle":
        from stages.futurecad.prepare import oracle_grounder

        return oracle_grounder
    if spec[0] == "model":
        from stages.futurecad.infer import ModelGrounder, load_ground

        return ModelGrounder(*load_ground(spec[1]))
    mod, _, fn = spec[1].partition(":")
    import importlib

    return getattr(importlib.import_module(mod), fn)


# ----------------------------------------------------------------------------------------------
# the parent side
# ----------------------------------------------------------------------------------------------
class _Worker:
    def __init__(self, n_points: int, cache_size: int, registry: Path):
        parent_sock, child_sock = socket.socketpair()
        fd = child_sock.fileno()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stages.futurecad.sandbox", "--worker", "--fd", str(fd), "--parent",
             str(os.getpid()), "--points", str(n_points), "--cache", str(cache_size)],
            pass_fds=(fd,), env=env, cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.ticks = start_ticks(self.proc.pid)
        self.busy: tuple | None = None
        self._killed = False
        self._lock = threading.Lock()

    def kill(self) -> None:
        """Kill and reap the process, close the connection; once, whichever thread calls it (close() and a
        prefetch thread that sees the worker die may both do)."""
        with self._lock:
            if self._killed:
                return
            self._killed = True
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        try:
            self.conn.close()
        except OSError:
            pass


class CadSandbox:
    """Executes scripts in ``workers`` worker processes; results cached by script text.

    ``run_many(texts, targets)`` returns, per text, ``{"ok", "error", "points", "iou"}`` (``iou`` against the
    target BREP when one is given). ``set_grounder(spec)`` (see ``_load_grounder``) sets how ``Query(...)``
    operands are grounded in every worker.
    """

    _count = 0                                            # sandboxes made by this process (record file names)

    def __init__(self, n_points: int, workers: int = 2, cache_size: int = 2048, timeout_s: float = 120.0):
        self.n_points, self.n_workers, self.cache_size, self.timeout_s = n_points, workers, cache_size, timeout_s
        self.registry = registry_dir()
        self.registry.mkdir(parents=True, exist_ok=True)
        CadSandbox._count += 1
        self.record = self.registry / (f"{os.getpid()}.json" if CadSandbox._count == 1
                                       else f"{os.getpid()}-{CadSandbox._count}.json")
        self.reaped = reap_stale(self.registry)
        self.workers: list[_Worker | None] = [None] * workers
        self.grounder = None
        self.results: dict[tuple, dict] = {}
        self.crashes = 0
        self.executed = 0
        self.requested = 0
        self.wall_s = 0.0
        self.closed = False
        self.prefetching: Prefetch | None = None
        self._spawn_lock = threading.Lock()               # close() against a prefetch thread starting a worker
        for i in range(workers):                      # start now: their imports overlap the stage's own work
            self._worker(i)

    # bookkeeping ---------------------------------------------------------------------------
    def _write_record(self) -> None:
        data = {"parent": os.getpid(), "parent_ticks": start_ticks(os.getpid()),
                "workers": {str(w.proc.pid): w.ticks for w in self.workers if w is not None}}
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.record)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w is not None]

    def _worker(self, i: int) -> _Worker:
        with self._spawn_lock:
            if self.closed:                               # a prefetch thread must not respawn after close()
                raise RuntimeError("sandbox is closed")
            if self.workers[i] is None:
                w = _Worker(self.n_points, self.cache_size, self.registry)
                self.workers[i] = w
                self._write_record()
                fresh = True
            else:
                fresh = False
        if fresh:
            if self.grounder is not None:
                w.conn.send(("grounder", self.grounder))
                self._expect(i, "ok")
        return self.workers[i]

    def _restart(self, i: int) -> None:
        w = self.workers[i]
        if w is not None:
            w.kill()
        self.workers[i] = None
        self.crashes += 1

    def _expect(self, i: int, kind: str):
        w = self.workers[i]
        if not w.conn.poll(self.timeout_s):
            raise RuntimeError("sandbox worker did not answer")
        msg = w.conn.recv()
        if msg[0] != kind:
            raise RuntimeError(f"sandbox worker: unexpected message {msg[0]!r}")
        return msg

    def set_grounder(self, spec) -> None:
        self._not_prefetching("set_grounder")
        self.grounder = spec
        self.results = {k: v for k, v in self.results.items() if not _uses_query(k[0])}
        for i in range(self.n_workers):
            w = self._worker(i)
            w.conn.send(("grounder", spec))
            try:
                self._expect(i, "ok")
            except (EOFError, OSError, RuntimeError):
                self._restart(i)
                self._worker(i)

    # execution -----------------------------------------------------------------------------
    def run_many(self, texts: list[str], target_breps: list[bytes | None] | None = None) -> list[dict]:
        self._not_prefetching("run_many")
        t0 = time.perf_counter()
        keys = self._execute(texts, target_breps)
        self.wall_s += time.perf_counter() - t0
        self.requested += len(texts)
        return [self.results[k] for k in keys]

    def prefetch(self, texts: list[str], target_breps: list[bytes | None] | None = None) -> "Prefetch":
        """Start executing ``texts`` on the workers from a background thread and return at once, so that the
        caller's own work overlaps the CAD kernel's. ``wait()`` on the returned handle blocks until they are
        done (its wait counts in ``wall_s``; the thread's error, if any, is raised there); later ``run_many``
        calls on these texts are then answered from the cache, each result the one ``run_many`` would have
        computed (a script's result depends on its text, target and the grounder only). Until ``wait()``
        returns, ``run_many``, ``set_grounder`` and another ``prefetch`` are refused: one thread drives the
        workers."""
        self._not_prefetching("prefetch")
        self.prefetching = Prefetch(self, list(texts), list(target_breps) if target_breps else None)
        return self.prefetching

    def _not_prefetching(self, what: str) -> None:
        if self.prefetching is not None:
            raise RuntimeError(f"sandbox.{what}: a prefetch is running; wait() on it first")

    def _execute(self, texts: list[str], target_breps: list[bytes | None] | None) -> list[tuple]:
        """Run every text not in the cache (each distinct one once); returns the cache key of each text."""
        from stages.futurecad import cad

        target_breps = target_breps or [None] * len(texts)
        keys = []
        todo: dict[int, list[tuple]] = {i: [] for i in range(self.n_workers)}
        queued = set()
        for text, brep in zip(texts, target_breps):
            key = (" ".join(text.split()), brep)
            keys.append(key)
            if key in self.results or key in queued:
                continue
            try:
                calls = cad.parse_script(key[0])
            except cad.ScriptError as err:                   # refused before it reaches a worker
                self.results[key] = {"ok": False, "error": str(err)}
                continue
            first = next((k for k, c in enumerate(calls) if c.name == "edges"), len(calls))
            route = zlib.crc32(repr(calls[:first]).encode()) % self.n_workers
            todo[route].append(key)
            queued.add(key)
        self._drain(todo)
        return keys

    def _drain(self, todo: dict[int, list[tuple]]) -> None:
        started: dict[int, float] = {}
        while any(todo.values()) or any(self.workers[i] is not None and self.workers[i].busy for i in todo):
            for i, queue in todo.items():
                w = self._worker(i)
                if w.busy is None and queue:
                    key = queue.pop(0)
                    w.busy = key
                    started[i] = time.monotonic()
                    try:
                        w.conn.send(("run", key[0], key[1]))
                    except OSError:
                        self._fail(i, key, "CAD kernel crashed (sandbox worker died)")
            busy = {self.workers[i].conn: i for i in todo if self.workers[i] is not None and self.workers[i].busy}
            if not busy:
                continue
            ready = wait(list(busy), timeout=1.0)
            for conn in ready:
                i = busy[conn]
                key = self.workers[i].busy
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self._fail(i, key, "CAD kernel crashed (sandbox worker died)")
                    continue
                self.results[key] = msg[1]
                self.executed += 1
                self.workers[i].busy = None
            now = time.monotonic()
            for i in list(busy.values()):
                w = self.workers[i]
                if w is not None and w.busy is not None and now - started[i] > self.timeout_s:
                    self._fail(i, w.busy, f"script ran longer than {self.timeout_s:g} s (sandbox worker killed)")

    def _fail(self, i: int, key, message: str) -> None:
        self.results[key] = {"ok": False, "error": message}
        self._restart(i)

    def close(self) -> None:
        """Kill every worker now (no waiting for running scripts) and drop the record. A running prefetch thread
        stops at its next step (it cannot start workers on a closed sandbox) and is joined here."""
        with self._spawn_lock:
            self.closed = True
        for i, w in enumerate(self.workers):
            if w is not None:
                w.kill()
                self.workers[i] = None
        if self.prefetching is not None and self.prefetching.thread is not threading.current_thread():
            self.prefetching.thread.join(timeout=10.0)
        self.record.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Prefetch:
    """A batch of scripts executing in a background (daemon) thread; see ``CadSandbox.prefetch``."""

    def __init__(self, sandbox: CadSandbox, texts: list[str], target_breps: list[bytes | None] | None):
        self.sandbox, self.error = sandbox, None
        self.thread = threading.Thread(target=self._run, args=(texts, target_breps), daemon=True,
                                       name="cad-prefetch")
        self.thread.start()

    def _run(self, texts, target_breps) -> None:
        try:
            self.sandbox._execute(texts, target_breps)
        except BaseException as err:                   # handed to the caller by wait()
            self.error = err

    def wait(self) -> None:
        t0 = time.perf_counter()
        self.thread.join()
        self.sandbox.wall_s += time.perf_counter() - t0
        self.sandbox.prefetching = None
        if self.error is not None:
            raise RuntimeError(f"sandbox prefetch failed: {self.error}") from self.error


def exit_fast_when_interrupted(err: BaseException) -> None:
    """After SIGTERM/SIGINT (the dispatcher's StageInterrupted) the stage has cleaned up (workers killed, temp
    output removed by the runner); finalising an interpreter that holds torch, Lightning and OCC then takes
    seconds (12 s measured on the shared machine). Skip it: the process exits with the dispatcher's code as
    soon as the dispatcher returns."""
    if type(err).__name__ != "StageInterrupted":
        return
    import atexit

    code = 130 if "SIGINT" in str(err) else 143

    def _exit():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    atexit.register(_exit)


def _uses_query(text: str) -> bool:
    return "Query" in text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.futurecad.sandbox")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--points", type=int, required=True)
    ap.add_argument("--cache", type=int, default=2048)
    args = ap.parse_args(argv)
    return worker_main(args.fd, args.parent, args.points, args.cache)


if __name__ == "__main__":
    sys.exit(main())
