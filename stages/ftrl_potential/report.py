"""report: hitting-time tables, growth fits, the derivation of the gadget, and the claims."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import polars as pl
import torch

from stages.common.claims import Bound, Claim
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.ftrl_potential.fits import fmt_hit

LOG2 = math.log(2.0)

CLAIM = ("Follow-the-regularized-leader can take exponential time to reach a Nash equilibrium in two-player "
         "potential games, for any permutation-invariant regularizer (hence from the uniform start) and even with "
         "vanishing step sizes (so MWU too); lazy, alternating no-regret dynamics reach an ε-NE within "
         "exp(O_ε(1/ε²)) iterations (a bound that does not grow with the game); fictitious play can take doubly "
         "exponential time in multi-player potential games.")

CLAIMS = [
    Claim("uniform_start_exponential",
          "From the uniform start, every FTRL arm (entropic/MWU, Euclidean, log-barrier; constant and η/√t steps) "
          "needs exponentially many steps in m to reach an ε-NE (ε = 0.1/m) on the chain games: log T_ε grows by "
          "at least log 2 per unit m (least-squares slope, capped runs counted at the cap, a lower bound) and the "
          "growth does not slow down (last increment of log T ≥ first, over the uncapped sizes of every arm with >= 3 of them)",
          "uniform_min_ftrl_slope >= param.k0_6931 and uniform_min_ftrl_convexity >= 0",
          refuted_by="any FTRL arm with a log-T slope below log 2, or whose log-T increments shrink with m "
                     "(polynomial-looking growth) from the uniform start", kind="finding"),
    Bound("random_start_exponential",
          "From random interior starts (5 seeds), MWU (η = 1) still needs exponentially many steps: per-seed "
          "log-T slope in m above log 2",
          value="random_start.mwu.slope",
          refuted_by="per-seed slopes not above log 2 beyond 2 s.e. (random starts escape the chain)", kind="finding"),
    Bound("random_games_fast",
          "Baseline: on random identical-interest games of the same size (3 game seeds) MWU from the uniform start "
          "does NOT show exponential growth (per-seed log-T slope below log 2) — the slowness is the gadget's",
          value="random_games.slope",
          refuted_by="random games with per-seed slopes above log 2 (then the chain is not what makes FTRL slow)", kind="finding"),
    Claim("staircase_not_enough",
          "The card's plain staircase (zeros off the chain) does not defeat the uniform start: MWU reaches an ε-NE "
          "with a log-T slope below log 2",
          "staircase_slope < param.k0_6931",
          refuted_by="an exponential-looking staircase slope (then the pre-check was wrong)", kind="finding"),
    Bound("lazy_alternating_bounded",
          "At a FIXED ε = 0.05, lazy alternating MWU's T_ε does not grow exponentially with the game size on random "
          "identical-interest games (per-seed log-T slope in m below 0.25) — consistent with an m-independent "
          "exp(O(1/ε²)) bound",
          value="fixed_eps.random_slope", 
          refuted_by="per-seed slopes above 0.25 beyond 2 s.e. at fixed ε", kind="finding"),
    Claim("lazy_alternating_bounded_chain",
          "At the same fixed ε, lazy alternating MWU on the chain games is not slowed by m either (log-T slope < "
          "0.25), while with ε = 0.1/m it is exponential (the alt_mwu row of the uniform-start table)",
          "fixed_eps.chain_slope < param.k0_25 and uniform.alt_mwu.slope >= param.k0_6931",
          refuted_by="a fixed-ε slope of 0.25 or more on the chain games", kind="finding"),
    Claim("multiplayer_fp_doubly_exponential",
          "Fictitious play in N-player potential games can take doubly exponential time: on the snake construction "
          "(derived, not the paper's) log log T grows linearly in N with increments of log T that grow "
          "(ratio last/first > 1.5)",
          "multi.loglog_slope > param.k0_3 and multi.increment_growth > param.k1_5",
          refuted_by="shrinking increments of log T in N (at most single-exponential growth) on this construction", kind="finding"),
]


class Config(ReportConfig):
    pass


DERIVATION = r"""
The paper's explicit game could not be retrieved (only its abstract); the construction below was
derived for this reproduction and is **not** the paper's. It is built so that the uniform start
cannot shortcut the chain.

*Game* (m × m block plus P = m + 2 padding actions per player, d = 1/(2m)). The chain
(0,0) → (1,0) → (1,1) → (2,1) → … → (m−1,m−1) alternates unilateral deviations of the two players;
chain cell k pays (k+2)d, so the potential strictly increases along it and (m−1, m−1) is the unique
pure NE (checked by brute force in `prepare`). The cell right of (i,i) and the cell below (i,i−1)
(the "wrong exits") pay their chain neighbour's value − 2d. Every other block cell pays
−(1 + (i+j)/m), graded so that later rows/columns are the worst under a spread-out opponent. Pad
columns pay 0 against row 0 and −1 otherwise; pad rows pay 0 against column 0 and −1 otherwise.

*Why the uniform start does not help.* At the uniform start the opponent is spread over 2m + 2
actions of which m + 2 are pads: a row's average payoff is dominated by its pad entries (0 for row 0,
−1 for every other row) and by the graded negatives, so row 0 and column 0 are the best responses and
every FTRL player (any permutation-invariant regularizer, whose first iterate is uniform) moves
towards the *start* of the chain. The graded negatives keep rows further down from accumulating
cumulative utility while play is still mixed, so the iterates cannot jump ahead to the end of the
chain (in the runs they skip at most the first few cells, then follow the chain in order).

*Why each stage is slower than the last.* Moving from chain cell k to k+1 requires the new action's
cumulative utility to overtake the incumbent's. The incumbent's lead was accumulated at rate 2d per
step (the gap between its chain payoff and the wrong exit) during all earlier stages it was played,
while the newcomer catches up at rate d (one chain increment): the stage lengths obey roughly
T_k ≈ 2(T_{k−1} + T_{k−2}) (fictitious-play estimate), i.e. exponential growth in the chain length
2m − 1. During every transition the profile is mixed between two adjacent chain cells and its
ε-NE gap is at least about d/(2 + c) with c = 2, i.e. ≥ d/4 = 1/(8m), so no ε-NE with ε < 1/(8m)
occurs before the end of the chain — the paper's ε ≤ 1/(8m) regime (we use ε = 1/(10m)).

*Contrast (pre-check).* On the plain staircase (zeros off the chain) the transitional mixed profiles
are themselves ε-NE (gap ≈ d²/(2d + v_k)), so FTRL from the uniform start stops early: that game
does not show the theorem, which is why it is kept here only as a contrast.
"""


def _hits_frame(s: dict) -> pl.DataFrame:
    rows = []
    for arm, u in s["uniform"].items():
        row = {"arm": arm, "reg": u["reg"], "schedule": u["schedule"], "alternating": u["alternating"]}
        for m, t, c in zip(s["ms"], u["hits"], u["capped"]):
            row[f"m={m}"] = fmt_hit(-1 if c else int(t), u["cap"])
        row["log-T slope"] = u["slope"]
        row["random-start slopes"] = ", ".join(f"{v:.2f}" for v in s["random_start"][arm]["slope"])
        rows.append(row)
    return pl.DataFrame(rows)


def run(cfg: Config, ctx: StageContext) -> None:
    ev, tr = ctx.input("evaluate"), ctx.input("train")
    s = read_json(ev / "summary.json")
    tmeta = read_json(tr / "meta.json")
    runs = pl.read_parquet(ev / "runs.parquet")
    traces = torch.load(tr / "traces.pt")
    ms = s["ms"]
    from stages.ftrl_potential.fits import log_slope
    s["staircase_slope"] = log_slope(ms, s["staircase"]["hits"])

    rep = Report(ctx, "FTRL can take exponential time to reach a Nash equilibrium in potential games (miniature)", CLAIM)
    rep.section("Setup", f"""
Two-player identical-interest games (both players get xᵀAy, so Φ = xᵀAy is an exact potential) of
size m ∈ {ms} built by `games.chain_game` (2m + 2 actions per player; derivation below). Dynamics
(kernel `ftrl_run`: one program per game, the exact ε-NE gap checked at every iterate): FTRL
x_t = Q(η_t Σ_{{s<t}} A y_s) with Q = softmax (entropic = MWU), exact Euclidean simplex projection,
log-barrier response; η_t = η or η/√t; fictitious play (Q = argmax, ties to the lowest index);
lazy alternating MWU (the column player already sees x_t). T_ε = first t with
gap(x_t, y_t) = max(max_i (Ay)_i, max_j (Aᵀx)_j) − xᵀAy ≤ ε, ε = {s['eps_scale']}/m, measured on the
last iterate; a run that reaches the cap (train.cap = {tmeta['cap']}, per-arm overrides in the arm
list) is reported as "≥ cap" and counted at the cap in the fits (a lower bound on the slope).
Uniform start: U_0 = 0. Random starts (seeds {tmeta['start_seeds']}): z_1 = η U_0 ~ {tmeta['start_scale']}·N(0, I).
Baselines: i.i.d. uniform[0,1] identical-interest games of the same size (seeds from prepare), and
the card's staircase. Upper-bound experiment: lazy alternating MWU at a fixed ε = {tmeta['fixed_eps']} for
m ∈ {s['fixed_eps']['ms']}.
Multi-player: fictitious play (cumulative realized utilities, simultaneous moves) on an N-player snake
game with 2 actions each (`games.multi_chain_game`), ε = 0.5 / 2^N.
Every stored hitting iterate was re-checked in evaluate with the exact gap (kernel `ne_gap`):
{s['verify']['hit_gap_violations']} hit violations, {s['verify']['cap_gap_violations']} cap violations over {s['verify']['runs']} runs.
""")
    rep.section("Derivation of the two-player construction", DERIVATION)
    rep.table("Hitting times T_ε from the uniform start (chain games)", _hits_frame(s),
              note="log-T slope: least-squares slope of log T_ε against m (per unit m; log 2 = 0.693 means "
                   "doubling per size step). Random-start slopes: one per start seed.")
    rs_rows = []
    for arm in s["uniform"]:
        part = runs.filter((pl.col("experiment") == "chain") & (pl.col("arm") == arm) & (pl.col("start") == "random"))
        row = {"arm": arm}
        for m in ms:
            h = part.filter(pl.col("m") == m)["hit"].to_list()
            row[f"m={m}"] = " / ".join(fmt_hit(v, int(part["cap"][0])) for v in h)
        rs_rows.append(row)
    rep.table("Hitting times from random starts (one entry per start seed)", pl.DataFrame(rs_rows),
              note="Random interior starts sometimes land the best responses near the END of the chain and finish "
                   "in a few steps, sometimes start the climb from the beginning: the gadget is built against the "
                   "uniform start (the paper's statement), not against every start.")
    other = pl.DataFrame([
        {"experiment": "staircase (uniform start, MWU)", **{f"m={m}": str(int(t)) for m, t in zip(ms, s["staircase"]["hits"])}},
        *[{"experiment": f"random game seed {k} (MWU)", **{f"m={m}": str(int(t)) for m, t in zip(ms, v)}}
          for k, v in s["random_games"]["hits"].items()],
    ])
    rep.table("Baselines: staircase and random identical-interest games", other)
    fe = s["fixed_eps"]
    fixed = pl.DataFrame([{"game": "chain", **{f"m={m}": str(int(t)) for m, t in zip(fe["ms"], fe["chain_hits"])}},
                          *[{"game": f"random seed {k}", **{f"m={m}": str(int(t)) for m, t in zip(fe["ms"], v)}}
                            for k, v in fe["random_hits"].items()]])
    rep.table(f"Lazy alternating MWU at fixed eps = {tmeta['fixed_eps']}", fixed)
    mu = s["multi"]
    rep.table("Multi-player fictitious play (snake game, 2 actions per player)", pl.DataFrame({
        "players N": mu["players"], "profiles": [2 ** n for n in mu["players"]],
        "T_ε": [fmt_hit(-1 if c else int(t), mu["cap"]) for t, c in zip(mu["hits"], mu["capped"])]}),
        note=f"log-log slope {mu['loglog_slope']:.3g}; log-T slope {mu['log_slope']:.3g}; growth of log-T increments "
             f"(last/first) {mu['increment_growth']:.3g}.")

    # figures
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for arm, u in s["uniform"].items():
        ax[0].semilogy(ms, u["hits"], marker="o", label=arm)
        for m, t, c in zip(ms, u["hits"], u["capped"]):
            if c:
                ax[0].scatter([m], [t], marker="^", color="k", zorder=3)
    ax[0].semilogy(ms, s["staircase"]["hits"], "k--", label="staircase (MWU)")
    for k, v in s["random_games"]["hits"].items():
        ax[0].semilogy(ms, v, ":", color="gray", label="random games (MWU)" if k == "0" else None)
    ax[0].set_xlabel("m"), ax[0].set_ylabel("T_ε (▲ = reached the cap, ≥)"), ax[0].legend(fontsize=7)
    ax[0].set_title("Hitting time vs game size (uniform start)")
    m_big = ms[-2] if len(ms) > 1 else ms[-1]
    for arm in s["uniform"]:
        t = traces[f"{arm}|{m_big}"]
        phi = t["phi"].numpy()
        ax[1].plot([(i + 1) * t["every"] for i in range(len(phi))], phi, label=arm)
    ax[1].set_xscale("log"), ax[1].set_xlabel("t"), ax[1].set_ylabel("potential Φ(x_t, y_t)")
    ax[1].set_title(f"Potential along the uniform-start trajectory, m = {m_big}")
    ax[1].legend(fontsize=7)
    rep.figure("hitting_times", fig, "Left: T_ε vs m per dynamic (log scale); right: potential staircase along "
                                     "trajectories — each plateau is one chain stage.")
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.semilogy(fe["ms"], fe["chain_hits"], marker="o", label="chain, ε fixed")
    for k, v in fe["random_hits"].items():
        ax.semilogy(fe["ms"], v, ":", marker=".", label=f"random seed {k}, ε fixed")
    ax.semilogy(ms, s["uniform"]["alt_mwu"]["hits"], "r-", marker="s", label="chain, ε = 0.1/m")
    ax.set_xlabel("m"), ax.set_ylabel("T_ε"), ax.legend(fontsize=7), ax.set_title("Lazy alternating MWU")
    rep.figure("fixed_eps", fig, "Lazy alternating MWU: bounded T_ε at fixed ε versus exponential at ε = 0.1/m.")
    rep.plot("hitting_times", runs.filter((pl.col("experiment") == "chain") & (pl.col("start") == "uniform"))
             .select("arm", "m", "hit"), x="m", y="hit", title="ftrl_potential: T_eps vs m (uniform start; -1 = cap)")

    metrics = {k: s[k] for k in ("uniform", "random_start", "uniform_min_ftrl_slope", "uniform_min_ftrl_convexity", "convexity_arms",
                                 "staircase", "staircase_slope", "random_games", "fixed_eps", "multi", "verify")}
    rep.section("Deviations", """
| what | paper | here | why |
| --- | --- | --- | --- |
| two-player game | the paper's identical-payoff construction (not retrieved) | a derived chain gadget with padding and graded negatives | only the abstract was available; the derivation above explains the mechanism |
| multi-player game | the paper's FP construction (not retrieved) | a snake (Gray-code) path through {0,1}^N | no construction available; a naive one, stated as such |
| ε | ≤ 1/(8m) | 0.1/m; 0.05 fixed for the upper bound | just inside the paper's regime |
| sizes | asymptotic in m | m ≤ 6 (default), caps reported as "≥ cap" | CPU minutes |
| FP ties | any rule | lowest index | deterministic |
| multi-player FP | best response to product of empirical marginals (classical FP) | best response to cumulative realized utilities (FTRL with η → ∞) | the abstract calls FP the extreme version of FTRL |
| upper bound | a proof for any lazy alternating no-regret dynamics | one dynamic (alternating MWU), empirical growth at fixed ε | a finite experiment cannot check an asymptotic bound |
""")
    rep.section("Discussion", """
The paper proves asymptotic statements (exponential lower bounds for every permutation-invariant
regularizer, an exp(O(1/ε²)) upper bound for lazy alternating no-regret dynamics, doubly exponential
fictitious play). This miniature measures hitting times for m ≤ 6 on a construction of its own; the
fits are over 4–5 sizes with capped values counted at the cap, so a slope is evidence of growth in
this range, not a proof. The multi-player part uses a naive construction; if its claim fails, that
says the snake game is not hard for FP, not that the paper's theorem is wrong (a quick variant with
the two-player gadget's wrong-exit penalties and graded negatives on the snake did not help either:
simultaneous fictitious play from the all-zero start jumps along the path). Nothing here uses the
paper's games or constants.

Random starts are not part of the paper's statement (which is about permutation-invariant
regularizers, i.e. the uniform start); here some random starts escape the chain quickly, so the
per-seed growth slopes from random starts are noisy, and the seed-aware verdict reports what they
support. The log-barrier arm is costly per step (Newton solve) and is capped at a lower T; its slope
is a lower bound from two uncapped sizes.
""")
    rep.finish(CLAIMS, metrics)
