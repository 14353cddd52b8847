"""Subprocesses with streamed logs, bounded in time, killed with their whole process group."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]


class CommandFailed(RuntimeError):
    """A command exited non-zero (or ran past its time limit); carries the exit code and output tail."""

    def __init__(self, what: str, returncode: int, tail: str):
        self.returncode = returncode
        self.tail = tail
        lines = tail.strip().splitlines()
        ours = [line for line in lines if line.startswith("error: ")]  # the stage's own one-line error
        last = ours[-1] if ours else (lines[-1] if lines else "")
        super().__init__(f"{what} exited with {returncode}" + (f": {last}" if last else ""))


def tool_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for dvc / stage subprocesses: this interpreter's bin dir first on PATH, so
    DVC's ``python -m stages ...`` runs with the same venv; PAPERS_ROOT dropped (cwd decides)."""
    env = dict(os.environ)
    env.pop("PAPERS_ROOT", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("DVC_NO_ANALYTICS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def dvc(*args: str) -> list[str]:
    """The DVC command line, run with this interpreter (no reliance on a `dvc` on PATH)."""
    return [sys.executable, "-m", "dvc", *args]


def run_streaming(cmd: Sequence[str], cwd: Path, logger: logging.Logger | logging.LoggerAdapter | None = None,
                  timeout: float | None = None, env: dict[str, str] | None = None,
                  what: str | None = None, keep: int = 200, drop=None, on_start=None) -> str:
    """Run ``cmd`` in ``cwd``, sending each output line to ``logger`` as it comes.

    Returns the output tail; raises CommandFailed on a non-zero exit or when ``timeout`` passes
    (the process group is then killed). Progress bars' carriage returns become lines. ``drop(line)``:
    kept in the tail, not logged. ``on_start(proc)``: called with the started process (e.g. to register
    it with something that may stop it).
    """
    what = what or " ".join(cmd[2:4] if cmd[:2] == [sys.executable, "-m"] else cmd[:2])
    tail: deque[str] = deque(maxlen=keep)
    proc = subprocess.Popen(list(cmd), cwd=str(cwd), env=env or tool_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", start_new_session=True)

    throttle = ProgressThrottle()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # universal newlines: '\r' from progress bars splits lines too
            line = line.rstrip()
            if not line:
                continue
            tail.append(line)
            if drop is not None and drop(line):
                continue
            if logger is not None and throttle.keep(line):
                logger.info(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        if on_start is not None:
            on_start(proc)
        returncode = proc.wait(timeout=timeout)
    except BaseException:  # timeout, KeyboardInterrupt, Prefect cancellation: no orphans left behind
        _kill_group(proc)
        reader.join(timeout=5)
        if isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
            raise CommandFailed(f"{what} (timed out after {timeout:.0f} s)", -9, "\n".join(tail)) from None
        raise
    reader.join(timeout=10)
    if returncode != 0:
        raise CommandFailed(what, returncode, "\n".join(tail))
    return "\n".join(tail)


class ProgressThrottle:
    """Progress-bar refreshes (tqdm / Lightning / rich: a percentage or an 'n/N' counter with a rate)
    reach the log at most every ``every_s`` seconds and always at 100%; other lines pass through."""

    _BAR = __import__("re").compile(r"(\d{1,3}%\|)|(\d+/\d+ \[)|(it/s\]|s/it\])")

    def __init__(self, every_s: float = 15.0, clock=None):
        import time

        self.every_s = every_s
        self.clock = clock or time.monotonic
        self.last = -float("inf")

    def keep(self, line: str) -> bool:
        if not self._BAR.search(line):
            return True
        now = self.clock()
        if "100%" in line or now - self.last >= self.every_s:
            self.last = now
            return True
        return False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
