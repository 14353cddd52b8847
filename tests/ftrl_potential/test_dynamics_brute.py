"""stages/ftrl_potential/dynamics.py against independent brute force: starts, run_arm's batching and
validation, the N-player ε-NE gap by enumeration of deviations, and fictitious play replayed with plain
loops (ties to the lowest index, simultaneous moves, ε boundary inclusive)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kernels.ftrl_dynamics import ftrl_run_reference
from kernels.record import KernelRecord
from stages.ftrl_potential.dynamics import Arm, multi_fp_hitting_time, multi_gap, run_arm, starts
from stages.ftrl_potential.games import GameError


def test_uniform_start_is_zero_and_two_independent_tensors():
    arm = Arm(name="a", reg="entropic", eta=2.5)
    ux, uy = starts(3, 4, arm, 0.7, None, "cpu")
    assert ux.shape == uy.shape == (3, 4) and ux.dtype == uy.dtype == torch.float64
    assert torch.count_nonzero(ux) == 0 and torch.count_nonzero(uy) == 0
    ux += 1.0                                                   # a clone, not the same storage
    assert torch.count_nonzero(uy) == 0


def test_random_start_is_scale_over_eta_times_the_generators_normals():
    arm = Arm(name="a", reg="euclidean", eta=2.5)
    ux, uy = starts(3, 4, arm, 0.7, torch.Generator().manual_seed(11), "cpu")
    g = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    torch.testing.assert_close(ux, g[0] * 0.28, rtol=0, atol=1e-15)   # 0.7 / 2.5 = 0.28
    torch.testing.assert_close(uy, g[1] * 0.28, rtol=0, atol=1e-15)
    assert not torch.equal(ux, uy)


def test_run_arm_broadcasts_eta_and_eps_per_game_and_counts_one_call():
    A = torch.tensor([[[0.9, 0.1, 0.3], [0.2, 0.6, 0.0], [0.4, 0.5, 0.8]],
                      [[0.3, 0.7, 0.2], [0.6, 0.1, 0.9], [0.0, 0.4, 0.5]]], dtype=torch.float64)
    arm = Arm(name="mwu", reg="entropic", eta=0.35, schedule="sqrt", alternating=True)
    ux, uy = starts(2, 3, arm, 0.5, torch.Generator().manual_seed(3), "cpu")
    rec = KernelRecord("cpu")
    out = run_arm(arm, A, 0.02, 57, ux, uy, rec, every=4)
    ref = ftrl_run_reference(A, ux, uy, torch.full((2,), 0.35, dtype=torch.float64),
                             torch.full((2,), 0.02, dtype=torch.float64), 57, "entropic", "sqrt", True, 4)
    assert out["phi"].shape == (2, 14)                          # 57 // every
    for key in ("hit", "x", "y", "phi", "gap"):
        torch.testing.assert_close(out[key], ref[key], equal_nan=True)
    assert rec.entries["ftrl_run"]["calls"] == 1


@pytest.mark.parametrize("eps", [0.0, -0.1])
def test_run_arm_rejects_nonpositive_eps(eps):
    A = torch.eye(2, dtype=torch.float64)[None]
    z = torch.zeros(1, 2, dtype=torch.float64)
    with pytest.raises(GameError, match=rf"eps: must be > 0 \(got {eps}\)"):
        run_arm(Arm(name="a", reg="fp"), A, eps, 5, z, z, KernelRecord("cpu"))


def _gap_brute(T, a):
    best = T[a]
    for p in range(T.ndim):
        for dev in range(T.shape[p]):
            b = a[:p] + (dev,) + a[p + 1:]
            best = max(best, T[b])
    return float(best - T[a])


@pytest.mark.parametrize("shape", [(3, 3, 3), (2, 4), (2, 3, 2, 2)])
def test_multi_gap_is_the_largest_unilateral_gain(shape):
    T = np.random.default_rng(sum(shape)).random(shape)
    for a in itertools.product(*(range(m) for m in shape)):
        assert multi_gap(T, a) == pytest.approx(_gap_brute(T, a), abs=1e-15)


def _fp_brute(T, eps, cap):
    N, m = T.ndim, T.shape[0]
    U = [[0.0] * m for _ in range(N)]
    phis = []
    for t in range(1, cap + 1):
        a = tuple(max(range(m), key=lambda k: (U[p][k], -k)) for p in range(N))   # lowest index on ties
        phis.append(float(T[a]))
        if _gap_brute(T, a) <= eps:
            return t, phis
        for p in range(N):
            for k in range(m):
                U[p][k] += T[a[:p] + (k,) + a[p + 1:]]
    return -1, phis


@pytest.mark.parametrize("seed", range(6))
def test_fictitious_play_matches_a_loop_replay(seed):
    rng = np.random.default_rng(seed)
    T = rng.integers(0, 4, size=(3, 3, 3)).astype(float) / 3.0          # ties are common
    for eps in (0.0 + 1e-12, 1 / 3, 0.5):
        t, phis = multi_fp_hitting_time(T, eps, 40)
        tb, phib = _fp_brute(T, eps, 40)
        assert (t, phis) == (tb, phib)


def test_fictitious_play_eps_boundary_is_inclusive_and_cap_gives_minus_one():
    # 2 players, 2 actions: T[0,0]=0.3 is the first profile (uniform ties -> index 0); its gap is
    # max(T[1,0], T[0,1]) - T[0,0] = 0.75 - 0.3 = 0.45
    T = np.array([[0.3, 0.75], [0.5, 1.0]])
    assert multi_fp_hitting_time(T, 0.45, 10) == (1, [0.3])
    # just below the gap: simultaneous best responses to U = T[:,0] and T[0,:] give (1, 1), an exact NE
    assert multi_fp_hitting_time(T, 0.45 - 1e-9, 10) == (2, [0.3, 1.0])
    assert multi_fp_hitting_time(T, 0.45 - 1e-9, 1) == (-1, [0.3])


def test_fictitious_play_accepts_a_tensor_and_rejects_nonpositive_eps():
    T = torch.tensor([[0.3, 0.75], [0.5, 1.0]], dtype=torch.float64)
    assert multi_fp_hitting_time(T, 0.45, 10) == (1, [0.3])
    with pytest.raises(GameError, match=r"eps: must be > 0 \(got 0\)"):
        multi_fp_hitting_time(T.numpy(), 0, 10)


def test_fictitious_play_rejects_players_with_different_action_counts():
    with pytest.raises(GameError, match=r"payoffs: every player needs the same number of actions \(shape \(2, 3\)\)"):
        multi_fp_hitting_time(np.zeros((2, 3)), 0.1, 10)


def test_starts_and_run_arm_build_tensors_on_the_inputs_device(monkeypatch):
    """Tensors are created on the inputs' device with float64 / the games' dtype (the meta device shows a
    tensor that silently fell back to the CPU default)."""
    ux, uy = starts(2, 3, Arm(name="a", reg="fp"), 0.5, None, "meta")
    assert ux.device.type == uy.device.type == "meta" and ux.dtype == torch.float64
    seen = {}

    def spy(A, ux0, uy0, eta, eps, cap, reg, schedule, alternating, every=None, backend="auto"):
        seen.update(eta=eta, eps=eps, cap=cap, reg=reg, schedule=schedule, alternating=alternating, every=every,
                    backend=backend)
        return {}

    monkeypatch.setattr("stages.ftrl_potential.dynamics.ftrl_run", spy)
    A = torch.zeros(2, 3, 3, dtype=torch.float64, device="meta")   # not torch's default dtype (float32)
    run_arm(Arm(name="a", reg="logbarrier", eta=0.4, schedule="sqrt", alternating=True), A, 0.03, 9, ux, uy,
            KernelRecord("cpu"), every=3)
    for v in (seen["eta"], seen["eps"]):
        assert v.device.type == "meta" and v.dtype == torch.float64 and v.shape == (2,)
    assert (seen["cap"], seen["reg"], seen["schedule"], seen["alternating"], seen["every"]) == (
        9, "logbarrier", "sqrt", True, 3)
    assert seen["backend"] == KernelRecord("cpu").backend
