"""Fused symmetric InfoNCE (CLIP loss) over paired embeddings, tiled with online log-sum-exp.

    loss, lse_row, lse_col, max_row, max_col, diag = fused_infonce(a, b, scale)   # a, b (B, D)

Pairs (a_i, b_i) are positives, every other (a_i, b_j) a negative (tgdt: text CLS vs trajectory
CLS projections, already L2-normalised by the caller). With z_ij = s · <a_i, b_j>:
    lse_row_i = logsumexp_j z_ij        lse_col_j = logsumexp_i z_ij        diag_i = z_ii
    L = ½ [ mean_i (lse_row_i − z_ii) + mean_j (lse_col_j − z_jj) ]          # ALGO: TG-DT Eq. (TBC)
max_row / max_col are the row / column maxima (retrieval hit: diag_i ≥ max_row_i), by-products of
the same passes. Gradient (upstream g): ∂L/∂z_ij = g/(2B) (P^row_ij + P^col_ij − 2 δ_ij) with
P^row = softmax over j, P^col = softmax over i; ∂a = s ∂z B, ∂b = s ∂zᵀ A, ∂s = Σ ∂z ⊙ (z / s).

The Triton forward runs two tiled passes (row blocks sweeping column tiles, column blocks sweeping
row tiles), each with an online log-sum-exp, and never writes the (B, B) score matrix; the backward
recomputes each tile from the saved LSEs (one kernel over row blocks for ∂a and ∂s, one over column
blocks for ∂b).
"""
from __future__ import annotations

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK = 16
MAX_D = 256


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------
def fused_infonce_reference(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor):
    """Materialised reference: symmetric cross-entropy of s·A Bᵀ against the diagonal."""
    z = scale.float() * (a.float() @ b.float().T)                       # (B, B)
    lse_row = torch.logsumexp(z, dim=1)
    lse_col = torch.logsumexp(z, dim=0)
    diag = torch.diagonal(z)
    loss = 0.5 * ((lse_row - diag).mean() + (lse_col - diag).mean())   # (CE_row + CE_col) / 2
    zd = z.detach()
    return loss, lse_row.detach(), lse_col.detach(), zd.amax(1), zd.amax(0), diag.detach()


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _load(P, rows, n, D, BLOCK_D: tl.constexpr):
        cols = tl.arange(0, BLOCK_D)
        return tl.load(P + rows[:, None] * D + cols[None, :], mask=(rows[:, None] < n) & (cols[None, :] < D),
                       other=0.0)

    @triton.jit
    def _lse_pass(X, Y, S, LSE, MAX, N, D, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """For each row x_i of X: online logsumexp_j s<x_i, y_j> over column tiles of Y."""
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        rmask = rows < N
        x = _load(X, rows, N, D, BLOCK_D)
        s = tl.load(S)
        m_i = tl.full([BLOCK], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, N, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            y = _load(Y, cols, N, D, BLOCK_D)
            z = s * tl.dot(x, tl.trans(y), input_precision="ieee")     # (BLOCK, BLOCK) tile
            z = tl.where((cols < N)[None, :], z, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(z, 1))                      # online LSE
            l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(z - m_new[:, None]), 1)
            m_i = m_new
        tl.store(LSE + rows, m_i + tl.log(l_i), mask=rmask)
        tl.store(MAX + rows, m_i, mask=rmask)

    @triton.jit
    def _grad_pass(X, Y, S, LSE_X, LSE_Y, G, DX, DS, N, D,
                   BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """∂x_i = s Σ_j ∂z_ij y_j (and per-row ∂s), recomputing z tiles. Symmetric in (X, Y), so the
        same kernel gives ∂b with the roles swapped (then ∂s is discarded)."""
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        rmask = rows < N
        x = _load(X, rows, N, D, BLOCK_D)
        s = tl.load(S)
        coef = tl.load(G) / (2.0 * N)
        lse_x = tl.load(LSE_X + rows, mask=rmask, other=0.0)
        dx = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
        ds = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, N, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            cmask = cols < N
            y = _load(Y, cols, N, D, BLOCK_D)
            lse_y = tl.load(LSE_Y + cols, mask=cmask, other=0.0)
            c = tl.dot(x, tl.trans(y), input_precision="ieee")
            z = s * c
            valid = rmask[:, None] & cmask[None, :]
            p = tl.exp(z - lse_x[:, None]) + tl.exp(z - lse_y[None, :])
            eye = (rows[:, None] == cols[None, :]).to(tl.float32)
            dz = tl.where(valid, coef * (p - 2.0 * eye), 0.0)
            ds += tl.sum(dz * c, 1)
            dx += s * tl.dot(dz, y, input_precision="ieee")
        cols_d = tl.arange(0, BLOCK_D)
        tl.store(DX + rows[:, None] * D + cols_d[None, :], dx, mask=rmask[:, None] & (cols_d[None, :] < D))
        tl.store(DS + rows, ds, mask=rmask)


def _block_d(D: int) -> int:
    return max(16, triton.next_power_of_2(D))


class _FusedInfoNCE(torch.autograd.Function):
    """Triton forward/backward; ``setup_context`` style with a ``vmap`` rule, so that the kernel also
    runs inside ``torch.func.vmap`` (stages/common/ensemble.py: the seeds of an arm as one ensemble):
    each member's (a, b, scale) goes through the kernel on its own, autograd recorded per member."""

    @staticmethod
    def forward(a, b, scale):
        N, D = a.shape
        a32, b32 = a.detach().float().contiguous(), b.detach().float().contiguous()
        s32 = scale.detach().float().reshape(1).contiguous()
        dev = a.device
        lse_r, lse_c = torch.empty(N, device=dev), torch.empty(N, device=dev)
        max_r, max_c = torch.empty(N, device=dev), torch.empty(N, device=dev)
        grid = (triton.cdiv(N, BLOCK),)
        _lse_pass[grid](a32, b32, s32, lse_r, max_r, N, D, BLOCK=BLOCK, BLOCK_D=_block_d(D))   # rows
        _lse_pass[grid](b32, a32, s32, lse_c, max_c, N, D, BLOCK=BLOCK, BLOCK_D=_block_d(D))   # columns
        diag = s32 * (a32 * b32).sum(-1)
        loss = 0.5 * ((lse_r - diag).mean() + (lse_c - diag).mean())
        return loss, lse_r, lse_c, max_r, max_c, diag

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, scale = inputs
        _, lse_r, lse_c, max_r, max_c, diag = output
        ctx.save_for_backward(a.detach().float().contiguous(), b.detach().float().contiguous(),
                              scale.detach().float().reshape(1).contiguous(), lse_r, lse_c)
        ctx.scale_shape = scale.shape
        ctx.mark_non_differentiable(lse_r, lse_c, max_r, max_c, diag)

    @staticmethod
    def backward(ctx, g_loss, *_):
        a32, b32, s32, lse_r, lse_c = ctx.saved_tensors
        N, D = a32.shape
        g = g_loss.float().reshape(1).contiguous()
        da, db = torch.empty_like(a32), torch.empty_like(b32)
        ds, ds_unused = torch.empty(N, device=a32.device), torch.empty(N, device=a32.device)
        grid = (triton.cdiv(N, BLOCK),)
        _grad_pass[grid](a32, b32, s32, lse_r, lse_c, g, da, ds, N, D, BLOCK=BLOCK, BLOCK_D=_block_d(D))
        _grad_pass[grid](b32, a32, s32, lse_c, lse_r, g, db, ds_unused, N, D, BLOCK=BLOCK, BLOCK_D=_block_d(D))
        return da, db, ds.sum().reshape(ctx.scale_shape)

    @staticmethod
    def vmap(info, in_dims, a, b, scale):
        """Batched (a, b, scale) -> every member through the kernel on its own, outputs stacked (dim 0)."""
        S = info.batch_size

        def member(x, dim, k):
            return x if dim is None else x.select(dim, k)

        outs = [_FusedInfoNCE.apply(*(member(x, d, k) for x, d in zip((a, b, scale), in_dims))) for k in range(S)]
        return tuple(torch.stack(col) for col in zip(*outs)), (0,) * 6


# ----------------------------------------------------------------------------------------------
# dispatcher
# ----------------------------------------------------------------------------------------------
def _check(a, b, scale):
    if a.dim() != 2 or b.dim() != 2 or a.shape != b.shape:
        raise ValueError(f"a and b must both be (B, D) with the same shape; got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] == 0:
        raise ValueError("a: need at least one pair")
    if a.shape[1] > MAX_D:
        raise ValueError(f"embedding width D={a.shape[1]} exceeds {MAX_D} (one register tile per row)")
    if scale.numel() != 1:
        raise ValueError(f"scale must be a scalar tensor; got shape {tuple(scale.shape)}")


def fused_infonce(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, backend: Backend = "auto"):
    """(loss, lse_row, lse_col, max_row, max_col, diag); loss differentiable in a, b and scale."""
    _check(a, b, scale)
    if use_triton(a, b, backend=backend):
        return _FusedInfoNCE.apply(a, b, scale)
    return fused_infonce_reference(a, b, scale)


def retrieval_hits(out) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (a→b) and per-column (b→a) top-1 retrieval hits from fused_infonce's outputs."""
    _, _, _, max_r, max_c, diag = out
    return diag >= max_r, diag >= max_c


# ----------------------------------------------------------------------------------------------
# benchmarks: (name, make_inputs(device), kernel, reference, ideal bytes, flops)
# ----------------------------------------------------------------------------------------------
def _inputs(n: int, d: int, device: str):
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.nn.functional.normalize(torch.randn(n, d, device=device, generator=g), dim=-1).requires_grad_()
    b = torch.nn.functional.normalize(torch.randn(n, d, device=device, generator=g), dim=-1).requires_grad_()
    s = torch.tensor(14.3, device=device, requires_grad=True)
    return a, b, s


def _fwd_bwd(backend):
    def run(a, b, s):
        fused_infonce(a, b, s, backend=backend)[0].backward()
    return run


BENCHMARKS = [
    ("fused_infonce fwd+bwd B=8192 D=128", lambda device: _inputs(8192, 128, device),
     _fwd_bwd("triton"), _fwd_bwd("torch"), 4 * 6 * 8192 * 128, 4 * 2 * 2 * 8192 * 8192 * 128),
]
BENCHMARKS_SMALL = [
    ("fused_infonce fwd+bwd B=45 D=24", lambda device: _inputs(45, 24, device),
     _fwd_bwd("triton"), _fwd_bwd("torch"), 4 * 6 * 45 * 24, 4 * 2 * 2 * 45 * 45 * 24),
]
