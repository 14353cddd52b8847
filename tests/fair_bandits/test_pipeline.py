"""Smoke pipeline end to end (no NaN/Infinity token in any JSON output), the fixed CLI (single-threaded
by default, finite output with null + reason), and bad-input errors (one line, exit 2, nothing written)."""
from __future__ import annotations

import json

import pytest
import torch

from stages.fair_bandits.report import CLAIMS
from stages.fair_bandits.scm import EXAMPLES
from stages.fair_bandits.simulate import main


def _strict_load(path):
    def bad(name):
        raise AssertionError(f"{path}: {name} token in a JSON output")
    return json.loads(path.read_text(), parse_constant=bad)


def test_smoke_pipeline_end_to_end(smoke_run):
    out = smoke_run("fair_bandits")
    for stage in ("prepare", "evaluate", "report"):
        for p in out[stage].rglob("*.json"):
            _strict_load(p)
    metrics = _strict_load(out["report"] / "metrics.json")
    assert [c["name"] for c in metrics["claims"]] == [c.name for c in sorted(CLAIMS, key=lambda c: c.kind != "finding")]
    assert metrics["kernels"]["fair_round_step"]["parity_max_abs_err"] == 0.0
    res = metrics["metrics"]["results"]
    assert res["worlds"]["official"]["methods"]["ucb"]["final"]["violation"] == [0.0, 0.0, 0.0]
    assert "tabular" in res["worlds"]["binding"]                       # the non-parametric variant ran
    for name, rep in res["reproduction"].items():                      # the transcribed official loop agrees
        assert rep["same_actions"] == 1.0 and rep["max_abs_diff_cum_violation"] < 1e-9, name
    kinds = {c["name"]: c["kind"] for c in metrics["claims"]}
    assert kinds["official_constraint_inactive"] == "check" and kinds["violation_sublinear_binding"] == "finding"
    specs = _strict_load(out["report"] / "plots" / "_specs.json")
    assert specs["time_per_round"]["x"] == "t" and len(specs["time_per_round"]["y"]) == 2     # issue 39 axes
    assert specs["violation_binding"]["x"] == "t" and "dologb" in specs["violation_binding"]["y"]
    assert (out["report"] / "figures" / "time_per_round.png").stat().st_size > 0


def test_cli_writes_finite_results_single_threaded(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(n))
    out = tmp_path / "r.json"
    assert main(["--scm", str(EXAMPLES / "binding.json"), "--horizon", "40", "--seeds", "2", "--out", str(out),
                 "--methods", "dologb,ucb,oracle,tabular"]) == 0
    assert seen == [1]
    r = _strict_load(out)
    e = r["methods"]["dologb"]
    assert set(e["final"]) >= {"regret", "regret_plus", "violation", "violation_DE", "violation_IE", "violation_SE",
                               "penalized_regret"}
    assert len(e["final"]["regret"]) == 2 and "violation" in e["exponents"] and "tabular" in r["methods"]
    assert main(["--scm", str(EXAMPLES / "binding.json"), "--horizon", "40", "--seeds", "1", "--out", str(out),
                 "--methods", "ucb", "--threads", "3"]) == 0 and seen[-1] == 3


def test_cli_no_fair_arm_writes_null_and_a_reason(tmp_path):
    """An SCM where no arm is fair (τ = 0): regret against the least-unfair arm can be negative, so its
    exponent is undefined — written as null with the reason, never as a bare NaN."""
    scm = tmp_path / "tau0.json"
    scm.write_text(json.dumps({**json.loads((EXAMPLES / "binding.json").read_text()), "tau": 0.0}))
    out = tmp_path / "r.json"
    assert main(["--scm", str(scm), "--horizon", "300", "--seeds", "3", "--out", str(out), "--methods", "dologb,ucb"]) == 0
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    r = _strict_load(out)
    exps, why = r["methods"]["dologb"]["exponents"]["regret"], r["methods"]["dologb"]["exponent_reasons"]["regret"]
    assert None in exps and all((v is None) == bool(w) for v, w in zip(exps, why) if not w.startswith("identically"))


@pytest.mark.parametrize("args,words", [
    (["--horizon", "0"], "--horizon"),
    (["--seeds", "0"], "--seeds"),
    (["--methods", "foo"], "--methods"),
    (["--threads", "0"], "--threads"),
    (["--rho", "1e308"], "--rho"),
])
def test_cli_bad_numbers(tmp_path, capsys, args, words):
    base = {"--scm": str(EXAMPLES / "official.json"), "--horizon": "10", "--seeds": "1", "--out": str(tmp_path / "o.json")}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    assert main([x for kv in base.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_cli_bad_files(tmp_path, capsys):
    spec = json.loads((EXAMPLES / "binding.json").read_text())
    cases = {
        "tau": {**spec, "tau": -1},
        "exceeds 1e+06 in magnitude": {**spec, "arms": [[1e308], [-1e308], [0.5]]},          # bounded numbers
        "nesting depth": None,                                                               # deep nesting
        "byte limit": None,                                                                  # file size
    }
    for words, data in cases.items():
        bad = tmp_path / "bad.json"
        if words == "nesting depth":
            bad.write_text("[" * 100_000 + "]" * 100_000)
        elif words == "byte limit":
            bad.write_text(json.dumps({**spec, "description": "x" * 2_000_000}))
        else:
            bad.write_text(json.dumps(data))
        out = tmp_path / "o.json"
        assert main(["--scm", str(bad), "--horizon", "10", "--seeds", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
        assert not out.exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(spec))
    assert main(["--scm", str(bad), "--horizon", "10", "--seeds", "1", "--out", str(tmp_path)]) == 2
    assert "directory" in capsys.readouterr().err
    assert main(["--scm", str(bad), "--horizon", "10", "--seeds", "1", "--out", str(bad)]) == 2
    assert "input" in capsys.readouterr().err
