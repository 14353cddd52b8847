"""Interruption (issue 40): the CAD sandbox's workers die with the process that started them (SIGKILL
included), stale workers recorded by a dead stage are reaped by the next sandbox, and SIGTERM ends the
train stage within 5 s leaving no worker and no output behind. Waits are bounded polls of process state."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from stages.futurecad import sandbox


def _wait_gone(pids, limit=30.0) -> list[int]:
    end = time.monotonic() + limit
    alive = list(pids)
    while alive and time.monotonic() < end:
        alive = [p for p in alive if sandbox.start_ticks(p) is not None and not _zombie(p)]
        time.sleep(0.1)
    return alive


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def test_sigkilled_owner_leaves_no_worker(tmp_path):
    """A process holding a CadSandbox is SIGKILLed: its workers (and anything else it started) die too."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from stages.futurecad.sandbox import CadSandbox
        sb = CadSandbox(16, workers=2)
        print(" ".join(map(str, sb.pids())), flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(sandbox.REPO)))
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(sandbox.start_ticks(p) is not None for p in pids)
    family = _descendants(proc.pid)
    assert set(pids) <= family
    record = sandbox.registry_dir() / f"{proc.pid}.json"
    assert {int(k) for k in json.loads(record.read_text())["workers"]} == set(pids)
    proc.kill()
    proc.wait()
    assert _wait_gone(family) == []
    # the next sandbox drops the dead owner's record
    sandbox.reap_stale()
    assert not record.exists()


def test_next_sandbox_reaps_stale_workers(tmp_path):
    """A worker that outlived its stage (recorded, parent gone) is killed by the next reap; a live owner's
    workers are left alone."""
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    dead_parent = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_parent.wait()
    d = tmp_path / "reg"
    d.mkdir()
    (d / f"{dead_parent.pid}.json").write_text(json.dumps(
        {"parent": dead_parent.pid, "parent_ticks": None, "workers": {str(stray.pid): sandbox.start_ticks(stray.pid)}}))
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (d / "live.json").write_text(json.dumps(
        {"parent": os.getpid(), "parent_ticks": sandbox.start_ticks(os.getpid()),
         "workers": {str(keeper.pid): sandbox.start_ticks(keeper.pid)}}))
    try:
        killed = sandbox.reap_stale(d)
        assert killed == [stray.pid]
        stray.wait(timeout=30)
        assert keeper.poll() is None                         # owner alive (this process): untouched
        assert not (d / f"{dead_parent.pid}.json").exists()
    finally:
        keeper.kill()
        stray.kill()
        keeper.wait()


def test_sandbox_worker_refuses_orphanhood(tmp_path):
    """A worker whose recorded parent is not its parent exits at once (the stage died before prctl)."""
    import socket

    a, b = socket.socketpair()
    proc = subprocess.run([sys.executable, "-m", "stages.futurecad.sandbox", "--worker", "--fd", str(b.fileno()),
                           "--parent", "1", "--points", "8"], pass_fds=(b.fileno(),), timeout=120)
    assert proc.returncode == 1


def test_sigterm_ends_train_stage_quickly(smoke_run):
    """SIGTERM during `python -m stages train futurecad` ends it within 5 s: workers killed, no output."""
    smoke_run("futurecad", stages=("prepare",))
    root = smoke_run.root
    repo = sandbox.REPO
    (root / "params.yaml").write_text((repo / "params.yaml").read_text())
    env = dict(os.environ, PAPERS_ROOT=str(root), WANDB_MODE="disabled",
               PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "stages", "train", "futurecad", "--profile", "smoke"], env=env,
                            cwd=str(repo), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    record = sandbox.registry_dir() / f"{proc.pid}.json"
    end = time.monotonic() + 300
    while not record.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    workers = [int(k) for k in json.loads(record.read_text())["workers"]]
    family = _descendants(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("train futurecad did not end within 5 s of SIGTERM")
    assert time.monotonic() - t0 < 5
    assert proc.returncode != 0
    assert _wait_gone(set(workers) | family) == []
    assert not record.exists()
    assert not (root / "data" / "futurecad" / "train").exists()
    assert not list((root / "data" / "futurecad").glob(".train.tmp-*"))
