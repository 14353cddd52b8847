"""The paper's core effect at tiny scale: from the uniform start FTRL's hitting time on the chain games
grows geometrically in m (>= 2x per size step), while the staircase and random games stay fast; at a
fixed ε lazy alternating MWU does not slow down with m."""
from __future__ import annotations

import numpy as np
import torch

from kernels.ftrl_dynamics import ftrl_run, ne_gap_reference
from stages.ftrl_potential.games import chain_game, random_game, staircase_game


def _hit(A, reg, eta, eps, cap=20000, schedule="constant", alternating=False):
    n = A.shape[0]
    z = torch.zeros(1, n, dtype=torch.float64)
    out = ftrl_run(A[None], z, z, torch.tensor([eta], dtype=torch.float64), torch.tensor([eps], dtype=torch.float64),
                   cap, reg, schedule, alternating, backend="torch")
    return int(out["hit"][0]), out


def test_uniform_start_exponential_on_chain_not_on_staircase():
    for reg, eta, sched in (("entropic", 1.0, "constant"), ("euclidean", 0.1, "constant"), ("entropic", 1.0, "sqrt")):
        hits = [_hit(chain_game(m), reg, eta, 0.1 / m, schedule=sched)[0] for m in (2, 3, 4)]
        assert all(h > 0 for h in hits), (reg, hits)
        assert hits[1] >= 2 * hits[0] and hits[2] >= 2 * hits[1], (reg, sched, hits)  # geometric growth
    stair = [_hit(staircase_game(m), "entropic", 1.0, 0.1 / m)[0] for m in (2, 3, 4, 5)]
    chain = [_hit(chain_game(m), "entropic", 1.0, 0.1 / m)[0] for m in (2, 3, 4, 5)]
    assert max(stair) < chain[-1] / 10, (stair, chain)


def test_hit_is_exact_first_eps_ne():
    A = chain_game(3)
    t, out = _hit(A, "entropic", 0.7, 1 / 30)
    assert ne_gap_reference(A[None], out["x"], out["y"]).item() <= 1 / 30
    # one step earlier the profile was not an ε-NE
    _, before = _hit(A, "entropic", 0.7, 1e-12, cap=t - 1)
    assert ne_gap_reference(A[None], before["x"], before["y"]).item() > 1 / 30


def test_fixed_eps_alternating_does_not_slow_down():
    hits = [_hit(chain_game(m), "entropic", 1.0, 0.05, alternating=True)[0] for m in (3, 5, 7)]
    assert all(0 < h < 200 for h in hits), hits
    rng = np.random.default_rng(1)
    hits_r = [_hit(random_game(2 * m + 2, rng), "entropic", 1.0, 0.05, alternating=True)[0] for m in (3, 5, 7)]
    assert all(0 < h < 200 for h in hits_r), hits_r


def test_potential_rises_along_chain_trajectory():
    A = chain_game(4)
    z = torch.zeros(1, A.shape[0], dtype=torch.float64)
    out = ftrl_run(A[None], z, z, torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.025], dtype=torch.float64),
                   700, "entropic", every=10, backend="torch")
    phi = out["phi"][0][~torch.isnan(out["phi"][0])]
    assert phi[-1] > phi[0] + 0.5       # climbs the chain: from ≈ the first cells to the NE payoff
