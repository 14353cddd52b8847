"""The upstream concept-synth release in its own schema (issue 53): benchmark records (yaml / yaml.gz / json /
jsonl), generated IID holdout worlds, published model reports -- on a hand-written fixture in that schema
(tests/induction/fixtures/concept_synth; no upstream data, no download) -- plus malformed entries, bounded
parsing, the tasks built from them, and the stages end to end with the fixture vendored."""
from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from stages.induction import concept_synth as cs
from stages.induction.concept_synth import (UpstreamError, build_tasks, family_of, load_holdout, load_llm_report,
                                            load_records, load_upstream_dir)
from stages.induction.evaluate import llm_recheck
from stages.induction.formula import binary_size, parse
from stages.induction.semantics import is_valid
from tests.induction.helpers import brute_labels

FIX = Path(__file__).parent / "fixtures" / "concept_synth"
HOLDOUT = FIX / "toy_fullobs_generated_iid_holdout_v1.jsonl"
RECORDS = FIX / "toy_benchmark_v1.yaml"
REPORT = FIX / "toy_model_challenge100_round1_report.json"
CROSS = "(forall y (or (not (R x y)) (S y x)))"
UNARY = "(and (P x) (not (Q x)))"


def _raw_holdout() -> list[dict]:
    return [json.loads(x) for x in HOLDOUT.read_text().splitlines()]


def _raw_records() -> list[dict]:
    return yaml.safe_load(RECORDS.read_text())


def _facts_by_hand(world: dict) -> dict:
    """The world's atoms decoded independently of the loader (names a<i> -> i)."""
    D = len(world["domain"])
    out = {"P": np.zeros(D, bool), "Q": np.zeros(D, bool), "R": np.zeros((D, D), bool), "S": np.zeros((D, D), bool)}
    for p, ext in world["predicates"].items():
        for atom in ext.get("true", []):
            idx = tuple(int(t.strip(" ()a")) for t in atom.split(","))
            out[p][idx] = True
    return out


@pytest.mark.real_source
def test_fixture_loads_upstream_schema():
    up = load_upstream_dir(FIX)
    assert set(up.files) == {"holdout", "records", "reports", "registry"} and up.reports[0].model == "toy-model-1"
    assert {k: len(v.worlds) for k, v in up.holdout.items()} == {
        "fullobs_v2_toy_cross_lift_qd1_001": 5, "fullobs_v2_toy_unary_qd0_001": 5,
        "fullobs_v2_toy_cross_lift_qd1_002": 0, "fullobs_v2_toy_unary_qd0_002": 2}
    gold = {"fullobs_v2_toy_cross_lift_qd1_001": CROSS, "fullobs_v2_toy_unary_qd0_001": UNARY,
            "fullobs_v2_toy_unary_qd0_002": UNARY}
    for raw in _raw_holdout():                       # labels and atoms against an independent decoding
        h = up.holdout[raw["task_id"]]
        for w, rw in zip(h.worlds, raw["worlds"]):
            facts = _facts_by_hand(rw)
            for p in facts:
                assert np.array_equal(w.facts[p], facts[p])
            assert np.array_equal(w.labels, brute_labels(parse(gold[raw["task_id"]]), facts, w.domain))
            assert w.labels.sum() == len(rw["targetExtension"]["T_true"])
    fo, ci, ec = up.records
    assert (fo.regime, len(fo.train), len(fo.test), fo.gold, fo.gold_ast, fo.family) == \
        ("fullobs", 4, 1, CROSS, 10, "toy_cross_lift_qd1")
    assert ci.regime == "ci" and [w.kind for w in ci.train] == ["yes", "yes", "yes", "no"]
    assert ec.regime == "ec" and all(w.unknown["Q"][1] and w.unknown["R"][0, 2] for w in ec.train)
    assert not any(w.facts["Q"][1] or w.facts["R"][0, 2] for w in ec.train)       # unknown is not also true
    for rec in up.records:                           # each record's gold explains its worlds (its regime's rule)
        from stages.induction.instances import Instance
        assert is_valid(parse(rec.gold), Instance(rec.id, rec.regime, rec.train, rec.gold))[0], rec.id
    rep = up.reports[0].tasks
    assert rep["fullobs_v2_toy_unary_qd0_002"].holdout_correct is False and rep["fullobs_v2_toy_unary_qd0_001"].correct


@pytest.mark.real_source
def test_record_formats_agree(tmp_path):
    """.yaml, .yaml.gz (the released format), .json and .jsonl give the same records."""
    recs = _raw_records()
    gz = tmp_path / "b.yaml.gz"
    gz.write_bytes(gzip.compress(RECORDS.read_bytes()))
    js, jl = tmp_path / "b_records.json", tmp_path / "b_records.jsonl"
    js.write_text(json.dumps(recs))
    jl.write_text("".join(json.dumps(r) + "\n" for r in recs))
    ref = load_records(RECORDS)
    for path in (gz, js, jl):
        got = load_records(path)
        assert [(r.id, r.regime, r.gold) for r in got] == [(r.id, r.regime, r.gold) for r in ref]
        for a, b in zip(got, ref):
            assert all(np.array_equal(x.labels, y.labels) and np.array_equal(x.facts["R"], y.facts["R"])
                       for x, y in zip(a.train, b.train))


def test_tasks_as_released_and_as_holdout_folds():
    up = load_upstream_dir(FIX)
    rel = build_tasks(up, train_worlds=4, max_folds=5)
    assert [t.mode for t in rel] == ["released"] * 3
    assert rel[0].heldout_index == [-1] and len(rel[0].heldout) == 1       # the record's own test world
    up.records = []
    folds = build_tasks(up, train_worlds=4, max_folds=5)
    assert [(t.task_id, t.fold) for t in folds] == [(tid, j) for tid in ("fullobs_v2_toy_cross_lift_qd1_001",
                                                                         "fullobs_v2_toy_unary_qd0_001")
                                                    for j in range(5)]   # tasks with < 5 worlds are skipped
    for t in folds:
        worlds = up.holdout[t.task_id].worlds
        assert t.heldout == [worlds[t.fold]] and t.heldout_index == [t.fold]
        assert len(t.instance.worlds) == 4 and all(w is not worlds[t.fold] for w in t.instance.worlds)
        assert t.instance.id == f"{t.task_id}@f{t.fold}" and t.gold is None
    assert len(build_tasks(up, train_worlds=4, max_folds=2)) == 4


def test_published_results_rechecked_on_the_vendored_worlds():
    up = load_upstream_dir(FIX)
    published = {"reports": {r.model: {tid: vars(t) for tid, t in r.tasks.items()} for r in up.reports},
                 "holdout": {tid: [_to_project(w) for w in h.worlds] for tid, h in up.holdout.items()}}
    rc = llm_recheck(published)
    assert (rc["n_checked"], rc["mismatches"], rc["n_ast"], rc["ast_mismatches"]) == (3, 0, 3, 0)
    # a wrong published verdict or size is caught
    bad = copy.deepcopy(published)
    bad["reports"]["toy-model-1"]["fullobs_v2_toy_unary_qd0_002"]["holdout_correct"] = True
    bad["reports"]["toy-model-1"]["fullobs_v2_toy_unary_qd0_001"]["correct_ast"] = 8
    rc = llm_recheck(bad)
    assert rc["mismatched"] == ["toy-model-1:fullobs_v2_toy_unary_qd0_002"]
    assert rc["ast_mismatched"] == ["toy-model-1:fullobs_v2_toy_unary_qd0_001"]


def _to_project(w):
    return w.to_json("fullobs")


def test_upstream_ast_convention():
    # upstream counts n-ary and/or as nested binary nodes: published correct_ast 18 for this 3-way and
    f = parse("(exists y (and (P y) (Q y) (forall z (or (not (R z y)) (S x z)))))")
    assert binary_size(f) == 18 and binary_size(parse("(and (P x) (Q x))")) == 5
    assert family_of("fullobs_v2_guardless_cross_scope_lift_qd2_003") == "guardless_cross_scope_lift_qd2"
    assert family_of("simple_001") == "other"


# ---------------------------------------------------------------- malformed entries
def _holdout_with(tmp_path, change) -> Path:
    rows = _raw_holdout()
    change(rows[0])
    p = tmp_path / "x_holdout.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("change, words", [
    (lambda r: r["worlds"][1]["predicates"]["R"]["true"].append("(a0, a99)"),
     ["x_holdout.jsonl:1", "fullobs_v2_toy_cross_lift_qd1_001", "worlds[1].predicates.R.true", "'a99'",
      "not in the world's domain"]),
    (lambda r: r["worlds"][0]["predicates"]["R"]["true"].append("a0 a1"),
     ["worlds[0].predicates.R.true", "binary atom"]),
    (lambda r: r["worlds"][0]["predicates"].update({"T": {"true": ["a0"]}}),
     ["worlds[0].predicates.T", "unknown predicate 'T'"]),
    (lambda r: r["worlds"][2]["targetExtension"].update({"T_true": ["a0", "zz"]}),
     ["worlds[2].targetExtension.T_true[1]", "'zz'"]),
    (lambda r: r["worlds"][0]["targetExtension"].update({"T_false": ["a0"]}),
     ["worlds[0].targetExtension", "do not partition"]),
    (lambda r: r["worlds"][0].update({"domainSize": 99}), ["worlds[0].domainSize", "does not match"]),
    (lambda r: r["worlds"][0].update({"domain": ["a0", "a0"]}), ["worlds[0].domain", "listed twice"]),
    (lambda r: r["worlds"][0].update({"domain": [f"a{i}" for i in range(40)]}), ["worlds[0].domain", "1..31"]),
    (lambda r: r.update({"generated_worlds": 4}), ["field generated_worlds", "5 worlds are listed"]),
    (lambda r: r.pop("task_id"), ["x_holdout.jsonl:1", "field task_id"]),
    (lambda r: r["worlds"][0].update({"unknownAtoms": {"P": ["a1"]}}), ["worlds[0].unknownAtoms", "only allowed in EC"]),
    (lambda r: r["worlds"][0]["predicates"]["P"].update({"false": r["worlds"][0]["predicates"]["P"]["true"][:1]}),
     ["worlds[0].predicates.P", "both true and false"]),
])
def test_malformed_holdout_entries_name_file_task_and_field(tmp_path, change, words):
    with pytest.raises(UpstreamError) as err:
        load_holdout(_holdout_with(tmp_path, change))
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def _records_with(tmp_path, k, change) -> Path:
    recs = _raw_records()
    change(recs[k])
    p = tmp_path / "bad_records.json"
    p.write_text(json.dumps(recs))
    return p


@pytest.mark.parametrize("k, change, words", [
    (0, lambda r: r.update({"schemaVersion": "v0"}), ["'fullobs_v2_toy_cross_lift_qd1_003'", "schemaVersion"]),
    (0, lambda r: r.update({"task": "Abduction"}), ["field task", "FullObs, CI, EC"]),
    (0, lambda r: r["problemDescription"]["hiddenTarget"].update({"formula": "(forall y (R x y)"}),
     ["problemDescription.hiddenTarget.formula", "malformed formula", "line 1, column"]),
    (0, lambda r: r["problemDescription"].pop("hiddenTarget"), ["problemDescription.hiddenTarget.formula"]),
    (0, lambda r: r["problem"]["task"].update({"trainWorldIds": ["train_0", "nope"]}),
     ["problem.task.trainWorldIds", "'nope'"]),
    (1, lambda r: r["problem"]["task"].pop("yesWorldIds"), ["'ci_toy_unary_001'", "problem.task.yesWorldIds"]),
    (1, lambda r: r.update({"scenario": "E"}), ["field scenario", "does not match task CI"]),
    (2, lambda r: r["problem"]["worlds"][0]["unknownAtoms"].update({"Q": ["a1", "a3"]}) or
     r["problem"]["worlds"][0]["predicates"]["Q"].update({"true": ["a3"], "false": []}),
     ["'ec_toy_unary_001'", "problem.worlds[0].unknownAtoms.Q", "both unknown and observed"]),
    (2, lambda r: r["problem"]["worlds"][1].update({"worldId": "train_0"}), ["problem.worlds[1].worldId", "duplicate"]),
])
def test_malformed_records_name_task_and_field(tmp_path, k, change, words):
    with pytest.raises(UpstreamError) as err:
        load_records(_records_with(tmp_path, k, change))
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_malformed_report_and_files(tmp_path):
    doc = json.loads(REPORT.read_text())
    doc["tasks"][1]["correct"] = "yes"
    p = tmp_path / "m_report.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(UpstreamError, match=r"tasks\[1\]\.correct.*true/false"):
        load_llm_report(p)
    doc = json.loads(REPORT.read_text())
    doc["schema_version"] = "other"
    p.write_text(json.dumps(doc))
    with pytest.raises(UpstreamError, match="schema_version"):
        load_llm_report(p)
    gz = tmp_path / "broken.yaml.gz"
    gz.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(UpstreamError, match="not a readable gzip file"):
        load_records(gz)
    y = tmp_path / "alias.yaml"
    y.write_text("- &a [1, 2]\n- *a\n")
    with pytest.raises(UpstreamError, match="alias"):
        load_records(y)


def test_bounded_before_parsing(tmp_path, monkeypatch):
    deep = tmp_path / "deep_holdout.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")          # no RecursionError: refused unparsed
    with pytest.raises(UpstreamError, match="nested 100000 levels deep"):
        load_holdout(deep)
    deep.write_text('{"id": ' + "9" * 5000 + "}\n")                              # past int()'s digit limit
    with pytest.raises(UpstreamError, match=r"deep_holdout\.jsonl:1: not valid JSON \(Exceeds the limit"):
        load_holdout(deep)
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("[" * 5_000 + "]" * 5_000 + "\n")
    with pytest.raises(UpstreamError, match="nested too deeply"):
        load_records(deep_yaml)
    monkeypatch.setattr(cs, "MAX_FILE_BYTES", 1000)
    with pytest.raises(UpstreamError, match="over the limit of 1,000 bytes"):
        load_holdout(HOLDOUT)
    bomb = tmp_path / "bomb.yaml.gz"
    bomb.write_bytes(gzip.compress(b"#" * 10_000))
    monkeypatch.setattr(cs, "MAX_DECOMPRESSED", 5_000)
    with pytest.raises(UpstreamError, match="decompresses to more than"):
        load_records(bomb)


# ---------------------------------------------------------------- prepare without / with a broken vendored folder
def test_prepare_upstream_absent_or_broken(tmp_path):
    from types import SimpleNamespace

    from stages.common.config import ConfigError
    from stages.induction.prepare import Config, prepare_upstream

    ctx = SimpleNamespace(out=tmp_path)
    meta = prepare_upstream(Config(upstream_dir=str(tmp_path / "nowhere")), ctx)
    assert meta["vendored"] is False and "no upstream files" in meta["reason"]
    assert (tmp_path / "upstream_instances.jsonl").read_text() == ""
    with pytest.raises(ConfigError, match="upstream_dir: no vendored upstream files"):
        prepare_upstream(Config(upstream="required", upstream_dir=str(tmp_path / "nowhere")), ctx)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x_holdout.jsonl").write_text('{"task_id": "t", "worlds": "no"}\n')
    with pytest.raises(ConfigError, match=r"upstream_dir: .*x_holdout.jsonl:1: task 't': field worlds"):
        prepare_upstream(Config(upstream_dir=str(broken)), ctx)
    assert prepare_upstream(Config(upstream="off"), ctx)["vendored"] is False


# ---------------------------------------------------------------- the vendored release itself
VENDORED = Path(__file__).parents[2] / "stages" / "induction" / "upstream"


@pytest.mark.real_source
def test_vendored_release_loads_with_its_licence_and_provenance():
    assert "MIT License" in (VENDORED / "LICENSE").read_text()
    prov = (VENDORED / "PROVENANCE.md").read_text()
    assert "SerafimBatzoglou/concept-synth" in prov and "660bc46d8f5f8200b32c5d1e76b8fdc7df32389a" in prov
    up = load_upstream_dir(VENDORED)
    assert up is not None and not up.records and len(up.holdout) == 36 and len(up.registry) == 15
    counts = sorted(len(h.worlds) for h in up.holdout.values())
    assert counts.count(5) == 25 and counts.count(0) == 7
    for h in up.holdout.values():                    # released worlds: 9-11 objects, out-degree exactly 2
        for w in h.worlds:
            assert 9 <= w.domain <= 11
            assert (w.facts["R"].sum(1) == 2).all() and (w.facts["S"].sum(1) == 2).all()
            assert 0 < w.labels.sum() < w.domain
    assert {r.id for r in up.registry} >= {"claude-opus-5", "gpt-5.6-sol-xhigh"}
    assert sum(len(build_tasks(up, 4, 5)) for _ in [0]) == 125


@pytest.mark.real_source
def test_lift_solves_a_released_task_and_labels_its_held_out_world():
    """The issue's independent check, reproduced: trained on 4 released holdout worlds of
    guardless_cross_scope_lift_qd2_003, the lift enumerator finds a size-12 formula exact on the 5th."""
    from stages.induction.lift import synthesize_lift
    from stages.induction.semantics import evaluate

    up = load_upstream_dir(VENDORED)
    t = [t for t in build_tasks(up, 4, 5) if t.task_id == "fullobs_v2_guardless_cross_scope_lift_qd2_003"][4]
    r = synthesize_lift(t.instance, max_generated=200_000, max_size=14, backend="torch")
    assert r.formula is not None and binary_size(r.formula) == 12 and is_valid(r.formula, t.instance)[0]
    assert np.array_equal(evaluate(r.formula, t.heldout[0]), t.heldout[0].labels)
