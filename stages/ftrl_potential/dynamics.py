"""The learning dynamics: arm specifications, starts, two-player runs through kernels.ftrl_dynamics,
and multi-player fictitious play (native; N-player payoff tensors do not fit the two-player kernel).

    out = run_arm(arm, A_batch, eps, cap, starts, rec)   # (B,) hitting times etc.
    t = multi_fp_hitting_time(T, eps, cap)               # N-player fictitious play
"""
from __future__ import annotations

from typing import Literal, Optional

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from kernels.ftrl_dynamics import ftrl_run
from stages.ftrl_potential.games import GameError, check_identical_interest


class Arm(BaseModel):
    """One learning dynamic: regularizer, step size η (η_t = η/√t for schedule sqrt), alternation."""
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
    name: str = Field(min_length=1, max_length=40)
    reg: Literal["entropic", "euclidean", "logbarrier", "fp"]
    eta: float = Field(1.0, gt=0, le=1e3)
    schedule: Literal["constant", "sqrt"] = "constant"
    alternating: bool = False
    cap: Optional[int] = Field(None, ge=1, le=10_000_000, description="per-arm hitting-time cap (None: train.cap)")
    max_m: Optional[int] = Field(None, ge=2, le=64, description="largest m of its uniform-start chain runs (cost)")


def starts(B: int, n: int, arm: Arm, scale: float, gen: torch.Generator | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial cumulative utilities U_0 for B runs. Uniform start: U_0 = 0 (x_1 = Q(0) = uniform for
    every permutation-invariant regularizer). Random start: z_1 = η_1 U_0 = scale · N(0, I), i.e.
    a random interior first iterate of comparable spread for every η (for FP: a random first action)."""
    if gen is None:
        z = torch.zeros(B, n, dtype=torch.float64, device=device)
        return z, z.clone()
    g = torch.randn(2, B, n, generator=gen, dtype=torch.float64, device=device)
    return g[0] * (scale / arm.eta), g[1] * (scale / arm.eta)


def run_arm(arm: Arm, A: torch.Tensor, eps: float, cap: int, ux0: torch.Tensor, uy0: torch.Tensor,
            rec, every: int | None = None) -> dict[str, torch.Tensor]:
    """Run the arm on the batch of games A (B, n, n) through the batched kernel."""
    if eps <= 0:
        raise GameError(f"eps: must be > 0 (got {eps})")
    B = A.shape[0]
    eta = torch.full((B,), arm.eta, dtype=A.dtype, device=A.device)
    epsv = torch.full((B,), eps, dtype=A.dtype, device=A.device)
    rec.count("ftrl_run")
    return ftrl_run(A, ux0, uy0, eta, epsv, cap, arm.reg, arm.schedule, arm.alternating, every=every,
                    backend=rec.backend)


def multi_gap(T: np.ndarray, a: tuple[int, ...]) -> float:
    """ε-NE gap of the pure profile a in the identical-interest N-player game T."""
    val = T[a]
    return max(float(T[a[:p] + (slice(None),) + a[p + 1:]].max() - val) for p in range(T.ndim))


def multi_fp_hitting_time(payoffs, eps: float, cap: int) -> tuple[int, list[float]]:
    """Fictitious play (FTRL with η → ∞) in an N-player identical-interest game: each player plays the
    pure best response to its cumulative realized utility vector U_p = Σ_s u_p(·, a_{-p,s}), ties to
    the lowest index, all players simultaneously. Returns (first t with an ε-NE or -1, potential trace)."""
    T = check_identical_interest(payoffs).numpy() if not isinstance(payoffs, np.ndarray) else payoffs
    if eps <= 0:
        raise GameError(f"eps: must be > 0 (got {eps})")
    if len(set(T.shape)) != 1:
        raise GameError(f"payoffs: every player needs the same number of actions (shape {tuple(T.shape)})")
    N, m = T.ndim, T.shape[0]
    U = np.zeros((N, m))
    phis = []
    for t in range(1, cap + 1):
        a = tuple(int(np.argmax(U[p])) for p in range(N))      # ALGO: FP = argmax of cumulative utility
        phis.append(float(T[a]))
        if multi_gap(T, a) <= eps:
            return t, phis
        for p in range(N):
            U[p] += T[a[:p] + (slice(None),) + a[p + 1:]]
    return -1, phis
