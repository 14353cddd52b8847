"""What the theory speaks of, measured on a learned W_OV (V, V) (rows: output token, cols: input).

- logits of a fact [e, r] are W x̄ = (W[:, e] + W[:, r]) / 2           # ALGO: one-layer model, uniform attention
- margin of a fact: logit of its target minus the largest other logit; γ_min = min over training facts
- nuclear norm at fixed margin: ‖W‖_* / γ_min (scale-free; GD on a factorized W from small init
  converges in direction to a KKT point of  min ‖W‖_*  s.t. every training margin ≥ 1)
- the reference: that minimum-nuclear-norm solution itself, by a convex solver (cvxpy)
- off-diagonal held-out asymmetry: u_i = W[a_i, b_i] (reverse), v_i = W[b_i, a_i] (forward),
  ‖u − v‖ / √(‖u‖² + ‖v‖²): 0 when symmetric, 1 when only one direction is stored, √2 when opposite.
"""
from __future__ import annotations

import numpy as np
import torch


def fact_logits(w: torch.Tensor, entity: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
    """(N, V) logits W x̄ of the facts [entity, relation]."""
    return (0.5 * (w[:, entity] + w[:, relation])).T


def margins(w: torch.Tensor, entity: torch.Tensor, relation: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N,) target logit minus the largest other logit."""
    logits = fact_logits(w, entity, relation)
    rows = torch.arange(len(target), device=logits.device)
    tgt = logits[rows, target]
    other = logits.clone()
    other[rows, target] = -torch.inf
    return tgt - other.max(dim=1).values


def nuclear_at_margin(w: torch.Tensor, entity, relation, target) -> float:
    """‖W‖_* / γ_min over the given (training) facts; +inf while some fact is still misclassified."""
    if not torch.isfinite(w).all():
        return float("nan")  # diverged
    gamma = margins(w, entity, relation, target).min().item()
    if gamma <= 0:
        return float("inf")
    return torch.linalg.matrix_norm(w.double(), ord="nuc").item() / gamma


def offdiag_asymmetry(w: torch.Tensor, a_idx: torch.Tensor, b_idx: torch.Tensor) -> float:
    """‖u − v‖ / √(‖u‖² + ‖v‖²) with u_i = W[a_i, b_i], v_i = W[b_i, a_i] over held-out pairs."""
    u, v = w[a_idx, b_idx].double(), w[b_idx, a_idx].double()
    denom = torch.sqrt((u * u).sum() + (v * v).sum()).clamp_min(1e-300)
    return (torch.linalg.norm(u - v) / denom).item()


def pair_block(w: torch.Tensor, a_idx: torch.Tensor, b_idx: torch.Tensor) -> list[list[float]]:
    """Mean over held-out pairs of [[W[a,a], W[a,b]], [W[b,a], W[b,b]]] (rows: output, cols: input)."""
    return [[w[a_idx, a_idx].mean().item(), w[a_idx, b_idx].mean().item()],
            [w[b_idx, a_idx].mean().item(), w[b_idx, b_idx].mean().item()]]


def min_nuclear_norm(vocab_size: int, entity: np.ndarray, relation: np.ndarray, target: np.ndarray,
                     solver: str = "SCS") -> tuple[float, np.ndarray]:
    """argmin ‖W‖_* s.t. (W x̄_i)[y_i] − (W x̄_i)[j] ≥ 1 for every training fact i and j ≠ y_i.

    # ALGO: the convex problem whose solution GD's implicit bias approaches (the paper's Theorem)
    Returns (optimal value, W)."""
    import cvxpy as cp  # noqa: PLC0415 (only the evaluate stage needs the solver)

    V, N = vocab_size, len(target)
    W = cp.Variable((V, V))
    logits = 0.5 * (W[:, entity] + W[:, relation])                    # (V, N)
    onehot = np.zeros((V, N))
    onehot[target, np.arange(N)] = 1.0
    tgt = cp.sum(cp.multiply(logits, onehot), axis=0)                 # (N,) target logits
    gap = logits - np.ones((V, 1)) @ cp.reshape(tgt, (1, N), order="C")  # other − target
    prob = cp.Problem(cp.Minimize(cp.normNuc(W)), [gap <= onehot - 1.0])  # ≤ −1 off target, ≤ 0 on it
    prob.solve(solver=solver)
    if prob.status not in ("optimal", "optimal_inaccurate"):
        raise RuntimeError(f"min-nuclear-norm problem: solver status {prob.status}")
    return float(prob.value), np.asarray(W.value)
