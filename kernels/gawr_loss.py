"""Fused GAWR actor loss and fused expectile loss (SCIQL), each a Triton kernel beside its torch reference.

    loss = gawr_actor_loss(mu, log_std, action, adv_style, adv_task, beta=3.0, clip=100.0, gated=True)
    loss = expectile_loss(q, v, tau=0.7)

GAWR (Gated Advantage Weighted Regression), per row i of a batch of N (action dim D):
    A_i   = A_z,i + σ(A_z,i) · A_r,i        (gated=True: style first; gated=False: A_z + A_r)
    w_i   = min(exp(β A_i), clip)           (advantages are constants for the actor: no gradient)
    log π = Σ_d −½((a − μ)/σ)² − log σ − ½ log 2π,   σ = exp(log_std)
    loss  = −(1/N) Σ_i w_i log π(a_i | s_i, z_i)
Gradients: ∂/∂μ = −w (a − μ)/σ² / N,  ∂/∂log σ = −w ((a − μ)²/σ² − 1) / N,  ∂/∂a = −∂/∂μ.
The Triton path never materialises the (N,) gate/weight/log-prob intermediates in separate passes:
one kernel reads μ, log σ, a and the two advantages and writes the per-row loss; the backward
kernel recomputes the weight and writes the three gradients.

Expectile loss (IQL value regression), per element of u = q − v:
    L = (1/N) Σ |τ − 1(u < 0)| u²,   ∂L/∂v = −2 |τ − 1(u < 0)| u / N,  ∂L/∂q = −∂L/∂v.
"""
from __future__ import annotations

import math

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK_N, BLOCK_D, BLOCK_E = 32, 16, 256
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


# ----------------------------------------------------------------------------------------------
# torch references
# ----------------------------------------------------------------------------------------------
def gated_advantage(adv_style: torch.Tensor, adv_task: torch.Tensor, gated: bool = True) -> torch.Tensor:
    """ALGO: GAWR gate A = A_z + σ(A_z)·A_r (style first); ungated: A_z + A_r."""
    return adv_style + torch.sigmoid(adv_style) * adv_task if gated else adv_style + adv_task


def gawr_weights_reference(adv_style, adv_task, beta: float = 3.0, clip: float = 100.0, gated: bool = True):
    """ALGO: AWR weight w = min(exp(β A), clip) on the gated advantage (no gradient)."""
    adv = gated_advantage(adv_style.detach().float(), adv_task.detach().float(), gated)
    return torch.clamp(torch.exp(beta * adv), max=clip)


def gaussian_log_prob(mu, log_std, action):
    z = (action - mu) * torch.exp(-log_std)
    return (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)


def gawr_actor_loss_reference(mu, log_std, action, adv_style, adv_task, beta: float = 3.0,
                              clip: float = 100.0, gated: bool = True) -> torch.Tensor:
    """ALGO: GAWR actor loss −E[w · log π(a|s,z)]."""
    w = gawr_weights_reference(adv_style, adv_task, beta, clip, gated)
    log_std = log_std.expand_as(mu)
    return -(w * gaussian_log_prob(mu.float(), log_std.float(), action.float())).mean()


def expectile_loss_reference(q: torch.Tensor, v: torch.Tensor, tau: float = 0.7) -> torch.Tensor:
    """ALGO: IQL expectile regression L_τ(u) = |τ − 1(u<0)| u², u = q − v."""
    diff = q.float() - v.float()
    weight = torch.where(diff > 0, tau, 1.0 - tau)
    return (weight * diff * diff).mean()


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _row_weight(AZ, AR, rows, rmask, beta, clip, GATED: tl.constexpr):
        az = tl.load(AZ + rows, mask=rmask, other=0.0)
        ar = tl.load(AR + rows, mask=rmask, other=0.0)
        if GATED:
            adv = az + ar / (1.0 + tl.exp(-az))  # A_z + σ(A_z) A_r
        else:
            adv = az + ar
        return tl.minimum(tl.exp(beta * adv), clip)  # w = min(exp(βA), clip)

    @triton.jit
    def _gawr_forward(MU, LS, ACT, AZ, AR, LOSS, W, N, D, beta, clip, half_log_2pi,
                      GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        w = _row_weight(AZ, AR, rows, rmask, beta, clip, GATED)
        logp = tl.zeros([BLOCK_N], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            msk = rmask[:, None] & (cols[None, :] < D)
            off = rows[:, None] * D + cols[None, :]
            mu = tl.load(MU + off, mask=msk, other=0.0)
            ls = tl.load(LS + off, mask=msk, other=0.0)
            a = tl.load(ACT + off, mask=msk, other=0.0)
            z = (a - mu) * tl.exp(-ls)
            logp += tl.sum(tl.where(msk, -0.5 * z * z - ls - half_log_2pi, 0.0), 1)
        tl.store(LOSS + rows, -w * logp, mask=rmask)
        tl.store(W + rows, w, mask=rmask)

    @triton.jit
    def _gawr_backward(MU, LS, ACT, AZ, AR, GRAD, DMU, DLS, N, D, beta, clip,
                       GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        w = _row_weight(AZ, AR, rows, rmask, beta, clip, GATED)
        g = tl.load(GRAD)  # upstream gradient of the mean loss, already divided by N
        coef = -w * g
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            msk = rmask[:, None] & (cols[None, :] < D)
            off = rows[:, None] * D + cols[None, :]
            mu = tl.load(MU + off, mask=msk, other=0.0)
            ls = tl.load(LS + off, mask=msk, other=0.0)
            a = tl.load(ACT + off, mask=msk, other=0.0)
            inv_var = tl.exp(-2.0 * ls)
            diff = a - mu
            tl.store(DMU + off, coef[:, None] * diff * inv_var, mask=msk)                 # ∂/∂μ
            tl.store(DLS + off, coef[:, None] * (diff * diff * inv_var - 1.0), mask=msk)  # ∂/∂log σ

    @triton.jit
    def _expectile_forward(Q, V, LOSS, N, tau, BLOCK_E: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
        m = offs < N
        u = tl.load(Q + offs, mask=m, other=0.0) - tl.load(V + offs, mask=m, other=0.0)
        wt = tl.where(u > 0, tau, 1.0 - tau)
        tl.store(LOSS + offs, wt * u * u, mask=m)

    @triton.jit
    def _expectile_backward(Q, V, GRAD, DQ, N, tau, BLOCK_E: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
        m = offs < N
        u = tl.load(Q + offs, mask=m, other=0.0) - tl.load(V + offs, mask=m, other=0.0)
        wt = tl.where(u > 0, tau, 1.0 - tau)
        g = tl.load(GRAD)
        tl.store(DQ + offs, 2.0 * wt * u * g, mask=m)  # ∂/∂q; ∂/∂v is its negative


def _gawr_triton_forward(mu, ls, act, az, ar, beta, clip, gated):
    N, D = mu.shape
    loss = torch.empty(N, dtype=torch.float32, device=mu.device)
    w = torch.empty(N, dtype=torch.float32, device=mu.device)
    _gawr_forward[(triton.cdiv(N, BLOCK_N),)](mu, ls, act, az, ar, loss, w, N, D, float(beta), float(clip),
                                              HALF_LOG_2PI, GATED=bool(gated), BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D)
    return loss, w


class _GAWRLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mu, log_std, action, adv_style, adv_task, beta, clip, gated):
        shared_std = log_std.dim() == 1
        ls = log_std.expand_as(mu)
        args = [x.detach().float().contiguous() for x in (mu, ls, action, adv_style, adv_task)]
        loss, _ = _gawr_triton_forward(*args, beta, clip, gated)
        ctx.save_for_backward(*args)
        ctx.hp = (beta, clip, gated, shared_std)
        return loss.mean()

    @staticmethod
    def backward(ctx, grad_out):
        mu, ls, act, az, ar = ctx.saved_tensors
        beta, clip, gated, shared_std = ctx.hp
        N, D = mu.shape
        g = (grad_out.float() / N).reshape(1).contiguous()
        dmu, dls = torch.empty_like(mu), torch.empty_like(mu)
        _gawr_backward[(triton.cdiv(N, BLOCK_N),)](mu, ls, act, az, ar, g, dmu, dls, N, D, float(beta),
                                                   float(clip), GATED=bool(gated), BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D)
        d_ls = dls.sum(0) if shared_std else dls
        return dmu, d_ls, -dmu, None, None, None, None, None


class _ExpectileLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, v, tau):
        q32, v32 = q.detach().float().contiguous().reshape(-1), v.detach().float().contiguous().reshape(-1)
        N = q32.numel()
        loss = torch.empty(N, dtype=torch.float32, device=q.device)
        _expectile_forward[(triton.cdiv(N, BLOCK_E),)](q32, v32, loss, N, float(tau), BLOCK_E=BLOCK_E)
        ctx.save_for_backward(q32, v32)
        ctx.tau, ctx.shape = tau, q.shape
        return loss.mean()

    @staticmethod
    def backward(ctx, grad_out):
        q32, v32 = ctx.saved_tensors
        N = q32.numel()
        g = (grad_out.float() / N).reshape(1).contiguous()
        dq = torch.empty_like(q32)
        _expectile_backward[(triton.cdiv(N, BLOCK_E),)](q32, v32, g, dq, N, float(ctx.tau), BLOCK_E=BLOCK_E)
        dq = dq.reshape(ctx.shape)
        return dq, -dq, None


# ----------------------------------------------------------------------------------------------
# dispatchers
# ----------------------------------------------------------------------------------------------
def _check_gawr(mu, log_std, action, adv_style, adv_task, beta, clip):
    if mu.dim() != 2 or action.shape != mu.shape:
        raise ValueError(f"expected mu and action of shape (N, D); got {tuple(mu.shape)} and {tuple(action.shape)}")
    if log_std.shape not in (mu.shape, mu.shape[1:]):
        raise ValueError(f"log_std must be (N, D) or (D,) for mu {tuple(mu.shape)}; got {tuple(log_std.shape)}")
    for name, adv in (("adv_style", adv_style), ("adv_task", adv_task)):
        if adv.shape != mu.shape[:1]:
            raise ValueError(f"{name} must be (N,) = ({mu.shape[0]},); got {tuple(adv.shape)}")
    if not clip > 0 or beta < 0:
        raise ValueError(f"need beta >= 0 and clip > 0 (got beta={beta}, clip={clip})")


def gawr_actor_loss(mu: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor, adv_style: torch.Tensor,
                    adv_task: torch.Tensor, beta: float = 3.0, clip: float = 100.0, gated: bool = True,
                    backend: Backend = "auto") -> torch.Tensor:
    """Mean GAWR actor loss; differentiable in mu, log_std (and action); advantages are constants."""
    _check_gawr(mu, log_std, action, adv_style, adv_task, beta, clip)
    if use_triton(mu, log_std, action, adv_style, adv_task, backend=backend):
        return _GAWRLoss.apply(mu, log_std, action, adv_style, adv_task, beta, clip, gated)
    return gawr_actor_loss_reference(mu, log_std, action, adv_style, adv_task, beta, clip, gated)


@torch.no_grad()
def gawr_weights(adv_style: torch.Tensor, adv_task: torch.Tensor, beta: float = 3.0, clip: float = 100.0,
                 gated: bool = True, backend: Backend = "auto") -> torch.Tensor:
    """Per-row GAWR weights w = min(exp(β A), clip) (for diagnostics)."""
    if use_triton(adv_style, adv_task, backend=backend):
        n = adv_style.shape[0]
        zeros = torch.zeros(n, 1, device=adv_style.device)
        _, w = _gawr_triton_forward(zeros, zeros, zeros, adv_style.float().contiguous(),
                                    adv_task.float().contiguous(), beta, clip, gated)
        return w
    return gawr_weights_reference(adv_style, adv_task, beta, clip, gated)


def expectile_loss(q: torch.Tensor, v: torch.Tensor, tau: float = 0.7, backend: Backend = "auto") -> torch.Tensor:
    """Mean expectile loss of u = q − v; differentiable in q and v."""
    if q.shape != v.shape:
        raise ValueError(f"q and v must have the same shape; got {tuple(q.shape)} and {tuple(v.shape)}")
    if not 0.0 < tau < 1.0:
        raise ValueError(f"tau (expectile) must lie in (0, 1); got {tau}")
    if use_triton(q, v, backend=backend):
        return _ExpectileLoss.apply(q, v, tau)
    return expectile_loss_reference(q, v, tau)


# ----------------------------------------------------------------------------------------------
# benchmarks: (name, make_inputs(device), kernel, reference, ideal bytes, flops)
# ----------------------------------------------------------------------------------------------
def _gawr_inputs(n: int, d: int, device: str):
    mu = torch.randn(n, d, device=device, requires_grad=True)
    ls = (0.3 * torch.randn(n, d, device=device)).requires_grad_()
    act = torch.randn(n, d, device=device)
    return mu, ls, act, torch.randn(n, device=device), torch.randn(n, device=device)


def _gawr_fwd_bwd(backend):
    def run(mu, ls, act, az, ar):
        gawr_actor_loss(mu, ls, act, az, ar, backend=backend).backward()
    return run


def _exp_inputs(n: int, device: str):
    return torch.randn(n, device=device, requires_grad=True), torch.randn(n, device=device, requires_grad=True)


def _exp_fwd_bwd(backend):
    def run(q, v):
        expectile_loss(q, v, 0.7, backend=backend).backward()
    return run


BENCHMARKS = [
    ("gawr_actor_loss fwd+bwd N=1048576 D=8", lambda device: _gawr_inputs(1 << 20, 8, device),
     _gawr_fwd_bwd("triton"), _gawr_fwd_bwd("torch"), 4 * (1 << 20) * (3 * 8 * 2 + 8 + 2), 30 * (1 << 20) * 8),
    ("expectile_loss fwd+bwd N=16777216", lambda device: _exp_inputs(1 << 24, device),
     _exp_fwd_bwd("triton"), _exp_fwd_bwd("torch"), 4 * (1 << 24) * 5, 10 * (1 << 24)),
]
BENCHMARKS_SMALL = [
    ("gawr_actor_loss fwd+bwd N=257 D=6", lambda device: _gawr_inputs(257, 6, device),
     _gawr_fwd_bwd("triton"), _gawr_fwd_bwd("torch"), 4 * 257 * (3 * 6 * 2 + 6 + 2), 30 * 257 * 6),
    ("expectile_loss fwd+bwd N=1001", lambda device: _exp_inputs(1001, device),
     _exp_fwd_bwd("triton"), _exp_fwd_bwd("torch"), 4 * 1001 * 5, 10 * 1001),
]
