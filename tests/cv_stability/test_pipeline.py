"""The smoke profile end to end (Triton Lasso under the interpreter), the metrics.json schema, and that no
stage writes into an upstream stage's output (issue 57)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl
import torch

from stages.cv_stability.models import CONTRASTS, MODELS
from stages.cv_stability.report import CLAIMS
from stages.cv_stability.simulate import draw_datasets


def _tree_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + f.read_bytes())
    return h.hexdigest()


def test_smoke_pipeline_end_to_end(smoke_run):
    out, hashes = {}, {}
    for stage in ("prepare", "train", "evaluate", "report"):   # one stage at a time: upstream must stay untouched
        out.update(smoke_run("cv_stability", stages=(stage,)))
        for up, digest in hashes.items():
            assert _tree_hash(out[up]) == digest, f"{stage} modified {up}'s output"
        hashes[stage] = _tree_hash(out[stage])
    prep_meta = json.loads((out["prepare"] / "meta.json").read_text())
    ns, reps, k, d = prep_meta["ns"], prep_meta["reps"], prep_meta["k"], prep_meta["d"]
    # prepare stores the design only; the data sets are regenerated from the seed downstream
    assert sorted(p.name for p in out["prepare"].iterdir()) == ["_stage.json", "meta.json"]
    x, y = draw_datasets(prep_meta["seed"], ns[0], range(reps), torch.tensor(prep_meta["beta_star"]),
                         prep_meta["noise_sd"])
    assert x.shape == (reps, ns[0], d) and y.shape == (reps, ns[0])
    assert y[0, :3].tolist() == prep_meta["fingerprint_y"][str(ns[0])]

    coefs = torch.load(out["train"] / f"coefs_n{ns[-1]}.pt")
    assert set(coefs) == set(MODELS)
    assert all(v.shape == (reps, k, d) for v in coefs.values())
    # ST at the higher threshold is never less sparse than at the lower one
    assert bool(((coefs["st_high"] == 0) >= (coefs["st_low"] == 0)).all())

    cov = pl.read_parquet(out["evaluate"] / "coverage.parquet")
    n_comp = sum(b is not None for _, b in CONTRASTS.values())
    assert cov.height == len(ns) * (len(CONTRASTS) + n_comp) * 2  # CV for all, Bonferroni for comparisons
    assert cov["coverage"].is_between(0, 1).all() and (cov["reps"] == reps).all()
    stab = pl.read_parquet(out["evaluate"] / "stability.parquet")
    assert stab.height == len(ns) * len(CONTRASTS)
    assert (stab["gamma"] >= 0).all() and (stab["sigma2"] > 0).all()

    metrics = json.loads((out["report"] / "metrics.json").read_text())
    assert [c["name"] for c in metrics["claims"]] == [c.name for c in CLAIMS]
    for claim in metrics["claims"]:
        assert set(claim) >= {"name", "statement", "holds", "verdict", "values", "refuted_by"}
        assert isinstance(claim["holds"], bool) and claim["values"] and claim["refuted_by"]
        assert claim["verdict"] in ("holds", "fails", "inconclusive")
    m = metrics["metrics"]
    assert len(m["batch"]["single_pooled"]) == prep_meta["batches"]
    assert m["bonferroni"]["min_coverage"] >= 0 and m["bonferroni"]["width_ratio"]
    for stage in ("train", "evaluate"):
        rec = json.loads((out[stage] / "kernels.json").read_text())["batched_lasso"]
        assert rec["calls"] > 0 and rec["backend"] == "torch-reference"
        assert rec["parity_backend"] == "triton-interpret" and rec["parity_max_abs_err"] < 1e-8
    assert set(metrics["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert all(v >= 0 for v in metrics["runtime_s"].values())
    for name in ("st_vs_ols", "lasso_vs_ols", "st_high_vs_st_low"):
        f = m["slope"][name]
        assert f["lower95"] <= f["slope"] <= f["upper95"] and f["se"] >= f["se_binomial"] > 0
    for fig in ("coverage_vs_n", "r_vs_n", "studentized_error", "coverage_slope", "bonferroni_width"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 0
    specs = json.loads((out["report"] / "plots" / "_specs.json").read_text())
    assert set(specs) == {"coverage_vs_n", "r_vs_n", "bonferroni_width_ratio_vs_n"}
    for plot, spec in specs.items():   # one column per series, numeric x, finite values (issue 39)
        frame = pl.read_csv(out["report"] / "plots" / f"{plot}.csv")
        assert frame.height == len(ns) and frame.columns == [spec["x"], *spec["y"]] and len(spec["y"]) >= 3
        assert all(frame[c].is_finite().all() for c in spec["y"])
    ratio = pl.read_csv(out["report"] / "plots" / "bonferroni_width_ratio_vs_n.csv")
    assert (ratio.drop("n") > 1).to_numpy().all()      # the Bonferroni interval is wider than the CV one
    kinds = {c["name"]: c["kind"] for c in metrics["claims"]}
    assert kinds.pop("bonferroni_covers") == "check" and set(kinds.values()) == {"finding"}
    gain = next(c for c in metrics["claims"] if c["name"] == "st_vs_ols_coverage_gain_bounded")
    assert gain["params"] == {"below": 0.01} and gain["stats"]["df"] == len(ns) - 2
    real = m["real_example"]
    assert real["n"] == 442 and {r["method"] for r in real["example"]} == {"cv", "bonferroni"}
    text = (out["report"] / "report.md").read_text()
    assert "## Findings" in text and "## Checks" in text and "coverage_vs_n.png" in text
    assert "## Threats to validity" in text and "Worked example on real data" in text
