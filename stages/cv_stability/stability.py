"""Monte-Carlo estimator of relative stability r(h_n) = n·γ(h_n) / σ²(h_n).

Definitions (Bayle et al. 2020), for a contrast h_n(Z, D) trained on D = Z_{1:m}:
    h'_n(Z, D) = h_n(Z, D) − E[h_n(Z, D) | D]                   (loss centred by its test error)
    γ(h_n)    = E[(h'_n(Z_0, D) − h'_n(Z_0, D'))²]                # ALGO: loss stability
                with D' = D with one training point replaced by an independent copy
    σ²(h_n)   = Var(h̄_n(Z_0)),  h̄_n(z) = E_D[h_n(z, D)]        # ALGO: variance of the averaged loss
    r(h_n)    = n·γ(h_n) / σ²(h_n)                               # ALGO: relative stability

Under the Gaussian design every squared-error contrast is a quadratic in the test point Z = (x, ε):
with u = β̂ − β*,   (ε − xᵀu)² = ε² − 2ε xᵀu + xᵀuuᵀx, so

    h(Z, D) = c ε² − 2ε xᵀa + xᵀ S x,
        single model A:   c = 1, a = u_A,        S = u_A u_Aᵀ
        comparison A − B: c = 0, a = u_A − u_B,  S = u_A u_Aᵀ − u_B u_Bᵀ

and for training sets D1, D2 the covariance over Z is exact:
    Cov_Z(h(Z, D1), h(Z, D2)) = 2c²σ⁴ + 4σ² a1ᵀa2 + 2 tr(S1 S2).

Hence, with B Monte-Carlo training sets D_b (and their one-point replacements D'_b):
    γ̂  = (1/B) Σ_b [4σ²‖a_b − a'_b‖² + 2‖S_b − S'_b‖²_F]          (exact in Z_0, MC over D, D')
    σ̂² = 2c²σ⁴ + 1/(B(B−1)) Σ_{b≠b'} [4σ² a_bᵀa_b' + 2 tr(S_b S_b')]   (unbiased U-statistic)
"""
from __future__ import annotations

import numpy as np
import torch

from stages.cv_stability.simulate import draw_points


def contrast_parts(u_a: torch.Tensor, u_b: torch.Tensor | None) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(c, a (..., d), S (..., d, d)) of the quadratic form of a single model or a comparison."""
    outer_a = u_a[..., :, None] * u_a[..., None, :]
    if u_b is None:
        return 1.0, u_a, outer_a
    return 0.0, u_a - u_b, outer_a - u_b[..., :, None] * u_b[..., None, :]


def pair_loss_cov(c: float, a1: torch.Tensor, s1: torch.Tensor, a2: torch.Tensor, s2: torch.Tensor,
                  noise_sd: float) -> torch.Tensor:
    """Cov_Z(h(Z, D1), h(Z, D2)) = 2c²σ⁴ + 4σ² a1ᵀa2 + 2 tr(S1 S2), exactly."""
    s2_ = noise_sd**2
    return 2 * c**2 * s2_**2 + 4 * s2_ * (a1 * a2).sum(-1) + 2 * (s1 * s2).sum((-2, -1))


def loss_stability_draws(a: torch.Tensor, s: torch.Tensor, a_rep: torch.Tensor, s_rep: torch.Tensor,
                         noise_sd: float) -> torch.Tensor:
    """Per draw: E_Z0[(h'(Z0, D) − h'(Z0, D'))²] = Var_Z(h(Z,D) − h(Z,D')), shape (B,)."""
    return 4 * noise_sd**2 * ((a - a_rep) ** 2).sum(-1) + 2 * ((s - s_rep) ** 2).sum((-2, -1))


def sigma2_ustat(c: float, a: torch.Tensor, s: torch.Tensor, noise_sd: float) -> torch.Tensor:
    """Unbiased U-statistic of σ²(h_n) = Var(h̄_n(Z_0)) over B independent training sets."""
    B = a.shape[0]
    if B < 2:
        raise ValueError("sigma2_ustat: need at least two training sets")
    sa = a.sum(0)
    ss = s.sum(0)
    cross_a = (sa @ sa - (a * a).sum()) / (B * (B - 1))  # mean over b≠b' of a_bᵀa_b'
    cross_s = ((ss * ss).sum() - (s * s).sum()) / (B * (B - 1))  # mean over b≠b' of tr(S_b S_b')
    return 2 * c**2 * noise_sd**4 + 4 * noise_sd**2 * cross_a + 2 * cross_s


def relative_stability(c: float, a: torch.Tensor, s: torch.Tensor, a_rep: torch.Tensor, s_rep: torch.Tensor,
                       noise_sd: float, n: int, groups: int = 1) -> dict[str, float]:
    """γ̂, σ̂², r̂ = n γ̂ / σ̂² from B draws; with groups > 1 also a batch-means standard error of r̂."""
    gamma_draws = loss_stability_draws(a, s, a_rep, s_rep, noise_sd)
    gamma = float(gamma_draws.mean())
    sigma2 = float(sigma2_ustat(c, a, s, noise_sd))
    out = {"gamma": gamma, "sigma2": sigma2, "r": n * gamma / sigma2 if sigma2 > 0 else float("inf"),
           "gamma_se": float(gamma_draws.std() / len(gamma_draws) ** 0.5)}
    if groups > 1:
        idx = torch.arange(a.shape[0], device=a.device).chunk(groups)
        rs = []
        for g in idx:
            s2g = float(sigma2_ustat(c, a[g], s[g], noise_sd))
            rs.append(n * float(gamma_draws[g].mean()) / s2g if s2g > 0 else float("nan"))
        out["r_se"] = float(np.nanstd(rs, ddof=1) / np.sqrt(len(rs)))
        out["r_groups"] = rs
    return out


def simulate_replace_one(rngs: list[np.random.Generator], m: int, beta_star: torch.Tensor,
                         noise_sd: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training set D of size m per generator, and D' = D with its first point replaced by a
    fresh one (drawn from the same generator, so results do not depend on how draws are chunked).

    Returns Gram statistics (XᵀX (count, d, d), Xᵀy (count, d)) of D and of D'."""
    sets = [(draw_points(rng, (m,), beta_star, noise_sd), draw_points(rng, (1,), beta_star, noise_sd))
            for rng in rngs]
    x, y = torch.stack([s[0][0] for s in sets]), torch.stack([s[0][1] for s in sets])
    x_new, y_new = torch.cat([s[1][0] for s in sets]), torch.cat([s[1][1] for s in sets])
    gram = x.transpose(1, 2) @ x
    xty = (x.transpose(1, 2) @ y[..., None])[..., 0]
    x0, y0 = x[:, 0], y[:, 0]
    gram_rep = gram - x0[:, :, None] * x0[:, None, :] + x_new[:, :, None] * x_new[:, None, :]
    xty_rep = xty - x0 * y0[:, None] + x_new * y_new[:, None]
    return gram, xty, gram_rep, xty_rep
