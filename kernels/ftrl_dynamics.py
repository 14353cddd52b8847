"""Batched FTRL / fictitious-play dynamics in two-player identical-interest games, with the exact
ε-Nash gap checked at every iterate: one Triton program per game runs the whole trajectory.

    out = ftrl_run(A, ux0, uy0, eta, eps, cap, reg="entropic", schedule="constant")
    out["hit"]        # (B,) int64: first t (1-based) with gap(x_t, y_t) <= eps[b]; -1 if none by cap
    out["x"], out["y"]  # (B, n): the iterate at the hitting time (or at t = cap)
    out["phi"], out["gap"]  # (B, K): Φ(x_t, y_t) = x_tᵀ A y_t and the gap at t = every, 2·every, …
    g = ne_gap(A, x, y)  # (B,) exact gap max(max_i (Ay)_i − xᵀAy, max_j (Aᵀx)_j − xᵀAy)

Dynamics (both players receive xᵀAy; u^x_t = A y_t, u^y_t = Aᵀ x_t):

    x_t = Q(η_t · U^x_{t-1}),  U^x_t = U^x_{t-1} + A y_t              # ALGO: FTRL (lazy / dual averaging)
    η_t = η           (schedule "constant")   or   η / √t   ("sqrt": vanishing step size)
    alternating=True: y_t = Q(η_t · (U^y_{t-1} + Aᵀx_t)): the column player moves second each round
        and already sees x_t (lazy alternating no-regret dynamics).

Q is the regularized best response argmax_x <z, x> − R(x) over the simplex:
    entropic    R = Σ x log x     → softmax(z)                          (= MWU)
    euclidean   R = ½‖x‖²         → Π_Δ(z), exact Euclidean projection
    logbarrier  R = −Σ log x      → x_i = 1/(λ − z_i) with Σ x_i = 1    (Newton on λ from the left)
    fp          R = 0 (η → ∞)     → the pure best response (fictitious play), ties to the highest of
                                     per-run priorities prio_x / prio_y (default: the lowest index)

Both paths compute in the input dtype (fp64 in the stages). The torch reference uses the sort-based
simplex projection (Duchi et al. 2008); the kernel uses bisection on the threshold followed by an
exact polish on the found support — the same point up to rounding.
"""
from __future__ import annotations

from typing import Literal

import torch

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

Reg = Literal["entropic", "euclidean", "logbarrier", "fp"]
REGS = ("entropic", "euclidean", "logbarrier", "fp")
REG_ID = {r: i for i, r in enumerate(REGS)}
SCHEDULES = ("constant", "sqrt")
MAX_N = 64          # the (n, n) payoff tile lives in registers on the Triton path
NEWTON_ITERS = 40   # log-barrier: Newton steps on λ (monotone from the left; converged well before)
BISECT_ITERS = 60   # Euclidean projection in the kernel: bisection steps on the threshold


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------

def ne_gap_reference(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Exact ε-NE gap of (x, y) in the identical-interest game A: (B, n, n), (B, n), (B, n) -> (B,)."""
    ay = torch.einsum("bij,bj->bi", A, y)       # row player's utility vector
    atx = torch.einsum("bij,bi->bj", A, x)      # column player's utility vector
    phi = (x * ay).sum(-1)                       # potential Φ = xᵀAy
    return torch.maximum(ay.amax(-1) - phi, atx.amax(-1) - phi)


def project_simplex(z: torch.Tensor) -> torch.Tensor:
    """Exact Euclidean projection of each row of z onto the probability simplex (sort-based)."""
    n = z.shape[-1]
    u, _ = torch.sort(z, dim=-1, descending=True)
    css = u.cumsum(-1) - 1.0
    k = torch.arange(1, n + 1, dtype=z.dtype, device=z.device)
    cond = u - css / k > 0
    rho = cond.to(torch.int64).cumsum(-1).argmax(-1, keepdim=True)  # last index where cond holds
    tau = css.gather(-1, rho) / (rho + 1).to(z.dtype)
    return (z - tau).clamp_min(0.0)


def logbarrier_response(z: torch.Tensor) -> torch.Tensor:
    """argmax <z,x> + Σ log x_i over the simplex: x_i = 1/(λ − z_i), Σ x_i = 1 (Newton from λ = max z + 1)."""
    zmax = z.amax(-1, keepdim=True)
    lam = zmax + 1.0                                 # g(λ) = Σ 1/(λ − z_i) − 1 >= 0 here
    for it in range(NEWTON_ITERS):
        r = 1.0 / (lam - z)
        g = r.sum(-1, keepdim=True) - 1.0
        step = g / (r * r).sum(-1, keepdim=True)
        lam = lam + step                             # g convex decreasing: iterates rise to the root
        if it % 4 == 3 and bool((step.abs() <= 1e-15 * lam.abs().clamp_min(1.0)).all()):
            break                                    # converged (the kernel runs all NEWTON_ITERS)
    x = 1.0 / (lam - z)
    return x / x.sum(-1, keepdim=True)


def best_response(z: torch.Tensor, prio: torch.Tensor | None = None) -> torch.Tensor:
    """Pure best response; ties go to the highest priority (prio: (B, n) distinct per row; default
    −index, i.e. the lowest index)."""
    n = z.shape[-1]
    idx = torch.arange(n, device=z.device).expand_as(z)
    if prio is None:
        first = torch.where(z == z.amax(-1, keepdim=True), idx, n).amin(-1, keepdim=True)
        return (idx == first).to(z.dtype)
    key = torch.where(z == z.amax(-1, keepdim=True), prio.to(z.dtype), -torch.inf)
    return (key == key.amax(-1, keepdim=True)).to(z.dtype)


def regularized_response(z: torch.Tensor, reg: str, prio: torch.Tensor | None = None) -> torch.Tensor:
    if reg == "entropic":
        return torch.softmax(z, dim=-1)              # ALGO: MWU = FTRL with negative entropy
    if reg == "euclidean":
        return project_simplex(z)                    # ALGO: FTRL with ½‖x‖² (projected)
    if reg == "logbarrier":
        return logbarrier_response(z)                # ALGO: FTRL with −Σ log x
    if reg == "fp":
        return best_response(z, prio)                # ALGO: fictitious play (η → ∞)
    raise ValueError(f"reg: expected one of {', '.join(REGS)} (got {reg!r})")


def ftrl_run_reference(A, ux0, uy0, eta, eps, cap: int, reg: str, schedule: str, alternating: bool,
                       every: int, prio_x: torch.Tensor | None = None,
                       prio_y: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    B, n, _ = A.shape
    ux, uy = ux0.clone(), uy0.clone()
    hit = torch.full((B,), -1, dtype=torch.int64, device=A.device)
    done = torch.zeros(B, dtype=torch.bool, device=A.device)
    K = cap // every
    phi_tr = torch.full((B, K), float("nan"), dtype=A.dtype, device=A.device)
    gap_tr = torch.full((B, K), float("nan"), dtype=A.dtype, device=A.device)
    x_out = torch.zeros_like(ux)
    y_out = torch.zeros_like(uy)
    At = A.transpose(1, 2)
    x = y = None
    for t in range(1, cap + 1):
        h = eta if schedule == "constant" else eta / (t ** 0.5)          # η_t
        x = regularized_response(h[:, None] * ux, reg, prio_x)
        atx = torch.einsum("bij,bj->bi", At, x)                          # u^y_t = Aᵀ x_t
        # ALGO: alternation — the column player responds to U^y that already contains Aᵀx_t
        y = regularized_response(h[:, None] * (uy + atx if alternating else uy), reg, prio_y)
        ay = torch.einsum("bij,bj->bi", A, y)                            # u^x_t = A y_t
        phi = (x * ay).sum(-1)
        gap = torch.maximum(ay.amax(-1) - phi, atx.amax(-1) - phi)
        if t % every == 0:
            k = t // every - 1
            phi_tr[:, k] = torch.where(done, phi_tr[:, k], phi)
            gap_tr[:, k] = torch.where(done, gap_tr[:, k], gap)
        new = (~done) & (gap <= eps)
        if bool(new.any()):                                              # first ε-NE of some games
            hit = torch.where(new, torch.full_like(hit, t), hit)
            x_out = torch.where(new[:, None], x, x_out)
            y_out = torch.where(new[:, None], y, y_out)
            done = done | new
            if bool(done.all()):
                break
        ux = ux + ay
        uy = uy + atx
    if x is not None:                                                    # games that reached the cap
        x_out = torch.where(done[:, None], x_out, x)
        y_out = torch.where(done[:, None], y_out, y)
    return {"hit": hit, "x": x_out, "y": y_out, "phi": phi_tr, "gap": gap_tr}


# ----------------------------------------------------------------------------------------------
# Triton kernel: one program per game runs the whole trajectory with the (n, n) tile in registers
# ----------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _respond(z, mask, idx, prio, REG: tl.constexpr, BLOCK_N: tl.constexpr, BISECT: tl.constexpr,
                 NEWTON: tl.constexpr):
        """The regularized best response Q(z) of one player, z: (BLOCK_N,), padded entries masked."""
        neg_inf = float("-inf")
        zm = tl.where(mask, z, neg_inf)
        zmax = tl.max(zm, axis=0)
        if REG == 0:    # entropic: softmax
            e = tl.where(mask, tl.exp(zm - zmax), 0.0)
            x = e / tl.sum(e, axis=0)
        elif REG == 1:  # euclidean: bisection on the threshold τ, then the exact τ on the support
            lo = zmax - 1.0
            hi = zmax
            for _ in range(BISECT):
                mid = 0.5 * (lo + hi)
                f = tl.sum(tl.where(mask, tl.maximum(z - mid, 0.0), 0.0), axis=0) - 1.0
                lo = tl.where(f > 0, mid, lo)
                hi = tl.where(f > 0, hi, mid)
            supp = mask & (z > lo)
            cnt = tl.sum(supp.to(z.dtype), axis=0)
            tau = (tl.sum(tl.where(supp, z, 0.0), axis=0) - 1.0) / cnt
            x = tl.where(mask, tl.maximum(z - tau, 0.0), 0.0)
        elif REG == 2:  # log-barrier: Newton on λ from the left of the root
            lam = zmax + 1.0
            for _ in range(NEWTON):
                r = tl.where(mask, 1.0 / (lam - z), 0.0)
                g = tl.sum(r, axis=0) - 1.0
                lam = lam + g / tl.sum(r * r, axis=0)
            x = tl.where(mask, 1.0 / (lam - z), 0.0)
            x = x / tl.sum(x, axis=0)
        else:           # fictitious play: pure best response, ties to the highest priority (default −index)
            key = tl.where(mask & (zm == zmax), prio, neg_inf)
            kmax = tl.max(key, axis=0)
            first = tl.min(tl.where(key == kmax, idx, BLOCK_N), axis=0)
            x = tl.where(idx == first, 1.0, 0.0).to(z.dtype)
        return x

    @triton.jit
    def _ftrl_kernel(A, UX0, UY0, ETA, EPS, PX, PY, HIT, XO, YO, PHI, GAP, n, cap, every, K,
                     REG: tl.constexpr, SQRT: tl.constexpr, ALT: tl.constexpr, BLOCK_N: tl.constexpr,
                     BISECT: tl.constexpr, NEWTON: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        idx = tl.arange(0, BLOCK_N)
        mask = idx < n
        a_off = b * n * n + idx[:, None] * n + idx[None, :]
        a = tl.load(A + a_off, mask=mask[:, None] & mask[None, :], other=0.0)     # (BN, BN) tile
        ux = tl.load(UX0 + b * n + idx, mask=mask, other=0.0)
        uy = tl.load(UY0 + b * n + idx, mask=mask, other=0.0)
        eta = tl.load(ETA + b)
        eps = tl.load(EPS + b)
        px = tl.load(PX + b * n + idx, mask=mask, other=0.0)
        py = tl.load(PY + b * n + idx, mask=mask, other=0.0)
        hit = tl.full([], -1, tl.int64)
        t = tl.full([], 1, tl.int64)
        x = tl.zeros([BLOCK_N], dtype=a.dtype)
        y = tl.zeros([BLOCK_N], dtype=a.dtype)
        while (t <= cap) & (hit < 0):
            h = eta
            if SQRT:
                h = eta / tl.sqrt(t.to(a.dtype))                                  # η_t = η/√t
            x = _respond(h * ux, mask, idx, px, REG, BLOCK_N, BISECT, NEWTON)    # x_t = Q(η_t U^x)
            atx = tl.sum(a * x[:, None], axis=0)                                  # Aᵀx_t
            if ALT:
                y = _respond(h * (uy + atx), mask, idx, py, REG, BLOCK_N, BISECT, NEWTON)
            else:
                y = _respond(h * uy, mask, idx, py, REG, BLOCK_N, BISECT, NEWTON)
            ay = tl.sum(a * y[None, :], axis=1)                                   # A y_t
            phi = tl.sum(x * ay, axis=0)                                          # Φ = xᵀAy
            gap = tl.maximum(tl.max(tl.where(mask, ay, float("-inf")), axis=0) - phi,
                             tl.max(tl.where(mask, atx, float("-inf")), axis=0) - phi)
            if t % every == 0:
                k = t // every - 1
                tl.store(PHI + b * K + k, phi)
                tl.store(GAP + b * K + k, gap)
            hit = tl.where(gap <= eps, t, hit)
            ux = ux + ay
            uy = uy + atx
            t += 1
        tl.store(HIT + b, hit)
        tl.store(XO + b * n + idx, x, mask=mask)
        tl.store(YO + b * n + idx, y, mask=mask)

    @triton.jit
    def _gap_kernel(A, X, Y, G, n, BLOCK_N: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        idx = tl.arange(0, BLOCK_N)
        mask = idx < n
        a = tl.load(A + b * n * n + idx[:, None] * n + idx[None, :], mask=mask[:, None] & mask[None, :], other=0.0)
        x = tl.load(X + b * n + idx, mask=mask, other=0.0)
        y = tl.load(Y + b * n + idx, mask=mask, other=0.0)
        ay = tl.sum(a * y[None, :], axis=1)
        atx = tl.sum(a * x[:, None], axis=0)
        phi = tl.sum(x * ay, axis=0)
        gap = tl.maximum(tl.max(tl.where(mask, ay, float("-inf")), axis=0) - phi,
                         tl.max(tl.where(mask, atx, float("-inf")), axis=0) - phi)
        tl.store(G + b, gap)


def _check_inputs(A, ux0, uy0, eta, eps, cap, reg, schedule, every):
    if A.dim() != 3 or A.shape[1] != A.shape[2]:
        raise ValueError(f"A: expected (B, n, n) payoff matrices, got {tuple(A.shape)}")
    B, n, _ = A.shape
    if n < 2:
        raise ValueError(f"A: a game needs >= 2 actions per player (got n = {n})")
    for name, v in (("ux0", ux0), ("uy0", uy0)):
        if v.shape != (B, n):
            raise ValueError(f"{name}: expected {(B, n)}, got {tuple(v.shape)}")
    for name, v in (("eta", eta), ("eps", eps)):
        if v.shape != (B,):
            raise ValueError(f"{name}: expected ({B},), got {tuple(v.shape)}")
    if not A.is_floating_point():
        raise ValueError(f"A: expected a floating dtype, got {A.dtype}")
    if B and bool((eps <= 0).any()):
        raise ValueError(f"eps: every ε must be > 0 (got min {float(eps.min()):.3g})")
    if B and bool((eta <= 0).any()):
        raise ValueError(f"eta: every step size must be > 0 (got min {float(eta.min()):.3g})")
    if cap < 1:
        raise ValueError(f"cap: must be >= 1 (got {cap})")
    if every < 1:
        raise ValueError(f"every: must be >= 1 (got {every})")
    if reg not in REGS:
        raise ValueError(f"reg: expected one of {', '.join(REGS)} (got {reg!r})")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected constant or sqrt (got {schedule!r})")


def ftrl_run(A: torch.Tensor, ux0: torch.Tensor, uy0: torch.Tensor, eta: torch.Tensor, eps: torch.Tensor,
             cap: int, reg: Reg = "entropic", schedule: str = "constant", alternating: bool = False,
             every: int | None = None, backend: Backend = "auto", prio_x: torch.Tensor | None = None,
             prio_y: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Run B games' dynamics until each reaches an ε-NE (hit = that t) or t = cap (hit = -1).
    prio_x, prio_y (B, n): fictitious play's tie-break priorities (distinct per row; ties go to the
    highest; default −index = the lowest index). A random permutation per run = random tie-breaking."""
    every = every if every is not None else max(1, cap // 64)
    _check_inputs(A, ux0, uy0, eta, eps, cap, reg, schedule, every)
    B, n, _ = A.shape
    dt = A.dtype
    for name, pr in (("prio_x", prio_x), ("prio_y", prio_y)):
        if pr is not None and (pr.shape != (B, n) or not bool(torch.isfinite(pr).all())):
            raise ValueError(f"{name}: expected finite ({B}, {n}) priorities, got {tuple(pr.shape)}")
    ux0, uy0, eta, eps = ux0.to(dt), uy0.to(dt), eta.to(dt), eps.to(dt)
    if not use_triton(A, backend=backend):
        return ftrl_run_reference(A, ux0, uy0, eta, eps, cap, reg, schedule, alternating, every, prio_x, prio_y)
    low = -torch.arange(n, dtype=dt, device=A.device).expand(B, n)
    px = (low if prio_x is None else prio_x.to(dt)).contiguous()
    py = (low if prio_y is None else prio_y.to(dt)).contiguous()
    if n > MAX_N:
        raise ValueError(f"A: the Triton path keeps the (n, n) tile in registers and needs n <= {MAX_N} (got {n})")
    K = cap // every
    hit = torch.empty(B, dtype=torch.int64, device=A.device)
    xo = torch.zeros(B, n, dtype=dt, device=A.device)
    yo = torch.zeros(B, n, dtype=dt, device=A.device)
    phi = torch.full((B, K), float("nan"), dtype=dt, device=A.device)
    gap = torch.full((B, K), float("nan"), dtype=dt, device=A.device)
    if B:
        _ftrl_kernel[(B,)](A.contiguous(), ux0.contiguous(), uy0.contiguous(), eta.contiguous(), eps.contiguous(),
                           px, py, hit, xo, yo, phi, gap, n, int(cap), int(every), K,
                           REG=REG_ID[reg], SQRT=schedule == "sqrt", ALT=bool(alternating),
                           BLOCK_N=max(2, triton.next_power_of_2(n)), BISECT=BISECT_ITERS, NEWTON=NEWTON_ITERS)
    return {"hit": hit, "x": xo, "y": yo, "phi": phi, "gap": gap}


def ne_gap(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor, backend: Backend = "auto") -> torch.Tensor:
    """Exact ε-NE gap of B profiles (x, y) in identical-interest games A: (B,)."""
    if A.dim() != 3 or A.shape[1] != A.shape[2] or x.shape != A.shape[:2] or y.shape != A.shape[:2]:
        raise ValueError(f"ne_gap: expected A (B, n, n), x and y (B, n); got {tuple(A.shape)}, "
                         f"{tuple(x.shape)}, {tuple(y.shape)}")
    if not use_triton(A, x, y, backend=backend):
        return ne_gap_reference(A, x, y)
    B, n, _ = A.shape
    if n > MAX_N:
        raise ValueError(f"A: the Triton path needs n <= {MAX_N} (got {n})")
    g = torch.empty(B, dtype=A.dtype, device=A.device)
    if B:
        _gap_kernel[(B,)](A.contiguous(), x.to(A.dtype).contiguous(), y.to(A.dtype).contiguous(), g, n,
                          BLOCK_N=max(2, triton.next_power_of_2(n)))
    return g


# ----------------------------------------------------------------------------------------------
# benchmarks (kernels/bench.py): (label, make_inputs(device), kernel_fn, reference_fn, bytes, flops)
# ----------------------------------------------------------------------------------------------

def _bench_inputs(B: int, n: int, cap: int):
    def make(device: str):
        gen = torch.Generator(device="cpu").manual_seed(0)
        A = torch.rand(B, n, n, generator=gen, dtype=torch.float64).to(device)
        z = torch.zeros(B, n, dtype=torch.float64, device=device)
        eta = torch.full((B,), 0.5, dtype=torch.float64, device=device)
        eps = torch.full((B,), 1e-12, dtype=torch.float64, device=device)  # tiny ε: every game runs to cap
        return A, z, z.clone(), eta, eps, cap
    return make


def _kern(A, ux, uy, eta, eps, cap):
    return ftrl_run(A, ux, uy, eta, eps, cap, "entropic", backend="triton")


def _ref(A, ux, uy, eta, eps, cap):
    return ftrl_run(A, ux, uy, eta, eps, cap, "entropic", backend="torch")


BENCHMARKS = [
    (f"entropic B={B} n={n} T={T}", _bench_inputs(B, n, T), _kern, _ref, B * n * n * 8, 4 * B * n * n * T)
    for B, n, T in [(4096, 16, 2000), (1024, 64, 1000)]
]
BENCHMARKS_SMALL = [("entropic B=5 n=7 T=6", _bench_inputs(5, 7, 6), _kern, _ref, 5 * 49 * 8, 4 * 5 * 49 * 6)]
