"""STAR-KV on a Hugging Face Llama-family causal LM (GQA, RoPE): hybrid SVD factorization of k_proj/v_proj,
the differentiable soft threshold (custom autograd), rank export, low-rank-aware mixed precision and the
latent KV-cache decode path through kernels/lowrank_attention.

Per layer ℓ: keys per KV head h, W_K,h (D×C) = U_h diag(σ_h) V_hᵀ (head-level threshold α_h); values
jointly, W_V (Hkv·D×C) = U diag(σ) Vᵀ (block-level threshold α_V). The cache stores the latents V_hᵀx and
Vᵀx; keys are rebuilt per head and rotated afterwards (RoPE after reconstruction; rotate-half, as in HF
Llama). The same code runs the toy (a tiny random ``LlamaForCausalLM`` trained here) and a real
checkpoint (``from_pretrained``; the ``full`` profile).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.lowrank_attention import (QuantLatent, decode, decode_quant, dequantize_latent, quantize_latent,
                                       rope_rotate_half)

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


# ----------------------------------------------------------------------------- the backbone
@dataclass(frozen=True)
class Backbone:
    """What STAR-KV reads from a Llama-family HF causal LM."""
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    vocab_size: int

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def llama_backbone(model) -> Backbone:
    """Check that `model` is a Llama-family causal LM this code supports (pre-norm decoder layers with
    q/k/v/o projections without bias, static rotate-half RoPE, scaling 1/√D) and return its shape.
    ValueError (one line) otherwise."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "embed_tokens") or not hasattr(model, "lm_head"):
        raise ValueError(f"{type(model).__name__}: not a Llama-family causal LM (model.model.layers, "
                         "embed_tokens, lm_head)")
    cfg = model.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    attn = layers[0].self_attn
    D = attn.head_dim
    for i, layer in enumerate(layers):
        a = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            if getattr(a, name).bias is not None:
                raise ValueError(f"layer {i} {name}: has a bias (STAR-KV latents here assume bias-free k/v/q)")
        if abs(a.scaling - D ** -0.5) > 1e-12 * D:
            raise ValueError(f"layer {i}: attention scaling {a.scaling} is not 1/sqrt(head_dim)")
    rot = inner.rotary_emb
    if getattr(rot, "rope_type", "default") not in ("default", "linear", "llama3") or rot.attention_scaling != 1.0:
        raise ValueError(f"rotary embedding {getattr(rot, 'rope_type', '?')} (attention scaling "
                         f"{rot.attention_scaling}) is not a static RoPE")
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
        raise ValueError("sliding-window attention is not supported")
    return Backbone(len(layers), H, Hkv, D, cfg.hidden_size, cfg.vocab_size)


def causal_rope(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x (B, heads, T, D) at positions 0..T-1."""
    return rope_rotate_half(x, torch.arange(x.shape[-2], device=x.device), inv_freq)


class LowRankAttn(nn.Module):
    """One layer's attention with factorized K (per KV head, or joint over KV heads) and V (joint)."""

    def __init__(self, attn, H: int, Hkv: int, k_mode: KMode, scale_k: float, scale_v: float):
        super().__init__()
        D = attn.head_dim
        C = attn.q_proj.weight.shape[1]
        self.H, self.Hkv, self.D, self.k_mode = H, Hkv, D, k_mode
        self.q_proj = copy.deepcopy(attn.q_proj)
        self.o_proj = copy.deepcopy(attn.o_proj)
        Wk = attn.k_proj.weight.detach().float()
        Wv = attn.v_proj.weight.detach().float()
        if k_mode == "head":  # ALGO: per-head SVD of k_proj (keys reconstructed per head before RoPE)
            U, S, Vh = torch.linalg.svd(Wk.view(Hkv, D, C), full_matrices=False)  # (Hkv,D,D) (Hkv,D) (Hkv,D,C)
            self.alpha_k = nn.Parameter(torch.zeros(Hkv, 1))
        else:  # one SVD of the whole k_proj (the "joint K" ablation)
            U, S, Vh = torch.linalg.svd(Wk, full_matrices=False)  # (Hkv·D,R) (R,) (R,C)
            U, S, Vh = U[None], S[None], Vh[None]
            self.alpha_k = nn.Parameter(torch.zeros(1, 1))
        dt = attn.k_proj.weight.dtype
        self.uk, self.sk, self.vk = (nn.Parameter(t.to(dt)) for t in (U, S, Vh))
        U, S, Vh = torch.linalg.svd(Wv, full_matrices=False)  # ALGO: joint SVD of v_proj (block threshold)
        self.uv, self.sv, self.vv = (nn.Parameter(t.to(dt)) for t in (U, S, Vh))
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
        """Rank = count of σ̂ > α (per KV head or joint K, and joint V)."""
        if self.fused:
            return [int(m.sum()) for m in self.mask_k], int(self.mask_v.sum())
        rk = (self.sk / self.scale_k > self.alpha_k).sum(-1)
        return [int(r) for r in rk], int((self.sv / self.scale_v > self.alpha_v).sum())

    @torch.no_grad()
    def fuse(self, ranks_k: list[int] | None = None, rank_v: int | None = None, use_alpha: bool = True,
             gate: bool = False):
        """ALGO: Σ fusion (phase 3): V ← V·(σ−α)₊, Σ = 1, α = 0 (official export); columns sorted by the fused
        value. Explicit ranks keep the top-r directions (by fused value) instead of those above α. gate=True
        fuses the soft-threshold value scale·f(σ/scale; α) (≈ σ above α, 0 below) instead of σ − α;
        use_alpha=False fuses σ itself (plain SVD truncation)."""
        def one(u, s, vh, a, scale, r):
            if gate:
                eff = scale * soft_threshold(s / scale, a, self.s)
            else:
                eff = (s - a * scale).clamp_min(0) if use_alpha else s.clone()
            order = torch.argsort(eff, dim=-1, descending=True)
            eff = torch.gather(eff, -1, order)
            keep = (eff > 0).to(eff.dtype) if r is None else (torch.arange(eff.shape[-1], device=eff.device) < r).to(eff.dtype)
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
        for p in (self.alpha_k, self.alpha_v, self.sk, self.sv):
            p.requires_grad_(False)
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
            k = (lk[:, :, 0] @ self.uk[0].T).view(B, T, self.Hkv, self.D).transpose(1, 2)
        v = (lv @ self.uv.T).view(B, T, self.Hkv, self.D).transpose(1, 2)
        return k, v

    def forward(self, x, inv_freq, quant: "QuantSpec | None" = None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D).transpose(1, 2)
        lk, lv = self.latents(x)
        if quant is not None:  # the cache holds quantized latents; every token reads them back
            lk, lv = quant_roundtrip(self, lk, lv, quant)
        k, v = self.keys_values(lk, lv)
        q, k = causal_rope(q, inv_freq), causal_rope(k, inv_freq)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.H != self.Hkv)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.D))

    # ----- export for the decode kernel
    def export(self):
        """Ranks → (k_down (Hk', Rk, C), k_up (Hkv, Rk, D), per-head ranks, v_down (Rv, C), v_up (Rv, Hkv·D));
        heads of smaller rank zero-padded to the layer's largest."""
        assert self.fused
        rk = [int(m.sum()) for m in self.mask_k]
        Rk, Rv = max(max(rk), 1), max(int(self.mask_v.sum()), 1)
        if self.k_mode == "head":
            kd = torch.zeros(self.Hkv, Rk, self.vk.shape[-1], device=self.uk.device, dtype=self.uk.dtype)
            ku = torch.zeros(self.Hkv, Rk, self.D, device=self.uk.device, dtype=self.uk.dtype)
            for h, r in enumerate(rk):
                kd[h, :r] = self.vk[h, :r]
                ku[h, :r] = self.uk[h][:, :r].T
        else:
            kd = self.vk[0, :Rk][None]
            ku = self.uk[0][:, :Rk].T.reshape(Rk, self.Hkv, self.D).transpose(0, 1)
        return kd.detach(), ku.contiguous().detach(), rk, self.vv[:Rv].detach(), self.uv[:, :Rv].T.contiguous().detach()


# ----------------------------------------------------------------------------- quantized caches
@dataclass(frozen=True)
class QuantSpec:
    """How the latent cache is stored: the top hi_k (per KV head) / hi_v (per layer) ranks at hi_bits (8:
    int8 + an fp16 scale per token; 16: fp16), the rest int4 with an fp16 scale per token and group of
    group_k / group_v columns (None: one group). hi_k = hi_v = 0 is uniform int4."""
    hi_k: int = 0
    hi_v: int = 0
    hi_bits: int = 8
    group_k: int | None = None
    group_v: int | None = None

    def parts(self, kind: str, rank: int) -> tuple[int, int, int | None]:
        n_hi = min(self.hi_k if kind == "k" else self.hi_v, rank)
        return n_hi, self.hi_bits, self.group_k if kind == "k" else self.group_v

    def quantize(self, x: torch.Tensor, kind: str) -> QuantLatent:
        return quantize_latent(x, *self.parts(kind, x.shape[-1]))

    def row_bytes(self, kind: str, rank: int) -> int:
        """Bytes one cache row of this rank occupies (codes + every scale), from the storage format itself."""
        if rank == 0:
            return 0
        return self.quantize(torch.zeros(1, rank), kind).nbytes()


def quant_roundtrip(attn: LowRankAttn, lk, lv, spec: QuantSpec):
    """Quantize → dequantize the exported (rank-truncated, zero-padded) latents per token, exactly as the
    decode cache stores them."""
    rk = [int(m.sum()) for m in attn.mask_k]
    Rk, Rv = max(max(rk), 1), max(int(attn.mask_v.sum()), 1)
    out_k, out_v = torch.zeros_like(lk), torch.zeros_like(lv)
    out_k[..., :Rk] = dequantize_latent(spec.quantize(lk[..., :Rk], "k")).to(lk.dtype)
    out_v[..., :Rv] = dequantize_latent(spec.quantize(lv[..., :Rv], "v")).to(lv.dtype)
    return out_k, out_v


def equal_bytes_int4(ranks_k: list[list[int]], ranks_v: list[int], mixed: QuantSpec) -> QuantSpec:
    """Uniform int4 spending the bytes the mixed format spends on its high-precision ranks on finer scale
    groups instead: the (K group, V group) pair whose total bytes (all rows, ragged ranks, K and V pooled) come
    closest to the mixed format's without exceeding them (ties: the smaller groups). A rule of the storage
    format, not of any measured quality."""
    rows = {"k": [r for layer in ranks_k for r in layer], "v": list(ranks_v)}
    budget = sum(mixed.row_bytes(kind, r) for kind in rows for r in rows[kind])
    widest = {kind: max(rows[kind] + [1]) for kind in rows}
    cost = {kind: {g: sum(QuantSpec(0, 0, 8, g, g).row_bytes(kind, r) for r in rows[kind])
                   for g in range(1, widest[kind] + 1)} for kind in rows}
    best = (widest["k"], widest["v"])
    best_key = (-(cost["k"][best[0]] + cost["v"][best[1]]), best[0] + best[1])
    for gk, ck in cost["k"].items():
        for gv, cv in cost["v"].items():
            if ck + cv <= budget and (-(ck + cv), gk + gv) < best_key:
                best, best_key = (gk, gv), (-(ck + cv), gk + gv)
    return QuantSpec(0, 0, 8, best[0], best[1])


# ----------------------------------------------------------------------------- the student
class StarKVLM(nn.Module):
    """The student: the teacher's embeddings/MLPs/norms/q/o projections, with factorized k/v projections.
    `teacher` is a Llama-family HF causal LM (see llama_backbone)."""

    def __init__(self, teacher, k_mode: KMode = "head"):
        super().__init__()
        bb = llama_backbone(teacher)
        t = copy.deepcopy(teacher)
        self.bb, self.k_mode = bb, k_mode
        inner = t.model
        self.embed, self.norm, self.lm_head = inner.embed_tokens, inner.norm, t.lm_head
        self.norm1 = nn.ModuleList(layer.input_layernorm for layer in inner.layers)
        self.norm2 = nn.ModuleList(layer.post_attention_layernorm for layer in inner.layers)
        self.mlp = nn.ModuleList(layer.mlp for layer in inner.layers)
        self.register_buffer("inv_freq", inner.rotary_emb.inv_freq.detach().float().clone(), persistent=False)
        # one singular-value unit per type: the median top singular value over layers (and KV heads)
        sk, sv = [], []
        for layer in inner.layers:
            a = layer.self_attn
            Wk = a.k_proj.weight.detach().float()
            Wk = Wk if k_mode == "joint" else Wk.view(bb.n_kv_heads, bb.head_dim, -1)
            sk.append(torch.linalg.matrix_norm(Wk, ord=2).reshape(-1))
            sv.append(torch.linalg.matrix_norm(a.v_proj.weight.detach().float(), ord=2).reshape(-1))
        scale_k, scale_v = float(torch.cat(sk).median()), float(torch.cat(sv).median())
        self.attn = nn.ModuleList(LowRankAttn(layer.self_attn, bb.n_heads, bb.n_kv_heads, k_mode, scale_k, scale_v)
                                  for layer in inner.layers)

    def alphas(self, kind: str):
        return [a.alpha_k if kind == "k" else a.alpha_v for a in self.attn]

    def rank_totals(self) -> tuple[int, int]:
        rk = sum(sum(a.ranks()[0]) for a in self.attn)
        rv = sum(a.ranks()[1] for a in self.attn)
        return rk, rv

    def forward(self, idx, quant: QuantSpec | None = None):
        x = self.embed(idx)
        for i, a in enumerate(self.attn):
            x = x + a(self.norm1[i](x), self.inv_freq, quant)
            x = x + self.mlp[i](self.norm2[i](x))
        return self.lm_head(self.norm(x))

    @torch.no_grad()
    def decode_logits(self, idx, backend="torch", quant: QuantSpec | None = None, rec=None,
                      name="lowrank_attention", order: Literal["layer", "token"] = "layer"):
        """Logits (B, T, V) with a KV cache of latents only (fp or quantized per token): the attention of
        every position t is the fused decode kernel (kernels.lowrank_attention.decode / decode_quant) over
        the latent cache of tokens 0..t. order "token" runs in generation order (each step appends the new
        token's latents to every layer's cache); "layer" (default, faster) runs every position of one layer
        before the next - the same kernel calls on the same caches, so the same numbers, because attention
        is causal."""
        B, T = idx.shape
        exports = [a.export() for a in self.attn]
        pos = torch.arange(T, device=idx.device)
        if order == "token":
            caches: list[list] = [[None, None] for _ in self.attn]
            logits = []
            for t in range(T):
                x = self.embed(idx[:, t:t + 1])  # (B, 1, C)
                for i, a in enumerate(self.attn):
                    q, kl, vl = self._qkv_latents(a, exports[i], self.norm1[i](x), pos[t:t + 1], quant)
                    caches[i][0] = kl if caches[i][0] is None else _cat_t(caches[i][0], kl)
                    caches[i][1] = vl if caches[i][1] is None else _cat_t(caches[i][1], vl)
                    y = self._attend(a, exports[i], q[:, :, 0], caches[i][0], caches[i][1], pos[:t + 1], quant,
                                     backend, rec, name)
                    x = x + a.o_proj(y.reshape(B, 1, a.H * a.D).to(x.dtype))
                    x = x + self.mlp[i](self.norm2[i](x))
                logits.append(self.lm_head(self.norm(x)))
            return torch.cat(logits, 1)
        x = self.embed(idx)
        for i, a in enumerate(self.attn):
            q, kl, vl = self._qkv_latents(a, exports[i], self.norm1[i](x), pos, quant)
            ys = [self._attend(a, exports[i], q[:, :, t], _slice_t(kl, t + 1), _slice_t(vl, t + 1), pos[:t + 1],
                               quant, backend, rec, name) for t in range(T)]
            y = torch.stack(ys, 1)  # (B, T, H, D)
            x = x + a.o_proj(y.reshape(B, T, a.H * a.D).to(x.dtype))
            x = x + self.mlp[i](self.norm2[i](x))
        return self.lm_head(self.norm(x))

    def _qkv_latents(self, a: LowRankAttn, export, h, pos, quant: QuantSpec | None):
        """Rotated queries (B, H, t, D) and the cache rows of these tokens: latents (fp) or QuantLatents."""
        kd, _, _, vd, _ = export
        B, t, _ = h.shape
        q = rope_rotate_half(a.q_proj(h).view(B, t, a.H, a.D).transpose(1, 2), pos, self.inv_freq)
        kl = torch.einsum("btc,hrc->bthr", h, kd)  # latents only
        if kl.shape[2] != a.Hkv:  # joint K: one latent shared by every KV head
            kl = kl.expand(-1, -1, a.Hkv, -1)
        vl = h @ vd.T
        if quant is not None:  # per-token quantization: each row is quantized once, when it enters the cache
            return q, quant.quantize(kl.contiguous(), "k"), quant.quantize(vl, "v")
        return q, kl, vl

    def _attend(self, a: LowRankAttn, export, q, kc, vc, pos, quant, backend, rec, name):
        _, ku, _, _, vu = export
        if rec is not None:
            rec.count(name)
        if quant is None:
            return decode(q, kc, ku, vc, vu, pos, self.inv_freq, backend=backend)
        return decode_quant(q, kc, ku, vc, vu, pos, self.inv_freq, backend=backend)


def _slice_t(c, n: int):
    """The first n tokens of a latent cache (a tensor (B, T, ...) or a QuantLatent)."""
    if isinstance(c, QuantLatent):
        return QuantLatent(c.hi[:, :n], c.hi_scale[:, :n], c.lo[:, :n], c.lo_scale[:, :n], c.rank, c.hi_bits,
                           c.lo_group)
    return c[:, :n]


def _cat_t(a, b):
    """Append cache rows b after a along the token axis."""
    if isinstance(a, QuantLatent):
        return QuantLatent(*(torch.cat([x, y], 1) for x, y in zip((a.hi, a.hi_scale, a.lo, a.lo_scale),
                                                                   (b.hi, b.hi_scale, b.lo, b.lo_scale))),
                           a.rank, a.hi_bits, a.lo_group)
    return torch.cat([a, b], 1)


def load_student(teacher, state: dict, k_mode: KMode, device=None) -> StarKVLM:
    """A fused student from its saved state dict (ranks are in the masks)."""
    s = StarKVLM(teacher, k_mode)
    for a in s.attn:
        a.fused = True
    s.load_state_dict(state)
    for a in s.attn:
        for p in (a.alpha_k, a.alpha_v, a.sk, a.sv):
            p.requires_grad_(False)
    return (s.to(device) if device is not None else s).eval()


# ----------------------------------------------------------------------------- bytes per token
def cache_ranks(model: StarKVLM) -> tuple[list[list[int]], list[int]]:
    """(K ranks per layer and KV head, V rank per layer); a joint K latent is one row per layer."""
    ranks = [a.ranks() for a in model.attn]
    return [r[0] for r in ranks], [r[1] for r in ranks]


def kv_bytes_per_token(ranks_k: list[list[int]], ranks_v: list[int], spec: QuantSpec | None = None,
                       elt_bytes: int = 2) -> int:
    """Bytes one token adds to the latent cache (all layers), ragged (each head at its own rank): elt_bytes
    per element unquantized, or the quantized format's codes + scales."""
    if spec is None:
        return elt_bytes * (sum(map(sum, ranks_k)) + sum(ranks_v))
    return (sum(spec.row_bytes("k", r) for layer in ranks_k for r in layer)
            + sum(spec.row_bytes("v", r) for r in ranks_v))


def dense_kv_bytes_per_token(bb: Backbone, elt_bytes: int = 2) -> int:
    """Bytes one token adds to the model's own K and V cache (fp16 by default)."""
    return elt_bytes * bb.n_layers * 2 * bb.kv_dim
