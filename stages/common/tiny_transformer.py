"""A tiny decoder/encoder transformer shared by every language-model paper (nanoGPT style).

    cfg = TinyTransformerConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4)
    model = TinyTransformer(cfg)
    logits = model(idx)                       # (B, T, V)
    h = model.hidden(idx)                     # (B, T, C) final-normed hidden states
    out = model.generate(idx, max_new_tokens=8)   # greedy, with a KV cache

Options: causal or bidirectional attention, RoPE or learned positions, RMSNorm or LayerNorm,
SwiGLU or GELU MLP, tied or untied unembedding. ``unembed`` is the (V, C) output matrix, so
losses can go through the fused linear+cross-entropy kernel without materializing logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class TinyTransformerConfig:
    vocab_size: int = 128      # V
    d_model: int = 64          # C
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None    # MLP width; default 4*C (GELU) or 8/3*C rounded (SwiGLU)
    max_seq_len: int = 128     # T_max (learned positions and RoPE cache)
    causal: bool = True        # False: bidirectional encoder
    positional: Literal["rope", "learned", "none"] = "rope"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.positional == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError("RoPE needs an even head dimension")

    @property
    def ff_width(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return 4 * self.d_model if self.mlp == "gelu" else int(math.ceil(8 * self.d_model / 3 / 8) * 8)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # RMSNorm: x / sqrt(mean(x^2) + eps) * g
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, max_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))  # (D/2,)
    angles = torch.outer(torch.arange(max_len).float(), inv_freq)  # (T, D/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # RoPE: rotate each (even, odd) pair of channels by angle pos * theta_i.   x: (B, H, T, D)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rot1 = x1 * cos - x2 * sin
    rot2 = x1 * sin + x2 * cos
    return torch.stack((rot1, rot2), dim=-1).flatten(-2)


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x (B, T, C) at positions ``rows`` (B, R) of each batch row: (B, R, C)."""
    return x.gather(1, rows[..., None].expand(*rows.shape, x.shape[-1]))


class KVCache:
    """Per-layer key/value tensors for incremental decoding."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]


class Attention(nn.Module):
    def __init__(self, cfg: TinyTransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                cache: KVCache | None = None, layer: int = 0, past: int = 0,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        if rows is not None:
            return self._at_rows(x, rope, rows)
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        if rope is not None:  # positions past..past+T-1 (past = tokens already in the cache)
            cos, sin = rope[0][past:past + T], rope[1][past:past + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            if cache.k[layer] is not None:
                k = torch.cat([cache.k[layer], k], dim=2)
                v = torch.cat([cache.v[layer], v], dim=2)
            cache.k[layer], cache.v[layer] = k, v
        if self.cfg.causal:
            # causal mask aligned to the end: query i (absolute past+i) sees keys 0..past+i
            S = k.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)

    def _at_rows(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                 rows: torch.Tensor) -> torch.Tensor:
        """The attention output at query positions ``rows`` (B, R) only: keys and values from every position,
        queries from those rows (no cache). (B, R, C)."""
        B, T, C = x.shape
        R = rows.shape[1]
        w_q, w_kv = self.qkv.weight[:C], self.qkv.weight[C:]
        q = F.linear(gather_rows(x, rows), w_q)
        k, v = F.linear(x, w_kv).split(C, dim=-1)
        q = q.view(B, R, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, R, D)
        k = k.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        if rope is not None:  # each query at its own position, the keys at 0..T-1
            q = apply_rope(q, rope[0][rows][:, None], rope[1][rows][:, None])
            k = apply_rope(k, rope[0][:T], rope[1][:T])
        mask = None
        if self.cfg.causal:  # query at position r sees keys 0..r
            mask = (torch.arange(T, device=x.device)[None, None, None, :] <= rows[:, None, :, None])
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, R, C))


class MLP(nn.Module):
    def __init__(self, cfg: TinyTransformerConfig):
        super().__init__()
        self.kind = cfg.mlp
        width = cfg.ff_width
        if cfg.mlp == "swiglu":
            self.gate = nn.Linear(cfg.d_model, width, bias=False)
        self.up = nn.Linear(cfg.d_model, width, bias=False)
        self.down = nn.Linear(width, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.down(F.silu(self.gate(x)) * self.up(x))  # SwiGLU: W2 (silu(W1 x) * W3 x)
        return self.down(F.gelu(self.up(x)))


def make_norm(cfg: TinyTransformerConfig) -> nn.Module:
    return RMSNorm(cfg.d_model) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.d_model)


class Block(nn.Module):
    def __init__(self, cfg: TinyTransformerConfig):
        super().__init__()
        self.norm1, self.attn = make_norm(cfg), Attention(cfg)
        self.norm2, self.mlp = make_norm(cfg), MLP(cfg)

    def forward(self, x, rope, cache=None, layer=0, past=0, rows=None):
        if rows is not None:  # only the residual stream at ``rows`` goes on (keys/values still from every position)
            h = gather_rows(x, rows)
            h = h + self.attn(self.norm1(x), rope, rows=rows)
            return h + self.mlp(self.norm2(h))
        x = x + self.attn(self.norm1(x), rope, cache, layer, past)  # pre-norm residual
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, cfg: TinyTransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.positional == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.positional == "rope":
            cos, sin = rope_tables(cfg.d_model // cfg.n_heads, cfg.max_seq_len)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.init_std)

    @property
    def unembed(self) -> torch.Tensor:
        """(V, C) unembedding matrix: logits = hidden @ unembed.T."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def hidden(self, idx: torch.Tensor, cache: KVCache | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed hidden states (B, T, C); with ``rows`` (B, R) positions (long), only those rows' (B, R, C):
        the last block computes its queries, residual and MLP there alone (the same values as the full pass's
        rows up to float rounding, for a fraction of the last block's cost; for callers that read a few
        positions, e.g. one-position-per-step decoding of a bidirectional model). Not with a cache."""
        B, T = idx.shape
        if rows is not None:
            if cache is not None:
                raise ValueError("hidden: rows and a KV cache cannot be combined")
            if rows.dim() != 2 or rows.shape[0] != B or rows.dtype != torch.long:
                raise ValueError(f"hidden: rows must be a (B={B}, R) long tensor, got {tuple(rows.shape)} {rows.dtype}")
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= T):
                raise ValueError(f"hidden: rows must lie in 0..{T - 1}")
        past = cache.length if cache is not None else 0
        if past + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {past + T} exceeds max_seq_len={self.cfg.max_seq_len}")
        x = self.embed(idx)  # (B, T, C)
        if self.pos is not None:
            x = x + self.pos(torch.arange(past, past + T, device=idx.device))
        rope = (self.rope_cos, self.rope_sin) if self.cfg.positional == "rope" else None
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, rope, cache, i, past, rows=rows if i == last else None)
        if rows is not None and last < 0:
            x = gather_rows(x, rows)
        return self.norm(x)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return self.hidden(idx, cache) @ self.unembed.T  # (B, T, V)

    def new_cache(self) -> KVCache:
        if not self.cfg.causal:
            raise ValueError("KV-cache decoding needs a causal model")
        return KVCache(self.cfg.n_layers)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, use_cache: bool = True) -> torch.Tensor:
        """Greedy decoding; with ``use_cache`` each step feeds only the newest token."""
        cache = self.new_cache() if use_cache else None
        out = idx
        logits = self(idx, cache)[:, -1]
        for step in range(max_new_tokens):
            nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
            out = torch.cat([out, nxt], dim=1)
            if step == max_new_tokens - 1:
                break
            logits = (self(nxt, cache) if use_cache else self(out))[:, -1]
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
