"""STAR-KV on the shared tiny transformer: hybrid SVD factorization of k/v projections, the differentiable
soft threshold (custom autograd), rank export, low-rank-aware mixed precision and the latent KV-cache
decode path through kernels/lowrank_attention.

Per layer ℓ: keys per KV head h, W_K,h (D×C) = U_h diag(σ_h) V_hᵀ (head-level threshold α_h); values
jointly, W_V (HD×C) = U diag(σ) Vᵀ (block-level threshold α_V). The cache stores the latents V_hᵀx and
Vᵀx; keys are rebuilt per head and rotated afterwards (RoPE after reconstruction).
"""
from __future__ import annotations

import copy
import math
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.lowrank_attention import decode, decode_quant, decode_ref, dequantize_latent, quantize_latent
from stages.common.tiny_transformer import TinyTransformer, apply_rope

KMode = Literal["head", "joint"]


class SoftThreshold(torch.autograd.Function):
    """ALGO: soft threshold f(σ) = σ·tanh(s(σ−α)) for σ > α, else −c·tanh(s(σ−α)) (c = 0 → 0),
    with the analytic gradient of that piecewise function in σ and α."""

    @staticmethod
    def forward(ctx, sigma, alpha, s: float, c: float):
        z = s * (sigma - alpha)
        t = torch.tanh(z)
        above = sigma > alpha
        ctx.save_for_backward(sigma, t, above)
        ctx.s, ctx.c = s, c
        return torch.where(above, sigma * t, -c * t)

    @staticmethod
    def backward(ctx, grad):
        sigma, t, above = ctx.saved_tensors
        s, c = ctx.s, ctx.c
        sech2 = 1.0 - t * t
        d_sigma = torch.where(above, t + sigma * s * sech2, -c * s * sech2)
        d_alpha = torch.where(above, -sigma * s * sech2, c * s * sech2)
        return grad * d_sigma, grad * d_alpha, None, None


def soft_threshold(sigma, alpha, s: float = 50.0, c: float = 0.0):
    return SoftThreshold.apply(sigma, alpha.expand_as(sigma), s, c)


def half_perm(D: int, device=None) -> torch.Tensor:
    """Channel order that turns the tiny transformer's interleaved RoPE pairs (2i, 2i+1) into the
    kernel's rotate-half pairs (i, i+D/2); q·k is invariant under a shared permutation."""
    return torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)]).to(device)


class LowRankAttn(nn.Module):
    """One layer's attention with factorized K (per head or joint) and V (joint)."""

    def __init__(self, attn, k_mode: KMode, scale_k: float, scale_v: float):
        super().__init__()
        H, D = attn.n_heads, attn.head_dim
        C = H * D
        self.H, self.D, self.k_mode = H, D, k_mode
        W = attn.qkv.weight.detach()
        self.wq = nn.Parameter(W[:C].clone())
        self.proj = copy.deepcopy(attn.proj)
        Wk, Wv = W[C:2 * C], W[2 * C:]
        if k_mode == "head":  # ALGO: per-head SVD of k_proj (keys reconstructed per head before RoPE)
            U, S, Vh = torch.linalg.svd(Wk.view(H, D, C), full_matrices=False)  # (H,D,D) (H,D) (H,D,C)
            self.alpha_k = nn.Parameter(torch.zeros(H, 1))
        else:  # one SVD of the whole k_proj (the "joint K" ablation)
            U, S, Vh = torch.linalg.svd(Wk, full_matrices=False)  # (C,C) (C,) (C,C)
            U, S, Vh = U[None], S[None], Vh[None]
            self.alpha_k = nn.Parameter(torch.zeros(1, 1))
        self.uk, self.sk, self.vk = nn.Parameter(U), nn.Parameter(S), nn.Parameter(Vh)
        U, S, Vh = torch.linalg.svd(Wv, full_matrices=False)  # ALGO: joint SVD of v_proj (block threshold)
        self.uv, self.sv, self.vv = nn.Parameter(U), nn.Parameter(S), nn.Parameter(Vh)
        self.alpha_v = nn.Parameter(torch.zeros(1))
        self.register_buffer("scale_k", torch.tensor(float(scale_k)))
        self.register_buffer("scale_v", torch.tensor(float(scale_v)))
        self.register_buffer("mask_k", torch.ones_like(self.sk.detach()))
        self.register_buffer("mask_v", torch.ones_like(self.sv.detach()))
        self.fused = False
        self.s = 50.0

    # ----- effective singular values
    def gate_k(self):
        if self.fused:
            return self.mask_k
        # σ̂ = σ/scale (a model-wide singular-value unit, so s = 50 sits at σ̂ = O(1))
        return self.scale_k * soft_threshold(self.sk / self.scale_k, self.alpha_k, self.s)

    def gate_v(self):
        if self.fused:
            return self.mask_v
        return self.scale_v * soft_threshold(self.sv / self.scale_v, self.alpha_v, self.s)

    def ranks(self) -> tuple[list[int], int]:
        """Rank = count of σ̂ > α (per K head or joint K, and joint V)."""
        if self.fused:
            return [int(m.sum()) for m in self.mask_k], int(self.mask_v.sum())
        rk = (self.sk / self.scale_k > self.alpha_k).sum(-1)
        return [int(r) for r in rk], int((self.sv / self.scale_v > self.alpha_v).sum())

    @torch.no_grad()
    def fuse(self, ranks_k: list[int] | None = None, rank_v: int | None = None, use_alpha: bool = True,
             gate: bool = False):
        """ALGO: Σ fusion (phase 3): V ← V·(σ−α)₊, Σ = 1, α = 0 (official export); columns sorted by the fused
        value; with explicit ranks (uniform arms) keep the top-r singular directions instead. gate=True fuses
        the soft-threshold value scale·f(σ/scale; α) (≈ σ above α, 0 below) instead of σ − α (diagnostic)."""
        def one(u, s, vh, a, scale, r):
            if gate:
                eff = scale * soft_threshold(s / scale, a, self.s)
            else:
                eff = (s - a * scale).clamp_min(0) if use_alpha else s.clone()
            order = torch.argsort(eff, dim=-1, descending=True)
            eff = torch.gather(eff, -1, order)
            keep = (eff > 0).float() if r is None else (torch.arange(eff.shape[-1]) < r).float()
            u.copy_(torch.gather(u, -1, order[..., None, :].expand_as(u)))
            vh.copy_(torch.gather(vh, -2, order[..., :, None].expand_as(vh)) * (eff * keep)[..., None])
            s.fill_(1.0)
            return keep
        for i in range(self.uk.shape[0]):
            self.mask_k[i] = one(self.uk[i], self.sk[i], self.vk[i], self.alpha_k[i], self.scale_k,
                                 None if ranks_k is None else ranks_k[i])
        self.mask_v.copy_(one(self.uv, self.sv, self.vv, self.alpha_v, self.scale_v, rank_v))
        self.alpha_k.zero_()
        self.alpha_v.zero_()
        self.alpha_k.requires_grad_(False)
        self.alpha_v.requires_grad_(False)
        self.sk.requires_grad_(False)
        self.sv.requires_grad_(False)
        self.fused = True

    # ----- latents and reconstruction
    def latents(self, x):
        """(k_latent (B,T,Hk',R), v_latent (B,T,Rv)) with the gates folded in."""
        lk = torch.einsum("btc,hrc->bthr", x, self.vk) * self.gate_k()
        lv = (x @ self.vv.T) * self.gate_v()
        return lk, lv

    def keys_values(self, lk, lv):
        B, T = lv.shape[:2]
        if self.k_mode == "head":
            k = torch.einsum("bthr,hdr->bhtd", lk, self.uk)
        else:
            k = (lk[:, :, 0] @ self.uk[0].T).view(B, T, self.H, self.D).transpose(1, 2)
        v = (lv @ self.uv.T).view(B, T, self.H, self.D).transpose(1, 2)
        return k, v

    def forward(self, x, rope, quant: dict | None = None):
        B, T, C = x.shape
        q = (x @ self.wq.T).view(B, T, self.H, self.D).transpose(1, 2)
        lk, lv = self.latents(x)
        if quant is not None:  # the cache holds quantized latents; every token reads them back
            lk, lv = quant_roundtrip(self, lk, lv, **quant)
        k, v = self.keys_values(lk, lv)
        cos, sin = rope[0][:T], rope[1][:T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    # ----- export for the decode kernel
    def export(self):
        """Per-head ranks → (k_down (Hk', Rk, C), k_up (H, Rk, D) in rotate-half channel order, Rk per head,
        v_down (Rv, C), v_up (Rv, H·D)); zero-padded heads."""
        assert self.fused
        perm = half_perm(self.D, self.uk.device)
        rk = [int(m.sum()) for m in self.mask_k]
        Rk, Rv = max(max(rk), 1), max(int(self.mask_v.sum()), 1)
        if self.k_mode == "head":
            kd = torch.zeros(self.H, Rk, self.vk.shape[-1], device=self.uk.device)
            ku = torch.zeros(self.H, Rk, self.D, device=self.uk.device)
            for h, r in enumerate(rk):
                kd[h, :r] = self.vk[h, :r]
                ku[h, :r] = self.uk[h][:, :r].T[:, perm]
        else:
            kd = self.vk[0, :Rk][None]
            ku = self.uk[0][:, :Rk].T.reshape(Rk, self.H, self.D).transpose(0, 1)[:, :, perm]
        return kd.detach(), ku.contiguous().detach(), rk, self.vv[:Rv].detach(), self.uv[:, :Rv].T.contiguous().detach()


def qspec(n_hi: int, r: int, hi_bits: int) -> tuple[int, int]:
    """(n_hi, hi_bits) for quantize_latent; hi_bits 4 = uniform int4 (no high-precision part)."""
    return (0, 8) if hi_bits == 4 else (min(n_hi, r), hi_bits)


def quant_roundtrip(attn: LowRankAttn, lk, lv, hi_k: int, hi_v: int, hi_bits: int):
    """Quantize → dequantize the exported (rank-truncated) latents, per token (and head for K)."""
    rk = [int(m.sum()) for m in attn.mask_k]
    out_k = torch.zeros_like(lk)
    for h, r in enumerate(rk):
        if r:
            ql = quantize_latent(lk[:, :, h, :r], *qspec(hi_k, r, hi_bits))
            out_k[:, :, h, :r] = dequantize_latent(ql)
    rv = int(attn.mask_v.sum())
    out_v = torch.zeros_like(lv)
    if rv:
        ql = quantize_latent(lv[..., :rv], *qspec(hi_v, rv, hi_bits))
        out_v[..., :rv] = dequantize_latent(ql)
    return out_k, out_v


class StarKVLM(nn.Module):
    """The student: the teacher's embeddings/MLPs/norms/q/o, with factorized k/v projections."""

    def __init__(self, teacher: TinyTransformer, k_mode: KMode = "head"):
        super().__init__()
        t = copy.deepcopy(teacher)
        self.cfg = t.cfg
        self.embed, self.norm, self.lm_head = t.embed, t.norm, t.lm_head
        self.norm1 = nn.ModuleList(b.norm1 for b in t.blocks)
        self.norm2 = nn.ModuleList(b.norm2 for b in t.blocks)
        self.mlp = nn.ModuleList(b.mlp for b in t.blocks)
        self.register_buffer("rope_cos", t.rope_cos, persistent=False)
        self.register_buffer("rope_sin", t.rope_sin, persistent=False)
        # one singular-value unit per type: the median top singular value over layers (and heads)
        sk, sv = [], []
        for b in t.blocks:
            C = b.attn.n_heads * b.attn.head_dim
            W = b.attn.qkv.weight.detach()
            Wk = W[C:2 * C] if k_mode == "joint" else W[C:2 * C].view(b.attn.n_heads, b.attn.head_dim, C)
            sk.append(torch.linalg.matrix_norm(Wk, ord=2).reshape(-1))
            sv.append(torch.linalg.matrix_norm(W[2 * C:], ord=2).reshape(-1))
        scale_k, scale_v = float(torch.cat(sk).median()), float(torch.cat(sv).median())
        self.attn = nn.ModuleList(LowRankAttn(b.attn, k_mode, scale_k, scale_v) for b in t.blocks)
        self.k_mode = k_mode

    @property
    def unembed(self):
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def alphas(self, kind: str):
        return [a.alpha_k if kind == "k" else a.alpha_v for a in self.attn]

    def rank_totals(self) -> tuple[int, int]:
        rk = sum(sum(a.ranks()[0]) for a in self.attn)
        rv = sum(a.ranks()[1] for a in self.attn)
        return rk, rv

    def forward(self, idx, quant: dict | None = None):
        x = self.embed(idx)
        rope = (self.rope_cos, self.rope_sin)
        for i, a in enumerate(self.attn):
            x = x + a(self.norm1[i](x), rope, quant)
            x = x + self.mlp[i](self.norm2[i](x))
        return self.norm(x) @ self.unembed.T

    @torch.no_grad()
    def decode_logits(self, idx, backend="torch", quant: dict | None = None, rec=None, name="lowrank_attention"):
        """Token-by-token decoding with a cache of latents only (fp32 or quantized); logits (B, T, V).
        Each step appends the new token's latents and calls the fused decode kernel."""
        B, T = idx.shape
        cache = [([], []) for _ in self.attn]
        exports = [a.export() for a in self.attn]
        logits = []
        for t in range(T):
            x = self.embed(idx[:, t:t + 1])
            pos = torch.arange(t + 1, device=idx.device)
            for i, a in enumerate(self.attn):
                kd, ku, rk, vd, vu = exports[i]
                h = self.norm1[i](x)[:, 0]  # (B, C)
                q = (h @ a.wq.T).view(B, 1, a.H, a.D).transpose(1, 2)
                q = apply_rope(q, self.rope_cos[t:t + 1], self.rope_sin[t:t + 1])[:, :, 0][:, :, half_perm(a.D, q.device)]
                cache[i][0].append(torch.einsum("bc,hrc->bhr", h, kd))  # latents only
                cache[i][1].append(h @ vd.T)
                kl = torch.stack(cache[i][0], 1)  # (B, t+1, Hk', Rk)
                vl = torch.stack(cache[i][1], 1)  # (B, t+1, Rv)
                if kl.shape[2] != a.H:  # joint K: one latent shared by every head
                    kl = kl.expand(-1, -1, a.H, -1)
                if quant is not None:
                    kq = quantize_latent(kl, *qspec(quant["hi_k"], kl.shape[-1], quant["hi_bits"]))
                    vq = quantize_latent(vl, *qspec(quant["hi_v"], vl.shape[-1], quant["hi_bits"]))
                if ku.shape[1] > a.D:  # joint K with rank > head_dim: outside the kernel's API (reference)
                    if quant is not None:  # the cache is still the quantized one
                        kl, vl = dequantize_latent(kq), dequantize_latent(vq)
                    y = decode_ref(q, kl, ku, vl, vu, pos, 10000.0)
                elif quant is None:
                    y = decode(q, kl, ku, vl, vu, pos, 10000.0, backend=backend)
                else:
                    y = decode_quant(q, kq, ku, vq, vu, pos, 10000.0, backend=backend)
                if rec is not None:
                    rec.count(name)
                x = x + a.proj(y.reshape(B, 1, -1))
                x = x + self.mlp[i](self.norm2[i](x))
            logits.append(self.norm(x) @ self.unembed.T)
        return torch.cat(logits, 1)


def kv_bytes_per_token(model: StarKVLM, bits: float = 16.0) -> float:
    """Latent cache bytes per token (all layers) at `bits` per element (joint K counted once)."""
    rk, rv = model.rank_totals()
    return (rk + rv) * bits / 8


def dense_kv_bytes_per_token(cfg, bits: float = 16.0) -> float:
    return 2 * cfg.n_layers * cfg.d_model * bits / 8


def quant_bytes_per_token(model: StarKVLM, hi_k: int, hi_v: int, hi_bits: int, scale_bytes: int = 2) -> float:
    """Bytes per token of the mixed-precision latent cache: hi part at hi_bits, rest 4-bit, plus one
    per-token scale per part (fp16) per row."""
    total = 0.0
    for a in model.attn:
        rks, rv = a.ranks()
        for r, n_hi in [(r, hi_k) for r in rks] + [(rv, hi_v)]:
            if r == 0:
                continue
            hi = qspec(n_hi, r, hi_bits)[0]
            total += hi * hi_bits / 8 + (r - hi) * 0.5 + scale_bytes * (1 + (hi > 0))
    return total
