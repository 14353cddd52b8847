"""Defining identities and hard-coded known values of the CV-inference and relative-stability code, with
non-unit σ (so σ vs σ² mistakes show), and the paper's central result at unit scale."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stages.cv_stability.cv_inference import bonferroni_difference, ci_covers, z_quantile
from stages.cv_stability.models import CONTRASTS, Penalties, fit_models
from stages.cv_stability.stability import (contrast_parts, loss_stability_draws, pair_loss_cov,
                                           relative_stability, sigma2_ustat, simulate_replace_one)

BETA = torch.tensor([3.0, 1.0, -5.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
T = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731


def test_pair_loss_cov_known_value():
    # c = 1, σ = 2: 2σ⁴ = 32; 4σ² a1ᵀa2 = 16·0.5 = 8; 2 tr(S1 S2) = 2 (a1ᵀa2)² = 0.5  ->  40.5
    a1, a2 = T(1.0, 0.0), T(0.5, 0.0)
    s1, s2 = torch.outer(a1, a1), torch.outer(a2, a2)
    assert float(pair_loss_cov(1.0, a1, s1, a2, s2, 2.0)) == pytest.approx(40.5)
    assert float(pair_loss_cov(0.0, a1, s1, a2, s2, 2.0)) == pytest.approx(8.5)  # comparison: no ε² term


def test_loss_stability_known_value():
    # 4σ²‖a − a'‖² + 2‖S − S'‖²_F with σ = 1.5, a − a' = (1, 2), S = S' : 4·2.25·5 = 45
    a, a_r = T(1.0, 2.0)[None], T(0.0, 0.0)[None]
    s = torch.ones(1, 2, 2, dtype=torch.float64)
    assert float(loss_stability_draws(a, s, a_r, s.clone(), 1.5)[0]) == pytest.approx(45.0)
    # S − S' = diag(1, −1): ‖·‖²_F = 2 -> adds 4
    s_r = s - torch.diag(T(1.0, -1.0))[None]
    assert float(loss_stability_draws(a, s, a_r, s_r, 1.5)[0]) == pytest.approx(49.0)


def test_sigma2_is_the_u_statistic_over_distinct_draws():
    """σ̂² averages Cov(h(·,D_b), h(·,D_b')) over b ≠ b' only (U-statistic), not over all pairs (V)."""
    rng = np.random.default_rng(0)
    B, sd = 5, 1.7
    us = torch.from_numpy(rng.normal(0, 0.4, (B, 3)))
    vs = torch.from_numpy(rng.normal(0, 0.4, (B, 3)))
    for single in (True, False):
        c, a, s = contrast_parts(us, None if single else vs)
        pairs = [[float(pair_loss_cov(c, a[i], s[i], a[j], s[j], sd)) for j in range(B)] for i in range(B)]
        u_stat = sum(pairs[i][j] for i in range(B) for j in range(B) if i != j) / (B * (B - 1))
        v_stat = sum(pairs[i][j] for i in range(B) for j in range(B)) / B**2
        got = float(sigma2_ustat(c, a, s, sd))
        assert got == pytest.approx(u_stat, rel=1e-12)
        assert abs(got - v_stat) > 1e-3 * abs(v_stat)  # the diagonal (b = b') is not in it


def test_relative_stability_defining_identity():
    """r̂ = n·γ̂/σ̂² with γ̂ the mean per-draw stability and σ̂² the U-statistic; non-unit σ."""
    rng = np.random.default_rng(1)
    B, sd, n = 12, 0.6, 300
    ua, ub = (torch.from_numpy(rng.normal(0, 0.3, (B, 4))) for _ in range(2))
    ua2 = ua + torch.from_numpy(rng.normal(0, 0.05, (B, 4)))
    c, a, s = contrast_parts(ua, None)   # single model: σ̂² > 0 (a comparison's U-statistic can be < 0 at small B)
    _, a_r, s_r = contrast_parts(ua2, None)
    res = relative_stability(c, a, s, a_r, s_r, sd, n, groups=3)
    gamma = np.mean([4 * sd**2 * float(((a[b] - a_r[b]) ** 2).sum()) + 2 * float(((s[b] - s_r[b]) ** 2).sum())
                     for b in range(B)])
    assert res["gamma"] == pytest.approx(gamma, rel=1e-12)
    assert res["sigma2"] == pytest.approx(float(sigma2_ustat(c, a, s, sd)), rel=1e-12)
    assert res["r"] == pytest.approx(n * res["gamma"] / res["sigma2"], rel=1e-12)
    # each group's r̂ uses only its own draws
    g0 = slice(0, 4)
    r0 = n * float(loss_stability_draws(a[g0], s[g0], a_r[g0], s_r[g0], sd).mean()) / float(sigma2_ustat(c, a[g0], s[g0], sd))
    assert res["r_groups"][0] == pytest.approx(r0, rel=1e-12) and len(res["r_groups"]) == 3


def test_ci_half_width_uses_sd_not_variance():
    # R̂ = 1, σ̂² = 4 (σ̂ = 2), n = 100, 95%: half width 1.959964·2/10 = 0.391993
    rhat, var = T(1.0, 1.0), T(4.0, 4.0)
    covered = ci_covers(rhat, var, T(1.3919, 1.3921), 100, 0.95)
    assert covered.tolist() == [True, False]
    assert z_quantile(0.95) == pytest.approx(1.959964, abs=1e-6)
    # the interval is closed: a target exactly at R̂ ± half width is covered
    half = z_quantile(0.95) * 2.0 / 10.0
    assert ci_covers(T(0.0, 0.0), T(4.0, 4.0), T(half, -half), 100, 0.95).tolist() == [True, True]


def test_bonferroni_difference_known_values():
    # each at 97.5%: z = 2.241403; R̂_A = 2, σ̂_A = 2; R̂_B = 1, σ̂_B = 1; n = 100
    lo, hi = bonferroni_difference(T(2.0), T(4.0), T(1.0), T(1.0), 100, 0.95)
    assert float(lo) == pytest.approx(2 - 0.4482806 - (1 + 0.2241403), abs=1e-6)
    assert float(hi) == pytest.approx(2 + 0.4482806 - (1 - 0.2241403), abs=1e-6)


def mc_r(contrast: str, n: int, B: int, seed: int, k: int = 10, sd: float = 1.0) -> float:
    """Monte-Carlo r(h_n) of a contrast through the same functions as the evaluate stage."""
    m = n - n // k
    rngs = [np.random.default_rng([seed, b]) for b in range(B)]
    gram, xty, gram_r, xty_r = simulate_replace_one(rngs, m, BETA, sd)
    coefs, _ = fit_models(torch.cat([gram, gram_r]), torch.cat([xty, xty_r]), float(m),
                          Penalties(1.0, 2.0, 1.0).at(n), 1e-10, 10_000, "torch")
    a_name, b_name = CONTRASTS[contrast]
    c, a, s = contrast_parts(coefs[a_name] - BETA, None if b_name is None else coefs[b_name] - BETA)
    return relative_stability(c, a[:B], s[:B], a[B:], s[B:], sd, n)["r"]


def test_central_result_comparison_r_does_not_shrink_single_does():
    """The paper's point at unit scale: from n = 100 to 1600 the single model's r̂ falls (~1/n) while the
    ST-vs-OLS comparison's r̂ does not shrink (ratio > 0.5)."""
    r = {(c, n): mc_r(c, n, 400, seed=i) for i, (c, n) in enumerate(
        [("st_low", 100), ("st_low", 1600), ("st_vs_ols", 100), ("st_vs_ols", 1600)])}
    assert r[("st_low", 1600)] / r[("st_low", 100)] < 0.25, r
    assert r[("st_vs_ols", 1600)] / r[("st_vs_ols", 100)] > 0.5, r
    assert r[("st_vs_ols", 1600)] > 0.05, r  # bounded away from 0 in absolute terms too
