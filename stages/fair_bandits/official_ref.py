"""A line-by-line numpy transcription of the official DO-LogB run (github.com/jchen-research/DO-LogB:
algorithms/OFU_MLogB.py select_arm / update_state / estimator, bandits/bandit.py feature bundle and
_true_effects, bandits/synthetic_data.py all_probs_for_at, bandits/simulation.py's round loop),
driven by RECORDED draws instead of np.random, for two uses:

- the reproduction check in evaluate: on the official world it must give the project's regret and
  violation curves (`official_quirk`: the official one-cell match; `all`: every cell, the intended
  computation) to float tolerance;
- the time-per-round comparison of the report (the official loop's structure: Python loops over arms
  and cells, pinv every round; wall-clock, never used by a claim).

Recorded draws per round t: the context (a, z, w) (already past the official rejection loop, which
redraws a round until some arm is truly fair), the exploration arm (t ≤ ⌊√T⌋), the tie-break
mixer (K,) and the reward uniform u (reward = 1 iff u < σ(θ*ᵀf), the Bernoulli the official
np.random.multinomial(1, [1 − σ, σ]) draws).
"""
from __future__ import annotations

import numpy as np
from numpy.linalg import pinv

ACTIONS = np.array([-1.0, -0.8, -0.6, -0.4, -0.2, 0.2, 0.4, 0.6, 0.8, 1.0])   # bandit.py action_values
THETA_STAR = np.array([np.sqrt(0.5), 0.0, 0.0, np.sqrt(0.5)])                  # main.py W (S = 1)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _f(x) -> float:
    """OFU_MLogB._to_float: the single entry of a (1, 1) array."""
    return float(np.asarray(x).reshape(-1)[0])


def feature_map(z):
    z = np.asarray(z, dtype=float).reshape(-1)
    norm = np.linalg.norm(z)
    return z if norm == 0.0 else z / norm


def all_probs_for_at(a_t: int) -> list[tuple]:
    """synthetic_data.AWMGenerator.all_probs_for_at with beta_wa = 1.2, beta_ma = beta_mw = 1:
    rows (w, m, P(w|a), P(w|a_alt), P(m|a,w), P(m|a_alt,w)), a_alt = −a."""
    def p_w(a):
        return float(sigmoid(1.2 * a))

    def p_m(a, w):
        return float(sigmoid(1.0 * a + 1.0 * (2 * w - 1)))

    a_alt = -a_t
    rows = []
    for w in (0, 1):
        pw_a = [1 - p_w(a_t), p_w(a_t)][w]
        pw_alt = [1 - p_w(a_alt), p_w(a_alt)][w]
        for m in (0, 1):
            rows.append((w, m, pw_a, pw_alt, [1 - p_m(a_t, w), p_m(a_t, w)][m], [1 - p_m(a_alt, w), p_m(a_alt, w)][m]))
    return rows


def feature_bundle(a_t: float, d_t: float) -> tuple:
    """bandit._build_feature_bundle (ctf_index_map = identity): factual [a, w, m, d] and counterfactual
    [1 − a, w, m, d] for the four (w, m) cells, each through the feature map."""
    out = []
    for w, m in ((0, 0), (0, 1), (1, 0), (1, 1)):
        out += [feature_map([a_t, w, m, d_t]), feature_map([1 - a_t, w, m, d_t])]
    return tuple(out)


def _matches(feature: list, item: int, row: tuple, cells: str) -> bool:
    """The official cell match compares the NORMALISED feature's coordinates with the raw 0/1 values
    (only z = w = 0 can match); cells="all" matches every cell by its raw (w, m) instead."""
    if cells == "official_quirk":
        return (feature[item][1] == row[0]) and (feature[item][2] == row[1])
    return ((item // 2) // 2, (item // 2) % 2) == (row[0], row[1])


def true_effects(bundle: tuple, wms: list, cells: str) -> tuple[float, float, float]:
    """bandit.Bandit._true_effects."""
    de = ie = se = 0.0
    feature = list(bundle)
    for item in [0, 2, 4, 6]:
        for row in wms:
            w_val, m_val, p_aw, p_a_alt_w, p_m_aw, p_m_a_alt_w = row
            if _matches(feature, item, row, cells):
                sig_fac = sigmoid(np.dot(feature_map(feature[item]), THETA_STAR))
                sig_ctf = sigmoid(np.dot(feature_map(feature[item + 1]), THETA_STAR))
                de += (sig_ctf - sig_fac) * p_aw * p_m_aw
                ie += sig_ctf * (p_m_aw - p_m_a_alt_w) * p_aw
                se += sig_ctf * p_m_a_alt_w * (p_aw - p_a_alt_w)
    return float(de), float(ie), float(se)


class OfficialOFUMLogB:
    """algorithms/OFU_MLogB.py with K = 1 (binary logistic), d = 4, S = 1, R = 1."""

    def __init__(self, T: int, tau: float, cells: str, d: int = 4, S: float = 1.0, R: float = 1.0):
        self.d, self.S, self.R, self.tau, self.cells = d, S, R, tau, cells
        self.delta = 1 / np.sqrt(T)
        self.L_mu, self.g_tau = 0.25, 1.0
        self.eta = 1.0 + R * S
        self.r_lambda = max(d * self.eta * R ** 2, self.eta * R * S * self.L_mu / self.g_tau)
        self.T0 = int(np.floor(np.sqrt(T)))
        self.t = 1
        self.W_t = np.zeros((d, 1))
        self.H = self.r_lambda * np.identity(d)
        self.inv_H = (1.0 / self.r_lambda) * np.identity(d)

    def get_beta_t(self) -> float:
        beta_sq = (self.r_lambda * self.S ** 2 + self.eta * np.log(1.0 / self.delta)
                   + self.d * (self.eta ** 2 + self.eta) * np.log(1.0 + (self.L_mu * self.t) / (self.r_lambda * self.g_tau)))
        return float(np.sqrt(max(beta_sq, 0.0)))

    def select_arm(self, arms: list, feature_vector: list, wms: list, explore_arm: int, mixer: np.ndarray) -> int:
        if self.t <= self.T0:
            return int(explore_arm)                                     # np.random.randint(len(arms))
        n = len(arms)
        ucb_s = np.full(n, -np.inf)
        ucb_s_cons = np.full(n, -np.inf)
        beta_t = self.get_beta_t()
        for i, (x, feature) in enumerate(zip(arms, feature_vector)):
            x = feature_map(x).reshape(-1, 1)
            x_local = float(np.sqrt(max(_f(x.T @ self.inv_H @ x), 0.0)))
            reward_ucb = _f(sigmoid(x.T @ self.W_t)) + beta_t * x_local
            ctf_de = ctf_ie = ctf_se = 0.0
            fac_P_1 = ctf_P_1 = ctf_P_2 = ctf_P_3 = 0.0
            feature = list(feature)
            for item in [0, 2, 4, 6]:
                for row in wms:
                    if _matches(feature, item, row, self.cells):
                        fac = feature_map(feature[item]).reshape(-1, 1)
                        ctf = feature_map(feature[item + 1]).reshape(-1, 1)
                        p_aw, p_a0w, p_m_aw, p_m_a0w = row[2], row[3], row[4], row[5]
                        sig_fac = _f(sigmoid(fac.T @ self.W_t))
                        sig_ctf = _f(sigmoid(ctf.T @ self.W_t))
                        ctf_de += (sig_ctf - sig_fac) * p_aw * p_m_aw
                        ctf_ie += sig_ctf * (p_m_aw - p_m_a0w) * p_aw
                        ctf_se += sig_ctf * p_m_a0w * (p_aw - p_a0w)
                        fac_w = float(np.sqrt(max(_f(fac.T @ self.inv_H @ fac), 0.0)))
                        ctf_w = float(np.sqrt(max(_f(ctf.T @ self.inv_H @ ctf), 0.0)))
                        fac_P_1 += fac_w * p_aw * p_m_aw
                        ctf_P_1 += ctf_w * p_aw * p_m_aw
                        ctf_P_2 += ctf_w * p_aw * p_m_a0w
                        ctf_P_3 += ctf_w * p_a0w * p_m_a0w
            xi_de = 0.25 * beta_t * (fac_P_1 + ctf_P_1)
            xi_ie = 0.25 * beta_t * (ctf_P_1 + ctf_P_2)
            xi_se = 0.25 * beta_t * (ctf_P_2 + ctf_P_3)
            ucb_s[i] = reward_ucb
            if (abs(ctf_de) - xi_de < self.tau) and (abs(ctf_ie) - xi_ie < self.tau) and (abs(ctf_se) - xi_se < self.tau):
                ucb_s_cons[i] = reward_ucb
        key = ucb_s if np.all(np.isneginf(ucb_s_cons)) else ucb_s_cons
        return int(list(np.lexsort((mixer, key)))[::-1][0])

    def update_state(self, x, y: float) -> None:
        x = feature_map(x)
        # estimator(): one OMD step (K = 1: Sigma = σ, the kron products reduce to scalars × x xᵀ)
        s = _f(sigmoid(x @ self.W_t[:, 0]))
        g = ((s - y) * x)[:, None]
        M = (1.0 / (2.0 * self.eta)) * self.H + 0.5 * (s - s * s) * np.outer(x, x)
        w_new = self.W_t - pinv(M) @ g
        if np.linalg.norm(w_new) > self.S:
            w_new = self.S * w_new / np.linalg.norm(w_new)
        self.W_t = w_new
        s2 = _f(sigmoid(x @ self.W_t[:, 0]))
        self.H = self.H + (s2 - s2 * s2) * np.outer(x, x)
        self.inv_H = pinv(self.H)
        self.t += 1


def run_official(contexts: list[tuple[int, int, int]], explore: np.ndarray, mixers: np.ndarray, uniforms: np.ndarray,
                 T: int, tau: float, cells: str, rounds: int | None = None) -> dict[str, np.ndarray]:
    """simulation.Simulation.run_environment for one run of horizon T (δ = 1/√T, ⌊√T⌋ exploration
    rounds) on recorded draws, stopped after `rounds` rounds (default T). contexts[t] = (a, z, w).
    Returns per-round arrays: action, regret, violation, penalized_regret, reward (expected)."""
    pol = OfficialOFUMLogB(T, tau, cells)
    R = T if rounds is None else rounds
    out = {k: np.zeros(R) for k in ("regret", "violation", "penalized_regret", "reward")}
    out["action"] = np.zeros(R, dtype=int)
    for t in range(R):
        a_t, z_t, w_t = contexts[t]
        wms = all_probs_for_at(a_t)
        arms, bundles, feasible = [], [], []
        for j, d_t in enumerate(ACTIONS):
            arms.append(feature_map([a_t, z_t, w_t, d_t]))
            bundle = feature_bundle(a_t, d_t)
            bundles.append(bundle)
            de, ie, se = true_effects(bundle, wms, cells)
            if abs(de) < tau and abs(ie) < tau and abs(se) < tau:
                feasible.append(j)
        if not feasible:
            raise ValueError(f"round {t}: context {contexts[t]} has no fair arm (the official loop would redraw it)")
        k = pol.select_arm(arms, bundles, wms, int(explore[t]) if t < len(explore) else -1, mixers[t])
        de, ie, se = true_effects(bundles[k], wms, cells)
        violated = abs(de) > tau or abs(ie) > tau or abs(se) > tau
        out["violation"][t] = max(abs(de), abs(ie), abs(se)) - tau if violated else 0.0
        rewards = np.array([float(sigmoid(np.dot(f, THETA_STAR))) for f in arms])
        best = float(rewards[feasible].max())
        out["reward"][t] = rewards[k]
        out["regret"][t] = best - rewards[k]
        out["penalized_regret"][t] = best if violated else best - rewards[k]
        y = 1.0 if uniforms[t] < rewards[k] else 0.0
        pol.update_state(arms[k], y)
        out["action"][t] = k
    return out
