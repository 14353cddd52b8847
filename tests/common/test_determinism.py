"""Same params, same metrics: every registered paper's smoke pipeline, run twice into two fresh
roots, gives identical metrics.json (apart from runtime fields), dvc_metrics.json and plot CSVs."""
from __future__ import annotations

import json

import pytest

from stages.common.config import registered_papers
from stages.common.runner import run_pipeline

pytestmark = pytest.mark.slow


def _strip(doc: dict) -> dict:
    doc = dict(doc)
    doc.pop("runtime_s", None)
    return doc


@pytest.mark.parametrize("slug", registered_papers())
def test_smoke_pipeline_twice_gives_identical_metrics(tmp_path, slug):
    outs = []
    for run in ("a", "b"):
        root = tmp_path / run
        (root).mkdir()
        (root / "params.yaml").write_text((__import__("stages.common.paths", fromlist=["ROOT"]).ROOT
                                           / "params.yaml").read_text())
        run_pipeline(slug, root=root, profile="smoke")
        outs.append(root / "reports" / slug)
    a, b = outs
    assert _strip(json.loads((a / "metrics.json").read_text())) == _strip(json.loads((b / "metrics.json").read_text()))
    assert (a / "dvc_metrics.json").read_bytes() == (b / "dvc_metrics.json").read_bytes()
    csv_a = sorted(p.name for p in (a / "plots").iterdir())
    assert csv_a == sorted(p.name for p in (b / "plots").iterdir())
    for name in csv_a:
        assert (a / "plots" / name).read_bytes() == (b / "plots" / name).read_bytes(), name
