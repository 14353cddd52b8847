"""Method properties: exact test error, CV estimators, the Monte-Carlo r(h_n) on known cases, model fits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import Lasso

from stages.cv_stability.cv_inference import ci_covers, cv_estimates, kfold_target, out_of_fold_losses
from stages.cv_stability.models import Penalties, fit_models
from stages.cv_stability.simulate import conditional_test_error, draw_points, fold_bounds
from stages.cv_stability.stability import (contrast_parts, loss_stability_draws, pair_loss_cov,
                                           relative_stability, sigma2_ustat, simulate_replace_one)
from stages.cv_stability.train import fold_statistics

BETA = torch.tensor([3.0, 1.0, -5.0, 3.0, 0.0, 0.0], dtype=torch.float64)


def test_conditional_test_error_is_exact():
    rng = np.random.default_rng(0)
    beta_hat = BETA + torch.from_numpy(rng.normal(0, 0.3, BETA.shape))
    x, y = draw_points(rng, (400_000,), BETA, noise_sd=1.5)
    losses = (y - x @ beta_hat) ** 2
    exact = float(conditional_test_error(beta_hat, BETA, 1.5))
    assert abs(float(losses.mean()) - exact) < 4 * float(losses.std()) / math.sqrt(len(losses))


def quad_loss(c, a, s, x, eps):
    """h(Z) = c ε² − 2 ε xᵀa + xᵀ S x on explicit test points."""
    return c * eps**2 - 2 * eps * (x @ a) + torch.einsum("ti,ij,tj->t", x, s, x)


@pytest.mark.parametrize("single", [True, False])
def test_contrast_quadratic_form_matches_losses(single):
    """The (c, a, S) decomposition reproduces the point-wise loss (difference)."""
    rng = np.random.default_rng(1)
    ua, ub = (torch.from_numpy(rng.normal(0, 0.2, BETA.shape)) for _ in range(2))
    x, y = draw_points(rng, (1000,), BETA, 1.0)
    la, lb = (y - x @ (BETA + ua)) ** 2, (y - x @ (BETA + ub)) ** 2
    c, a, s = contrast_parts(ua, None if single else ub)
    torch.testing.assert_close(quad_loss(c, a, s, x, y - x @ BETA), la if single else la - lb)


def test_pair_loss_covariance_against_brute_force():
    """Cov_Z(h(Z,D1), h(Z,D2)) = 2c²σ⁴ + 4σ² a1ᵀa2 + 2tr(S1 S2), checked on 400k explicit test points."""
    rng = np.random.default_rng(2)
    sd = 1.3
    us = [torch.from_numpy(rng.normal(0, 0.4, BETA.shape)) for _ in range(4)]
    x, y = draw_points(rng, (400_000,), BETA, sd)
    eps = y - x @ BETA
    for c_single in (True, False):
        c, a1, s1 = contrast_parts(us[0], None if c_single else us[1])
        _, a2, s2 = contrast_parts(us[2], None if c_single else us[3])
        h1, h2 = quad_loss(c, a1, s1, x, eps), quad_loss(c, a2, s2, x, eps)
        emp = float(((h1 - h1.mean()) * (h2 - h2.mean())).mean())
        exact = float(pair_loss_cov(c, a1, s1, a2, s2, sd))
        assert abs(emp - exact) < 0.03 * abs(exact) + 1e-3, (c_single, emp, exact)


def test_loss_stability_term_against_brute_force():
    """Per draw, E_Z0[(h'(Z0,D) − h'(Z0,D'))²] with h' centred by the exact conditional mean."""
    rng = np.random.default_rng(3)
    ua, ub, ua2, ub2 = (torch.from_numpy(rng.normal(0, 0.3, BETA.shape)) for _ in range(4))
    c, a, s = contrast_parts(ua, ub)
    _, a_r, s_r = contrast_parts(ua2, ub2)
    x, y = draw_points(rng, (400_000,), BETA, 1.0)
    eps = y - x @ BETA
    centred = lambda a_, s_: quad_loss(c, a_, s_, x, eps) - (c + torch.trace(s_))  # E_Z h = cσ² + tr S
    emp = float(((centred(a, s) - centred(a_r, s_r)) ** 2).mean())
    exact = float(loss_stability_draws(a[None], s[None], a_r[None], s_r[None], 1.0)[0])
    assert abs(emp - exact) < 0.03 * exact


def test_sigma2_ustat_exact_when_training_sets_agree():
    u = torch.tensor([0.3, -0.2, 0.0, 0.1, 0.0, 0.05], dtype=torch.float64)
    c, a, s = contrast_parts(u, None)
    a_b, s_b = a.expand(7, -1), s.expand(7, -1, -1)
    exact = pair_loss_cov(c, a, s, a, s, 0.8)
    torch.testing.assert_close(sigma2_ustat(c, a_b, s_b, 0.8), exact)


def test_oracle_model_has_zero_relative_stability():
    """Known answer: a 'model' that always returns β* has γ = 0 and σ² = Var(ε²) = 2σ⁴, so r = 0."""
    B, sd = 50, 1.7
    u = torch.zeros(B, BETA.shape[0], dtype=torch.float64)
    c, a, s = contrast_parts(u, None)
    res = relative_stability(c, a, s, a.clone(), s.clone(), sd, n=100, groups=5)
    assert res["gamma"] == 0.0 and res["r"] == 0.0
    assert res["sigma2"] == pytest.approx(2 * sd**4)


def mc_r(model: str, n: int, k: int, B: int, seed: int) -> float:
    """Monte-Carlo r(h_n) of one single model through the same functions as the evaluate stage."""
    m = n - n // k
    rngs = [np.random.default_rng([seed, b]) for b in range(B)]
    gram, xty, gram_r, xty_r = simulate_replace_one(rngs, m, BETA, 1.0)
    coefs, _ = fit_models(torch.cat([gram, gram_r]), torch.cat([xty, xty_r]), float(m),
                          Penalties(1.0, 2.0, 1.0).at(n), 1e-10, 10_000, "torch")
    c, a, s = contrast_parts(coefs[model] - BETA, None)
    return relative_stability(c, a[:B], s[:B], a[B:], s[B:], 1.0, n)["r"]


def test_single_stable_model_r_goes_to_zero():
    """OLS is stable: r(h_n) ~ C/n, so a 16x larger n must shrink r̂ by far more than 4x."""
    r_small, r_large = mc_r("ols", 100, 10, 400, seed=0), mc_r("ols", 1600, 10, 400, seed=1)
    assert r_small > 0
    assert r_large / r_small < 0.15, (r_small, r_large)


def test_replace_one_changes_exactly_one_point():
    rngs = [np.random.default_rng([7, b]) for b in range(3)]
    gram, xty, gram_r, xty_r = simulate_replace_one(rngs, 25, BETA, 1.0)
    rng = np.random.default_rng([7, 1])  # regenerate draw 1 explicitly
    (x, y), (x_new, y_new) = draw_points(rng, (25,), BETA, 1.0), draw_points(rng, (1,), BETA, 1.0)
    torch.testing.assert_close(gram[1], x.T @ x)
    x_rep, y_rep = torch.cat([x_new, x[1:]]), torch.cat([y_new, y[1:]])
    torch.testing.assert_close(gram_r[1], x_rep.T @ x_rep)
    torch.testing.assert_close(xty_r[1], x_rep.T @ y_rep)


def test_cv_estimates_match_direct_formulas():
    rng = np.random.default_rng(4)
    n, k = 23, 4
    bounds = fold_bounds(n, k)
    h = torch.from_numpy(rng.normal(1.0, 2.0, (3, n)))
    est = cv_estimates(h, bounds)
    for r in range(3):
        hr = h[r].numpy()
        rhat = hr.mean()
        assert est["rhat"][r].item() == pytest.approx(rhat)
        assert est["var_out"][r].item() == pytest.approx(((hr - rhat) ** 2).mean())
        within = np.mean([np.var(hr[a:b], ddof=1) for a, b in bounds])
        assert est["var_in"][r].item() == pytest.approx(within)


def test_fold_bounds_partition_and_target_weights():
    bounds = fold_bounds(23, 4)
    assert bounds[0][0] == 0 and bounds[-1][1] == 23
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(bounds, bounds[1:]))
    assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    err_a = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    sizes = np.array([b - a for a, b in bounds])
    assert kfold_target(err_a, None, bounds).item() == pytest.approx((sizes * [1, 2, 3, 4]).sum() / 23)
    assert kfold_target(err_a, err_a, bounds).item() == 0.0


def test_ci_covers_at_nominal_rate_for_iid_losses():
    """When h_i are i.i.d. with mean μ and the target is μ, the CI is the usual z-interval (≈95%)."""
    rng = np.random.default_rng(5)
    R, n = 4000, 200
    h = torch.from_numpy(rng.exponential(1.0, (R, n)))  # skewed, mean 1
    est = cv_estimates(h, fold_bounds(n, 10))
    cover = ci_covers(est["rhat"], est["var_out"], torch.ones(R, dtype=torch.float64), n, 0.95)
    assert abs(float(cover.double().mean()) - 0.95) < 4 * math.sqrt(0.95 * 0.05 / R) + 0.01


def test_fold_statistics_and_fits_match_direct_refits():
    """Training Gram statistics = complement of each fold; Lasso fit = scikit-learn on that split;
    ST = soft-threshold of OLS; out-of-fold losses use the fold's own fit."""
    rng = np.random.default_rng(6)
    n, k = 60, 4
    x, y = draw_points(rng, (2, n), BETA, 1.0)
    bounds = fold_bounds(n, k)
    gram, xty, sizes = fold_statistics(x, y, bounds)
    lam = Penalties(1.0, 2.0, 1.5).at(n)
    coefs, _ = fit_models(gram, xty, sizes.expand(gram.shape[:2]), lam, 1e-13, 100_000, "torch")
    for j, (a, b) in enumerate(bounds):
        keep = torch.ones(n, dtype=torch.bool)
        keep[a:b] = False
        xs, ys = x[1][keep], y[1][keep]
        torch.testing.assert_close(gram[1, j], xs.T @ xs)
        ols = torch.linalg.lstsq(xs, ys).solution
        torch.testing.assert_close(coefs["ols"][1, j], ols)
        st = torch.sign(ols) * (ols.abs() - lam["st_high"]).clamp_min(0)
        torch.testing.assert_close(coefs["st_high"][1, j], st)
        sk = Lasso(alpha=lam["lasso"], fit_intercept=False, tol=1e-14, max_iter=1_000_000).fit(xs.numpy(), ys.numpy())
        np.testing.assert_allclose(coefs["lasso"][1, j].numpy(), sk.coef_, atol=1e-6)
        assert np.array_equal(coefs["lasso"][1, j].numpy() != 0, sk.coef_ != 0)
    losses = out_of_fold_losses(x, y, coefs["ols"], bounds)
    a, b = bounds[2]
    torch.testing.assert_close(losses[0, a:b], (y[0, a:b] - x[0, a:b] @ coefs["ols"][0, 2]) ** 2)
