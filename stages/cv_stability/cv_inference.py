"""CV inference for the test error (Bayle, Bayle, Janson & Mackey 2020) and its k-fold target.

For a contrast with per-point loss h (a single model's squared error, or loss of A minus loss of B)
and k folds B_1..B_k, every point i is scored by the model fitted without its fold:

    h_i = h(Z_i, Z_{B_j^c}),  i ∈ B_j
    R̂ = (1/n) Σ_i h_i                                                  # ALGO: CV estimate
    σ̂²_out = (1/n) Σ_i (h_i − R̂)²  = mean(h²) − R̂²                     # ALGO: all-pairs variance
    σ̂²_in  = (1/k) Σ_j 1/(|B_j| − 1) Σ_{i∈B_j} (h_i − h̄_j)²           # ALGO: within-fold variance
    CI = R̂ ± z_{1−α/2} σ̂ / √n                                          # ALGO: CV confidence interval

The target is the k-fold test error R_n = Σ_j (|B_j|/n) E[h(Z_0, Z_{B_j^c}) | Z_{B_j^c}] (the plain
fold average when folds are equal), computed exactly from the conditional test errors.
"""
from __future__ import annotations

import torch
from scipy.stats import norm


def out_of_fold_losses(x: torch.Tensor, y: torch.Tensor, coef: torch.Tensor,
                       bounds: list[tuple[int, int]]) -> torch.Tensor:
    """x (R, n, d), y (R, n), coef (R, k, d) fitted without fold j -> squared errors (R, n)."""
    loss = torch.empty_like(y)
    for j, (a, b) in enumerate(bounds):
        pred = torch.einsum("rid,rd->ri", x[:, a:b], coef[:, j])  # (R, |B_j|)
        loss[:, a:b] = (y[:, a:b] - pred) ** 2
    return loss


def cv_estimates(h: torch.Tensor, bounds: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """R̂, σ̂²_out and σ̂²_in for every replication; h (R, n)."""
    rhat = h.mean(1)
    var_out = (h**2).mean(1) - rhat**2
    var_in = torch.stack([h[:, a:b].var(1, unbiased=True) for a, b in bounds], 1).mean(1)
    return {"rhat": rhat, "var_out": var_out.clamp_min(0.0), "var_in": var_in}


def kfold_target(err_a: torch.Tensor, err_b: torch.Tensor | None, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """Σ_j (|B_j|/n)(err_A,j − err_B,j); err_* (R, k) exact conditional test errors per fold's fit."""
    sizes = torch.tensor([b - a for a, b in bounds], dtype=err_a.dtype, device=err_a.device)
    diff = err_a if err_b is None else err_a - err_b
    return diff @ (sizes / sizes.sum())


def z_quantile(level: float) -> float:
    return float(norm.ppf(0.5 + level / 2))


def ci_covers(rhat: torch.Tensor, var: torch.Tensor, target: torch.Tensor, n: int, level: float) -> torch.Tensor:
    """Whether R̂ ± z σ̂/√n contains the target (closed interval)."""
    half = z_quantile(level) * var.sqrt() / n**0.5
    return (rhat - target).abs() <= half


def bonferroni_difference(rhat_a: torch.Tensor, var_a: torch.Tensor, rhat_b: torch.Tensor, var_b: torch.Tensor,
                          n: int, level: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A conservative interval for R_A − R_B from the two single-model CIs at level 1 − α/2 each:
    [L_A − U_B, U_A − L_B]. If each single interval is valid (single models are relatively stable),
    both hold together with probability ≥ 1 − α (Bonferroni), and then so does the difference interval.
    Returns (lower, upper)."""
    z = z_quantile(1 - (1 - level) / 2)   # ALGO: Bonferroni, each interval at 1 − α/2
    ha, hb = z * var_a.sqrt() / n**0.5, z * var_b.sqrt() / n**0.5
    return (rhat_a - ha) - (rhat_b + hb), (rhat_a + ha) - (rhat_b - hb)


def coverage_se(p: float, reps: int) -> float:
    """Monte-Carlo standard error of a coverage proportion over ``reps`` replications."""
    return (p * (1 - p) / reps) ** 0.5
