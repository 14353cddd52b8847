"""Ghost technique: per-sample gradient information of linear layers from their inputs and output grads.

For a linear layer y = W a (no bias), one sample z with inputs a_t (d_in) and output gradients
b_t = ∂L_z/∂y_t (d_out) at positions t has the weight gradient

    G(z) = Σ_t b_t a_tᵀ                                        # (d_out, d_in), never formed here

and inner products need only a and b ("ghost" inner products):

    ⟨G(z), G(z')⟩ = Σ_{t,s} (a_t · a'_s)(b_t · b'_s)           # ghost_gram
    ⟨G(z), M⟩     = Σ_t b_tᵀ M a_t                              # ghost_dot

``capture_linear_grads`` runs one forward + one backward of the per-sample losses of a batch
through forward hooks on every nn.Linear and returns {layer: (a, b)}, without touching .grad.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear of the model, by qualified name (the layers OPUS scores)."""
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, nn.Linear)}


@contextmanager
def hooked_linears(model: nn.Module) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Forward hooks keeping each linear layer's input a (detached) and output y (in the graph)."""
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}
    handles = []
    for name, mod in linear_layers(model).items():
        def hook(module, args, out, name=name):
            inputs[name] = args[0].detach()
            outputs[name] = out
        handles.append(mod.register_forward_hook(hook))
    try:
        yield inputs, outputs
    finally:
        for h in handles:
            h.remove()


def per_sample_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of each sequence, averaged over its positions: (B,)."""
    logits = model(tokens[:, :-1])  # (B, T-1, V)
    ce = F.cross_entropy(logits.transpose(1, 2).float(), tokens[:, 1:], reduction="none")  # (B, T-1)
    return ce.mean(1)


def capture_linear_grads(model: nn.Module, tokens: torch.Tensor
                         ) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Per-sample losses (B,) and {layer: (a (B,T,d_in), b (B,T,d_out))} with b = ∂L_z/∂y for each z.

    One forward and one backward of Σ_z L_z (samples do not interact, so the output gradient of
    sample z is that of its own loss); eval mode; parameter .grad fields are left untouched.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), hooked_linears(model) as (inputs, outputs):
            losses = per_sample_loss(model, tokens)
            names = list(outputs)
            grads = torch.autograd.grad(losses.sum(), [outputs[n] for n in names])
    finally:
        model.train(was_training)
    return losses.detach(), {n: (inputs[n], g.detach()) for n, g in zip(names, grads)}


def ghost_gram(a1: torch.Tensor, b1: torch.Tensor, a2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """⟨G(z), G(z')⟩ for all pairs: (B1, B2) from a (B,T,d_in), b (B,T,d_out)."""
    # ALGO: ghost inner product  ⟨G(z),G(z')⟩ = Σ_{t,s} (a_t·a'_s)(b_t·b'_s)
    aa = torch.einsum("nti,msi->nmts", a1, a2)
    bb = torch.einsum("nto,mso->nmts", b1, b2)
    return (aa * bb).sum((-1, -2))


def ghost_dot(a: torch.Tensor, b: torch.Tensor, mat: torch.Tensor) -> torch.Tensor:
    """⟨G(z), M⟩ = Σ_t b_tᵀ M a_t for every sample: (B,), with M (d_out, d_in)."""
    return torch.einsum("bto,oi,bti->b", b, mat, a)


def summed_gradient(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_z G(z) = Σ_{z,t} b_t a_tᵀ (d_out, d_in): one matrix for a whole batch (e.g. the proxy)."""
    return torch.einsum("bto,bti->oi", b, a)
