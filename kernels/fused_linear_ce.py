"""Fused linear + softmax cross-entropy with an online logsumexp over vocabulary tiles.

    loss = linear_cross_entropy(h, w, y)             # == F.cross_entropy(h @ w.T, y), differentiable
    loss_rows, pred = linear_cross_entropy_stats(h, w, y)   # per-row loss and argmax, no grad

h: (N, C) hidden states, w: (V, C) unembedding, y: (N,) targets (``ignore_index`` rows are skipped).
The (N, V) logits are never materialized: the forward streams vocabulary tiles keeping a running
max and sum-exp per row (online logsumexp), the target logit and the argmax; the backward
recomputes each logits tile from h and w and the saved logsumexp:
    dlogits = softmax - onehot(y)  (scaled per row),  dH = dlogits @ W,  dW = dlogitsᵀ @ H.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency, but keep the reference usable
    triton = None

BLOCK_N, BLOCK_V, BLOCK_C = 32, 64, 32


def linear_cross_entropy_reference(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
                                   reduction: str = "mean", ignore_index: int = -100) -> torch.Tensor:
    return F.cross_entropy((h @ w.T).float(), y, reduction=reduction, ignore_index=ignore_index)


def linear_cross_entropy_stats_reference(h, w, y, ignore_index: int = -100):
    logits = (h @ w.T).float()
    loss = F.cross_entropy(logits, y, reduction="none", ignore_index=ignore_index)
    return loss, logits.argmax(-1)


if triton is not None:

    @triton.jit
    def _logits_tile(H, W, rows, cols, rmask, vmask, C, s_hn, s_hc, s_wv, s_wc,
                     BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
        acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            ks = c0 + tl.arange(0, BLOCK_C)
            kmask = ks < C
            h = tl.load(H + rows[:, None] * s_hn + ks[None, :] * s_hc,
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(W + cols[:, None] * s_wv + ks[None, :] * s_wc,
                        mask=vmask[:, None] & kmask[None, :], other=0.0)
            acc += tl.dot(h, tl.trans(w), input_precision="ieee")
        return acc

    @triton.jit
    def _flce_forward(H, W, Y, LOSS, LSE, ARGMAX, N, C, V, s_hn, s_hc, s_wv, s_wc, ignore_index,
                      BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        y = tl.load(Y + rows, mask=rmask, other=0)
        m = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)  # running max
        s = tl.zeros([BLOCK_N], dtype=tl.float32)                # running sum of exp(logit - m)
        target = tl.zeros([BLOCK_N], dtype=tl.float32)
        best = tl.zeros([BLOCK_N], dtype=tl.int32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            vmask = cols < V
            logits = _logits_tile(H, W, rows, cols, rmask, vmask, C, s_hn, s_hc, s_wv, s_wc,
                                  BLOCK_N, BLOCK_V, BLOCK_C)
            logits = tl.where(vmask[None, :], logits, float("-inf"))
            tile_max = tl.max(logits, 1)
            tile_arg = tl.argmax(logits, 1).to(tl.int32) + v0
            best = tl.where(tile_max > m, tile_arg, best)
            m_new = tl.maximum(m, tile_max)
            # online logsumexp: s <- s * exp(m - m_new) + sum exp(logits - m_new)
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), 1)
            m = m_new
            target += tl.sum(tl.where(cols[None, :] == y[:, None], logits, 0.0), 1)
        lse = m + tl.log(s)
        loss = tl.where(y == ignore_index, 0.0, lse - target)  # CE = logsumexp - target logit
        tl.store(LSE + rows, lse, mask=rmask)
        tl.store(LOSS + rows, loss, mask=rmask)
        tl.store(ARGMAX + rows, best, mask=rmask)

    @triton.jit
    def _dlogits_tile(H, W, Y, LSE, SCALE, rows, cols, rmask, vmask, C, s_hn, s_hc, s_wv, s_wc,
                      BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
        logits = _logits_tile(H, W, rows, cols, rmask, vmask, C, s_hn, s_hc, s_wv, s_wc,
                              BLOCK_N, BLOCK_V, BLOCK_C)
        lse = tl.load(LSE + rows, mask=rmask, other=0.0)
        y = tl.load(Y + rows, mask=rmask, other=-1)
        scale = tl.load(SCALE + rows, mask=rmask, other=0.0)
        p = tl.exp(logits - lse[:, None])  # softmax
        g = p - tl.where(cols[None, :] == y[:, None], 1.0, 0.0)  # dCE/dlogits = softmax - onehot
        return tl.where(vmask[None, :] & rmask[:, None], g * scale[:, None], 0.0)

    @triton.jit
    def _flce_backward_dh(H, W, Y, LSE, SCALE, DH, N, C, V, s_hn, s_hc, s_wv, s_wc,
                          BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            vmask = cols < V
            g = _dlogits_tile(H, W, Y, LSE, SCALE, rows, cols, rmask, vmask, C, s_hn, s_hc, s_wv, s_wc,
                              BLOCK_N, BLOCK_V, BLOCK_C)
            for c0 in range(0, C, BLOCK_C):  # dH[rows, :] += g @ W[cols, :]
                ks = c0 + tl.arange(0, BLOCK_C)
                kmask = ks < C
                w = tl.load(W + cols[:, None] * s_wv + ks[None, :] * s_wc,
                            mask=vmask[:, None] & kmask[None, :], other=0.0)
                ptr = DH + rows[:, None] * C + ks[None, :]
                msk = rmask[:, None] & kmask[None, :]
                tl.store(ptr, tl.load(ptr, mask=msk, other=0.0) + tl.dot(g, w, input_precision="ieee"), mask=msk)

    @triton.jit
    def _flce_backward_dw(H, W, Y, LSE, SCALE, DW, N, C, V, s_hn, s_hc, s_wv, s_wc,
                          BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
        cols = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        vmask = cols < V
        for n0 in range(0, N, BLOCK_N):
            rows = n0 + tl.arange(0, BLOCK_N)
            rmask = rows < N
            g = _dlogits_tile(H, W, Y, LSE, SCALE, rows, cols, rmask, vmask, C, s_hn, s_hc, s_wv, s_wc,
                              BLOCK_N, BLOCK_V, BLOCK_C)
            for c0 in range(0, C, BLOCK_C):  # dW[cols, :] += gᵀ @ H[rows, :]
                ks = c0 + tl.arange(0, BLOCK_C)
                kmask = ks < C
                h = tl.load(H + rows[:, None] * s_hn + ks[None, :] * s_hc,
                            mask=rmask[:, None] & kmask[None, :], other=0.0)
                ptr = DW + cols[:, None] * C + ks[None, :]
                msk = vmask[:, None] & kmask[None, :]
                tl.store(ptr, tl.load(ptr, mask=msk, other=0.0) + tl.dot(tl.trans(g), h, input_precision="ieee"),
                         mask=msk)


def _check(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    if h.dim() != 2 or w.dim() != 2 or y.dim() != 1:
        raise ValueError(f"expected h (N, C), w (V, C), y (N,); got {tuple(h.shape)}, {tuple(w.shape)}, {tuple(y.shape)}")
    if h.shape[1] != w.shape[1] or h.shape[0] != y.shape[0]:
        raise ValueError(f"shape mismatch: h {tuple(h.shape)}, w {tuple(w.shape)}, y {tuple(y.shape)}")


def _forward_triton(h, w, y, ignore_index):
    N, C = h.shape
    V = w.shape[0]
    loss = torch.empty(N, dtype=torch.float32, device=h.device)
    lse = torch.empty(N, dtype=torch.float32, device=h.device)
    argmax = torch.empty(N, dtype=torch.int32, device=h.device)
    _flce_forward[(triton.cdiv(N, BLOCK_N),)](
        h, w, y, loss, lse, argmax, N, C, V, h.stride(0), h.stride(1), w.stride(0), w.stride(1),
        ignore_index, BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V, BLOCK_C=BLOCK_C)
    return loss, lse, argmax


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, y, reduction, ignore_index):
        h, w, y = h.contiguous(), w.contiguous(), y.contiguous()
        loss, lse, _ = _forward_triton(h, w, y, ignore_index)
        valid = (y != ignore_index)
        ctx.save_for_backward(h, w, y, lse, valid)
        ctx.reduction = reduction
        if reduction == "none":
            return loss
        total = loss.sum()
        return total / valid.sum().clamp(min=1) if reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad_out):
        h, w, y, lse, valid = ctx.saved_tensors
        N, C = h.shape
        V = w.shape[0]
        if ctx.reduction == "none":
            scale = grad_out.float() * valid
        elif ctx.reduction == "mean":
            scale = grad_out.float() * valid / valid.sum().clamp(min=1)
        else:
            scale = grad_out.float() * valid.float()
        scale = scale.float().contiguous()
        dh = torch.zeros(N, C, dtype=torch.float32, device=h.device)
        dw = torch.zeros(V, C, dtype=torch.float32, device=h.device)
        args = (h, w, y, lse, scale)
        strides = (N, C, V, h.stride(0), h.stride(1), w.stride(0), w.stride(1))
        if ctx.needs_input_grad[0]:
            _flce_backward_dh[(triton.cdiv(N, BLOCK_N),)](*args, dh, *strides,
                                                          BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V, BLOCK_C=BLOCK_C)
        if ctx.needs_input_grad[1]:
            _flce_backward_dw[(triton.cdiv(V, BLOCK_V),)](*args, dw, *strides,
                                                          BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V, BLOCK_C=BLOCK_C)
        return dh.to(h.dtype), dw.to(w.dtype), None, None, None


def linear_cross_entropy(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, reduction: str = "mean",
                         ignore_index: int = -100, backend: Backend = "auto") -> torch.Tensor:
    """Cross-entropy of logits h @ w.T against y, without materializing the logits on the Triton path."""
    _check(h, w, y)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction: expected mean, sum or none (got {reduction!r})")
    if use_triton(h, w, y, backend=backend):
        return _LinearCrossEntropy.apply(h, w, y, reduction, ignore_index)
    return linear_cross_entropy_reference(h, w, y, reduction, ignore_index)


@torch.no_grad()
def linear_cross_entropy_stats(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, ignore_index: int = -100,
                               backend: Backend = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss (0 for ignored rows) and argmax prediction, for evaluation."""
    _check(h, w, y)
    if use_triton(h, w, y, backend=backend):
        loss, _, argmax = _forward_triton(h.contiguous(), w.contiguous(), y.contiguous(), ignore_index)
        return loss, argmax.long()
    return linear_cross_entropy_stats_reference(h, w, y, ignore_index)


def _bench_inputs(n: int, c: int, v: int, device: str):
    h = torch.randn(n, c, device=device, requires_grad=True)
    w = torch.randn(v, c, device=device, requires_grad=True) / c**0.5
    y = torch.randint(0, v, (n,), device=device)
    return h, w.detach().requires_grad_(), y


def _bench_fwd_bwd(fn):
    def run(h, w, y):
        fn(h, w, y).backward()
    return run


# (name, make_inputs(device), kernel, reference, bytes moved by an ideal kernel, flops)
BENCHMARKS = [
    ("fused_linear_ce fwd+bwd N=4096 C=512 V=32768",
     lambda device: _bench_inputs(4096, 512, 32768, device),
     _bench_fwd_bwd(lambda h, w, y: linear_cross_entropy(h, w, y, backend="triton")),
     _bench_fwd_bwd(lambda h, w, y: linear_cross_entropy(h, w, y, backend="torch")),
     4 * (2 * 4096 * 512 + 2 * 32768 * 512), 3 * 2 * 2 * 4096 * 512 * 32768),
]
BENCHMARKS_SMALL = [
    ("fused_linear_ce fwd+bwd N=97 C=40 V=203",
     lambda device: _bench_inputs(97, 40, 203, device),
     _bench_fwd_bwd(lambda h, w, y: linear_cross_entropy(h, w, y, backend="triton")),
     _bench_fwd_bwd(lambda h, w, y: linear_cross_entropy(h, w, y, backend="torch")),
     4 * (2 * 97 * 40 + 2 * 203 * 40), 3 * 2 * 2 * 97 * 40 * 203),
]
