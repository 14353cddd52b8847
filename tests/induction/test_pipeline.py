"""The smoke pipeline end to end: metrics schema, claims, figures, plots."""
from __future__ import annotations

import json


def test_smoke_pipeline(smoke_run):
    out = smoke_run("induction")
    m = json.loads((out["report"] / "metrics.json").read_text())
    first = (out["evaluate"] / "metrics.json").read_text()
    again = smoke_run("induction", stages=("train", "evaluate"))        # same params -> same metrics
    assert (again["evaluate"] / "metrics.json").read_text() == first
    assert set(m["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert all(isinstance(v, (int, float)) for v in m["runtime_s"].values())
    names = [c["name"] for c in m["claims"]]
    assert names == ["enumeration_solves_fullobs", "compact_generalizes", "difficulty_rises_with_depth",
                     "reaches_outside_fragment", "lift_reaches_benchmark_families", "lift_solutions_generalize"]
    for c in m["claims"]:
        assert set(c) >= {"name", "statement", "holds", "values", "verdict", "refuted_by"} and isinstance(c["holds"], bool)
        assert c["values"] and c["refuted_by"]
    seeds = m["metrics"]["heldout"]["per_seed"]
    assert len(seeds["compact_acc"]) == len(seeds["best_baseline_acc"]) == 3     # paired per-seed lists
    assert m["metrics"]["kernel"]["evaluator_mismatches"] == 0
    k = m["kernels"]["quantifier_eval"]
    assert k["calls"] > 0 and k["backend"] in ("torch-reference", "triton-cuda")
    assert k["parity_max_abs_err"] == 0.0                 # Triton path == reference on real inputs
    assert not any("seconds" in key for key in _keys(m["metrics"]))   # no wall-clock in the metrics
    g = m["metrics"]["guided"]                        # optional (C): the Lightning ranker ran and guided
    assert g["n"] > 0 and 0 <= g["guided_valid_rate"] <= 1
    assert (out["train"] / "ranker.pt").exists()
    for fig in ("difficulty_by_depth", "heldout_vs_size", "budgeted_validity", "size_vs_gold", "ranker_effort"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 1000
    assert (out["report"] / "plots" / "difficulty_by_depth.csv").exists()
    b = m["metrics"]["bench"]                         # benchmark families: lift vs guarded, per seed and family
    assert len(b["per_seed"]["lift_solve_rate"]) == len(b["per_seed"]["guarded_solve_rate"]) == 3
    assert set(b["per_family"]) == {"guardless_cross_scope_lift_qd2", "compact_ef_lift_qd2"}
    assert b["lift"]["solve_rate"] > b["guarded"]["solve_rate"]
    lift_lines = [json.loads(x) for x in (out["train"] / "bench_predictions_lift.jsonl").read_text().splitlines()]
    assert all(set(x) == {"id", "formula", "size", "seconds", "status"} for x in lift_lines)
    assert (out["report"] / "figures" / "bench_families.png").stat().st_size > 1000
    report = (out["report"] / "report.md").read_text()
    assert "## Benchmark families (held-out suite)" in report and "claude_opus_5_5_challenge100" in report
    assert "## Verdicts" in report and "figures/difficulty_by_depth.png" in report
    preds = (out["train"] / "predictions_enum.jsonl").read_text().splitlines()
    n = json.loads((out["prepare"] / "meta.json").read_text())["n_instances"]
    assert len(preds) == n and all(set(json.loads(p)) == {"id", "formula", "size", "seconds", "status"} for p in preds)
    assert {json.loads(p)["status"] for p in preds} <= {"solved", "fallback", "none"}


def _keys(d, prefix=""):
    for k, v in d.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _keys(v, prefix + k + ".")
