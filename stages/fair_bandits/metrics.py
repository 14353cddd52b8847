"""Official metrics (bandits/simulation.py) from logged contexts and actions, and log-log slopes.

Per round t with context c_t, chosen arm a_t, comparator k*_t (best truly fair arm; the least-unfair
arm when none is fair):
    regret_t     = μ(c_t, k*_t) − μ(c_t, a_t)                                    # ALGO: regret
    viol_t^j     = max(|effect_j(a_t)| − τ, 0) for j ∈ {DE, IE, SE}; viol_t = max_j viol_t^j   # ALGO: violation
    penalized_t  = μ(c_t, k*_t) if any |effect_j(a_t)| > τ else regret_t        # ALGO: penalized regret
"""
from __future__ import annotations

import numpy as np
import torch

from stages.fair_bandits.scm import CELLS, EFFECTS, World


def round_metrics(world: World, taus: torch.Tensor, ctx: torch.Tensor, act: torch.Tensor) -> dict[str, torch.Tensor]:
    """ctx, act (B, T) int; taus (B,). Returns per-round tensors (B, T) (viol_DE etc. included)."""
    comp, _ = world.comparator(taus)                                   # (B, 8)
    ctx, act = ctx.long(), act.long()
    best = world.mu[ctx, comp.gather(1, ctx)]
    got = world.mu[ctx, act]
    a_of_c = torch.tensor([ia for ia, _, _ in CELLS], device=ctx.device)
    eff = world.effects[a_of_c[ctx]]                                   # (B, T, 3, K)
    eff = eff.gather(3, act[:, :, None, None].expand(*act.shape, 3, 1))[..., 0].abs()  # (B, T, 3)
    over = eff - taus[:, None, None]
    viol_j = over.clamp_min(0)
    violated = (over > 0).any(-1)
    out = {"regret": best - got, "violation": viol_j.amax(-1),
           "penalized_regret": torch.where(violated, best, best - got), "reward": got}
    for j, name in enumerate(EFFECTS):
        out[f"violation_{name}"] = viol_j[..., j]
    return out


def checkpoints(T: int, n: int = 40) -> np.ndarray:
    """Geometric grid of rounds 1..T (distinct, ending at T)."""
    return np.unique(np.round(np.geomspace(1, T, n)).astype(int))


def loglog_slope(ts: np.ndarray, values: np.ndarray, t_min: int) -> float:
    """Least-squares slope of log(value) on log(t) over checkpoints t >= t_min where value > 0.

    A curve that is 0 on the whole window (nothing accumulated) has slope 0; a curve with a
    non-positive value inside the window after being positive (regret can be negative) gives NaN
    (undefined) unless at most one point is positive."""
    sel = ts >= t_min
    t, v = ts[sel].astype(float), np.asarray(values, dtype=float)[sel]
    pos = v > 0
    if pos.sum() < 2:
        return 0.0 if np.all(v >= 0) else float("nan")
    if not pos[np.argmax(pos):].all():
        return float("nan")
    return float(np.polyfit(np.log(t[pos]), np.log(v[pos]), 1)[0])


def summarize(per_round: dict[str, torch.Tensor], T: int, t_min: int) -> dict:
    """Per instance: final cumulative values, curves at checkpoints, slopes."""
    ts = checkpoints(T)
    out = {"checkpoints": ts.tolist(), "final": {}, "curves": {}, "slopes": {}}
    for key, val in per_round.items():
        cum = val.cumsum(1).cpu().numpy()                              # (B, T)
        curve = cum[:, ts - 1]
        out["final"][key] = cum[:, -1].tolist()
        out["curves"][key] = curve.tolist()
        if key != "reward":
            out["slopes"][key] = [loglog_slope(ts, c, t_min) for c in curve]
    return out
