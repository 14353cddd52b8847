"""Config loading: profiles, and every bad-input path fails early with the key named."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from stages.common.config import ConfigError, StageConfig, active_profile, deep_merge, stage_block, validate
from stages.common.paths import ROOT
from stages.common.runner import load_config


class Inner(StageConfig):
    width: int = Field(4, ge=1)


class Demo(StageConfig):
    lr: float = Field(0.1, gt=0)
    steps: int = Field(10, ge=1)
    inner: Inner = Inner()


PARAMS = {"profile": "default", "papers": {"demo": {"train": {
    "lr": 0.5, "steps": 100, "profiles": {"smoke": {"steps": 2, "inner": {"width": 2}}, "full": {"steps": 9999}}}}}}


def test_profiles_merge_over_defaults():
    assert stage_block(PARAMS, "demo", "train", "default") == {"lr": 0.5, "steps": 100}
    smoke = validate(Demo, stage_block(PARAMS, "demo", "train", "smoke"), "x")
    assert (smoke.lr, smoke.steps, smoke.inner.width) == (0.5, 2, 2)
    assert validate(Demo, stage_block(PARAMS, "demo", "train", "full"), "x").steps == 9999


def test_deep_merge_keeps_siblings():
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}, "w") == {"a": {"b": 1, "c": 3}}


@pytest.mark.parametrize("block, needle", [
    ({"lr": 0.1, "stpes": 3}, "x.stpes: unknown key"),
    ({"lr": "0.1"}, "x.lr: Input should be a valid number"),
    ({"lr": -1.0}, "x.lr: Input should be greater than 0"),
    ({"steps": 1.5}, "x.steps"),
    ({"inner": {"width": 0}}, "x.inner.width: Input should be greater than or equal to 1"),
])
def test_bad_values_name_the_key(block, needle):
    with pytest.raises(ConfigError) as err:
        validate(Demo, block, "x")
    assert needle in str(err.value)


def test_unknown_paper_stage_and_profile():
    with pytest.raises(ConfigError, match=r"papers\.nope: unknown paper"):
        stage_block(PARAMS, "nope", "train", "default")
    with pytest.raises(ConfigError, match="profile: must be one of"):
        active_profile({"profile": "huge"})
    bad = {"papers": {"demo": {"train": {"profiles": {"tiny": {}}}}}}
    with pytest.raises(ConfigError, match=r"papers\.demo\.train\.profiles\.tiny: unknown profile"):
        stage_block(bad, "demo", "train", "smoke")
    bad = {"papers": {"demo": {"trian": {}}}}
    with pytest.raises(ConfigError, match=r"papers\.demo\.trian: unknown stage"):
        stage_block(bad, "demo", "train", "default")


def test_every_registered_stage_config_validates_in_every_profile():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for slug in params["papers"]:
        for stage in ("prepare", "train", "evaluate", "report"):
            load_config(slug, stage, "smoke")  # validates the block under every profile


def _cli(tmp_path: Path, params: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    # PAPERS_ROOT points the whole package (params.yaml, data/, reports/) at the temp dir
    return subprocess.run([sys.executable, "-m", "stages", *args], cwd=ROOT, capture_output=True, text=True,
                          env={"WANDB_MODE": "disabled", "PATH": "/usr/bin:/bin", "PAPERS_ROOT": str(tmp_path)})


def test_cli_errors_are_one_line_exit_2_and_write_nothing(tmp_path):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["papers"]["reversal_curse"]["prepare"]["n_pairs"] = "forty"
    res = _cli(tmp_path, params, "prepare", "reversal_curse")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().count("\n") == 0
    assert "papers.reversal_curse.prepare.n_pairs" in res.stderr
    assert not (tmp_path / "data").exists()
    for args, needle in [(("prepare", "no_such_paper"), "papers.no_such_paper: unknown paper"),
                         (("bake", "reversal_curse"), "stage: unknown stage 'bake'")]:
        res = _cli(tmp_path, params, *args)
        assert res.returncode == 2 and needle in res.stderr, res.stderr


def test_shared_seeds_and_distinct_types_reject_duplicates_naming_the_key():
    from typing import Annotated

    from stages.common.config import Distinct, Seeds

    class Grid(StageConfig):
        seeds: Seeds = [0]
        arms: Annotated[list[str], Distinct] = ["a"]

    for block, needle in [({"seeds": [2, 5, 2]}, "x.seeds: duplicate entry 2"),
                          ({"arms": ["b", "c", "b"]}, "x.arms: duplicate entry 'b'")]:
        with pytest.raises(ConfigError) as err:
            validate(Grid, block, "x")
        assert needle in str(err.value)
    assert validate(Grid, {"seeds": [3, 1], "arms": ["b", "a"]}, "x").seeds == [3, 1]


@pytest.mark.parametrize("text, needle", [
    ("profile: default\npapers:\n  opus:\n    prepare: {seed: " + "9" * 5000 + "}\n", "unreadable value"),
    ("profile: default\npapers:\n  opus:\n    prepare: {seed: 36893488147419103232}\n", "integer beyond 64 bits"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nc: [" + ", ".join(["*a"] * 70) + "]\n", "more than 64 YAML aliases"),
    ("papers: " + "[" * 40 + "]" * 40 + "\n", "nests deeper than 32 levels"),
])
def test_hostile_params_are_one_line_and_fast(tmp_path, text, needle):
    """Issue 40: a huge integer, an alias bomb or deep nesting in params.yaml is refused up front."""
    from stages.common.config import ConfigError, read_params

    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle) as err:
        read_params(path)
    assert "\n" not in str(err.value)


def test_oversized_params_file_is_refused_before_reading(tmp_path):
    from stages.common.config import ConfigError, read_params

    path = tmp_path / "params.yaml"
    path.write_text("profile: default\n# " + "x" * 2_100_000 + "\npapers: {}\n")
    with pytest.raises(ConfigError, match="limit 2,000,000"):
        read_params(path)
