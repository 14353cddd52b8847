"""The learners, batched over B independent instances (seeds × thresholds), float64 tensors.

Every method exposes ``scores(t, c, ia) -> (score (B,K), eff (B,3,K), xi (B,3,K))`` and
``update(c, action, reward, step)``; the round itself (optimistic feasible set, argmax with the
official tie-break, Bernoulli reward, counters, dual ascent) is kernels.fair_round_step.

- ``dologb``   the paper's logistic algorithm as the official code runs it (DO-LogB /
               algorithms/OFU_MLogB.py): ⌊√T⌋ uniform rounds, then the UCB argmax inside the
               optimistic feasible set {|ĉ_k| − ξ_k < τ ∀k} (overall argmax when it is empty);
               θ̂ by one-pass online mirror descent (Zhang & Sugiyama, "GLB: almost optimal regret
               with one-pass update", Thm 1) — O(p²)/O(p³) work per round, independent of t.
- ``dologb_scaled`` THIS PROJECT's ablation: DO-LogB with the confidence radius β_t multiplied by
               beta_scale (< 1) in both the UCB and ξ (the theoretical radius keeps the optimistic
               set vacuous for T ≲ 10⁵ here; see the report).
- ``ucb``      the same learner without the fairness constraint (unconstrained UCB).
- ``primal_dual`` the ICML 2025 predecessor's construction: same estimator and exploration, arm =
               argmax UCB − Σ_k λ_k |ĉ_k|, λ_k ← Π_[0,ρ](λ_k + η(|ĉ_k(a_t)| − τ)) (truncated dual).
- ``tabular``  THIS PROJECT's non-parametric variant (the paper's is unknown): empirical means per
               (context, arm) with Hoeffding widths, the same optimistic-feasibility + UCB rule;
               needs counterfactual contexts in the support (counterfactual_feature = "other").
- ``oracle``   knows θ*: plays the best truly fair arm (overall best when none is fair).
"""
from __future__ import annotations

import math

import torch

from stages.fair_bandits.scm import World, effects_from_mu

METHODS = ("dologb", "dologb_scaled", "ucb", "primal_dual", "tabular", "oracle")


class OMDEstimator:
    """One-pass OMD for the logistic parameter (official estimator(), K = 1 branch).

        g = (σ(xᵀθ) − y) x ;  M = H/(2η) + ½ σ'(xᵀθ) x xᵀ ;  θ ← Π_{‖θ‖≤S}(θ − M⁻¹ g)   # ALGO: OMD step
        H ← H + σ'(xᵀθ_new) x xᵀ                                                         # ALGO: Hessian
        β_t² = λS² + η log(1/δ) + p(η² + η) log(1 + L t/λ), η = 1 + RS, λ = max(pηR², ηRSL)  # ALGO: radius
    with R = 1, L = 1/4 (logistic), H₁ = λ I. The projection is the Euclidean rescaling of the
    official K = 1 branch.
    """

    def __init__(self, B: int, p: int, S: float, delta: float, device, R: float = 1.0, L: float = 0.25):
        self.eta = 1.0 + R * S
        self.lam = max(p * self.eta * R**2, self.eta * R * S * L)
        self.S, self.delta, self.p, self.L = S, delta, p, L
        f64 = torch.float64
        self.theta = torch.zeros(B, p, dtype=f64, device=device)
        self.H = self.lam * torch.eye(p, dtype=f64, device=device).expand(B, p, p).clone()
        self.Hinv = torch.linalg.inv(self.H)

    def beta(self, t: int) -> float:
        b2 = (self.lam * self.S**2 + self.eta * math.log(1.0 / self.delta)
              + self.p * (self.eta**2 + self.eta) * math.log(1.0 + self.L * t / self.lam))
        return math.sqrt(max(b2, 0.0))

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """x (B, p) played features, y (B,) rewards."""
        s = torch.sigmoid((x * self.theta).sum(-1))
        g = (s - y)[:, None] * x
        xxT = x[:, :, None] * x[:, None, :]
        # M⁻¹ by Sherman–Morrison: M = H/(2η) + c x xᵀ, (H/(2η))⁻¹ = 2η H⁻¹
        A = 2 * self.eta * self.Hinv
        Ax = (A @ x[:, :, None])[..., 0]
        cm = 0.5 * s * (1 - s)
        Ag = (A @ g[:, :, None])[..., 0]
        Minv_g = Ag - (cm * (Ax * g).sum(-1) / (1 + cm * (Ax * x).sum(-1)))[:, None] * Ax
        th = self.theta - Minv_g
        norm = th.norm(dim=-1, keepdim=True)
        self.theta = torch.where(norm > self.S, self.S * th / norm, th)
        s2 = torch.sigmoid((x * self.theta).sum(-1))
        c2 = s2 * (1 - s2)
        self.H = self.H + c2[:, None, None] * xxT
        Hx = (self.Hinv @ x[:, :, None])[..., 0]                        # Sherman–Morrison for H⁻¹
        self.Hinv = self.Hinv - (c2 / (1 + c2 * (Hx * x).sum(-1)))[:, None, None] * (Hx[:, :, None] * Hx[:, None, :])

    def mean_width(self, f: torch.Tensor, batch_dims: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """σ(fᵀθ̂) and ‖f‖_{H⁻¹} for features f (B, ..., p)."""
        shape = f.shape
        flat = f.reshape(shape[0], -1, shape[-1])
        mu = torch.sigmoid(flat @ self.theta[:, :, None])[..., 0]
        w = ((flat @ self.Hinv) * flat).sum(-1).clamp_min(0).sqrt()
        return mu.reshape(shape[:-1]), w.reshape(shape[:-1])


class Logistic:
    """dologb / dologb_scaled / ucb / primal_dual: one shared logistic learner. ``kinds`` gives each
    instance's rule, so several of these methods run in one batch (identical per-instance maths)."""

    def __init__(self, kinds: list[str], world: World, taus: torch.Tensor, T: int, rho: float = 10.0,
                 beta_scale: float = 0.1):
        self.kinds, self.world, self.taus = kinds, world, taus
        dev, f64 = taus.device, torch.float64
        B = taus.shape[0]
        if len(kinds) != B:
            raise ValueError(f"kinds: {len(kinds)} entries for {B} instances")
        self.beta_scale = torch.tensor([beta_scale if k == "dologb_scaled" else 1.0 for k in kinds], dtype=f64, device=dev)
        self.constrained = torch.tensor([k in ("dologb", "dologb_scaled") for k in kinds], device=dev)
        a_of_c = [ia for ia in (0, 0, 0, 0, 1, 1, 1, 1)]
        self.all_feats = torch.stack([torch.cat([world.x_play[c], world.f_fac[a].reshape(-1, world.p),
                                                 world.f_ctf[a].reshape(-1, world.p)]) for c, a in enumerate(a_of_c)])
        self.est = OMDEstimator(B, world.p, world.S, delta=1.0 / math.sqrt(T), device=dev)
        self.eta = torch.tensor([rho / math.sqrt(T) if k == "primal_dual" else 0.0 for k in kinds], dtype=f64, device=dev)
        self.lam_max = torch.full((B,), rho, dtype=f64, device=dev)
        self.lam = torch.zeros(B, 3, dtype=f64, device=dev)   # stays 0 unless eta > 0 (primal_dual)

    def scores(self, t: int, c: torch.Tensor, ia: torch.Tensor):
        w = self.world
        K = w.K
        beta = self.est.beta(t) * self.beta_scale[:, None]            # (B, 1)
        mu_all, w_all = self.est.mean_width(self.all_feats[c])         # (B, 9K): played, factual, ctf
        ucb = mu_all[:, :K] + beta * w_all[:, :K]                      # ALGO: UCB σ(fᵀθ̂) + β‖f‖_{H⁻¹}
        mf, wf = mu_all[:, K:5 * K].reshape(-1, 4, K), w_all[:, K:5 * K].reshape(-1, 4, K)   # (B, 4, K)
        mc, wc = mu_all[:, 5 * K:].reshape(-1, 4, K), w_all[:, 5 * K:].reshape(-1, 4, K)
        eff = effects_from_mu(mf, mc, w, ia)                           # ĉ (B, 3, K)
        pz, pw = w.p_zw_fac[ia][..., None], w.p_w_fac[ia][..., None]
        pz_alt, pw_alt = w.p_zw_alt[ia][..., None], w.p_w_alt[ia][..., None]
        q = beta[:, :, None] / 4.0                                     # ALGO: ξ_k (official xi_de/ie/se)
        xi = q * torch.stack([((wf + wc) * pz * pw).sum(1),
                              (wc * (pz * pw + pz * pw_alt)).sum(1),
                              (wc * (pz * pw_alt + pz_alt * pw_alt)).sum(1)], 1)
        xi = torch.where(self.constrained[:, None, None], xi, torch.inf)   # ucb / primal_dual: no feasibility test
        # primal_dual: Lagrangian UCB − Σ_k λ_k |ĉ_k| (λ ≡ 0 for the other kinds)   # ALGO: predecessor's primal step
        return ucb - (self.lam[:, :, None] * eff.abs()).sum(1), eff, xi

    def update(self, c, action, reward, step) -> None:
        self.lam = step.lam
        x = self.world.x_play[c, action]
        self.est.update(x, reward)


class Tabular:
    """Non-parametric variant (this project's construction): μ̂(c, k) = successes / pulls,
    width w = sqrt(log(2·8·K·T/δ) / (2 n)) (Hoeffding + union bound; 1 for unpulled cells), UCB
    min(1, μ̂ + w); effects from μ̂ at factual and counterfactual cells; ξ_k = Σ |coefficient|·w,
    an exact bound on |ĉ_k − c_k| when every μ̂ is within its width."""

    def __init__(self, world: World, taus: torch.Tensor, T: int):
        if world.scm.counterfactual_feature != "other":
            raise ValueError("tabular: needs counterfactual_feature 'other' (with 'one_minus_a' the counterfactual "
                             "context 1 − a never occurs, so no non-parametric estimate of it exists)")
        self.world, self.taus = world, taus
        B = taus.shape[0]
        self.log_term = math.log(2 * 8 * world.K * T * math.sqrt(T))
        dev = taus.device
        self.counts = torch.zeros(B, 8, world.K, dtype=torch.int64, device=dev)
        self.succ = torch.zeros(B, 8, world.K, dtype=torch.float64, device=dev)
        self.lam = torch.zeros(B, 3, dtype=torch.float64, device=dev)
        self.eta = torch.zeros(B, dtype=torch.float64, device=dev)
        self.lam_max = torch.zeros(B, dtype=torch.float64, device=dev)

    def stats(self):
        n = self.counts.to(torch.float64)
        mu = torch.where(n > 0, self.succ / n.clamp_min(1), torch.full_like(n, 0.5))
        w = torch.where(n > 0, (self.log_term / (2 * n.clamp_min(1))).sqrt().clamp_max(1.0), torch.ones_like(n))
        return mu, w                                                   # (B, 8, K)

    def scores(self, t: int, c: torch.Tensor, ia: torch.Tensor):
        w = self.world
        mu, width = self.stats()
        rows = torch.arange(c.shape[0], device=c.device)
        ucb = (mu[rows, c] + width[rows, c]).clamp_max(1.0)           # ALGO: tabular UCB
        zw = torch.arange(4, device=c.device)
        fac = 4 * ia[:, None] + zw                                     # (B, 4) factual cells
        ctf = 4 * (1 - ia)[:, None] + zw                               # counterfactual cells (a' = other value)
        mf, wf = mu[rows[:, None], fac], width[rows[:, None], fac]     # (B, 4, K)
        mc, wc = mu[rows[:, None], ctf], width[rows[:, None], ctf]
        eff = effects_from_mu(mf, mc, w, ia)
        pz, pw = w.p_zw_fac[ia][..., None], w.p_w_fac[ia][..., None]
        pz_alt, pw_alt = w.p_zw_alt[ia][..., None], w.p_w_alt[ia][..., None]
        xi = torch.stack([((wf + wc) * pz * pw).sum(1),
                          (wc * (pw - pw_alt).abs() * pz).sum(1),
                          (wc * pw_alt * (pz - pz_alt).abs()).sum(1)], 1)
        return ucb, eff, xi

    def update(self, c, action, reward, step) -> None:
        self.counts, self.succ = step.counts, step.succ


class Oracle:
    """Knows θ*: scores are the true means, effects the true ones, no widths."""

    def __init__(self, world: World, taus: torch.Tensor):
        self.world, self.taus = world, taus
        B = taus.shape[0]
        dev = taus.device
        self.lam = torch.zeros(B, 3, dtype=torch.float64, device=dev)
        self.eta = torch.zeros(B, dtype=torch.float64, device=dev)
        self.lam_max = torch.zeros(B, dtype=torch.float64, device=dev)

    def scores(self, t: int, c: torch.Tensor, ia: torch.Tensor):
        eff = self.world.effects[ia]
        return self.world.mu[c], eff, torch.zeros_like(eff)

    def update(self, c, action, reward, step) -> None:
        pass


LOGISTIC = ("dologb", "dologb_scaled", "ucb", "primal_dual")


def make_method(name: str | list[str], world: World, taus: torch.Tensor, T: int, rho: float = 10.0,
                beta_scale: float = 0.1):
    """One method for every instance, or (logistic kinds only) a list with one kind per instance."""
    if isinstance(name, list):
        if not all(k in LOGISTIC for k in name):
            raise ValueError(f"method: only {', '.join(LOGISTIC)} can share a batch (got {sorted(set(name))})")
        return Logistic(name, world, taus, T, rho, beta_scale)
    if name in LOGISTIC:
        return Logistic([name] * taus.shape[0], world, taus, T, rho, beta_scale)
    if name == "tabular":
        return Tabular(world, taus, T)
    if name == "oracle":
        return Oracle(world, taus)
    raise ValueError(f"method: unknown {name!r} (methods: {', '.join(METHODS)})")


def explores(name: str) -> bool:
    """Methods with the official ⌊√T⌋ uniform-exploration phase."""
    return name != "oracle"
