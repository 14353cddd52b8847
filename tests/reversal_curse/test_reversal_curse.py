"""reversal_curse: the fact world, the one-layer model's algebra, evaluation metrics, the smoke
pipeline end to end, and bad-input errors."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from stages.common.config import ConfigError, validate
from stages.reversal_curse import evaluate, prepare, train
from stages.reversal_curse.facts import ARMS, Vocab, arm_mask, build_facts, mean_onehot
from stages.reversal_curse.models import OneLayerModel


@pytest.fixture
def facts():
    return {k: np.array(v) for k, v in build_facts(20, 0.2, seed=3).items()}


def test_fact_world_layout(facts):
    voc = Vocab(20)
    assert voc.size == 43 and (voc.r_fwd, voc.r_rev, voc.r_id) == (40, 41, 42)
    test = (facts["split"] == "test")
    assert test.sum() == 4 and set(facts["kind"][test]) == {"reverse"}
    fwd = facts["kind"] == "forward"
    assert np.array_equal(facts["target"][fwd], facts["entity"][fwd] + 20)  # a_i -> b_i
    ident = np.isin(facts["kind"], ["identity_A", "identity_B"])
    assert np.array_equal(facts["target"][ident], facts["entity"][ident])


@pytest.mark.parametrize("arm", ARMS)
def test_arms_never_train_on_heldout_reversals(facts, arm):
    rows = arm_mask(facts["kind"], facts["split"], arm)
    assert not (rows & (facts["split"] == "test")).any()
    kinds = set(facts["kind"][rows])
    assert ("identity_A" in kinds) == ("A" in arm) and ("identity_B" in kinds) == ("B" in arm)
    # every forward fact, including held-out pairs', is trained in every arm
    assert rows[facts["kind"] == "forward"].all()


def test_unknown_arm_is_an_error(facts):
    with pytest.raises(ValueError, match="unknown arm"):
        arm_mask(facts["kind"], facts["split"], "C")


def test_one_layer_model_algebra():
    x = mean_onehot(torch.tensor([0, 3]), torch.tensor([5, 5]), 6)
    assert torch.equal(x.sum(1), torch.ones(2)) and x[0, 0] == 0.5 and x[1, 5] == 0.5
    for factorized in (True, False):
        model = OneLayerModel(6, 4, 0.5, factorized, torch.Generator().manual_seed(0))
        h, unembed = model.hidden_and_unembed(x)
        torch.testing.assert_close(h @ unembed.T, x @ model.w_ov().T)
        if factorized:
            torch.testing.assert_close(model.w_ov(), model.w_o @ model.w_v)
            assert torch.linalg.matrix_rank(model.w_ov()) <= 4


def test_asymmetry_measure():
    a, b = torch.tensor([0, 1]), torch.tensor([2, 3])
    sym = torch.randn(4, 4)
    sym = sym + sym.T
    assert evaluate.heldout_asymmetry(sym, a, b) == pytest.approx(0.0, abs=1e-6)
    one_way = torch.zeros(4, 4)
    one_way[b, a] = 1.0  # only W[b_i, a_i]: forward facts, no reversal
    assert evaluate.heldout_asymmetry(one_way, a, b) == pytest.approx(math.sqrt(2))
    block = evaluate.pair_block(one_way, a, b)
    assert block == [[0.0, 0.0], [1.0, 0.0]]


@pytest.mark.parametrize("stage_cfg, block, needle", [
    (prepare.Config, {"n_pairs": 1}, "n_pairs"),
    (prepare.Config, {"holdout_frac": 1.0}, "holdout_frac"),
    (train.Config, {"theory": {"arms": [{"name": "x", "bridge": "C"}]}}, "theory.arms.0.bridge"),
    (train.Config, {"theory": {"arms": []}}, "theory.arms"),
    (train.Config, {"theory": {"arms": [{"name": "x", "bridge": "AB"}]}, "transformer": {"arms": ["AC"]}},
     "transformer.arms"),
    (train.Config, {"theory": {"lr": -1, "arms": [{"name": "x", "bridge": "AB"}]}}, "theory.lr"),
    (evaluate.Config, {"kernel_backend": "cuda"}, "kernel_backend"),
])
def test_bad_params_name_the_key(stage_cfg, block, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        validate(stage_cfg, block, "papers.reversal_curse.x")


def test_smoke_pipeline_end_to_end(smoke_run):
    outs = smoke_run("reversal_curse")
    report = outs["report"]
    doc = json.loads((report / "metrics.json").read_text())
    assert [c["name"] for c in doc["claims"]] == ["bridge_reverses", "symmetric_only_with_bridge",
                                                 "implicit_bias_needed", "transformer_bridge_helps"]
    for claim in doc["claims"]:
        assert isinstance(claim["holds"], bool) and claim["values"]
        assert all(isinstance(v, (int, float)) for v in claim["values"].values())
    assert set(doc["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert doc["profile"] == "smoke"
    assert {p.name for p in (report / "figures").glob("*.png")} == {"curves.png", "w_ov_blocks.png"}
    assert (report / "plots" / "reverse_acc_vs_step.csv").exists()
    m = doc["metrics"]
    assert set(m["theory"]) == {"none", "A", "B", "AB", "AB_large_init", "AB_unfactorized"}
    for arm in m["theory"].values():
        assert 0.0 <= arm["reverse_acc"] <= 1.0 and arm["nuclear_norm"] > 0
    # evaluate's accuracies agree with the training history's final record (independent code path)
    import polars as pl

    hist = pl.read_csv(outs["train"] / "history.csv")
    last = hist.filter(pl.col("step") == hist["step"].max())
    for row in last.iter_rows(named=True):
        assert m[row["model"]][row["arm"]]["reverse_acc_per_seed"][0] == pytest.approx(row["reverse_acc"])
