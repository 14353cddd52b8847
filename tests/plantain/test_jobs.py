"""plantain on the shared process pool (stages/common/jobs.py): a (seed, format) SFT + GRPO run (with the plan-first
w_helpful = 0 ablation) and a model's evaluation give the same result in a pool of two spawned processes as in this
process, bit for bit (histories, curves, saved weights, per-problem evaluation values)."""
from __future__ import annotations

import numpy as np
import torch

from stages.common.jobs import payload, run_jobs
from stages.plantain import evaluate, train
from stages.plantain.judge import PlanJudge
from stages.plantain.model import sft_tensor
from stages.plantain.prepare import MAX_TRACE, problems_frame
from stages.plantain.task import ERROR_KINDS, corrupt_plan, sample_problem, validate_plan


def _smoke_inputs(tmp_path):
    cfg = train.Config.model_validate({"model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
                                       "sft": {"steps": 3, "batch": 4, "curve_every": 2, "curve_prompts": 4},
                                       "rl": {"steps": 2, "prompts_per_step": 2, "grpo": {"group_size": 2}},
                                       "trainer": {"enable_progress_bar": False}})
    rng = np.random.default_rng(0)
    probs = [sample_problem(rng, 3, 5) for _ in range(40)]
    sft = problems_frame(probs[:24], "sft", rng, 0.4, list(ERROR_KINDS))
    # a learned (fallible) judge: it must reach the workers as the reward's judge
    plans = [p.plan if i % 2 == 0 else corrupt_plan(p.plan, "swap", rng) for i, p in enumerate(probs)]
    judge = PlanJudge.fit(probs, plans, [int(validate_plan(p, q)) for p, q in zip(probs, plans)], 8, 0, 20)
    rl = torch.tensor([p.prompt() for p in probs[24:]], dtype=torch.long)
    mcfg = train.model_config(cfg)
    data = {"cfg": cfg.model_dump(mode="json"), "trainer": cfg.trainer.model_dump(mode="json"), "model": mcfg.__dict__,
            "device": "cpu", "sft": {f: sft_tensor(sft[f"trace_{f}"].to_list(), sft["prompt"].to_list(), MAX_TRACE)
                                     for f in cfg.formats},
            "rl_prompts": rl[4:], "dev_prompts": rl[:4], "dev_problems": probs[24:28], "judge": judge, "out": str(tmp_path)}
    return cfg, mcfg, data, probs[24:], rl, judge


def _weights(path):
    return {f.name: torch.load(f, weights_only=True) for f in sorted(path.glob("*.pt"))}


def _unit(job):
    """A train or an evaluate job of one pool (one spawn start-up for both: ~10 s of imports per worker), each
    reading its own part of the payload (a worker runs one job at a time)."""
    kind, j = job
    shared = dict(payload())
    payload().update(shared[kind])
    try:
        return (train.sft_grpo_run if kind == "train" else evaluate.eval_run)(j)
    finally:
        payload().clear()
        payload().update(shared)


def test_sft_grpo_and_eval_runs_equal_in_a_pool(tmp_path):
    solo_dir, pool_dir = tmp_path / "solo", tmp_path / "pool"
    solo_dir.mkdir(), pool_dir.mkdir()
    cfg, mcfg, data, test_probs, prompts, judge = _smoke_inputs(solo_dir)
    ecfg = evaluate.Config.model_validate({"eval_prompts": 6, "wall_prompts": 2,
                                           "rr": {"max_retries": 2, "prompts": 4}})
    edata = {"cfg": ecfg.model_dump(mode="json"), "device": "cpu", "model": mcfg.__dict__, "max_trace": MAX_TRACE,
             "train_dir": str(solo_dir), "prompts": prompts[:6], "problems": test_probs[:6], "n_eval": 6, "n_rr": 4,
             "judges": {"oracle": validate_plan, "learned_40": judge}}
    # train jobs first: in this process they write the models the evaluate jobs read; the pool's train jobs write
    # theirs elsewhere while its evaluate jobs read the first run's
    jobs = [("train", (0, "pf")), ("train", (1, "tta")),
            ("evaluate", (0, "pf", "grpo")), ("evaluate", (0, "pf", "grpo_nohelp")), ("evaluate", (1, "tta", "sft"))]
    solo = run_jobs(_unit, jobs, {"train": data, "evaluate": edata}, workers=1)
    pooled = run_jobs(_unit, jobs, {"train": dict(data, out=str(pool_dir)), "evaluate": edata}, workers=2)
    t1, t2, e1, e2 = solo[:2], pooled[:2], solo[2:], pooled[2:]
    assert t1 == t2 and t1[0]["calls"] > 0                            # histories, curves, kernel calls
    # GRPO rows: step 0 (the curve's first point: the SFT model) and 2 steps, with the curve's last point at step 2
    assert [r["fmt"] for r in t1[0]["rl_history"]] == ["pf"] * 3 + ["pf_nohelp"] * 3
    assert [r["step"] for r in t1[0]["rl_history"]] == [0, 1, 2] * 2
    assert ["dev_pass1" in r for r in t1[0]["rl_history"]] == [True, False, True] * 2
    # every GRPO step (not the step-0 curve point) logs the judge's acceptance beside the plans' truth
    assert [{"judge_accept", "plan_right"} <= set(r) for r in t1[0]["rl_history"]] == [False, True, True] * 2
    assert [r["step"] for r in t1[1]["sft_curve"]] == [2, 3] and len(t1[1]["sft_history"]) == 3
    solo_w, pooled_w = _weights(solo_dir), _weights(pool_dir)         # the saved models agree bit for bit
    assert sorted(solo_w) == sorted(pooled_w) == ["pf_grpo_nohelp_s0.pt", "pf_grpo_s0.pt", "pf_sft_s0.pt",
                                                  "tta_grpo_s1.pt", "tta_sft_s1.pt"]
    for name, w in pooled_w.items():
        assert all(torch.equal(w[k], solo_w[name][k]) for k in w), name
    for a, b in zip(e1, e2):
        assert a.keys() == b.keys()
        for k in a:
            if k == "parity":
                assert all(torch.equal(x, y) for x, y in zip(a[k], b[k]))
            elif k == "walls":                                        # wall times are measured, not computed
                assert [(w["ttfr_tokens"], w["tokens"]) for w in a[k]] == [(w["ttfr_tokens"], w["tokens"])
                                                                          for w in b[k]]
            else:
                assert a[k] == b[k], k
    assert set(e1[0]["rr"]) == {"oracle", "learned_40"} and set(e1[1]["rr"]) == {"oracle"} and e1[2]["rr"] is None
    assert len(e1[0]["ok"]) == 6 and e1[0]["calls"] == 1
