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
- ``oracle``   knows θ*: plays its world's comparator (best truly fair arm; least-unfair when none).

All logistic kinds (and the oracle) share ONE batch per group of worlds (see Logistic).
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
    official K = 1 branch. ``delta`` is one number or one per instance (δ = 1/√T_b per horizon).
    """

    def __init__(self, B: int, p: int, S: float, delta, device, R: float = 1.0, L: float = 0.25):
        self.eta = 1.0 + R * S
        self.lam = max(p * self.eta * R**2, self.eta * R * S * L)
        self.S, self.p, self.L = S, p, L
        f64 = torch.float64
        self.log_inv_delta = torch.log(1.0 / torch.as_tensor(delta, dtype=f64, device=device)).expand(B).clone()
        self.delta = float(delta) if isinstance(delta, (int, float)) else None
        self.theta = torch.zeros(B, p, dtype=f64, device=device)
        self.H = self.lam * torch.eye(p, dtype=f64, device=device).expand(B, p, p).clone()
        self.Hinv = torch.linalg.inv(self.H)

    def beta(self, t: int) -> float:
        """β_t of instance 0 (all instances when δ is shared)."""
        return float(self.beta_all(t)[0])

    def beta_all(self, t: int) -> torch.Tensor:
        """(B,) β_t per instance (δ may differ per instance)."""
        b2 = (self.lam * self.S**2 + self.eta * self.log_inv_delta
              + self.p * (self.eta**2 + self.eta) * math.log(1.0 + self.L * t / self.lam))
        return b2.clamp_min(0.0).sqrt()

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """x (B, p) played features, y (B,) rewards."""
        s = torch.sigmoid((x * self.theta).sum(-1))
        g = (s - y)[:, None] * x
        # M⁻¹ by Sherman–Morrison: M = H/(2η) + c x xᵀ, (H/(2η))⁻¹ = 2η H⁻¹
        Hx = (self.Hinv @ x[:, :, None])[..., 0]                        # H⁻¹x
        Ax = 2 * self.eta * Hx
        cm = 0.5 * s * (1 - s)
        Ag = 2 * self.eta * (self.Hinv @ g[:, :, None])[..., 0]
        Minv_g = Ag - (cm * (Ax * g).sum(-1) / (1 + cm * (Ax * x).sum(-1)))[:, None] * Ax
        th = self.theta - Minv_g
        norm = th.norm(dim=-1, keepdim=True)
        self.theta = torch.where(norm > self.S, self.S * th / norm, th)
        s2 = torch.sigmoid((x * self.theta).sum(-1))
        c2 = s2 * (1 - s2)
        self.H = self.H + c2[:, None, None] * (x[:, :, None] * x[:, None, :])
        self.Hinv = self.Hinv - (c2 / (1 + c2 * (Hx * x).sum(-1)))[:, None, None] * (Hx[:, :, None] * Hx[:, None, :])

    def mean_width(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """σ(fᵀθ̂) and ‖f‖_{H⁻¹} for features f (B, ..., p)."""
        shape = f.shape
        flat = f.reshape(shape[0], -1, shape[-1])
        mu = torch.sigmoid(flat @ self.theta[:, :, None])[..., 0]
        w = ((flat @ self.Hinv) * flat).sum(-1).clamp_min(0).sqrt()
        return mu.reshape(shape[:-1]), w.reshape(shape[:-1])


def xi_radius(beta: torch.Tensor, wf: torch.Tensor, wc: torch.Tensor, pz, pw, pz_alt, pw_alt) -> torch.Tensor:
    """The official ξ_DE, ξ_IE, ξ_SE (OFU_MLogB.select_arm): (β_t/4) × probability-weighted sums of the
    factual / counterfactual widths over the kept cells. beta (B, 1, 1); widths (B, 4, K); the
    probabilities (B, 4, 1) with the dropped cells already zeroed in pz and pz_alt. Returns (B, 3, K)."""
    q = beta / 4.0                                                     # ALGO: ξ_k (official xi_de/ie/se)
    return q * torch.stack([((wf + wc) * pz * pw).sum(1),             # fac_P_1 + ctf_P_1
                            (wc * (pz * pw + pz * pw_alt)).sum(1),     # ctf_P_1 + ctf_P_2
                            (wc * (pz * pw_alt + pz_alt * pw_alt)).sum(1)], 1)  # ctf_P_2 + ctf_P_3


class Logistic:
    """dologb / dologb_scaled / ucb / primal_dual / oracle: one shared logistic learner, batched over
    instances. Per instance b: ``kinds[b]`` (its rule), ``taus[b]``, ``horizons[b]`` (δ = 1/√T_b) and
    ``cell_masks[b]`` (which (z, w) cells its effect estimates sum, see scm.effect_cells), so worlds
    that differ only in τ, fairness mode or effect cells, every method and every horizon run in ONE
    batch (identical per-instance maths; tested against separate runs). The oracle knows θ* and
    plays its world's comparator arm (``oracle_arm[b]``: (8,) best truly fair arm per context)."""

    def __init__(self, kinds: list[str], world: World, taus: torch.Tensor, T, rho: float = 10.0,
                 beta_scale: float = 0.1, cell_masks: torch.Tensor | None = None,
                 oracle_arm: torch.Tensor | None = None):
        self.kinds, self.world, self.taus = kinds, world, taus
        dev, f64 = taus.device, torch.float64
        B = taus.shape[0]
        if len(kinds) != B:
            raise ValueError(f"kinds: {len(kinds)} entries for {B} instances")
        bad = sorted(set(kinds) - set(LOGISTIC))
        if bad:
            raise ValueError(f"method: {bad[0]!r} is not a logistic kind ({', '.join(LOGISTIC)})")
        horizons = torch.as_tensor(T, dtype=f64, device=dev).expand(B)
        self.beta_scale = torch.tensor([beta_scale if k == "dologb_scaled" else 1.0 for k in kinds], dtype=f64, device=dev)
        self.constrained = torch.tensor([k in ("dologb", "dologb_scaled") for k in kinds], device=dev)
        self.is_oracle = torch.tensor([k == "oracle" for k in kinds], device=dev)
        self.cell = (world.cell_mask.expand(B, 4) if cell_masks is None else cell_masks.to(dev, f64))[:, :, None]
        if self.is_oracle.any() and oracle_arm is None:
            raise ValueError("oracle: needs oracle_arm (B, 8), the comparator arm per context")
        self.oracle_arm = oracle_arm
        a_of_c = [ia for ia in (0, 0, 0, 0, 1, 1, 1, 1)]
        self.all_feats = torch.stack([torch.cat([world.x_play[c], world.f_fac[a].reshape(-1, world.p),
                                                 world.f_ctf[a].reshape(-1, world.p)]) for c, a in enumerate(a_of_c)])
        self.est = OMDEstimator(B, world.p, world.S, delta=1.0 / horizons.sqrt(), device=dev)
        self.eta = torch.where(torch.tensor([k == "primal_dual" for k in kinds], device=dev), rho / horizons.sqrt(),
                               torch.zeros_like(horizons))
        self.lam_max = torch.full((B,), rho, dtype=f64, device=dev)
        self.lam = torch.zeros(B, 3, dtype=f64, device=dev)   # stays 0 unless eta > 0 (primal_dual)
        self.rows = torch.arange(B, device=dev)

    def scores(self, t: int, c: torch.Tensor, ia: torch.Tensor):
        w = self.world
        K = w.K
        beta = self.est.beta_all(t)[:, None] * self.beta_scale[:, None]  # (B, 1)
        mu_all, w_all = self.est.mean_width(self.all_feats[c])         # (B, 9K): played, factual, ctf
        ucb = mu_all[:, :K] + beta * w_all[:, :K]                      # ALGO: UCB σ(fᵀθ̂) + β‖f‖_{H⁻¹}
        mf, wf = mu_all[:, K:5 * K].reshape(-1, 4, K), w_all[:, K:5 * K].reshape(-1, 4, K)   # (B, 4, K)
        mc, wc = mu_all[:, 5 * K:].reshape(-1, 4, K), w_all[:, 5 * K:].reshape(-1, 4, K)
        eff = effects_from_mu(mf, mc, w, ia, cell=self.cell)           # ĉ (B, 3, K)
        pz, pw = w.p_zw_fac[ia][..., None] * self.cell, w.p_w_fac[ia][..., None]
        pz_alt, pw_alt = w.p_zw_alt[ia][..., None] * self.cell, w.p_w_alt[ia][..., None]
        xi = xi_radius(beta[:, :, None], wf, wc, pz, pw, pz_alt, pw_alt)
        xi = torch.where(self.constrained[:, None, None], xi, torch.inf)   # ucb / primal_dual: no feasibility test
        # primal_dual: Lagrangian UCB − Σ_k λ_k |ĉ_k| (λ ≡ 0 for the other kinds)   # ALGO: predecessor's primal step
        score = ucb - (self.lam[:, :, None] * eff.abs()).sum(1)
        if self.oracle_arm is not None:                                # oracle: its comparator arm, nothing else
            pick = self.oracle_arm[self.rows, c]
            one = (torch.arange(K, device=c.device)[None] == pick[:, None]).to(score.dtype)
            score = torch.where(self.is_oracle[:, None], one, score)
        return score, eff, xi

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


LOGISTIC = ("dologb", "dologb_scaled", "ucb", "primal_dual", "oracle")


def make_method(name: str | list[str], world: World, taus: torch.Tensor, T, rho: float = 10.0,
                beta_scale: float = 0.1, cell_masks: torch.Tensor | None = None,
                oracle_arm: torch.Tensor | None = None):
    """One method for every instance, or (logistic kinds) a list with one kind per instance."""
    if isinstance(name, list):
        return Logistic(name, world, taus, T, rho, beta_scale, cell_masks, oracle_arm)
    if name in LOGISTIC:
        return Logistic([name] * taus.shape[0], world, taus, T, rho, beta_scale, cell_masks, oracle_arm)
    if name == "tabular":
        return Tabular(world, taus, T)
    raise ValueError(f"method: unknown {name!r} (methods: {', '.join(METHODS)})")


def explores(name) -> bool:
    """Every method but the oracle has the official ⌊√T⌋ uniform-exploration phase."""
    return name != "oracle"
