"""Bad input fails at config load with the key in the message."""
from __future__ import annotations

import pytest

from stages.common.config import ConfigError, validate
from stages.common.runner import load_config
from stages.opus import evaluate, prepare, train


@pytest.mark.parametrize("profile", ["smoke", "default", "full"])
def test_every_profile_loads(profile):
    for stage in ("prepare", "train", "evaluate", "report"):
        load_config("opus", stage, profile)


@pytest.mark.parametrize("block,key", [
    ({"select_ratio": 0.0}, "select_ratio"),
    ({"select_ratio": 1.5}, "select_ratio"),
    ({"select_ratio": -0.2}, "select_ratio"),
    ({"buffer_size": 8, "select_k": 9}, "select_k"),
    ({"sketch_size": 0}, "sketch_size"),
    ({"proxy_batch": 0}, "proxy_batch"),
    ({"tau": 0.0}, "tau"),
    ({"arms": [{"name": "a", "selector": "opus", "sampling": "softmax"}]}, "sampling"),
    ({"arms": [{"name": "a", "selector": "random"}, {"name": "a", "selector": "opus"}]}, "unique"),
    ({"bogus": 1}, "bogus"),
    ({"seeds": [0, 0, 1]}, "seeds"),
    ({"seeds": [-1]}, "seeds"),
    ({"device": "tpu"}, "device"),
    ({"buffer_size": 10**7}, "buffer_size"),
    ({"trainer": {"max_steps": 10**7}}, "max_steps"),
    ({"arms": [{"name": "a", "selector": "opus", "score_every": 0}]}, "score_every"),
    ({"arms": [{"name": "a", "selector": "opus", "window": 1}]}, "window"),
    ({"arms": [{"name": "a", "selector": "opus", "pool": "other"}]}, "pool"),
])
def test_bad_train_params(block, key):
    with pytest.raises(ConfigError, match=key):
        validate(train.Config, block, "papers.opus.train")


def test_k_from_ratio_and_explicit_k():
    assert validate(train.Config, {"buffer_size": 10, "select_ratio": 0.3}, "t").k == 3
    assert validate(train.Config, {"buffer_size": 10, "select_k": 10}, "t").k == 10
    assert validate(train.Config, {"buffer_size": 10, "select_ratio": 1.0}, "t").k == 10


@pytest.mark.parametrize("block,key", [
    ({"proxy_size": 0}, "proxy_size"),
    ({"frac_target": 0.6, "frac_other": 0.6}, "frac_target"),
    ({"vocab_size": 3}, "vocab_size"),
    ({"redundant_frac_dup": 0.9}, "redundant_frac_dup"),
    ({"frac_dup": 1.5}, "frac_dup"),
    ({"seed": -3}, "seed"),
])
def test_bad_prepare_params(block, key):
    with pytest.raises(ConfigError, match=key):
        validate(prepare.Config, block, "papers.opus.prepare")


def test_bad_evaluate_params():
    with pytest.raises(ConfigError, match="fidelity_sizes"):
        validate(evaluate.Config, {"fidelity_sizes": [64, 0]}, "papers.opus.evaluate")
    with pytest.raises(ConfigError, match="overhead_sketch_sizes"):
        validate(evaluate.Config, {"overhead_sketch_sizes": []}, "papers.opus.evaluate")
    with pytest.raises(ConfigError, match="overhead_buffers"):
        validate(evaluate.Config, {"overhead_buffers": [16, 16]}, "papers.opus.evaluate")
    with pytest.raises(ConfigError, match="device"):
        validate(evaluate.Config, {"device": "gpu0"}, "papers.opus.evaluate")


def test_load_config_names_the_key(tmp_path):
    import yaml

    from stages.common.config import read_params

    params = read_params()
    params["papers"]["opus"]["train"]["select_ratio"] = 2.0
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"papers\.opus\.train\.select_ratio"):
        load_config("opus", "train", "default", params_path=path)


def test_proxy_batch_larger_than_the_proxy_set_fails_before_training(tmp_path):
    import yaml

    from stages.common.config import read_params
    from stages.common.runner import run_stage

    params = read_params()
    params["papers"]["opus"]["train"]["profiles"]["smoke"]["proxy_batch"] = 50  # smoke proxy set: 8
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, allow_unicode=True))
    run_stage("opus", "prepare", "smoke", root=tmp_path, params_path=path)
    with pytest.raises(ConfigError, match=r"proxy_batch=50 exceeds the proxy set \(8 sequences"):
        run_stage("opus", "train", "smoke", root=tmp_path, params_path=path)
    assert not (tmp_path / "data" / "opus" / "train").exists()  # nothing half-written
