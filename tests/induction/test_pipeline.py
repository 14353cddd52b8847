"""The smoke pipeline end to end, with the hand-written upstream-schema fixture as the vendored folder
(tests/induction/fixtures/concept_synth; the smoke profile otherwise unchanged): metrics schema, claims, figures,
plots, the upstream section, and no write into the vendored folder. (Same params -> same metrics is
tests/common/test_determinism.py, for every paper.)"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

FIX = Path(__file__).parent / "fixtures" / "concept_synth"


def _dir_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(p.name.encode() + (p.read_bytes() if p.is_file() else b""))
    return h.hexdigest()


def test_smoke_pipeline(tmp_path):
    from stages.common.runner import run_stage

    vend = tmp_path / "vendored"          # holdout worlds + a published report, no records: the fold path
    vend.mkdir()
    for name in ("toy_fullobs_generated_iid_holdout_v1.jsonl", "toy_model_challenge100_round1_report.json"):
        (vend / name).write_bytes((FIX / name).read_bytes())
    (vend / "SOURCE.md").write_text("fixture: hand-written in the upstream schema (not upstream data)\n")
    before = _dir_hash(vend)
    params = yaml.safe_load((Path(__file__).parents[2] / "params.yaml").read_text())
    prep = params["papers"]["induction"]["prepare"]
    prep.update({"upstream": "required", "upstream_dir": str(vend)})
    prep["profiles"]["smoke"]["upstream_families"] = None
    pp = tmp_path / "params.yaml"
    pp.write_text(yaml.safe_dump(params))
    root = tmp_path / "root"

    def run(stages):
        return {s: run_stage("induction", s, "smoke", root=root, params_path=pp) for s in stages}

    out = run(("prepare",))
    prep_hash = _dir_hash(out["prepare"])
    out.update(run(("train",)))
    train_hash = _dir_hash(out["train"])
    out.update(run(("evaluate", "report")))
    # issue 57: no stage writes into an upstream stage's output (or into the vendored folder)
    assert _dir_hash(out["prepare"]) == prep_hash and _dir_hash(out["train"]) == train_hash
    m = json.loads((out["report"] / "metrics.json").read_text())
    assert _dir_hash(vend) == before                                    # the vendored folder is only read
    assert set(m["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert all(isinstance(v, (int, float)) for v in m["runtime_s"].values())
    kinds = {c["name"]: c["kind"] for c in m["claims"]}
    assert kinds == {"enumeration_solves_fullobs": "finding", "compact_generalizes": "finding",
                     "difficulty_rises_with_depth": "finding", "upstream_enumeration_solves": "finding",
                     "upstream_compact_generalizes": "finding", "bloated_beats_majority": "check",
                     "reaches_outside_fragment": "check", "lift_beats_guarded_synthetic": "check",
                     "lift_generalizes_synthetic": "check", "upstream_published_results_reproduced": "check"}
    for c in m["claims"]:
        assert set(c) >= {"name", "statement", "holds", "values", "verdict", "refuted_by", "kind"}
        assert c["values"] and c["refuted_by"] and isinstance(c["holds"], bool)
    items = m["metrics"]["heldout"]["items"]              # paired per-instance lists, seeds x instances
    assert len(items["compact_acc"]) == 3 and [len(x) for x in items["compact_acc"]] == \
        [len(x) for x in items["bloated_acc"]]
    assert m["metrics"]["kernel"]["evaluator_mismatches"] == 0
    k = m["kernels"]["quantifier_eval"]
    assert k["calls"] > 0 and k["backend"] in ("torch-reference", "triton-cuda")
    assert k["parity_max_abs_err"] == 0.0                 # Triton path == reference on real inputs
    assert not any("seconds" in key for key in _keys(m["metrics"]))   # no wall-clock in the metrics
    g = m["metrics"]["guided"]                        # optional (C): the Lightning ranker ran and guided
    assert g["n"] > 0 and 0 <= g["guided_valid_rate"] <= 1
    assert (out["train"] / "ranker.pt").exists()
    for fig in ("difficulty_by_depth", "heldout_vs_size", "budgeted_validity", "size_vs_gold", "ranker_effort",
                "bench_families", "upstream_families", "upstream_budget"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 1000
    specs = json.loads((out["report"] / "plots" / "_specs.json").read_text())
    assert set(specs) == {"difficulty_by_depth", "budgeted_validity", "size_vs_gold", "ranker_effort",
                          "bench_families", "upstream_families", "upstream_budget"}
    b = m["metrics"]["bench"]                         # synthetic families: lift vs guarded, per seed and family
    assert len(b["per_seed"]["lift_solve_rate"]) == len(b["per_seed"]["guarded_solve_rate"]) == 3
    assert set(b["per_family"]) == {"guardless_cross_scope_lift_qd2", "compact_ef_lift_qd2"}
    lift_lines = [json.loads(x) for x in (out["train"] / "bench_predictions_lift.jsonl").read_text().splitlines()]
    assert all(set(x) == {"id", "formula", "size", "seconds", "status"} for x in lift_lines)
    u = m["metrics"]["upstream"]                      # the vendored fixture: 2 tasks x 5 folds
    assert u["mode"] == "holdout_folds" and u["n_tasks"] == 2 and u["grammars"] == {"lift": 6}   # smoke: 3 folds
    assert u["llm_recheck"]["mismatches"] == 0 and u["llm_recheck"]["n_checked"] == 3
    assert u["per_fold"]["fold"] == [0, 1, 2] and all(len(x) == 2 for x in u["per_fold"]["solved"])
    fam = u["per_family"]["toy_cross_lift_qd1"]
    assert fam["n_tasks"] == 1 and fam["llm"]["toy-model-1"] == {
        "n": 1, "train_correct": 1, "holdout_available": 1, "holdout_correct": 1, "median_correct_ast": 10.0}
    assert fam["ref_kind"] == "llm_holdout_correct" and fam["median_ref_size"] == 10
    enum = [json.loads(x) for x in (out["train"] / "upstream_predictions_enum.jsonl").read_text().splitlines()]
    assert {x["grammar"] for x in enum} == {"lift"}
    verdicts = {c["name"]: c["verdict"] for c in m["claims"]}
    assert verdicts["upstream_published_results_reproduced"] == "holds"
    report = (out["report"] / "report.md").read_text()
    for heading in ("## Upstream released benchmark (vendored)", "## Synthetic families suite",
                    "## Threats to validity", "## Deviations", "## Findings", "## Checks"):
        assert heading in report, heading
    assert "toy-model-1" in report and "claude_opus" not in report
    preds = (out["train"] / "predictions_enum.jsonl").read_text().splitlines()
    n = json.loads((out["prepare"] / "meta.json").read_text())["n_instances"]
    assert len(preds) == n and all(set(json.loads(p)) == {"id", "formula", "size", "seconds", "status"} for p in preds)
    assert {json.loads(p)["status"] for p in preds} <= {"solved", "fallback", "none"}


def _keys(d, prefix=""):
    for k, v in d.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _keys(v, prefix + k + ".")
