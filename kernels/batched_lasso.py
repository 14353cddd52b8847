"""Batched ISTA Lasso: many small Lasso problems, each given by its Gram statistics.

    beta = batched_lasso(gram, xty, alpha)                  # (P, d)
    beta, iters = batched_lasso(gram, xty, alpha, return_iters=True)

For every problem p (independently) it minimises

    F_p(β) = ½ βᵀ G_p β − b_pᵀ β + α_p ‖β‖₁ ,

which is scikit-learn's ``Lasso(fit_intercept=False)`` objective 1/(2n)‖y − Xβ‖² + α‖β‖₁ up to a
constant when G_p = XᵀX / n and b_p = Xᵀy / n. The solver is ISTA (proximal gradient) with the
constant step t_p = 1 / λ_max(G_p):

    β ← S_{t α}(β − t (G β − b)),     S_τ(z) = sign(z) · max(|z| − τ, 0)      # ALGO: ISTA step

and a problem stops (its β is frozen) as soon as max_j |β_new − β| ≤ tol. Both paths run exactly
this iteration, so they agree to rounding and report the same iteration counts.

The Triton kernel gives each program BLOCK_P problems and keeps their (BLOCK_P, d, d) Gram tiles in
registers for the whole solve (d ≤ 64); the soft-threshold is fused into the epilogue of the
batched mat-vec. The torch reference is the same iteration, vectorised over all problems at once
(a Python loop over iterations, never over problems).
"""
from __future__ import annotations

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency, but keep the reference usable
    triton = None

MAX_D = 64  # Gram tiles live in registers: d ≤ 64 on the Triton path
TILE_ELEMS = 4096  # BLOCK_P * BLOCK_D * BLOCK_D per program
EIGH_CHUNK = 8192  # problems per batched eigvalsh call on CUDA (ista_step_sizes)


def _check(gram: torch.Tensor, xty: torch.Tensor, alpha: torch.Tensor, tol: float, max_iter: int) -> None:
    if gram.dim() != 3 or gram.shape[1] != gram.shape[2]:
        raise ValueError(f"gram: expected (P, d, d), got {tuple(gram.shape)}")
    if gram.shape[1] < 1:
        raise ValueError("gram: need at least one feature (d >= 1)")
    if xty.shape != gram.shape[:2]:
        raise ValueError(f"xty: expected (P, d) = {tuple(gram.shape[:2])}, got {tuple(xty.shape)}")
    if alpha.shape != gram.shape[:1]:
        raise ValueError(f"alpha: expected a scalar or (P,) = {tuple(gram.shape[:1])}, got {tuple(alpha.shape)}")
    if not gram.is_floating_point():
        raise ValueError(f"gram: expected a floating dtype, got {gram.dtype}")
    if alpha.numel() and bool((alpha < 0).any()):
        raise ValueError(f"alpha: the Lasso penalty must be >= 0 (got min {alpha.min().item():.3g})")
    if tol < 0:
        raise ValueError(f"tol: must be >= 0 (got {tol})")
    if max_iter < 1:
        raise ValueError(f"max_iter: must be >= 1 (got {max_iter})")


def ista_step_sizes(gram: torch.Tensor) -> torch.Tensor:
    """t_p = 1 / λ_max(G_p): the largest step for which ISTA is guaranteed to converge.

    The eigenvalues are computed EIGH_CHUNK problems at a time: on CUDA, cuSOLVER's batched syev failed with
    CUSOLVER_STATUS_INTERNAL_ERROR on 65,536 16×16 problems in one call (torch 2.11, H200) and ran on 8,192."""
    lmax = torch.cat([torch.linalg.eigvalsh(c).amax(-1) for c in gram.split(EIGH_CHUNK)])
    return 1.0 / lmax.clamp_min(torch.finfo(gram.dtype).tiny)


def soft_threshold(z: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """S_τ(z) = sign(z)·max(|z| − τ, 0), written as the same three-way select the kernel uses."""
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    return torch.where(z > tau, z - tau, torch.where(z < -tau, z + tau, zero))


def batched_lasso_reference(gram: torch.Tensor, xty: torch.Tensor, alpha: torch.Tensor, step: torch.Tensor,
                            tol: float, max_iter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised torch ISTA over all P problems; returns (beta (P, d), iterations (P,))."""
    beta = torch.zeros_like(xty)
    iters = torch.zeros(xty.shape[0], dtype=torch.int32, device=xty.device)
    done = torch.zeros(xty.shape[0], dtype=torch.bool, device=xty.device)
    thr = (step * alpha)[:, None]
    for _ in range(max_iter):
        grad = torch.einsum("pij,pj->pi", gram, beta) - xty  # ∇ of ½βᵀGβ − bᵀβ
        new = soft_threshold(beta - step[:, None] * grad, thr)  # ALGO: ISTA step
        delta = (new - beta).abs().amax(-1)
        iters += (~done).to(torch.int32)
        beta = torch.where(done[:, None], beta, new)
        done |= delta <= tol
        if bool(done.all()):
            break
    return beta, iters


if triton is not None:

    @triton.jit
    def _ista_kernel(G, B, STEP, ALPHA, BETA, ITERS, P, D, tol, max_iter,
                     BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
        probs = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)  # (BP,)
        ii = tl.arange(0, BLOCK_D)
        pmask = probs < P
        dmask = ii < D
        base = probs.to(tl.int64)  # int64 offsets: P·d² may exceed 2³¹
        g_off = base[:, None, None] * (D * D) + ii[None, :, None] * D + ii[None, None, :]
        g_msk = pmask[:, None, None] & dmask[None, :, None] & dmask[None, None, :]
        g = tl.load(G + g_off, mask=g_msk, other=0.0)                      # (BP, BD, BD)
        v_off = base[:, None] * D + ii[None, :]
        v_msk = pmask[:, None] & dmask[None, :]
        b = tl.load(B + v_off, mask=v_msk, other=0.0)                       # (BP, BD)
        step = tl.load(STEP + probs, mask=pmask, other=1.0)                 # (BP,)
        thr = step * tl.load(ALPHA + probs, mask=pmask, other=0.0)          # t·α
        beta = tl.zeros([BLOCK_P, BLOCK_D], dtype=g.dtype)
        iters = tl.zeros([BLOCK_P], dtype=tl.int32)
        done = probs >= P  # padding problems are done from the start
        it = tl.full([], 0, tl.int32)
        active = tl.sum((~done).to(tl.int32), axis=0)
        while (it < max_iter) & (active > 0):
            grad = tl.sum(g * beta[:, None, :], axis=2) - b                 # G β − b, (BP, BD)
            z = beta - step[:, None] * grad
            # ALGO: ISTA step — soft-threshold fused into the mat-vec epilogue
            new = tl.where(z > thr[:, None], z - thr[:, None],
                           tl.where(z < -thr[:, None], z + thr[:, None], 0.0))
            delta = tl.max(tl.abs(new - beta), axis=1)                      # (BP,)
            iters += (~done).to(tl.int32)
            beta = tl.where(done[:, None], beta, new)
            done = done | (delta <= tol)
            it += 1
            active = tl.sum((~done).to(tl.int32), axis=0)
        tl.store(BETA + v_off, beta, mask=v_msk)
        tl.store(ITERS + probs, iters, mask=pmask)


def _triton_blocks(d: int) -> tuple[int, int]:
    block_d = max(2, triton.next_power_of_2(d))
    block_p = max(1, TILE_ELEMS // (block_d * block_d))
    return block_p, block_d


def batched_lasso_triton(gram, xty, alpha, step, tol: float, max_iter: int):
    P, d = xty.shape
    if d > MAX_D:
        raise ValueError(f"gram: the Triton path keeps (d, d) tiles in registers and needs d <= {MAX_D} (got {d})")
    gram, xty = gram.contiguous(), xty.contiguous()
    alpha, step = alpha.contiguous(), step.contiguous()
    beta = torch.empty_like(xty)
    iters = torch.empty(P, dtype=torch.int32, device=xty.device)
    if P == 0:
        return beta, iters
    block_p, block_d = _triton_blocks(d)
    _ista_kernel[(triton.cdiv(P, block_p),)](gram, xty, step, alpha, beta, iters, P, d, float(tol), int(max_iter),
                                             BLOCK_P=block_p, BLOCK_D=block_d)
    return beta, iters


def batched_lasso(gram: torch.Tensor, xty: torch.Tensor, alpha, tol: float = 1e-10, max_iter: int = 10_000,
                  backend: Backend = "auto", return_iters: bool = False):
    """Solve P Lasso problems ½βᵀG_pβ − b_pᵀβ + α_p‖β‖₁; gram (P, d, d) symmetric PSD, xty (P, d).

    alpha: a number or a (P,) tensor, every value >= 0. Returns beta (P, d) (and the iteration count
    of every problem when ``return_iters``).
    """
    if not isinstance(gram, torch.Tensor) or not isinstance(xty, torch.Tensor):
        raise TypeError("gram and xty must be torch tensors")
    alpha = torch.as_tensor(alpha, dtype=gram.dtype, device=gram.device)
    if alpha.dim() == 0:
        alpha = alpha.expand(gram.shape[0]).clone()
    xty = xty.to(gram.dtype)
    _check(gram, xty, alpha, tol, max_iter)
    step = ista_step_sizes(gram) if gram.shape[0] else alpha.clone()
    if use_triton(gram, xty, backend=backend):
        beta, iters = batched_lasso_triton(gram, xty, alpha, step, tol, max_iter)
    else:
        beta, iters = batched_lasso_reference(gram, xty, alpha, step, tol, max_iter)
    return (beta, iters) if return_iters else beta


def _bench_inputs(P: int, d: int, n: int, device: str):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(P, n, d, generator=gen, dtype=torch.float64)
    beta = torch.zeros(d, dtype=torch.float64)
    beta[: max(1, d // 3)] = 2.0
    y = x @ beta + torch.randn(P, n, generator=gen, dtype=torch.float64)
    gram = (x.transpose(1, 2) @ x / n).to(device)
    xty = (x.transpose(1, 2) @ y[..., None] / n)[..., 0].to(device)
    alpha = torch.full((P,), 0.1, dtype=torch.float64, device=device)
    return gram, xty, alpha


def _lasso_fixed_iters(backend: Backend):
    # tol = 0 and a fixed iteration budget: every problem does (almost always) exactly 100 steps
    return lambda g, b, a: batched_lasso(g, b, a, tol=0.0, max_iter=100, backend=backend)


def _lasso_cost(P: int, d: int, iters: int = 100):
    nbytes = 8 * P * (d * d + 3 * d + 2)
    flops = iters * P * (2 * d * d + 6 * d)
    return nbytes, flops


# (name, make_inputs(device), kernel, reference, bytes moved by an ideal kernel, flops)
BENCHMARKS = [
    ("batched_lasso ISTA fp64 P=65536 d=16 100 it", lambda device: _bench_inputs(65536, 16, 64, device),
     _lasso_fixed_iters("triton"), _lasso_fixed_iters("torch"), *_lasso_cost(65536, 16)),
    ("batched_lasso ISTA fp64 P=8192 d=64 100 it", lambda device: _bench_inputs(8192, 64, 128, device),
     _lasso_fixed_iters("triton"), _lasso_fixed_iters("torch"), *_lasso_cost(8192, 64)),
]
BENCHMARKS_SMALL = [
    ("batched_lasso ISTA fp64 P=37 d=10 100 it", lambda device: _bench_inputs(37, 10, 30, device),
     _lasso_fixed_iters("triton"), _lasso_fixed_iters("torch"), *_lasso_cost(37, 10)),
]
