"""SCM compilation and parsing against independent brute force (plain Python loops over the
8 contexts, numpy features): every World tensor, the strict fairness boundary, the comparator,
and the one-line error messages the format documents."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from stages.fair_bandits.scm import EXAMPLES, SCMError, World, effects_from_mu, feature_map, load_scm, parse_scm

# a world with nothing symmetric: protected values (-0.7, 1.3), unequal P(a), identity features
ODD = {
    "format": "fair_bandits.scm/v1", "name": "odd", "variables": {"A": "protected", "Z": "confounder",
                                                                  "W": "mediator", "D": "decision"},
    "protected_values": [-0.7, 1.3], "p_protected": [0.3, 0.7], "p_confounder": [0.2, 0.65],
    "p_mediator": [[0.1, 0.45], [0.55, 0.9]], "arms": [[-0.9, 0.3], [0.4, -0.5], [0.8, 0.6]],
    "theta_star": [0.5, -0.3, 0.2, 0.7, -0.4], "norm_bound": 1.5, "tau": 0.13,
}


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _feat(a, z, w, d, kind):
    v = np.array([a, z, w, *d], dtype=float)
    return v / np.linalg.norm(v) if kind == "normalize" else v


def _brute(spec: dict):
    """Every compiled quantity from the format's definitions, by loops."""
    a_vals = spec["protected_values"]
    kind = spec.get("feature_map", "normalize")
    cf_mode = spec.get("counterfactual_feature", "other")
    th = np.array(spec["theta_star"])
    pz1, pw1, pa = spec["p_confounder"], spec["p_mediator"], spec.get("p_protected", [0.5, 0.5])

    def pz(ia, z):
        return pz1[ia] if z else 1 - pz1[ia]

    def pw(ia, z, w):
        return pw1[ia][z] if w else 1 - pw1[ia][z]

    def mu(a, z, w, d):
        return _sig(float(_feat(a, z, w, d, kind) @ th))

    K = len(spec["arms"])
    p_ctx = np.zeros(8)
    mu_play = np.zeros((8, K))
    for c, (ia, z, w) in enumerate(itertools.product((0, 1), (0, 1), (0, 1))):
        p_ctx[c] = pa[ia] * pz(ia, z) * pw(ia, z, w)
        for k, d in enumerate(spec["arms"]):
            mu_play[c, k] = mu(a_vals[ia], z, w, d)
    eff = np.zeros((2, 3, K))
    for ia in (0, 1):
        alt = 1 - ia
        a_ctf = (1 - a_vals[ia]) if cf_mode == "one_minus_a" else a_vals[alt]
        for k, d in enumerate(spec["arms"]):
            de = ie = se = 0.0
            for z, w in itertools.product((0, 1), (0, 1)):
                if spec.get("effect_cells") == "official_quirk" and (z, w) != (0, 0):
                    continue                      # the official code's exact-float cell match: only (0, 0)
                m1, m0 = mu(a_ctf, z, w, d), mu(a_vals[ia], z, w, d)
                de += (m1 - m0) * pw(ia, z, w) * pz(ia, z)
                ie += m1 * (pw(ia, z, w) - pw(alt, z, w)) * pz(ia, z)
                se += m1 * pw(alt, z, w) * (pz(ia, z) - pz(alt, z))
            eff[ia, :, k] = (de, ie, se)
    return p_ctx, mu_play, eff


@pytest.mark.parametrize("spec", [
    ODD,
    {**ODD, "feature_map": "normalize"},
    {**ODD, "feature_map": "normalize", "counterfactual_feature": "one_minus_a"},
    json.loads((EXAMPLES / "official.json").read_text()),
    json.loads((EXAMPLES / "binding.json").read_text()),
    json.loads((EXAMPLES / "official_quirk.json").read_text()),
    {**ODD, "effect_cells": "official_quirk"},
], ids=["identity", "normalize", "one_minus_a", "official", "binding", "official_quirk", "odd_quirk"])
def test_world_tensors_match_brute_force(spec):
    spec = {"feature_map": "identity", **spec}
    w = World(parse_scm(spec))
    p_ctx, mu_play, eff = _brute(spec)
    K, m = len(spec["arms"]), len(spec["arms"][0])
    assert (w.K, w.m, w.p) == (K, m, 3 + m)
    assert w.tau == spec["tau"] and w.S == spec.get("norm_bound", 1.0)
    assert w.x_play.dtype == torch.float64 and w.x_play.shape == (8, K, 3 + m)
    np.testing.assert_allclose(w.p_context.numpy(), p_ctx, rtol=0, atol=1e-15)
    assert abs(float(w.p_context.sum()) - 1.0) < 1e-12
    np.testing.assert_allclose(w.mu.numpy(), mu_play, rtol=0, atol=1e-14)
    np.testing.assert_allclose(w.effects.numpy(), eff, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(w.theta_star.numpy(), np.array(spec["theta_star"]))


def test_features_per_cell_and_counterfactual_value():
    spec = {**ODD, "feature_map": "normalize", "counterfactual_feature": "one_minus_a"}
    w = World(parse_scm(spec))
    d = spec["arms"][2]
    # context c = 4·ia + 2·z + w; cell index of (z, w) is 2z + w
    np.testing.assert_allclose(w.x_play[4 * 1 + 2 * 0 + 1, 2].numpy(), _feat(1.3, 0, 1, d, "normalize"), atol=1e-15)
    np.testing.assert_allclose(w.f_fac[0, 2, 2].numpy(), _feat(-0.7, 1, 0, d, "normalize"), atol=1e-15)
    np.testing.assert_allclose(w.f_ctf[0, 2, 2].numpy(), _feat(1.7, 1, 0, d, "normalize"), atol=1e-15)  # 1 − a
    np.testing.assert_allclose(w.f_ctf[1, 3, 2].numpy(), _feat(-0.3, 1, 1, d, "normalize"), atol=1e-15)
    w2 = World(parse_scm({**spec, "counterfactual_feature": "other"}))
    np.testing.assert_allclose(w2.f_ctf[0, 2, 2].numpy(), _feat(1.3, 1, 0, d, "normalize"), atol=1e-15)  # a*
    # probabilities of the factual and the other protected value, cell order (z, w) = 00, 01, 10, 11
    np.testing.assert_allclose(w.p_zw_fac.numpy(), [[0.8, 0.8, 0.2, 0.2], [0.35, 0.35, 0.65, 0.65]], atol=1e-15)
    np.testing.assert_allclose(w.p_w_fac.numpy(), [[0.9, 0.1, 0.55, 0.45], [0.45, 0.55, 0.1, 0.9]], atol=1e-15)
    np.testing.assert_allclose(w.p_zw_alt.numpy(), w.p_zw_fac.numpy()[::-1], atol=0)
    np.testing.assert_allclose(w.p_w_alt.numpy(), w.p_w_fac.numpy()[::-1], atol=0)


def test_feature_map_kinds():
    v = torch.tensor([[3.0, 4.0], [0.0, -2.0]], dtype=torch.float64)
    np.testing.assert_allclose(feature_map(v, "normalize").numpy(), [[0.6, 0.8], [0.0, -1.0]])
    assert feature_map(v, "identity") is v


def test_effects_with_a_index_select_rows():
    w = World(parse_scm({**ODD, "feature_map": "normalize"}))
    mf = torch.sigmoid(w.f_fac @ w.theta_star)
    mc = torch.sigmoid(w.f_ctf @ w.theta_star)
    idx = torch.tensor([1, 0, 1])
    got = effects_from_mu(mf[idx], mc[idx], w, a_idx=idx)
    np.testing.assert_allclose(got.numpy(), w.effects[idx].numpy(), atol=1e-15)


def test_fairness_is_strict_and_comparator_matches_brute_force():
    w = World(parse_scm({**ODD, "feature_map": "normalize"}))
    worst = w.effects.abs().amax(1)                        # (2, K) max |effect|
    t_exact = float(worst[0, 1])                            # τ equal to an arm's worst effect: not fair
    taus = torch.tensor([0.0, t_exact, math.nextafter(t_exact, 1.0), 0.05, 0.13, 10.0], dtype=torch.float64)
    feas = w.feasible(taus)
    comp, has = w.comparator(taus)
    for i, tau in enumerate(taus.tolist()):
        for ia in (0, 1):
            for k in range(w.K):
                expect = all(abs(float(w.effects[ia, e, k])) < tau for e in range(3))
                assert bool(feas[i, ia, k]) == expect, (tau, ia, k)
        for c in range(8):
            ia = c // 4
            fair = [k for k in range(w.K) if bool(feas[i, ia, k])]
            assert bool(has[i, c]) == bool(fair)
            if fair:
                expect = max(fair, key=lambda k: float(w.mu[c, k]))
            else:
                lo = min(float(worst[ia, k]) for k in range(w.K))
                expect = max((k for k in range(w.K) if float(worst[ia, k]) == lo), key=lambda k: float(w.mu[c, k]))
            assert int(comp[i, c]) == expect, (tau, c)
    assert not bool(feas[1, 0, 1]) and bool(feas[2, 0, 1])   # the boundary itself is excluded
    assert not has[0].any() and has[-1].all()


def test_least_unfair_ties_go_to_higher_reward():
    # two arms with the same |effects| (mirror images under d -> -d with θ_d = 0): equal worst effect
    spec = {**ODD, "arms": [[0.5, 0.3], [0.5, -0.3], [0.9, 0.9]], "theta_star": [0.5, -0.3, 0.2, 0.7, 0.0],
            "tau": 0.0}
    w = World(parse_scm(spec))
    worst = w.effects.abs().amax(1)
    assert torch.equal(worst[:, 0], worst[:, 1])
    comp, has = w.comparator(torch.tensor([0.0], dtype=torch.float64))
    assert not has.any()
    for c in range(8):
        lo = worst[c // 4].min()
        cands = [k for k in range(3) if worst[c // 4, k] == lo]
        assert int(comp[0, c]) == max(cands, key=lambda k: float(w.mu[c, k]))


# ---- parsing: the one-line messages the format promises ------------------------------------------------

@pytest.mark.parametrize("patch,drop,expected", [
    ({"extra": 1}, None, "x.json: extra: unknown key (see stages/fair_bandits/scm.py for the format)"),
    ({}, "p_confounder", "x.json: p_confounder: required key is missing"),
    ({"tau": float("nan")}, None, "x.json: tau: must be a finite number"),
    ({"feature_map": "cube"}, None, "x.json: feature_map: must be 'normalize' or 'identity'"),
    ({"name": "bad name"}, None, "x.json: name: must match [A-Za-z0-9_.-]+ (got 'bad name')"),
    ({"protected_values": [1, 1]}, None, "x.json: protected_values: the two values must differ (got [1.0, 1.0])"),
    ({"p_mediator": [[0.1, 0.2, 0.3], [0.5, 0.5]]}, None,
     "x.json: p_mediator: row 0: expected [P(W=1|a,Z=0), P(W=1|a,Z=1)] (2 entries, got 3)"),
    ({"p_mediator": [[0.1, 0.2], [0.5, 1.5]]}, None, "x.json: p_mediator: [1][1] = 1.5 is not a probability in [0, 1]"),
    ({"p_confounder": [0.2, -0.5]}, None, "x.json: p_confounder: entry 1 = -0.5 is not a probability in [0, 1]"),
    ({"p_protected": [1.2, -0.2]}, None, "x.json: p_protected: entry 0 = 1.2 is not a probability in [0, 1]"),
    ({"theta_star": [0.6, 0.6, 0.6, 0.6]}, None, "x.json: theta_star: norm 1.2 exceeds norm_bound 1.0"),
    ({"resample_infeasible": 1}, None, "x.json: resample_infeasible: Input should be a valid boolean"),
])
def test_error_messages_exact(patch, drop, expected):
    data = {**json.loads((EXAMPLES / "binding.json").read_text()), **patch}
    if drop:
        data.pop(drop)
    with pytest.raises(SCMError) as err:
        parse_scm(data, "x.json")
    assert str(err.value) == expected


def test_parse_scm_envelope():
    with pytest.raises(SCMError) as err:
        parse_scm([1, 2])
    assert str(err.value) == "SCM: expected a JSON object (the fair_bandits.scm/v1 format)"
    with pytest.raises(SCMError) as err:
        parse_scm({"format": "fair_bandits.scm/v2"}, "f.json")
    assert str(err.value) == "f.json: format: must be 'fair_bandits.scm/v1' (got 'fair_bandits.scm/v2')"
    # JSON integers are numbers for float fields (nested too); strings and booleans are not coerced
    data = {**json.loads((EXAMPLES / "binding.json").read_text()), "tau": 0, "protected_values": [-2, 3],
            "arms": [[-1], [2]], "norm_bound": 2}
    scm = parse_scm(data)
    assert scm.tau == 0.0 and isinstance(scm.tau, float) and scm.protected_values == [-2.0, 3.0]
    assert scm.arms == [[-1.0], [2.0]] and all(isinstance(x, float) for x in scm.arms[1])
    with pytest.raises(SCMError, match=r"^SCM: name: Input should be a valid string$"):
        parse_scm({**data, "name": 7})
    with pytest.raises(SCMError, match=r"^SCM: tau: Input should be a valid number$"):
        parse_scm({**data, "tau": True})


def test_load_scm_file_errors(tmp_path):
    with pytest.raises(SCMError) as err:
        load_scm(tmp_path)
    assert str(err.value) == f"{tmp_path}: is a directory, expected an SCM JSON file"
    p = tmp_path / "latin1.json"
    p.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(SCMError) as err:
        load_scm(p)
    assert str(err.value) == f"{p}: not UTF-8 text"
    p = tmp_path / "inf.json"
    p.write_text('{"format": "fair_bandits.scm/v1", "tau": -Infinity}')
    with pytest.raises(SCMError) as err:
        load_scm(p)
    assert str(err.value) == f"{p}: -Infinity is not a finite number (JSON allows none)"
    p = tmp_path / "ok.json"
    p.write_text((EXAMPLES / "binding.json").read_text())
    assert load_scm(str(p)).name == "binding"  # a str path works too


def test_boundary_mode_has_no_slater_point():
    """tau_mode boundary: τ is the least-unfair arm's max|effect| at the boundary protected value, that arm
    is fair (|effect| <= τ) and no arm there is strictly inside (every arm has some |effect| >= τ)."""
    for ia in (0, 1):
        w = World(parse_scm({**ODD, "feature_map": "normalize", "tau_mode": "boundary", "boundary_protected": ia}))
        worst = w.effects.abs().amax(1)
        assert w.tau == float(worst[ia].min()) and w.boundary_arm == int(worst[ia].argmin())
        feas = w.feasible(torch.tensor([w.tau], dtype=torch.float64))[0]
        assert bool(feas[ia, w.boundary_arm]) and int(feas[ia].sum()) == int((worst[ia] == worst[ia].min()).sum())
        assert not ((w.effects[ia].abs() < w.tau).all(0)).any()                  # no strictly feasible arm
    b = World(load_scm(EXAMPLES / "boundary.json"))
    assert b.tau == float(b.effects[0].abs().amax(0).min()) and b.tau < 0.06


def test_quirk_keeps_only_the_first_cell_and_binds_for_a_plus():
    q = World(load_scm(EXAMPLES / "official_quirk.json"))
    fair = q.feasible(torch.tensor([q.tau], dtype=torch.float64))[0]
    assert fair[1].tolist() == [True] * 5 + [False] * 5 and not fair[0].any()    # arms 0-4 fair for a = +1
    se = q.effects[1, 2].abs()
    assert torch.allclose(se[:5], torch.full((5,), 0.156, dtype=torch.float64), atol=6e-4)
    assert torch.allclose(se[5:], torch.full((5,), 0.317, dtype=torch.float64), atol=6e-4)


def test_bounded_numbers_depth_and_size(tmp_path):
    with pytest.raises(SCMError) as err:
        parse_scm({**ODD, "arms": [[1e308, 0.3], [0.4, -0.5], [0.8, 0.6]]}, "x.json")
    assert str(err.value).startswith("x.json: arms: [0][0] = 1e+308 exceeds 1e+06 in magnitude")
    with pytest.raises(SCMError, match=r"protected_values: entry 1 = -1e\+300 exceeds"):
        parse_scm({**ODD, "protected_values": [1.0, -1e300]}, "x.json")
    p = tmp_path / "deep.json"
    p.write_text('{"a": ' + "[" * 50 + "]" * 50 + "}")
    with pytest.raises(SCMError, match="nesting depth 51 exceeds 8"):
        load_scm(p)
    p.write_text('{"description": "[[[[[[[[[[[[[[[[[[[[", "x": [[1]]}')              # brackets inside strings
    from stages.common.paths import json_text_depth
    assert json_text_depth(p.read_text()) == 3
    p.write_text('{"horizon": ' + "9" * 5000 + "}")                                 # past int()'s digit limit
    with pytest.raises(SCMError, match=r"deep\.json: not valid JSON \(Exceeds the limit"):
        load_scm(p)
    p.write_text(" " * 1_000_001)
    with pytest.raises(SCMError, match="byte limit"):
        load_scm(p)
