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


def test_a_default_override_that_another_profile_contradicts(tmp_path):
    """star_kv on seeds 5-9 with side_seeds [5]: valid at default, but its smoke profile sets seeds [0]; the study
    runs one profile, so the scratch params keep only that profile's overrides and the default config loads."""
    from stages.common.runner import load_config
    from stages.common.study import only_profile

    changed = apply_overrides(read_params(), "star_kv", ["train.seeds=[5, 6, 7, 8, 9]", "train.side_seeds=[5]"])
    raw, kept = tmp_path / "raw.yaml", tmp_path / "kept.yaml"
    raw.write_text(yaml.safe_dump(changed, sort_keys=False))
    with pytest.raises(ConfigError, match=r"profile smoke.*side_seeds: \[5\] is not a subset of seeds \[0\]"):
        load_config("star_kv", "train", "default", raw)
    scratch = only_profile(changed, "star_kv", "default")
    assert all("profiles" not in scratch["papers"]["star_kv"][s] for s in ("prepare", "train", "evaluate", "report"))
    assert "profiles" in changed["papers"]["star_kv"]["train"]                 # the input is not modified
    kept.write_text(yaml.safe_dump(scratch, sort_keys=False))
    _, cfg, prof = load_config("star_kv", "train", "default", kept)
    assert prof == "default" and cfg.seeds == [5, 6, 7, 8, 9] and cfg.side_seeds == [5]
    smoke = only_profile(changed, "star_kv", "smoke")["papers"]["star_kv"]["train"]["profiles"]
    assert list(smoke) == ["smoke"] and smoke["smoke"]["seeds"] == [0]


def test_a_value_the_stage_config_refuses_is_one_line(tmp_path, capsys):
    """An override naming an existing key with a value the stage's Config rejects: exit 2, one line, no --out."""
    out = tmp_path / "o"
    assert main(["ftrl_potential", "--out", str(out), "--set", "train.start_seeds=nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: papers.ftrl_potential.train") and "start_seeds" in err and len(err.splitlines()) == 1
    assert not out.exists()
