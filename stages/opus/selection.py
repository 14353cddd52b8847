"""OPUS selection, top to bottom, plus the random and high-loss baselines.

At each step, from a buffer of N candidates pick K:
  1. one forward+backward of the candidates and of a proxy batch (ghost capture: a, b per linear layer)
  2. φ_r(z) = Π_r(P_r · G_r(z))   for every linear layer r   (fused kernel, no per-sample gradients)
  3. ψ_r    = Π_r(mean raw proxy gradient)
  4. U_z    = η Σ_r⟨φ_r(z), ψ_r⟩ − η² Σ_r⟨φ_r(z), Φ_r⟩,   Φ_r = Σ of φ_r over already-selected samples
  5. K rounds: Boltzmann sampling p(z) ∝ exp(Ũ_z/τ) over the remaining candidates (Ũ = U standardized
     over them), or greedy argmax (ablation); Φ is updated after every pick.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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


class OpusScorer:
    """Holds one CountSketch Π_r per linear layer of the model (fixed for the whole run)."""

    def __init__(self, model: nn.Module, sketch_size: int, seed: int, backend: str = "auto"):
        if sketch_size < 1:
            raise ValueError(f"sketch_size must be >= 1 (got {sketch_size})")
        self.m = sketch_size
        self.backend = backend
        gen = torch.Generator().manual_seed(seed)
        self.sketches = {name: make_countsketch(mod.out_features, mod.in_features, sketch_size, gen,
                                                mod.weight.device)
                         for name, mod in linear_layers(model).items()}

    def weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {name: mod.weight for name, mod in linear_layers(model).items()}

    def score(self, model: nn.Module, candidates: torch.Tensor, proxy: torch.Tensor,
              precond: Preconditioner) -> Scored:
        losses, cand = capture_linear_grads(model, candidates)
        _, prox = capture_linear_grads(model, proxy)
        phis, psis = [], []
        for name, (hashes, signs) in self.sketches.items():
            a, b = cand[name]
            # ALGO: φ_r(z) = Π_r(P_r G_r(z)), G_r(z) = Σ_t b_t a_tᵀ  (fused kernel)
            phis.append(ghost_countsketch(a, b, precond.diag[name], hashes, signs, self.m, backend=self.backend))
            pa, pb = prox[name]
            # ALGO: ψ_r = Π_r(mean raw proxy gradient)
            psis.append(countsketch(summed_gradient(pa, pb) / proxy.shape[0], hashes, signs, self.m))
        return Scored(torch.cat(phis, 1), torch.cat(psis), precond.eta, losses)


def standardize(u: torch.Tensor) -> torch.Tensor:
    sd = u.std(unbiased=False)
    return (u - u.mean()) / sd if sd > 0 else torch.zeros_like(u)


def select_opus(scored: Scored, k: int, tau: float, greedy: bool, generator: torch.Generator | None,
                eta_scale: float = 1.0, redundancy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """K picks with the redundancy penalty (off: ablation); returns (indices (K,), utility of each pick)."""
    n = scored.phi.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"K={k} must be in [1, N={n}]")
    # the optimizer steps on the mean gradient of the K picks, so one sample moves θ by P·G(z)/K:
    # the per-sample step of the utility is η = η_optimizer / K (η_optimizer: lr for P = I, 1 for AdamW)
    eta = scored.eta * eta_scale / k
    align = eta * (scored.phi @ scored.psi)   # η⟨φ(z), ψ⟩
    gram = scored.phi @ scored.phi.T          # ⟨φ(z), φ(z')⟩, so ⟨φ(z), Φ⟩ = Σ_{j∈S} gram[z, j]
    penalty = torch.zeros(n, dtype=align.dtype)
    available = torch.ones(n, dtype=torch.bool)
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
            probs = torch.softmax(standardize(u) / tau, 0)
            j = int(torch.multinomial(probs, 1, generator=generator))
        pick = int(idx[j])
        picks.append(pick)
        utils.append(float(util[pick]))
        available[pick] = False
        if redundancy:
            penalty += gram[:, pick]  # Φ ← Φ + φ(pick)
    return torch.tensor(picks), torch.tensor(utils)


def select_random(n: int, k: int, generator: torch.Generator | None) -> torch.Tensor:
    return torch.randperm(n, generator=generator)[:k]


@torch.no_grad()
def select_high_loss(model: nn.Module, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """The K candidates with the highest loss (perplexity) under the current model."""
    was_training = model.training
    model.eval()
    losses = per_sample_loss(model, candidates)
    model.train(was_training)
    return torch.topk(losses, k).indices
