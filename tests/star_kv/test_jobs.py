"""star_kv on the shared process pool (stages/common/jobs.py): every student of a seed (pass A with the star_gatefuse
branch, pass B at star_full's totals, the untrained arms; seed 0 also at a side target) gives the same result in a
pool of two spawned processes as in this process, bit for bit (weights, ranks, steps, curves, held-out NLLs)."""
from __future__ import annotations

import torch

from stages.common.jobs import run_jobs
from stages.star_kv.train import eval_windows, seed_run
from tests.star_kv.test_star_kv import _cfg, teacher


def test_seed_runs_equal_in_a_pool():
    cfg = _cfg(seeds=[0, 1], targets=[0.4, 0.6], main_targets=[0.6], side_seeds=[0],
               side_arms=["star_full", "star_global", "uniform_kd", "svd_uniform", "star_nokd"])
    t = teacher(5)
    t.requires_grad_(False)
    corpus = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(3))
    val = eval_windows(torch.randint(0, 64, (80,), generator=torch.Generator().manual_seed(4)), 12, 5)
    data = {"cfg": cfg.model_dump(mode="json"), "teacher": t, "train": corpus, "curve": val[3:], "full_eval": val[:3]}
    solo = run_jobs(seed_run, [0, 1], data, workers=1)
    pooled = run_jobs(seed_run, [0, 1], data, workers=2)
    assert [r["runs"] for r in solo] == [r["runs"] for r in pooled]
    assert [r["log"] for r in solo] == [r["log"] for r in pooled]
    # seed 0 runs the side target 0.4 (star_full and the controls, not star_jointk / star_gatefuse); seed 1 only 0.6
    assert sorted(solo[0]["students"]) == sorted(
        [f"s0_c60_{a}" for a in ("star_full", "star_jointk", "star_gatefuse", "star_nokd", "star_global",
                                 "uniform_kd", "svd_uniform")]
        + [f"s0_c40_{a}" for a in ("star_full", "star_nokd", "star_global", "uniform_kd", "svd_uniform")])
    assert sorted(solo[1]["students"]) == sorted(k.replace("s0_", "s1_") for k in solo[0]["students"]
                                                 if k.startswith("s0_c60"))
    for a, b in zip(solo, pooled):
        assert sorted(a["students"]) == sorted(b["students"])
        for key, weights in a["students"].items():
            for name, x in weights.items():
                torch.testing.assert_close(x, b["students"][key][name], atol=0, rtol=0, msg=f"{key}.{name}")
    # the KD arms took every step; the two seeds drew different batches
    assert all(r["kd_steps_total"] == 5 for r in solo[0]["runs"] if r["arm"] not in ("star_nokd", "svd_uniform"))
    assert solo[0]["log"]["s0/star_full_c60/nll"] != solo[1]["log"]["s1/star_full_c60/nll"]
