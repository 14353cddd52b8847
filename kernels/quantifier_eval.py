"""Batched guarded-quantifier evaluation over bit-packed finite domains (induction enumeration).

    out = guarded_quantify(rel, phi, dom, mode="exists")   # (G, C, W) int32 bitmasks over x

rel: (G, W, D) int32 -- for guard g in world w, rel[g, w, x] is the bitmask over y of Rel_g(x, y)
phi: (C, W) int32    -- for candidate c in world w, the bitmask over y of φ_c(y)
dom: (W,) int32      -- the domain mask of world w ((1 << size) - 1); size <= 31

    exists:  bit x of out[g, c, w] = OR_y (Rel_g[w, x, y] AND φ_c[w, y])
    forall:  bit x of out[g, c, w] = NOT OR_y (Rel_g[w, x, y] AND NOT φ_c[w, y])     (∀ as ¬∃¬)

for x inside the domain of w; bits outside it are 0. The Triton kernel tiles (flattened
(guard, candidate) rows x worlds) and loops over x with each y-domain packed in one int32, so the
(G, C, W, D, D) boolean tensor of the reference is never materialized. Results are exact integers: tests compare for
equality.
"""
from __future__ import annotations

import torch

from kernels.dispatch import Backend, interpreting, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency, but keep the reference usable
    triton = None

MAX_DOMAIN = 31
BLOCK_R, BLOCK_W = 64, 16
MODES = ("exists", "forall")


def guarded_quantify_reference(rel: torch.Tensor, phi: torch.Tensor, dom: torch.Tensor,
                               mode: str = "exists") -> torch.Tensor:
    """Plain torch integer ops, one x row at a time: bit x of out = (Rel[g, w, x] AND φ[c, w]) != 0.

    Memory O(G * C * W) (the (G, C, W, D, D) boolean tensor is never built), so the CPU stages can
    run it on whole enumeration levels; tests pin it to plain Python loops."""
    G, W, D = rel.shape
    if mode == "forall":
        phi = ~phi & dom[None, :]                                     # ¬φ inside the domain
    out = torch.zeros(G, phi.shape[0], W, dtype=torch.int32, device=rel.device)
    for x in range(D):
        hit = (rel[:, None, :, x] & phi[None, :, :]) != 0             # (G, C, W): OR_y Rel ∧ φ
        out |= hit.to(torch.int32) << x
    if mode == "forall":
        out = ~out
    return out & dom[None, None, :]


if triton is not None:

    @triton.jit
    def _guarded_quantify_kernel(REL, PHI, DOM, OUT, C, W, GC,
                                 D: tl.constexpr, FORALL: tl.constexpr,
                                 BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
        # one tile = BLOCK_R (guard, candidate) rows x BLOCK_W worlds; row r = g * C + c
        rs = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        ws = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        rmask = rs < GC
        wmask = ws < W
        tile_mask = rmask[:, None] & wmask[None, :]
        g = rs // C
        c = rs - g * C
        phi = tl.load(PHI + c[:, None] * W + ws[None, :], mask=tile_mask, other=0)
        dom = tl.load(DOM + ws, mask=wmask, other=0)
        if FORALL:
            phi = (~phi) & dom[None, :]          # ∀y (Rel → φ)  =  ¬∃y (Rel ∧ ¬φ)
        rel_rows = REL + (g[:, None] * W + ws[None, :]) * D
        acc = tl.zeros([BLOCK_R, BLOCK_W], dtype=tl.int32)
        for x in tl.static_range(D):
            rel_x = tl.load(rel_rows + x, mask=tile_mask, other=0)    # row x of Rel: mask over y
            hit = (rel_x & phi) != 0                                   # OR_y (Rel[w,x,y] AND φ[c,w,y])
            acc = acc | (hit.to(tl.int32) << x)
        if FORALL:
            acc = ~acc
        tl.store(OUT + rs[:, None] * W + ws[None, :], acc & dom[None, :], mask=tile_mask)


def _check(rel: torch.Tensor, phi: torch.Tensor, dom: torch.Tensor, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: expected exists or forall (got {mode!r})")
    if rel.dim() != 3 or phi.dim() != 2 or dom.dim() != 1:
        raise ValueError(f"expected rel (G, W, D), phi (C, W), dom (W,); got "
                         f"{tuple(rel.shape)}, {tuple(phi.shape)}, {tuple(dom.shape)}")
    if rel.shape[1] != phi.shape[1] or rel.shape[1] != dom.shape[0]:
        raise ValueError(f"world axis mismatch: rel {tuple(rel.shape)}, phi {tuple(phi.shape)}, dom {tuple(dom.shape)}")
    if rel.shape[2] > MAX_DOMAIN:
        raise ValueError(f"domain size {rel.shape[2]} exceeds the bit-packing limit {MAX_DOMAIN}")
    for name, t in (("rel", rel), ("phi", phi), ("dom", dom)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: expected int32 bitmasks (got {t.dtype})")


def guarded_quantify(rel: torch.Tensor, phi: torch.Tensor, dom: torch.Tensor, mode: str = "exists",
                     backend: Backend = "auto") -> torch.Tensor:
    """out[g, c, w] = bitmask over x of ∃y (Rel_g(x,y) ∧ φ_c(y))  (or ∀y (Rel_g(x,y) → φ_c(y)))."""
    _check(rel, phi, dom, mode)
    G, W, D = rel.shape
    C = phi.shape[0]
    if G == 0 or C == 0 or W == 0:
        return torch.zeros(G, C, W, dtype=torch.int32, device=rel.device)
    if not use_triton(rel, phi, dom, backend=backend):
        return guarded_quantify_reference(rel, phi, dom, mode)
    rel, phi, dom = rel.contiguous(), phi.contiguous(), dom.contiguous()
    out = torch.empty(G, C, W, dtype=torch.int32, device=rel.device)
    block_r, block_w = BLOCK_R, BLOCK_W
    if interpreting() and not rel.is_cuda:   # the CPU interpreter pays per program: use few, big tiles
        block_r = min(8192, max(16, triton.next_power_of_2(G * C)))
        block_w = min(64, max(16, triton.next_power_of_2(W)))
    grid = (triton.cdiv(G * C, block_r), triton.cdiv(W, block_w))
    _guarded_quantify_kernel[grid](rel, phi, dom, out, C, W, G * C, D=D, FORALL=(mode == "forall"),
                                   BLOCK_R=block_r, BLOCK_W=block_w)
    return out


def random_inputs(g: int, c: int, w: int, d: int, device: str = "cpu", seed: int | None = None):
    """Random guards/candidates over worlds of sizes 1..d (bits outside each domain are zero)."""
    gen = torch.Generator(device="cpu")
    if seed is not None:
        gen.manual_seed(seed)
    sizes = torch.randint(1, d + 1, (w,), generator=gen)
    sizes[0] = d
    dom = ((torch.ones(w, dtype=torch.int64) << sizes) - 1).to(torch.int32)
    rel = torch.randint(0, 2**31 - 1, (g, w, d), generator=gen, dtype=torch.int64).to(torch.int32)
    rel = rel & dom[None, :, None]
    rows_ok = (torch.arange(d)[None, :] < sizes[:, None])                # (W, D)
    rel = torch.where(rows_ok[None], rel, torch.zeros_like(rel))
    phi = torch.randint(0, 2**31 - 1, (c, w), generator=gen, dtype=torch.int64).to(torch.int32) & dom[None]
    return rel.to(device), phi.to(device), dom.to(device)


def _bench(mode: str, backend: Backend):
    def run(rel, phi, dom):
        return guarded_quantify(rel, phi, dom, mode, backend=backend)
    return run


def _bench_case(g: int, c: int, w: int, d: int):
    # ideal bytes: read phi and rel once, write out; ops: one AND + test per (g, c, w, x, y-word)
    return (4 * (c * w + g * w * d + g * c * w), 2 * g * c * w * d)


# (name, make_inputs(device), kernel, reference, bytes moved by an ideal kernel, flops)
BENCHMARKS = [
    (f"quantifier_eval {mode} G=10 C=65536 W=64 D=8",
     lambda device: random_inputs(10, 65536, 64, 8, device, seed=0),
     _bench(mode, "triton"), _bench(mode, "torch"), *_bench_case(10, 65536, 64, 8))
    for mode in MODES
]
BENCHMARKS_SMALL = [
    (f"quantifier_eval {mode} G=3 C=97 W=7 D=6",
     lambda device: random_inputs(3, 97, 7, 6, device, seed=0),
     _bench(mode, "triton"), _bench(mode, "torch"), *_bench_case(3, 97, 7, 6))
    for mode in MODES
]
