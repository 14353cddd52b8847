"""The OPUS baselines and the redundancy diagnostics in stages/opus/selection.py against brute force:
random picks replayed from the generator, high-loss picks from known losses (with the model put in eval
mode and restored), and the diagnostics rebuilt from a greedy selection written as plain loops."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.opus import selection
from stages.opus.selection import Scored, redundancy_diagnostics, select_high_loss, select_opus, select_random

PHI = np.array([[1.2, -0.4, 0.3], [1.1, -0.5, 0.2], [-0.7, 0.9, 1.4], [0.2, 1.3, -0.8], [1.0, -0.3, 0.4],
                [-1.5, 0.1, 0.6]])
PSI = np.array([0.8, -0.6, 1.1])


def _greedy_brute(phi, psi, eta, k, redundancy):
    """Greedy OPUS by its definition: U_z = eta<phi_z, psi> - eta^2 <phi_z, sum of picked phi>."""
    picks, utils, phi_sum = [], [], np.zeros(phi.shape[1])
    for _ in range(k):
        util = {z: eta * phi[z] @ psi - eta ** 2 * phi[z] @ phi_sum for z in range(len(phi)) if z not in picks}
        z = max(util, key=lambda i: (util[i], -i))
        picks.append(z)
        utils.append(util[z])
        if redundancy:
            phi_sum = phi_sum + phi[z]
    return picks, utils


def test_random_picks_are_the_generators_permutation_prefix():
    got = select_random(11, 4, torch.Generator().manual_seed(5))
    want = torch.randperm(11, generator=torch.Generator().manual_seed(5))[:4]
    assert torch.equal(got, want) and len(set(got.tolist())) == 4
    assert select_random(6, 6, torch.Generator().manual_seed(1)).sort().values.tolist() == list(range(6))
    assert select_random(9, 2, None, device="meta").device.type == "meta"


@pytest.mark.parametrize("start_training", [True, False])
def test_high_loss_picks_the_top_k_losses_in_eval_mode(monkeypatch, start_training):
    losses = torch.tensor([0.3, 2.5, 1.1, 2.4, 0.05, 1.9])
    modes = []

    def fake_loss(model, candidates):
        modes.append(model.training)
        assert candidates.shape == (6, 5)
        return losses

    monkeypatch.setattr(selection, "per_sample_loss", fake_loss)
    model = torch.nn.Linear(2, 2)
    model.train(start_training)
    got = select_high_loss(model, torch.zeros(6, 5, dtype=torch.long), 3)
    assert got.tolist() == [1, 3, 5]                             # 2.5 > 2.4 > 1.9
    assert modes == [False] and model.training is start_training


@pytest.mark.parametrize("k,eta_scale", [(3, 1.0), (4, 2.5)])
def test_redundancy_diagnostics_rebuilt_by_hand(k, eta_scale):
    scored = Scored(phi=torch.tensor(PHI), psi=torch.tensor(PSI), eta=1.7, losses=torch.zeros(6))
    picks, utils = select_opus(scored, k, 1.0, True, None, eta_scale, True)
    eta = 1.7 * eta_scale / k
    want_with, want_utils = _greedy_brute(PHI, PSI, eta, k, True)
    assert picks.tolist() == want_with and utils.numpy() == pytest.approx(want_utils, rel=1e-12)
    want_without, _ = _greedy_brute(PHI, PSI, eta, k, False)
    d = redundancy_diagnostics(scored, picks, utils, k, eta_scale)
    align = eta * PHI @ PSI
    red = align[want_with] - np.array(want_utils)
    assert d["redundancy_over_alignment"] == pytest.approx(np.abs(red).mean() / np.abs(align[want_with]).mean(),
                                                           rel=1e-12)
    assert d["greedy_picks_changed"] == k - len(set(want_with) & set(want_without))
    assert d["raw_utility_sd"] == pytest.approx(np.std(align, ddof=1), rel=1e-12)


def test_redundancy_changes_greedy_picks_on_near_duplicates():
    """Rows 0, 1 and 4 are near-duplicates with the best alignment: with the penalty the second pick leaves
    that cluster; without it greedy takes the cluster (hand-checked with the brute force above)."""
    scored = Scored(phi=torch.tensor(PHI), psi=torch.tensor(PSI), eta=6.0, losses=torch.zeros(6))
    d = redundancy_diagnostics(scored, *select_opus(scored, 2, 1.0, True, None, 1.0, True), 2)
    with_pen, _ = _greedy_brute(PHI, PSI, 3.0, 2, True)
    without, _ = _greedy_brute(PHI, PSI, 3.0, 2, False)
    assert with_pen != without and d["greedy_picks_changed"] >= 1
    assert d["redundancy_over_alignment"] > 0
