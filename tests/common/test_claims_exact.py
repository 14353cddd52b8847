"""The shared verdict rule at each boundary, with expectations worked by hand (t quantiles from scipy).

Rule (issue 38): per-seed differences d (positive supports the claim), n >= 3, L/U the one-sided 95%
t-bounds of mean(d) with n - 1 df: holds iff L > min_effect and d > 0 on a strict majority of seeds;
fails iff U < min_effect; inconclusive otherwise (and always with n < 3 or a non-finite value).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stages.common.claims import (Better, Bound, Claim, ClaimError, Near, Within, bind, evaluate_claims,
                                  findings_line, findings_summary, gap_verdict, seed_stats)

T95 = {2: 2.919986, 4: 2.131847}  # one-sided 95% t quantiles (tables), df = n - 1


def test_t_table_values_match_scipy():
    for df, q in T95.items():
        assert stats.t.ppf(0.95, df) == pytest.approx(q, abs=1e-6)


# --- the four examples of the issue, and their numbers by hand ------------------------------------
def test_issue_examples():
    assert gap_verdict([1.0, 1.4, 0.2])[0] == "inconclusive"
    assert gap_verdict([1.0, 1.5, 0.4])[0] == "holds"
    assert gap_verdict([0, 0, 0], min_effect=0.01)[0] == "fails"
    assert gap_verdict([0.5, 0.6, 0.55], min_effect=1.0)[0] == "fails"


def test_bounds_by_hand():
    # [1.0, 1.4, 0.2]: mean 0.866667, sample var 0.373333, se sqrt(0.373333/3) = 0.352767
    v, st = gap_verdict([1.0, 1.4, 0.2])
    assert st["mean"] == pytest.approx(0.866667, abs=1e-6)
    assert st["se"] == pytest.approx(0.352767, abs=1e-6)
    assert st["df"] == 2.0 and st["t"] == pytest.approx(T95[2], abs=1e-6)
    assert st["lower"] == pytest.approx(0.866667 - 2.919986 * 0.352767, abs=1e-5)   # -0.163409
    assert st["upper"] == pytest.approx(0.866667 + 2.919986 * 0.352767, abs=1e-5)
    # [1.0, 1.5, 0.4]: mean 0.966667, var 0.303333, se 0.317980, L = 0.038170 > 0
    v, st = gap_verdict([1.0, 1.5, 0.4])
    assert v == "holds" and st["lower"] == pytest.approx(0.038170, abs=1e-5)
    # the old rule (mean - 2 se) would have held the first example: 0.8667 - 0.7055 > 0
    assert 0.866667 - 2 * 0.352767 > 0


def test_five_seeds_use_four_df():
    d = [0.2, 0.4, 0.3, 0.5, 0.1]    # mean 0.3, var 0.025, se sqrt(0.005) = 0.0707107
    v, st = gap_verdict(d)
    assert st["df"] == 4.0 and st["lower"] == pytest.approx(0.3 - 2.131847 * 0.0707107, abs=1e-6)
    assert v == "holds"
    assert gap_verdict(d, min_effect=0.15)[0] == "inconclusive"   # L = 0.14926 < 0.15 < U
    assert gap_verdict(d, min_effect=0.46)[0] == "fails"          # U = 0.45074 < 0.46


def test_lower_bound_exactly_at_min_effect_is_not_enough():
    d = [1.0, 2.0, 3.0]                          # mean 2, se 1/sqrt(3)
    lower = 2.0 - T95[2] / math.sqrt(3)          # 0.314132
    assert gap_verdict(d, min_effect=lower - 1e-6)[0] == "holds"
    assert gap_verdict(d, min_effect=lower + 1e-6)[0] == "inconclusive"
    upper = 2.0 + T95[2] / math.sqrt(3)
    assert gap_verdict(d, min_effect=upper + 1e-6)[0] == "fails"
    assert gap_verdict(d, min_effect=upper - 1e-6)[0] == "inconclusive"


def test_identical_arms():
    assert gap_verdict([0.0, 0.0, 0.0])[0] == "inconclusive"          # min_effect 0: L = U = 0
    assert gap_verdict([0.0, 0.0, 0.0], min_effect=1e-9)[0] == "fails"
    assert gap_verdict([1e-9, 1e-9, 1e-9])[0] == "holds"              # any improvement, min effect 0
    assert gap_verdict([1e-9, 1e-9, 1e-9], min_effect=1e-3)[0] == "fails"


def test_strict_majority_needed():
    # 51 seeds at -0.001 and 50 at +1: L ~ 0.41 > 0 but wins 50/101 -> not holds
    d = [-0.001] * 51 + [1.0] * 50
    v, st = gap_verdict(d)
    assert st["lower"] > 0 and st["wins"] == pytest.approx(50 / 101) and v == "inconclusive"
    d2 = [-0.001] * 50 + [1.0] * 51
    assert gap_verdict(d2)[0] == "holds"


def test_non_inferiority_wins_count_seeds_within_the_margin():
    # "a at least b − 0.05": gaps −0.02, −0.01, −0.03 lose to b but are within the margin on every seed
    d = [-0.02, -0.01, -0.03]
    v, st = gap_verdict(d, min_effect=-0.05)
    lower = -0.02 - T95[2] * 0.01 / math.sqrt(3)            # sd 0.01
    assert st["lower"] == pytest.approx(lower) and lower > -0.05
    assert (v, st["wins"], st["losses"]) == ("holds", 1.0, 0.0)
    # one seed beyond the margin: wins 2/3, still a majority; two beyond: not a majority
    assert gap_verdict([-0.02, -0.021, -0.06], min_effect=-0.1)[1]["wins"] == 1.0
    st2 = gap_verdict([-0.02, -0.06, -0.07], min_effect=-0.05)[1]
    assert st2["wins"] == pytest.approx(1 / 3)
    # a superiority claim keeps d > 0 as the win (min effect 0 or positive)
    assert gap_verdict(d)[1]["wins"] == 0.0 and gap_verdict(d, min_effect=0.01)[1]["wins"] == 0.0


@pytest.mark.parametrize("diffs", [[5.0, 6.0], [1.0], [], [1.0, math.nan, 2.0], [1.0, math.inf, 2.0]])
def test_few_seeds_or_non_finite_inconclusive(diffs):
    v, st = gap_verdict(diffs)
    assert v == "inconclusive" and st["n"] == len(diffs) and "lower" not in st


def test_detectable_gap_formula():
    d = [1.0, 1.4, 0.2]
    _, st = gap_verdict(d, min_effect=0.1)
    se = 0.352767
    assert st["detectable"] == pytest.approx(0.1 + (2.919986 + stats.t.ppf(0.8, 2)) * se, abs=1e-5)


def test_seed_stats_by_hand():
    st = seed_stats([1.0, 2.0, 6.0])  # mean 3, var (4 + 1 + 9)/2 = 7
    assert st == {"n": 3, "mean": 3.0, "se": pytest.approx(math.sqrt(7 / 3)), "wins": 1.0, "losses": 0.0}


# --- item noise -----------------------------------------------------------------------------------
A_ITEMS = [[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1]]
B_ITEMS = [[0, 1, 0, 0, 1, 0], [1, 0, 0, 1, 0, 0], [0, 1, 0, 1, 0, 0]]


def test_items_paired_total_variance_by_hand():
    a, b = np.array(A_ITEMS, float), np.array(B_ITEMS, float)
    d_items = a - b                                    # paired per item
    d = d_items.mean(axis=1)                           # per-seed gaps: 2/6, 3/6, 3/6
    v_s = d_items.var(axis=1, ddof=1) / 6              # within-seed variance of each seed's gap
    between = d.var(ddof=1) / 3
    se = math.sqrt(between + v_s.mean())               # shared items: not divided by n
    df = (between + v_s.mean()) ** 2 / (between ** 2 / 2 + v_s.mean() ** 2 / 5)   # Welch–Satterthwaite
    out = evaluate_claims([Better("x", "s", kind="finding", a="a", b="b")], {"a": A_ITEMS, "b": B_ITEMS},
                          {"x": {"min_effect": 0.0}})[0]
    assert out["stats"]["se"] == pytest.approx(se) and out["stats"]["se_seeds"] == pytest.approx(math.sqrt(between))
    assert out["stats"]["df"] == pytest.approx(df)
    assert out["stats"]["mean"] == pytest.approx(8 / 18)
    lower = 8 / 18 - stats.t.ppf(0.95, df) * se
    assert out["stats"]["lower"] == pytest.approx(lower)
    assert out["verdict"] == ("holds" if lower > 0 else "inconclusive")
    # without items the same per-seed gaps (2/6, 3/6, 3/6) clear 0.2; with 6 items per seed they do not
    flat = evaluate_claims([Better("x", "s", kind="finding", a="a", b="b")],
                           {"a": list(a.mean(axis=1)), "b": list(b.mean(axis=1))}, {"x": {"min_effect": 0.2}})[0]
    assert flat["verdict"] == "holds"
    withitems = evaluate_claims([Better("x", "s", kind="finding", a="a", b="b")], {"a": A_ITEMS, "b": B_ITEMS},
                                {"x": {"min_effect": 0.2}})[0]
    assert withitems["verdict"] == "inconclusive"


def test_items_unshared_divides_by_n_and_satterthwaite_df():
    a = [[1.0, 2.0, 4.0], [2.0, 2.0, 5.0], [0.0, 3.0, 3.0]]
    means = [7 / 3, 3.0, 2.0]
    item_var = [np.var(x, ddof=1) / 3 for x in a]
    s2 = np.var(means, ddof=1)
    A, B = s2 / 3, np.mean(item_var) / 3
    df = (A + B) ** 2 / (A ** 2 / 2 + B ** 2 / 2)
    out = evaluate_claims([Bound("x", "s", kind="finding", value="a", items_shared=False)], {"a": a},
                          {"x": {"above": 1.0}})[0]
    assert out["stats"]["se"] == pytest.approx(math.sqrt(A + B))
    assert out["stats"]["df"] == pytest.approx(df)
    assert out["values"]["a"] == pytest.approx(means)


def test_binomial_item_noise_from_n_items():
    m = {"acc_a": [0.6, 0.62, 0.58], "acc_b": [0.5, 0.52, 0.48], "m": 400}
    out = evaluate_claims([Better("x", "s", kind="finding", a="acc_a", b="acc_b", n_items="m")], m,
                          {"x": {"min_effect": 0.0}})[0]
    v = np.mean([p * (1 - p) / 400 + q * (1 - q) / 400 for p, q in zip(m["acc_a"], m["acc_b"])])
    assert out["stats"]["se_items"] == pytest.approx(math.sqrt(v))
    assert out["stats"]["se"] == pytest.approx(math.sqrt(v))   # seed part is 0: identical gaps
    assert out["stats"]["df"] == pytest.approx(399)            # no seed part: the item df m - 1
    assert out["verdict"] == "holds"                            # 0.10 - 1.649 * 0.0350 > 0
    out0 = evaluate_claims([Better("x", "s", kind="finding", a="acc_a", b="acc_b", n_items=100)], m,
                           {"x": {"min_effect": 0.0}})[0]
    assert out0["verdict"] == "inconclusive"                    # 100 items: 0.10 - 1.66 * 0.070 < 0


@pytest.mark.parametrize("count", [0, 1, float("nan")])
def test_binomial_with_fewer_than_two_items_is_inconclusive(count):
    """A rate over 0 or 1 items has no item variance (like a per-item list of one, `_var`): the verdict is
    inconclusive, not a ZeroDivisionError (m = 0) or a t-quantile at 0 df (m = 1) deep in the rule. The same gaps
    with 400 items hold (above)."""
    m = {"acc_a": [0.6, 0.62, 0.58], "acc_b": [0.5, 0.52, 0.48], "m": [400, count, 400]}
    for n_items in ("m", count):
        for claim in (Better("x", "s", kind="finding", a="acc_a", b="acc_b", n_items=n_items),
                      Bound("x", "s", kind="check", value="acc_a", n_items=n_items)):
            th = {"above": 0.1} if isinstance(claim, Bound) else {"min_effect": 0.0}
            out = evaluate_claims([claim], m, {"x": th})[0]
            assert out["verdict"] == "inconclusive", (n_items, type(claim).__name__)


# --- Within / Bound / Near on the same bounds -----------------------------------------------------
def test_within_tost_edges():
    # gaps 0.01, 0.02, 0.03: mean 0.02, se 0.01/sqrt(3) = 0.0057735; bounds 0.02 -/+ 0.016859
    m = {"a": [1.01, 1.02, 1.03], "b": [1.0, 1.0, 1.0]}
    half = T95[2] * 0.01 / math.sqrt(3)
    upper = 0.02 + half
    assert evaluate_claims([Within("w", "s", kind="finding", a="a", b="b")], m,
                           {"w": {"delta": upper + 1e-6}})[0]["verdict"] == "holds"
    assert evaluate_claims([Within("w", "s", kind="finding", a="a", b="b")], m,
                           {"w": {"delta": upper - 1e-6}})[0]["verdict"] == "inconclusive"
    lower = 0.02 - half
    assert evaluate_claims([Within("w", "s", kind="finding", a="a", b="b")], m,
                           {"w": {"delta": lower - 1e-6}})[0]["verdict"] == "fails"
    assert evaluate_claims([Within("w", "s", kind="finding", a="a", b="b")], m,
                           {"w": {"delta": lower + 1e-6}})[0]["verdict"] == "inconclusive"


def test_bound_and_near():
    m = {"slope": [0.48, 0.52, 0.50], "rate": [0.94, 0.95, 0.96], "lim": 0.9}
    out = evaluate_claims([
        Bound("below", "s", kind="finding", value="slope"),
        Bound("above", "s", kind="finding", value="slope"),
        Bound("above_metric", "s", kind="check", value="rate", above="lim"),
        Near("near", "s", kind="check", value="rate"),
        Near("not_near", "s", kind="check", value="rate"),
    ], m, {"below": {"below": 0.6}, "above": {"above": 0.6}, "near": {"ref": 0.95, "tol": 0.05},
           "not_near": {"ref": 0.5, "tol": 0.03}})
    assert [o["verdict"] for o in out] == ["holds", "fails", "holds", "holds", "fails"]
    # below 0.6: diffs 0.12, 0.08, 0.10 -> mean 0.1, se 0.02/sqrt(3)
    assert out[0]["stats"]["lower"] == pytest.approx(0.1 - T95[2] * 0.02 / math.sqrt(3))
    assert out[3]["params"] == {"ref": 0.95, "tol": 0.05}


# --- kinds and thresholds from params -------------------------------------------------------------
def test_kind_is_required_and_checked():
    with pytest.raises(TypeError):
        Better("x", "s", a="a", b="b")  # no kind
    with pytest.raises(ClaimError, match="kind must be"):
        Better("x", "s", kind="result", a="a", b="b")


@pytest.mark.parametrize("make, field", [
    (lambda: Better("x", "s", kind="finding", a="a", b="b", min_effect=0.1), "min_effect"),
    (lambda: Better("x", "s", kind="finding", a="a", b=0.5), "b"),
    (lambda: Within("x", "s", kind="finding", a="a", b="b", delta=0.05), "delta"),
    (lambda: Near("x", "s", kind="check", value="a", ref=0.95), "ref"),
    (lambda: Bound("x", "s", kind="finding", value="a", below=1.0), "below"),
])
def test_numbers_in_code_are_refused(make, field):
    with pytest.raises(ClaimError, match=f"{field}=.* is a threshold written in code.*claims.x.{field}"):
        make()


def test_expression_literals_other_than_0_1_are_refused():
    with pytest.raises(ClaimError, match="the number 10 in its check"):
        Claim("c", "s", "a > 10 * b", kind="check")
    c = Claim("c", "s", "a > param.k * b and a >= 0 and a - 1 > b", kind="check")
    out = evaluate_claims([c], {"a": 5.0, "b": 0.4}, {"c": {"k": 10}})[0]
    assert out["verdict"] == "holds" and out["params"] == {"k": 10.0}
    assert out["values"] == {"a": 5.0, "b": 0.4}
    assert evaluate_claims([c], {"a": 5.0, "b": 0.6}, {"c": {"k": 10}})[0]["verdict"] == "fails"


@pytest.mark.parametrize("thresholds, needle", [
    ({}, r"claims.x.min_effect: missing"),
    ({"x": {"min_effect": 0.1, "delta": 0.2}}, r"claims.x.delta: claim 'x' reads no threshold 'delta'"),
    ({"x": {"min_effect": "big"}}, r"claims.x.min_effect: must be a finite number"),
    ({"x": {"min_effect": math.inf}}, r"claims.x.min_effect: must be a finite number"),
    ({"x": {"min_effect": 0.1, "b": 0.3}}, r"already compares against the metric 'b'"),
])
def test_bind_errors_name_the_key(thresholds, needle):
    with pytest.raises(ClaimError, match=needle):
        bind([Better("x", "s", kind="finding", a="a", b="b")], thresholds, "papers.demo.report")


def test_bind_patterns_and_unused():
    claims = [Better("beats_c1", "s", kind="finding", a="a", b="b"),
              Better("beats_c2", "s", kind="finding", a="a", b="b")]
    out = bind(claims, {"beats_*": {"min_effect": 0.2}, "beats_c2": {"min_effect": 0.3}})
    assert [c.min_effect for c in out] == [0.2, 0.3]   # an exact name wins over a pattern
    with pytest.raises(ClaimError, match="matches several patterns"):
        bind(claims, {"beats_*": {"min_effect": 0.2}, "beats_c?": {"min_effect": 0.2}})
    with pytest.raises(ClaimError, match="claims.nosuch: no claim"):
        bind(claims, {"beats_*": {"min_effect": 0.2}, "nosuch": {"min_effect": 1}}, strict_unused=True)
    with pytest.raises(ClaimError, match="below or above, not both"):
        bind([Bound("b", "s", kind="finding", value="v", below="m")], {"b": {"above": 1.0}})


def test_plain_claim_non_finite_is_inconclusive():
    out = evaluate_claims([Claim("c", "s", "v < 1 or v >= 1", kind="check")], {"v": math.nan})[0]
    assert out["verdict"] == "inconclusive" and out["holds"] is False


def test_findings_summary_and_line():
    vs = [{"kind": "finding", "verdict": v} for v in ("holds", "holds", "holds", "fails", "inconclusive",
                                                      "inconclusive")]
    vs += [{"kind": "check", "verdict": "holds"}] * 5
    assert findings_summary(vs) == {"findings": 6, "findings_holds": 3, "findings_fails": 1,
                                    "findings_inconclusive": 2, "checks": 5, "checks_pass": 5}
    assert findings_line(vs) == "findings: 3 hold, 1 fails, 2 inconclusive; checks: 5/5 pass"


def test_result_schema():
    out = evaluate_claims([Better("x", "stmt", kind="check", a="a", b="b", higher_is_better=False,
                                  refuted_by="r")],
                          {"a": [1.0, 1.1, 1.2], "b": [2.0, 2.0, 2.1]}, {"x": {"min_effect": 0.5}})[0]
    assert set(out) == {"name", "statement", "kind", "check", "holds", "verdict", "values", "stats", "params",
                        "refuted_by", "wallclock"}
    assert out["kind"] == "check" and out["params"] == {"min_effect": 0.5} and out["wallclock"] is False
    assert out["stats"]["mean"] == pytest.approx(0.9333333)   # raw gap: min effect not subtracted
    assert out["stats"]["min_effect"] == 0.5
    assert out["check"] == "a < b by more than 0.5 (per seed, t-bound)"


def test_seed_count_mismatch_and_bad_values():
    with pytest.raises(ClaimError, match="expected 3"):
        evaluate_claims([Better("x", "s", kind="finding", a="a", b="b")], {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0]},
                        {"x": {"min_effect": 0}})
    with pytest.raises(ClaimError, match="per-seed list"):
        evaluate_claims([Better("x", "s", kind="finding", a="a", b="b")], {"a": "text", "b": [1.0]},
                        {"x": {"min_effect": 0}})
    with pytest.raises(ClaimError, match="per-item numbers"):
        evaluate_claims([Better("x", "s", kind="finding", a="a", b="b")], {"a": [[1, "x"]], "b": [1.0]},
                        {"x": {"min_effect": 0}})


def test_param_marks_a_stage_config_threshold():
    from stages.common.claims import Param

    b = Bound("x", "s", kind="finding", value="v", below=Param(1.25, "evaluate.ppl_budget"))
    out = evaluate_claims([b], {"v": [1.1, 1.0, 1.05]})[0]
    assert out["verdict"] == "holds" and out["params"] == {"below": 1.25, "below_from": "evaluate.ppl_budget"}
    c = Claim("c", "s", "r >= param.target", kind="finding", thresholds={"target": Param(4, "evaluate.target")})
    out = evaluate_claims([c], {"r": 4.5})[0]
    assert out["verdict"] == "holds" and out["params"] == {"target": 4.0, "target_from": "evaluate.target"}
    with pytest.raises(ClaimError, match="threshold target=4 is written in code"):
        Claim("c", "s", "r >= param.target", kind="finding", thresholds={"target": 4})


def test_json_null_reads_as_a_non_finite_measurement():
    out = evaluate_claims([Better("x", "s", kind="finding", a="a", b="b"),
                           Claim("c", "s", "v > 0", kind="check")],
                          {"a": [1.0, None, 2.0], "b": [0.0, 0.0, 0.0], "v": None}, {"x": {"min_effect": 0}})
    assert [o["verdict"] for o in out] == ["inconclusive", "inconclusive"]


def test_paired_item_gap_is_the_gap_better_computes():
    """The table helper gives the stats of a Better claim on the same per-item lists (mean, se, df, bounds), and
    refuses unpaired seed counts."""
    from stages.common.claims import Better, ClaimError, bind, paired_item_gap

    a = [[0.9, 0.2, 0.7, 0.4], [0.5, 0.8, 0.3, 0.6], [0.7, 0.7, 0.1, 0.9]]
    b = [[0.4, 0.3, 0.2, 0.5], [0.6, 0.1, 0.2, 0.3], [0.2, 0.5, 0.4, 0.1]]
    claim = bind([Better("g", "a beats b", kind="check", a="a", b="b")], {"g": {"min_effect": 0.0}})[0]
    want = claim.evaluate({"a": a, "b": b})["stats"]
    got = paired_item_gap(a, b)
    for k in ("mean", "se", "se_items", "se_seeds", "df", "lower", "upper"):
        assert got[k] == pytest.approx(want[k], rel=1e-12), k
    with pytest.raises(ClaimError, match="3 seeds against 2"):
        paired_item_gap(a, b[:2])
