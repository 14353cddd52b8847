"""One real `prefect server start` on loopback: `python -m flows.serve` serves a paper's deployment,
a run triggered through the API completes and publishes its artifacts."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from flowkit import SLUG
from flowkit_cluster import kill_tree
from flows.paper_flow import STAGES, artifact_key, compact_verdicts, embed_figures

pytestmark = pytest.mark.slow


def wait_deployment(name: str, timeout: float, proc: subprocess.Popen, log) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"flows.serve exited with {proc.returncode}:\n{log.read_text()}"
            try:
                client.read_deployment_by_name(name)
                return
            except ObjectNotFound:
                time.sleep(1)
    raise TimeoutError(f"deployment {name} not served within {timeout:.0f} s:\n{log.read_text()}")


def test_served_deployment_runs_through_the_api(cluster, smoke_flow, tmp_path):
    from prefect.deployments import run_deployment

    state, computed = smoke_flow
    assert state.is_completed(), state.message
    repo = tmp_path / "served"
    shutil.copytree(computed, repo, symlinks=True)  # already computed: DVC finds nothing to rerun
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.serve", "--papers", SLUG, "--cron", "0 3 * * *"],
                                cwd=repo, env=cluster.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        with cluster.api_settings():
            wait_deployment(f"paper/{SLUG}", 120, proc, log)
            run = run_deployment(f"paper/{SLUG}", timeout=0)
            run = cluster.wait_run(run.id, timeout=600)
            assert run.state.is_completed(), f"{run.state.name}: {run.state.message}\n{log.read_text()}"
            arts = cluster.artifacts(run.id)
    finally:
        kill_tree(proc.pid)
    report_dir = repo / "reports" / SLUG
    assert arts[artifact_key(SLUG, "report")] == embed_figures(compact_verdicts((report_dir / "report.md").read_text()),
                                                               report_dir)
    rows = arts[artifact_key(SLUG, "claims")]
    stages = {r["name"].removeprefix("stage "): r["verdict"] for r in rows if r["kind"] == "stage"}
    assert stages == {s: "dvc: unchanged" for s in STAGES}
    metrics = json.loads((repo / "reports" / SLUG / "metrics.json").read_text())
    assert {r["name"]: r["verdict"] for r in rows if r["kind"] == "claim"} == \
        {c["name"]: c["verdict"] for c in metrics["claims"]}
