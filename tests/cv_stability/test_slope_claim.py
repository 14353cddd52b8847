"""The lack-of-fit-aware slope s.e. (worked by hand) and the single-estimate verdict shape
(stages.common.claims.Estimate) at its boundaries, with t quantiles from scipy."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy.stats import t as student_t

from stages.common.claims import ClaimError, Estimate, evaluate_claims
from stages.cv_stability.report import CLAIMS, coverage_slope


def _rows(ns, cov, reps):
    return pl.DataFrame({"n": ns, "coverage": cov, "reps": reps})


def test_residual_se_by_hand_on_a_curved_coverage():
    # x = log2 n = 1, 2, 3, 4, 5 (n = 2..32): x̄ = 3, Σ(x − x̄)² = 10
    # p = 0.80, 0.90, 0.86, 0.88, 0.84: slope = Σ(x − x̄)p / 10 = (−2·.80 − .90 + 0 + .88 + 2·.84)/10 = 0.006
    p = [0.80, 0.90, 0.86, 0.88, 0.84]
    f = coverage_slope(_rows([2, 4, 8, 16, 32], p, [100_000] * 5))
    assert f["slope"] == pytest.approx(0.006)
    fitted = 0.856 + 0.006 * (np.arange(1, 6) - 3)          # intercept at x̄: mean p = 0.856
    rss = float(((np.array(p) - fitted) ** 2).sum())          # residuals −.044, .05, .004, .018, −.028: 0.00556
    assert rss == pytest.approx(0.00556)
    assert f["se_residual"] == pytest.approx(np.sqrt(rss / 3 / 10))
    # binomial noise is tiny at 100,000 reps: the residual s.e. is the one used, with t at 5 − 2 = 3 df
    assert f["se"] == f["se_residual"] and f["df"] == 3.0
    t3 = student_t.ppf(0.95, 3)
    assert f["t"] == pytest.approx(t3)
    assert f["upper95"] == pytest.approx(0.006 + t3 * np.sqrt(rss / 30))
    assert f["lack_of_fit_ratio"] > 100 and f["lack_of_fit_p"] < 1e-6


def test_binomial_se_is_a_floor_when_the_line_fits():
    # points exactly on a line: zero residual, so the binomial s.e. is used
    ns = [200, 800, 3200, 12800]
    x = np.log2(ns)
    p = (0.85 + 0.004 * (x - x.mean())).tolist()
    f = coverage_slope(_rows(ns, p, [500] * 4))
    assert f["se_residual"] == pytest.approx(0.0, abs=1e-12)
    assert f["se"] == pytest.approx(f["se_binomial"]) and f["se"] > 0
    assert f["lack_of_fit_p"] == pytest.approx(1.0)


def _estimate(below=None, above=None):
    return Estimate("gain", "slope below a bound", kind="finding", value="s.slope", se="s.se", df="s.df",
                    points="s.points", below=below, above=above, _bound=True)


@pytest.mark.parametrize("slope,se,df,bound,verdict", [
    # t(0.95, 3) = 2.3534: upper = 0.004 + 2.3534·0.002 = 0.0087 < 0.01 -> holds
    (0.004, 0.002, 3, 0.01, "holds"),
    # upper = 0.006 + 0.0047 = 0.0107 > 0.01, lower = 0.0013 < 0.01 -> inconclusive
    (0.006, 0.002, 3, 0.01, "inconclusive"),
    # lower = 0.016 − 0.0047 = 0.0113 > 0.01 -> fails
    (0.016, 0.002, 3, 0.01, "fails"),
    # the same gap at 30 df is decided: t(0.95, 30) = 1.697, upper = 0.006 + 0.0034 = 0.0094 -> holds
    (0.006, 0.002, 30, 0.01, "holds"),
])
def test_estimate_verdict_boundaries(slope, se, df, bound, verdict):
    metrics = {"s": {"slope": slope, "se": se, "df": df, "points": df + 2}}
    v = _estimate(below=bound).evaluate({"s.slope": slope, "s.se": se, "s.df": df, "s.points": df + 2})
    assert v["verdict"] == verdict
    t = student_t.ppf(0.95, df)
    assert v["stats"]["upper"] == pytest.approx(bound - slope + t * se)
    assert v["stats"]["lower"] == pytest.approx(bound - slope - t * se)
    # through the params binding, as the report evaluates it
    c = Estimate("gain", "s", kind="finding", value="s.slope", se="s.se", df="s.df")
    assert evaluate_claims([c], metrics, {"gain": {"below": bound}})[0]["verdict"] == verdict


def test_estimate_above_and_bad_inputs():
    env = {"s.slope": 0.6, "s.se": 0.05, "s.df": 6.0, "s.points": 8.0}
    assert _estimate(above=0.3).evaluate(env)["verdict"] == "holds"            # 0.6 − 1.943·0.05 > 0.3
    assert _estimate(above=0.7).evaluate(env)["verdict"] == "fails"            # 0.6 + 0.097 < 0.7
    assert _estimate(above=0.3).evaluate({**env, "s.df": 0.0})["verdict"] == "inconclusive"
    assert _estimate(above=0.3).evaluate({**env, "s.se": float("nan")})["verdict"] == "inconclusive"
    with pytest.raises(ClaimError, match="threshold written in code"):
        Estimate("g", "s", kind="finding", value="a", se="b", df="c", below=0.01)
    with pytest.raises(ClaimError, match="not measured"):
        _estimate(below=0.1).evaluate({"s.slope": 1.0, "s.se": 0.1})
    with pytest.raises(ClaimError, match="exactly one of"):
        _estimate().evaluate(env)


def test_every_cv_claim_reads_its_thresholds_from_params():
    """The report's claims bind against params.yaml without a number in code (bind raises otherwise)."""
    import yaml

    from stages.common.claims import bind

    params = yaml.safe_load(open("params.yaml"))["papers"]["cv_stability"]["report"]["claims"]
    bound = bind(CLAIMS, params, "papers.cv_stability.report", strict_unused=True)
    kinds = {c.name: c.kind for c in bound}
    assert kinds["bonferroni_covers"] == "check"
    assert all(k == "finding" for n, k in kinds.items() if n != "bonferroni_covers")
    gains = [c for c in bound if c.name.endswith("_coverage_gain_bounded")]
    assert len(gains) == 3 and all(c.below == params["*_coverage_gain_bounded"]["below"] for c in gains)
