"""Bad params fail at config load with a message naming the key (issue: k < 2, k > n, n <= 0, negative penalty)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stages.common.config import ConfigError, validate
from stages.common.runner import load_config
from stages.cv_stability import evaluate, prepare, train

WHERE = "papers.cv_stability"


@pytest.mark.parametrize("stage", ["prepare", "train", "evaluate", "report"])
@pytest.mark.parametrize("profile", ["smoke", "default", "full"])
def test_params_load_for_every_profile(stage, profile):
    _, cfg, prof = load_config("cv_stability", stage, profile)
    assert prof == profile
    if stage == "prepare" and profile == "default":
        assert cfg.ns == [200, 800, 3200, 6400, 12800] and cfg.reps >= 400 and cfg.k == 10


@pytest.mark.parametrize("block,keys", [
    ({"k": 1}, ["prepare.k", "greater than or equal to 2"]),
    ({"k": 0}, ["prepare.k"]),
    ({"ns": [4, 8], "k": 6}, ["k", "exceed", "n = 4"]),
    ({"ns": [0, 200]}, ["ns", "positive", "got 0"]),
    ({"ns": [-50, 200]}, ["ns", "positive"]),
    ({"ns": [800, 200]}, ["ns", "increasing"]),
    ({"ns": [20, 400], "k": 2}, ["ns", "OLS"]),
    ({"ns": [200]}, ["prepare.ns", "at least 2"]),
    ({"reps": 1}, ["prepare.reps"]),
    ({"noise_sd": -1.0}, ["prepare.noise_sd"]),
    ({"folds": 5}, ["prepare.folds", "unknown key"]),
    ({"reps": 10**6}, ["prepare.reps"]),
    ({"ns": [200, 10**6]}, ["ns", "50,000"]),
    ({"seed": -1}, ["prepare.seed"]),
    ({"reps": 10, "batches": 6}, ["batches", "reps"]),
    ({"k": 1000}, ["prepare.k"]),
])
def test_prepare_bad_input(block, keys):
    with pytest.raises(ConfigError) as err:
        validate(prepare.Config, block, f"{WHERE}.prepare")
    for key in keys:
        assert key in str(err.value)


@pytest.mark.parametrize("block,keys", [
    ({"lasso_scale": -0.5}, ["train.lasso_scale", "greater than 0"]),
    ({"st_scale_low": -1.0}, ["train.st_scale_low"]),
    ({"st_scale_high": -2.0}, ["train.st_scale_high"]),
    ({"st_scale_low": 2.0, "st_scale_high": 1.0}, ["st_scale_high", "st_scale_low"]),
    ({"backend": "torch"}, ["train.backend", "unknown key"]),
    ({"device": "tpu"}, ["train.device"]),
    ({"lasso_max_iter": 10**9}, ["train.lasso_max_iter"]),
    ({"lasso_max_iter": 0}, ["train.lasso_max_iter"]),
])
def test_train_bad_input(block, keys):
    with pytest.raises(ConfigError) as err:
        validate(train.Config, block, f"{WHERE}.train")
    for key in keys:
        assert key in str(err.value)


@pytest.mark.parametrize("block,keys", [
    ({"level": 1.5}, ["evaluate.level"]),
    ({"stability_draws": 10, "stability_groups": 20}, ["stability_groups", "stability_draws"]),
    ({"stability_draws": 10**8}, ["evaluate.stability_draws"]),
    ({"level": 1.0}, ["evaluate.level"]),
    ({"device": "gpu"}, ["evaluate.device"]),
])
def test_evaluate_bad_input(block, keys):
    with pytest.raises(ConfigError) as err:
        validate(evaluate.Config, block, f"{WHERE}.evaluate")
    for key in keys:
        assert key in str(err.value)


def test_bad_params_file_fails_at_load(tmp_path: Path):
    """Through the real loader: a params.yaml with k > n fails before any stage runs."""
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["papers"]["cv_stability"]["prepare"]["k"] = 100
    params["papers"]["cv_stability"]["prepare"]["ns"] = [50, 200]
    params["papers"]["cv_stability"]["train"]["lasso_scale"] = -1.0
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"papers\.cv_stability\.prepare.*k: 100 folds exceed the sample size n = 50"):
        load_config("cv_stability", "prepare", "default", params_path=path)
    with pytest.raises(ConfigError, match=r"papers\.cv_stability\.train\.lasso_scale"):
        load_config("cv_stability", "train", "default", params_path=path)
