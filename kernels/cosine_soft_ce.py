"""Fused cosine-similarity × soft cross-entropy (CLIP-style contrastive loss over multi-hot labels).

    loss, min_pos, max_neg = cosine_soft_ce(x, q, targets, scale)      # x (B, D), q (M, D), targets (B, M)
    mean = cosine_soft_ce_mean(x, q, targets, scale)                 # mean over rows with a positive

Per scene row i and query j (clip_binding, train_clean.py:400 of the official code):
    ĉ_ij  = <x_i/|x_i|, q_j/|q_j|>                      cosine similarity
    z_ij  = s · ĉ_ij                                     logits, s = min(exp(τ), 10) (computed by the caller)
    p_ij  = T_ij / Σ_j T_ij                              soft target: multi-hot row normalised
    L_i   = logsumexp_j z_ij − Σ_j p_ij z_ij             soft cross-entropy (0 for rows without positives)
    min_pos_i = min_{j: T_ij>0} z_ij,  max_neg_i = max_{j: T_ij=0} z_ij     (accuracy: min_pos > max_neg)
Gradients (upstream g_i per row): ∂L/∂z_ij = g_i (softmax_ij − p_ij); ∂/∂s = Σ ∂z · ĉ;
∂/∂x̂ = s ∂z Q̂, ∂/∂q̂ = s ∂zᵀ X̂; through the normalisation ∂/∂x = (∂x̂ − x̂ <x̂, ∂x̂>) / |x|.

The Triton forward normalises the rows in registers, tiles the (B, M) score matrix over query
blocks with an online log-sum-exp, and never writes the score matrix; the two backward kernels
(one over scene blocks for ∂x and ∂s, one over query blocks for ∂q) recompute the scores from the
saved per-row LSE. min_pos / max_neg are non-differentiable by-products of the same pass.
"""
from __future__ import annotations

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK_B, BLOCK_M = 16, 16
NUM_WARPS = 8  # Triton 3.6 on an H200: 1, 2 and 4 warps crash its TritonGPUOptimizeThreadLocality pass at D = 64
EPS = 1e-6
MAX_D = 256
BIG = 3.0e38


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------
def cosine_logits_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """z = s · cos(x_i, q_j), the (B, M) logits (materialised; the kernel never does)."""
    xn = x.float() / x.float().norm(dim=-1, keepdim=True).clamp_min(EPS)
    qn = q.float() / q.float().norm(dim=-1, keepdim=True).clamp_min(EPS)
    return scale.float() * (xn @ qn.T)


def cosine_soft_ce_reference(x, q, targets, scale):
    """ALGO: soft CE of s·cos logits against row-normalised multi-hot targets (+ min_pos, max_neg)."""
    z = cosine_logits_reference(x, q, scale)                       # (B, M)
    t = targets.float()
    tsum = t.sum(-1)
    has = tsum > 0
    p = t / tsum.clamp_min(1e-30)[:, None]
    loss = torch.logsumexp(z, dim=-1) - (p * z).sum(-1)
    loss = torch.where(has, loss, torch.zeros_like(loss))
    pos = t > 0
    zd = z.detach()
    min_pos = torch.where(pos, zd, torch.full_like(zd, BIG)).amin(-1)
    max_neg = torch.where(pos, torch.full_like(zd, -BIG), zd).amax(-1)
    return loss, min_pos, max_neg


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
if triton is not None:

    # a module global read inside @triton.jit must be a tl.constexpr: compiling for a GPU refuses a plain float
    # (the interpreter does not check; found on the first CUDA run, an H200)
    _BIG = tl.constexpr(BIG)

    # (in the loops below the discarded norms get their own names: a name bound outside a loop and rebound inside
    # it is loop-carried, and must keep its shape; BLOCK_B != BLOCK_M failed to compile with ``_`` reused)
    @triton.jit
    def _load_unit_rows(P, rows, n, D, BLOCK_D: tl.constexpr, eps):
        cols = tl.arange(0, BLOCK_D)
        msk = (rows[:, None] < n) & (cols[None, :] < D)
        v = tl.load(P + rows[:, None] * D + cols[None, :], mask=msk, other=0.0)
        norm = tl.maximum(tl.sqrt(tl.sum(v * v, 1)), eps)
        return v / norm[:, None], norm, v

    @triton.jit
    def _forward(X, Q, T, S, LOSS, LSE, MINP, MAXN, B, M, D, eps,
                 BLOCK_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
        rmask = rows < B
        xh, _, _ = _load_unit_rows(X, rows, B, D, BLOCK_D, eps)             # (BB, BD) unit rows
        s = tl.load(S)
        m_i = tl.full([BLOCK_B], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_B], dtype=tl.float32)
        tz = tl.zeros([BLOCK_B], dtype=tl.float32)                          # Σ_j T_ij z_ij
        ts = tl.zeros([BLOCK_B], dtype=tl.float32)                          # Σ_j T_ij
        minp = tl.full([BLOCK_B], _BIG, tl.float32)
        maxn = tl.full([BLOCK_B], -_BIG, tl.float32)
        for m0 in range(0, M, BLOCK_M):
            qrows = m0 + tl.arange(0, BLOCK_M)
            qmask = qrows < M
            qh, _qn, _qv = _load_unit_rows(Q, qrows, M, D, BLOCK_D, eps)
            z = s * tl.dot(xh, tl.trans(qh), input_precision="ieee")       # (BB, BM) = s·cos
            valid = rmask[:, None] & qmask[None, :]
            t = tl.load(T + rows[:, None] * M + qrows[None, :], mask=valid, other=0.0)
            zm = tl.where(qmask[None, :], z, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(zm, 1))                          # online LSE
            l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(zm - m_new[:, None]), 1)
            m_i = m_new
            tz += tl.sum(t * z, 1)
            ts += tl.sum(t, 1)
            pos = t > 0
            minp = tl.minimum(minp, tl.min(tl.where(pos & valid, z, _BIG), 1))
            maxn = tl.maximum(maxn, tl.max(tl.where((~pos) & valid, z, -_BIG), 1))
        lse = m_i + tl.log(l_i)
        loss = tl.where(ts > 0, lse - tz / tl.maximum(ts, 1e-30), 0.0)
        tl.store(LOSS + rows, loss, mask=rmask)
        tl.store(LSE + rows, lse, mask=rmask)
        tl.store(MINP + rows, minp, mask=rmask)
        tl.store(MAXN + rows, maxn, mask=rmask)

    @triton.jit
    def _dz_tile(xh, qh, s, T, G, LSE, rows, qrows, B, M):
        """∂L/∂z for one (scene block, query block) tile, and the cosine tile."""
        rmask = rows < B
        qmask = qrows < M
        valid = rmask[:, None] & qmask[None, :]
        c = tl.dot(xh, tl.trans(qh), input_precision="ieee")
        t = tl.load(T + rows[:, None] * M + qrows[None, :], mask=valid, other=0.0)
        lse = tl.load(LSE + rows, mask=rmask, other=0.0)
        g = tl.load(G + rows, mask=rmask, other=0.0)
        return c, t, lse, g, valid

    @triton.jit
    def _backward_x(X, Q, T, S, G, LSE, TS, DX, DS, B, M, D, eps,
                    BLOCK_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
        rmask = rows < B
        xh, xnorm, _ = _load_unit_rows(X, rows, B, D, BLOCK_D, eps)
        s = tl.load(S)
        ts = tl.load(TS + rows, mask=rmask, other=0.0)
        inv_ts = tl.where(ts > 0, 1.0 / tl.maximum(ts, 1e-30), 0.0)
        dxh = tl.zeros([BLOCK_B, BLOCK_D], dtype=tl.float32)
        ds = tl.zeros([BLOCK_B], dtype=tl.float32)
        for m0 in range(0, M, BLOCK_M):
            qrows = m0 + tl.arange(0, BLOCK_M)
            qh, _qn, _qv = _load_unit_rows(Q, qrows, M, D, BLOCK_D, eps)
            c, t, lse, g, valid = _dz_tile(xh, qh, s, T, G, LSE, rows, qrows, B, M)
            prob = tl.where(valid, tl.exp(s * c - lse[:, None]), 0.0)
            dz = tl.where(ts[:, None] > 0, g[:, None] * (prob - t * inv_ts[:, None]), 0.0)  # g (softmax − p)
            ds += tl.sum(dz * c, 1)
            dxh += s * tl.dot(dz, qh, input_precision="ieee")
        proj = tl.sum(dxh * xh, 1)
        dx = (dxh - xh * proj[:, None]) / xnorm[:, None]                  # through x/|x|
        cols = tl.arange(0, BLOCK_D)
        tl.store(DX + rows[:, None] * D + cols[None, :], dx, mask=rmask[:, None] & (cols[None, :] < D))
        tl.store(DS + rows, ds, mask=rmask)

    @triton.jit
    def _backward_q(X, Q, T, S, G, LSE, TS, DQ, B, M, D, eps,
                    BLOCK_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        qrows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        qmask = qrows < M
        qh, qnorm, _ = _load_unit_rows(Q, qrows, M, D, BLOCK_D, eps)
        s = tl.load(S)
        dqh = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for b0 in range(0, B, BLOCK_B):
            rows = b0 + tl.arange(0, BLOCK_B)
            rmask = rows < B
            xh, _xn, _xv = _load_unit_rows(X, rows, B, D, BLOCK_D, eps)
            ts = tl.load(TS + rows, mask=rmask, other=0.0)
            inv_ts = tl.where(ts > 0, 1.0 / tl.maximum(ts, 1e-30), 0.0)
            c, t, lse, g, valid = _dz_tile(xh, qh, s, T, G, LSE, rows, qrows, B, M)
            prob = tl.where(valid, tl.exp(s * c - lse[:, None]), 0.0)
            dz = tl.where(ts[:, None] > 0, g[:, None] * (prob - t * inv_ts[:, None]), 0.0)
            dqh += s * tl.dot(tl.trans(dz), xh, input_precision="ieee")
        proj = tl.sum(dqh * qh, 1)
        dq = (dqh - qh * proj[:, None]) / qnorm[:, None]
        cols = tl.arange(0, BLOCK_D)
        tl.store(DQ + qrows[:, None] * D + cols[None, :], dq, mask=qmask[:, None] & (cols[None, :] < D))


def _block_d(D: int) -> int:
    return max(16, triton.next_power_of_2(D))


class _CosineSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, q, targets, scale):
        B, D = x.shape
        M = q.shape[0]
        x32, q32 = x.detach().float().contiguous(), q.detach().float().contiguous()
        t32 = targets.detach().float().contiguous()
        s32 = scale.detach().float().reshape(1).contiguous()
        dev = x.device
        loss, lse = torch.empty(B, device=dev), torch.empty(B, device=dev)
        minp, maxn = torch.empty(B, device=dev), torch.empty(B, device=dev)
        _forward[(triton.cdiv(B, BLOCK_B),)](x32, q32, t32, s32, loss, lse, minp, maxn, B, M, D, EPS,
                                            BLOCK_B=BLOCK_B, BLOCK_M=BLOCK_M, BLOCK_D=_block_d(D),
                                            num_warps=NUM_WARPS)
        ctx.save_for_backward(x32, q32, t32, s32, lse)
        ctx.scale_shape = scale.shape
        ctx.mark_non_differentiable(minp, maxn)
        return loss, minp, maxn

    @staticmethod
    def backward(ctx, g_loss, _g_minp, _g_maxn):
        x32, q32, t32, s32, lse = ctx.saved_tensors
        B, D = x32.shape
        M = q32.shape[0]
        g = g_loss.float().contiguous()
        ts = t32.sum(-1).contiguous()
        dx, dq = torch.empty_like(x32), torch.empty_like(q32)
        ds = torch.empty(B, device=x32.device)
        _backward_x[(triton.cdiv(B, BLOCK_B),)](x32, q32, t32, s32, g, lse, ts, dx, ds, B, M, D, EPS,
                                               BLOCK_B=BLOCK_B, BLOCK_M=BLOCK_M, BLOCK_D=_block_d(D),
                                               num_warps=NUM_WARPS)
        _backward_q[(triton.cdiv(M, BLOCK_M),)](x32, q32, t32, s32, g, lse, ts, dq, B, M, D, EPS,
                                               BLOCK_B=BLOCK_B, BLOCK_M=BLOCK_M, BLOCK_D=_block_d(D),
                                               num_warps=NUM_WARPS)
        return dx, dq, None, ds.sum().reshape(ctx.scale_shape)


# ----------------------------------------------------------------------------------------------
# dispatchers
# ----------------------------------------------------------------------------------------------
def _check(x, q, targets, scale):
    if x.dim() != 2 or q.dim() != 2 or x.shape[1] != q.shape[1]:
        raise ValueError(f"x and q must be (B, D) and (M, D); got {tuple(x.shape)} and {tuple(q.shape)}")
    if targets.shape != (x.shape[0], q.shape[0]):
        raise ValueError(f"targets must be (B, M) = ({x.shape[0]}, {q.shape[0]}); got {tuple(targets.shape)}")
    if x.shape[1] > MAX_D:
        raise ValueError(f"embedding width D={x.shape[1]} exceeds {MAX_D} (one register tile per row)")
    if scale.numel() != 1:
        raise ValueError(f"scale must be a scalar tensor; got shape {tuple(scale.shape)}")
    if q.shape[0] == 0:
        raise ValueError("q: need at least one query")


def cosine_soft_ce(x: torch.Tensor, q: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor,
                   backend: Backend = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row soft-CE loss (differentiable in x, q, scale), min positive and max negative logit."""
    _check(x, q, targets, scale)
    if use_triton(x, q, targets, backend=backend):
        return _CosineSoftCE.apply(x, q, targets, scale)
    return cosine_soft_ce_reference(x, q, targets, scale)


def cosine_soft_ce_mean(x, q, targets, scale, backend: Backend = "auto") -> torch.Tensor:
    """Mean loss over rows that have at least one positive (empty rows are dropped, as officially)."""
    loss, _, _ = cosine_soft_ce(x, q, targets, scale, backend=backend)
    has = (targets > 0).any(-1)
    return loss.sum() / has.sum().clamp_min(1)


# ----------------------------------------------------------------------------------------------
# benchmarks: (name, make_inputs(device), kernel, reference, ideal bytes, flops)
# ----------------------------------------------------------------------------------------------
def _inputs(b: int, m: int, d: int, device: str):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(b, d, device=device, generator=g).requires_grad_()
    q = torch.randn(m, d, device=device, generator=g).requires_grad_()
    t = (torch.rand(b, m, device=device, generator=g) < 4.0 / m).float()
    s = torch.tensor(3.0, device=device, requires_grad=True)
    return x, q, t, s


def _fwd_bwd(backend):
    def run(x, q, t, s):
        cosine_soft_ce_mean(x, q, t, s, backend=backend).backward()
    return run


def _bytes(b, m, d):
    return 4 * (3 * (b + m) * d + 2 * b * m + 6 * b)


BENCHMARKS = [
    ("cosine_soft_ce fwd+bwd B=8192 M=8192 D=64", lambda device: _inputs(8192, 8192, 64, device),
     _fwd_bwd("triton"), _fwd_bwd("torch"), _bytes(8192, 8192, 64), 3 * 2 * 2 * 8192 * 8192 * 64),
]
BENCHMARKS_SMALL = [
    ("cosine_soft_ce fwd+bwd B=67 M=45 D=24", lambda device: _inputs(67, 45, 24, device),
     _fwd_bwd("triton"), _fwd_bwd("torch"), _bytes(67, 45, 24), 3 * 2 * 2 * 67 * 45 * 24),
]
