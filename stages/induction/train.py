"""train: run the symbolic synthesizers over every generated instance.

(A) bottom-up enumeration by AST size with observational-equivalence pruning, budgeted by time
    (timeout_s per instance) and AST size (max_size) -- stages.induction.enumerate;
(B) the bloated characteristic-type DNF fitter -- stages.induction.bloated.
(C) optional: a neural production ranker (LightningModule, stages.induction.ranker) trained on
    the productions used by (A)'s solutions on a seeded training split of the instances, then
    used to guide enumeration (size + learned penalties) on the held-out split.
Writes predictions_enum.jsonl / predictions_bloated.jsonl in the `solve` output format,
search_log.jsonl (status, seconds, formulas kept/generated, z3 calls) for the evaluation, and
for (C) ranker.pt, predictions_guided.jsonl and guided_log.jsonl (held-out split only).
"""
from __future__ import annotations

import json

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.trainer import TrainerConfig, make_trainer
from stages.induction.bloated import fit_bloated
from stages.induction.enumerate import synthesize
from stages.induction.instances import load_instances
from stages.induction.solve import prediction_line


class Config(StageConfig):
    seed: int = 0
    timeout_s: float = Field(1.0, gt=0, le=600, description="enumeration budget per instance (s)")
    max_size: int = Field(20, ge=2, le=60, description="enumeration AST-size budget")
    completions: int = Field(8, ge=1, le=256, description="EC: sampled completions per world")
    max_bank: int = Field(400_000, ge=100, description="cap on formulas kept by the enumerator")
    bloat_max_feature_size: int = Field(12, ge=6, le=20, description="largest extra feature for the bloated fitter")
    ranker: bool = Field(True, description="train the optional neural production ranker (C)")
    ranker_train_frac: float = Field(0.5, gt=0, lt=1, description="instances whose solutions train the ranker")
    ranker_max_penalty: int = Field(3, ge=0, le=10)
    ranker_batch_size: int = Field(16, ge=1)
    ranker_lr: float = Field(1e-2, gt=0)
    trainer: TrainerConfig = TrainerConfig(max_epochs=60, log_every_n_steps=5)


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    insts = load_instances(ctx.input("prepare") / "instances.jsonl")
    enum_lines, bloat_lines, log = [], [], []
    for inst in tqdm(insts, desc="train@induction (synthesize)"):
        e = synthesize(inst, timeout_s=cfg.timeout_s, max_size=cfg.max_size, completions=cfg.completions,
                       max_bank=cfg.max_bank, seed=cfg.seed)
        b = fit_bloated(inst, max_feature_size=cfg.bloat_max_feature_size)
        enum_lines.append(prediction_line(inst, e))
        bloat_lines.append(prediction_line(inst, b))
        log.append({"id": inst.id, "enum_productions": list(e.productions), "enum_status": e.status, "enum_seconds": e.seconds, "enum_bank": e.bank,
                    "enum_generated": e.generated, "enum_z3_calls": e.z3_calls, "bloated_status": b.status,
                    "bloated_seconds": b.seconds, "bloated_features": b.bank, "bloated_types": b.generated})
        if ctx.tracker:
            ctx.tracker.log({"enum_found": int(e.formula is not None), "enum_seconds": e.seconds,
                             "enum_generated": e.generated})
    for name, lines in (("predictions_enum.jsonl", enum_lines), ("predictions_bloated.jsonl", bloat_lines),
                        ("search_log.jsonl", log)):
        (ctx.out / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {"n_instances": len(insts), "enum_found": sum(x["formula"] is not None for x in enum_lines),
               "bloated_found": sum(x["formula"] is not None for x in bloat_lines)}
    if cfg.ranker:
        summary["ranker"] = train_ranker_and_guide(cfg, ctx, insts, log)
    write_json(ctx.out / "summary.json", summary)


def train_ranker_and_guide(cfg: Config, ctx: StageContext, insts, log) -> dict:
    """(C): fit the production ranker on the training split's solutions; guide the other split."""
    from stages.induction.ranker import ProductionRanker, penalties, production_features, usage_vector

    order = np.random.default_rng(cfg.seed).permutation(len(insts))
    n_train = int(round(cfg.ranker_train_frac * len(insts)))
    train_idx, test_idx = sorted(order[:n_train].tolist()), sorted(order[n_train:].tolist())
    feats = np.stack([production_features(inst, cfg.seed) for inst in insts])        # (N, V, F)
    solved = [i for i in train_idx if log[i]["enum_status"] == "found"]
    if len(solved) < 2 or not test_idx:
        return {"trained": False, "reason": f"{len(solved)} solved training instances"}
    data = TensorDataset(torch.from_numpy(feats[solved]),
                         torch.from_numpy(np.stack([usage_vector(tuple(log[i]["enum_productions"])) for i in solved])))
    model = ProductionRanker(lr=cfg.ranker_lr)
    trainer = make_trainer(cfg.trainer, ctx.tracker)
    trainer.fit(model, DataLoader(data, batch_size=cfg.ranker_batch_size, shuffle=True))
    torch.save(model.state_dict(), ctx.out / "ranker.pt")
    lines, glog = [], []
    for i in tqdm(test_idx, desc="train@induction (ranker-guided enumeration)"):
        inst = insts[i]
        pen = penalties(model.probabilities(feats[i]), cfg.ranker_max_penalty)
        g = synthesize(inst, timeout_s=cfg.timeout_s, max_size=cfg.max_size, completions=cfg.completions,
                       max_bank=cfg.max_bank, seed=cfg.seed, penalty=pen)
        lines.append(prediction_line(inst, g))
        glog.append({"id": inst.id, "status": g.status, "seconds": g.seconds, "generated": g.generated,
                     "penalty": pen.tolist()})
    (ctx.out / "predictions_guided.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (ctx.out / "guided_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in glog))
    return {"trained": True, "n_train": len(solved), "n_guided": len(test_idx)}
