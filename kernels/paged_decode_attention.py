"""Paged decode attention with shared prefix blocks (one query token per sequence).

    out = paged_decode_attention(q, k_cache, v_cache, block_table, lengths, backend="auto")

q: (B, H, D) the new token's queries; k_cache, v_cache: (N_blocks, BS, H, D) the block pool;
block_table: (B, M) int block ids (entries past a sequence's last block are ignored; several
sequences may point at the same blocks, e.g. a shared system prompt); lengths: (B,) int tokens in
cache per sequence (≥ 1). Output (B, H, D): softmax(q·Kᵀ/√D)·V over each sequence's first
lengths[b] cached tokens, computed block by block with an online softmax (the Triton path) or by
gathering to dense tensors (the torch reference).
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


def paged_decode_attention_reference(q, k_cache, v_cache, block_table, lengths):
    B, H, D = q.shape
    BS = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(lengths[b])
        nb = -(-n // BS)
        ids = block_table[b, :nb].long()
        k = k_cache[ids].reshape(nb * BS, H, D)[:n]  # (n, H, D)
        v = v_cache[ids].reshape(nb * BS, H, D)[:n]
        s = torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(D)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v)
    return out


if triton is not None:
    @triton.jit
    def _paged_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, o_ptr, H, D, M, scale,
                      BS: tl.constexpr, BLOCK_D: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        offs_d = tl.arange(0, BLOCK_D)
        offs_t = tl.arange(0, BS)
        dmask = offs_d < D
        q = tl.load(q_ptr + (b * H + h) * D + offs_d, mask=dmask, other=0.0).to(tl.float32)
        n = tl.load(len_ptr + b)
        m_i = -float("inf")
        l_i = 0.0
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        nblocks = (n + BS - 1) // BS
        for j in range(0, nblocks):
            blk = tl.load(bt_ptr + b * M + j).to(tl.int64)
            tok = j * BS + offs_t
            tmask = tok < n
            base = ((blk * BS + offs_t[:, None]) * H + h) * D + offs_d[None, :]
            kv_mask = tmask[:, None] & dmask[None, :]
            k = tl.load(k_ptr + base, mask=kv_mask, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + base, mask=kv_mask, other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale
            s = tl.where(tmask, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)  # ALGO: online softmax rescaling
            p = tl.exp(s - m_new)
            p = tl.where(tmask, p, 0.0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m_i = m_new
        tl.store(o_ptr + (b * H + h) * D + offs_d, acc / l_i, mask=dmask)


def _check(q, k_cache, v_cache, block_table, lengths):
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("expected q (B,H,D), k_cache/v_cache (N,BS,H,D) of equal shape")
    B, H, D = q.shape
    if k_cache.shape[2:] != (H, D):
        raise ValueError(f"k_cache heads/dim {tuple(k_cache.shape[2:])} != q's {(H, D)}")
    if block_table.shape[0] != B or lengths.shape != (B,):
        raise ValueError("block_table must be (B, M) and lengths (B,)")
    if bool((lengths < 1).any()) or bool((lengths > block_table.shape[1] * k_cache.shape[1]).any()):
        raise ValueError("lengths must be in [1, M*BS]")


@torch.no_grad()
def paged_decode_attention(q, k_cache, v_cache, block_table, lengths, backend: Backend = "auto"):
    _check(q, k_cache, v_cache, block_table, lengths)
    if not use_triton(q, k_cache, backend=backend):
        return paged_decode_attention_reference(q, k_cache, v_cache, block_table, lengths)
    B, H, D = q.shape
    BS = k_cache.shape[1]
    if BS & (BS - 1):
        raise ValueError(f"Triton path needs a power-of-two block size (got {BS})")
    out32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    bt = block_table.to(torch.int32).contiguous()
    ln = lengths.to(torch.int32).contiguous()
    _paged_kernel[(B, H)](q.contiguous(), k_cache.contiguous(), v_cache.contiguous(), bt, ln, out32, H, D,
                          bt.shape[1], 1.0 / math.sqrt(D), BS=BS, BLOCK_D=triton.next_power_of_2(D))
    return out32.to(q.dtype)


def random_inputs(B: int, H: int, D: int, BS: int, max_len: int, shared_blocks: int = 0, seed: int = 0,
                  device="cpu", dtype=torch.float32):
    """Random pool + tables where every sequence starts with the same `shared_blocks` prefix blocks."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, shared_blocks * BS), max_len + 1, (B,), generator=g)
    M = -(-max_len // BS)
    nblocks = shared_blocks + B * (M - shared_blocks) + 1
    perm = torch.randperm(nblocks, generator=g)
    table = torch.zeros(B, M, dtype=torch.int32)
    nxt = shared_blocks
    for b in range(B):
        table[b, :shared_blocks] = perm[:shared_blocks]
        for j in range(shared_blocks, M):
            table[b, j] = perm[nxt]
            nxt += 1
    k = torch.randn(nblocks, BS, H, D, generator=g, dtype=dtype)
    v = torch.randn(nblocks, BS, H, D, generator=g, dtype=dtype)
    q = torch.randn(B, H, D, generator=g, dtype=dtype)
    return tuple(x.to(device) for x in (q, k, v, table, lengths))


def _case(B, H, D, BS, L, S):
    label = f"paged_decode_attention B={B} H={H} D={D} BS={BS} L={L} shared={S}"
    nbytes = 4 * B * L * H * D * 2
    return (label, lambda device: random_inputs(B, H, D, BS, L, S, device=device),
            lambda *x: paged_decode_attention(*x, backend="triton"),
            lambda *x: paged_decode_attention(*x, backend="torch"), nbytes, 4 * B * L * H * D)


BENCHMARKS = [_case(64, 8, 128, 16, 4096, 64), _case(256, 8, 64, 16, 1024, 16)]
BENCHMARKS_SMALL = [_case(3, 2, 16, 4, 37, 2)]
