"""The four stages end to end at the smoke profile."""
from __future__ import annotations

import json

from datasets import load_from_disk


def test_smoke_pipeline(smoke_run):
    out = smoke_run("opus")
    pool = load_from_disk(str(out["prepare"] / "pool"))
    assert set(pool["kind"]) == {"target", "other", "noise", "dup", "toxic"}
    runs = json.loads((out["train"] / "runs.json").read_text())
    arms = {r["arm"] for r in runs["runs"]}
    assert arms == {"random", "high_loss", "greedy_opus", "opus_sgd", "opus_adamw", "opus_no_redundancy"}
    tokens = {r["update_tokens"] for r in runs["runs"]}
    assert len(tokens) == 1 and tokens.pop() > 0  # equal update tokens in every arm
    for r in runs["runs"]:
        assert sum(r["selected_kind_counts"]) == r["steps"] * runs["k"]
        if r["arm"] == "opus_adamw":
            assert r["precond_kinds"].get("adamw", 0) == r["steps"] - 1  # live AdamW state after step 1
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    assert set(metrics["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    names = {c["name"] for c in metrics["claims"]}
    assert names == {"opus_adamw_beats_random", "boltzmann_ge_greedy", "static_filter_flags_toxic", "overhead_small"}
    for claim in metrics["claims"]:
        assert isinstance(claim["holds"], bool) and claim["statement"] and claim["values"]
        assert all(isinstance(v, (int, float)) for v in claim["values"].values())
    for fig in ("val_loss_curves", "overhead"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 1000
    assert (out["report"] / "plots" / "val_loss_curves.csv").exists()
    report = (out["report"] / "report.md").read_text()
    assert "## Verdicts" in report and "opus_adamw" in report
