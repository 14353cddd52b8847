"""Geometry of the unembedding matrix W_U (V, C) and of final-layer representations H (N, C).

    erank(W)              # Roy & Vetterli effective rank, p_k = σ_k / Σσ_j   (the paper's R(W))
    erank(W, "sigma2")    # σ²-normalized variant, p_k = σ_k² / Σσ_j²
    mean_cosine(W)        # mean pairwise cosine similarity of the rows
    isotropy(W)           # I(W) = min_u Z(u) / max_u Z(u), u over eigenvectors of WᵀW (Mu & Viswanath)
"""
from __future__ import annotations

from typing import Literal

import torch


def singular_values(w: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(w.detach().double())


def erank(w: torch.Tensor, kind: Literal["sigma", "sigma2"] = "sigma") -> float:
    """exp of the Shannon entropy of the normalized singular-value distribution."""
    if kind not in ("sigma", "sigma2"):
        raise ValueError(f"kind: must be 'sigma' or 'sigma2' (got {kind!r})")
    s = singular_values(w)
    s = s.pow(2) if kind == "sigma2" else s
    if float(s.sum()) <= 0:
        return 0.0
    p = s / s.sum()                          # ALGO: p_k = σ_k / Σ_j σ_j  (σ² for the variant)
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))  # ALGO: R(W) = exp(−Σ_k p_k log p_k)


def erank_pct(w: torch.Tensor, kind: Literal["sigma", "sigma2"] = "sigma") -> float:
    """Effective rank as % of the maximal rank min(V, C), the paper's reporting unit."""
    return 100.0 * erank(w, kind) / min(w.shape)


def mean_cosine(w: torch.Tensor) -> float:
    """Mean cosine similarity over distinct row pairs."""
    x = torch.nn.functional.normalize(w.detach().double(), dim=-1)
    n = x.shape[0]
    g = x @ x.T
    return float((g.sum() - g.diagonal().sum()) / (n * (n - 1)))


def isotropy(w: torch.Tensor) -> float:
    """I(W) = min_u Z(u) / max_u Z(u) with Z(u) = Σ_i exp(uᵀ w_i), u the eigenvectors of WᵀW.
    1 = perfectly isotropic; → 0 when the rows share a dominant direction."""
    x = w.detach().double()
    _, vecs = torch.linalg.eigh(x.T @ x)    # (C, C) columns = eigenvectors
    z = torch.logsumexp(x @ vecs, dim=0)     # log Z(u) per eigenvector (stable)
    return float(torch.exp(z.min() - z.max()))


def geometry(w: torch.Tensor, h: torch.Tensor | None = None) -> dict[str, float]:
    """Every metric of W_U, and (given H) the same of the final-layer representations."""
    out = {"erank": erank_pct(w), "erank_sq": erank_pct(w, "sigma2"),
           "cosine": mean_cosine(w), "isotropy": isotropy(w)}
    if h is not None:
        out.update({"h_erank": erank_pct(h), "h_erank_sq": erank_pct(h, "sigma2"),
                    "h_cosine": mean_cosine(h), "h_isotropy": isotropy(h)})
    return out
