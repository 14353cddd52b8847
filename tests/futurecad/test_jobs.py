"""futurecad on the shared process pool (stages/common/jobs.py): a grounder run and a program-model run (SFT,
SFT-only arm, SFT+RL arm, each pooled run with its own CAD sandbox) give the same results and checkpoints in a
pool of two spawned processes as in this process."""
from __future__ import annotations

import math

import pytest
import torch

from stages.common.jobs import run_jobs
from stages.common.runner import load_config
from stages.futurecad import train

CKPTS = ("ground_s1.pt", "sft_s0.pt", "sft_more_s0.pt", "rl_s0.pt")
TIMINGS = ("cpu", "sandbox")                  # CPU seconds and sandbox wall/CPU: measured, not results


def _same(a, b) -> bool:
    """Exact equality, NaN equal to NaN (an empty family's validation metric)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _checkpoints(out):
    loaded = {name: torch.load(out / name, weights_only=True) for name in CKPTS}
    loaded["ground_s1.pt"] = loaded["ground_s1.pt"]["state"]
    return loaded


def test_ground_and_program_runs_equal_in_a_pool(smoke_run, tmp_path):
    prep = smoke_run("futurecad", stages=("prepare",))["prepare"]
    _, cfg, _ = load_config("futurecad", "train", "smoke")
    cfg = train.Config.model_validate({**cfg.model_dump(mode="json"), "workers": 2, "sandbox_workers": 2})
    out = tmp_path / "out"
    out.mkdir()
    data = train.run_inputs(cfg, prep, out, torch.device("cpu"))
    assert data["sandbox_workers"] == 1       # a pooled run's sandbox: sandbox_workers // workers, no oversubscription
    assert data["env_grounder"] == ("model", str(out / "ground_s0.pt"))
    data["env_grounder"] = ("oracle",)        # its sandbox workers start without importing the grounder's stack
    jobs = [("program", 0), ("ground", 1)]
    solo = run_jobs(train.train_run, jobs, data, workers=1)
    solo_w = _checkpoints(out)
    pooled = run_jobs(train.train_run, jobs, data, workers=2)
    strip = [{k: v for k, v in r.items() if k not in TIMINGS} for r in solo + pooled]
    assert _same(strip[:2], strip[2:])
    prog, ground = solo
    assert prog["rl_history"] and prog["kernels"]["token_logprob"] > 0 and prog["selected"] is not None
    assert prog["sandbox"]["requested"] > 0 and ground["history"][-1]["seed"] == 1 and ground["calibration"]
    pooled_w = _checkpoints(out)
    for name in CKPTS:                                                   # the saved weights agree bit for bit
        assert solo_w[name].keys() == pooled_w[name].keys()
        assert all(torch.equal(solo_w[name][k], pooled_w[name][k]) for k in solo_w[name]), name


def test_program_runs_wait_for_the_environment_grounder(tmp_path):
    """One pool runs the grounders and the program runs: a program run in a pool process waits until the first
    grounder's checkpoint exists (written atomically by its run); in the stage process that run came first, so a
    missing checkpoint is an error, as is one that never appears."""
    import threading
    import time

    ck = tmp_path / "ground_s0.pt"
    with pytest.raises(RuntimeError, match="was not written before"):
        train.wait_for_env_grounder(ck, pooled=False)
    with pytest.raises(RuntimeError, match="not written after 0.3 s"):
        train.wait_for_env_grounder(ck, pooled=True, poll_s=0.05, timeout_s=0.3)
    threading.Timer(0.3, ck.write_bytes, args=(b"x",)).start()
    t0 = time.monotonic()
    train.wait_for_env_grounder(ck, pooled=True, poll_s=0.02)
    assert ck.exists() and time.monotonic() - t0 >= 0.25
    train.wait_for_env_grounder(ck, pooled=False)            # present: returns at once


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
@pytest.mark.parametrize("rl", [True, False])
def test_job_order_starts_the_environment_grounder_before_any_program_run(workers, rl):
    """The pool hands jobs out in order: with RL the environment grounder (seeds[0]) must precede every program
    run, or a pool whose processes all hold waiting program runs never trains it; the program runs (the longest
    jobs) come next, the other grounders last. Every run appears once."""
    seeds, pseeds = [4, 1, 7, 2, 9], [4, 1, 7]
    jobs = train.job_order(seeds, pseeds, workers, rl)
    assert sorted(jobs) == sorted([("ground", s) for s in seeds] + [("program", s) for s in pseeds])
    first_program = min(k for k, j in enumerate(jobs) if j[0] == "program")
    if rl:                                  # without RL a program run needs no grounder: programs go first
        assert jobs[0] == ("ground", 4) and first_program == 1
    else:
        assert first_program == 0
    assert jobs[first_program: first_program + 3] == [("program", s) for s in pseeds]
    assert [j for j in jobs if j[0] == "ground"] == [("ground", s) for s in seeds]
