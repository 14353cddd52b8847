"""Every registered paper's smoke pipeline on CUDA (skipped without a GPU): the device helper picks
CUDA, every Lightning trainer runs with accelerator gpu, and no tensor, generator or buffer may be
left on an implicit CPU device; the kernels then take the Triton path. Run it on a GPU machine with
`TRITON_INTERPRET=0 pytest tests/common/test_gpu_smoke.py` (tests/conftest.py keeps an explicit 0)."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from stages.common.config import STAGES, registered_papers
from stages.common.runner import run_stage

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _on_gpu(block):
    """Every `trainer` block (and its profile overrides) with accelerator gpu on one device."""
    if isinstance(block, dict):
        for key, value in block.items():
            if key == "trainer" and isinstance(value, dict):
                value.update(accelerator="gpu", devices=1)
            else:
                _on_gpu(value)
    elif isinstance(block, list):
        for item in block:
            _on_gpu(item)


@pytest.mark.parametrize("slug", registered_papers())
def test_smoke_on_cuda(tmp_path, slug):
    from stages.common.paths import ROOT

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    _on_gpu(params["papers"][slug])
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    for stage in STAGES:
        run_stage(slug, stage, "smoke", root=tmp_path, params_path=path)
    doc = json.loads((tmp_path / "reports" / slug / "metrics.json").read_text())
    assert all(e["backend"] == "triton-cuda" for e in doc["kernels"].values()), doc["kernels"]
