"""sciql on the shared process pool (stages/common/jobs.py): a suite's training run and a suite's evaluation give
the same result, bit for bit, in a pool of two spawned processes as in this process."""
from __future__ import annotations

import torch

from stages.common.jobs import run_jobs
from stages.common.paths import read_json
from stages.sciql import data as D
from stages.sciql import evaluate, train


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_suite_training_and_evaluation_equal_in_a_pool(smoke_run):
    prep = smoke_run("sciql", stages=("prepare",))["prepare"]       # 20 Circle2D + 4 HalfCheetah episodes
    metas = {e: read_json(prep / e / "meta.json") for e in ("circle2d", "halfcheetah")}
    datas = {e: D.load_dataset(prep / e, metas[e]["styles"]) for e in metas}
    cfg = train.Config.model_validate({"seeds": [0, 1], "circle2d": {"steps": 6}, "halfcheetah": {"steps": 4},
                                       "hidden": 8, "batch_size": 8, "inner_steps": 2, "curve_points": 2,
                                       "ablation_relabel": [0.2, 0.5, 0.3], "ablation_style": "position",
                                       "trainer": {"enable_progress_bar": False, "log_every_n_steps": 1}})
    jobs = train.suite_jobs(cfg, "circle2d", ["speed", "position"])[1:] + train.suite_jobs(cfg, "halfcheetah", ["speed"])
    assert [j[3] for j in jobs] == ["suite_position.pt", "ablation_position.pt", "suite_speed.pt"]
    data = {"cfg": cfg.model_dump(mode="json"), "data": datas, "meta": metas, "backend": "torch", "device": "cpu",
            "track": True}
    solo = run_jobs(train.suite_run, jobs, data, workers=1)
    pooled = run_jobs(train.suite_run, jobs, data, workers=2)
    assert _same(solo, pooled)
    for r, steps in zip(solo, (6, 6, 4)):
        assert r["curve"][-1]["step"] == steps and sorted(r["snapshots"]) == ([3, 6] if steps == 6 else [2, 4])
        assert r["kernel_calls"]["gawr_actor_loss"] == 5 * steps                 # five actors, every Adam step
        assert [e[0] for e in r["events"]][0] == "hparams" and len(r["events"]) > steps // 2  # W&B rows to replay
    assert not _same(solo[0]["state_dict"], solo[1]["state_dict"])              # the ablation relabels differently

    # the parent rebuilds each suite from its result; those checkpoints are what evaluate reads
    out = prep.parent / "train_jobs"
    for (env, style, _, fname), r in zip(jobs, solo):
        (out / env).mkdir(parents=True, exist_ok=True)
        module = train.rebuild_suite(r, metas[env], "cpu")
        assert _same(module.state_dict(), r["state_dict"])
        train.save_suite(out / env / fname, module, style, cfg.seeds, metas[env], r["extra"])
    ecfg = evaluate.Config.model_validate({"episodes": 1, "curve_episodes": 1, "diagnostic_rows": 64})
    edata = {"cfg": ecfg.model_dump(mode="json"), "device": "cpu", "seeds": cfg.seeds, "meta": metas, "data": datas}
    ejobs = [("suite", "halfcheetah", "speed", str(out / "halfcheetah" / "suite_speed.pt")),
             ("suite", "circle2d", "position", str(out / "circle2d" / "suite_position.pt")),
             ("ablation", "circle2d", "position", str(out / "circle2d" / "ablation_position.pt"))]
    e1 = run_jobs(evaluate.eval_run, ejobs, edata, workers=1)
    e2 = run_jobs(evaluate.eval_run, ejobs, edata, workers=2)
    assert e1[0].keys() == e2[0].keys()
    for a, b in zip(e1, e2):
        assert all(_same(a[k], b[k]) for k in a if k != "trajectories")
        assert a["trajectories"].keys() == b["trajectories"].keys()
        assert all((a["trajectories"][k] == b["trajectories"][k]).all() if a["trajectories"][k] is not None
                   else b["trajectories"][k] is None for k in a["trajectories"])
    assert len(e1[0]["rows"]) > 0 and len(e1[1]["curves"]) > 0 and len(e1[2]["ablation"]) > 0
    assert e1[1]["trajectories"] and e1[0]["kernels"]["gawr_actor_loss"]["calls"] > 0


def test_pooled_kernel_records_merge_as_serial_calls():
    from kernels.record import KernelRecord

    serial, merged = KernelRecord("cpu"), KernelRecord("cpu")
    parts = []
    for err, slc in ((0.5, "a"), (None, None), (0.25, "c")):
        part = KernelRecord("cpu")
        for rec in (serial, part):
            rec.count("k", 3)
            if slc is not None:
                e = rec._entry("k")
                e["slice"], e["parity_backend"] = slc, "triton-interpret"
                e["parity_max_abs_err"] = err if e["parity_max_abs_err"] is None else max(e["parity_max_abs_err"], err)
        parts.append(part.to_dict())
    for p in parts:
        evaluate.merge_into(merged, p)
    assert merged.to_dict() == serial.to_dict() == {"k": {"backend": "torch-reference", "calls": 9, "slice": "c",
                                                          "parity_backend": "triton-interpret",
                                                          "parity_max_abs_err": 0.5}}
