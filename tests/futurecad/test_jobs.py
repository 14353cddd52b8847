"""futurecad on the shared process pool (stages/common/jobs.py): a grounder run and a program-model run (SFT,
SFT-only arm, SFT+RL arm, each pooled run with its own CAD sandbox) give the same results and checkpoints in a
pool of two spawned processes as in this process."""
from __future__ import annotations

import math

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
