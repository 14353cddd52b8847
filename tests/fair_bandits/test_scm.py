"""SCM format: examples load, exact effects vs Monte-Carlo counterfactual simulation, bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from stages.fair_bandits.scm import EXAMPLES, SCMError, World, load_scm, parse_scm


def _mc_effects(world: World, ia: int, k: int, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Counterfactual simulation of the fairness model: shared exogenous noise per unit."""
    scm = world.scm
    a, alt = ia, 1 - ia
    cf_val = (1 - scm.protected_values[ia]) if scm.counterfactual_feature == "one_minus_a" else scm.protected_values[alt]
    theta = np.asarray(scm.theta_star)
    d = np.asarray(scm.arms[k])

    def mu(aval, z, w):
        v = np.concatenate([np.stack([np.full(len(z), aval), z, w], 1), np.tile(d, (len(z), 1))], 1)
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        return 1 / (1 + np.exp(-v @ theta))

    pz = np.asarray(scm.p_confounder)
    pw = np.asarray(scm.p_mediator)
    uz, uw, uy = rng.random(n), rng.random(n), rng.random(n)   # exogenous U_Z, U_W, U_Y
    z_a = (uz < pz[a]).astype(float)                           # Z_a
    z_alt = (uz < pz[alt]).astype(float)                       # Z_{a*}
    w_a = (uw < pw[a][z_a.astype(int)]).astype(float)          # W_a(Z_a)
    w_alt_za = (uw < pw[alt][z_a.astype(int)]).astype(float)   # W_{a*}(Z_a)
    w_alt = (uw < pw[alt][z_alt.astype(int)]).astype(float)    # W_{a*}(Z_{a*})
    y = lambda aval, z, w: (uy < mu(aval, z, w)).astype(float)  # noqa: E731
    de = y(cf_val, z_a, w_a) - y(scm.protected_values[a], z_a, w_a)
    ie = y(cf_val, z_a, w_a) - y(cf_val, z_a, w_alt_za)
    se = y(cf_val, z_a, w_alt_za) - y(cf_val, z_alt, w_alt)
    stack = np.stack([de, ie, se])
    return stack.mean(1), stack.std(1) / np.sqrt(n)


@pytest.mark.parametrize("name", ["official.json", "binding.json"])
def test_exact_effects_match_monte_carlo_counterfactuals(name):
    world = World(load_scm(EXAMPLES / name))
    rng = np.random.default_rng(0)
    for ia in (0, 1):
        for k in (0, world.K - 1):
            est, se = _mc_effects(world, ia, k, 200_000, rng)
            exact = world.effects[ia, :, k].numpy()
            assert np.all(np.abs(est - exact) < 4.5 * se + 1e-4), (ia, k, est, exact, se)


def test_official_world_numbers():
    world = World(load_scm(EXAMPLES / "official.json"))
    # a = -1, d = 1: factual feature [-1,0,0,1]/√2 gives θ*ᵀf = 0 -> μ = 1/2
    assert abs(float(world.mu[0, -1]) - 0.5) < 1e-12
    fair = world.feasible(torch.tensor([0.157], dtype=torch.float64))[0]
    assert not fair[0].any() and fair[1].all()  # the constraint binds only where no arm is fair


def _base():
    return json.loads((EXAMPLES / "binding.json").read_text())


@pytest.mark.parametrize("patch,words", [
    ({"p_confounder": [0.2, 1.3]}, ["p_confounder", "probability"]),
    ({"p_mediator": [[0.1, -0.2], [0.5, 0.5]]}, ["p_mediator", "probability"]),
    ({"p_protected": [0.0, 1.0]}, ["p_protected", "zero mass"]),
    ({"p_protected": [0.3, 0.3]}, ["p_protected", "sum to 1"]),
    ({"tau": -0.1}, ["tau"]),
    ({"variables": {"A": "protected", "Z": "confounder", "D": "decision"}}, ["variables", "exactly one"]),
    ({"variables": {"A": "protected", "B": "protected", "W": "mediator", "D": "decision"}}, ["variables"]),
    ({"theta_star": [0.1, 0.2, 0.1, 0.2, 0.1]}, ["theta_star", "entries"]),
    ({"theta_star": [1.0, 1.0, 0.0, 0.0]}, ["theta_star", "norm"]),
    ({"arms": [[0.1], [0.1]]}, ["arms[1]", "duplicates"]),
    ({"arms": [[0.1], [0.2, 0.3]]}, ["arms[1]"]),
    ({"extra": 1}, ["extra", "unknown key"]),
    ({"format": "v0"}, ["format"]),
    ({"counterfactual_feature": "mirror"}, ["counterfactual_feature"]),
    ({"protected_values": [0.0, 1.0], "arms": [[0.0], [0.5]]}, ["arms[0]", "zero vector"]),
])
def test_bad_scm_one_line_errors(patch, words):
    data = {**_base(), **patch}
    with pytest.raises(SCMError) as err:
        parse_scm(data, "x.json")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("x.json")
    for w in words:
        assert w in msg, msg


def test_defaults_are_documented_values():
    data = _base()
    for key in ("p_protected", "protected_values", "norm_bound", "feature_map", "counterfactual_feature",
                "context_sampling", "resample_infeasible", "tau", "description"):
        data.pop(key)
    scm = parse_scm(data)
    assert scm.p_protected == [0.5, 0.5] and scm.protected_values == [-1.0, 1.0] and scm.tau == 0.157
    assert scm.feature_map == "normalize" and scm.counterfactual_feature == "other"
    assert scm.context_sampling == "balanced_blocks" and scm.resample_infeasible is True


def test_bad_json_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"format": "fair_bandits.scm/v1",\n "tau": NaN}')
    with pytest.raises(SCMError, match="finite"):
        load_scm(p)
    p.write_text('{"format": ')
    with pytest.raises(SCMError, match=r"bad.json:1:\d+"):
        load_scm(p)
    with pytest.raises(SCMError, match="not found"):
        load_scm(tmp_path / "missing.json")
