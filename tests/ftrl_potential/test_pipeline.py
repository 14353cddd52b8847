"""The smoke profile end to end (kernel parity under the interpreter) and the metrics.json schema."""
from __future__ import annotations

import json

import polars as pl

from stages.ftrl_potential.report import CLAIMS


def test_smoke_pipeline_end_to_end(smoke_run):
    out = smoke_run("ftrl_potential")
    runs = pl.read_parquet(out["evaluate"] / "runs.parquet")
    assert set(runs["experiment"].unique()) == {"chain", "staircase", "random", "fixed_eps", "fixed_eps_chain",
                                                "fp_ties", "eps_sweep"}
    hit = runs.filter(pl.col("hit") > 0)
    assert hit.height > 0 and (hit["gap_at_stop"] <= hit["eps"] * (1 + 1e-9)).all()   # exact re-check
    capped = runs.filter(pl.col("hit") < 0)
    assert (capped["gap_at_stop"] > capped["eps"]).all()
    summary = json.loads((out["evaluate"] / "summary.json").read_text())
    assert summary["verify"]["hit_gap_violations"] == 0 and summary["verify"]["cap_gap_violations"] == 0
    kern = json.loads((out["train"] / "kernels.json").read_text())
    assert kern["ftrl_run"]["calls"] > 0 and kern["ftrl_run"]["parity_max_abs_err"] < 1e-9

    metrics = json.loads((out["report"] / "metrics.json").read_text())
    assert [c["name"] for c in metrics["claims"]] == [c.name for c in CLAIMS]
    for claim in metrics["claims"]:
        assert claim["verdict"] in ("holds", "fails", "inconclusive") and claim["values"] and claim["refuted_by"]
    assert {"ftrl_run", "ne_gap"} <= set(metrics["kernels"])
    assert set(metrics["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert (out["report"] / "figures" / "hitting_times.png").stat().st_size > 0
    assert pl.read_csv(out["report"] / "plots" / "hitting_times.csv").height > 0
    text = (out["report"] / "report.md").read_text()
    assert "Derivation of the two-player construction" in text and ">= " in text  # capped runs shown as ≥ cap
    assert summary["fp"]["kernel_vs_exact"]["mismatches"] == 0 and summary["fp"]["kernel_vs_exact"]["compared"] > 0
    assert summary["multi"]["box"]["all_follow"] == 1 and summary["multi"]["gray"]["min_visited_fraction"] < 1
    specs = json.loads((out["report"] / "plots" / "_specs.json").read_text())
    ht = pl.read_csv(out["report"] / "plots" / "hitting_times.csv")
    assert specs["hitting_times"]["x"] == "m" and set(specs["hitting_times"]["y"]) == set(ht.columns) - {"m"}
    assert len(specs["hitting_times"]["y"]) >= 5                                 # one series per arm (issue 39)
    kinds = {c["name"]: c["kind"] for c in metrics["claims"]}
    assert kinds["multiplayer_fp_doubly_exponential"] == "finding" and kinds["random_games_fast"] == "check"
