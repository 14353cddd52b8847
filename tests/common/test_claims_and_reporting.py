"""Claims-as-data evaluation, the metrics.json schema, and atomic outputs."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import polars as pl
import pytest

from stages.common.claims import Claim, ClaimError, evaluate_claims, flatten
from stages.common.paths import atomic_dir
from stages.common.reporting import Report, markdown_table
from stages.common.runner import StageContext

METRICS = {"chance": 0.025, "theory": {"AB": {"acc": 0.9}, "none": {"acc": 0.0}}, "flag": True}


def test_flatten():
    assert flatten(METRICS)["theory.AB.acc"] == 0.9


def test_claims_hold_and_fail_on_the_numbers():
    claims = [Claim("a", "AB beats chance", "theory.AB.acc > 10 * chance and theory.none.acc <= 2 * chance"),
              Claim("b", "none beats AB", "theory.none.acc > theory.AB.acc"),
              Claim("c", "chained", "0 <= theory.none.acc < theory.AB.acc <= 1 and max(1, 2) == 2 and flag")]
    out = evaluate_claims(claims, METRICS)
    assert [v["holds"] for v in out] == [True, False, True]
    assert out[0]["values"] == {"theory.AB.acc": 0.9, "chance": 0.025, "theory.none.acc": 0.0}
    assert set(out[0]) == {"name", "statement", "check", "holds", "values"}


@pytest.mark.parametrize("check, needle", [
    ("theory.XY.acc > 0", "was not measured"),
    ("__import__('os')", "unsupported expression"),
    ("theory.AB.acc >", "not a valid expression"),
])
def test_bad_claims_are_clear_errors(check, needle):
    with pytest.raises(ClaimError, match=needle):
        evaluate_claims([Claim("x", "s", check)], METRICS)


def test_nan_metric_never_holds():
    out = evaluate_claims([Claim("x", "s", "v < 1 or v >= 1")], {"v": float("nan")})
    assert out[0]["holds"] is False


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("one")
    assert (final / "a.txt").read_text() == "one"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "a.txt").write_text("half-written")
            raise RuntimeError("interrupted")
    assert (final / "a.txt").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_report_writes_schema_figures_and_plots(tmp_path):
    out = tmp_path / "reports" / "demo"
    out.mkdir(parents=True)
    ctx = StageContext(slug="demo", stage="report", profile="smoke", out=out, root=tmp_path)
    rep = Report(ctx, "Demo", "a claim")
    frame = pl.DataFrame({"arm": ["AB", "none"], "acc": [0.9, 0.0]})
    rep.table("Results", frame)
    with pytest.raises(RuntimeError, match="at least one figure"):
        rep.finish([], METRICS)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    rep.figure("line", fig, "a line")
    rep.plot("acc", frame)
    rep.finish([Claim("a", "s", "theory.AB.acc > chance")], METRICS)
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["claims"][0]["holds"] is True
    assert set(doc["runtime_s"]) == {"report"}  # no upstream stage ran in this temp root
    assert (out / "figures" / "line.png").stat().st_size > 1000
    assert pl.read_csv(out / "plots" / "acc.csv").equals(frame)
    text = (out / "report.md").read_text()
    assert "| a | yes |" in text and markdown_table(frame) in text
