"""Every registered paper's smoke pipeline with the device on CUDA (skipped without a GPU): no tensor,
generator or buffer may be left on an implicit CPU device, and the kernels take the Triton path."""
from __future__ import annotations

import json

import pytest
import torch

from stages.common.config import registered_papers
from stages.common.runner import run_pipeline

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("slug", registered_papers())
def test_smoke_on_cuda(tmp_path, slug, monkeypatch):
    from stages.common.paths import ROOT

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    run_pipeline(slug, root=tmp_path, profile="smoke")
    doc = json.loads((tmp_path / "reports" / slug / "metrics.json").read_text())
    assert all(e["backend"] == "triton-cuda" for e in doc["kernels"].values()), doc["kernels"]
