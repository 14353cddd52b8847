"""Optimizer-induced preconditioners read from the live optimizer state (OPUS step 3).

The effective update of sample z on a linear layer is u(z) = P·G(z); OPUS scores u, not G.

    SGD:    P = I,                           utility step η = lr
    AdamW:  P = C_t · diag(1/(√v̂ + ε)),     C_t = lr(1−β1)/(1−β1ᵗ),  v̂ = v/(1−β2ᵗ),   η = 1
            (C_t already carries lr, so the utility's η is 1 and both optimizers give
             U = lr⟨ĝ, ψ⟩ − lr²⟨ĝ, Σĝ⟩ in their own geometry)
    identity ablation ("OPUS-SGD" on an AdamW run): P = I, η = lr of the live optimizer.

Muon (P = κ_t(aI + bA + cA²)) is not implemented: the shared optimizer set has no Muon.
AdamW's decoupled weight decay does not depend on the data and is left out of u(z).
Before the first AdamW step v = 0 carries no information; the preconditioner falls back to P = I
with η = lr (recorded as kind "adamw-warmup-identity").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Preconditioner:
    diag: dict[str, torch.Tensor]  # layer name -> (d_out, d_in) diagonal of P
    eta: float                     # η of the utility U = η⟨φ,ψ⟩ − η²⟨φ,Φ⟩
    kind: str


def _group_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict:
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    raise ValueError("a scored linear weight is not in the optimizer's parameter groups")


def preconditioner_from_optimizer(optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                                  mode: str = "optimizer") -> Preconditioner:
    """P for each linear weight, from `optimizer`'s live state (mode "optimizer") or P = I ("identity")."""
    if mode not in ("optimizer", "identity"):
        raise ValueError(f"preconditioner mode: expected optimizer or identity (got {mode!r})")
    first = next(iter(weights.values()))
    lr = float(_group_of(optimizer, first)["lr"])
    ones = {name: torch.ones_like(w, dtype=torch.float32) for name, w in weights.items()}
    if mode == "identity" or isinstance(optimizer, torch.optim.SGD):
        # ALGO: SGD effective update, P = I (η = lr)
        return Preconditioner(ones, lr, "identity" if mode == "identity" else "sgd")
    if not isinstance(optimizer, (torch.optim.AdamW, torch.optim.Adam)):
        raise ValueError(f"no OPUS preconditioner for optimizer {type(optimizer).__name__} (SGD, Adam, AdamW)")
    diag = {}
    for name, w in weights.items():
        group = _group_of(optimizer, w)
        state = optimizer.state.get(w, {})
        if "exp_avg_sq" not in state:
            return Preconditioner(ones, lr, "adamw-warmup-identity")
        beta1, beta2 = group["betas"]
        t = float(state["step"])
        v_hat = state["exp_avg_sq"].float() / (1 - beta2 ** t)  # bias-corrected second moment
        c_next = group["lr"] * (1 - beta1) / (1 - beta1 ** (t + 1))  # weight of this step's g in m̂_{t+1}
        # ALGO: AdamW effective update, P = C_t · diag(1/(√v̂ + ε)), C_t = lr(1−β1)/(1−β1ᵗ)
        diag[name] = c_next / (v_hat.sqrt() + group["eps"])
    return Preconditioner(diag, 1.0, "adamw")
