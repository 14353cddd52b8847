"""Beyond one machine, on one machine: Prefect process workers in their own checkouts sharing a
local-folder DVC remote, a worker killed mid-run, and Lightning DDP on 2 CPU processes (gloo)."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flowkit import SLUG
from flowkit_cluster import remote_run_cache_cmds, stage_rows
from flows import pools
from flows.paper_flow import artifact_key

pytestmark = [pytest.mark.scaling, pytest.mark.slow]

CACHED = ("prepare", "train", "evaluate")  # report's outputs are `cache: false` (git-tracked): DVC reruns it
CLAIMS = artifact_key(SLUG, "claims")


def cmd(stage: str) -> str:
    return f"python -m stages {stage} {SLUG}"


@pytest.fixture(scope="module")
def pool(cluster, repo_template):
    """Work pool `papers` with one queue per worker, crash detection, the git-sourced deployment,
    and two process workers (w1 polls queue w1, w2 polls w2). Every run clones repo_template."""
    with cluster.api_settings():
        pools.ensure_pool("papers", ("w1", "w2"))
        # workers' runs heartbeat every 30 s; 60 s of silence leaves room for a loaded machine
        pools.ensure_crash_detection(within_s=60)
        pools.deploy(str(repo_template), pool="papers")
    for name in ("w1", "w2"):
        cluster.start_worker(name, "papers", name)
    yield cluster
    for name in list(cluster.workers):
        cluster.kill_worker(name)


def claims(rows) -> dict:
    return {r["name"]: (r["verdict"], r["measured"]) for r in rows if r["kind"] == "claim"}


def test_two_workers_share_stages_through_the_remote(pool, tmp_path):
    remote = tmp_path / "dvc-remote"
    remote.mkdir()
    with pool.api_settings():
        first = [pools.submit(SLUG, queue=q, remote=str(remote)) for q in ("w1", "w2")]
        runs = [pool.wait_run(r.id, timeout=900) for r in first]
        for run in runs:
            assert run.state.is_completed(), f"{run.name}: {run.state.message}\n{pool.logs()}"
        tables = [pool.artifacts(r.id)[CLAIMS] for r in runs]
        before = [stage_rows(t) for t in tables]
        for stage in CACHED:  # each stage was computed by one of the two (or both, concurrently)
            assert "ran" in {b[stage]["dvc"] for b in before}, before

        third = pool.wait_run(pools.submit(SLUG, queue="w2", remote=str(remote)).id, timeout=900)
        assert third.state.is_completed(), f"{third.state.message}\n{pool.logs()}"
        table = pool.artifacts(third.id)[CLAIMS]
    after = stage_rows(table)
    for stage in CACHED:
        assert after[stage]["dvc"] == "restored", after  # DVC: "is cached - skipping run, checking out outputs"
        # restored, not recomputed: this worker measured no runtime for it (timings live beside outputs)
        assert after[stage]["runtime_s"] is None, after
    assert claims(table) == claims(tables[0])
    assert set(remote_run_cache_cmds(remote)) == {cmd(s) for s in CACHED}


def test_killed_worker_crashes_its_run_pushes_nothing_partial_and_retry_completes(pool, tmp_path):
    remote = tmp_path / "dvc-remote"
    remote.mkdir()
    with pool.api_settings():
        doomed = pools.submit(SLUG, queue="w1", remote=str(remote))
        pool.wait_task_running(doomed.id, f"train@{SLUG}", timeout=600)
        pool.kill_worker("w1")  # SIGKILL the worker and everything under it: the machine is gone
        dead = pool.wait_run(doomed.id, timeout=240)
        assert dead.state.type.value in ("CRASHED", "FAILED"), dead.state
        # only the stage that completed before the kill was pushed; train's partial output never was
        assert remote_run_cache_cmds(remote) == [cmd("prepare")]

        retry = pool.wait_run(pools.submit(SLUG, queue="w2", remote=str(remote)).id, timeout=900)
        assert retry.state.is_completed(), f"{retry.state.message}\n{pool.logs()}"
        rows = stage_rows(pool.artifacts(retry.id)[CLAIMS])
    pool.start_worker("w1", "papers", "w1")
    assert rows["prepare"]["dvc"] == "restored" and rows["train"]["dvc"] == "ran", rows
    assert sorted(remote_run_cache_cmds(remote)) == sorted(cmd(s) for s in CACHED)


def test_ddp_factory_all_reduces_gradients(tmp_path):
    """2 gloo processes, each on half of every batch, end where 1 process on the whole batch ends."""
    toy = Path(__file__).with_name("ddp_toy.py")
    single, ddp = tmp_path / "single.json", tmp_path / "ddp.json"
    subprocess.run([sys.executable, str(toy), str(single)], check=True, capture_output=True, timeout=600)
    out = subprocess.run([sys.executable, str(toy), str(ddp), "--devices", "2"], check=True,
                         capture_output=True, text=True, timeout=600)
    assert "distributed_backend=gloo" in out.stdout + out.stderr
    a, b = json.loads(single.read_text()), json.loads(ddp.read_text())
    assert b["world_size"] == 2
    for key in ("weight", "bias"):  # float32 all-reduce: equal up to rounding
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6)


def numbers(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from numbers(v, f"{prefix}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from numbers(v, f"{prefix}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield prefix, float(obj)


def test_reversal_curse_train_under_ddp_matches_single_process(smoke_flow, tmp_path):
    """train@reversal_curse with strategy ddp on 2 CPU processes, then evaluate: the same numbers as
    the single-process smoke run (its full-batch GD gives every rank the same batch, so DDP's
    averaged gradient equals the single-process one up to float32 all-reduce rounding)."""
    state, computed = smoke_flow
    assert state.is_completed(), state.message
    repo = tmp_path / "repo"
    shutil.copytree(computed, repo, symlinks=True)
    single = json.loads((computed / "data" / SLUG / "evaluate" / "metrics.json").read_text())
    params_path = repo / "params.yaml"
    params = yaml.safe_load(params_path.read_text())
    params["papers"][SLUG]["train"]["profiles"]["smoke"].setdefault("trainer", {}).update(
        accelerator="cpu", strategy="ddp", devices=2)
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**pool_free_env(), "WANDB_MODE": "disabled"}
    train = subprocess.run([sys.executable, "-m", "stages", "train", SLUG], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=900)
    log = train.stdout + train.stderr
    assert train.returncode == 0, log[-3000:]
    assert "distributed_backend=gloo" in log and "Starting with 2 processes" in log  # Lightning's own words
    assert not list((repo / "data" / SLUG).glob(".train*")), "a rank left a temp dir behind"
    ev = subprocess.run([sys.executable, "-m", "stages", "evaluate", SLUG], cwd=repo, env=env,
                        capture_output=True, text=True, timeout=900)
    assert ev.returncode == 0, (ev.stdout + ev.stderr)[-3000:]
    ddp = json.loads((repo / "data" / SLUG / "evaluate" / "metrics.json").read_text())
    a, b = dict(numbers(single)), dict(numbers(ddp))
    assert a.keys() == b.keys()
    bad = {k: (a[k], b[k]) for k in a if not math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-6)}
    assert not bad, bad


def pool_free_env() -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PAPERS_ROOT",)}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env
