"""stages/common/claims.py pinned on hand-computed numbers (issue 33): per-seed statistics, every verdict
boundary of gap_verdict and Within built so that mean ± 2 s.e. or the win fraction lands exactly on it,
the exact result dicts (keys, values, check strings), and error messages that name the claim from every
position in a check expression."""
from __future__ import annotations

import math

import pytest

from stages.common.claims import (Better, Bound, Claim, ClaimError, Near, Within, evaluate_claims, gap_verdict,
                                  seed_stats)


# ---------------------------------------------------------------- seed statistics
def test_seed_stats_by_hand():
    # mean 0.3; squared deviations .04 .25 .36 .09 -> sample var .74/3; se = sqrt(var/4); 0.0 is neither
    st = seed_stats([0.5, -0.2, 0.9, 0.0])
    assert st["n"] == 4 and st["mean"] == pytest.approx(0.3)
    assert st["se"] == pytest.approx(math.sqrt(0.74 / 3 / 4))
    assert st["wins"] == 0.5 and st["losses"] == 0.25
    two = seed_stats([0.3, -0.1])                      # var = (.2² + .2²)/1 = .08, se = sqrt(.08/2) = .2
    assert two["se"] == pytest.approx(0.2) and two["wins"] == 0.5 and two["losses"] == 0.5
    one = seed_stats([0.7])
    assert one["se"] == math.inf and one["mean"] == 0.7 and one["wins"] == 1.0 and one["losses"] == 0.0


# ---------------------------------------------------------------- gap_verdict boundaries
def test_gap_verdict_mean_minus_two_se_exactly_zero_is_not_enough():
    # [3,3,3,-1]: mean 2, var (1+1+1+9)/3 = 4, se = sqrt(4/4) = 1 -> mean - 2 se = 0 exactly
    verdict, st = gap_verdict([3.0, 3.0, 3.0, -1.0])
    assert verdict == "inconclusive" and st["mean"] == 2.0 and st["se"] == 1.0
    assert gap_verdict([-3.0, -3.0, -3.0, 1.0])[0] == "inconclusive"      # mean + 2 se = 0 exactly


def test_gap_verdict_two_not_three_standard_errors():
    # [3,3,3,-.5]: mean 2.125, se .875: mean - 2 se = .375 > 0 but mean - 3 se < 0
    assert gap_verdict([3.0, 3.0, 3.0, -0.5])[0] == "holds"
    assert gap_verdict([-3.0, -3.0, -3.0, 0.5])[0] == "fails"


def test_gap_verdict_needs_a_strict_majority_of_seeds():
    # [10,10,10,0,0,0]: mean 5, se = sqrt(30/6) = 2.236 -> mean - 2 se > 0, but wins are exactly 1/2
    assert gap_verdict([10.0, 10.0, 10.0, 0.0, 0.0, 0.0])[0] == "inconclusive"
    assert gap_verdict([-10.0, -10.0, -10.0, 0.0, 0.0, 0.0])[0] == "inconclusive"
    assert gap_verdict([10.0, 10.0, 10.0, 0.5, 0.5, 0.5])[0] == "holds"


def test_gap_verdict_few_seeds_or_non_finite_is_inconclusive_with_only_n():
    assert gap_verdict([]) == ("inconclusive", {"n": 0})
    assert gap_verdict([1.0, 2.0, math.nan]) == ("inconclusive", {"n": 3})
    assert gap_verdict([1.0, math.inf, 2.0]) == ("inconclusive", {"n": 3})
    verdict, st = gap_verdict([5.0, 6.0])
    assert verdict == "inconclusive" and st["n"] == 2 and st["mean"] == 5.5


# ---------------------------------------------------------------- Better / Bound exact results
ENV = {"a": [3.0, 4.0, 5.0], "b": [1.0, 1.5, 2.5], "flat": 2.0, "pair": [1.0, 2.0]}


def test_better_result_dict_exactly():
    out = Better("c", "A beats B", a="a", b="b", refuted_by="B wins").evaluate(ENV)
    # diffs 2, 2.5, 2.5: mean 7/3
    assert out == {"name": "c", "statement": "A beats B", "check": "a > b (per seed)", "holds": True,
                   "verdict": "holds", "values": {"a": [3.0, 4.0, 5.0], "b": [1.0, 1.5, 2.5]},
                   "stats": {**seed_stats([2.0, 2.5, 2.5])}, "refuted_by": "B wins"}
    assert all(isinstance(v, float) for v in out["stats"].values())


def test_better_lower_is_better_sign_margin_and_constants():
    out = Better("c", "s", a="b", b="a", higher_is_better=False, margin=0.25).evaluate(ENV)
    # diffs = -(b - a) - .25 = 1.75, 2.25, 2.25
    assert out["stats"]["mean"] == pytest.approx(6.25 / 3)
    assert out["check"] == "b < a by > 0.25 (per seed)" and out["verdict"] == "holds"
    const = Better("c", "s", a="a", b=4.5).evaluate(ENV)        # a constant b is not a named value
    assert const["values"] == {"a": [3.0, 4.0, 5.0]} and const["check"] == "a > 4.5 (per seed)"
    assert const["stats"]["mean"] == pytest.approx(-0.5)
    scalar = Better("c", "s", a="a", b="flat").evaluate(ENV)    # a scalar metric is broadcast and named
    assert scalar["values"] == {"a": [3.0, 4.0, 5.0], "flat": [2.0, 2.0, 2.0]}


def test_bound_below_and_above_exactly():
    below = Bound("c", "s", value="b", below=3.0).evaluate(ENV)  # diffs 3 - v = 2, 1.5, .5
    assert below["check"] == "b < 3.0 (per seed)" and below["values"] == {"b": [1.0, 1.5, 2.5]}
    assert below["stats"]["mean"] == pytest.approx(4.0 / 3) and below["verdict"] == "holds"
    above = Bound("c", "s", value="a", above="flat").evaluate(ENV)   # diffs v - 2 = 1, 2, 3
    assert above["check"] == "a > flat (per seed)" and above["stats"]["mean"] == pytest.approx(2.0)
    assert above["values"] == {"a": [3.0, 4.0, 5.0], "flat": [2.0, 2.0, 2.0]}
    with pytest.raises(ClaimError, match=r"claim 'c': Bound needs exactly one of below= / above="):
        Bound("c", "s", value="a").evaluate(ENV)


# ---------------------------------------------------------------- Within boundaries
def _within(gaps, delta):
    return Within("w", "s", a="g", b=0.0, delta=delta).evaluate({"g": gaps})


def test_within_interval_edges_are_strict():
    # [0,0,0,2]: mean .5, var (3·.25 + 2.25)/3 = 1, se .5 -> interval [-.5, 1.5] exactly; 3/4 inside
    assert _within([0.0, 0.0, 0.0, 2.0], 1.5)["verdict"] == "inconclusive"    # hi == delta
    assert _within([0.0, 0.0, 0.0, 2.0], 1.6)["verdict"] == "holds"
    assert _within([0.0, 0.0, 0.0, -2.0], 1.5)["verdict"] == "inconclusive"   # lo == -delta
    assert _within([0.0, 0.0, 0.0, -2.0], 1.6)["verdict"] == "holds"


def test_within_interval_and_majority_both_needed():
    # [0,0,0,10]: 3/4 inside delta 1, but the interval reaches 7.5
    assert _within([0.0, 0.0, 0.0, 10.0], 1.0)["verdict"] == "inconclusive"
    # 4 of 8 inside (0.2 is not < 0.2) although the interval [.024, .176] is inside
    half = _within([0.0] * 4 + [0.2] * 4, 0.2)
    assert half["verdict"] == "inconclusive" and half["stats"]["inside"] == 0.5


def test_within_fails_only_wholly_outside_with_most_seeds_outside():
    out = _within([0.1, 0.1, 0.1], 0.1)                          # lo == delta, nobody inside: fails
    assert out["verdict"] == "fails" and out["stats"]["inside"] == 0.0
    assert _within([-0.1, -0.1, -0.1], 0.1)["verdict"] == "fails"  # hi == -delta
    assert _within([0.0, 2.0, 2.0, 2.0], 1.0)["verdict"] == "inconclusive"   # 1/4 inside, lo = .5 < 1
    assert _within([-1.0, -1.0, 1.0], 1.0)["verdict"] == "inconclusive"      # hi = 1 is not <= -1
    # 4 of 8 inside, interval wholly below -delta: not a strict majority outside
    assert _within([-2.0] * 4 + [-0.05] * 4, 0.1)["verdict"] == "inconclusive"


def test_within_result_dict_and_few_seeds():
    out = Within("w", "st", a="a", b="b", delta=3.0, refuted_by="r").evaluate(ENV)
    gaps = [2.0, 2.5, 2.5]
    assert out == {"name": "w", "statement": "st", "check": "|a - b| < 3 (per seed)", "holds": True,
                   "verdict": "holds", "values": {"a": [3.0, 4.0, 5.0], "b": [1.0, 1.5, 2.5]},
                   "stats": {**seed_stats(gaps), "inside": 1.0}, "refuted_by": "r"}
    few = Within("w", "st", a="pair", b=0.0, delta=3.0).evaluate(ENV)
    assert few == {"name": "w", "statement": "st", "check": "|pair - 0.0| < 3 (per seed)", "holds": False,
                   "verdict": "inconclusive", "values": {"pair": [1.0, 2.0]}, "stats": {"n": 2.0}, "refuted_by": ""}
    nan = Within("w", "st", a="g", b=0.0, delta=3.0).evaluate({"g": [1.0, math.nan, 2.0]})
    assert nan["verdict"] == "inconclusive" and nan["stats"] == {"n": 3.0}


def test_near_is_within_with_its_own_check_text():
    out = Near("n", "rate near .95", value="r", ref=0.95, tol=0.03, refuted_by="off").evaluate(
        {"r": [0.94, 0.95, 0.96]})
    assert out["name"] == "n" and out["statement"] == "rate near .95" and out["refuted_by"] == "off"
    assert out["check"] == "r within 0.03 of 0.95 (per seed)" and out["verdict"] == "holds"


# ---------------------------------------------------------------- plain claims
def test_claim_values_keep_bools_and_make_numbers_float():
    out = Claim("c", "s", "flag and n > 2", refuted_by="r").evaluate({"flag": True, "n": 3})
    assert out == {"name": "c", "statement": "s", "check": "flag and n > 2", "holds": True, "verdict": "holds",
                   "values": {"flag": True, "n": 3.0}, "refuted_by": "r"}
    assert type(out["values"]["flag"]) is bool and type(out["values"]["n"]) is float


def test_claim_names_in_order_without_functions():
    assert Claim("c", "s", "a.b > 2 * c and abs(d.e) < 1 or a.b < 0").names() == ["a.b", "c", "d.e"]


@pytest.mark.parametrize("check", ["missing > 0", "x + missing > 0", "missing + x > 0", "-missing > 0",
                                   "missing and x", "1 < missing", "abs(missing) > 0", "missing"])
def test_missing_metric_error_names_the_claim_from_every_position(check):
    with pytest.raises(ClaimError, match=r"^claim 'mine': metric 'missing' was not measured$"):
        Claim("mine", "s", check).evaluate({"x": 1.0})


def test_non_number_and_unsupported_expressions_name_the_claim():
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 'm' is not a number \(\[1, 2\]\)$"):
        Claim("c", "s", "m > 0").evaluate({"m": [1, 2]})
    with pytest.raises(ClaimError, match=r"^claim 'c': unsupported expression 'x in y'$"):
        Claim("c", "s", "x in y").evaluate({"x": 1.0, "y": 2.0})
    with pytest.raises(ClaimError, match=r"^claim 'c': unsupported expression 'abs\(x\).real'$"):
        Claim("c", "s", "abs(x).real > 0").evaluate({"x": 1.0})
    with pytest.raises(ClaimError, match=r"^claim 'c': check is not a valid expression"):
        Claim("c", "s", "x >").evaluate({"x": 1.0})
    with pytest.raises(ClaimError, match=r"^claim 'c': check is not a valid expression"):
        Claim("c", "s", "x >").names()


@pytest.mark.parametrize("shape", [lambda **k: Better("c", "s", **k), lambda **k: Within("c", "s", delta=1.0, **k)])
def test_seed_aware_errors_name_the_claim(shape):
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 'nope' was not measured$"):
        shape(a="nope", b="b").evaluate(ENV)
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 'nope' was not measured$"):
        shape(a="a", b="nope").evaluate(ENV)
    with pytest.raises(ClaimError, match=r"^claim 'c': 'pair' has 2 seeds, expected 3 \(paired\)$"):
        shape(a="a", b="pair").evaluate(ENV)
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 's' is not a per-seed list of numbers"):
        shape(a="s", b=0.0).evaluate({"s": ["x", 1.0, 2.0]})
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 's' is not a per-seed list of numbers"):
        shape(a="s", b=0.0).evaluate({"s": {1.0, 2.0, 3.0}})


def test_bound_errors_name_the_claim():
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 'nope' was not measured$"):
        Bound("c", "s", value="nope", below=1.0).evaluate(ENV)
    with pytest.raises(ClaimError, match=r"^claim 'c': metric 'nope' was not measured$"):
        Bound("c", "s", value="a", above="nope").evaluate(ENV)


def test_evaluate_claims_flattens_and_rejects_duplicates():
    out = evaluate_claims([Claim("c", "s", "m.x > 1")], {"m": {"x": 2}})
    assert out[0]["values"] == {"m.x": 2.0}
    with pytest.raises(ClaimError, match=r"^claim 'c': declared twice$"):
        evaluate_claims([Claim("c", "s", "1 > 0"), Claim("c", "t", "1 > 0")], {})
