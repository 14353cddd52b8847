"""Fused low-rank decode attention with RoPE (STAR-KV), optionally dequantizing latents on the fly.

    out = decode(q, k_latent, k_up, v_latent, v_up, positions, rope_base, backend="auto")   # (B, Hq, D)
    out = decode_ref(q, k_latent, k_up, v_latent, v_up, positions, rope_base)             # torch reference
    out = decode_quant(q, kq, k_up, vq, v_up, positions, rope_base, backend="auto")        # quantized latents

q (B, Hq, D): the new token's query, RoPE already applied. k_latent (B, T, Hkv, Rk), k_up (Hkv, Rk, D):
pre-RoPE keys K[:, :, h] = k_latent[:, :, h] @ k_up[h] (per-head SVD; a head with a smaller rank is
zero-padded). v_latent (B, T, Rv), v_up (Rv, Hkv·D): values V = (v_latent @ v_up).view(B, T, Hkv, D)
(joint SVD). positions (T,) int64: the cached tokens' positions. RoPE is rotate-half (channel i pairs
with i + D/2, θ_i = rope_base^(−2i/D)). out[b, h] = softmax(q[b,h]·RoPE(K[b,:,g])ᵀ/√D)·V[b,:,g],
g = h // (Hq/Hkv).

The Triton path never materializes K or V in memory: per block of cached tokens it rebuilds the two
halves of the keys from the latents in registers, rotates them, scores them, and accumulates the
softmax-weighted *value latents* (online softmax); the value up-projection is applied once at the
end (p·V = (p·v_latent)·v_up). ``decode_quant`` takes ``QuantLatent`` caches (top ranks int8 or
fp16, the rest int4 packed two per byte, per-token scales) and dequantizes them inside the same
kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


# ----------------------------------------------------------------------------- quantized latents
@dataclass
class QuantLatent:
    """A latent cache (..., R) stored low-rank-aware: columns [0, n_hi) at `hi_bits` (8: int8 with a
    per-row scale; 16: fp16, scale 1), columns [n_hi, R) int4 (codes q+8 packed two per byte, low
    nibble first) with a per-row scale. Rows are every leading index (token, or token × head)."""
    hi: torch.Tensor        # (..., n_hi) int8 or float16
    hi_scale: torch.Tensor  # (...,) float32
    lo: torch.Tensor        # (..., ceil((R - n_hi)/2)) uint8
    lo_scale: torch.Tensor  # (...,) float32
    rank: int
    hi_bits: int

    @property
    def n_hi(self) -> int:
        return self.hi.shape[-1]

    def nbytes(self) -> int:
        """Bytes this cache occupies (codes + scales)."""
        return sum(t.numel() * t.element_size() for t in (self.hi, self.hi_scale, self.lo, self.lo_scale))


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int codes in [-8, 7] (..., n) -> uint8 (..., ceil(n/2)); nibble = code + 8, low nibble first."""
    n = codes.shape[-1]
    u = (codes.to(torch.int16) + 8).to(torch.uint8)
    if n % 2:
        u = torch.cat([u, torch.full_like(u[..., :1], 8)], dim=-1)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of pack_int4: uint8 (..., ceil(n/2)) -> int8 codes (..., n)."""
    lo = (packed & 15).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack([lo, hi], dim=-1).flatten(-2)[..., :n]


def _symmetric(x: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(dim=-1) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.clamp(torch.round(x / scale[..., None]), -qmax, qmax)
    return codes, scale.float()


def quantize_latent(x: torch.Tensor, n_hi: int, hi_bits: int = 8) -> QuantLatent:
    """Low-rank-aware mixed precision: the first n_hi latent ranks (largest singular values) at hi_bits,
    the rest int4, each part with its own per-row (per-token) symmetric scale."""
    if hi_bits not in (8, 16):
        raise ValueError(f"hi_bits: expected 8 or 16 (got {hi_bits})")
    R = x.shape[-1]
    if not 0 <= n_hi <= R:
        raise ValueError(f"n_hi: {n_hi} outside [0, rank={R}]")
    xh, xl = x[..., :n_hi].float(), x[..., n_hi:].float()
    if hi_bits == 16:
        hi, hs = xh.to(torch.float16), torch.ones(x.shape[:-1], dtype=torch.float32, device=x.device)
    else:
        c, hs = _symmetric(xh, 127) if n_hi else (xh, torch.ones(x.shape[:-1], device=x.device))
        hi = c.to(torch.int8)
    if R - n_hi:
        c, ls = _symmetric(xl, 7)  # int4 codes in [-7, 7]
        lo = pack_int4(c.to(torch.int8))
    else:
        lo = torch.zeros(*x.shape[:-1], 0, dtype=torch.uint8, device=x.device)
        ls = torch.ones(x.shape[:-1], dtype=torch.float32, device=x.device)
    return QuantLatent(hi.contiguous(), hs.contiguous(), lo.contiguous(), ls.contiguous(), R, hi_bits)


def dequantize_latent(ql: QuantLatent) -> torch.Tensor:
    hi = ql.hi.float() * ql.hi_scale[..., None]
    lo = unpack_int4(ql.lo, ql.rank - ql.n_hi).float() * ql.lo_scale[..., None]
    return torch.cat([hi, lo], dim=-1)


# ----------------------------------------------------------------------------- torch reference
def rope_rotate_half(x: torch.Tensor, positions: torch.Tensor, rope_base: float) -> torch.Tensor:
    """x (..., T, D) rotated at positions (T,): pairs (i, i + D/2), angle pos · rope_base^(−2i/D)."""
    D = x.shape[-1]
    inv_freq = _inv_freq(D, rope_base, x.device)
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _inv_freq(D: int, rope_base: float, device) -> torch.Tensor:
    return 1.0 / (float(rope_base) ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))


def _check(q, k_latent, k_up, v_latent, v_up, positions):
    if q.dim() != 3 or k_latent.dim() != 4 or k_up.dim() != 3 or v_latent.dim() != 3 or v_up.dim() != 2:
        raise ValueError("expected q (B,Hq,D), k_latent (B,T,Hkv,Rk), k_up (Hkv,Rk,D), v_latent (B,T,Rv), "
                         "v_up (Rv,Hkv*D)")
    B, Hq, D = q.shape
    _, T, Hkv, Rk = k_latent.shape
    if D % 2 or D > 128:
        raise ValueError(f"head_dim D={D}: must be even and ≤ 128")
    if T < 1 or k_latent.shape[0] != B or v_latent.shape[:2] != (B, T):
        raise ValueError(f"k_latent/v_latent must be (B={B}, T≥1, ...) with the same T")
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    if k_up.shape != (Hkv, Rk, D) or not 1 <= Rk <= D:
        raise ValueError(f"k_up must be (Hkv={Hkv}, Rk={Rk}, D={D}) with 1 ≤ Rk ≤ D (got {tuple(k_up.shape)})")
    if v_up.shape != (v_latent.shape[2], Hkv * D):
        raise ValueError(f"v_up must be (Rv={v_latent.shape[2]}, Hkv*D={Hkv * D}) (got {tuple(v_up.shape)})")
    if positions.shape != (T,):
        raise ValueError(f"positions must be (T={T},) (got {tuple(positions.shape)})")


def decode_ref(q, k_latent, k_up, v_latent, v_up, positions, rope_base=10000.0, backend: Backend = "torch"):
    """Torch reference: materialize K and V from the latents, rotate K, softmax attention (GQA)."""
    B, Hq, D = q.shape
    T, Hkv = k_latent.shape[1], k_latent.shape[2]
    f = torch.float32 if q.dtype != torch.float64 else torch.float64
    k = torch.einsum("bthr,hrd->bhtd", k_latent.to(f), k_up.to(f))           # (B, Hkv, T, D)
    k = rope_rotate_half(k, positions, rope_base)
    v = (v_latent.to(f) @ v_up.to(f)).view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    G = Hq // Hkv
    qg = q.to(f).view(B, Hkv, G, D)
    s = torch.einsum("bhgd,bhtd->bhgt", qg, k) / math.sqrt(D)
    out = torch.einsum("bhgt,bhtd->bhgd", torch.softmax(s, dim=-1), v)
    return out.reshape(B, Hq, D).to(q.dtype)


# ----------------------------------------------------------------------------- Triton kernel
if triton is not None:
    @triton.jit
    def _load_latent(x_ptr, lo_ptr, shi_ptr, slo_ptr, rows, cols, tmask, R, NHI, NLOB, QUANT: tl.constexpr):
        """(BT, BR) tile of a latent cache in fp32; rows are flat (token[, head]) indices."""
        cmask = cols < R
        m = tmask[:, None] & cmask[None, :]
        if QUANT:
            is_hi = cols < NHI
            hi = tl.load(x_ptr + rows[:, None] * NHI + cols[None, :], mask=m & is_hi[None, :], other=0).to(tl.float32)
            sh = tl.load(shi_ptr + rows, mask=tmask, other=0.0)
            lc = tl.where(is_hi, 0, cols - NHI)
            byte = tl.load(lo_ptr + rows[:, None] * NLOB + (lc // 2)[None, :], mask=m & (~is_hi)[None, :],
                           other=8).to(tl.int32)
            nib = (byte >> ((lc % 2) * 4)[None, :]) & 15  # ALGO: on-the-fly int4 unpack (low nibble first)
            lo = (nib - 8).to(tl.float32)
            sl = tl.load(slo_ptr + rows, mask=tmask, other=0.0)
            return tl.where(is_hi[None, :], hi * sh[:, None], lo * sl[:, None])
        else:
            return tl.load(x_ptr + rows[:, None] * R + cols[None, :], mask=m, other=0.0).to(tl.float32)

    @triton.jit
    def _lowrank_decode_kernel(q_ptr, kx_ptr, klo_ptr, kshi_ptr, kslo_ptr, kup_ptr,
                               vx_ptr, vlo_ptr, vshi_ptr, vslo_ptr, vup_ptr, pos_ptr, invf_ptr, o_ptr,
                               T, Hq, Hkv, G, D, HALF, RK, RV, KNHI, KNLOB, VNHI, VNLOB, scale,
                               BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_RK: tl.constexpr,
                               BLOCK_RV: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        g = h // G
        offs_i = tl.arange(0, BLOCK_H)       # half-channel index
        imask = offs_i < HALF
        offs_rk = tl.arange(0, BLOCK_RK)
        offs_rv = tl.arange(0, BLOCK_RV)
        offs_t = tl.arange(0, BLOCK_T)
        qbase = q_ptr + (b * Hq + h) * D
        q1 = tl.load(qbase + offs_i, mask=imask, other=0.0).to(tl.float32)
        q2 = tl.load(qbase + HALF + offs_i, mask=imask, other=0.0).to(tl.float32)
        invf = tl.load(invf_ptr + offs_i, mask=imask, other=0.0)
        # the head's up-projection, split in its two RoPE halves: (BLOCK_RK, BLOCK_H) each
        umask = (offs_rk < RK)[:, None] & imask[None, :]
        ubase = kup_ptr + g * RK * D + offs_rk[:, None] * D + offs_i[None, :]
        u1 = tl.load(ubase, mask=umask, other=0.0).to(tl.float32)
        u2 = tl.load(ubase + HALF, mask=umask, other=0.0).to(tl.float32)
        m_i = -float("inf")
        l_i = 0.0
        acc = tl.zeros([BLOCK_RV], dtype=tl.float32)   # softmax-weighted value latent
        for start in range(0, T, BLOCK_T):
            tok = start + offs_t
            tmask = tok < T
            krows = (b * T + tok) * Hkv + g
            x = _load_latent(kx_ptr, klo_ptr, kshi_ptr, kslo_ptr, krows, offs_rk, tmask, RK, KNHI, KNLOB, QUANT)
            # ALGO: keys rebuilt from the latent in registers, K_half = X · U_half  (BLOCK_T, BLOCK_H)
            k1 = tl.sum(x[:, :, None] * u1[None, :, :], axis=1)
            k2 = tl.sum(x[:, :, None] * u2[None, :, :], axis=1)
            pos = tl.load(pos_ptr + tok, mask=tmask, other=0).to(tl.float32)
            ang = pos[:, None] * invf[None, :]
            c = tl.cos(ang)
            s_ = tl.sin(ang)
            # ALGO: rotate-half RoPE applied after reconstruction, then q · RoPE(k)
            r1 = k1 * c - k2 * s_
            r2 = k2 * c + k1 * s_
            s = tl.sum(r1 * q1[None, :] + r2 * q2[None, :], axis=1) * scale
            s = tl.where(tmask, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)  # ALGO: online softmax rescaling
            p = tl.exp(s - m_new)
            p = tl.where(tmask, p, 0.0)
            vrows = b * T + tok
            vx = _load_latent(vx_ptr, vlo_ptr, vshi_ptr, vslo_ptr, vrows, offs_rv, tmask, RV, VNHI, VNLOB, QUANT)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * vx, axis=0)  # ALGO: p · v_latent in latent space
            m_i = m_new
        acc = acc / l_i
        # expand once: out = acc · v_up[:, g*D:(g+1)*D]
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        vu = tl.load(vup_ptr + offs_rv[:, None] * (Hkv * D) + g * D + offs_d[None, :],
                     mask=(offs_rv < RV)[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        out = tl.sum(acc[:, None] * vu, axis=0)
        tl.store(o_ptr + (b * Hq + h) * D + offs_d, out, mask=dmask)


def _launch(q, k_parts, k_up, v_parts, v_up, positions, rope_base, T, Hkv, Rk, Rv, quant: bool):
    B, Hq, D = q.shape
    out = torch.empty((B, Hq, D), dtype=torch.float32, device=q.device)
    invf = _inv_freq(D, rope_base, q.device).contiguous()
    kx, klo, kshi, kslo, knhi, knlob = k_parts
    vx, vlo, vshi, vslo, vnhi, vnlob = v_parts
    _lowrank_decode_kernel[(B, Hq)](
        q.contiguous(), kx, klo, kshi, kslo, k_up.contiguous(), vx, vlo, vshi, vslo, v_up.contiguous(),
        positions.contiguous(), invf, out, T, Hq, Hkv, Hq // Hkv, D, D // 2, Rk, Rv, knhi, knlob, vnhi, vnlob,
        1.0 / math.sqrt(D), BLOCK_T=16, BLOCK_H=max(2, triton.next_power_of_2(D // 2)),
        BLOCK_RK=max(2, triton.next_power_of_2(Rk)), BLOCK_RV=max(2, triton.next_power_of_2(Rv)),
        BLOCK_D=max(2, triton.next_power_of_2(D)), QUANT=quant)
    return out.to(q.dtype)


@torch.no_grad()
def decode(q, k_latent, k_up, v_latent, v_up, positions, rope_base=10000.0, backend: Backend = "auto"):
    """Fused low-rank decode attention (see module docstring); (B, Hq, D) in q's dtype."""
    _check(q, k_latent, k_up, v_latent, v_up, positions)
    if not use_triton(q, k_latent, v_latent, backend=backend):
        return decode_ref(q, k_latent, k_up, v_latent, v_up, positions, rope_base)
    T, Hkv, Rk = k_latent.shape[1:]
    Rv = v_latent.shape[2]
    kx, vx = k_latent.contiguous(), v_latent.contiguous()
    return _launch(q, (kx, kx, kx, kx, 0, 0), k_up, (vx, vx, vx, vx, 0, 0), v_up, positions, rope_base,
                   T, Hkv, Rk, Rv, quant=False)


def decode_quant_ref(q, kq: QuantLatent, k_up, vq: QuantLatent, v_up, positions, rope_base=10000.0):
    return decode_ref(q, dequantize_latent(kq), k_up, dequantize_latent(vq), v_up, positions, rope_base)


@torch.no_grad()
def decode_quant(q, kq: QuantLatent, k_up, vq: QuantLatent, v_up, positions, rope_base=10000.0,
                 backend: Backend = "auto"):
    """decode() over mixed-precision latent caches (QuantLatent, kq rows (B,T,Hkv), vq rows (B,T)),
    dequantized on the fly inside the kernel (torch reference: dequantize, then decode_ref)."""
    B, Hq, D = q.shape
    T, Hkv = kq.hi_scale.shape[1], kq.hi_scale.shape[2]
    _check(q, torch.empty(B, T, Hkv, kq.rank, device="meta"), k_up, torch.empty(B, T, vq.rank, device="meta"),
           v_up, positions)
    if not use_triton(q, kq.lo, vq.lo, backend=backend):
        return decode_quant_ref(q, kq, k_up, vq, v_up, positions, rope_base)

    def parts(ql: QuantLatent):
        hi = ql.hi.contiguous() if ql.n_hi else torch.zeros(1, dtype=ql.hi.dtype, device=q.device)
        lo = ql.lo.contiguous() if ql.lo.numel() else torch.zeros(1, dtype=torch.uint8, device=q.device)
        return hi, lo, ql.hi_scale.contiguous(), ql.lo_scale.contiguous(), ql.n_hi, ql.lo.shape[-1]

    return _launch(q, parts(kq), k_up, parts(vq), v_up, positions, rope_base, T, Hkv, kq.rank, vq.rank,
                   quant=True)


# ----------------------------------------------------------------------------- inputs and benchmarks
def random_inputs(B: int, Hq: int, Hkv: int, D: int, T: int, Rk: int, Rv: int, seed: int = 0, device="cpu",
                  dtype=torch.float32, pad_heads: bool = True, pos_offset: int = 0):
    """Random decode inputs; with pad_heads, head h keeps only rank Rk - h (zero-padded, as exported)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, D, generator=g, dtype=dtype)
    kl = torch.randn(B, T, Hkv, Rk, generator=g, dtype=dtype)
    ku = torch.randn(Hkv, Rk, D, generator=g, dtype=dtype) / math.sqrt(Rk)
    if pad_heads:
        for h in range(Hkv):
            r = max(1, Rk - h)
            kl[:, :, h, r:] = 0
            ku[h, r:] = 0
    vl = torch.randn(B, T, Rv, generator=g, dtype=dtype)
    vu = torch.randn(Rv, Hkv * D, generator=g, dtype=dtype) / math.sqrt(Rv)
    pos = pos_offset + torch.sort(torch.randperm(4 * T + 7, generator=g)[:T]).values
    return tuple(x.to(device) for x in (q, kl, ku, vl, vu, pos))


def materialize_sdpa(q, k_latent, k_up, v_latent, v_up, positions, rope_base=10000.0):
    """The baseline the paper's latency compares against: build full K, V, rotate, then SDPA."""
    B, Hq, D = q.shape
    T, Hkv = k_latent.shape[1:3]
    k = rope_rotate_half(torch.einsum("bthr,hrd->bhtd", k_latent, k_up), positions, rope_base)
    v = (v_latent @ v_up).view(B, T, Hkv, D).transpose(1, 2)
    G = Hq // Hkv
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]


def kv_bytes(B, T, Hkv, D, Rk, Rv, elt=4) -> dict[str, int]:
    """KV-cache bytes read per decode step: latent cache vs materialized K and V."""
    return {"latent": elt * B * T * (Hkv * Rk + Rv), "dense": elt * B * T * 2 * Hkv * D}


def _case(B, Hq, Hkv, D, T, Rk, Rv):
    label = f"lowrank_attention B={B} Hq={Hq} Hkv={Hkv} D={D} T={T} Rk={Rk} Rv={Rv} (vs materialize-K+SDPA)"
    by = kv_bytes(B, T, Hkv, D, Rk, Rv)
    flops = 2 * B * T * (Hq * (Rk * D + D) + Hq * Rv)
    return (label, lambda device: random_inputs(B, Hq, Hkv, D, T, Rk, Rv, device=device, pad_heads=False),
            lambda *x: decode(*x, backend="triton"),
            lambda *x: materialize_sdpa(*x), by["latent"], flops)


BENCHMARKS = [_case(16, 32, 8, 128, 4096, 32, 256), _case(16, 8, 8, 64, 8192, 16, 128)]
BENCHMARKS_SMALL = [_case(2, 4, 2, 32, 37, 8, 12)]
