"""Within, Bound and Near against an independent numpy/scipy computation of the same statistics.

test_claims_exact.py checks the verdict edges with hand-worked numbers; these tests check every statistic a
result carries (means, the seed and item parts of the standard error, Welch–Satterthwaite df, t-bounds, the
detectable band, the share of seeds inside the band), the check text and the recorded values, for per-seed
lists, per-item lists (paired and unpaired), binomial rates (``n_items``) and unshared items. The reference
below is written from the rule in ``stages/common/claims.py``'s docstring, not from its code.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stages.common.claims import (Better, Bound, Claim, ClaimError, Estimate, Near, Param, Within, bind,
                                  evaluate_claims, findings_summary, gap_verdict, paired_item_gap, seed_stats)

ALPHA, POWER = 0.05, 0.80


def reference(gaps, within=None, items_df=None, shared=True):
    """se² = s²/n + mean(v) (÷ n when items are not shared); df n − 1 or Welch–Satterthwaite."""
    g = np.asarray(gaps, float)
    n = len(g)
    a = g.var(ddof=1) / n
    b = 0.0 if within is None else float(np.mean(within)) / (1 if shared else n)
    df = n - 1.0 if b == 0 else (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / items_df)
    se = math.sqrt(a + b)
    t = stats.t.ppf(1 - ALPHA, df)
    return {"n": n, "mean": g.mean(), "se": se, "se_seeds": math.sqrt(a), "se_items": math.sqrt(b), "df": df,
            "t": t, "lower": g.mean() - t * se, "upper": g.mean() + t * se}


def within(delta, **kw):
    return Within("w", "stmt", kind="finding", a="a", b="b", **kw), {"w": {"delta": delta}}


def assert_stats(st, ref):
    for k, v in ref.items():
        assert st[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


# --- Within -------------------------------------------------------------------------------------
def test_within_seed_lists_every_statistic():
    a, b = [2.31, 2.27, 2.36, 2.25], [2.30, 2.30, 2.30, 2.30]
    claim, th = within(0.2)
    out = evaluate_claims([claim], {"a": a, "b": b}, th)[0]
    gaps = np.subtract(a, b)
    ref = reference(gaps)
    assert_stats(out["stats"], ref)
    assert out["stats"]["delta"] == 0.2
    assert out["stats"]["detectable"] == pytest.approx((ref["t"] + stats.t.ppf(0.5 + POWER / 2, 3)) * ref["se"])
    assert out["stats"]["inside"] == 1.0
    assert out["verdict"] == "holds" and out["holds"] is True
    assert out["values"] == {"a": a, "b": b}
    assert out["check"] == "|a - b| < 0.2 (per seed, t-bounds)"
    assert out["params"] == {"delta": 0.2}
    assert out["kind"] == "finding" and out["name"] == "w" and out["statement"] == "stmt"


def test_within_inside_majority_is_strict():
    # ten seeds, the t-bounds well inside ±0.5; five seeds at |gap| = 0.5 exactly are not inside (strict <),
    # and five of ten inside is not a majority
    gaps = [0.5, -0.5, 0.5, -0.5, 0.5, 0.25, -0.25, 0.25, -0.25, 0.25]
    ref = reference(gaps)
    assert -0.5 < ref["lower"] < ref["upper"] < 0.5
    claim, th = within(0.5)
    out = evaluate_claims([claim], {"a": gaps, "b": [0.0] * 10}, th)[0]
    assert out["stats"]["inside"] == 0.5 and out["verdict"] == "inconclusive"
    assert_stats(out["stats"], ref)
    gaps6 = gaps[:4] + [0.4375] + gaps[5:]                  # six of ten inside
    out6 = evaluate_claims([claim], {"a": gaps6, "b": [0.0] * 10}, th)[0]
    assert -0.5 < out6["stats"]["lower"] < out6["stats"]["upper"] < 0.5
    assert out6["stats"]["inside"] == 0.6 and out6["verdict"] == "holds"


@pytest.mark.parametrize("gaps, verdict", [
    ([0.30, 0.32, 0.31], "fails"),          # lower bound above delta
    ([-0.30, -0.32, -0.31], "fails"),       # upper bound below −delta
    ([0.05, 0.5, -0.4], "inconclusive"),    # bounds straddle the band
])
def test_within_fails_on_either_side(gaps, verdict):
    claim, th = within(0.1)
    out = evaluate_claims([claim], {"a": gaps, "b": 0.0}, th)[0]      # a scalar metric: broadcast to the seeds
    assert out["verdict"] == verdict
    assert out["values"] == {"a": gaps, "b": [0.0, 0.0, 0.0]}
    # the same reference as a number from params: in the check text, not in the values
    const = Within("w", "stmt", kind="finding", a="a")
    out2 = evaluate_claims([const], {"a": gaps}, {"w": {"delta": 0.1, "b": 0.0}})[0]
    assert out2["verdict"] == verdict and out2["values"] == {"a": gaps}
    assert out2["check"] == "|a - 0.0| < 0.1 (per seed, t-bounds)"
    assert out2["params"] == {"b": 0.0, "delta": 0.1}


@pytest.mark.parametrize("m", [
    {"a": [0.1, 0.2], "b": [0.1, 0.2]},                       # two seeds
    {"a": [0.1, math.nan, 0.2], "b": [0.1, 0.2, 0.2]},        # a non-finite gap
    {"a": [0.1, None, 0.2], "b": [0.1, 0.2, 0.2]},            # JSON null
])
def test_within_inconclusive_without_enough_finite_seeds(m):
    claim, th = within(0.5)
    out = evaluate_claims([claim], m, th)[0]
    assert out["verdict"] == "inconclusive" and out["holds"] is False
    assert out["stats"] == {"n": float(len(m["a"])), "delta": 0.5}
    assert out["check"] == "|a - b| < 0.5 (per seed, t-bounds)"


def test_within_infinite_item_variance_is_inconclusive():
    # one item per seed: the item variance is undefined -> inconclusive, with the short stats
    m = {"a": [[0.5], [0.6], [0.55]], "b": [[0.5], [0.6], [0.55]]}
    claim, th = within(0.5)
    out = evaluate_claims([claim], m, th)[0]
    assert out["verdict"] == "inconclusive" and set(out["stats"]) == {"n", "delta"}


def test_within_paired_items():
    rng = np.random.default_rng(3)
    A = rng.normal(0.70, 0.20, (4, 9)).round(3)
    B = (A - rng.normal(0.01, 0.05, (4, 9))).round(3)
    claim, th = within(0.3)
    out = evaluate_claims([claim], {"a": A.tolist(), "b": B.tolist()}, th)[0]
    gaps = A.mean(1) - B.mean(1)
    v = (A - B).var(axis=1, ddof=1) / 9                     # paired: the variance of per-item differences
    ref = reference(gaps, v, items_df=8)
    assert_stats(out["stats"], ref)
    assert out["stats"]["detectable"] == pytest.approx((ref["t"] + stats.t.ppf(0.9, ref["df"])) * ref["se"])
    assert out["verdict"] == "holds"
    assert out["values"]["a"] == pytest.approx(A.mean(1).tolist())


def test_within_unpaired_items_and_unshared():
    rng = np.random.default_rng(4)
    A = rng.normal(1.0, 0.3, (3, 6))
    B = rng.normal(1.0, 0.3, (3, 6))
    claim, th = within(2.0, paired_items=False, items_shared=False)
    out = evaluate_claims([claim], {"a": A.tolist(), "b": B.tolist()}, th)[0]
    v = A.var(axis=1, ddof=1) / 6 + B.var(axis=1, ddof=1) / 6
    assert_stats(out["stats"], reference(A.mean(1) - B.mean(1), v, items_df=5, shared=False))


def test_within_binomial_rates_both_sides():
    a, b = [0.62, 0.58, 0.65], [0.60, 0.61, 0.59]
    claim, th = within(0.25, n_items=40)
    out = evaluate_claims([claim], {"a": a, "b": b}, th)[0]
    pa, pb = np.array(a), np.array(b)
    v = pa * (1 - pa) / 40 + pb * (1 - pb) / 40
    assert_stats(out["stats"], reference(pa - pb, v, items_df=39))


def test_within_binomial_count_from_a_metric_and_a_constant_reference():
    # n_items names a metric (per seed; the smallest count is used); a reference that is a metric is a rate too
    # (binomial noise on both sides), a number from params carries none
    a = [0.52, 0.47, 0.50]
    claim = Within("w", "s", kind="check", a="a", b="ref", n_items="m")
    out = evaluate_claims([claim], {"a": a, "ref": 0.4, "m": [30, 25, 40]}, {"w": {"delta": 0.3}})[0]
    pa = np.array(a)
    assert_stats(out["stats"], reference(pa - 0.4, pa * (1 - pa) / 25 + 0.4 * 0.6 / 25, items_df=24))
    assert out["values"] == {"a": a, "ref": [0.4, 0.4, 0.4]}
    const = Within("w", "s", kind="check", a="a", n_items="m")
    out2 = evaluate_claims([const], {"a": a, "m": [30, 25, 40]}, {"w": {"delta": 0.3, "b": 0.4}})[0]
    assert_stats(out2["stats"], reference(pa - 0.4, pa * (1 - pa) / 25, items_df=24))


# --- Bound --------------------------------------------------------------------------------------
def test_bound_below_and_above_every_statistic():
    v = [0.41, 0.47, 0.44, 0.45]
    below = evaluate_claims([Bound("b", "s", kind="finding", value="v")], {"v": v}, {"b": {"below": 0.6}})[0]
    assert_stats(below["stats"], reference(0.6 - np.array(v)))
    assert below["stats"]["min_effect"] == 0.0 and below["verdict"] == "holds"
    assert below["check"] == "v < 0.6 (per seed, t-bound)" and below["values"] == {"v": v}
    above = evaluate_claims([Bound("b", "s", kind="finding", value="v")], {"v": v}, {"b": {"above": 0.6}})[0]
    assert_stats(above["stats"], reference(np.array(v) - 0.6))
    assert above["verdict"] == "fails" and above["check"] == "v > 0.6 (per seed, t-bound)"
    assert above["params"] == {"above": 0.6}


def test_bound_against_a_per_seed_metric_with_items():
    # value with per-item lists against a per-seed limit: the item noise is the value's alone
    rng = np.random.default_rng(5)
    X = rng.normal(0.3, 0.1, (3, 7))
    lim = [0.5, 0.45, 0.55]
    out = evaluate_claims([Bound("b", "s", kind="finding", value="x", below="lim")], {"x": X.tolist(), "lim": lim},
                          {})[0]
    ref = reference(np.array(lim) - X.mean(1), X.var(axis=1, ddof=1) / 7, items_df=6)
    assert_stats(out["stats"], ref)
    assert out["values"]["lim"] == lim and out["verdict"] == "holds"
    assert out["check"] == "x < lim (per seed, t-bound)"


def test_bound_binomial_and_unshared():
    r = [0.91, 0.93, 0.95]
    out = evaluate_claims([Bound("b", "s", kind="check", value="r", n_items=50, items_shared=False)], {"r": r},
                          {"b": {"above": 0.9}})[0]
    p = np.array(r)
    assert_stats(out["stats"], reference(p - 0.9, p * (1 - p) / 50, items_df=49, shared=False))


def test_bound_needs_exactly_one_side():
    with pytest.raises(ClaimError, match="exactly one of below= / above="):
        Bound("b", "s", kind="check", value="v").evaluate({"v": [1.0, 2.0, 3.0]})


# --- Near ---------------------------------------------------------------------------------------
def test_near_is_within_against_the_reference():
    r = [0.93, 0.96, 0.95, 0.94]
    out = evaluate_claims([Near("n", "s", kind="check", value="r", n_items=200)], {"r": r},
                          {"n": {"ref": 0.95, "tol": 0.04}})[0]
    p = np.array(r)
    ref = reference(p - 0.95, p * (1 - p) / 200, items_df=199)
    assert_stats(out["stats"], ref)
    assert out["stats"]["delta"] == 0.04 and out["stats"]["inside"] == 1.0
    assert out["verdict"] == "holds"
    assert out["check"] == "r within 0.04 of 0.95 (per seed, t-bounds)"
    assert out["params"] == {"ref": 0.95, "tol": 0.04}
    assert out["name"] == "n" and out["kind"] == "check" and out["statement"] == "s"
    unshared = evaluate_claims([Near("n", "s", kind="check", value="r", n_items=200, items_shared=False)], {"r": r},
                               {"n": {"ref": 0.95, "tol": 0.04}})[0]
    assert_stats(unshared["stats"], reference(p - 0.95, p * (1 - p) / 200, items_df=199, shared=False))


def test_near_keeps_refuted_by_and_wallclock():
    out = evaluate_claims([Near("n", "s", kind="check", value="r", refuted_by="why", wallclock=True)],
                          {"r": [1.0, 1.1, 0.9]}, {"n": {"ref": 5.0, "tol": 0.5}})[0]
    assert out["refuted_by"] == "why" and out["wallclock"] is True and out["verdict"] == "fails"


# --- Estimate -----------------------------------------------------------------------------------
def estimate(**kw):
    return Estimate("e", "stmt", kind="finding", value="fit.slope", se="fit.se", df="fit.df", **kw)


def test_estimate_below_every_statistic():
    m = {"fit.slope": 0.42, "fit.se": 0.05, "fit.df": 7}
    out = evaluate_claims([estimate()], m, {"e": {"below": 0.6}})[0]
    t = stats.t.ppf(0.95, 7)
    gap = 0.6 - 0.42
    expect = {"mean": gap, "se": 0.05, "df": 7.0, "t": t, "lower": gap - t * 0.05, "upper": gap + t * 0.05,
              "min_effect": 0.0, "detectable": (t + stats.t.ppf(0.8, 7)) * 0.05, "n": 9.0}
    assert set(out["stats"]) == set(expect)
    assert_stats(out["stats"], expect)
    assert out["verdict"] == "holds" and out["holds"] is True
    assert out["values"] == {"fit.slope": 0.42, "fit.se": 0.05, "fit.df": 7.0}
    assert out["check"] == "fit.slope < 0.6 (one-sided 95% t-bound, se fit.se, df fit.df)"
    assert out["params"] == {"below": 0.6}
    assert out["name"] == "e" and out["statement"] == "stmt" and out["kind"] == "finding"


def test_estimate_above_against_a_metric_with_points():
    m = {"fit.slope": 0.42, "fit.se": 0.03, "fit.df": 4.5, "lim": 0.5, "fit.n": 12}
    out = evaluate_claims([estimate(above="lim", points="fit.n")], m, {})[0]
    t = stats.t.ppf(0.95, 4.5)                                # ≈ 2.08: upper bound −0.08 + 2.08·0.03 < 0
    assert_stats(out["stats"], {"mean": 0.42 - 0.5, "lower": -0.08 - t * 0.03, "upper": -0.08 + t * 0.03,
                                "n": 12.0, "t": t})
    assert out["verdict"] == "fails"
    assert out["values"] == {"fit.slope": 0.42, "fit.se": 0.03, "fit.df": 4.5, "lim": 0.5}
    assert out["check"] == "fit.slope > lim (one-sided 95% t-bound, se fit.se, df fit.df)"


@pytest.mark.parametrize("slope, verdict", [
    (0.6 - 1.0001 * stats.t.ppf(0.95, 7) * 0.05, "holds"),       # lower bound just above 0
    (0.6 - 0.9999 * stats.t.ppf(0.95, 7) * 0.05, "inconclusive"),
    (0.6 + 0.9999 * stats.t.ppf(0.95, 7) * 0.05, "inconclusive"),
    (0.6 + 1.0001 * stats.t.ppf(0.95, 7) * 0.05, "fails"),       # upper bound just below 0
])
def test_estimate_edges(slope, verdict):
    out = evaluate_claims([estimate()], {"fit.slope": slope, "fit.se": 0.05, "fit.df": 7}, {"e": {"below": 0.6}})[0]
    assert out["verdict"] == verdict


@pytest.mark.parametrize("m", [
    {"fit.slope": math.nan, "fit.se": 0.05, "fit.df": 7},
    {"fit.slope": 0.1, "fit.se": math.inf, "fit.df": 7},
    {"fit.slope": 0.1, "fit.se": 0.05, "fit.df": 0.5},          # df < 1
    {"fit.slope": 0.1, "fit.se": -0.05, "fit.df": 7},           # a negative se
])
def test_estimate_inconclusive_inputs(m):
    out = evaluate_claims([estimate()], m, {"e": {"below": 0.6}})[0]
    assert out["verdict"] == "inconclusive" and out["stats"] == {"n": 0.0}
    assert out["check"].startswith("fit.slope < 0.6")


def test_estimate_df_one_and_zero_se_are_decided():
    out = evaluate_claims([estimate()], {"fit.slope": 0.1, "fit.se": 0.0, "fit.df": 1}, {"e": {"below": 0.6}})[0]
    assert out["verdict"] == "holds" and out["stats"]["lower"] == pytest.approx(0.5)


def test_estimate_errors_name_the_metric():
    with pytest.raises(ClaimError, match="exactly one of below= / above="):
        estimate().evaluate({"fit.slope": 0.1, "fit.se": 0.1, "fit.df": 3})
    with pytest.raises(ClaimError, match="metric 'fit.se' was not measured"):
        evaluate_claims([estimate()], {"fit.slope": 0.1, "fit.df": 3}, {"e": {"below": 0.6}})
    with pytest.raises(ClaimError, match="metric 'fit.df' is not a number"):
        evaluate_claims([estimate()], {"fit.slope": 0.1, "fit.se": 0.1, "fit.df": [3, 4]}, {"e": {"below": 0.6}})
    with pytest.raises(ClaimError, match="threshold written in code"):
        estimate(below=0.6)


# --- the rule's own edges: ties, one seed, the non-inferiority count, the default item sharing ----------------
def test_seed_stats_ties_and_small_n():
    st = seed_stats([1.5, 0.0, -0.5])
    assert st["wins"] == pytest.approx(1 / 3) and st["losses"] == pytest.approx(1 / 3)   # a zero is neither
    assert st["se"] == pytest.approx(np.std([1.5, 0.0, -0.5], ddof=1) / math.sqrt(3))
    one = seed_stats([0.7])
    assert one["n"] == 1 and one["mean"] == 0.7 and one["se"] == math.inf
    two = seed_stats([0.5, 1.5])
    assert two["se"] == pytest.approx(0.5)                   # sd 0.7071 / sqrt 2


def test_gap_verdict_short_stats_and_non_finite_inputs():
    assert gap_verdict([0.5, 0.6], 0.1) == ("inconclusive", {"n": 2, "min_effect": 0.1})
    assert gap_verdict([0.5, 0.6, 0.7], math.nan)[0] == "inconclusive"
    v, st = gap_verdict([0.5, 0.6, 0.7], 0.1, within_var=[0.001, math.inf, 0.001], items_df=9)
    assert v == "inconclusive" and st == {"n": 3, "min_effect": 0.1}


def test_gap_verdict_items_shared_by_default():
    d, w = [0.3, 0.5, 0.4], [0.004, 0.006, 0.005]
    _, st = gap_verdict(d, 0.0, within_var=w, items_df=19)
    assert_stats(st, reference(d, w, items_df=19, shared=True))
    _, st2 = gap_verdict(d, 0.0, within_var=w, items_df=19, items_shared=False)
    assert_stats(st2, reference(d, w, items_df=19, shared=False))


def test_gap_verdict_wins_and_losses_by_margin():
    # min_effect 0: wins d > 0 and losses d < 0 (a tie is neither)
    _, st = gap_verdict([1.0, 0.0, 2.0], 0.0)
    assert st["wins"] == pytest.approx(2 / 3) and st["losses"] == 0.0
    # a positive min_effect does not change what a win is (d > 0)
    _, st = gap_verdict([0.6, 0.4, 0.7], 0.5)
    assert st["wins"] == 1.0
    # non-inferiority: a seed exactly at the margin is not a win
    _, st = gap_verdict([-0.1, 0.2, 0.3], -0.1)
    assert st["wins"] == pytest.approx(2 / 3) and st["losses"] == pytest.approx(1 / 3)


def test_gap_verdict_lower_bound_equal_to_min_effect_and_half_the_seeds():
    assert gap_verdict([0.25, 0.25, 0.25], 0.25)[0] == "inconclusive"    # se 0: lower == upper == min_effect
    d = [10.0] * 5 + [0.0] * 5                                          # lower bound > 0, but 5 of 10 wins
    v, st = gap_verdict(d, 0.0)
    assert st["lower"] > 0 and st["wins"] == 0.5 and v == "inconclusive"
    v, st = gap_verdict(d[:-1] + [0.5], 0.0)
    assert st["wins"] == 0.6 and v == "holds"


# --- operands, messages and binding: each error names the claim and the key ----------------------------------
def better(**kw):
    return Better("x", "s", kind="finding", a="a", **kw)


def test_operand_errors_name_claim_and_metric():
    with pytest.raises(ClaimError, match=r"claim 'x': metric 'b' was not measured"):
        evaluate_claims([better(b="b")], {"a": [1.0, 2.0, 3.0]}, {"x": {"min_effect": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'x': metric 'a' was not measured"):
        evaluate_claims([better(b="b")], {"b": [1.0, 2.0, 3.0]}, {"x": {"min_effect": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'x': metric 'cnt' was not measured"):
        evaluate_claims([better(b="b", n_items="cnt")], {"a": [0.1] * 3, "b": [0.2] * 3}, {"x": {"min_effect": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'x': metric 'a' is not a per-seed list of numbers"):
        evaluate_claims([better(b="b")], {"a": ["q", 1.0, 2.0], "b": [1.0] * 3}, {"x": {"min_effect": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'x': metric 'a' is not a per-seed list of numbers"):
        evaluate_claims([better(b="b")], {"a": True, "b": [1.0] * 3}, {"x": {"min_effect": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'x': metric 'a' is not a per-seed list of per-item numbers"):
        evaluate_claims([better(b="b")], {"a": [[1.0], ["q"], [2.0]], "b": [1.0] * 3}, {"x": {"min_effect": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'x': 'b' has 2 seeds, expected 3 \(paired\)"):
        evaluate_claims([better(b="b")], {"a": [1.0] * 3, "b": [1.0] * 2}, {"x": {"min_effect": 0.1}})
    long = "z" * 100
    with pytest.raises(ClaimError) as err:
        evaluate_claims([better(b="b")], {"a": long, "b": [1.0] * 3}, {"x": {"min_effect": 0.1}})
    assert f"({'z' * 80})" in str(err.value)
    with pytest.raises(ClaimError, match=r"claim 'paired_item_gap': metric 'a' is not a per-seed list"):
        paired_item_gap([[1.0, "q"]] * 3, [[1.0, 2.0]] * 3)
    with pytest.raises(ClaimError, match=r"claim 'paired_item_gap': metric 'b' is not a per-seed list"):
        paired_item_gap([[1.0, 2.0]] * 3, [[1.0, "q"]] * 3)
    with pytest.raises(ClaimError, match=r"claim 'x': needs b and min_effect"):
        better(b="b").evaluate({"a": [1.0] * 3, "b": [1.0] * 3})


def test_null_measurements_are_non_finite():
    out = evaluate_claims([better(b="b")], {"a": [None, 5.0, 6.0], "b": [1.0, 2.0, 3.0]}, {"x": {"min_effect": 0.1}})[0]
    assert out["verdict"] == "inconclusive" and math.isnan(out["values"]["a"][0])
    out = evaluate_claims([Bound("bd", "s", kind="check", value="a")], {"a": None}, {"bd": {"below": 1.0}})[0]
    assert out["verdict"] == "inconclusive" and math.isnan(out["values"]["a"][0]) and len(out["values"]["a"]) == 1
    items = {"a": [[0.9, None], [0.8, 0.7], [0.9, 0.9]], "b": [[0.1, 0.2]] * 3}
    out = evaluate_claims([better(b="b")], items, {"x": {"min_effect": 0.1}})[0]
    assert out["verdict"] == "inconclusive" and math.isnan(out["values"]["a"][0])


def test_two_items_per_seed_have_a_variance():
    A, B = [[0.9, 0.8], [0.85, 0.95], [0.9, 1.0]], [[0.1, 0.2], [0.15, 0.05], [0.1, 0.2]]
    out = evaluate_claims([better(b="b")], {"a": A, "b": B}, {"x": {"min_effect": 0.1}})[0]
    A_, B_ = np.array(A), np.array(B)
    assert_stats(out["stats"], reference(A_.mean(1) - B_.mean(1), (A_ - B_).var(axis=1, ddof=1) / 2, items_df=1))
    assert out["verdict"] in ("holds", "inconclusive") and math.isfinite(out["stats"]["se_items"])


def test_binomial_two_items_clamped_rates_and_constant_references():
    a = [0.6, 0.7, 0.65]
    out = evaluate_claims([better(b="b", n_items=2)], {"a": a, "b": [0.2, 0.3, 0.25]}, {"x": {"min_effect": 0.1}})[0]
    pa, pb = np.array(a), np.array([0.2, 0.3, 0.25])
    assert_stats(out["stats"], reference(pa - pb, (pa * (1 - pa) + pb * (1 - pb)) / 2, items_df=1))
    # a rate above 1 is clamped: no item variance (p(1 - p) with p = 1)
    out = evaluate_claims([Bound("r", "s", kind="check", value="r", n_items=50)], {"r": [1.5, 1.2, 1.3]},
                          {"r": {"above": 0.9}})[0]
    assert out["stats"]["se_items"] == 0.0
    # a constant reference from params carries no binomial noise; items_shared reaches the rule
    out = evaluate_claims([better(n_items=40, items_shared=False)], {"a": a}, {"x": {"min_effect": 0.1, "b": 0.5}})[0]
    assert_stats(out["stats"], reference(pa - 0.5, pa * (1 - pa) / 40, items_df=39, shared=False))
    assert out["check"] == "a > 0.5 by more than 0.1 (per seed, t-bound)"
    assert out["values"] == {"a": a}


def test_per_item_side_against_a_plain_side():
    # b has per-item lists, a has one value per seed: the item noise is b's alone
    B = np.array([[0.2, 0.4, 0.3, 0.1], [0.3, 0.3, 0.2, 0.2], [0.1, 0.2, 0.3, 0.2]])
    a = [0.9, 0.8, 0.85]
    out = evaluate_claims([better(b="b")], {"a": a, "b": B.tolist()}, {"x": {"min_effect": 0.1}})[0]
    assert_stats(out["stats"], reference(np.array(a) - B.mean(1), B.var(axis=1, ddof=1) / 4, items_df=3))
    assert out["values"]["b"] == pytest.approx(B.mean(1).tolist())


@pytest.mark.parametrize("make, field", [
    (lambda: Within("x", "s", kind="finding", a="a", b=0.5), "b"),
    (lambda: Bound("x", "s", kind="finding", value="a", above=1.0), "above"),
    (lambda: Near("x", "s", kind="check", value="a", ref="r", tol=0.1), "tol"),
    (lambda: Estimate("x", "s", kind="finding", value="v", se="s", df="d", above=1.0), "above"),
])
def test_every_threshold_field_refuses_a_number_in_code(make, field):
    with pytest.raises(ClaimError, match=f"{field}=.* is a threshold written in code"):
        make()


def test_expression_errors_name_the_claim():
    with pytest.raises(ClaimError, match=r"claim 'c': check is not a valid expression"):
        Claim("c", "s", "a >", kind="check")
    with pytest.raises(ClaimError, match=r"claim 'c': metric 'a' is not a number"):
        evaluate_claims([Claim("c", "s", "a > 0", kind="check")], {"a": "text"})
    with pytest.raises(ClaimError, match=r"claim 'c': metric 'q' was not measured"):
        evaluate_claims([Claim("c", "s", "a - q > 0", kind="check")], {"a": 1.0})
    with pytest.raises(ClaimError, match=r"claim 'c': metric 'q' was not measured"):
        evaluate_claims([Claim("c", "s", "q * a > 0", kind="check")], {"a": 1.0})
    with pytest.raises(ClaimError, match=r"claim 'c': unsupported expression"):
        evaluate_claims([Claim("c", "s", "max(a, b).real > 0", kind="check")], {"a": 1.0, "b": 2.0})
    assert Claim("c", "s", "x.y + z > param.k", kind="check", thresholds={"k": Param(1.0, "k")}).names() == \
        ["x.y", "z", "param.k"]


def test_claim_keeps_booleans():
    out = evaluate_claims([Claim("c", "s", "flag and n > 0", kind="check")], {"flag": True, "n": 2})[0]
    assert out["values"] == {"flag": True, "n": 2.0} and out["values"]["flag"] is True
    assert out["verdict"] == "holds"


def test_bind_messages_and_defaults():
    claims = [better(b="b")]
    with pytest.raises(ClaimError, match=r"^papers\.<slug>\.report\.claims\.x\.min_effect: missing \(claim 'x' reads this "
                                          r"threshold; fix it in params\.yaml before the run\)$"):
        bind(claims, {})
    with pytest.raises(ClaimError, match=r"^papers\.<slug>\.report\.claims: expected a mapping"):
        bind(claims, [1, 2])
    with pytest.raises(ClaimError, match=r"^here\.claims\.x: expected a mapping of threshold -> number$"):
        bind(claims, {"x": 3}, "here")
    with pytest.raises(ClaimError, match=r"claims\.c\.k: claim 'c' reads no threshold 'k' \(it reads: none\)$"):
        bind([Claim("c", "s", "a > 0", kind="check")], {"c": {"k": 1.0}})
    with pytest.raises(ClaimError, match=r"\(it reads: b, min_effect\)$"):
        bind(claims, {"x": {"min_effect": 0.1, "tol": 1.0}})
    with pytest.raises(ClaimError, match=r"matches several patterns \(x\*, \?\)$"):
        bind(claims, {"x*": {"min_effect": 0.1}, "?": {"min_effect": 0.1}})
    assert bind(claims, {"x": {"min_effect": 0.1}, "unused": {"min_effect": 1.0}})[0].min_effect == 0.1
    # a threshold given in code as a Param is there: not missing
    kept = bind([better(b="b", min_effect=Param(0.2, "k"))], {})[0]
    assert kept.min_effect == 0.2
    # a Bound with above in code and below in params is refused
    with pytest.raises(ClaimError, match="a Bound takes below or above, not both"):
        bind([Bound("bd", "s", kind="finding", value="v", above="m")], {"bd": {"below": 1.0}})


def test_findings_summary_counts_unkinded_verdicts_as_findings():
    assert findings_summary([{"verdict": "holds"}, {"verdict": "fails", "kind": "check"}]) == {
        "findings": 1, "findings_holds": 1, "findings_fails": 0, "findings_inconclusive": 0, "checks": 1,
        "checks_pass": 0}


def test_band_edges_with_no_spread():
    # every gap equal: both t-bounds equal the gap; a gap on the band's edge is neither inside nor outside it
    for g in (0.25, -0.25):
        out = evaluate_claims([Within("w", "s", kind="finding", a="a")], {"a": [g] * 3},
                              {"w": {"delta": 0.25, "b": 0.0}})[0]
        assert out["verdict"] == "inconclusive" and out["stats"]["lower"] == out["stats"]["upper"] == g


def test_within_inconclusive_keeps_values_and_names_the_claim():
    out = evaluate_claims([Within("w", "s", kind="finding", a="a", b="b")], {"a": [1.0, 2.0], "b": [1.0, 1.5]},
                          {"w": {"delta": 0.1}})[0]
    assert out["values"] == {"a": [1.0, 2.0], "b": [1.0, 1.5]}
    with pytest.raises(ClaimError, match=r"claim 'w': 'b' has 2 seeds, expected 3"):
        evaluate_claims([Within("w", "s", kind="finding", a="a", b="b")], {"a": [1.0] * 3, "b": [1.0] * 2},
                        {"w": {"delta": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'bd': 'lim' has 2 seeds, expected 3"):
        evaluate_claims([Bound("bd", "s", kind="finding", value="a", below="lim")], {"a": [1.0] * 3, "lim": [1.0] * 2})
    with pytest.raises(ClaimError, match=r"claim 'bd': metric 'a' was not measured"):
        evaluate_claims([Bound("bd", "s", kind="finding", value="a", below="lim")], {"lim": [1.0] * 3})
    with pytest.raises(ClaimError, match=r"claim 'bd': metric 'cnt' was not measured"):
        evaluate_claims([Bound("bd", "s", kind="finding", value="a", below="lim", n_items="cnt")],
                        {"a": [0.1] * 3, "lim": [1.0] * 3})
    with pytest.raises(ClaimError, match=r"^claim 'bd': Bound needs exactly one of below= / above= \(a metric, "
                                          r"or a number in params\)$"):
        Bound("bd", "s", kind="check", value="v").evaluate({"v": [1.0, 2.0, 3.0]})
    with pytest.raises(ClaimError, match=r"^claim 'e': Estimate needs exactly one of below= / above= \(a metric, "
                                          r"or a number in params\)$"):
        estimate().evaluate({"fit.slope": 0.1, "fit.se": 0.1, "fit.df": 3})
    with pytest.raises(ClaimError, match=r"^claim 'n': needs ref and tol \(tol from params\)$"):
        Near("n", "s", kind="check", value="r", ref="q").evaluate({"r": [1.0] * 3, "q": 1.0})


def test_bound_pairs_items_with_a_per_item_limit():
    rng = np.random.default_rng(6)
    X = rng.normal(0.3, 0.1, (3, 5))
    L_ = X + rng.normal(0.2, 0.02, (3, 5))                  # the limit measured on the same items
    out = evaluate_claims([Bound("bd", "s", kind="finding", value="x", below="lim")],
                          {"x": X.tolist(), "lim": L_.tolist()})[0]
    assert_stats(out["stats"], reference(L_.mean(1) - X.mean(1), (L_ - X).var(axis=1, ddof=1) / 5, items_df=4))
    assert out["verdict"] == "holds"


def test_band_edges_with_spread():
    # a t-bound exactly on the band's edge is not inside it (both one-sided tests are strict)
    def run(gaps, delta):
        return evaluate_claims([Within("w", "s", kind="finding", a="a")], {"a": gaps},
                               {"w": {"delta": delta, "b": 0.0}})[0]
    neg = [-0.1, 0.0, 0.05, -0.05, 0.02]                  # mean < 0: the lower bound is the binding one
    lower = run(neg, 1.0)["stats"]["lower"]
    out = run(neg, -lower)
    assert out["stats"]["lower"] == -out["stats"]["delta"] and out["verdict"] == "inconclusive"
    pos = [0.1, 0.0, -0.05, 0.05, -0.02]                  # mean > 0: the upper bound is the binding one
    upper = run(pos, 1.0)["stats"]["upper"]
    out = run(pos, upper)
    assert out["stats"]["upper"] == out["stats"]["delta"] and out["verdict"] == "inconclusive"


def test_estimate_on_its_bound_with_no_error():
    out = evaluate_claims([estimate()], {"fit.slope": 0.6, "fit.se": 0.0, "fit.df": 5}, {"e": {"below": 0.6}})[0]
    assert out["stats"]["lower"] == out["stats"]["upper"] == 0.0 and out["verdict"] == "inconclusive"
    bad = evaluate_claims([estimate()], {"fit.slope": 0.6, "fit.se": 0.1, "fit.df": 0}, {"e": {"below": 0.6}})[0]
    assert bad["values"] == {"fit.slope": 0.6, "fit.se": 0.1, "fit.df": 0.0}


def test_within_direct_errors_name_the_claim():
    with pytest.raises(ClaimError, match=r"^claim 'w': needs b and delta \(delta from params\)$"):
        Within("w", "s", kind="finding", a="a", b="b").evaluate({"a": [1.0] * 3, "b": [1.0] * 3})
    with pytest.raises(ClaimError, match=r"claim 'w': metric 'a' was not measured"):
        evaluate_claims([Within("w", "s", kind="finding", a="a", b="b")], {"b": [1.0] * 3}, {"w": {"delta": 0.1}})
    with pytest.raises(ClaimError, match=r"claim 'w': metric 'cnt' was not measured"):
        evaluate_claims([Within("w", "s", kind="finding", a="a", b="b", n_items="cnt")],
                        {"a": [0.1] * 3, "b": [0.1] * 3}, {"w": {"delta": 0.1}})


def test_claim_values_are_floats_except_booleans():
    out = evaluate_claims([Claim("c", "s", "flag and n > 0", kind="check")], {"flag": True, "n": 2})[0]
    assert type(out["values"]["n"]) is float and type(out["values"]["flag"]) is bool


@pytest.mark.parametrize("expr", ["-q > 0", "a > 0 and q > 0", "a < q", "abs(q) > 0", "a + 0 < q"])
def test_expression_errors_inside_sub_expressions_name_the_claim(expr):
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 'q' was not measured$"):
        evaluate_claims([Claim("c", "s", expr, kind="check")], {"a": 1.0})


def test_unsupported_comparison_is_an_error():
    with pytest.raises(ClaimError, match=r"claim 'c': unsupported expression"):
        evaluate_claims([Claim("c", "s", "a is b", kind="check")], {"a": 1.0, "b": 1.0})


def test_where_names_the_params_section():
    claims = [better(b="b")]
    with pytest.raises(ClaimError, match=r"^papers\.<slug>\.report\.claims\.x\.min_effect: missing"):
        evaluate_claims(claims, {"a": [1.0] * 3, "b": [1.0] * 3})
    with pytest.raises(ClaimError, match=r"^papers\.demo\.report\.claims\.x\.min_effect: missing"):
        evaluate_claims(claims, {"a": [1.0] * 3, "b": [1.0] * 3}, None, "papers.demo.report")
    with pytest.raises(ClaimError, match=r"^here\.claims: claim 'x' matches several patterns"):
        bind(claims, {"x*": {"min_effect": 0.1}, "?": {"min_effect": 0.1}}, "here")


def test_a_pattern_with_every_wildcard_kind():
    c = [Better("xyzx", "s", kind="finding", a="a", b="b")]
    assert bind(c, {"x*?[x]": {"min_effect": 0.3}})[0].min_effect == 0.3


def test_item_variance_without_an_item_df_keeps_n_minus_1():
    d, w = [0.3, 0.5, 0.4], [0.004, 0.006, 0.005]
    _, st = gap_verdict(d, 0.0, within_var=w)
    ref = reference(d, w, items_df=1.0)
    assert st["df"] == 2.0 and st["se"] == pytest.approx(ref["se"])
    assert st["t"] == pytest.approx(stats.t.ppf(0.95, 2))
