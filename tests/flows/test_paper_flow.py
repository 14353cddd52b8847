"""The paper flow under the session-wide Prefect harness, on a smoke-profile copy of the repo."""
from __future__ import annotations

import json

import pytest
import yaml

from flows.paper_flow import STAGES, artifact_key, paper_flow

from flowkit import SLUG

pytestmark = pytest.mark.slow


def read_artifacts(run_id) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    return {a.key: a for a in arts}


def task_runs(run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))


def test_paper_flow_runs_stages_and_publishes_artifacts(prefect_harness, smoke_flow):
    state, paper_repo = smoke_flow
    assert state.is_completed(), state.message
    result = state.result()
    assert result["stages"] == {s: "ran" for s in STAGES}  # DVC's own "Running stage" lines
    metrics = json.loads((paper_repo / "reports" / SLUG / "metrics.json").read_text())
    assert result["claims"] == {c["name"]: c["verdict"] for c in metrics["claims"]}

    run_id = state.state_details.flow_run_id
    arts = read_artifacts(run_id)
    report = arts[artifact_key(SLUG, "report")]
    assert report.type == "markdown"
    md = (paper_repo / "reports" / SLUG / "report.md").read_text()
    assert "](figures/" in md and "](figures/" not in report.data  # figures inlined: they render in the UI
    assert report.data.count("](data:image/png;base64,") == md.count("](figures/")
    assert "| claim | verdict |" in md and "| claim | verdict |" not in report.data  # verdicts as a wrapping list
    assert all(f"- **{c['name']}** — " in report.data for c in metrics["claims"])
    table = arts[artifact_key(SLUG, "claims")]
    assert table.type == "table"
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    claim_rows = {r["name"]: r for r in rows if r["kind"] == "claim"}
    assert {n: r["verdict"] for n, r in claim_rows.items()} == result["claims"]
    assert all("{" not in r["measured"] for r in rows)  # numbers in words, not raw JSON
    stage_rows = {r["name"].removeprefix("stage "): r["runtime_s"] for r in rows if r["kind"] == "stage"}
    assert stage_rows == {s: metrics["runtime_s"][s] for s in STAGES if s != "report"} | {"report": stage_rows["report"]}
    runs = task_runs(run_id)
    assert [t.name for t in sorted(runs, key=lambda t: t.expected_start_time)][:4] == [f"{s}@{SLUG}" for s in STAGES]
    by_id = {t.id: t.name for t in runs}
    edges = {t.name: sorted(by_id.get(i.id, "?") for ins in t.task_inputs.values() for i in ins
                            if getattr(i, "input_type", "") == "task_run") for t in runs}
    for prev, nxt in zip(STAGES, STAGES[1:]):  # the run graph shows prepare -> train -> evaluate -> report
        assert f"{prev}@{SLUG}" in edges[f"{nxt}@{SLUG}"], edges

    # a second run: DVC's lock file says nothing changed, so no stage reruns
    again = paper_flow(SLUG, root=str(paper_repo), sync=False, return_state=True)
    assert again.is_completed(), again.message
    assert again.result()["stages"] == {s: "unchanged" for s in STAGES}


def test_failing_stage_fails_the_flow_without_retrying(prefect_harness, paper_repo, tool_path):
    params_path = paper_repo / "params.yaml"
    params = yaml.safe_load(params_path.read_text())
    params["papers"][SLUG]["prepare"]["no_such_key"] = 1
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))

    state = paper_flow(SLUG, root=str(paper_repo), sync=False, return_state=True)
    assert state.is_failed()
    assert f"papers.{SLUG}.prepare.no_such_key" in state.message  # the stage's one-line error
    runs = {t.name: t for t in task_runs(state.state_details.flow_run_id)}
    assert runs[f"prepare@{SLUG}"].state.is_failed()
    assert runs[f"prepare@{SLUG}"].run_count == 1  # exit 2 (bad params) is not retried
    assert f"train@{SLUG}" not in runs
    assert not (paper_repo / "data" / SLUG / "prepare").exists()


def test_unknown_paper_fails_before_any_stage(prefect_harness, paper_repo, tool_path):
    state = paper_flow("no_such_paper", root=str(paper_repo), sync=False, return_state=True)
    assert state.is_failed()
    assert "papers.no_such_paper: unknown paper" in state.message
    assert task_runs(state.state_details.flow_run_id) == []


@pytest.mark.parametrize("remote, message", [
    ("{tmp}/missing-folder", "folder {tmp}/missing-folder does not exist"),
    ("nosuch://bucket/dvc", "DVC remote 'flow'"),
])
def test_misconfigured_remote_fails_before_any_stage(prefect_harness, paper_repo, tmp_path, remote, message):
    remote, message = remote.format(tmp=tmp_path), message.format(tmp=tmp_path)
    state = paper_flow(SLUG, root=str(paper_repo), remote=remote, return_state=True)
    assert state.is_failed()
    assert message in state.message
    assert task_runs(state.state_details.flow_run_id) == []  # nothing pulled, run or pushed
    assert not (paper_repo / "data").exists()


def test_all_papers_runs_subset_and_rejects_unknown(prefect_harness, smoke_flow, tmp_path):
    import shutil

    from flows.all_papers import all_papers

    state, computed = smoke_flow
    repo = tmp_path / "repo"
    shutil.copytree(computed, repo, symlinks=True)
    done = all_papers(root=str(repo), papers=[SLUG], sync=False, return_state=True)
    assert done.is_completed(), done.message
    assert done.result()[SLUG]["stages"] == {s: "unchanged" for s in STAGES}
    bad = all_papers(root=str(repo), papers=["nope"], return_state=True)
    assert bad.is_failed() and "papers.nope: unknown paper" in bad.message


def test_cli_unreachable_api_is_one_line(paper_repo, tmp_path):
    import os
    import subprocess
    import sys

    from flows.serve import free_port

    url = f"http://127.0.0.1:{free_port()}/api"
    env = {**os.environ, "PREFECT_API_URL": url}
    out = subprocess.run([sys.executable, "-m", "flows.paper_flow", SLUG], cwd=paper_repo, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    err = out.stderr.strip()
    assert err.startswith(f"error: Prefect API {url}: no answer within 5 s") and "\n" not in err
    assert not (paper_repo / "data").exists()


def test_paper_flow_at_another_profile_leaves_committed_results_alone(prefect_harness, paper_repo, tool_path):
    committed = paper_repo / "reports" / SLUG / "claims.json"
    before = committed.read_bytes() if committed.exists() else None
    state = paper_flow(SLUG, profile="smoke", root=str(paper_repo), sync=False, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result["profile"] == "smoke" and set(result["stages"]) == set(STAGES)
    run_dir = paper_repo / "runs" / "smoke"
    metrics = json.loads((run_dir / "reports" / SLUG / "metrics.json").read_text())
    assert metrics["profile"] == "smoke"
    assert result["claims"] == {c["name"]: c["verdict"] for c in metrics["claims"]}
    assert not (paper_repo / "data" / SLUG).exists()
    assert (committed.read_bytes() if committed.exists() else None) == before  # the committed report is untouched
    arts = read_artifacts(state.state_details.flow_run_id)
    verdicts = arts[artifact_key(SLUG, "verdicts")]
    assert verdicts.type == "markdown" and all(f"- **{c['name']}** — " in verdicts.data for c in metrics["claims"])
    names = {t.name for t in task_runs(state.state_details.flow_run_id)}
    assert f"publish-{SLUG}" in names and f"train@{SLUG} (smoke)" in names
    bad = paper_flow(SLUG, profile="huge", root=str(paper_repo), sync=False, return_state=True)
    assert bad.is_failed() and "profile: must be one of" in bad.message


@pytest.mark.parametrize("argv, needle", [(["no_such_paper"], "papers.no_such_paper: unknown paper"),
                                          ([SLUG, "--profile", "huge"], "profile: must be one of")])
def test_cli_rejects_bad_names_in_one_line_before_prefect(argv, needle):
    import subprocess
    import sys

    from stages.common.paths import ROOT

    code = ("import runpy, sys; sys.argv = ['flows.paper_flow', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('flows.paper_flow', run_name='__main__')\n"
            "except SystemExit as e:\n    assert 'prefect' not in sys.modules, 'prefect imported'\n    raise\n")
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"error: {out.stderr.strip().removeprefix('error: ')}"]
    assert needle in out.stderr and "Traceback" not in out.stderr
