"""evaluate: validity per regime, size vs gold, budgeted validity, held-out accuracy, difficulty by depth.

Validity is decided exactly by stages.induction.check (numpy evaluation; EC with z3). Held-out
accuracy -- the hot loop -- evaluates every predicted formula on its instance's fresh, fully
observed held-out worlds through the bit-packed evaluator whose quantifiers run in the batched
Triton kernel (kernels.quantifier_eval); each result is cross-checked against the numpy evaluator
and disagreements are counted (expected 0).
Outputs: results.csv (one row per instance x solver) and metrics.json.
"""
from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator
from tqdm import tqdm

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.induction.bitset import BitContext, NotGuarded, unpack
from stages.induction.check import check_formula
from stages.induction.formula import parse
from stages.induction.instances import load_instances, load_predictions, parse_instance
from stages.induction.semantics import evaluate as np_evaluate

SOLVERS = ("enum", "bloated")


class Config(StageConfig):
    budgets_s: list[float] = Field(default_factory=lambda: [0.01, 0.03, 0.1, 0.3, 1.0],
                                   description="time budgets for the budgeted-validity curve (s)")
    seed: int = 0

    @field_validator("budgets_s")
    @classmethod
    def _budgets(cls, v: list[float]) -> list[float]:
        if not v or any(b <= 0 for b in v) or sorted(v) != v:
            raise ValueError(f"expected a non-empty increasing list of positive seconds (got {v})")
        return v


def heldout_scores(formula_text: str, worlds) -> tuple[float, float, int, bool]:
    """(object accuracy, exact-world rate, evaluator disagreements, used kernel path)."""
    f = parse(formula_text)
    ctx = BitContext(worlds)
    try:
        sig = ctx.compile_many([f])[0]                              # (W,) via the Triton kernel
        preds = [unpack(sig[k: k + 1], w.domain)[0] for k, w in enumerate(worlds)]
        kernel = True
    except NotGuarded:
        preds = [np_evaluate(f, w) for w in worlds]
        kernel = False
    mismatches = sum(int((p != np_evaluate(f, w)).sum()) for p, w in zip(preds, worlds)) if kernel else 0
    correct = sum(int((p == w.labels).sum()) for p, w in zip(preds, worlds))
    total = sum(w.domain for w in worlds)
    exact = sum(bool(np.array_equal(p, w.labels)) for p, w in zip(preds, worlds))
    return correct / total, exact / len(worlds), mismatches, kernel


def _rate(xs) -> float:
    xs = list(xs)
    return float(np.mean(xs)) if xs else float("nan")


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    prep, train = ctx.input("prepare"), ctx.input("train")
    insts = load_instances(prep / "instances.jsonl")
    metas = {m["id"]: m for m in map(json.loads, (prep / "heldout.jsonl").read_text().splitlines())}
    logs = {x["id"]: x for x in map(json.loads, (train / "search_log.jsonl").read_text().splitlines())}
    preds = {s: load_predictions(train / f"predictions_{s}.jsonl", insts) for s in SOLVERS}
    rows, mismatches, fallbacks = [], 0, 0
    for inst in tqdm(insts, desc="evaluate@induction"):
        meta = metas[inst.id]
        held = [parse_instance({"id": inst.id, "regime": "fullobs", "worlds": [w]}).worlds[0]
                for w in meta["heldout"]]
        train_labels = np.concatenate([w.labels for w in inst.worlds if w.kind == "yes"])
        majority = bool(train_labels.mean() >= 0.5)          # reference: a constant classifier
        majority_acc = float(np.mean(np.concatenate([w.labels for w in held]) == majority))
        for solver in SOLVERS:
            pred = preds[solver][inst.id]
            res = check_formula(inst, pred.formula)
            acc = exact = float("nan")
            if pred.formula is not None and res["size"] is not None:
                acc, exact, mm, kernel = heldout_scores(pred.formula, held)
                mismatches += mm
                fallbacks += int(not kernel)
            log = logs[inst.id]
            rows.append({"id": inst.id, "regime": inst.regime, "template": meta["template"], "depth": meta["depth"],
                         "solver": solver, "valid": bool(res["valid"]), "size": res["size"],
                         "gold_size": meta["gold_size"], "seconds": float(pred.seconds or 0.0),
                         "generated": int(log["enum_generated"]) if solver == "enum" else None,
                         "heldout_acc": acc, "heldout_exact": exact, "majority_acc": majority_acc,
                         "error": res["error"]})
    df = pl.DataFrame(rows, infer_schema_length=None)
    df.write_csv(ctx.out / "results.csv")
    metrics = summarize(df, cfg, mismatches, fallbacks)
    if (train / "guided_log.jsonl").exists():
        metrics["guided"] = guided_metrics(insts, train, logs, ctx)
    write_json(ctx.out / "metrics.json", metrics)
    if ctx.tracker:
        ctx.tracker.summary({"enum_valid": metrics["enum"]["all"]["valid_rate"],
                             "bloated_valid": metrics["bloated"]["all"]["valid_rate"]})


def guided_metrics(insts, train, logs, ctx) -> dict:
    """(C) ranker-guided vs plain enumeration on the ranker's held-out split (same budgets)."""
    glog = [json.loads(x) for x in (train / "guided_log.jsonl").read_text().splitlines()]
    by_id = {i.id: i for i in insts}
    preds = {json.loads(x)["id"]: json.loads(x) for x in (train / "predictions_guided.jsonl").read_text().splitlines()}
    plain = {p.id: p for p in load_predictions(train / "predictions_enum.jsonl", insts).values()}
    rows = []
    for g in glog:
        inst = by_id[g["id"]]
        rows.append({"id": g["id"], "regime": inst.regime,
                     "guided_valid": bool(check_formula(inst, preds[g["id"]]["formula"])["valid"]),
                     "plain_valid": bool(check_formula(inst, plain[g["id"]].formula)["valid"]),
                     "guided_generated": g["generated"], "plain_generated": logs[g["id"]]["enum_generated"],
                     "guided_seconds": g["seconds"], "plain_seconds": logs[g["id"]]["enum_seconds"],
                     "guided_size": preds[g["id"]]["size"], "plain_size": plain[g["id"]].size})
    df = pl.DataFrame(rows, infer_schema_length=None)
    df.write_csv(ctx.out / "guided.csv")
    both = df.filter(pl.col("guided_valid") & pl.col("plain_valid"))
    ratio = np.log10(df["guided_generated"].to_numpy() + 1) - np.log10(df["plain_generated"].to_numpy() + 1)
    return {"n": df.height, "guided_valid_rate": _rate(df["guided_valid"]), "plain_valid_rate": _rate(df["plain_valid"]),
            "guided_median_generated": float(df["guided_generated"].median()),
            "plain_median_generated": float(df["plain_generated"].median()),
            "mean_log10_effort_ratio": float(ratio.mean()), "frac_less_effort": _rate(ratio < 0),
            "guided_median_size": float(both["guided_size"].median()) if both.height else float("nan"),
            "plain_median_size": float(both["plain_size"].median()) if both.height else float("nan")}


def summarize(df: pl.DataFrame, cfg: Config, mismatches: int, fallbacks: int) -> dict:
    out: dict = {"n_instances": df.filter(pl.col("solver") == "enum").height}
    for solver in SOLVERS:
        d = df.filter(pl.col("solver") == solver)
        block = {}
        for regime in ["fullobs", "ci", "ec", "all"]:
            r = d if regime == "all" else d.filter(pl.col("regime") == regime)
            if r.height == 0:
                continue
            v = r.filter(pl.col("valid"))
            block[regime] = {"n": r.height, "valid_rate": _rate(r["valid"]),
                             "median_size": float(v["size"].median()) if v.height else float("nan"),
                             "median_size_over_gold": float((v["size"] / v["gold_size"]).median()) if v.height else float("nan"),
                             "heldout_acc_valid": _rate(v["heldout_acc"].drop_nans())}
        out[solver] = block
    # budgeted validity of the enumerator: valid and found within b seconds
    e = df.filter(pl.col("solver") == "enum")
    out["budgeted"] = {}
    for regime in ["fullobs", "ci", "ec"]:
        r = e.filter(pl.col("regime") == regime)
        if r.height:
            out["budgeted"][regime] = {f"b{b:g}": _rate((r["valid"] & (r["seconds"] <= b)).to_list()) for b in cfg.budgets_s}
    # compact vs bloated on instances where BOTH are training-valid (paired)
    wide = (e.select("id", pl.col("valid").alias("ev"), pl.col("heldout_acc").alias("ea"), pl.col("heldout_exact").alias("ex"),
                     pl.col("size").alias("es"), pl.col("majority_acc").alias("ma"))
            .join(df.filter(pl.col("solver") == "bloated").select("id", pl.col("valid").alias("bv"),
                  pl.col("heldout_acc").alias("ba"), pl.col("heldout_exact").alias("bx"), pl.col("size").alias("bs")), on="id"))
    both = wide.filter(pl.col("ev") & pl.col("bv"))
    out["heldout"] = {"n_pairs": both.height, "compact_acc": _rate(both["ea"]), "bloated_acc": _rate(both["ba"]),
                      "compact_exact": _rate(both["ex"]), "bloated_exact": _rate(both["bx"]),
                      "compact_median_size": float(both["es"].median()) if both.height else float("nan"),
                      "bloated_median_size": float(both["bs"].median()) if both.height else float("nan"),
                      "majority_acc": _rate(both["ma"]), "acc_gap": _rate(both["ea"]) - _rate(both["ba"])}
    # difficulty by template depth (enumeration): solve rate within the budget and search effort
    diff = {}
    for depth in sorted(e["depth"].unique().to_list()):
        r = e.filter(pl.col("depth") == depth)
        diff[f"depth_{depth}"] = {"n": r.height, "solve_rate": _rate(r["valid"]),
                                  "median_generated": float(r["generated"].median()),
                                  "median_seconds": float(r["seconds"].median())}
    depths = sorted(e["depth"].unique().to_list())
    lo, hi = diff[f"depth_{depths[0]}"], diff[f"depth_{depths[-1]}"]
    diff["shallowest"], diff["deepest"] = depths[0], depths[-1]
    diff["solve_rate_shallow"], diff["solve_rate_deep"] = lo["solve_rate"], hi["solve_rate"]
    diff["effort_ratio"] = hi["median_generated"] / max(1.0, lo["median_generated"])
    diff["log10_effort_ratio"] = math.log10(max(diff["effort_ratio"], 1e-12))
    out["difficulty"] = diff
    out["kernel"] = {"evaluator_mismatches": mismatches, "numpy_fallbacks": fallbacks}
    return out
