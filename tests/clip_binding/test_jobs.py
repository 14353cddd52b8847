"""clip_binding on the shared process pool (stages/common/jobs.py): a (fraction, seed) training run, a regressor
bank of one complexity fraction and one model's coverage scores give the same result, bit for bit, in a pool of
two spawned processes as in this process (the pooled training runs and evaluation pieces share one pool:
spawning a pool costs seconds)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from stages.common.jobs import run_jobs
from stages.common.paths import read_json
from stages.clip_binding import evaluate, prepare, train
from stages.clip_binding.prepare import frac_key
from stages.clip_binding.scenes import World


def _same(a, b) -> bool:
    """Exact equality of nested results (tensors bit for bit; nan equals nan)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def unit(job: tuple) -> dict:
    """A training run (i, j) or an evaluation piece ("complexity", ci) / ("coverage", i, j) of one shared payload."""
    return evaluate.eval_run(job) if isinstance(job[0], str) else train.train_run(job)


def test_train_and_eval_units_equal_in_a_pool(tmp_path):
    pcfg = prepare.Config.model_validate({"k": 2, "v": 4, "n_max": 2, "train_object_fractions": [0.25, 0.75],
                                          "seeds": [0, 1], "test_scenes": 24, "complexity_fractions": [0.5, 0.75]})
    prep = tmp_path / "prep"
    prep.mkdir()
    prepare.run(pcfg, SimpleNamespace(out=prep))
    meta, splits = read_json(prep / "meta.json"), torch.load(prep / "splits.pt")
    world = World(meta["k"], meta["v"], meta["n_max"])
    tcfg = train.Config.model_validate({"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "d_out": 8,
                                        "batch_size": 12, "steps": 4, "curve_every": 2, "curve_scenes": 16,
                                        "trainer": {"enable_progress_bar": False}})
    kwargs = train.model_kwargs(tcfg, world)
    jobs = [(1, 0), (1, 1), (0, 0), (0, 1)]
    data = {"meta": meta, "kwargs": kwargs, "device": "cpu", "backend": "torch",
            "trainer": tcfg.trainer.model_dump(mode="json"), "coverage_masks": splits["coverage_masks"]}
    for workers in (1, 2):
        (tmp_path / f"train{workers}" / "models").mkdir(parents=True)
    solo = run_jobs(train.train_run, jobs, dict(data, out=str(tmp_path / "train1")), workers=1)
    assert [(r["i"], r["j"]) for r in solo] == jobs
    assert solo[0]["calls"] > 0 and solo[0]["history"][-1]["step"] == 3

    ecfg = evaluate.Config.model_validate({"eval_batch": 8, "train_scenes": 16, "hidden": 4, "mlp_hidden": 8,
                                           "reg_steps": 4, "max_train_scenes": 16, "reg_restarts": 2,
                                           "trainer": {"enable_progress_bar": False}})
    train_dir = tmp_path / "train1"
    labels = [f"{frac_key(f)}_s{s}" for f in meta["train_object_fractions"] for s in meta["seeds"]]
    models = {lb: evaluate.load_model(train_dir, kwargs, world, lb, "cpu") for lb in labels}
    inp = evaluate.complexity_inputs(ecfg, world, models, meta, torch.device("cpu"), tcfg.d_out)
    edata = dict(data, cfg=ecfg.model_dump(mode="json"), complexity=inp, complexity_masks=splits["complexity_masks"],
                 test_objs=splits["test_objs"], test_n=splits["test_n"], train_dir=str(train_dir))
    ejobs = [("complexity", 1), ("complexity", 0), ("coverage", 1, 0), ("coverage", 1, 1), ("coverage", 0, 0)]
    e1 = run_jobs(evaluate.eval_run, ejobs, edata, workers=1)
    cx, cov = e1[0], e1[4]
    assert set(cx["out"]) == {"trained", "control"} and len(cx["out"]["trained"]["mlp"]["r2_restarts"]) == 2
    assert cx["calls"] > 0 and cx["curves"][0]["fraction"] == 0.75
    assert set(cov["acc"]) == set(evaluate.COVERAGE_KEYS) and len(cov["parity"]) == 4 and e1[2]["parity"] is None
    # the every-concept-differing subset, counted here from the test split itself: 2-object scenes of two objects
    # whose concept values differ in every position (digits of the object index in base v), at most the 2-object items
    objs, n = splits["test_objs"][0, 0], splits["test_n"][0, 0]
    digits = lambda o: [(int(o) // meta["v"] ** c) % meta["v"] for c in range(meta["k"])]  # noqa: E731
    apart = sum(1 for row, m in zip(objs.tolist(), n.tolist())
                if m == 2 and all(x != y for x, y in zip(digits(row[0]), digits(row[1]))))
    assert cov["acc"]["n_binding_distinct_items"] == apart <= cov["acc"]["n_binding_items"]
    assert 0 <= cov["acc"]["bag_binding_acc_distinct"] <= cov["acc"]["bag_binding_acc"] + 1e-9 or apart == 0

    # the same runs and pieces in a pool of two (the runs save their weights under train2)
    pooled = run_jobs(unit, jobs + ejobs, dict(edata, out=str(tmp_path / "train2")), workers=2)
    assert _same(pooled[:len(jobs)], solo) and _same(pooled[len(jobs):], e1)
    states = [{p.name: torch.load(p) for p in sorted((tmp_path / f"train{w}" / "models").glob("*.pt"))}
              for w in (1, 2)]
    assert len(states[0]) == 4 and _same(states[0], states[1])        # the saved weights agree bit for bit
