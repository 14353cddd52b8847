"""flows/replicate.py: the fresh-seed overrides are seed keys of every paper with unused seeds, the studies it
launches, and the table it writes from study folders (toy git repo; counts worked out by hand)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

import flows.replicate as rep
from stages.common.config import ConfigError, read_params, registered_papers
from tests.repo_copy import git


def test_every_paper_has_fresh_seeds_for_existing_seed_keys():
    params = read_params()
    rep.check_fresh_seeds(params)                               # raises on a missing paper, key or reused seed
    assert set(rep.FRESH_SEEDS) == set(registered_papers(params)) == set(rep.KEPT)
    # nested seeds inside a replaced list: only the oracle's seeds differ from vision2web's default agents
    text = rep.FRESH_SEEDS["vision2web"][-1]
    assert rep.seed_changes(rep._default(params, "vision2web", text), yaml.safe_load(text.split("=", 1)[1]),
                            "train.agents") == [("train.agents[0].seeds", [0], [5])]


@pytest.mark.parametrize("entry, needle", [
    ({}, "no entry for alpha"),
    ({"alpha": ["train.seeds=[3, 4, 5]", "train.steps=5"]}, "train.steps: not a seed value (3 -> 5)"),
    ({"alpha": ["train.seeds=[2, 3, 4]"]}, "train.seeds reuses default seeds [2]"),
    ({"alpha": ["train.seed=0"]}, "papers.alpha.train.seed is not in params.yaml"),
    ({"alpha": ["prepare.seed=0"]}, "'prepare.seed=0' changes no seed"),
    ({"alpha": ["train.agents=[{name: a, seeds: [0, 5]}]"]}, "train.agents[0].seeds reuses default seeds [0]"),
    ({"alpha": ["train.agents=[{name: b, seeds: [8, 9]}]"]}, "train.agents[0].name: not a seed value ('a' -> 'b')"),
    ({"alpha": ["train.agents=[{name: a, seeds: [8, 9]}, {name: c}]"]}, "train.agents: not a seed value"),
    ({"alpha": ["train.seeds=[3, 4, 5, 6]"]}, "train.seeds: 4 seeds instead of 3"),
    ({"alpha": ["train.n_seeds=5"]}, "train.n_seeds: not a seed value (3 -> 5; a list of integer seeds"),
    ({"alpha": ["train.arm_seeds={x: 2}"]}, "train.arm_seeds: not a seed value ({'x': 1} -> {'x': 2}"),
    ({"alpha": ["train.seeds=[3, 4, 4.5]"]}, "train.seeds: not a seed value"),
    ({"alpha": ["prepare.seed=true"]}, "prepare.seed: not a seed value (0 -> True"),
])
def test_bad_fresh_seed_entries_are_named(monkeypatch, entry, needle):
    params = {"papers": {"alpha": {"prepare": {"seed": 0}, "train": {
        "seeds": [0, 1, 2], "steps": 3, "n_seeds": 3, "arm_seeds": {"x": 1}, "agents": [{"name": "a", "seeds": [0, 1]}]}}}}
    monkeypatch.setattr(rep, "FRESH_SEEDS", entry)
    with pytest.raises(ConfigError) as err:
        rep.check_fresh_seeds(params)
    assert needle in str(err.value)


def test_runs_one_study_per_paper_with_its_overrides(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1 if "tgdt" in cmd else 0)

    monkeypatch.setattr(rep.subprocess, "run", fake_run)
    assert rep.run_replications(["star_kv", "tgdt"], tmp_path) == ["tgdt"]
    assert calls[0][1:] == ["-m", "stages.common.study", "star_kv", "--out", str(tmp_path / "star_kv_fresh_seeds"),
                            "--set", "train.seeds=[5, 6, 7, 8, 9]", "--set", "train.side_seeds=[5]"]
    assert calls[1][3] == "tgdt"


def test_table_from_study_folders(monkeypatch, tmp_path):
    """alpha committed with two findings; its fresh-seed study keeps one and moves the other to inconclusive;
    beta has no study yet."""
    root = tmp_path / "repo"
    (root / "reports" / "alpha").mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump({"papers": {"alpha": {}, "beta": {}}}))
    committed = [{"name": "a", "kind": "finding", "verdict": "holds", "values": {}},
                 {"name": "b", "kind": "finding", "verdict": "holds", "values": {"x": [1.0, 0.75]},
                  "stats": {"mean": 0.5, "lower": 0.25, "upper": 0.75}}]
    (root / "reports" / "alpha" / "claims.json").write_text(json.dumps({"claims": committed}))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "c")
    studies = tmp_path / "studies"
    folder = studies / "alpha_fresh_seeds"
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"slug": "alpha", "overrides": ["train.seeds=[3, 4, 5]"]}))
    (folder / "claims.json").write_text(json.dumps({"claims": [
        committed[0], dict(committed[1], verdict="inconclusive", values={"x": [1.0, 0.5]},
                           stats={"mean": 0.125, "lower": -0.25, "upper": 0.5})]}))
    monkeypatch.setattr(rep, "FRESH_SEEDS", {"alpha": ["train.seeds=[3, 4, 5]"], "beta": ["train.seeds=[1]"]})
    text = rep.table_text(studies, root)
    assert text.startswith("# Fresh-seed replication\n")
    assert "| alpha_fresh_seeds | alpha | `train.seeds=[3, 4, 5]` | 1/2 | 0/0 | 0 | 1 | - |" in text
    assert "1 of 2 committed verdicts the same in the studies, 0 moved between holds and fails" in text
    assert "| alpha | b | finding | holds (0.5 [0.25, 0.75]) | inconclusive (0.125 [-0.25, 0.5]) |" in text
    assert text.rstrip().endswith("- alpha: (not recorded)\n\nNot run yet: beta")


def test_cli_errors_are_one_line(monkeypatch, capsys, tmp_path):
    assert rep.main(["--papers", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown paper 'nope' (registered: ") and len(err.splitlines()) == 1
    monkeypatch.setattr(rep, "FRESH_SEEDS", {k: v for k, v in rep.FRESH_SEEDS.items() if k != "sciql"})
    assert rep.main(["--table"]) == 2
    assert capsys.readouterr().err.strip() == "error: flows.replicate.FRESH_SEEDS: no entry for sciql"


def test_table_only_writes_the_file(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(rep, "TABLE", tmp_path / "replication.md")
    monkeypatch.setattr(rep, "run_replications", lambda *a: pytest.fail("--table must not run studies"))
    assert rep.main(["--table"]) == 0
    text = (tmp_path / "replication.md").read_text()
    assert text.startswith("# Fresh-seed replication") and text == capsys.readouterr().out.rstrip("\n") + "\n"


def test_the_committed_table_is_what_the_study_folders_give():
    """reports/studies/replication.md equals the table the committed study folders give against the committed
    reports (commit hashes aside). After a paper's report is re-run, `make replicate TABLE=1` rewrites it (and the
    paper's study is then stale: `make replicate PAPERS=<slug>`)."""
    import re

    from flows.proc import ROOT

    def strip(text):
        return re.sub(r"\((?:[0-9a-f]{7,40}(?:, )?)+\)", "(<commit>)", text)

    committed = (ROOT / "reports" / "studies" / "replication.md").read_text()
    assert strip(committed) == strip(rep.table_text()), "stale: run `make replicate TABLE=1`"
