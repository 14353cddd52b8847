"""The l2g_net pipeline end to end at the smoke profile, the model's transforms, and config errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from stages.common.config import ConfigError, validate
from stages.common.runner import load_config
from stages.l2g_net import prepare, train
from stages.l2g_net.gft import factorize
from stages.l2g_net.graphs import laplacian, sbm_blocks
from stages.l2g_net.model import TorchGFT


def test_smoke_pipeline(smoke_run):
    out = smoke_run("l2g_net")
    report = out["report"]
    metrics = json.loads((report / "metrics.json").read_text())
    assert set(metrics["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    names = [c["name"] for c in metrics["claims"]]
    assert names == ["exact", "scaling_in_n", "linear_in_cut", "beats_local_filters", "matches_full_gft"]
    for claim in metrics["claims"]:
        assert set(claim) >= {"name", "statement", "holds", "values"}
        assert isinstance(claim["holds"], bool) and claim["values"]
    # exactness does not depend on scale: it must hold even in the smoke run
    assert metrics["claims"][0]["holds"], metrics["claims"][0]
    for fig in ("scaling", "exactness", "task"):
        assert (report / "figures" / f"{fig}.png").stat().st_size > 0
    assert (report / "plots" / "scaling_n.csv").exists()
    assert "## Verdicts" in (report / "report.md").read_text()


def test_torch_gft_matches_numpy_and_has_gradients():
    L = laplacian(sbm_blocks(3, 20, 6.0, 3, seed=1))
    f = factorize(L, min_part_size=8, max_cut_fraction=0.5)
    assert len(f.cut_edges) > 0
    g = TorchGFT(f, backend="torch")
    X = torch.randn(60, 4, dtype=torch.float64, requires_grad=True)
    Y = g.transform(X)
    np.testing.assert_allclose(Y.detach().numpy(), f.transform(X.detach().numpy()), atol=1e-12)
    np.testing.assert_allclose(g.inverse(Y).detach().numpy(), X.detach().numpy(), atol=1e-12)
    (Y ** 2).sum().backward()  # U orthogonal: d/dX ||U^T X||^2 = 2 X
    np.testing.assert_allclose(X.grad.numpy(), 2 * X.detach().numpy(), atol=1e-11)


@pytest.mark.parametrize("module, block, key", [
    (prepare, {"scaling_sizes": [500, 250, 1000]}, "scaling_sizes"),
    (prepare, {"suite_scale": 3}, "suite_scale"),
    (prepare, {"task": {"num_blocks": 4, "bridges": 2}}, "bridges"),
    (prepare, {"bogus": 1}, "bogus"),
    (train, {"models": ["l2g", "transformer"]}, "models"),
    (train, {"max_cut_fraction": 0.0}, "max_cut_fraction"),
    (train, {"lr": "fast"}, "lr"),
])
def test_config_errors_name_the_key(module, block, key):
    with pytest.raises(ConfigError, match=key):
        validate(module.Config, block, "papers.l2g_net.stage")


def test_params_load_for_every_profile():
    for stage in ("prepare", "train", "evaluate", "report"):
        for profile in ("smoke", "default", "full"):
            load_config("l2g_net", stage, profile)
