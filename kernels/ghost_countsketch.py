"""Fused preconditioned outer-product CountSketch (OPUS's per-sample update sketch).

    hashes, signs = make_countsketch(d_out, d_in, m, generator)     # one sketch Π per linear layer
    phi = ghost_countsketch(a, g, precond, hashes, signs, m)          # (B, m)

For a linear layer with inputs a (B, T, d_in) and output gradients g (B, T, d_out), the per-sample
weight gradient is G_b = Σ_t g_{b,t} a_{b,t}ᵀ (d_out, d_in). With an elementwise preconditioner
D (d_out, d_in) (the diagonal of P, e.g. AdamW's C_t / (√v̂ + ε)) and a CountSketch
(h: [d_out·d_in] → [m], s: [d_out·d_in] → ±1) this computes

    phi[b, k] = Σ_{(i,j): h(i,j) = k} s(i,j) · D(i,j) · G_b(i,j)        # φ = Π(P·G(z))

The Triton kernel never materializes G_b: each program builds one (BLOCK_O, BLOCK_I) tile of G_b
in registers (a tl.dot over token chunks), scales it by D·s, and atomically adds it into the
sample's m buckets. The torch reference materializes per-sample gradients a chunk of samples at a
time (bmm) and scatter_adds them into the buckets.
"""
from __future__ import annotations

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency, but keep the reference usable
    triton = None

BLOCK_O, BLOCK_I, BLOCK_T = 32, 32, 16


def make_countsketch(d_out: int, d_in: int, m: int, generator: torch.Generator | None = None,
                     device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A CountSketch of the d_out·d_in weight entries: bucket ids (int32) and ±1 signs (float32)."""
    if m < 1:
        raise ValueError(f"sketch size m must be >= 1 (got {m})")
    hashes = torch.randint(0, m, (d_out, d_in), generator=generator, dtype=torch.int64)
    signs = torch.randint(0, 2, (d_out, d_in), generator=generator, dtype=torch.int64) * 2 - 1
    return hashes.to(device=device, dtype=torch.int32), signs.to(device=device, dtype=torch.float32)


def countsketch(x: torch.Tensor, hashes: torch.Tensor, signs: torch.Tensor, m: int) -> torch.Tensor:
    """Π x for x (..., d_out, d_in) (or flattened (..., d)): (..., m) bucket sums of s·x."""
    lead = x.shape[: x.dim() - hashes.dim()]
    flat = (x.reshape(*lead, -1) * signs.reshape(-1)).reshape(-1, hashes.numel())
    out = torch.zeros(flat.shape[0], m, dtype=flat.dtype, device=x.device)
    out.scatter_add_(1, hashes.reshape(1, -1).long().expand(flat.shape[0], -1), flat)
    return out.reshape(*lead, m)


def ghost_countsketch_reference(a: torch.Tensor, g: torch.Tensor, precond: torch.Tensor,
                                hashes: torch.Tensor, signs: torch.Tensor, m: int,
                                chunk: int = 16) -> torch.Tensor:
    """Chunked bmm (per-sample gradients of `chunk` samples at a time) + scatter_add."""
    B = a.shape[0]
    scale = (precond * signs).reshape(1, -1).float()
    index = hashes.reshape(1, -1).long()
    out = torch.zeros(B, m, dtype=torch.float32, device=a.device)
    for b0 in range(0, B, chunk):
        gb = torch.bmm(g[b0:b0 + chunk].transpose(1, 2).float(), a[b0:b0 + chunk].float())  # (c, d_out, d_in)
        vals = gb.reshape(gb.shape[0], -1) * scale  # s·D·G_b, flattened
        out[b0:b0 + chunk].scatter_add_(1, index.expand(gb.shape[0], -1), vals)
    return out


if triton is not None:

    @triton.jit
    def _ghost_countsketch_kernel(A, G, D, H, S, OUT, T, DI, DO, M,
                                  s_ab, s_at, s_ai, s_gb, s_gt, s_go,
                                  BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_T: tl.constexpr):
        b = tl.program_id(0)
        rows = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)  # output features i
        cols = tl.program_id(2) * BLOCK_I + tl.arange(0, BLOCK_I)  # input features j
        rmask = rows < DO
        cmask = cols < DI
        acc = tl.zeros([BLOCK_O, BLOCK_I], dtype=tl.float32)
        for t0 in range(0, T, BLOCK_T):
            ts = t0 + tl.arange(0, BLOCK_T)
            tmask = ts < T
            gt = tl.load(G + b * s_gb + ts[None, :] * s_gt + rows[:, None] * s_go,
                         mask=rmask[:, None] & tmask[None, :], other=0.0)  # (BLOCK_O, BLOCK_T)
            at = tl.load(A + b * s_ab + ts[:, None] * s_at + cols[None, :] * s_ai,
                         mask=tmask[:, None] & cmask[None, :], other=0.0)  # (BLOCK_T, BLOCK_I)
            acc += tl.dot(gt, at, input_precision="ieee")  # tile of G_b = Σ_t g_t a_tᵀ
        tile = rows[:, None] * DI + cols[None, :]
        msk = rmask[:, None] & cmask[None, :]
        d = tl.load(D + tile, mask=msk, other=0.0)
        s = tl.load(S + tile, mask=msk, other=0.0)
        h = tl.load(H + tile, mask=msk, other=0)
        tl.atomic_add(OUT + b * M + h, acc * d * s, mask=msk)  # φ[b, h(i,j)] += s·D·G_b


def _ghost_countsketch_triton(a, g, precond, hashes, signs, m):
    B, T, DI = a.shape
    DO = g.shape[2]
    out = torch.zeros(B, m, dtype=torch.float32, device=a.device)
    precond = precond.float().contiguous()
    grid = (B, triton.cdiv(DO, BLOCK_O), triton.cdiv(DI, BLOCK_I))
    _ghost_countsketch_kernel[grid](
        a, g, precond, hashes.contiguous(), signs.float().contiguous(), out, T, DI, DO, m,
        a.stride(0), a.stride(1), a.stride(2), g.stride(0), g.stride(1), g.stride(2),
        BLOCK_O=BLOCK_O, BLOCK_I=BLOCK_I, BLOCK_T=BLOCK_T)
    return out


def _check(a, g, precond, hashes, signs, m) -> None:
    if a.dim() != 3 or g.dim() != 3 or a.shape[:2] != g.shape[:2]:
        raise ValueError(f"expected a (B, T, d_in) and g (B, T, d_out); got {tuple(a.shape)}, {tuple(g.shape)}")
    want = (g.shape[2], a.shape[2])
    for name, x in (("precond", precond), ("hashes", hashes), ("signs", signs)):
        if tuple(x.shape) != want:
            raise ValueError(f"{name}: expected shape (d_out, d_in) = {want}, got {tuple(x.shape)}")
    if m < 1:
        raise ValueError(f"sketch size m must be >= 1 (got {m})")


@torch.no_grad()
def ghost_countsketch(a: torch.Tensor, g: torch.Tensor, precond: torch.Tensor, hashes: torch.Tensor,
                      signs: torch.Tensor, m: int, backend: Backend = "auto") -> torch.Tensor:
    """φ[b] = Π(D ⊙ Σ_t g[b,t] a[b,t]ᵀ), shape (B, m), float32."""
    _check(a, g, precond, hashes, signs, m)
    if use_triton(a, g, precond, backend=backend):
        return _ghost_countsketch_triton(a.float(), g.float(), precond, hashes.to(torch.int32), signs, m)
    return ghost_countsketch_reference(a, g, precond, hashes, signs, m)


def _bench_inputs(b: int, t: int, di: int, do: int, m: int, device: str):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(b, t, di, generator=gen).to(device)
    g = torch.randn(b, t, do, generator=gen).to(device)
    d = torch.rand(do, di, generator=gen).to(device)
    h, s = make_countsketch(do, di, m, gen, device)
    return a, g, d, h, s, m


def _case(b, t, di, do, m):
    label = f"ghost_countsketch B={b} T={t} d_in={di} d_out={do} m={m}"
    nbytes = 4 * (b * t * (di + do) + 3 * do * di + b * m)
    flops = 2 * b * t * di * do + 3 * b * di * do
    return (label, lambda device: _bench_inputs(b, t, di, do, m, device),
            lambda *x: ghost_countsketch(*x, backend="triton"),
            lambda *x: ghost_countsketch(*x, backend="torch"), nbytes, flops)


# (name, make_inputs(device), kernel, reference, bytes moved by an ideal kernel, flops)
BENCHMARKS = [_case(256, 1024, 1024, 4096, 8192), _case(512, 512, 768, 768, 4096)]
BENCHMARKS_SMALL = [_case(7, 19, 37, 45, 53)]
