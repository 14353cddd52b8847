"""A one-machine stand-in for a cluster: a real ``prefect server start`` on loopback, process
workers (each its own OS process, polling its own work queue) and local-folder DVC remotes.

Every wait is bounded; ``close()`` ends only the processes started here.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.serve import start_server, stop_server

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _tree(pid: int) -> list:
    import psutil

    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process and all its descendants (as a machine losing power would)."""
    import psutil

    procs = _tree(pid)
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=20)


class Cluster:
    def __init__(self, workdir: Path, heartbeat_s: int = 30):
        self.workdir = Path(workdir)
        self.home = self.workdir / "prefect-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.server, self.api = start_server(log_path=self.workdir / "server.log", home=self.home,
                                            extra_env={"PREFECT_UI_ENABLED": "false"})
        self.workers: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ)
        for key in [k for k in self.env if k.startswith("PREFECT_")]:
            self.env.pop(key)
        self.env.update(
            PREFECT_API_URL=self.api, PREFECT_HOME=str(self.home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_HEARTBEAT_SECONDS="10",
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY=str(heartbeat_s), WANDB_MODE="disabled",
            PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
        self.env.pop("PAPERS_ROOT", None)
        # flow runs' temporary checkouts (a killed worker cannot clean its own) stay under workdir
        (self.workdir / "tmp").mkdir(exist_ok=True)
        self.env["TMPDIR"] = str(self.workdir / "tmp")

    @contextmanager
    def api_settings(self):
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api}):
            yield

    def start_worker(self, name: str, pool: str, queue: str) -> subprocess.Popen:
        log = open(self.workdir / f"worker-{name}.log", "ab")
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool", pool, "--type", "process",
             "--work-queue", queue, "--name", name],
            cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.workers[name] = proc
        return proc

    def kill_worker(self, name: str) -> None:
        kill_tree(self.workers.pop(name).pid, signal.SIGKILL)

    def wait_run(self, run_id, timeout: float = 600, until=TERMINAL) -> Any:
        from prefect.client.orchestration import get_client

        deadline = time.monotonic() + timeout
        with get_client(sync_client=True) as client:
            while True:
                run = client.read_flow_run(run_id)
                if run.state and run.state.type.value in until:
                    return run
                if time.monotonic() > deadline:
                    raise TimeoutError(f"flow run {run.name}: still {run.state and run.state.name} after {timeout:.0f} s\n"
                                       + self.logs())
                time.sleep(1.0)

    def wait_task_running(self, run_id, task_name: str, timeout: float = 300) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        deadline = time.monotonic() + timeout
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
                if any(t.name == task_name and t.state and t.state.type.value == "RUNNING" for t in tasks):
                    return
                run = client.read_flow_run(run_id)
                if run.state and run.state.type.value in TERMINAL:
                    raise AssertionError(f"flow run ended ({run.state.name}) before {task_name} ran\n" + self.logs())
                time.sleep(0.5)
        raise TimeoutError(f"task {task_name} not running after {timeout:.0f} s\n" + self.logs())

    def artifacts(self, run_id) -> dict[str, Any]:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        with get_client(sync_client=True) as client:
            arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
        out = {}
        for art in arts:
            data = art.data
            out[art.key] = json.loads(data) if art.type == "table" and isinstance(data, str) else data
        return out

    def logs(self, tail: int = 60) -> str:
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def close(self) -> None:
        for name in list(self.workers):
            kill_tree(self.workers.pop(name).pid, signal.SIGTERM)
        stop_server(self.server)


def stage_rows(table: Any) -> dict[str, dict[str, Any]]:
    """The per-stage rows of a paper flow's claims table artifact: {stage: {dvc, runtime_s}}."""
    rows = table if isinstance(table, list) else []
    return {r["name"].removeprefix("stage "): {"dvc": r["verdict"].removeprefix("dvc: "), "runtime_s": r["runtime_s"]}
            for r in rows if r.get("kind") == "stage"}


def remote_run_cache_cmds(remote: Path) -> list[str]:
    """The stage commands of every run-cache entry in a local DVC remote (DVC's own files)."""
    import yaml

    cmds = []
    for entry in sorted((Path(remote) / "runs").rglob("*")):
        if entry.is_file():
            cmds.append(yaml.safe_load(entry.read_text())["cmd"])
    return cmds
