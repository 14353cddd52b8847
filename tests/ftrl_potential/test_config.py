"""Bad params fail at load with the key named; every profile validates."""
from __future__ import annotations

import pytest

from stages.common.config import ConfigError, validate
from stages.common.runner import load_config
from stages.ftrl_potential import prepare, train

WHERE = "papers.ftrl_potential"


@pytest.mark.parametrize("stage", ["prepare", "train", "evaluate", "report"])
@pytest.mark.parametrize("profile", ["smoke", "default", "full"])
def test_params_load_for_every_profile(stage, profile):
    _, cfg, prof = load_config("ftrl_potential", stage, profile)
    assert prof == profile
    if stage == "train" and profile != "smoke":
        assert len(cfg.start_seeds) >= 3


@pytest.mark.parametrize("block,keys", [
    ({"ms": [1, 2, 3]}, ["prepare.ms", ">= 2", "[2, 24]"]),
    ({"ms": [3, 2, 4]}, ["ms", "increasing"]),
    ({"ms": [2, 2, 3]}, ["ms", "duplicate"]),
    ({"multi_players": [3, 4, 9]}, ["multi_players", "no stored snake-in-the-box for N = 9"]),
    ({"random_game_seeds": [0, 0, 1]}, ["random_game_seeds", "duplicate"]),
    ({"sizes": [2]}, ["prepare.sizes"]),
])
def test_prepare_bad_input(block, keys):
    with pytest.raises(ConfigError) as err:
        validate(prepare.Config, block, f"{WHERE}.prepare")
    for key in keys:
        assert key in str(err.value), (key, str(err.value))


@pytest.mark.parametrize("block,keys", [
    ({"eps_scale": 0.0}, ["train.eps_scale"]),
    ({"eps_scale": -0.1}, ["train.eps_scale"]),
    ({"fixed_eps": 0}, ["train.fixed_eps"]),
    ({"cap": 10**9}, ["train.cap"]),
    ({"arms": [{"name": "a", "reg": "tsallis"}]}, ["arms"]),
    ({"arms": [{"name": "mwu", "reg": "entropic", "eta": -1.0}]}, ["arms", "eta"]),
    ({"staircase_arm": "nope"}, ["staircase_arm", "nope"]),
    ({"start_seeds": [1, 1, 2]}, ["start_seeds", "duplicate"]),
    ({"tie_seeds": [4, 4]}, ["tie_seeds", "duplicate"]),
    ({"eps_sweep": [0.05, 0.1, 0.02]}, ["eps_sweep", "decreasing"]),
    ({"arms": [{"name": "fp", "reg": "fp", "max_m": 1}]}, ["arms", "max_m"]),
])
def test_train_bad_input(block, keys):
    with pytest.raises(ConfigError) as err:
        validate(train.Config, block, f"{WHERE}.train")
    for key in keys:
        assert key in str(err.value), (key, str(err.value))
