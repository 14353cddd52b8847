"""stages.common.study: a paper's pipeline with params changed, outside the DVC graph and the committed results."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from stages.common.config import ConfigError, read_params
from stages.common.paths import ROOT
from stages.common.study import apply_overrides, main, parse_override, run_study


def test_overrides_read_as_yaml_into_the_default_block():
    params = read_params()
    out = apply_overrides(params, "clip_binding", ["prepare.v=6", "train.steps=3000", "prepare.seeds=[4, 5]",
                                                   "train.trainer.enable_progress_bar=true"])
    paper = out["papers"]["clip_binding"]
    assert paper["prepare"]["v"] == 6 and paper["train"]["steps"] == 3000 and paper["prepare"]["seeds"] == [4, 5]
    assert paper["train"]["trainer"]["enable_progress_bar"] is True
    assert params["papers"]["clip_binding"]["prepare"]["v"] == 8            # the checkout's params are untouched
    assert paper["train"]["profiles"] == params["papers"]["clip_binding"]["train"]["profiles"]


@pytest.mark.parametrize("text, match", [
    ("train.steps", "expected stage.key=value"),
    ("steps=3", "must name a stage and a key"),
    ("trian.steps=3", "'trian' is not a stage"),
    ("train.stpes=3", r"papers.clip_binding.train.stpes is not in params.yaml"),
    ("train.trainer.nope=1", r"papers.clip_binding.train.trainer.nope is not in params.yaml"),
    ("train.steps.deeper=1", r"papers.clip_binding.train.steps.deeper is not in params.yaml"),
    ("train.steps=[1, 2", "not YAML"),
])
def test_bad_overrides_name_the_key(text, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides(read_params(), "clip_binding", [text])


def test_unknown_paper_and_cli_exit_code(tmp_path, capsys):
    with pytest.raises(ConfigError, match="papers.nope"):
        apply_overrides(read_params(), "nope", [])
    assert main(["clip_binding", "--out", str(tmp_path / "o"), "--set", "train.stpes=3"]) == 2
    assert "train.stpes is not in params.yaml" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()                                   # nothing written on a bad override
    assert parse_override("evaluate.a.b=null") == ("evaluate", ["a", "b"], None)


def test_study_runs_the_four_stages_with_the_override(tmp_path):
    """ftrl_potential at smoke with two start seeds instead of five: the report's per-seed metrics follow the
    override, the scratch params carry it, and study.json names it."""
    root, out = tmp_path / "root", tmp_path / "study"
    root.mkdir()
    info = run_study("ftrl_potential", ["train.start_seeds=[3, 4]"], out, scratch=root, profile="smoke")
    assert yaml.safe_load((root / "params.yaml").read_text())["papers"]["ftrl_potential"]["train"]["start_seeds"] \
        == [3, 4]
    assert (out / "metrics.json").is_file()
    assert (out / "report.md").read_text().startswith("> **Study, not the default run**")
    assert "`train.start_seeds=[3, 4]`" in (out / "report.md").read_text().split("\n")[0]
    saved = json.loads((out / "study.json").read_text())
    assert saved == info and saved["overrides"] == ["train.start_seeds=[3, 4]"] and saved["profile"] == "smoke"
    assert set(saved["stage_wall_s"]) == {"prepare", "train", "evaluate", "report"}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:                                              # provenance: the commit the code is at
        assert saved["commit"] == head.stdout.strip() and isinstance(saved["code_dirty"], bool)
        assert f"code at commit `{saved['commit'][:10]}`" in (out / "report.md").read_text().split("\n")[0]
    train_cfg = json.loads((root / "data" / "ftrl_potential" / "train" / "_stage.json").read_text())
    assert train_cfg["profile"] == "smoke"
    tmeta = json.loads((root / "data" / "ftrl_potential" / "train" / "meta.json").read_text())
    assert tmeta["start_seeds"] == [3, 4]                       # the stages ran with the override
