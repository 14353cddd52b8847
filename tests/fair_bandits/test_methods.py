"""Learners and engine: OMD step vs a direct (numpy) computation, oracle exactness, the rejection loop,
exponent fits without NaN, one batch == separate runs, and the core effect at tiny scale."""
from __future__ import annotations

import math

import numpy as np
import torch

from stages.fair_bandits.methods import OMDEstimator
from stages.fair_bandits.metrics import finite_json, fit_exponent, loglog_slope, round_metrics
from stages.fair_bandits.scm import EXAMPLES, World, load_scm
from stages.fair_bandits.simulate import Instance, draw_contexts, run_group


def test_omd_matches_direct_formulas_with_non_unit_bound():
    S = 0.7
    est = OMDEstimator(2, 4, S, delta=0.05, device="cpu")
    rng = np.random.default_rng(1)
    theta = np.zeros((2, 4))
    H = np.stack([est.lam * np.eye(4)] * 2)
    eta = 1 + S
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    for _ in range(30):
        x = rng.normal(size=(2, 4))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        y = (rng.random(2) < 0.6).astype(float)
        est.update(torch.tensor(x), torch.tensor(y))
        for b in range(2):
            s = sig(x[b] @ theta[b])
            g = (s - y[b]) * x[b]
            M = H[b] / (2 * eta) + 0.5 * s * (1 - s) * np.outer(x[b], x[b])
            th = theta[b] - np.linalg.pinv(M) @ g
            n = np.linalg.norm(th)
            theta[b] = S * th / n if n > S else th
            s2 = sig(x[b] @ theta[b])
            H[b] = H[b] + s2 * (1 - s2) * np.outer(x[b], x[b])
    np.testing.assert_allclose(est.theta.numpy(), theta, atol=1e-10)
    np.testing.assert_allclose(est.Hinv.numpy(), np.linalg.inv(H), atol=1e-10)
    # β_t² = λS² + η log(1/δ) + p(η²+η) log(1 + t/(4λ)), δ per instance
    lam = max(4 * eta, eta * S * 0.25)
    want = math.sqrt(lam * S**2 + eta * math.log(20) + 4 * (eta**2 + eta) * math.log(1 + 0.25 * 7 / lam))
    assert abs(est.beta(7) - want) < 1e-12
    est2 = OMDEstimator(2, 4, S, delta=torch.tensor([0.05, 0.01], dtype=torch.float64), device="cpu")
    b = est2.beta_all(7)
    assert abs(float(b[0]) - want) < 1e-12 and float(b[1]) > float(b[0])


def test_oracle_has_zero_regret_and_violation_in_every_world():
    for name in ("binding", "boundary", "official_quirk"):
        world = World(load_scm(EXAMPLES / f"{name}.json"))
        T = 120
        ctxs = {(name, s): draw_contexts(world, s, T) for s in (0, 1)}
        out = run_group({name: world}, [Instance(name, "oracle", T, s) for s in (0, 1)], ctxs)
        ctx = torch.as_tensor(np.stack([ctxs[(name, s)] for s in (0, 1)]))
        m = round_metrics(world, torch.full((2,), world.tau, dtype=torch.float64), ctx, out["act"])
        assert float(m["regret"].abs().max()) == 0.0 and float(m["violation"].max()) == 0.0, name


def test_contexts_follow_the_rejection_loop():
    world = World(load_scm(EXAMPLES / "official_quirk.json"))
    c = draw_contexts(world, 0, 401)
    assert set(np.unique(c)) == {4, 5, 6, 7}                   # a = -1 has no fair arm: redrawn
    assert all(sorted(c[i:i + 4]) == [4, 5, 6, 7] for i in range(0, 400, 4))  # shuffled blocks
    b = World(load_scm(EXAMPLES / "binding.json"))
    cb = draw_contexts(b, 0, 20000)                            # i.i.d. from the SCM, every context kept
    freq = np.bincount(cb, minlength=8) / len(cb)
    assert np.abs(freq - b.p_context.numpy()).max() < 0.01


def test_exponents_are_defined_or_null_with_a_reason():
    t = np.array([10, 20, 40, 80, 160])
    assert abs(loglog_slope(t, 3 * t**0.5, 10) - 0.5) < 1e-9
    assert fit_exponent(t, np.zeros(5)) == (0.0, "identically 0 (nothing accumulated): exponent 0")
    v, why = fit_exponent(t, np.array([1.0, -1, 2, 3, 4]))
    assert v is None and "not positive" in why
    assert finite_json({"a": [1.0, float("nan"), float("inf")], "b": {"c": -float("inf")}}) == \
        {"a": [1.0, None, None], "b": {"c": None}}


def test_one_batch_equals_separate_runs():
    """Worlds of one group (τ, fairness mode differ), several methods and horizons in ONE batch: every
    instance acts exactly as when run alone (its own horizon's δ and exploration length)."""
    worlds = {n: World(load_scm(EXAMPLES / f"{n}.json")) for n in ("binding", "boundary")}
    ctxs = {(n, s): draw_contexts(worlds[n], s, 90) for n in worlds for s in (3, 4)}
    inst = [Instance("binding", "dologb", 90, 3), Instance("boundary", "primal_dual", 90, 4),
            Instance("binding", "ucb", 50, 4), Instance("boundary", "dologb_scaled", 70, 3),
            Instance("binding", "oracle", 90, 3)]
    both = run_group(worlds, inst, ctxs, beta_scale=0.05)
    for b, i in enumerate(inst):
        alone = run_group({i.world: worlds[i.world]}, [i], ctxs, beta_scale=0.05)
        assert torch.equal(alone["act"][0, :i.horizon], both["act"][b, :i.horizon]), i


def test_core_effect_constraint_binds_and_reduces_violation_at_tiny_scale():
    """In the binding world a learner whose feasibility test can bind (a small radius, β × 0.02)
    excludes the unfair arms and violates far less than unconstrained UCB; at the official radius and
    this horizon the test cannot bind yet (DO-LogB == UCB)."""
    world = World(load_scm(EXAMPLES / "binding.json"))
    T, seeds = 700, [0, 1, 2]
    ctxs = {("binding", s): draw_contexts(world, s, T) for s in seeds}
    inst = [Instance("binding", m, T, s) for m in ("dologb_scaled", "ucb", "dologb") for s in seeds]
    out = run_group({"binding": world}, inst, ctxs, beta_scale=0.02)
    ctx = torch.as_tensor(np.stack([ctxs[("binding", s)] for s in seeds] * 3))
    v = round_metrics(world, torch.full((9,), world.tau, dtype=torch.float64), ctx, out["act"])["violation"].sum(1)
    assert float(v[:3].sum()) < 0.5 * float(v[3:6].sum()), v
    assert int(out["excluded"][:3].sum()) > 100
    assert torch.equal(out["act"][6:], out["act"][3:6]) and int(out["excluded"][6:].sum()) == 0
