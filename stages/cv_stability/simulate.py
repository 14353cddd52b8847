"""The data model of the miniature: Y = Xᵀβ* + ε, X ~ N(0, I_d), ε ~ N(0, σ²).

Because the design is isotropic Gaussian and independent of the noise, the conditional test error
of any fitted linear rule β̂ is known exactly:

    E[(Y − Xᵀβ̂)² | β̂] = σ² + ‖β̂ − β*‖²                        # ALGO: exact conditional test error
"""
from __future__ import annotations

import numpy as np
import torch


def draw_points(rng: np.random.Generator, shape: tuple[int, ...], beta_star: torch.Tensor,
                noise_sd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """X (*shape, d) and y (*shape) in float64; x ~ N(0, I), y = xᵀβ* + σ ε."""
    d = beta_star.shape[0]
    x = torch.from_numpy(rng.standard_normal((*shape, d)))
    eps = torch.from_numpy(rng.standard_normal(shape))
    return x, x @ beta_star + noise_sd * eps


def conditional_test_error(beta_hat: torch.Tensor, beta_star: torch.Tensor, noise_sd: float) -> torch.Tensor:
    """σ² + ‖β̂ − β*‖² over the last axis (exact under the Gaussian design)."""
    return noise_sd**2 + ((beta_hat - beta_star) ** 2).sum(-1)


def fold_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """k contiguous folds of near-equal size. The points are i.i.d., so contiguous blocks are
    distributed exactly like a uniformly random partition."""
    edges = np.linspace(0, n, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
