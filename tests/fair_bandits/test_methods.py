"""Learners: OMD step vs a direct (numpy) computation, oracle exactness, tabular widths, core effect."""
from __future__ import annotations

import math

import numpy as np
import torch

from stages.fair_bandits.methods import OMDEstimator
from stages.fair_bandits.metrics import loglog_slope, round_metrics
from stages.fair_bandits.scm import EXAMPLES, World, load_scm
from stages.fair_bandits.simulate import draw_contexts, run_method


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
    # β_t² = λS² + η log(1/δ) + p(η²+η) log(1 + t/(4λ))
    lam = max(4 * eta, eta * S * 0.25)
    want = math.sqrt(lam * S**2 + eta * math.log(20) + 4 * (eta**2 + eta) * math.log(1 + 0.25 * 7 / lam))
    assert abs(est.beta(7) - want) < 1e-12


def test_oracle_has_zero_regret_and_violation():
    world = World(load_scm(EXAMPLES / "binding.json"))
    T = 120
    log = run_method("oracle", world, [world.tau], [0, 1], T)
    m = round_metrics(world, torch.full((2,), world.tau, dtype=torch.float64), log["ctx"], log["act"])
    assert float(m["regret"].abs().max()) == 0.0 and float(m["violation"].max()) == 0.0


def test_contexts_follow_the_rejection_loop():
    world = World(load_scm(EXAMPLES / "official.json"))
    c = draw_contexts(world, 0.157, 0, 0, 401)
    assert set(np.unique(c)) == {4, 5, 6, 7}                   # a = -1 has no fair arm: redrawn
    assert all(sorted(c[i:i + 4]) == [4, 5, 6, 7] for i in range(0, 400, 4))  # shuffled blocks
    assert set(np.unique(draw_contexts(world, 0.0, 0, 1, 64))) == set(range(8))  # τ = 0: nothing to redraw


def test_slopes():
    t = np.array([10, 20, 40, 80, 160])
    assert abs(loglog_slope(t, 3 * t**0.5, 10) - 0.5) < 1e-9
    assert loglog_slope(t, np.zeros(5), 10) == 0.0
    assert math.isnan(loglog_slope(t, np.array([1.0, -1, 2, 3, 4]), 10))


def test_core_effect_constraint_reduces_violation_at_tiny_scale():
    """A learner that respects the optimistic feasible set (small radius) violates far less than
    unconstrained UCB in the binding world; the two coincide if the feasibility test is removed."""
    world = World(load_scm(EXAMPLES / "binding.json"))
    T, seeds = 900, [0, 1, 2]
    tau = torch.full((3,), world.tau, dtype=torch.float64)
    from stages.fair_bandits.simulate import run_methods

    logs = run_methods(["dologb_scaled", "ucb"], world, [world.tau], seeds, T, beta_scale=0.02)  # one shared batch
    viol = {m: float(round_metrics(world, tau, log["ctx"], log["act"])["violation"].sum()) for m, log in logs.items()}
    assert viol["dologb_scaled"] < 0.85 * viol["ucb"], viol


def test_shared_batch_equals_separate_runs():
    """The logistic methods share one batch; every instance must behave exactly as when run alone."""
    from stages.fair_bandits.simulate import run_methods

    world = World(load_scm(EXAMPLES / "binding.json"))
    both = run_methods(["dologb", "primal_dual", "ucb"], world, [world.tau, 0.0], [3, 4], 60)
    for m in ("dologb", "primal_dual"):
        alone = run_method(m, world, [world.tau, 0.0], [3, 4], 60)
        assert torch.equal(alone["act"], both[m]["act"])  # batched matmuls may differ in the last ulp:
        torch.testing.assert_close(alone["lam"], both[m]["lam"], atol=1e-9, rtol=0)
