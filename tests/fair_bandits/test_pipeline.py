"""Smoke pipeline end to end, the fixed CLI, and its bad-input errors."""
from __future__ import annotations

import json

import pytest

from stages.common.config import ConfigError, validate
from stages.fair_bandits import prepare
from stages.fair_bandits.report import CLAIMS
from stages.fair_bandits.scm import EXAMPLES
from stages.fair_bandits.simulate import main


def test_smoke_pipeline_end_to_end(smoke_run):
    out = smoke_run("fair_bandits")
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    assert [c["name"] for c in metrics["claims"]] == [c.name for c in CLAIMS]
    assert metrics["kernels"]["fair_round_step"]["parity_max_abs_err"] == 0.0
    res = metrics["metrics"]["results"]
    assert "tabular" not in res["official_dologb"]["tau"]["methods"]   # 1 − a is outside the support
    assert res["official_dologb"]["tau"]["max_violation_ucb"] == 0.0
    assert (out["report"] / "figures" / "time_per_round.png").stat().st_size > 0


def test_cli_writes_results(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--scm", str(EXAMPLES / "binding.json"), "--horizon", "40", "--seeds", "2", "--out", str(out),
                 "--methods", "dologb,ucb,oracle"]) == 0
    r = json.loads(out.read_text())
    e = r["methods"]["dologb"]
    assert set(e["final"]) >= {"regret", "violation", "violation_DE", "violation_IE", "violation_SE", "penalized_regret"}
    assert len(e["final"]["regret"]) == 2 and "violation" in e["slopes"]


@pytest.mark.parametrize("args,words", [
    (["--horizon", "0"], "--horizon"),
    (["--seeds", "0"], "--seeds"),
    (["--methods", "foo"], "--methods"),
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
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads((EXAMPLES / "binding.json").read_text()), "tau": -1}))
    assert main(["--scm", str(bad), "--horizon", "10", "--seeds", "1", "--out", str(tmp_path / "o.json")]) == 2
    assert "tau" in capsys.readouterr().err
    assert main(["--scm", str(bad), "--horizon", "10", "--seeds", "1", "--out", str(tmp_path)]) == 2
    assert "directory" in capsys.readouterr().err
    assert main(["--scm", str(bad), "--horizon", "10", "--seeds", "1", "--out", str(bad)]) == 2
    assert "input" in capsys.readouterr().err


def test_bad_params():
    with pytest.raises(ConfigError, match="horizon"):
        validate(prepare.Config, {"horizon": 10**7}, "papers.fair_bandits.prepare")
    with pytest.raises(ConfigError, match="seeds"):
        validate(prepare.Config, {"seeds": [1, 1]}, "papers.fair_bandits.prepare")
    with pytest.raises(ConfigError, match="scms"):
        validate(prepare.Config, {"scms": ["nope.json"]}, "papers.fair_bandits.prepare")
