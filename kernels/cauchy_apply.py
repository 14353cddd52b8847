"""Implicit application of a Cauchy-like factor (L2G-Net's per-cut-edge basis update).

    Y = cauchy_apply(z, d, org, tau, a, X)                   # Y = C^T X
    Y = cauchy_apply(z, d, org, tau, a, X, transpose=False)  # Y = C X

with C_ij = a_j z_i / ((d_i - org_j) - tau_j): z (m,) the Gu-Eisenstat vector, d (m,) the old
eigenvalues, lam~_j = org_j + tau_j the new ones written relative to their nearest pole (so the
difference d_i - lam~_j keeps full relative precision), a (m,) the column normalizers; X (m, c).
The Triton kernel generates C tile by tile from these O(m) numbers and never stores the m x m
matrix; the reference builds C densely in torch (fp64). Differentiable in X: the gradient of
C^T X is C dY and vice versa, computed by the same kernel with the flag flipped.
"""
from __future__ import annotations

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency, but keep the reference usable
    triton = None

BLOCK_R, BLOCK_K, BLOCK_C = 32, 32, 32


def cauchy_matrix(z, d, org, tau, a) -> torch.Tensor:
    """The dense (m, m) factor C_ij = a_j z_i / ((d_i - org_j) - tau_j) (reference / debugging)."""
    delta = (d[:, None] - org[None, :]) - tau[None, :]
    return (z[:, None] * a[None, :]) / delta


def cauchy_apply_reference(z, d, org, tau, a, X, transpose: bool = True) -> torch.Tensor:
    C = cauchy_matrix(z, d, org, tau, a).to(X.dtype)
    return C.T @ X if transpose else C @ X


if triton is not None:

    @triton.jit
    def _cauchy_kernel(Z, D, ORG, TAU, A, X, Y, M, NC, s_xm, s_xc, s_ym, s_yc,
                       TRANSPOSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        rmask = rows < M
        cmask = cols < NC
        acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
        if TRANSPOSE:  # output rows are columns j of C; inner index i
            org = tl.load(ORG + rows, mask=rmask, other=0.0)
            tau = tl.load(TAU + rows, mask=rmask, other=0.0)
            scale = tl.load(A + rows, mask=rmask, other=0.0)
        else:          # output rows are rows i of C; inner index j
            d_r = tl.load(D + rows, mask=rmask, other=0.0)
            scale = tl.load(Z + rows, mask=rmask, other=0.0)
        for k0 in range(0, M, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < M
            if TRANSPOSE:
                d_k = tl.load(D + ks, mask=kmask, other=0.0)
                z_k = tl.load(Z + ks, mask=kmask, other=0.0)
                delta = (d_k[None, :] - org[:, None]) - tau[:, None]          # (R, K): d_i - lam~_j
                tile = z_k[None, :] / tl.where(rmask[:, None] & kmask[None, :], delta, 1.0)
            else:
                org_k = tl.load(ORG + ks, mask=kmask, other=0.0)
                tau_k = tl.load(TAU + ks, mask=kmask, other=0.0)
                a_k = tl.load(A + ks, mask=kmask, other=0.0)
                delta = (d_r[:, None] - org_k[None, :]) - tau_k[None, :]      # (R, K): d_i - lam~_j
                tile = a_k[None, :] / tl.where(rmask[:, None] & kmask[None, :], delta, 1.0)
            tile = tl.where(rmask[:, None] & kmask[None, :], tile, 0.0)
            x = tl.load(X + ks[:, None] * s_xm + cols[None, :] * s_xc,
                        mask=kmask[:, None] & cmask[None, :], other=0.0)
            # fp64 tile product as broadcast-multiply-reduce (exact fp64 FMA path on any device)
            acc += tl.sum(tile[:, :, None] * x[None, :, :], axis=1)
        out = acc * scale[:, None]
        tl.store(Y + rows[:, None] * s_ym + cols[None, :] * s_yc, out, mask=rmask[:, None] & cmask[None, :])


def _apply_triton(z, d, org, tau, a, X, transpose: bool) -> torch.Tensor:
    m, c = X.shape
    Xd = X.to(torch.float64).contiguous()
    Y = torch.empty(m, c, dtype=torch.float64, device=X.device)
    params = [t.to(torch.float64).contiguous() for t in (z, d, org, tau, a)]
    grid = (triton.cdiv(m, BLOCK_R), triton.cdiv(c, BLOCK_C))
    _cauchy_kernel[grid](*params, Xd, Y, m, c, Xd.stride(0), Xd.stride(1), Y.stride(0), Y.stride(1),
                         TRANSPOSE=transpose, BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K, BLOCK_C=BLOCK_C)
    return Y.to(X.dtype)


class _CauchyApply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, z, d, org, tau, a, transpose):
        ctx.save_for_backward(z, d, org, tau, a)
        ctx.transpose = transpose
        return _apply_triton(z, d, org, tau, a, X, transpose)

    @staticmethod
    def backward(ctx, grad):
        z, d, org, tau, a = ctx.saved_tensors
        # d(C^T X)/dX applied to grad is C grad, and vice versa
        return _apply_triton(z, d, org, tau, a, grad, not ctx.transpose), None, None, None, None, None, None


def _check(z, d, org, tau, a, X) -> None:
    m = d.shape[0]
    for name, t in (("z", z), ("d", d), ("org", org), ("tau", tau), ("a", a)):
        if t.dim() != 1 or t.shape[0] != m:
            raise ValueError(f"cauchy_apply: {name} must have shape ({m},), got {tuple(t.shape)}")
    if X.dim() != 2 or X.shape[0] != m:
        raise ValueError(f"cauchy_apply: X must have shape ({m}, c), got {tuple(X.shape)}")


def cauchy_apply(z, d, org, tau, a, X, transpose: bool = True, backend: Backend = "auto") -> torch.Tensor:
    """C^T X (transpose=True) or C X for the implicit Cauchy-like factor; differentiable in X."""
    _check(z, d, org, tau, a, X)
    if use_triton(z, d, org, tau, a, X, backend=backend):
        return _CauchyApply.apply(X, z, d, org, tau, a, transpose)
    return cauchy_apply_reference(z, d, org, tau, a, X, transpose)


def _secular_roots(d, z2, rho, iters: int = 80):
    """Roots of 1/rho + sum_i z2_i / (d_i - lam) = 0 by bisection (numpy, vectorized over roots),
    each as (origin pole, offset) with the nearer pole as origin; the kernel's own test inputs, so
    that kernels/ never imports from stages/."""
    import numpy as np

    m = d.size
    upper = np.append(d[1:], d[-1] + rho * z2.sum())
    gap = upper - d
    f = lambda lam_minus_d0, d0: 1.0 / rho + (z2[:, None] / ((d[:, None] - d0[None, :]) - lam_minus_d0[None, :])).sum(0)  # noqa: E731
    right = np.zeros(m, dtype=bool)
    right[:-1] = f(0.5 * gap[:-1], d[:-1]) < 0            # root in the upper half: origin d_{j+1}
    origin = np.where(right, np.minimum(np.arange(m) + 1, m - 1), np.arange(m))
    lo = np.where(right, -0.5 * gap, 0.0)
    hi = np.where(right, 0.0, np.where(np.arange(m) == m - 1, gap, 0.5 * gap))
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        neg = f(mid, d[origin]) < 0
        lo, hi = np.where(neg, mid, lo), np.where(neg, hi, mid)
    return origin, 0.5 * (lo + hi)


def random_factor(m: int, c: int, device: str | torch.device = "cpu", seed: int | None = None):
    """A genuine orthogonal Cauchy factor: the rank-one eigen-update of diag(d) + rho z z^T, with
    Gu-Eisenstat z^ (z^_i^2 = prod_j (lam~_j - d_i) / (rho prod_{j!=i} (d_j - d_i))) and unit columns."""
    import numpy as np

    rng = np.random.default_rng(seed)
    d = np.sort(rng.uniform(0.0, 10.0, m)) + np.arange(m) * 1e-3
    z = rng.normal(size=m)
    z /= np.linalg.norm(z)
    rho = float(rng.uniform(0.5, 3.0))
    origin, tau = _secular_roots(d, z * z, rho)
    delta = (d[:, None] - d[origin][None, :]) - tau[None, :]          # d_i - lam~_j
    jj = np.arange(m)
    den = np.where(jj[None, :] < jj[:, None], d[None, :] - d[:, None], d[np.minimum(jj + 1, m - 1)][None, :] - d[:, None])
    den[:, m - 1] = rho
    zhat = np.copysign(np.sqrt(np.prod(-delta / den, axis=1)), z)
    a = 1.0 / np.sqrt(((zhat[:, None] / delta) ** 2).sum(axis=0))
    to = lambda v: torch.tensor(v, dtype=torch.float64, device=device)  # noqa: E731
    X = torch.tensor(rng.normal(size=(m, c)), dtype=torch.float64, device=device)
    return to(zhat), to(d), to(d[origin]), to(tau), to(a), X


def _bench_case(m: int, c: int):
    def make(device):
        return random_factor(m, c, device=device, seed=0)
    return make


# (name, make_inputs(device), kernel, reference, bytes moved by an ideal kernel, flops)
BENCHMARKS = [
    ("cauchy_apply C^T X fp64 m=4096 c=64", _bench_case(4096, 64),
     lambda *t: cauchy_apply(*t, backend="triton"), lambda *t: cauchy_apply(*t, backend="torch"),
     8 * (5 * 4096 + 2 * 4096 * 64), 2 * 4096 * 4096 * 64 + 4 * 4096 * 4096),
]
BENCHMARKS_SMALL = [
    ("cauchy_apply C^T X fp64 m=97 c=5", _bench_case(97, 5),
     lambda *t: cauchy_apply(*t, backend="triton"), lambda *t: cauchy_apply(*t, backend="torch"),
     8 * (5 * 97 + 2 * 97 * 5), 2 * 97 * 97 * 5 + 4 * 97 * 97),
]
