"""Walrus in miniature: hMLP encoder -> space-time factorized processor -> mirrored decoder, with patch jitter.

Shapes: a window u is (B, T, C, N, N); tokens are (B, T, n, n, d) with n = N / (s1 s2).

- Encoder (official encoder: conv k8 then conv k4, each RMS-norm + SiLU, no bias). The first conv
  consumes the patches of the rolled, circularly padded field (kernels/rolled_patchify gathers them);
  its stride s1 and the second conv's stride s2 are chosen per resolution (compute-adaptive
  tokenization: a fixed token count per axis), the kernels stay (8, 4), so patches overlap.
- Processor block (space_time_split.py): causal time attention first (relative-position bias,
  QK-norm), then space attention in parallel with a SwiGLU MLP (QK-norm, axial RoPE on linspace(-1, 1)).
- Patch jitter (patch_jitterers.py, use_periodic_fixed_jitter): one integer shift per axis per
  forward call, shared over batch and time, U{-(N/2-1) .. N/2-1} ("domain") or U{-(p/2-1) .. p/2-1}
  ("patch"); before every block the token grid is rolled by randint(0, n) per axis and the total is
  undone after the last block (isotropic_model.py:371). Jitter stays on at evaluation.
- Normalisation (normalization_strat.py): inputs / per-sample per-field RMS over the context window;
  Δu targets / RMS of the window's frame differences; the model predicts normalised Δu.
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.rolled_patchify import rolled_patchify, rolled_unpatchify, rolled_unpatchify_reference, unchecked_patchify
from stages.walrus.common import K1, K2, STRIDES, hmlp_pad
from stages.walrus.jitter import PERIODIC_2D, BCs, Mode, axis_maps, boundary_flags, draw_jitter

Jitter = Mode
N_FLAGS = 3
EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# normalisation (ALGO: per-sample per-field RMS of the context window; Δu by RMS of frame diffs)
# ---------------------------------------------------------------------------------------------
def window_stats(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u (B, T, C, N, N) -> rms_in, rms_delta, each (B, 1, C, 1, 1)."""
    rms_in = u.pow(2).mean(dim=(1, 3, 4), keepdim=True).sqrt() + EPS
    if u.shape[1] > 1:
        d = u[:, 1:] - u[:, :-1]
        rms_delta = d.pow(2).mean(dim=(1, 3, 4), keepdim=True).sqrt() + EPS
    else:
        rms_delta = rms_in
    return rms_in, rms_delta


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
class RMSChannelNorm(nn.Module):
    """RMSGroupNorm as read in the official code: RMS per channel over space, learned gain."""

    def __init__(self, ch: int):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(ch))

    def forward(self, x):  # (B, C, H, W)
        return x * torch.rsqrt(x.pow(2).mean(dim=(-2, -1), keepdim=True) + EPS) * self.gain[:, None, None]


def axial_rope_2d(n: int, m: int, head_dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (n*m, head_dim/2) for axial RoPE on positions linspace(-1, 1) per axis (rows, then columns)."""
    quarter = head_dim // 4
    freqs = math.pi * torch.arange(1, quarter + 1, device=device, dtype=dtype)
    ang_y = torch.linspace(-1.0, 1.0, n, device=device, dtype=dtype)[:, None] * freqs[None]     # (n, quarter)
    ang_x = torch.linspace(-1.0, 1.0, m, device=device, dtype=dtype)[:, None] * freqs[None]     # (m, quarter)
    ang = torch.cat([ang_y[:, None, :].expand(n, m, quarter), ang_x[None, :, :].expand(n, m, quarter)], -1)
    ang = ang.reshape(n * m, 2 * quarter)
    return ang.cos(), ang.sin()


def axial_rope(n: int, head_dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (n*n, head_dim/2) for a square token grid."""
    return axial_rope_2d(n, n, head_dim, device, dtype)


def apply_rope(x, cos, sin):  # x (..., L, hd), cos/sin (L, hd/2)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
    return out.flatten(-2)


class SpaceTimeBlock(nn.Module):
    def __init__(self, d: int, heads: int, mlp_ratio: int, max_t: int):
        super().__init__()
        self.h = heads
        self.norm_t = nn.LayerNorm(d)
        self.qkv_t = nn.Linear(d, 3 * d, bias=False)
        self.out_t = nn.Linear(d, d, bias=False)
        self.qn_t, self.kn_t = nn.LayerNorm(d // heads), nn.LayerNorm(d // heads)
        self.rel_bias = nn.Parameter(torch.zeros(heads, max_t))          # T5-style bias by time lag
        self.norm_s = nn.LayerNorm(d)
        self.qkv_s = nn.Linear(d, 3 * d, bias=False)
        self.out_s = nn.Linear(d, d, bias=False)
        self.qn_s, self.kn_s = nn.LayerNorm(d // heads), nn.LayerNorm(d // heads)
        self.w12 = nn.Linear(d, 2 * mlp_ratio * d, bias=False)            # SwiGLU
        self.w3 = nn.Linear(mlp_ratio * d, d, bias=False)

    def _heads(self, x):  # (..., L, d) -> (..., h, L, hd)
        *lead, L, d = x.shape
        return x.view(*lead, L, self.h, d // self.h).transpose(-3, -2)

    def forward(self, x, cos, sin):  # x (B, T, n, m, d)
        B, T, n, m, d = x.shape
        # causal time attention (QK-norm, relative-position bias)
        y = self.norm_t(x).permute(0, 2, 3, 1, 4).reshape(B * n * m, T, d)
        q, k, v = (self._heads(t) for t in self.qkv_t(y).chunk(3, -1))
        q, k = self.qn_t(q), self.kn_t(k)
        lag = (torch.arange(T, device=x.device)[:, None] - torch.arange(T, device=x.device)[None, :])
        bias = self.rel_bias[:, lag.clamp(0, self.rel_bias.shape[1] - 1)]        # (h, T, T)
        bias = bias.masked_fill(lag[None] < 0, float("-inf"))                     # causal
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        a = self.out_t(a.transpose(-3, -2).reshape(B * n * m, T, d))
        x = x + a.view(B, n, m, T, d).permute(0, 3, 1, 2, 4)
        # space attention || SwiGLU (parallel block), QK-norm + axial RoPE
        y = self.norm_s(x).reshape(B * T, n * m, d)
        q, k, v = (self._heads(t) for t in self.qkv_s(y).chunk(3, -1))
        q, k = apply_rope(self.qn_s(q), cos, sin), apply_rope(self.kn_s(k), cos, sin)
        a = self.out_s(F.scaled_dot_product_attention(q, k, v).transpose(-3, -2).reshape(B * T, n * m, d))
        g, u = self.w12(y).chunk(2, -1)
        mlp = self.w3(F.silu(g) * u)
        return x + (a + mlp).view(B, T, n, m, d)


class Walrus(nn.Module):
    """One model; the jitter draws come from outside (``draw``), so that a seed's random stream is the
    same in a solo run and as a member of a vectorized ensemble (stages/common/ensemble.py)."""

    def __init__(self, channels: int = 2, d: int = 64, depth: int = 4, heads: int = 4, mlp_ratio: int = 4,
                 max_t: int = 8, jitter: Mode = "domain", token_roll: bool = True,
                 tokenization: Literal["adaptive", "fixed"] = "adaptive", tokens_per_axis: int = 8,
                 patch_size: int = 4):
        super().__init__()
        if d % (4 * heads):
            raise ValueError(f"d={d} must be a multiple of 4*heads for axial RoPE")
        self.c, self.d, self.depth = channels, d, depth
        self.jitter, self.token_roll, self.tokenization = jitter, token_roll, tokenization
        self.tokens_per_axis, self.patch_size = tokens_per_axis, patch_size
        c1 = d // 4
        cin = channels + N_FLAGS                       # fields + (bias, wall, open) flag channels
        self.enc1 = nn.Parameter(torch.randn(c1, cin * K1 * K1) / math.sqrt(cin * K1 * K1))
        self.enc_n1 = RMSChannelNorm(c1)
        self.enc2 = nn.Parameter(torch.randn(d, c1, K2, K2) / math.sqrt(c1 * K2 * K2))
        self.enc_n2 = RMSChannelNorm(d)
        self.blocks = nn.ModuleList(SpaceTimeBlock(d, heads, mlp_ratio, max_t) for _ in range(depth))
        self.dec_norm = nn.LayerNorm(d)
        self.dec1 = nn.Parameter(torch.randn(d, c1, K2, K2) / math.sqrt(d))
        self.dec_n1 = RMSChannelNorm(c1)
        self.dec2 = nn.Parameter(torch.zeros(c1, channels, K1, K1))
        self.kernel_backend = "train"   # "train": the vmappable torch reference; evaluate sets rec.backend
        self.kernel_calls = 0

    # --- tokenization ------------------------------------------------------------------------
    def strides(self, n_grid: int) -> tuple[int, int]:
        """ALGO: compute-adaptive tokenization: total stride N / tokens_per_axis (fixed: the patch size)."""
        p = n_grid // self.tokens_per_axis if self.tokenization == "adaptive" else self.patch_size
        if n_grid % p or p not in STRIDES:
            raise ValueError(f"patch {p} does not divide grid {n_grid} into a known stride {sorted(STRIDES)}")
        return STRIDES[p]

    def draw(self, rng: np.random.Generator, shape: tuple[int, int], bcs: BCs = PERIODIC_2D):
        """This model's jitter draws for one forward call: shift (2,), token rolls (depth, 2) (int64)."""
        s1, s2 = self.strides(shape[0])
        shift, rolls = draw_jitter(rng, shape, bcs, self.jitter, s1 * s2, hmlp_pad(s1, s2), self.depth,
                                   self.token_roll)
        return torch.from_numpy(shift), torch.from_numpy(rolls)

    def _patchify(self, x, my, mx, s1):
        if self.kernel_backend == "train":
            return unchecked_patchify(x, my, mx, K1, s1)
        return rolled_patchify(x, my, mx, K1, s1, backend=self.kernel_backend)

    def _unpatchify(self, y, iy, ix):
        if self.kernel_backend == "train":
            return rolled_unpatchify_reference(y, iy, ix)
        return rolled_unpatchify(y, iy, ix, backend=self.kernel_backend)

    def forward(self, x: torch.Tensor, bcs: BCs = PERIODIC_2D, shift: torch.Tensor | None = None,
                rolls: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C, H, W) normalised inputs -> (B, T, C, H, W) normalised Δu predictions.
        shift (2,) and rolls (depth, 2) integer tensors (zeros when None)."""
        B, T, C, H, W = x.shape
        s1, s2 = self.strides(H)
        if self.strides(W) != (s1, s2):
            raise ValueError(f"grid {H}x{W}: both axes need the same hMLP strides")
        if shift is None:
            shift = torch.zeros(2, dtype=torch.long, device=x.device)
        if rolls is None:
            rolls = torch.zeros(self.depth, 2, dtype=torch.long, device=x.device)
        # ALGO: patch jitter (pad / roll as index maps), flag channels, first strided conv (kernel)
        my, mx, iy, ix = axis_maps((H, W), bcs, self.jitter, shift, s1, s2, x.device)
        xf = x.reshape(B * T, C, H, W)
        patches = self._patchify(xf, my, mx, s1)                                        # (BT, C*64, L1)
        flags = F.unfold(boundary_flags(my, mx, bcs, x.dtype)[None], K1, stride=s1)    # (1, 3*64, L1)
        n1, m1 = (my.shape[0] - K1) // s1 + 1, (mx.shape[0] - K1) // s1 + 1
        w_field, w_flag = self.enc1[:, : C * K1 * K1], self.enc1[:, C * K1 * K1:]
        h = torch.einsum("oc,bcl->bol", w_field, patches) + torch.einsum("oc,bcl->bol", w_flag, flags)
        h = F.silu(self.enc_n1(h.reshape(B * T, -1, n1, m1)))
        h = F.silu(self.enc_n2(F.conv2d(h, self.enc2, stride=s2)))                     # (BT, d, n, m)
        n, m = h.shape[-2:]
        tok = h.reshape(B, T, self.d, n, m).permute(0, 1, 3, 4, 2)                      # (B, T, n, m, d)
        cos, sin = axial_rope_2d(n, m, self.d // self.blocks[0].h, x.device, x.dtype)
        rolled = self.token_roll and self.jitter != "none"
        total = torch.zeros(2, dtype=torch.long, device=x.device)
        for k, blk in enumerate(self.blocks):
            if rolled:                                    # ALGO: per-block token roll (periodic axes)
                tok = roll_tokens(tok, rolls[k])
                total = total + rolls[k]
            tok = blk(tok, cos, sin)
        if rolled:
            tok = roll_tokens(tok, -total)
        # decoder mirrors the encoder; then un-jitter (roll back + crop) as one gather (kernel)
        h = self.dec_norm(tok).permute(0, 1, 4, 2, 3).reshape(B * T, self.d, n, m)
        h = F.silu(self.dec_n1(F.conv_transpose2d(h, self.dec1, stride=s2)))
        y = F.conv_transpose2d(h, self.dec2, stride=s1)                                 # (BT, C, H', W')
        out = self._unpatchify(y, iy, ix)
        self.kernel_calls += 2
        return out.reshape(B, T, C, H, W)


def roll_tokens(tok: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """torch.roll of the token grid (B, T, n, m, d) by r = (ry, rx) as a gather (vmappable with per-member r)."""
    n, m = tok.shape[2], tok.shape[3]
    iy = torch.remainder(torch.arange(n, device=tok.device) - r[0], n)
    ix = torch.remainder(torch.arange(m, device=tok.device) - r[1], m)
    return tok[:, :, iy][:, :, :, ix]


def normalized_l1(model: Walrus, window: torch.Tensor, context: int, bcs: BCs = PERIODIC_2D,
                  shift: torch.Tensor | None = None, rolls: torch.Tensor | None = None) -> torch.Tensor:
    """ALGO: per-field normalised L1 on Δu. window (B, context+1, C, N, N); the first position is
    dropped (official: causal training predicts every step's delta, the first one is discarded)."""
    u = window[:, :context]
    rms_in, rms_delta = window_stats(u)
    target = (window[:, 1:] - window[:, :-1]) / rms_delta
    pred = model(u / rms_in, bcs, shift, rolls)
    start = 1 if context > 1 else 0
    return (pred[:, start:] - target[:, start:]).abs().mean()


def rollout_step(model: Walrus, win: torch.Tensor, bcs: BCs, shift=None, rolls=None) -> torch.Tensor:
    """ALGO: one autoregressive step u <- u + rms_delta * M(u / rms_in), stats from the current window.
    win (B, context, C, H, W) -> next frame (B, 1, C, H, W)."""
    rms_in, rms_delta = window_stats(win)
    pred = model(win / rms_in, bcs, shift, rolls)[:, -1:]     # last causal position: Δu of the next frame
    return win[:, -1:] + rms_delta * pred


@torch.no_grad()
def rollout(model: Walrus, init: torch.Tensor, steps: int, bcs: BCs = PERIODIC_2D,
            rng: np.random.Generator | None = None) -> torch.Tensor:
    """Autoregressive rollout with a fresh jitter draw per step (jitter stays on at evaluation).
    init (B, context, C, H, W) -> (B, steps, C, H, W) predicted frames."""
    win = init.clone()
    out = []
    for _ in range(steps):
        shift, rolls = (model.draw(rng, tuple(init.shape[-2:]), bcs) if rng is not None else (None, None))
        nxt = rollout_step(model, win, bcs, shift, rolls)
        out.append(nxt)
        win = torch.cat([win[:, 1:], nxt], 1)
    return torch.cat(out, 1)
