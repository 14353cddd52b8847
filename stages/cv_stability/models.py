"""The model families, fitted from Gram statistics so that many (rep, fold) fits run batched.

    OLS:     β̂ = (XᵀX)⁻¹ Xᵀy
    ST:      β̂_ST = S_λ(β̂_OLS),  λ_n = c_ST / √n         (soft-thresholded OLS)
    Lasso:   argmin 1/(2m)‖y − Xβ‖² + α_n‖β‖₁,  α_n = c_L / √n   (scikit-learn scaling; m = training size)

The Lasso runs through kernels.batched_lasso with the backend the calling stage's KernelRecord
chose (Triton on CUDA, the vectorised torch reference on CPU); the stage records which path ran. Contrasts are what CV inference is run on: a single model (its loss)
or a comparison (loss of A minus loss of B, point by point).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.batched_lasso import batched_lasso, soft_threshold

MODELS = ("ols", "st_low", "st_high", "lasso")
# name -> (model A, model B or None for a single model)
CONTRASTS: dict[str, tuple[str, str | None]] = {
    "ols": ("ols", None),
    "st_low": ("st_low", None),
    "st_high": ("st_high", None),
    "lasso": ("lasso", None),
    "st_vs_ols": ("st_low", "ols"),
    "lasso_vs_ols": ("lasso", "ols"),
    "st_high_vs_st_low": ("st_high", "st_low"),
}
SINGLES = tuple(c for c, (_, b) in CONTRASTS.items() if b is None)
COMPARISONS = tuple(c for c, (_, b) in CONTRASTS.items() if b is not None)


@dataclass(frozen=True)
class Penalties:
    """Penalty constants c: threshold/penalty at sample size n is c / √n."""

    st_low: float
    st_high: float
    lasso: float

    def at(self, n: int) -> dict[str, float]:
        return {"st_low": self.st_low / math.sqrt(n), "st_high": self.st_high / math.sqrt(n),
                "lasso": self.lasso / math.sqrt(n)}


def fit_models(gram: torch.Tensor, xty: torch.Tensor, m: torch.Tensor | float, lam: dict[str, float],
               tol: float, max_iter: int, backend: str = "auto") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Fit every model on every problem. gram (..., d, d) = XᵀX, xty (..., d) = Xᵀy of each training
    set, m its size (scalar or broadcastable to gram.shape[:-2]). Returns ({model: β̂ (..., d)},
    Lasso iteration counts (...))."""
    batch, d = xty.shape[:-1], xty.shape[-1]
    ols = torch.linalg.solve(gram, xty[..., None])[..., 0]  # (XᵀX)⁻¹ Xᵀy
    m = torch.as_tensor(m, dtype=gram.dtype, device=gram.device)
    m = m.expand(batch)[..., None]
    lasso, iters = batched_lasso((gram / m[..., None]).reshape(-1, d, d), (xty / m).reshape(-1, d),
                                 lam["lasso"], tol=tol, max_iter=max_iter, backend=backend, return_iters=True)
    coefs = {
        "ols": ols,
        "st_low": soft_threshold(ols, torch.tensor(lam["st_low"], dtype=ols.dtype, device=ols.device)),
        "st_high": soft_threshold(ols, torch.tensor(lam["st_high"], dtype=ols.dtype, device=ols.device)),
        "lasso": lasso.reshape(*batch, d),
    }
    return coefs, iters.reshape(batch)
