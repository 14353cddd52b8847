"""Claims-as-data evaluation (every operator pinned on boundary values), the seed-aware verdict
helpers on known samples, the metrics.json schema, and atomic outputs."""
from __future__ import annotations

import json
import math
import re
import types

import matplotlib.pyplot as plt
import polars as pl
import pytest

from stages.common.claims import (Better, Bound, Claim, ClaimError, Near, Within, evaluate_claims, flatten,
                                  gap_verdict)
from stages.common.paths import atomic_dir
from stages.common.reporting import Report, markdown_table
from stages.common.runner import StageContext

METRICS = {"chance": 0.025, "theory": {"AB": {"acc": 0.9}, "none": {"acc": 0.0}}, "flag": True}


def test_flatten():
    assert flatten(METRICS)["theory.AB.acc"] == 0.9


def test_claims_hold_and_fail_on_the_numbers():
    claims = [Claim("a", "AB beats chance", "theory.AB.acc > param.k * chance and theory.none.acc <= param.j * chance",
                    kind="finding"),
              Claim("b", "none beats AB", "theory.none.acc > theory.AB.acc", kind="finding"),
              Claim("c", "chained", "0 <= theory.none.acc < theory.AB.acc <= 1 and max(1, param.two) == param.two "
                    "and flag", kind="check")]
    out = evaluate_claims(claims, METRICS, {"a": {"k": 10, "j": 2}, "c": {"two": 2}})
    assert [v["holds"] for v in out] == [True, False, True]
    assert [v["verdict"] for v in out] == ["holds", "fails", "holds"]
    assert out[0]["values"] == {"theory.AB.acc": 0.9, "chance": 0.025, "theory.none.acc": 0.0}
    assert out[0]["params"] == {"k": 10.0, "j": 2.0}
    assert set(out[0]) == {"name", "statement", "kind", "check", "holds", "verdict", "values", "params",
                           "refuted_by", "wallclock"}


def _lit(check: str) -> tuple[str, dict[str, float]]:
    """Literals other than 0/1 become params (a check may write only 0 and 1)."""
    params: dict[str, float] = {}

    def sub(m):
        text = m.group(0)
        if text in ("0", "1"):
            return text
        key = "n" + text.replace(".", "_")
        params[key] = float(text)
        return f"param.{key}"

    return re.sub(r"(?<![\w.])\d+(\.\d+)?", sub, check), params


# Each operator on boundary values, with hard-coded expected verdicts (x = 2, y = 3, z = 0).
@pytest.mark.parametrize("check, expected", [
    ("x < y", True), ("y < x", False), ("x < x", False), ("x <= x", True), ("y <= x", False),
    ("x > x", False), ("y > x", True), ("x >= x", True), ("x >= y", False),
    ("x == 2", True), ("x == y", False), ("x != y", True), ("x != 2", False),
    ("x < y and z > x", False), ("x < y or z > x", True), ("z > x or x > y", False),
    ("x < y and y < 4", True), ("not x < y", False), ("not z", True),
    ("1 < x < y", True), ("1 < y < x", False), ("x < y <= 3", True), ("x < y < 3", False),
    ("-x < z", True), ("-x > z", False), ("- -x == 2", True),
    ("y / x == 1.5", True), ("y / x == 1", False), ("x ** y == 8", True), ("y ** x == 8", False),
    ("y - x == 1", True), ("x - y == 1", False), ("x * y == 6", True), ("x + y == 5", True),
    ("abs(-x) == 2", True), ("abs(z - x) == -2", False), ("min(x, y) == 2", True), ("max(x, y) == 2", False),
])
def test_each_operator_on_boundaries(check, expected):
    expr, params = _lit(check)
    out = evaluate_claims([Claim("c", "s", expr, kind="check")], {"x": 2, "y": 3, "z": 0}, {"c": params})
    assert out[0]["holds"] is expected


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_is_inconclusive(value):
    out = evaluate_claims([Claim("c", "s", "v < 1 or v >= 1 or v > -param.big", kind="check")], {"v": value},
                          {"c": {"big": 1e300}})
    assert out[0]["holds"] is False and out[0]["verdict"] == "inconclusive"


@pytest.mark.parametrize("check, needle", [
    ("theory.XY.acc > 0", "was not measured"),
    ("__import__('os')", "unsupported expression"),
    ("theory.AB.acc >", "not a valid expression"),
    ("theory.AB.acc // param.two > 0", "unsupported expression"),
])
def test_bad_claims_are_clear_errors(check, needle):
    with pytest.raises(ClaimError, match=needle):
        evaluate_claims([Claim("x", "s", check, kind="check")], METRICS, {"x": {"two": 2}} if "param" in check else {})


def test_duplicate_claim_names_rejected():
    with pytest.raises(ClaimError, match="declared twice"):
        evaluate_claims([Claim("x", "s", "flag", kind="check"), Claim("x", "t", "flag", kind="check")], METRICS)


# --- seed-aware verdicts on known samples ---------------------------------------------------------
def test_gap_verdict_known_samples():
    # diffs 1, 2, 3: mean 2, sd 1, se 1/sqrt(3) = 0.577 -> 2 - 2.92 * 0.577 = 0.314 > 0: holds
    v, st = gap_verdict([1.0, 2.0, 3.0])
    assert v == "holds" and st["mean"] == pytest.approx(2.0) and st["se"] == pytest.approx(1 / math.sqrt(3))
    assert gap_verdict([-1.0, -2.0, -3.0])[0] == "fails"
    assert gap_verdict([1.0, 1.0, -1.0])[0] == "inconclusive"
    # big mean gap from two seeds, loses on the majority: never holds
    assert gap_verdict([30.0, -0.1, -0.1, 31.0, -0.2])[0] == "inconclusive"
    assert gap_verdict([5.0, 6.0])[0] == "inconclusive"          # fewer than 3 seeds
    assert gap_verdict([1.0, math.nan, 2.0])[0] == "inconclusive"


def test_better_paired_and_direction():
    m = {"a": [0.50, 0.61, 0.72], "b": [0.40, 0.52, 0.60], "loss": {"a": [1.0, 1.1, 1.2], "b": [1.3, 1.35, 1.5]},
         "c55": 0.55}
    out = evaluate_claims([
        Better("hi", "a beats b", kind="finding", a="a", b="b"),
        Better("hi_rev", "b beats a", kind="finding", a="b", b="a"),
        Better("lo", "a has lower loss", kind="finding", a="loss.a", b="loss.b", higher_is_better=False),
        Better("margin", "a beats b by 0.5", kind="finding", a="a", b="b"),
        Better("const", "a above 0.55", kind="finding", a="a"),
    ], m, {"hi": {"min_effect": 0}, "hi_rev": {"min_effect": 0}, "lo": {"min_effect": 0},
           "margin": {"min_effect": 0.5}, "const": {"b": 0.55, "min_effect": 0}})
    assert [o["verdict"] for o in out] == ["holds", "fails", "holds", "fails", "inconclusive"]
    assert out[0]["values"]["a"] == [0.50, 0.61, 0.72] and out[0]["stats"]["n"] == 3.0
    # paired: a is better than b on every seed by ~0.1 even though the per-arm spread is larger
    assert out[0]["stats"]["mean"] == pytest.approx(0.10333333, abs=1e-6)


def test_seed_claim_errors():
    with pytest.raises(ClaimError, match="expected 3"):
        evaluate_claims([Better("x", "s", kind="finding", a="a", b="b")], {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0]},
                        {"x": {"min_effect": 0}})
    with pytest.raises(ClaimError, match="exactly one"):
        evaluate_claims([Bound("x", "s", kind="finding", value="a")], {"a": [1.0, 2.0, 3.0]})


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
    rep.plot("acc", frame, x="arm", y="acc", title="accuracy per arm", template="bar_horizontal")
    with pytest.raises(ValueError, match="no column 'nope'"):
        rep.plot("bad", frame, x="arm", y="nope", template="bar_horizontal")
    with pytest.raises(ValueError, match="x 'arm' is String, not numeric"):
        rep.plot("bad", frame, x="arm", y="acc")
    long = pl.DataFrame({"step": [0, 1, 0, 1], "arm": ["a", "a", "b", "b"], "loss": [2.0, 1.0, 3.0, 2.5]})
    with pytest.raises(ValueError, match="one zigzag line; pass series="):
        rep.plot("bad", long, x="step", y="loss")
    with pytest.raises(ValueError, match="no finite value"):
        rep.plot("bad", long.with_columns(pl.lit(float("nan")).alias("loss")), x="step", y="loss", series="arm")
    rep.plot("curves", long, x="step", y="loss", series="arm")
    ctx.cfg = types.SimpleNamespace(claims={"b": {"min_effect": 0.5}})
    rep.finish([Claim("a", "s", "theory.AB.acc > chance", kind="check", refuted_by="AB at chance"),
                Better("b", "s", kind="finding", a="seeds.x", b="seeds.y")],
               {**METRICS, "seeds": {"x": [3, 4, 5], "y": [1, 2, 3]}})
    doc = json.loads((out / "metrics.json").read_text())
    assert [c["name"] for c in doc["claims"]] == ["b", "a"]    # findings first
    assert doc["claims"][1]["holds"] is True and doc["claims"][0]["verdict"] == "holds"
    assert doc["findings"] == {"findings": 1, "findings_holds": 1, "findings_fails": 0,
                               "findings_inconclusive": 0, "checks": 1, "checks_pass": 1}
    assert doc["kernels"] == {}
    assert set(doc["runtime_s"]) == {"report"}  # no upstream stage ran in this temp root
    flat = json.loads((out / "dvc_metrics.json").read_text())
    assert flat["demo.claim.a"] == "holds" and flat["demo.claim.b"] == "holds" and flat["demo.b.seeds.x"] == 4.0
    assert flat["demo.findings.holds"] == 1 and flat["demo.checks.total"] == 1
    specs = json.loads((out / "plots" / "_specs.json").read_text())
    assert specs["acc"] == {"x": "arm", "y": ["acc"], "title": "accuracy per arm", "template": "bar_horizontal"}
    assert specs["curves"]["y"] == ["a", "b"]
    assert pl.read_csv(out / "plots" / "curves.csv").to_dict(as_series=False) == {
        "step": [0, 1], "a": [2.0, 1.0], "b": [3.0, 2.5]}
    assert not (out / "plots" / "bad.csv").exists()
    assert (out / "figures" / "line.png").stat().st_size > 1000
    assert pl.read_csv(out / "plots" / "acc.csv").equals(frame)
    text = (out / "report.md").read_text()
    assert "| a | holds |" in text and "AB at chance" in text and markdown_table(frame) in text
    assert "**findings: 1 hold, 0 fail, 0 inconclusive; checks: 1/1 pass.**" in text
    assert text.index("## Findings (1 hold") < text.index("## Checks (1/1 pass)")
    assert "gap 2; min effect 0.5; 95% t-bounds [2, 2]" in text and "| min_effect = 0.5 |" in text
    assert "## Kernel paths" in text
