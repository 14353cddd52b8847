"""Fused token log-probabilities: log_softmax(logits / T)[target] per row, never materialising the softmax.

    logp = token_logprob(logits, targets)                       # logits (..., V), targets (...) -> (...)
    logp = token_logprob(logits, targets, temperature=0.7, backend="triton")
    logp, ent = token_logprob(logits, targets, with_entropy=True)   # + entropy of softmax(logits/T)

Per row i (z = logits_i / T, y = targets_i):
    lse_i  = log Σ_v exp(z_v)                         online log-sum-exp over vocabulary blocks
    logp_i = z_y − lse_i                              the GRPO policy log-prob of the sampled token
    H_i    = lse_i − Σ_v softmax(z)_v z_v             (optional, non-differentiable) predictive entropy
Backward (upstream g_i):  ∂logp_i/∂logits_iv = g_i (onehot(y)_v − softmax(z)_v) / T.
Rows whose target equals ``ignore_index`` give logp = 0 and zero gradient (padding).

The Triton forward runs one program per row, streams the row in BLOCK_V chunks with an online
max/sum, gathers the target logit and writes only (logp, lse[, H]); the backward recomputes
softmax from the saved lse chunk by chunk. Computation is float32 whatever the input dtype
(the official JustGRPO code takes the log-softmax in fp32); the gradient has the logits' dtype.
Shared by every GRPO paper (justgrpo, plantain, backdoor_awareness, futurecad) through
``stages.common.grpo``.
"""
from __future__ import annotations

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK_V = 128
IGNORE_INDEX = -100


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------
def token_logprob_reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                            ignore_index: int = IGNORE_INDEX, with_entropy: bool = False):
    """ALGO: logp_t = log_softmax(logits_t / T)[y_t] (materialises the (N, V) log-softmax)."""
    z = logits.float() / temperature
    logsm = torch.log_softmax(z, dim=-1)                                     # (..., V)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets)).long()
    logp = logsm.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    if not with_entropy:
        return logp
    ent = -(logsm.exp() * logsm).sum(-1).detach()
    return logp, ent


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _forward(X, Y, LOGP, LSE, ENT, V, stride, inv_t, ignore_index,
                 WITH_ENT: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = X + row.to(tl.int64) * stride
        y = tl.load(Y + row)
        m = -float("inf")
        s = 0.0
        zy = 0.0
        for v0 in range(0, V, BLOCK):
            cols = v0 + tl.arange(0, BLOCK)
            msk = cols < V
            z = tl.load(base + cols, mask=msk, other=-float("inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, tl.max(z, 0))                              # online LSE
            s = s * tl.exp(m - m_new) + tl.sum(tl.where(msk, tl.exp(z - m_new), 0.0), 0)
            m = m_new
            zy += tl.sum(tl.where(cols == y, z, 0.0), 0)                     # gather z_y
        lse = m + tl.log(s)
        valid = y != ignore_index
        tl.store(LOGP + row, tl.where(valid, zy - lse, 0.0))
        tl.store(LSE + row, lse)
        if WITH_ENT:                                                         # H = lse − Σ p z
            pz = 0.0
            for v0 in range(0, V, BLOCK):
                cols = v0 + tl.arange(0, BLOCK)
                msk = cols < V
                z = tl.load(base + cols, mask=msk, other=0.0).to(tl.float32) * inv_t
                pz += tl.sum(tl.where(msk, tl.exp(z - lse) * z, 0.0), 0)
            tl.store(ENT + row, lse - pz)

    @triton.jit
    def _backward(X, Y, LSE, G, DX, V, stride, dstride, inv_t, ignore_index, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = X + row.to(tl.int64) * stride
        dbase = DX + row.to(tl.int64) * dstride
        y = tl.load(Y + row)
        lse = tl.load(LSE + row)
        g = tl.load(G + row).to(tl.float32)
        g = tl.where(y != ignore_index, g, 0.0)
        for v0 in range(0, V, BLOCK):
            cols = v0 + tl.arange(0, BLOCK)
            msk = cols < V
            z = tl.load(base + cols, mask=msk, other=0.0).to(tl.float32) * inv_t
            p = tl.exp(z - lse)
            d = g * (tl.where(cols == y, 1.0, 0.0) - p) * inv_t              # g (onehot − softmax) / T
            tl.store(dbase + cols, d.to(DX.dtype.element_ty), mask=msk)


def _rows(logits: torch.Tensor, targets: torch.Tensor):
    V = logits.shape[-1]
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = targets.reshape(-1).to(torch.int64).contiguous()
    return x, y, V


def _triton_forward(x, y, V, temperature, ignore_index, with_entropy):
    n = x.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=x.device)
    lse = torch.empty(n, dtype=torch.float32, device=x.device)
    ent = torch.empty(n if with_entropy else 1, dtype=torch.float32, device=x.device)
    if n:
        _forward[(n,)](x, y, logp, lse, ent, V, x.stride(0), 1.0 / temperature, ignore_index,
                       WITH_ENT=with_entropy, BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
    return logp, lse, ent


class _TokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, ignore_index):
        x, y, V = _rows(logits, targets)
        logp, lse, _ = _triton_forward(x, y, V, temperature, ignore_index, False)
        ctx.save_for_backward(x, y, lse)
        ctx.meta = (temperature, ignore_index, logits.shape, logits.dtype)
        return logp.view(targets.shape)

    @staticmethod
    def backward(ctx, grad):
        x, y, lse = ctx.saved_tensors
        temperature, ignore_index, shape, dtype = ctx.meta
        V = x.shape[1]
        g = grad.reshape(-1).float().contiguous()
        dx = torch.empty(x.shape, dtype=dtype, device=x.device)
        if x.shape[0]:
            _backward[(x.shape[0],)](x, y, lse, g, dx, V, x.stride(0), dx.stride(0), 1.0 / temperature,
                                     ignore_index, BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
        return dx.view(shape), None, None, None


def token_logprob(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                  ignore_index: int = IGNORE_INDEX, with_entropy: bool = False, backend: Backend = "auto"):
    """Per-token log-probabilities (float32, shape of ``targets``), differentiable in ``logits``.

    ``with_entropy`` also returns the (detached) entropy of softmax(logits / T) per row.
    backend: "triton" (CUDA or TRITON_INTERPRET=1), "torch" (reference) or "auto" (kernels.dispatch).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"token_logprob: logits {tuple(logits.shape)} and targets {tuple(targets.shape)} "
                         "must agree on every dim but the last")
    if not temperature > 0:
        raise ValueError(f"token_logprob: temperature must be > 0 (got {temperature})")
    if not use_triton(logits, targets, backend=backend):
        return token_logprob_reference(logits, targets, temperature, ignore_index, with_entropy)
    logp = _TokenLogprob.apply(logits, targets, float(temperature), int(ignore_index))
    if not with_entropy:
        return logp
    x, y, V = _rows(logits.detach(), targets)
    _, _, ent = _triton_forward(x, y, V, float(temperature), int(ignore_index), True)
    return logp, ent.view(targets.shape)


# ----------------------------------------------------------------------------------------------
# benchmark entries (python -m kernels.bench --only token_logprob)
# ----------------------------------------------------------------------------------------------
def _inputs(n: int, v: int, device: str):
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(n, v, generator=g, device=device).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=g, device=device)
    return logits, targets


def _fwd_bwd(backend: str):
    def fn(logits, targets):
        token_logprob(logits, targets, backend=backend).sum().backward()
    return fn


BENCHMARKS = [
    ("token_logprob fwd+bwd N=16384 V=32000", lambda device: _inputs(16384, 32000, device),
     _fwd_bwd("triton"), _fwd_bwd("torch"), 3 * 4 * 16384 * 32000, 6 * 16384 * 32000),
]
BENCHMARKS_SMALL = [
    ("token_logprob fwd+bwd N=67 V=301", lambda device: _inputs(67, 301, device),
     _fwd_bwd("triton"), _fwd_bwd("torch"), 3 * 4 * 67 * 301, 6 * 67 * 301),
]
