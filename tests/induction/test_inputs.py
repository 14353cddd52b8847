"""Bad input: instance and prediction files, CLIs (exit 2, one line), configs (ConfigError naming the key)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stages.common.config import ConfigError, validate
from stages.common.paths import ROOT
from stages.common.runner import load_config
from stages.induction import check as check_cli
from stages.induction import evaluate, prepare, train
from stages.induction import solve as solve_cli
from stages.induction.instances import InstanceError, load_instances, load_predictions

GOOD = {"id": "fo-0001", "regime": "fullobs", "gold": "(exists y (and (R x y) (P y)))",
        "worlds": [{"domain": 3, "facts": {"P": [1], "Q": [], "R": [[0, 1], [2, 2]], "S": []}, "labels": [1, 0, 0]},
                   {"domain": 2, "facts": {"P": [0], "R": [[1, 0]]}, "labels": [0, 1]}]}


def _write(tmp_path, name, objs):
    path = tmp_path / name
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def _bad(**world_changes):
    obj = json.loads(json.dumps(GOOD))
    obj["id"] = "fo-0002"
    obj["worlds"][1].update(world_changes)
    return obj


@pytest.mark.parametrize("obj, words", [
    (_bad(labels=[0, 1, 1]), ["inst.jsonl:2", "'fo-0002'", "worlds[1].labels", "expected 2 labels"]),
    (_bad(facts={"P": [5]}), ["inst.jsonl:2", "'fo-0002'", "worlds[1].facts.P[0]", "outside the domain 0..1"]),
    (_bad(facts={"R": [[0, 2]]}), ["'fo-0002'", "worlds[1].facts.R[0]", "R(0, 2)", "outside"]),
    (_bad(facts={"T": [0]}), ["'fo-0002'", "worlds[1].facts.T", "unknown predicate 'T'"]),
    (_bad(unknown={"P": [1]}), ["'fo-0002'", "worlds[1].unknown", "only allowed in regime 'ec'"]),
    (_bad(labels=[0, 2]), ["'fo-0002'", "worlds[1].labels", "0 or 1"]),
    (_bad(domain=0), ["'fo-0002'", "worlds[1].domain"]),
    (dict(GOOD, id="fo-0002", regime="induction"), ["'fo-0002'", "field regime"]),
    (dict(GOOD, id="fo-0002", gold="(exists y (R x y)"), ["'fo-0002'", "field gold", "line 1, column"]),
    (dict(GOOD, id="fo-0002", regime="ci"), ["'fo-0002'", "worlds[0].kind"]),
    (dict(GOOD, id="fo-0001"), ["inst.jsonl:2", "'fo-0001'", "field id", "duplicate"]),
    ("{not json", ["inst.jsonl:2", "not valid JSON"]),
])
def test_bad_instances_name_line_instance_and_field(tmp_path, obj, words):
    path = _write(tmp_path, "inst.jsonl", [GOOD, obj])
    with pytest.raises(InstanceError) as err:
        load_instances(path)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_prediction_file_missing_an_id(tmp_path):
    second = dict(GOOD, id="fo-0002")
    insts = load_instances(_write(tmp_path, "inst.jsonl", [GOOD, second]))
    preds = _write(tmp_path, "pred.jsonl", [{"id": "fo-0001", "formula": "(P x)"}])
    with pytest.raises(InstanceError, match=r"instance 'fo-0002'.*field id: no prediction"):
        load_predictions(preds, insts)


def test_check_reports_malformed_formulas_invalid_and_exits_0(tmp_path, capsys):
    second = dict(GOOD, id="fo-0002")
    third = dict(GOOD, id="fo-0003")
    inst = _write(tmp_path, "inst.jsonl", [GOOD, second, third])
    preds = _write(tmp_path, "pred.jsonl", [
        {"id": "fo-0001", "formula": "(exists y (and (R x y) (P y)))", "size": 8, "seconds": 0.1},
        {"id": "fo-0002", "formula": "(exists y (and (R x y) (P y)"},
        {"id": "fo-0003", "formula": None}])
    out = tmp_path / "res.jsonl"
    assert check_cli.main(["--instances", str(inst), "--predictions", str(preds), "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["valid"] for r in rows] == [True, False, False]
    assert rows[0]["size"] == 8 and rows[0]["gold_size"] == 8
    assert rows[1]["error"].startswith("parse error: line 1, column") and rows[2]["error"] == "no formula"
    assert "fullobs: 1/3 valid" in capsys.readouterr().out


def test_cli_bad_instance_file_exits_2_with_one_line(tmp_path):
    inst = _write(tmp_path, "inst.jsonl", [GOOD, _bad(labels=[1])])
    preds = _write(tmp_path, "pred.jsonl", [{"id": "fo-0001", "formula": "(P x)"}])
    proc = subprocess.run([sys.executable, "-m", "stages.induction.check", "--instances", str(inst),
                           "--predictions", str(preds)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "inst.jsonl:2" in lines[0] and "fo-0002" in lines[0] and "labels" in lines[0]
    assert solve_cli.main(["--instances", str(inst), "--out", str(tmp_path / "o.jsonl")]) == 2


def test_deep_nesting_and_huge_files_refused_before_parsing(tmp_path, monkeypatch, capsys):
    """Issue 40: a 100k-deep JSON nesting (instances or predictions) and an oversized file are one line, exit 2,
    nothing written -- never a RecursionError traceback."""
    from stages.induction import instances as inst_mod

    deep = tmp_path / "deep.jsonl"
    deep.write_text(json.dumps(GOOD) + "\n" + '{"id": "x", "worlds": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    out = tmp_path / "o.jsonl"
    assert solve_cli.main(["--instances", str(deep), "--out", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "deep.jsonl:2" in err[0] and "nested 100001 levels deep" in err[0]
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"id": "x", "domain": ' + "9" * 5000 + "}\n")                # past int()'s digit limit
    assert solve_cli.main(["--instances", str(huge), "--out", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "huge.jsonl:1: not valid JSON (Exceeds the limit" in err[0]
    good = _write(tmp_path, "inst.jsonl", [GOOD])
    assert check_cli.main(["--instances", str(good), "--predictions", str(deep),
                           "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "refused before parsing" in capsys.readouterr().err
    monkeypatch.setattr(inst_mod, "MAX_FILE_BYTES", 100)
    assert solve_cli.main(["--instances", str(good), "--out", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over the limit of 100 bytes" in err[0]


def test_solve_then_check_round_trip(tmp_path):
    inst = _write(tmp_path, "inst.jsonl", [GOOD])
    out = tmp_path / "pred.jsonl"
    assert solve_cli.main(["--instances", str(inst), "--out", str(out), "--timeout", "5"]) == 0
    pred = json.loads(out.read_text())
    assert set(pred) == {"id", "formula", "size", "seconds", "status", "grammar"} and pred["id"] == "fo-0001"
    assert pred["status"] == "solved"
    assert check_cli.check_files(inst, out)[0]["valid"]


@pytest.mark.parametrize("module, block, key", [
    (prepare, {"min_domain": 9, "max_domain": 5}, "min_domain"),
    (prepare, {"templates": ["nope"]}, "templates"),
    (prepare, {"unknown_rate": 1.5}, "unknown_rate"),
    (prepare, {"per_templat": 2}, "per_templat"),
    (train, {"safety_timeout_s": 0}, "safety_timeout_s"),
    (train, {"safety_timeout_s": float("nan")}, "safety_timeout_s"),
    (train, {"max_size": "big"}, "max_size"),
    (train, {"max_generated": 10**12}, "max_generated"),
    (train, {"device": "tpu"}, "device"),
    (train, {"seed": -1}, "seed"),
    (prepare, {"regimes": ["ci", "ci"]}, "regimes"),
    (prepare, {"regimes": ["induction"]}, "regimes"),
    (prepare, {"seeds": [0, 0, 1]}, "seeds"),
    (prepare, {"per_template": 10**6}, "per_template"),
    (evaluate, {"budgets_generated": [1000, 100]}, "budgets_generated"),
    (evaluate, {"budgets_generated": [100, 100]}, "budgets_generated"),
])
def test_bad_params_fail_at_load_naming_the_key(module, block, key):
    with pytest.raises(ConfigError, match=key):
        validate(module.Config, block, "papers.induction.stage")


def test_registered_configs_load_for_every_profile():
    for stage in ("prepare", "train", "evaluate", "report"):
        for profile in ("smoke", "default", "full"):
            load_config("induction", stage, profile)


def test_check_survives_pathological_formulas(tmp_path):
    from stages.induction.instances import load_instances as load

    inst = load(_write(tmp_path, "inst.jsonl", [GOOD]))[0]
    deep = "(not " * 5000 + "(P x)" + ")" * 5000
    res = check_cli.check_formula(inst, deep)
    assert not res["valid"] and "parse error" in res["error"]
    nested = "(P x)"
    for k in range(9):                                   # 9 nested quantifiers over a 3-object domain
        v = f"v{k}"
        nested = f"(exists {v} (and (R x {v}) {nested}))"
    res = check_cli.check_formula(inst, nested)
    assert res["size"] is not None and isinstance(res["valid"], bool)
    assert check_cli.check_formula(inst, 42)["error"].startswith("parse error")


@pytest.mark.parametrize("content", [b"\xff\xfe{bad utf8}\n", b'{"id": "a"}\x00\x01\x02'])
def test_cli_non_utf8_or_binary_input_is_one_line(tmp_path, content, capsys):
    inst = tmp_path / "inst.jsonl"
    inst.write_bytes(content)
    out = tmp_path / "o.jsonl"
    assert solve_cli.main(["--instances", str(inst), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "inst.jsonl" in err and ("UTF-8" in err or "binary" in err), err
    assert not out.exists()
    preds = _write(tmp_path, "pred.jsonl", [{"id": "a", "formula": "(P x)"}])
    assert check_cli.main(["--instances", str(inst), "--predictions", str(preds),
                           "--out", str(tmp_path / "c.jsonl")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    good = _write(tmp_path, "good.jsonl", [GOOD])
    preds.write_bytes(b"\x89PNG\x00\x00")                 # a binary predictions file
    assert check_cli.main(["--instances", str(good), "--predictions", str(preds),
                           "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "binary" in capsys.readouterr().err


def test_cli_out_that_is_a_directory_or_an_input_fails_before_work(tmp_path):
    inst = _write(tmp_path, "inst.jsonl", [GOOD])
    before = inst.read_text()
    assert solve_cli.main(["--instances", str(inst), "--out", str(tmp_path)]) == 2
    assert solve_cli.main(["--instances", str(inst), "--out", str(inst)]) == 2
    assert inst.read_text() == before
    preds = _write(tmp_path, "pred.jsonl", [{"id": "fo-0001", "formula": "(P x)"}])
    assert check_cli.main(["--instances", str(inst), "--predictions", str(preds), "--out", str(preds)]) == 2
    assert check_cli.main(["--instances", str(inst), "--predictions", str(preds), "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_cli_timeout_must_be_finite_and_positive(tmp_path, value, capsys):
    inst = _write(tmp_path, "inst.jsonl", [GOOD])
    out = tmp_path / "o.jsonl"
    assert solve_cli.main(["--instances", str(inst), "--out", str(out), "--timeout", value]) == 2
    assert "--timeout" in capsys.readouterr().err and not out.exists()


def test_solve_writes_incrementally_and_marks_fallbacks(tmp_path, monkeypatch):
    """Each line is flushed as solved (an interruption keeps it); an unsolved instance carries the
    bloated fallback formula marked status 'fallback'."""
    second = dict(GOOD, id="fo-0002")
    inst = _write(tmp_path, "inst.jsonl", [GOOD, second])
    out = tmp_path / "o.jsonl"
    real = solve_cli.solve_instance
    seen = []

    def interrupt_second(inst_, *a, **kw):
        if inst_.id == "fo-0002":
            seen.append(out.read_text())
            raise KeyboardInterrupt
        return real(inst_, *a, **kw)

    monkeypatch.setattr(solve_cli, "solve_instance", interrupt_second)
    with pytest.raises(KeyboardInterrupt):
        solve_cli.main(["--instances", str(inst), "--out", str(out)])
    assert json.loads(seen[0])["id"] == "fo-0001"                # first line already on disk
    monkeypatch.setattr(solve_cli, "solve_instance", real)
    assert solve_cli.main(["--instances", str(inst), "--out", str(out), "--max-generated", "5"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["status"] for x in lines] == ["fallback", "fallback"] and all(x["formula"] for x in lines)
