"""Fused low-rank decode attention with RoPE (STAR-KV), optionally dequantizing latents on the fly.

    out = decode(q, k_latent, k_up, v_latent, v_up, positions, rope, backend="auto")   # (B, Hq, D)
    out = decode_ref(q, k_latent, k_up, v_latent, v_up, positions, rope)             # torch reference
    out = decode_quant(q, kq, k_up, vq, v_up, positions, rope, backend="auto")        # quantized latents
    out = decode_latent_torch(...)   # the fused algorithm in torch (values in latent space; CPU bench)

q (B, Hq, D): the new token's query, RoPE already applied. k_latent (B, T, Hkv, Rk), k_up (Hkv, Rk, D):
pre-RoPE keys K[:, :, h] = k_latent[:, :, h] @ k_up[h] (per-head SVD; a head with a smaller rank is
zero-padded; a joint-K latent is the same latent repeated for every head). v_latent (B, T, Rv), v_up
(Rv, Hkv·D): values V = (v_latent @ v_up).view(B, T, Hkv, D) (joint SVD). positions (T,) int64: the cached
tokens' positions. rope: the RoPE base θ (float; θ_i = base^(−2i/D)) or the model's inverse frequencies as
a (D/2,) tensor (e.g. Llama-3.1's scaled ones). RoPE is rotate-half (channel i pairs with i + D/2, as in
Hugging Face Llama). out[b, h] = softmax(q[b,h]·RoPE(K[b,:,g])ᵀ/√D)·V[b,:,g], g = h // (Hq/Hkv).

The Triton path never materializes K or V in memory. One program per (batch, KV head, split of the cached
tokens) serves all G = Hq/Hkv query heads of the group (the latents are read once per KV head; the splits'
partial softmaxes are merged after the kernel, as in flash-decoding): per block of cached tokens it rebuilds
the two RoPE halves of the keys from the latents in registers (tl.dot), rotates them, scores all G queries,
and accumulates the softmax-weighted *value latents* (online softmax); the value up-projection is applied
once at the end (p·V = (p·v_latent)·v_up), as one batched GEMM over all heads after the kernel.
``decode_quant`` takes ``QuantLatent`` caches (top ranks int8 or fp16, the rest int4 packed two per byte,
fp16 scales per token and column group) and dequantizes them inside the same kernel. Register use grows with the
value rank (one BLOCK_G × next_pow2(Rv) accumulator).
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

Rope = float | torch.Tensor


# ----------------------------------------------------------------------------- quantized latents
@dataclass
class QuantLatent:
    """A latent cache (..., R) stored low-rank-aware: columns [0, n_hi) at `hi_bits` (8: int8 with one fp16
    scale per row; 16: fp16, no scale), columns [n_hi, R) int4 (codes q+8 packed two per byte, low nibble
    first) with one fp16 scale per row and group of `lo_group` columns (the last group may be shorter).
    Rows are every leading index (token, or token × head). ``nbytes`` counts every stored byte (codes and
    scales; symmetric quantization has no zero-points)."""
    hi: torch.Tensor        # (..., n_hi) int8 or float16
    hi_scale: torch.Tensor  # (..., 1) float16 for int8, (..., 0) for fp16 or n_hi = 0
    lo: torch.Tensor        # (..., ceil((R - n_hi)/2)) uint8
    lo_scale: torch.Tensor  # (..., n_groups) float16
    rank: int
    hi_bits: int
    lo_group: int

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
    """Codes in [-qmax, qmax] and the fp16 scale they are decoded with (amax/qmax rounded to fp16 first, so
    encoding and decoding use the same scale; a row whose scale rounds to 0 gets scale 1 and codes 0)."""
    scale = (x.abs().amax(dim=-1) / qmax).to(torch.float16)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.clamp(torch.round(x / scale.float()[..., None]), -qmax, qmax)
    return codes, scale


def n_groups(width: int, lo_group: int | None) -> int:
    return 0 if width == 0 else 1 if lo_group is None else -(-width // lo_group)


def quantize_latent(x: torch.Tensor, n_hi: int, hi_bits: int = 8, lo_group: int | None = None) -> QuantLatent:
    """Low-rank-aware mixed precision: the first n_hi latent ranks (largest singular values) at hi_bits,
    the rest int4 with one symmetric fp16 scale per row and group of lo_group columns (None: one group)."""
    if hi_bits not in (8, 16):
        raise ValueError(f"hi_bits: expected 8 or 16 (got {hi_bits})")
    R = x.shape[-1]
    if not 0 <= n_hi <= R:
        raise ValueError(f"n_hi: {n_hi} outside [0, rank={R}]")
    if lo_group is not None and lo_group < 1:
        raise ValueError(f"lo_group: {lo_group} must be ≥ 1")
    lead = x.shape[:-1]
    xh, xl = x[..., :n_hi].float(), x[..., n_hi:].float()
    if hi_bits == 16 or n_hi == 0:
        hi = xh.to(torch.float16) if hi_bits == 16 else torch.zeros(*lead, 0, dtype=torch.int8, device=x.device)
        hs = torch.zeros(*lead, 0, dtype=torch.float16, device=x.device)
    else:
        c, s = _symmetric(xh, 127)
        hi, hs = c.to(torch.int8), s[..., None]
    width = R - n_hi
    g = width if lo_group is None else lo_group
    codes, scales = [], []
    for start in range(0, width, max(g, 1)):
        c, s = _symmetric(xl[..., start:start + g], 7)  # int4 codes in [-7, 7]
        codes.append(c)
        scales.append(s[..., None])
    if width:
        lo = pack_int4(torch.cat(codes, dim=-1).to(torch.int8))
        ls = torch.cat(scales, dim=-1)
    else:
        lo = torch.zeros(*lead, 0, dtype=torch.uint8, device=x.device)
        ls = torch.zeros(*lead, 0, dtype=torch.float16, device=x.device)
    return QuantLatent(hi.contiguous(), hs.contiguous(), lo.contiguous(), ls.contiguous(), R, hi_bits,
                       max(g, 1))


def dequantize_latent(ql: QuantLatent) -> torch.Tensor:
    hi = ql.hi.float() * (ql.hi_scale.float() if ql.hi_scale.shape[-1] else 1.0)
    width = ql.rank - ql.n_hi
    lo = unpack_int4(ql.lo, width).float()
    if width:
        scale = ql.lo_scale.float().repeat_interleave(ql.lo_group, dim=-1)[..., :width]
        lo = lo * scale
    return torch.cat([hi, lo], dim=-1)


# ----------------------------------------------------------------------------- torch reference
def inv_freq(D: int, rope: Rope, device) -> torch.Tensor:
    """RoPE inverse frequencies (D/2,) in fp32: base^(−2i/D) for a float base, or the given tensor."""
    if isinstance(rope, torch.Tensor):
        if rope.shape != (D // 2,):
            raise ValueError(f"rope: inverse frequencies must be (D/2={D // 2},) (got {tuple(rope.shape)})")
        return rope.to(device=device, dtype=torch.float32)
    if not (isinstance(rope, (int, float)) and math.isfinite(rope) and rope > 1):
        raise ValueError(f"rope: a RoPE base must be a finite number > 1 (got {rope!r})")
    return 1.0 / (float(rope) ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))


def rope_rotate_half(x: torch.Tensor, positions: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x (..., T, D) rotated at positions (T,): pairs (i, i + D/2), angle pos · inv_freq[i]."""
    D = x.shape[-1]
    ang = positions.to(torch.float32)[:, None] * inv_freq(D, rope, x.device)[None, :]  # (T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _check(q, k_latent, k_up, v_latent, v_up, positions):
    if q.dim() != 3 or k_latent.dim() != 4 or k_up.dim() != 3 or v_latent.dim() != 3 or v_up.dim() != 2:
        raise ValueError("expected q (B,Hq,D), k_latent (B,T,Hkv,Rk), k_up (Hkv,Rk,D), v_latent (B,T,Rv), "
                         "v_up (Rv,Hkv*D)")
    B, Hq, D = q.shape
    _, T, Hkv, Rk = k_latent.shape
    if D % 2 or D > 256:
        raise ValueError(f"head_dim D={D}: must be even and ≤ 256")
    if T < 1 or k_latent.shape[0] != B or v_latent.shape[:2] != (B, T):
        raise ValueError(f"k_latent/v_latent must be (B={B}, T≥1, ...) with the same T")
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    if k_up.shape != (Hkv, Rk, D) or not 1 <= Rk <= 4096:
        raise ValueError(f"k_up must be (Hkv={Hkv}, Rk={Rk}, D={D}) with 1 ≤ Rk ≤ 4096 (got {tuple(k_up.shape)})")
    if v_up.shape != (v_latent.shape[2], Hkv * D) or not 1 <= v_latent.shape[2] <= 8192:
        raise ValueError(f"v_up must be (Rv={v_latent.shape[2]}, Hkv*D={Hkv * D}) with 1 ≤ Rv ≤ 8192 "
                         f"(got {tuple(v_up.shape)})")
    if positions.shape != (T,):
        raise ValueError(f"positions must be (T={T},) (got {tuple(positions.shape)})")


def decode_ref(q, k_latent, k_up, v_latent, v_up, positions, rope: Rope = 10000.0, backend: Backend = "torch"):
    """Torch reference: materialize K and V from the latents, rotate K, softmax attention (GQA)."""
    B, Hq, D = q.shape
    T, Hkv = k_latent.shape[1], k_latent.shape[2]
    f = torch.float32 if q.dtype != torch.float64 else torch.float64
    k = torch.einsum("bthr,hrd->bhtd", k_latent.to(f), k_up.to(f))           # (B, Hkv, T, D)
    k = rope_rotate_half(k, positions, rope)
    v = (v_latent.to(f) @ v_up.to(f)).view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    G = Hq // Hkv
    qg = q.to(f).view(B, Hkv, G, D)
    s = torch.einsum("bhgd,bhtd->bhgt", qg, k) / math.sqrt(D)
    out = torch.einsum("bhgt,bhtd->bhgd", torch.softmax(s, dim=-1), v)
    return out.reshape(B, Hq, D).to(q.dtype)


def decode_latent_torch(q, k_latent, k_up, v_latent, v_up, positions, rope: Rope = 10000.0):
    """The fused kernel's algorithm in torch: keys rebuilt from the latents and rotated, softmax, then the
    weights applied to the *value latents* and expanded once (V itself is never formed)."""
    B, Hq, D = q.shape
    T, Hkv = k_latent.shape[1], k_latent.shape[2]
    G = Hq // Hkv
    k = rope_rotate_half(torch.einsum("bthr,hrd->bhtd", k_latent, k_up), positions, rope)
    s = torch.einsum("bhgd,bhtd->bhgt", q.view(B, Hkv, G, D), k) / math.sqrt(D)
    pl = torch.softmax(s, dim=-1).reshape(B, Hq, T) @ v_latent                 # (B, Hq, Rv)
    vu = v_up.view(-1, Hkv, D).transpose(0, 1)                                  # (Hkv, Rv, D)
    return torch.einsum("bhgr,hrd->bhgd", pl.view(B, Hkv, G, -1), vu).reshape(B, Hq, D)


# ----------------------------------------------------------------------------- Triton kernel
if triton is not None:
    @triton.jit
    def _load_latent(x_ptr, lo_ptr, shi_ptr, slo_ptr, rows, cols, tmask, R, NHI, NLOB, NG, GS,
                     QUANT: tl.constexpr, HI_SCALED: tl.constexpr):
        """(BT, BR) tile of a latent cache in fp32; rows are flat (token[, head]) indices."""
        cmask = cols < R
        m = tmask[:, None] & cmask[None, :]
        if QUANT:
            is_hi = cols < NHI
            hi = tl.load(x_ptr + rows[:, None] * NHI + cols[None, :], mask=m & is_hi[None, :], other=0).to(tl.float32)
            if HI_SCALED:
                sh = tl.load(shi_ptr + rows, mask=tmask, other=0.0).to(tl.float32)
                hi = hi * sh[:, None]
            lc = tl.where(is_hi, 0, cols - NHI)
            lom = m & (~is_hi)[None, :]
            byte = tl.load(lo_ptr + rows[:, None] * NLOB + (lc // 2)[None, :], mask=lom, other=8).to(tl.int32)
            nib = (byte >> ((lc % 2) * 4)[None, :]) & 15  # ALGO: on-the-fly int4 unpack (low nibble first)
            sl = tl.load(slo_ptr + rows[:, None] * NG + (lc // GS)[None, :], mask=lom, other=0.0).to(tl.float32)
            lo = (nib - 8).to(tl.float32) * sl
            return tl.where(is_hi[None, :], hi, lo)
        else:
            return tl.load(x_ptr + rows[:, None] * R + cols[None, :], mask=m, other=0.0).to(tl.float32)

    @triton.jit
    def _lowrank_decode_kernel(q_ptr, kx_ptr, klo_ptr, kshi_ptr, kslo_ptr, kup_ptr,
                               vx_ptr, vlo_ptr, vshi_ptr, vslo_ptr, pos_ptr, invf_ptr, o_ptr, m_ptr, l_ptr,
                               T, CHUNK, NSPLIT, Hq, Hkv, G, D, HALF, RK, RV, KNHI, KNLOB, KNG, KGS, VNHI, VNLOB, VNG,
                               VGS, scale,
                               BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_H: tl.constexpr,
                               BLOCK_RK: tl.constexpr, BLOCK_RV: tl.constexpr,
                               QUANT: tl.constexpr, K_HI_SCALED: tl.constexpr, V_HI_SCALED: tl.constexpr,
                               PREC: tl.constexpr):
        b = tl.program_id(0)
        g = tl.program_id(1)                 # KV head: serves query heads g*G .. g*G + G - 1
        sp = tl.program_id(2)                # split of the cached tokens: [sp·CHUNK, (sp+1)·CHUNK) ∩ [0, T)
        t_lo = sp * CHUNK
        t_hi = tl.minimum(t_lo + CHUNK, T)
        offs_g = tl.arange(0, BLOCK_G)
        gmask = offs_g < G
        offs_i = tl.arange(0, BLOCK_H)       # half-channel index
        imask = offs_i < HALF
        offs_rk = tl.arange(0, BLOCK_RK)
        offs_rv = tl.arange(0, BLOCK_RV)
        offs_t = tl.arange(0, BLOCK_T)
        # the group's queries, split in their two RoPE halves: (BLOCK_G, BLOCK_H) each
        qrow = (b * Hq + g * G + offs_g) * D
        qm = gmask[:, None] & imask[None, :]
        q1 = tl.load(q_ptr + qrow[:, None] + offs_i[None, :], mask=qm, other=0.0).to(tl.float32)
        q2 = tl.load(q_ptr + qrow[:, None] + HALF + offs_i[None, :], mask=qm, other=0.0).to(tl.float32)
        invf = tl.load(invf_ptr + offs_i, mask=imask, other=0.0)
        # the KV head's key up-projection, split in its two RoPE halves: (BLOCK_RK, BLOCK_H) each
        umask = (offs_rk < RK)[:, None] & imask[None, :]
        ubase = kup_ptr + g * RK * D + offs_rk[:, None] * D + offs_i[None, :]
        u1 = tl.load(ubase, mask=umask, other=0.0).to(tl.float32)
        u2 = tl.load(ubase + HALF, mask=umask, other=0.0).to(tl.float32)
        m_i = tl.full([BLOCK_G], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_RV], dtype=tl.float32)   # softmax-weighted value latents per query head
        for start in range(t_lo, t_hi, BLOCK_T):
            tok = start + offs_t
            tmask = tok < t_hi
            krows = (b * T + tok) * Hkv + g
            x = _load_latent(kx_ptr, klo_ptr, kshi_ptr, kslo_ptr, krows, offs_rk, tmask, RK, KNHI, KNLOB, KNG, KGS,
                             QUANT, K_HI_SCALED)
            # ALGO: keys rebuilt from the latent in registers, K_half = X · U_half  (BLOCK_T, BLOCK_H)
            k1 = tl.dot(x, u1, input_precision=PREC)
            k2 = tl.dot(x, u2, input_precision=PREC)
            pos = tl.load(pos_ptr + tok, mask=tmask, other=0).to(tl.float32)
            ang = pos[:, None] * invf[None, :]
            c = tl.cos(ang)
            s_ = tl.sin(ang)
            # ALGO: rotate-half RoPE applied after reconstruction, then q · RoPE(k) for the G queries
            r1 = k1 * c - k2 * s_
            r2 = k2 * c + k1 * s_
            s = (tl.dot(r1, tl.trans(q1), input_precision=PREC)
                 + tl.dot(r2, tl.trans(q2), input_precision=PREC)) * scale   # (BLOCK_T, BLOCK_G)
            s = tl.where(tmask[:, None], s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)  # ALGO: online softmax rescaling
            p = tl.exp(s - m_new[None, :])
            p = tl.where(tmask[:, None], p, 0.0)
            vrows = b * T + tok
            vx = _load_latent(vx_ptr, vlo_ptr, vshi_ptr, vslo_ptr, vrows, offs_rv, tmask, RV, VNHI, VNLOB, VNG, VGS,
                              QUANT, V_HI_SCALED)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            # ALGO: p · v_latent in latent space  (BLOCK_G, BLOCK_RV)
            acc = acc * alpha[:, None] + tl.dot(tl.trans(p), vx, input_precision=PREC)
            m_i = m_new
        # this split's running max, softmax denominator and un-normalized value latents p·v_latent (G, RV) of the
        # KV head's query heads; the splits are merged and the up-projection applied (one GEMM over all heads) in
        # _launch: a (next_pow2(Rv), D) v_up tile here needs more shared memory than a GPU has at the paper's
        # ranks (Rv = 522: 512 KiB fp32; an H200 has 227 KiB)
        hrow = (b * Hq + g * G + offs_g) * NSPLIT + sp
        tl.store(m_ptr + hrow, m_i, mask=gmask)
        tl.store(l_ptr + hrow, l_i, mask=gmask)
        tl.store(o_ptr + hrow[:, None] * RV + offs_rv[None, :], acc, mask=gmask[:, None] & (offs_rv < RV)[None, :])


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


# Launch settings, from a sweep at the paper's shape on an H200 (Triton 3.6; materialize + SDPA 9.6 ms, SDPA on a
# dense fp16 cache 0.49 ms): ieee dots, 4 warps 27.3 ms, 8 warps 21.2 ms (BLOCK_T 32: 25.1; 64: out of shared
# memory); tf32 dots 7.9 ms (8 warps, BLOCK_T 32; max error 2.6e-3 of the output scale against 1.3e-3 with ieee,
# fp16 caches); 4 or 8 programs per SM the same; one split per (batch, KV head) 23.6 ms
BLOCK_T = 16            # cached tokens per loop step of the decode kernel
NUM_WARPS = 8
DOT_PRECISION = "ieee"  # fp32 tl.dot inputs: "ieee" (exact fp32 FMAs, as every kernel here) or "tf32" (tensor cores)
PROGRAMS_PER_SM = 4     # CUDA: token splits chosen for about this many programs per streaming multiprocessor


def n_splits(B: int, Hkv: int, T: int, device) -> int:
    """How many token splits the decode kernel runs per (batch, KV head) (flash-decoding): on CUDA enough programs
    for ~4 per streaming multiprocessor (B·Hkv = 128 programs at the paper's shape leave a 132-SM H200 walking
    32,768 tokens serially per program), at least 64 tokens per split; on the CPU interpreter up to 4 splits of at
    least BLOCK_T tokens, so the tests run the split and merge path."""
    if device.type != "cuda":
        return max(1, min(4, triton.cdiv(T, BLOCK_T)))
    target = PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(target, B * Hkv), triton.cdiv(T, 64)))


def _launch(q, k_parts, k_up, v_parts, v_up, positions, rope, T, Hkv, Rk, Rv, quant: bool,
            k_hi_scaled: bool = False, v_hi_scaled: bool = False):
    B, Hq, D = q.shape
    S = n_splits(B, Hkv, T, q.device)
    chunk = triton.cdiv(triton.cdiv(T, S), BLOCK_T) * BLOCK_T
    S = triton.cdiv(T, chunk)                                  # no empty split
    acc = torch.empty((B, Hq, S, Rv), dtype=torch.float32, device=q.device)   # per split: un-normalized p·v_latent
    m = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device)        # ... its running max
    den = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device)      # ... its softmax denominator
    invf = inv_freq(D, rope, q.device).contiguous()
    kx, klo, kshi, kslo, knhi, knlob, kng, kgs = k_parts
    vx, vlo, vshi, vslo, vnhi, vnlob, vng, vgs = v_parts
    _lowrank_decode_kernel[(B, Hkv, S)](
        q.contiguous(), kx, klo, kshi, kslo, k_up.contiguous(), vx, vlo, vshi, vslo,
        positions.contiguous(), invf, acc, m, den, T, chunk, S, Hq, Hkv, Hq // Hkv, D, D // 2, Rk, Rv, knhi, knlob,
        kng, kgs, vnhi, vnlob, vng, vgs, 1.0 / math.sqrt(D), BLOCK_T=BLOCK_T, BLOCK_G=_p2(Hq // Hkv),
        BLOCK_H=_p2(D // 2),
        BLOCK_RK=_p2(Rk), BLOCK_RV=_p2(Rv), QUANT=quant,
        K_HI_SCALED=bool(quant and kshi.numel() > 1), V_HI_SCALED=bool(quant and vshi.numel() > 1),
        PREC=DOT_PRECISION, num_warps=NUM_WARPS)
    # ALGO: split-softmax merge (flash-decoding): w_s = exp(m_s − max_s m_s), lat = Σ_s w_s·acc_s / Σ_s w_s·l_s
    w = torch.exp(m - m.amax(-1, keepdim=True))
    lat = (w[..., None] * acc).sum(2) / (w * den).sum(-1, keepdim=True)        # (B, Hq, Rv)
    # ALGO: expand once, out[b, g·G + j] = lat[b, g·G + j] · v_up[:, g·D:(g+1)·D]  (one batched GEMM, all heads)
    up = v_up.float().view(Rv, Hkv, D).permute(1, 0, 2)                          # (Hkv, Rv, D)
    out = lat.view(B, Hkv, Hq // Hkv, Rv) @ up                                    # (B, Hkv, G, D)
    return out.reshape(B, Hq, D).to(q.dtype)


@torch.no_grad()
def decode(q, k_latent, k_up, v_latent, v_up, positions, rope: Rope = 10000.0, backend: Backend = "auto"):
    """Fused low-rank decode attention (see module docstring); (B, Hq, D) in q's dtype."""
    _check(q, k_latent, k_up, v_latent, v_up, positions)
    if not use_triton(q, k_latent, v_latent, backend=backend):
        return decode_ref(q, k_latent, k_up, v_latent, v_up, positions, rope)
    T, Hkv, Rk = k_latent.shape[1:]
    Rv = v_latent.shape[2]
    kx, vx = k_latent.contiguous(), v_latent.contiguous()
    return _launch(q, (kx, kx, kx, kx, 0, 0, 1, 1), k_up, (vx, vx, vx, vx, 0, 0, 1, 1), v_up, positions, rope,
                   T, Hkv, Rk, Rv, quant=False)


def decode_quant_ref(q, kq: QuantLatent, k_up, vq: QuantLatent, v_up, positions, rope: Rope = 10000.0):
    return decode_ref(q, dequantize_latent(kq), k_up, dequantize_latent(vq), v_up, positions, rope)


@torch.no_grad()
def decode_quant(q, kq: QuantLatent, k_up, vq: QuantLatent, v_up, positions, rope: Rope = 10000.0,
                 backend: Backend = "auto"):
    """decode() over mixed-precision latent caches (QuantLatent, kq rows (B,T,Hkv), vq rows (B,T)),
    dequantized on the fly inside the kernel (torch reference: dequantize, then decode_ref)."""
    B, Hq, D = q.shape
    if kq.lo_scale.dim() != 4 or vq.lo_scale.dim() != 3:
        raise ValueError("kq must hold rows (B, T, Hkv) and vq rows (B, T)")
    T, Hkv = kq.lo_scale.shape[1], kq.lo_scale.shape[2]
    _check(q, torch.empty(B, T, Hkv, kq.rank, device="meta"), k_up, torch.empty(B, T, vq.rank, device="meta"),
           v_up, positions)
    if not use_triton(q, kq.lo, vq.lo, backend=backend):
        return decode_quant_ref(q, kq, k_up, vq, v_up, positions, rope)

    def parts(ql: QuantLatent):
        def nz(t, dtype):
            return t.contiguous() if t.numel() else torch.zeros(1, dtype=dtype, device=q.device)
        return (nz(ql.hi, ql.hi.dtype), nz(ql.lo, torch.uint8), nz(ql.hi_scale, torch.float16),
                nz(ql.lo_scale, torch.float16), ql.n_hi, ql.lo.shape[-1], max(ql.lo_scale.shape[-1], 1), ql.lo_group)

    return _launch(q, parts(kq), k_up, parts(vq), v_up, positions, rope, T, Hkv, kq.rank, vq.rank, quant=True,
                   k_hi_scaled=kq.hi_scale.shape[-1] > 0, v_hi_scaled=vq.hi_scale.shape[-1] > 0)


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


def materialize_sdpa(q, k_latent, k_up, v_latent, v_up, positions, rope: Rope = 10000.0):
    """A naive low-rank cache: build full K and V from the latents, rotate K, then SDPA (GQA)."""
    B, Hq, D = q.shape
    T, Hkv = k_latent.shape[1:3]
    k = rope_rotate_half(torch.einsum("bthr,hrd->bhtd", k_latent, k_up), positions, rope)
    v = (v_latent @ v_up).view(B, T, Hkv, D).transpose(1, 2)
    return dense_sdpa(q, k, v)


def dense_sdpa(q, k, v):
    """The paper's latency baseline: SDPA over a dense, already rotated KV cache k, v (B, Hkv, T, D)."""
    out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
    return out[:, :, 0]


def kv_bytes(B, T, Hkv, D, Rk, Rv, elt=4) -> dict[str, int]:
    """Cache bytes one decode step reads: the Triton kernel (one program per KV head reads that head's key
    latent and the shared value latent) vs a dense K and V cache."""
    return {"latent": elt * B * T * Hkv * (Rk + Rv), "dense": elt * B * T * 2 * Hkv * D}


def _case(B, Hq, Hkv, D, T, Rk, Rv):
    label = f"lowrank_attention B={B} Hq={Hq} Hkv={Hkv} D={D} T={T} Rk={Rk} Rv={Rv} (vs materialize-K+SDPA)"
    by = kv_bytes(B, T, Hkv, D, Rk, Rv)
    flops = 2 * B * T * Hkv * (Rk * D + Hq // Hkv * (D + Rv))
    return (label, lambda device: random_inputs(B, Hq, Hkv, D, T, Rk, Rv, device=device, pad_heads=False),
            lambda *x: decode(*x, backend="triton"),
            lambda *x: materialize_sdpa(*x), by["latent"], flops)


# The paper's latency setting (latency.py): Llama-3.1-8B (Hq 32, Hkv 8, head_dim 128), batch 16, context
# 32768; ranks at its C = 0.6 run with the K/V split (K keeps 1 - 0.69 of 128 per head, V 1 - 0.49 of 1024).
PAPER_SHAPE = dict(B=16, Hq=32, Hkv=8, D=128, T=32768, Rk=40, Rv=522)
PAPER_SPEEDUP = 6.9   # the paper's attention-module speedup over SDPA (its Table/Fig. on latency)
BENCHMARKS: list = []  # timed by bench_rows below (three paths, CPU and GPU)
BENCHMARKS_SMALL = [_case(2, 4, 2, 32, 37, 8, 12)]


def _time(fn, device: str, reps: int) -> float:
    import time
    if device == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=10, rep=max(reps * 10, 50)) / 1e3
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench_rows(device: str, small: bool = False, reps: int = 5, peak_gbs: float | None = 4800.0,
               check: bool = True) -> list[dict]:
    """Decode attention over the compressed cache vs the dense cache, at the paper's shapes.

    CPU (here): the torch paths only - the fused algorithm in torch (decode_latent_torch) vs materialize-K/V
    + SDPA and vs SDPA on a dense cache; batch 1 (a batch-16 fp32 dense cache is 4.3 GB), fp32.
    CUDA: the Triton kernel (fp16 latents) vs SDPA on a dense fp16 cache (the paper's baseline, batch 16)
    and vs materialize + SDPA, with the fraction of the memory roofline the kernel reaches (latent bytes
    read / time / peak_gbs). ``check``: on CUDA also the kernel's deviation from materialize + SDPA
    (``kernels.bench.parity``: ``max_abs_err`` and ``rel_err``)."""
    shape = dict(PAPER_SHAPE)
    if small:
        shape.update(B=2, Hq=4, Hkv=2, D=32, T=37, Rk=8, Rv=12)
    elif device != "cuda":
        shape["B"] = 1
    B, Hq, Hkv, D, T, Rk, Rv = (shape[k] for k in ("B", "Hq", "Hkv", "D", "T", "Rk", "Rv"))
    dt = torch.float16 if device == "cuda" else torch.float32
    q, kl, ku, vl, vu, pos = (x.to(dt) if x.is_floating_point() else x
                              for x in random_inputs(B, Hq, Hkv, D, T, Rk, Rv, device=device, pad_heads=False))
    k = rope_rotate_half(torch.einsum("bthr,hrd->bhtd", kl, ku), pos, 10000.0).contiguous()
    v = (vl @ vu).view(B, T, Hkv, D).transpose(1, 2).contiguous()
    label = f"lowrank_attention decode B={B} Hq={Hq} Hkv={Hkv} D={D} T={T} Rk={Rk} Rv={Rv} ({dt})"
    row = {"kernel": "lowrank_attention", "case": label, "device": device, "paper_speedup": PAPER_SPEEDUP}
    with torch.no_grad():
        t_dense = _time(lambda: dense_sdpa(q, k, v), device, reps)
        t_mat = _time(lambda: materialize_sdpa(q, kl, ku, vl, vu, pos), device, reps)
        # reference_s / kernel_s: the columns of `python -m kernels.bench`'s table (torch ms = materialize + SDPA)
        row.update(dense_sdpa_s=t_dense, materialize_sdpa_s=t_mat, reference_s=t_mat)
        if device == "cuda":
            t_k = _time(lambda: decode(q, kl, ku, vl, vu, pos, backend="triton"), device, reps)
            by = kv_bytes(B, T, Hkv, D, Rk, Rv, elt=2)
            row.update(triton_s=t_k, kernel_s=t_k, ratio_kernel_over_reference=t_k / t_mat, speedup_vs_dense_sdpa=t_dense / t_k, speedup_vs_materialize=t_mat / t_k,
                       latent_bytes=by["latent"], dense_bytes=by["dense"],
                       achieved_gbs=by["latent"] / t_k / 1e9)
            if peak_gbs:
                row["bandwidth_fraction"] = by["latent"] / t_k / 1e9 / peak_gbs
            if check:
                from kernels.bench import parity

                row.update(parity(lambda *x: decode(*x, backend="triton"), materialize_sdpa, (q, kl, ku, vl, vu, pos)))
        else:
            t_lat = _time(lambda: decode_latent_torch(q, kl, ku, vl, vu, pos), device, reps)
            row.update(latent_torch_s=t_lat, ratio_materialize_over_latent=t_mat / t_lat,
                       ratio_dense_over_latent=t_dense / t_lat,
                       gpu_entry="skipped: no CUDA device here (on CUDA this row times the Triton kernel vs SDPA "
                                 "on a dense fp16 cache at batch 16 and reports the memory-roofline fraction)")
    return [row]
