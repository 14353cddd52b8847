"""OPUS selection, top to bottom, plus the random and high-loss baselines.

At each step, from a buffer of N candidates pick K:
  1. one forward+backward of the candidates and of a proxy batch (ghost capture: a, b per linear layer);
     optionally one combined pass for both, and optionally on a window of W tokens of each sequence
     (the official code scores a 512-token window of 2048-token sequences)
  2. φ_r(z) = Π_r(P_r · G_r(z))   for every linear layer r   (fused kernel, no per-sample gradients)
  3. ψ_r    = Π_r(mean raw proxy gradient)
  4. U_z    = η Σ_r⟨φ_r(z), ψ_r⟩ − η² Σ_r⟨φ_r(z), Φ_r⟩,   Φ_r = Σ of φ_r over already-selected samples
  5. K rounds: Boltzmann sampling p(z) ∝ exp(Ũ_z/τ) over the remaining candidates (Ũ = U standardized
     over them; the official code uses the raw U), or greedy argmax (ablation); Φ is updated after
     every pick. ``vectorized=True`` runs the same rounds without host synchronisation (Gumbel-max
     sampling on the device, masks instead of index lists).

Every tensor is created on the device of its inputs; the CountSketches are buffers of the scorer
module, so they move with the LightningModule that owns it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from kernels.ghost_countsketch import countsketch, ghost_countsketch, make_countsketch
from stages.opus.ghost import capture_linear_grads, linear_layers, per_sample_loss, summed_gradient
from stages.opus.precondition import Preconditioner


@dataclass
class Scored:
    phi: torch.Tensor          # (N, L·m) sketched effective updates
    psi: torch.Tensor          # (L·m,) sketched proxy gradient
    eta: float
    losses: torch.Tensor       # (N,) candidate losses (free by-product of the forward)
    info: dict = field(default_factory=dict)

    def alignment(self) -> torch.Tensor:
        """η⟨φ(z), ψ⟩: the utility without redundancy (the static OPUS score)."""
        return self.eta * (self.phi @ self.psi)


def token_windows(tokens: torch.Tensor, window: int, generator: torch.Generator | None) -> torch.Tensor:
    """A random contiguous window of `window` tokens from each sequence (official: score_len windows)."""
    n, t = tokens.shape
    if window >= t:
        return tokens
    starts = torch.randint(0, t - window + 1, (n, 1), generator=generator, device=tokens.device)
    return tokens.gather(1, starts + torch.arange(window, device=tokens.device))


class OpusScorer(nn.Module):
    """One CountSketch Π_r per linear layer of the model (fixed for the whole run), as buffers.

    The hashes are drawn by a CPU generator (the same sketch on every device) and then live on the
    scorer's device; ``.to(device)`` of an owning module moves them.
    """

    def __init__(self, model: nn.Module, sketch_size: int, seed: int):
        super().__init__()
        if sketch_size < 1:
            raise ValueError(f"sketch_size must be >= 1 (got {sketch_size})")
        self.m = sketch_size
        gen = torch.Generator().manual_seed(seed)
        self.layer_names = list(linear_layers(model))
        for i, mod in enumerate(linear_layers(model).values()):
            hashes, signs = make_countsketch(mod.out_features, mod.in_features, sketch_size, gen)
            self.register_buffer(f"hash_{i}", hashes.to(mod.weight.device), persistent=False)
            self.register_buffer(f"sign_{i}", signs.to(mod.weight.device), persistent=False)

    @property
    def sketches(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {name: (getattr(self, f"hash_{i}"), getattr(self, f"sign_{i}"))
                for i, name in enumerate(self.layer_names)}

    @staticmethod
    def weights(model: nn.Module) -> dict[str, torch.Tensor]:
        return {name: mod.weight for name, mod in linear_layers(model).items()}

    def score(self, model: nn.Module, candidates: torch.Tensor, proxy: torch.Tensor, precond: Preconditioner,
              backend: str = "auto", combined: bool = False, window: int | None = None,
              generator: torch.Generator | None = None,
              sketch_fn: Callable | None = None) -> Scored:
        """φ of every candidate and ψ of the proxy. `sketch_fn(a, b, D, h, s, m)` (e.g. a
        KernelRecord-counted wrapper) replaces the direct kernel call when given."""
        if window is not None:
            candidates = token_windows(candidates, window, generator)
            proxy = token_windows(proxy, window, generator)
        n = candidates.shape[0]
        if combined:  # ONE forward/backward for candidates and proxy (samples do not interact)
            losses, both = capture_linear_grads(model, torch.cat([candidates, proxy]))
            cand = {k: (a[:n], b[:n]) for k, (a, b) in both.items()}
            prox = {k: (a[n:], b[n:]) for k, (a, b) in both.items()}
            losses = losses[:n]
        else:
            losses, cand = capture_linear_grads(model, candidates)
            _, prox = capture_linear_grads(model, proxy)
        sketch = sketch_fn or (lambda *x: ghost_countsketch(*x, backend=backend))
        phis, psis = [], []
        for name, (hashes, signs) in self.sketches.items():
            a, b = cand[name]
            # ALGO: φ_r(z) = Π_r(P_r G_r(z)), G_r(z) = Σ_t b_t a_tᵀ  (fused kernel)
            phis.append(sketch(a, b, precond.diag[name], hashes, signs, self.m))
            pa, pb = prox[name]
            # ALGO: ψ_r = Π_r(mean raw proxy gradient)
            psis.append(countsketch(summed_gradient(pa, pb) / proxy.shape[0], hashes, signs, self.m))
        return Scored(torch.cat(phis, 1), torch.cat(psis), precond.eta, losses)


def standardize(u: torch.Tensor) -> torch.Tensor:
    sd = u.std(unbiased=False)
    return (u - u.mean()) / sd if sd > 0 else torch.zeros_like(u)


def select_opus(scored: Scored, k: int, tau: float, greedy: bool, generator: torch.Generator | None,
                eta_scale: float = 1.0, redundancy: bool = True, standardized: bool = True,
                vectorized: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """K picks with the redundancy penalty (off: ablation); returns (indices (K,), utility of each pick).

    standardized=False samples p ∝ exp(U/τ) on the raw utility, as the official code does."""
    n = scored.phi.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"K={k} must be in [1, N={n}]")
    # the optimizer steps on the mean gradient of the K picks, so one sample moves θ by P·G(z)/K:
    # the per-sample step of the utility is η = η_optimizer / K (η_optimizer: lr for P = I, 1 for AdamW)
    eta = scored.eta * eta_scale / k
    align = eta * (scored.phi @ scored.psi)   # η⟨φ(z), ψ⟩
    gram = scored.phi @ scored.phi.T          # ⟨φ(z), φ(z')⟩, so ⟨φ(z), Φ⟩ = Σ_{j∈S} gram[z, j]
    if vectorized:
        return _select_on_device(align, gram, eta, k, tau, greedy, generator, redundancy, standardized)
    dev = align.device
    penalty = torch.zeros(n, dtype=align.dtype, device=dev)
    available = torch.ones(n, dtype=torch.bool, device=dev)
    picks, utils = [], []
    for _ in range(k):
        # ALGO: U_z = η⟨φ(z),ψ⟩ − η²⟨φ(z),Φ⟩  (redundancy penalty over the selected set)
        util = align - eta ** 2 * penalty
        idx = available.nonzero().squeeze(1)
        u = util[idx]
        if greedy:
            j = int(torch.argmax(u))
        else:
            # ALGO: Boltzmann sampling p(z) ∝ exp(U_z/τ), U standardized over the remaining candidates
            probs = torch.softmax((standardize(u) if standardized else u) / tau, 0)
            j = int(torch.multinomial(probs, 1, generator=generator))
        pick = int(idx[j])
        picks.append(pick)
        utils.append(float(util[pick]))
        available[pick] = False
        if redundancy:
            penalty += gram[:, pick]  # Φ ← Φ + φ(pick)
    return torch.tensor(picks, device=dev), torch.tensor(utils, dtype=align.dtype, device=dev)


def _select_on_device(align, gram, eta, k, tau, greedy, generator, redundancy, standardized):
    """The same K rounds with no host synchronisation: Gumbel-max sampling (exact for a categorical),
    a mask of picked candidates, and Φ kept as a running tensor."""
    n, dev = align.shape[0], align.device
    taken = torch.zeros(n, dtype=torch.bool, device=dev)
    penalty = torch.zeros(n, dtype=align.dtype, device=dev)
    picks = torch.empty(k, dtype=torch.long, device=dev)
    utils = torch.empty(k, dtype=align.dtype, device=dev)
    if not greedy:
        u01 = torch.rand(k, n, generator=generator, device=dev, dtype=align.dtype).clamp_(1e-12, 1 - 1e-7)
        gumbel = -torch.log(-torch.log(u01))
    neg_inf = torch.tensor(float("-inf"), dtype=align.dtype, device=dev)
    for r in range(k):
        util = align - eta ** 2 * penalty  # ALGO: U_z = η⟨φ(z),ψ⟩ − η²⟨φ(z),Φ⟩
        if greedy:
            logits = util
        else:
            if standardized:
                free = (~taken).to(align.dtype)
                cnt = free.sum()
                mean = (util * free).sum() / cnt
                sd = (((util - mean) ** 2) * free).sum().div(cnt).sqrt()
                z = torch.where(sd > 0, (util - mean) / sd.clamp_min(1e-30), torch.zeros_like(util))
            else:
                z = util
            logits = z / tau + gumbel[r]  # ALGO: Boltzmann p ∝ exp(Ũ/τ) via Gumbel-max
        j = torch.where(taken, neg_inf, logits).argmax()
        picks[r] = j
        utils[r] = util[j]
        taken[j] = True
        if redundancy:
            penalty += gram.index_select(1, j.reshape(1)).squeeze(1)  # Φ ← Φ + φ(pick)
    return picks, utils


def redundancy_diagnostics(scored: Scored, picks: torch.Tensor, utils: torch.Tensor, k: int,
                           eta_scale: float = 1.0) -> dict[str, float]:
    """Size of the redundancy term against the alignment term over the K picks, and how many picks
    greedy selection changes when the penalty is removed (same scores)."""
    eta = scored.eta * eta_scale / k
    align = eta * (scored.phi @ scored.psi)
    red = align[picks] - utils  # η²⟨φ(pick), Φ before the pick⟩
    with_pen, _ = select_opus(scored, k, 1.0, True, None, eta_scale, True)
    without, _ = select_opus(scored, k, 1.0, True, None, eta_scale, False)
    changed = k - len(set(with_pen.tolist()) & set(without.tolist()))
    return {"redundancy_over_alignment": float(red.abs().mean() / align[picks].abs().mean().clamp_min(1e-30)),
            "greedy_picks_changed": float(changed),
            "raw_utility_sd": float(align.std())}


def select_random(n: int, k: int, generator: torch.Generator | None, device: torch.device | None = None
                  ) -> torch.Tensor:
    dev = device if device is not None else (generator.device if generator is not None else None)
    return torch.randperm(n, generator=generator, device=dev)[:k]


@torch.no_grad()
def select_high_loss(model: nn.Module, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """The K candidates with the highest loss (perplexity) under the current model."""
    was_training = model.training
    model.eval()
    losses = per_sample_loss(model, candidates)
    model.train(was_training)
    return torch.topk(losses, k).indices
