"""justgrpo on the shared process pool (stages/common/jobs.py): an RL run or an evaluation piece gives the same
result in a pool of two spawned processes as in this process."""
from __future__ import annotations

import torch

from stages.common.jobs import run_jobs
from stages.common.tiny_transformer import TinyTransformer
from stages.justgrpo import evaluate, train
from stages.justgrpo.task import all_prompts, prompt_batch


def _smoke_inputs(tmp_path):
    cfg = train.Config.model_validate({"model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
                                       "rl": {"steps": 2, "prompts_per_step": 2, "grpo": {"group_size": 2},
                                              "eval_every": 2, "eval_prompts": 6, "drift_prompts": 3},
                                       "trainer": {"enable_progress_bar": False}})
    gen_len = 20
    mcfg = train.model_config(cfg, gen_len)
    torch.manual_seed(5)
    base = TinyTransformer(mcfg)
    torch.save(base.state_dict(), tmp_path / "base.pt")
    prompts = prompt_batch(torch.as_tensor(all_prompts()[::97]))
    data = {"cfg": cfg.model_dump(mode="json"), "trainer": cfg.trainer.model_dump(mode="json"), "model": mcfg.__dict__,
            "base": base.state_dict(), "device": "cpu", "gen_len": gen_len, "train_p": prompts[:50],
            "acc_dev": prompts[50:56], "drift_dev": prompts[50:53], "out": str(tmp_path)}
    return cfg, mcfg, data


def test_rl_and_eval_runs_equal_in_a_pool(tmp_path):
    cfg, mcfg, data = _smoke_inputs(tmp_path)
    jobs = [(0, "justgrpo"), (1, "arbitrary")]
    solo = run_jobs(train.rl_run, jobs, data, workers=1)
    solo_w = {j: torch.load(tmp_path / f"{j[1]}_s{j[0]}.pt") for j in jobs}
    pooled = run_jobs(train.rl_run, jobs, data, workers=2)
    assert solo == pooled and solo[0]["calls"] > 0
    assert [r["history"][-1]["step"] for r in pooled] == [2, 2]
    for j in jobs:                                                    # the saved policies agree bit for bit
        w = torch.load(tmp_path / f"{j[1]}_s{j[0]}.pt")
        assert all(torch.equal(w[k], solo_w[j][k]) for k in w)
    ecfg = evaluate.Config.model_validate({"n_samples": 2, "ks": [1, 2], "claim_k": 2, "passk_prompts": 4,
                                           "eval_prompts": 4, "tokens_per_step": [1, 2], "eval_block": 5})
    prompts = prompt_batch(torch.as_tensor(all_prompts()[::97]))
    edata = {"cfg": ecfg.model_dump(mode="json"), "device": "cpu", "gen_len": 20, "model": mcfg.__dict__,
             "train_dir": str(tmp_path), "pk_prompts": prompts[:4], "acc_prompts": prompts[:4],
             "decoders": [("tps1", 5, 1), ("full_arbitrary", 20, 1)]}
    ejobs = [("passk", 0, "ar"), ("passk", 1, "arbitrary"), ("greedy", 0, "base"), ("greedy", 1, "arbitrary")]
    e1 = run_jobs(evaluate.eval_run, ejobs, edata, workers=1)
    e2 = run_jobs(evaluate.eval_run, ejobs, edata, workers=2)
    for a, b in zip(e1, e2):
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k] == b[k]).all() if hasattr(a[k], "shape") else a[k] == b[k]
    assert set(e1[2]["items"]) == {"tps1", "full_arbitrary"} and len(e1[2]["items"]["tps1"]["answer"]) == 4
