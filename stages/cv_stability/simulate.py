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


def dataset_rng(seed: int, n: int, rep: int) -> np.random.Generator:
    """The stream of data set ``rep`` at sample size ``n``: independent across (n, rep), so every
    data set can be regenerated on its own, in any chunking, from the seed alone."""
    return np.random.default_rng([seed, n, rep])


def draw_datasets(seed: int, n: int, reps: range, beta_star: torch.Tensor,
                  noise_sd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Data sets ``reps`` of size n: x (R, n, d), y (R, n) in float64 on the CPU, each from its own
    stream dataset_rng(seed, n, rep) (so a chunk equals the same rows of any other chunking)."""
    sets = [draw_points(dataset_rng(seed, n, r), (n,), beta_star.cpu().double(), noise_sd) for r in reps]
    return torch.stack([s[0] for s in sets]), torch.stack([s[1] for s in sets])


def rep_chunks(reps: int, n: int, points: int = 1_000_000) -> list[range]:
    """Replications in chunks of about ``points`` data points (memory only; results do not depend on it)."""
    size = max(1, points // n)
    return [range(a, min(a + size, reps)) for a in range(0, reps, size)]


def conditional_test_error(beta_hat: torch.Tensor, beta_star: torch.Tensor, noise_sd: float) -> torch.Tensor:
    """σ² + ‖β̂ − β*‖² over the last axis (exact under the Gaussian design)."""
    return noise_sd**2 + ((beta_hat - beta_star) ** 2).sum(-1)


def fold_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """k contiguous folds of near-equal size. The points are i.i.d., so contiguous blocks are
    distributed exactly like a uniformly random partition."""
    edges = np.linspace(0, n, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
