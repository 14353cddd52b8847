"""OPUS selection and scoring against independent brute force (issue 33):

- the device sampler replayed in numpy from the same uniform draws (Gumbel-max over the remaining
  candidates, utilities standardized over the remaining ones, Φ of every earlier pick);
- the loop sampler's pick frequencies against hard-coded Boltzmann probabilities;
- φ and ψ of the scorer against per-sample gradients from torch.func and a loop CountSketch.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from stages.opus.ghost import per_sample_loss
from stages.opus.precondition import Preconditioner
from stages.opus.selection import OpusScorer, Scored, select_opus, standardize, token_windows

RNG = np.random.default_rng(7)
PHI = RNG.normal(0.0, 1.7, (7, 3))
PSI = np.array([0.9, -1.4, 2.2])


def _scored(phi=PHI, psi=PSI, eta=2.6):
    return Scored(phi=torch.tensor(phi), psi=torch.tensor(psi), eta=eta, losses=torch.zeros(len(phi)))


def _brute_device_sampler(phi, psi, eta, k, tau, u01, standardized, redundancy):
    """The K rounds from their definition, with the uniforms the device sampler draws."""
    n = len(phi)
    align = eta * phi @ psi
    gram = phi @ phi.T
    gumbel = -np.log(-np.log(np.clip(u01, 1e-12, 1 - 1e-7)))
    taken, phi_sum_dot = [], np.zeros(n)
    picks, utils = [], []
    for r in range(k):
        util = align - eta ** 2 * phi_sum_dot
        rest = [i for i in range(n) if i not in taken]
        u = util[rest]
        z = (u - u.mean()) / u.std() if standardized else u      # population s.d. over the remaining
        j = rest[int(np.argmax(z / tau + gumbel[r, rest]))]
        picks.append(j)
        utils.append(util[j])
        taken.append(j)
        if redundancy:
            phi_sum_dot = phi_sum_dot + gram[:, j]
    return picks, utils


@pytest.mark.parametrize("standardized,redundancy,tau", [(True, True, 0.7), (False, True, 3.5), (True, False, 1.9)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_device_sampler_replays_in_numpy(standardized, redundancy, tau, seed):
    k, eta_scale = 4, 1.5
    eta = 2.6 * eta_scale / k
    got, utils = select_opus(_scored(), k, tau, greedy=False, generator=torch.Generator().manual_seed(seed),
                             eta_scale=eta_scale, redundancy=redundancy, standardized=standardized, vectorized=True)
    u01 = torch.rand(k, len(PHI), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).numpy()
    picks, want = _brute_device_sampler(PHI, PSI, eta, k, tau, u01, standardized, redundancy)
    assert got.tolist() == picks
    np.testing.assert_allclose(utils.numpy(), want, rtol=1e-12, atol=1e-12)


def test_loop_sampler_frequencies_match_boltzmann():
    # utilities U = η⟨φ,ψ⟩ with η = 1.2·1/1 (K = 1): standardized, then p ∝ exp(z/τ), τ = 0.8
    phi = np.array([[1.0], [2.0], [4.0], [-1.0]])
    psi = np.array([1.0])
    u = 1.2 * phi[:, 0]
    z = (u - u.mean()) / u.std()
    p = np.exp(z / 0.8) / np.exp(z / 0.8).sum()
    for vectorized in (False, True):
        g = torch.Generator().manual_seed(11)
        counts = np.zeros(4)
        for _ in range(3000):
            j, _ = select_opus(_scored(phi, psi, 1.2), 1, 0.8, greedy=False, generator=g, vectorized=vectorized)
            counts[int(j)] += 1
        se = np.sqrt(p * (1 - p) / 3000)
        assert np.all(np.abs(counts / 3000 - p) < 4.5 * se), (vectorized, counts / 3000, p)
    # the raw (official) sampler on the same utilities: p ∝ exp(U/τ)
    q = np.exp(u / 0.8) / np.exp(u / 0.8).sum()
    g = torch.Generator().manual_seed(12)
    counts = np.zeros(4)
    for _ in range(3000):
        j, _ = select_opus(_scored(phi, psi, 1.2), 1, 0.8, greedy=False, generator=g, standardized=False)
        counts[int(j)] += 1
    assert np.all(np.abs(counts / 3000 - q) < 4.5 * np.sqrt(q * (1 - q) / 3000) + 1e-3), (counts / 3000, q)


def test_loop_greedy_utilities_and_k_bounds():
    k, eta = 3, 2.6 * 0.7 / 3
    picks, utils = select_opus(_scored(), k, 1.0, greedy=True, generator=None, eta_scale=0.7)
    # brute force greedy
    align, gram = eta * PHI @ PSI, PHI @ PHI.T
    pen, taken, want_p, want_u = np.zeros(len(PHI)), [], [], []
    for _ in range(k):
        util = align - eta ** 2 * pen
        j = max((i for i in range(len(PHI)) if i not in taken), key=lambda i: util[i])
        want_p.append(j), want_u.append(util[j]), taken.append(j)
        pen = pen + gram[:, j]
    assert picks.tolist() == want_p
    np.testing.assert_allclose(utils.numpy(), want_u, rtol=1e-12)
    assert sorted(select_opus(_scored(), 7, 1.0, True, None)[0].tolist()) == list(range(7))  # K = N allowed
    for bad in (0, 8):
        with pytest.raises(ValueError) as err:
            select_opus(_scored(), bad, 1.0, True, None)
        assert str(err.value) == f"K={bad} must be in [1, N=7]"


def test_standardize_population_sd_and_constant_input():
    u = torch.tensor([1.0, 2.0, 4.0, 9.0], dtype=torch.float64)
    mean, sd = 4.0, math.sqrt(((1 - 4) ** 2 + (2 - 4) ** 2 + 0 + (9 - 4) ** 2) / 4)
    np.testing.assert_allclose(standardize(u).numpy(), [(x - mean) / sd for x in (1, 2, 4, 9)], rtol=1e-14)
    assert torch.equal(standardize(torch.full((3,), 2.5)), torch.zeros(3))


def test_token_windows_cover_every_start_and_leave_short_sequences():
    toks = torch.arange(600 * 7).reshape(600, 7)
    w = token_windows(toks, 5, torch.Generator().manual_seed(4))
    starts = (w[:, 0] - torch.arange(600) * 7)
    assert set(starts.tolist()) == {0, 1, 2}                      # every start in [0, T − W], no other
    assert torch.equal(w - w[:, :1], torch.arange(5).expand(600, 5))
    assert token_windows(toks, 7, None) is toks and token_windows(toks, 9, None) is toks
    one = token_windows(toks, 6, torch.Generator().manual_seed(0))
    assert one.shape == (600, 6)


def _model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Embedding(9, 5), torch.nn.Linear(5, 6, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(6, 9, bias=False)).double()


def _loop_countsketch(mat, hashes, signs, m):
    out = np.zeros(m)
    for (i, j), v in np.ndenumerate(mat):
        out[int(hashes[i, j])] += float(signs[i, j]) * v
    return out


def test_scorer_phi_psi_match_per_sample_gradients_and_loop_sketch():
    model = _model()
    scorer = OpusScorer(model, 4, seed=9)
    names = list(scorer.layer_names)
    params = {n: p.detach() for n, p in model.named_parameters()}
    diag = {n: torch.rand(mod.weight.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64) * 2 + 0.3
            for i, (n, mod) in enumerate(zip(names, [model[1], model[3]]))}
    pre = Preconditioner(diag=diag, eta=0.37, kind="test")
    cand = torch.randint(0, 9, (4, 6), generator=torch.Generator().manual_seed(1))
    prox = torch.randint(0, 9, (3, 6), generator=torch.Generator().manual_seed(2))
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        from kernels.ghost_countsketch import ghost_countsketch
        return ghost_countsketch(*args, backend="torch")

    sc = scorer.score(model, cand, prox, pre, backend="torch", sketch_fn=counted)
    assert len(calls) == 2 and sc.eta == 0.37

    def loss_one(p, toks):
        return per_sample_loss(lambda x: functional_call(model, p, (x,)), toks[None])[0]

    per = vmap(grad(loss_one), in_dims=(None, 0))(params, cand)           # per-sample gradients
    mean_proxy = {n: torch.stack([grad(loss_one)(params, t)[n] for t in prox]).mean(0) for n in params}
    key = {names[0]: "1.weight", names[1]: "3.weight"}
    sketches = scorer.sketches
    m = 4
    for li, name in enumerate(names):
        h, s = (x.numpy() for x in sketches[name])
        for z in range(4):
            want = _loop_countsketch((diag[name] * per[key[name]][z]).numpy(), h, s, m)
            np.testing.assert_allclose(sc.phi[z, li * m:(li + 1) * m].numpy(), want, rtol=1e-4, atol=1e-6)
        want_psi = _loop_countsketch(mean_proxy[key[name]].numpy(), h, s, m)
        np.testing.assert_allclose(sc.psi[li * m:(li + 1) * m].numpy(), want_psi, rtol=1e-6, atol=1e-9)
    want_losses = torch.stack([loss_one(params, t) for t in cand])
    np.testing.assert_allclose(sc.losses.numpy(), want_losses.detach().numpy(), rtol=1e-6)  # CE in float32
    same = Scored(phi=sc.phi.double(), psi=sc.psi, eta=sc.eta, losses=sc.losses)  # the kernel's φ is float32
    np.testing.assert_allclose(same.alignment().numpy(), 0.37 * sc.phi.double().numpy() @ sc.psi.numpy(), rtol=1e-12)


def test_scorer_window_scores_the_windowed_tokens():
    model = _model()
    scorer = OpusScorer(model, 4, seed=9)
    pre = Preconditioner(diag={n: torch.ones(mod.weight.shape, dtype=torch.float64)
                               for n, mod in zip(scorer.layer_names, [model[1], model[3]])}, eta=1.3, kind="t")
    cand = torch.randint(0, 9, (4, 10), generator=torch.Generator().manual_seed(1))
    prox = torch.randint(0, 9, (3, 10), generator=torch.Generator().manual_seed(2))
    got = scorer.score(model, cand, prox, pre, backend="torch", window=4, generator=torch.Generator().manual_seed(8))
    g = torch.Generator().manual_seed(8)
    wc, wp = token_windows(cand, 4, g), token_windows(prox, 4, g)   # candidates first, then the proxy
    want = scorer.score(model, wc, wp, pre, backend="torch")
    torch.testing.assert_close(got.phi, want.phi)
    torch.testing.assert_close(got.psi, want.psi)
    torch.testing.assert_close(got.losses, want.losses)


def test_scorer_init_sketch_per_layer_and_seed():
    model = _model()
    with pytest.raises(ValueError) as err:
        OpusScorer(model, 0, seed=1)
    assert str(err.value) == "sketch_size must be >= 1 (got 0)"
    a, b, c = OpusScorer(model, 5, seed=1), OpusScorer(model, 5, seed=1), OpusScorer(model, 5, seed=2)
    assert a.m == 5 and a.layer_names == ["1", "3"]
    ha, hb, hc = a.sketches, b.sketches, c.sketches
    assert ha["1"][0].shape == (6, 5) and ha["3"][0].shape == (9, 6)           # (d_out, d_in) per layer
    assert all(torch.equal(ha[n][0], hb[n][0]) and torch.equal(ha[n][1], hb[n][1]) for n in ha)
    assert not torch.equal(ha["1"][0], hc["1"][0])
    assert not torch.equal(ha["1"][0][:5, :5], ha["3"][0][:5, :5])             # each layer its own draw
    assert int(ha["1"][0].min()) >= 0 and int(ha["1"][0].max()) <= 4
    assert set(ha["3"][1].unique().tolist()) == {-1.0, 1.0}
    assert a.state_dict() == {} or all("hash" not in k for k in a.state_dict())  # not persistent
