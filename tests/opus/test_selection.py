"""Preconditioners read from live optimizer state; OPUS utility, redundancy penalty, Boltzmann vs greedy."""
from __future__ import annotations

import pytest
import torch

from kernels.testing import assert_close
from stages.opus.precondition import preconditioner_from_optimizer
from stages.opus.selection import Scored, select_opus


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Tanh(), torch.nn.Linear(6, 3, bias=False))


def _weights(net):
    return {"0": net[0].weight, "2": net[2].weight}


def _steps(net, opt, n):
    for _ in range(n):
        opt.zero_grad()
        net(torch.randn(8, 4)).pow(2).sum().backward()
        opt.step()


def test_adamw_preconditioner_is_bias_corrected_inverse_rms_times_ct():
    net = _net()
    lr, (b1, b2), eps = 0.01, (0.8, 0.95), 1e-6
    opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(b1, b2), eps=eps)
    pre = preconditioner_from_optimizer(opt, _weights(net))
    assert pre.kind == "adamw-warmup-identity" and pre.eta == lr  # v = 0 before the first step
    _steps(net, opt, 3)
    pre = preconditioner_from_optimizer(opt, _weights(net))
    assert pre.kind == "adamw" and pre.eta == 1.0
    v = opt.state[net[0].weight]["exp_avg_sq"]
    want = lr * (1 - b1) / (1 - b1 ** 4) / ((v / (1 - b2 ** 3)).sqrt() + eps)
    assert_close(pre.diag["0"], want, 1e-7, 1e-6)
    # the preconditioned update of the next step, for a gradient g, is what AdamW would add from g
    g = torch.randn_like(net[0].weight)
    m_prev = opt.state[net[0].weight]["exp_avg"]
    v_next = b2 * v + (1 - b2) * g ** 2
    step_from_g = lr * ((1 - b1) * g / (1 - b1 ** 4)) / ((v_next / (1 - b2 ** 4)).sqrt() + eps)
    approx = pre.diag["0"] * g  # uses v_t in place of v_{t+1}: equal when g does not move v much
    assert torch.corrcoef(torch.stack([approx.flatten(), step_from_g.flatten()]))[0, 1] > 0.9
    assert m_prev.shape == g.shape


def test_sgd_and_identity_preconditioners():
    net = _net()
    sgd = torch.optim.SGD(net.parameters(), lr=0.2)
    pre = preconditioner_from_optimizer(sgd, _weights(net))
    assert pre.kind == "sgd" and pre.eta == 0.2 and all((d == 1).all() for d in pre.diag.values())
    adam = torch.optim.AdamW(net.parameters(), lr=0.05)
    _steps(net, adam, 2)
    ident = preconditioner_from_optimizer(adam, _weights(net), "identity")
    assert ident.kind == "identity" and ident.eta == 0.05 and all((d == 1).all() for d in ident.diag.values())
    with pytest.raises(ValueError, match="no OPUS preconditioner"):
        preconditioner_from_optimizer(torch.optim.RMSprop(net.parameters()), _weights(net))


def _scored(phi, psi, eta=1.0):
    return Scored(phi=phi, psi=psi, eta=eta, losses=torch.zeros(len(phi)))


def test_greedy_without_redundancy_picks_top_alignment():
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(20, 8, generator=gen) * 1e-4  # tiny φ: the η²⟨φ,Φ⟩ penalty is negligible
    psi = torch.randn(8, generator=gen) * 1e4
    picks, _ = select_opus(_scored(phi, psi), 5, 0.9, greedy=True, generator=None)
    assert set(picks.tolist()) == set(torch.topk(phi @ psi, 5).indices.tolist())


def test_redundancy_penalty_avoids_duplicates():
    # candidates 0,1,2 are the same high-alignment update; 3 is slightly less aligned and orthogonal to them
    phi = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.9], [-1.0, 0.0]])
    psi = torch.tensor([1.0, 1.0])
    # K = 2 -> per-sample step eta = 2/2 = 1: U = <φ,ψ> - <φ,Φ>
    picks, utils = select_opus(_scored(phi, psi, eta=2.0), 2, 0.9, greedy=True, generator=None)
    assert picks[0].item() in (0, 1, 2) and picks[1].item() == 3
    no_penalty, _ = select_opus(_scored(phi, psi, eta=2.0), 2, 0.9, greedy=True, generator=None, redundancy=False)
    assert set(no_penalty.tolist()) <= {0, 1, 2}  # without the penalty the duplicates win
    assert utils[1] < utils[0]


def test_selection_returns_k_distinct_and_low_temperature_is_greedy():
    gen = torch.Generator().manual_seed(3)
    phi, psi = torch.randn(16, 6, generator=gen), torch.randn(6, generator=gen)
    picks, _ = select_opus(_scored(phi, psi), 16, 0.9, greedy=False, generator=gen)
    assert sorted(picks.tolist()) == list(range(16))
    cold, _ = select_opus(_scored(phi, psi), 6, 1e-4, greedy=False, generator=gen)
    greedy, _ = select_opus(_scored(phi, psi), 6, 0.9, greedy=True, generator=None)
    assert cold.tolist() == greedy.tolist()
    with pytest.raises(ValueError, match="K=17"):
        select_opus(_scored(phi, psi), 17, 0.9, greedy=True, generator=None)
