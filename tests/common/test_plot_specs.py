"""Every registered paper's committed DVC plots draw (issue 39): numeric axes (or a bar template for
labels), at least one finite point per series, one row per x on line templates, and dvc.yaml's
`plots:` in sync with the specs. Reads the CSVs and plots/_specs.json; no browser needed."""
from __future__ import annotations

import math

import polars as pl
import pytest

from stages.common.config import registered_papers
from stages.common.paths import ROOT, read_json
from stages.common.summary import plots_section


@pytest.mark.parametrize("slug", registered_papers())
def test_every_plot_has_numeric_axes_and_finite_points(slug):
    plots = ROOT / "reports" / slug / "plots"
    specs = read_json(plots / "_specs.json")
    assert specs, f"{slug}: no plots"
    csvs = {p.stem for p in plots.glob("*.csv")}
    assert csvs == set(specs), f"{slug}: CSVs {sorted(csvs ^ set(specs))} without a spec (or the reverse)"
    for name, spec in specs.items():
        frame = pl.read_csv(plots / f"{name}.csv")
        x, ys, template = spec["x"], spec["y"], spec.get("template", "linear")
        assert x in frame.columns and all(y in frame.columns for y in ys), f"{slug}/{name}: missing columns"
        if not template.startswith("bar"):
            assert frame.schema[x].is_numeric(), f"{slug}/{name}: x {x!r} is {frame.schema[x]} (renders empty)"
            if template != "scatter":
                assert not frame[x].is_duplicated().any(), f"{slug}/{name}: several rows per x (one zigzag line)"
        for y in ys:
            col = frame[y]
            assert col.dtype.is_numeric(), f"{slug}/{name}: y {y!r} is {col.dtype}"
            finite = [v for v in col.to_list() if v is not None and math.isfinite(v)]
            assert finite, f"{slug}/{name}: series {y!r} has no finite point"


def test_dvc_yaml_plots_match_the_committed_specs():
    import yaml

    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    assert dvc.get("plots", []) == plots_section(ROOT), "run `python -m stages dvcplots` after re-rendering reports"
