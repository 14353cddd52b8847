"""The four stages end to end at the smoke profile."""
from __future__ import annotations

import json

from datasets import load_from_disk

from stages.opus.report import CLAIMS
from stages.opus.train import DEFAULT_ARMS


def test_smoke_pipeline(smoke_run):
    out = smoke_run("opus")
    pool = load_from_disk(str(out["prepare"] / "pool"))
    assert set(pool["kind"]) == {"target", "other", "noise", "dup", "toxic"}
    redundant = load_from_disk(str(out["prepare"] / "pool_redundant"))
    assert redundant["kind"].count("dup") > pool["kind"].count("dup")
    runs = json.loads((out["train"] / "runs.json").read_text())
    arms = {r["arm"] for r in runs["runs"]}
    assert arms == {a.name for a in DEFAULT_ARMS}
    assert {"raw_grad_opus", "sgd_opus", "official_raw_tau", "opus_cheap"} <= arms and "opus_sgd" not in arms
    tokens = {r["update_tokens"] for r in runs["runs"]}
    assert len(tokens) == 1 and tokens.pop() > 0  # equal update tokens in every arm
    for r in runs["runs"]:
        assert sum(r["selected_kind_counts"]) == r["steps"] * runs["k"]
        if r["arm"] == "opus_adamw":
            assert r["precond_kinds"].get("adamw", 0) == r["steps"] - 1  # live AdamW state after step 1
            assert r["diagnostics"] and r["diagnostics"][0]["raw_logit_sd"] >= 0
        if r["arm"] == "sgd_opus":
            assert set(r["precond_kinds"]) == {"sgd"} and r["optimizer"] == "sgd"
        if r["arm"] == "opus_every4":
            assert sum(r["precond_kinds"].values()) == -(-r["steps"] // 4)  # scored once per 4 steps
    by = {(r["arm"], r["seed"]): r for r in runs["runs"]}
    for (arm, seed), r in by.items():          # the stream control: same seed and data, another selection draw
        if arm == "random_stream2":
            base = by[("random", seed)]
            assert (r["stream"], base["stream"]) == (1, 0) and r["update_tokens"] == base["update_tokens"]
            assert r["final_val_loss"] != base["final_val_loss"]
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    raw = metrics["metrics"]["arms"]["official_raw_tau"]
    assert all(mx >= med >= 0 for mx, med in zip(raw["raw_logit_sd_max"], raw["raw_logit_sd"]))
    assert all(mx >= s0 >= 0 for mx, s0 in zip(raw["raw_logit_sd_max"], raw["raw_logit_sd_step0"]))
    assert (out["report"] / "plots" / "raw_logit_sd_by_step.csv").exists()
    assert set(metrics["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert {c["name"] for c in metrics["claims"]} == {c.name for c in CLAIMS}
    for claim in metrics["claims"]:
        assert claim["verdict"] in ("holds", "fails", "inconclusive") and claim["statement"] and claim["values"]
        assert claim["refuted_by"]
    k = metrics["kernels"]["ghost_countsketch"]
    assert k["calls"] > 0 and k["parity_max_abs_err"] is not None and k["parity_max_abs_err"] < 1e-3
    over = metrics["metrics"]["overhead"]
    assert over["flops"]["cheap"] < over["flops"]["full"]  # window + every-4 cut the scored tokens
    for fig in ("val_loss_curves", "overhead"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 1000
    assert (out["report"] / "plots" / "val_loss_curves.csv").exists()
    report = (out["report"] / "report.md").read_text()
    assert "## Findings" in report and "## Checks" in report and "## Threats to validity" in report
    assert "## Deviations" in report and "opus_adamw" in report
    assert report.index("## Findings") < report.index("## Checks")  # findings first (Report.finish)
    assert "through the Triton kernel" not in report
