"""Official metrics (bandits/simulation.py) from logged contexts and actions, and growth exponents.

Per round t with context c_t, chosen arm a_t, comparator k*_t (best truly fair arm; the least-unfair
arm when none is fair):
    regret_t     = μ(c_t, k*_t) − μ(c_t, a_t)                                    # ALGO: regret
    regret⁺_t    = max(regret_t, 0)  (an upper bound of the regret; never negative, so its growth
                   exponent is defined even when a learner earns MORE than the fair optimum by
                   playing unfair arms, which makes the signed regret negative)
    viol_t^j     = max(|effect_j(a_t)| − τ, 0) for j ∈ {DE, IE, SE}; viol_t = max_j viol_t^j   # ALGO: violation
    penalized_t  = μ(c_t, k*_t) if any |effect_j(a_t)| > τ else regret_t        # ALGO: penalized regret

Exponents: least-squares slope of log(cumulative value) on log t (anytime, over checkpoints in a
window) or on log T over a horizon sweep (final values). A curve that is not positive over the
window has no exponent: the value is null and a reason is given — never NaN.
"""
from __future__ import annotations

import math

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
    out = {"regret": best - got, "regret_plus": (best - got).clamp_min(0), "violation": viol_j.amax(-1),
           "penalized_regret": torch.where(violated, best, best - got), "reward": got,
           "violated_rounds": violated.to(best.dtype)}
    for j, name in enumerate(EFFECTS):
        out[f"violation_{name}"] = viol_j[..., j]
    return out


def checkpoints(T: int, n: int = 40) -> np.ndarray:
    """Geometric grid of rounds 1..T (distinct, ending at T)."""
    return np.unique(np.round(np.geomspace(1, T, n)).astype(int))


def fit_exponent(xs, values) -> tuple[float | None, str]:
    """(slope of log value on log x, "") or (None, reason). Needs >= 2 points, all values > 0."""
    x, v = np.asarray(xs, dtype=float), np.asarray(values, dtype=float)
    if len(x) < 2:
        return None, "fewer than 2 points"
    if not np.all(np.isfinite(v)):
        return None, "a non-finite value"
    if np.all(v == 0):
        return 0.0, "identically 0 (nothing accumulated): exponent 0"
    if np.any(v <= 0):
        return None, f"not positive at {int(np.sum(v <= 0))} of {len(v)} points (no power law to fit)"
    return float(np.polyfit(np.log(x), np.log(v), 1)[0]), ""


def loglog_slope(ts: np.ndarray, values: np.ndarray, t_min: int) -> float | None:
    """Anytime exponent over checkpoints t >= t_min (None where undefined; see fit_exponent)."""
    sel = ts >= t_min
    return fit_exponent(ts[sel], np.asarray(values, dtype=float)[sel])[0]


def summarize(per_round: dict[str, torch.Tensor], T: int, t_min: int) -> dict:
    """Per instance: final cumulative values, curves at checkpoints, anytime exponents over [t_min, T]
    (per key: list over instances, None where undefined, with the reasons)."""
    ts = checkpoints(T)
    out = {"checkpoints": ts.tolist(), "final": {}, "curves": {}, "exponents": {}, "exponent_reasons": {}}
    sel = ts >= t_min
    for key, val in per_round.items():
        cum = val[:, :T].cumsum(1).cpu().numpy()                       # (B, T)
        curve = cum[:, ts - 1]
        out["final"][key] = cum[:, -1].tolist()
        out["curves"][key] = curve.tolist()
        if key not in ("reward", "violated_rounds"):
            fits = [fit_exponent(ts[sel], c[sel]) for c in curve]
            out["exponents"][key] = [f[0] for f in fits]
            out["exponent_reasons"][key] = [f[1] for f in fits]
    return out


def finite_json(obj):
    """A copy with every non-finite float replaced by None (JSON outputs hold no NaN/Infinity token;
    a field that can be undefined carries its reason beside it)."""
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
