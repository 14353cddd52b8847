"""The Cauchy-factor application of gft.Factorization, routed through kernels/cauchy_apply.

    cauchy = kernel_cauchy(rec, device)          # rec: kernels.record.KernelRecord
    U = fact.inverse(np.eye(n), cauchy=cauchy)   # every factor applied to all n columns at once
    rec.parity("cauchy_apply", cauchy_apply, *factor_args(fact.factors[0], X), slice="...")

Each call moves one factor's O(m) parameters and the (m, c) block to ``device`` and back; the
record counts the calls and names the path that ran (Triton on CUDA, the torch reference on CPU).
"""
from __future__ import annotations

import numpy as np
import torch

from kernels.cauchy_apply import cauchy_apply
from kernels.record import KernelRecord

NAME = "cauchy_apply"


def _t(v, device) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(v, dtype=np.float64), device=device)


def kernel_cauchy(rec: KernelRecord, device: torch.device):
    def apply(z, d, org, tau, a, X, transpose=True):
        out = rec.call(NAME, cauchy_apply, _t(z, device), _t(d, device), _t(org, device), _t(tau, device),
                       _t(a, device), _t(X, device), transpose=transpose)
        return out.cpu().numpy()
    return apply


def factor_args(factor, X: np.ndarray, device: torch.device) -> tuple:
    """(z, d, org, tau, a, X) of one Cauchy factor as tensors on ``device`` (for rec.parity)."""
    return tuple(_t(v, device) for v in (factor.z, factor.d, factor.org, factor.tau, factor.a, X))
