"""Selection and preconditioning with non-unit parameters and hard-coded expectations (issue 33)."""
from __future__ import annotations

import pytest
import torch

from stages.opus.precondition import preconditioner_from_optimizer
from stages.opus.selection import OpusScorer, Scored, select_opus, token_windows


def _scored(phi, psi, eta):
    phi, psi = torch.as_tensor(phi, dtype=torch.float64), torch.as_tensor(psi, dtype=torch.float64)
    return Scored(phi=phi, psi=psi, eta=eta, losses=torch.zeros(len(phi)))


# η = eta·eta_scale/K = 2.6·1.5/3 = 1.3, η² = 1.69. Worked by hand (U = η⟨φ,ψ⟩ − η²⟨φ,Φ⟩):
# round 1: U = [1.3, -3.9, 5.2, -7.8, 1.3] -> 2; round 2: [-2.08, 1.17, -, 2.34, 2.99] -> 4;
# round 3 (Φ = φ2 + φ4): [-0.39, 1.17, -, 2.34, -] -> 3. With only the LAST pick's penalty round 3
# would pick 0; with η instead of η², or without the penalty, the picks differ too.
PHI = [[0.0, 1.0], [-1.0, -1.0], [1.0, 2.0], [-2.0, -2.0], [1.0, -1.0]]
PSI = [2.0, 1.0]


@pytest.mark.parametrize("vectorized", [False, True])
def test_greedy_uses_redundancy_of_all_earlier_picks(vectorized):
    picks, utils = select_opus(_scored(PHI, PSI, 2.6), 3, 0.9, greedy=True, generator=None, eta_scale=1.5,
                               vectorized=vectorized)
    assert picks.tolist() == [2, 4, 3]
    assert utils.tolist() == pytest.approx([5.2, 2.99, 2.34])
    no_pen, _ = select_opus(_scored(PHI, PSI, 2.6), 3, 0.9, greedy=True, generator=None, eta_scale=1.5,
                            redundancy=False, vectorized=vectorized)
    assert no_pen.tolist() == [2, 0, 4]


def test_adamw_preconditioner_hard_coded_state():
    w = torch.nn.Parameter(torch.zeros(1, 2))
    opt = torch.optim.AdamW([w], lr=0.1, betas=(0.5, 0.75), eps=1e-3)
    w.grad = torch.ones(1, 2)
    opt.step()
    opt.state[w]["exp_avg_sq"] = torch.tensor([[0.04, 0.25]])
    opt.state[w]["step"] = torch.tensor(3.0)
    pre = preconditioner_from_optimizer(opt, {"w": w})
    # C = 0.1·0.5/(1−0.5⁴) = 0.053333; v̂ = v/(1−0.75³); D = C/(√v̂ + 1e-3)
    assert pre.kind == "adamw" and pre.eta == 1.0
    assert pre.diag["w"].flatten().tolist() == pytest.approx([0.2019908, 0.0809804], rel=1e-5)


def test_sgd_preconditioner_eta_is_lr():
    w = torch.nn.Parameter(torch.zeros(2, 3))
    pre = preconditioner_from_optimizer(torch.optim.SGD([w], lr=0.37), {"w": w})
    assert pre.kind == "sgd" and pre.eta == 0.37 and (pre.diag["w"] == 1).all()


def _first_pick_freq(scored, tau, standardized, vectorized, trials=3000):
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(len(scored.phi))
    for _ in range(trials):
        p, _ = select_opus(scored, 1, tau, False, gen, standardized=standardized, vectorized=vectorized)
        counts[p[0]] += 1
    return counts / trials


@pytest.mark.parametrize("vectorized", [False, True])
def test_boltzmann_first_pick_hard_coded(vectorized):
    # U = [0, 1, 2, 4] (K = 1, η = 1): standardized z = (U − 1.75)/1.479; softmax(z/0.9), computed by hand
    want = torch.tensor([0.035973, 0.07625, 0.161623, 0.726154])
    freq = _first_pick_freq(_scored([[0.0], [1.0], [2.0], [4.0]], [1.0], 1.0), 0.9, True, vectorized)
    assert (freq - want).abs().max() < 0.03, freq


@pytest.mark.parametrize("vectorized", [False, True])
def test_official_raw_sampler_is_uniform_on_tiny_utilities(vectorized):
    freq = _first_pick_freq(_scored([[0.0], [1.0], [2.0], [4.0]], [1e-4], 1.0), 0.9, False, vectorized)
    assert (freq - 0.25).abs().max() < 0.04, freq
    # and on large raw utilities (U = [0, 2, 4, 8]) it concentrates: softmax(U/0.9)[3] = 0.98702
    freq = _first_pick_freq(_scored([[0.0], [1.0], [2.0], [4.0]], [2.0], 1.0), 0.9, False, vectorized, 2000)
    assert abs(freq[3] - 0.98702) < 0.015, freq


def test_vectorized_matches_loop_greedy_on_random_scores():
    gen = torch.Generator().manual_seed(5)
    phi, psi = torch.randn(40, 6, generator=gen), torch.randn(6, generator=gen)
    for eta, k in ((0.7, 9), (3.0, 20)):
        a, ua = select_opus(Scored(phi, psi, eta, torch.zeros(40)), k, 0.9, True, None)
        b, ub = select_opus(Scored(phi, psi, eta, torch.zeros(40)), k, 0.9, True, None, vectorized=True)
        assert a.tolist() == b.tolist()
        torch.testing.assert_close(ua, ub)
    gen2 = torch.Generator().manual_seed(2)
    picks, _ = select_opus(Scored(phi, psi, 1.0, torch.zeros(40)), 40, 0.9, False, gen2, vectorized=True)
    assert sorted(picks.tolist()) == list(range(40))


def test_token_windows_are_contiguous_slices():
    toks = torch.arange(5 * 12).reshape(5, 12)
    w = token_windows(toks, 4, torch.Generator().manual_seed(0))
    assert w.shape == (5, 4)
    assert ((w[:, 1:] - w[:, :-1]) == 1).all() and ((w // 12) == torch.arange(5)[:, None]).all()
    assert token_windows(toks, 12, None) is toks


def test_scorer_sketches_are_buffers_that_move_and_combined_equals_separate():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 8, bias=False), torch.nn.Tanh(),
                                torch.nn.Linear(8, 11, bias=False))
    scorer = OpusScorer(model, 7, seed=3)
    assert len(dict(scorer.named_buffers())) == 4
    holder = torch.nn.Module()
    holder.scorer = OpusScorer(model, 7, seed=3)
    holder.to("meta")
    assert all(b.device.type == "meta" for b in holder.buffers())
    w = OpusScorer.weights(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    pre = preconditioner_from_optimizer(opt, w)
    cand, prox = torch.randint(0, 11, (5, 9)), torch.randint(0, 11, (3, 9))
    sep = scorer.score(model, cand, prox, pre, backend="torch")
    comb = scorer.score(model, cand, prox, pre, backend="torch", combined=True)
    torch.testing.assert_close(sep.phi, comb.phi, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sep.psi, comb.psi, rtol=1e-5, atol=1e-6)
