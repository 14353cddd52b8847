"""Fused round step of B independent constrained bandit instances (fair_bandits).

    out = fair_round_step(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ,
                          lam, eta, lam_max, backend="auto")
    out.action (B,) int64, out.reward (B,), out.counts (B, C, K), out.succ (B, C, K),
    out.lam (B, J), out.any_feasible (B,) bool

For every instance b (one Triton program each), with K arms and J constraints:

    feasible_k = AND_j ( |eff[b,j,k]| − xi[b,j,k] < tau[b] )        # ALGO: optimistic feasible set
    allowed    = feasible if any arm is feasible else every arm        # official fallback: overall argmax
    action     = argmax_{k ∈ allowed} score[b,k], ties broken by the largest mixer[b,k]
                 (the official np.lexsort((mixer, ucb)) rule), first index on exact ties;
                 explore[b] >= 0 overrides it (uniform exploration arm drawn outside)
    reward     = 1[u[b] < p_true[b, action]]                           # Bernoulli from a pre-drawn uniform
    counts[b, ctx[b], action] += 1 ; succ[b, ctx[b], action] += reward # tabular statistics
    lam[b,j]   = clip(lam[b,j] + eta[b]·(|eff[b,j,action]| − tau[b]), 0, lam_max[b])  # ALGO: capped dual ascent

Unconstrained instances pass xi = +inf (every arm feasible), non-dual ones eta = 0. Inputs are
not modified (the outputs are fresh tensors). The torch reference is the same step vectorized
over instances; the actions and counters agree exactly, λ up to floating-point contraction.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


class RoundStep(NamedTuple):
    action: torch.Tensor
    reward: torch.Tensor
    counts: torch.Tensor
    succ: torch.Tensor
    lam: torch.Tensor
    any_feasible: torch.Tensor


def fair_round_step_reference(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ,
                              lam, eta, lam_max) -> RoundStep:
    B, K = score.shape
    feas = ((eff.abs() - xi) < tau[:, None, None]).all(1)                    # (B, K)
    any_feas = feas.any(1)
    allowed = torch.where(any_feas[:, None], feas, torch.ones_like(feas))
    s = torch.where(allowed, score, torch.full_like(score, -torch.inf))
    cand = allowed & (s == s.max(1, keepdim=True).values)
    mkey = torch.where(cand, mixer, torch.full_like(mixer, -2.0))
    best = cand & (mkey == mkey.max(1, keepdim=True).values)
    ar = torch.arange(K, device=score.device).expand(B, K)
    action = torch.where(best, ar, torch.full_like(ar, K)).min(1).values
    action = torch.where(explore >= 0, explore, action)
    reward = (u < p_true.gather(1, action[:, None])[:, 0]).to(score.dtype)
    counts, succ = counts.clone(), succ.clone()
    rows = torch.arange(B, device=score.device)
    counts[rows, ctx, action] += 1
    succ[rows, ctx, action] += reward.to(succ.dtype)
    g = eff.gather(2, action[:, None, None].expand(B, eff.shape[1], 1))[..., 0].abs() - tau[:, None]
    lam = torch.minimum(torch.clamp(lam + eta[:, None] * g, min=0.0), lam_max[:, None])
    return RoundStep(action, reward, counts, succ, lam, any_feas)


if triton is not None:

    @triton.jit
    def _fair_round_step_kernel(SCORE, EFF, XI, TAU, EXPLORE, MIX, U, P, CTX, COUNTS, SUCC, LAM, ETA, LMAX,
                                ACT, REW, FEAS, K, C, J: tl.constexpr, BLOCK_K: tl.constexpr):
        b = tl.program_id(0)
        ks = tl.arange(0, BLOCK_K)
        km = ks < K
        score = tl.load(SCORE + b * K + ks, mask=km, other=0.0)
        tau = tl.load(TAU + b)
        feas = km
        for j in tl.static_range(J):
            e = tl.load(EFF + (b * J + j) * K + ks, mask=km, other=0.0)
            x = tl.load(XI + (b * J + j) * K + ks, mask=km, other=0.0)
            feas = feas & ((tl.abs(e) - x) < tau)                     # |ĉ_j| − ξ_j < τ
        anyf = tl.max(feas.to(tl.int32), 0) > 0
        allowed = tl.where(anyf, feas, km)
        s = tl.where(allowed, score, float("-inf"))
        smax = tl.max(s, 0)
        cand = allowed & (s == smax)
        mix = tl.load(MIX + b * K + ks, mask=km, other=0.0)
        mkey = tl.where(cand, mix, -2.0)
        mmax = tl.max(mkey, 0)
        idx = tl.where(cand & (mkey == mmax), ks, BLOCK_K)
        a = tl.min(idx, 0)
        ex = tl.load(EXPLORE + b)
        a = tl.where(ex >= 0, ex, a)
        p = tl.load(P + b * K + a)
        u = tl.load(U + b)
        r = (u < p).to(p.dtype)
        c = tl.load(CTX + b)
        off = (b * C + c) * K + a
        tl.store(COUNTS + off, tl.load(COUNTS + off) + 1)
        sv = tl.load(SUCC + off)
        tl.store(SUCC + off, sv + r.to(sv.dtype))
        eta = tl.load(ETA + b)
        lmax = tl.load(LMAX + b)
        for j in tl.static_range(J):
            ea = tl.load(EFF + (b * J + j) * K + a)
            lv = tl.load(LAM + b * J + j)
            lv = lv + eta * (tl.abs(ea) - tau)
            lv = tl.minimum(tl.maximum(lv, 0.0), lmax)
            tl.store(LAM + b * J + j, lv)
        tl.store(ACT + b, a.to(tl.int64))
        tl.store(REW + b, r)
        tl.store(FEAS + b, anyf.to(tl.int8))


def _fair_round_step_triton(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ,
                            lam, eta, lam_max) -> RoundStep:
    B, K = score.shape
    J, C = eff.shape[1], counts.shape[1]
    dt = score.dtype
    c = lambda x, d=dt: x.to(d).contiguous()  # noqa: E731
    counts_o, succ_o, lam_o = counts.clone().contiguous(), succ.clone().contiguous(), c(lam).clone()
    action = torch.empty(B, dtype=torch.int64, device=score.device)
    reward = torch.empty(B, dtype=dt, device=score.device)
    feas = torch.empty(B, dtype=torch.int8, device=score.device)
    _fair_round_step_kernel[(B,)](
        c(score), c(eff), c(xi), c(tau), c(explore, torch.int64), c(mixer), c(u), c(p_true),
        c(ctx, torch.int64), counts_o, succ_o, lam_o, c(eta), c(lam_max), action, reward, feas,
        K, C, J=J, BLOCK_K=max(2, triton.next_power_of_2(K)))
    return RoundStep(action, reward, counts_o, succ_o, lam_o, feas.bool())


def _check(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ, lam, eta, lam_max) -> None:
    if score.dim() != 2:
        raise ValueError(f"score: expected (B, K), got {tuple(score.shape)}")
    B, K = score.shape
    if eff.dim() != 3 or eff.shape[0] != B or eff.shape[2] != K or xi.shape != eff.shape:
        raise ValueError(f"eff/xi: expected (B, J, K) = ({B}, J, {K}); got {tuple(eff.shape)}, {tuple(xi.shape)}")
    J = eff.shape[1]
    for name, x, shape in (("tau", tau, (B,)), ("explore", explore, (B,)), ("mixer", mixer, (B, K)),
                           ("u", u, (B,)), ("p_true", p_true, (B, K)), ("ctx", ctx, (B,)),
                           ("lam", lam, (B, J)), ("eta", eta, (B,)), ("lam_max", lam_max, (B,))):
        if tuple(x.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(x.shape)}")
    if counts.dim() != 3 or counts.shape[0] != B or counts.shape[2] != K or succ.shape != counts.shape:
        raise ValueError(f"counts/succ: expected (B, C, K) = ({B}, C, {K}); got {tuple(counts.shape)}")
    if not torch.isfinite(tau).all():
        raise ValueError("tau: must be finite (an unconstrained instance passes xi = +inf instead)")
    if K < 1 or J < 1:
        raise ValueError(f"need K >= 1 arms and J >= 1 constraints (got K={K}, J={J})")


@torch.no_grad()
def fair_round_step(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ, lam, eta, lam_max,
                    backend: Backend = "auto") -> RoundStep:
    """One fused round for B instances; see the module docstring."""
    _check(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ, lam, eta, lam_max)
    if use_triton(score, eff, backend=backend):
        return _fair_round_step_triton(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ,
                                       lam, eta, lam_max)
    return fair_round_step_reference(score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ,
                                     lam, eta, lam_max)


def random_inputs(B: int, K: int, J: int, C: int, device: str | torch.device = "cpu", seed: int = 0,
                  dtype: torch.dtype = torch.float64, ties: bool = False):
    """Fresh random inputs (tests and benchmarks); ties=True quantizes scores so argmax ties occur."""
    g = torch.Generator().manual_seed(seed)
    score = torch.rand(B, K, generator=g, dtype=dtype)
    if ties:
        score = (score * 3).floor() / 3
    eff = torch.randn(B, J, K, generator=g, dtype=dtype) * 0.3
    xi = torch.rand(B, J, K, generator=g, dtype=dtype) * 0.2
    xi[: B // 4] = torch.inf  # some unconstrained instances
    tau = torch.rand(B, generator=g, dtype=dtype) * 0.3
    explore = torch.where(torch.rand(B, generator=g) < 0.2, torch.randint(0, K, (B,), generator=g),
                          torch.full((B,), -1))
    mixer = torch.rand(B, K, generator=g, dtype=dtype)
    u = torch.rand(B, generator=g, dtype=dtype)
    p_true = torch.rand(B, K, generator=g, dtype=dtype)
    ctx = torch.randint(0, C, (B,), generator=g)
    counts = torch.randint(0, 5, (B, C, K), generator=g, dtype=torch.int64)
    succ = (counts * torch.rand(B, C, K, generator=g, dtype=dtype)).floor()
    lam = torch.rand(B, J, generator=g, dtype=dtype) * 2
    eta = torch.rand(B, generator=g, dtype=dtype) * (torch.rand(B, generator=g) < 0.5)
    lam_max = torch.full((B,), 1.5, dtype=dtype)
    out = (score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ, lam, eta, lam_max)
    return tuple(x.to(device) for x in out)


def _case(B, K, J, C):
    label = f"fair_round_step B={B} K={K} J={J} C={C}"
    nbytes = 8 * B * (K * (3 + 2 * J) + 6 + 2 * J) + 16 * B
    flops = B * K * (3 * J + 6)
    return (label, lambda device: random_inputs(B, K, J, C, device),
            lambda *x: fair_round_step(*x, backend="triton"),
            lambda *x: fair_round_step(*x, backend="torch"), nbytes, flops)


# (name, make_inputs(device), kernel, reference, bytes moved by an ideal kernel, flops)
BENCHMARKS = [_case(65536, 10, 3, 8), _case(4096, 64, 3, 8)]
BENCHMARKS_SMALL = [_case(37, 10, 3, 8)]
