"""train: run the symbolic synthesizers over every generated instance.

(A) bottom-up enumeration by AST size with observational-equivalence pruning, budgeted by time
    (timeout_s per instance) and AST size (max_size) -- stages.induction.enumerate;
(B) the bloated characteristic-type DNF fitter -- stages.induction.bloated.
Writes predictions_enum.jsonl / predictions_bloated.jsonl in the `solve` output format, and
search_log.jsonl (status, seconds, formulas kept/generated, z3 calls) for the evaluation.
No neural network is trained here (the optional neural ranker of the card is not implemented).
"""
from __future__ import annotations

import json

import torch
from pydantic import Field
from tqdm import tqdm

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
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
        log.append({"id": inst.id, "enum_status": e.status, "enum_seconds": e.seconds, "enum_bank": e.bank,
                    "enum_generated": e.generated, "enum_z3_calls": e.z3_calls, "bloated_status": b.status,
                    "bloated_seconds": b.seconds, "bloated_features": b.bank, "bloated_types": b.generated})
        if ctx.tracker:
            ctx.tracker.log({"enum_found": int(e.formula is not None), "enum_seconds": e.seconds,
                             "enum_generated": e.generated})
    for name, lines in (("predictions_enum.jsonl", enum_lines), ("predictions_bloated.jsonl", bloat_lines),
                        ("search_log.jsonl", log)):
        (ctx.out / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    write_json(ctx.out / "summary.json", {"n_instances": len(insts),
                                          "enum_found": sum(x["formula"] is not None for x in enum_lines),
                                          "bloated_found": sum(x["formula"] is not None for x in bloat_lines)})
