"""report: regret / violation tables and curves, per-round time, claims with verdicts."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

CLAIM = ("Online learning under multiple round-wise counterfactual-fairness constraints (|Ctf-DE|, |Ctf-IE|, "
         "|Ctf-SE| < τ, unknown a priori) attains sublinear regret and sublinear (vanishing) cumulative violation "
         "without Slater's condition; for logistic bandits the optimistic feasible-set method with one-pass OMD "
         "has O(1) work per round and a regret whose leading term matches the unconstrained setting.")

OFF, BIND = "official_dologb", "binding_other_cf"
R = "results"

CLAIMS = [
    Bound("dologb_regret_sublinear_official",
          "Official world, τ = 0.157: DO-LogB's cumulative regret grows sublinearly (log-log slope < 1)",
          value=f"{R}.{OFF}.tau.methods.dologb.slopes.regret", 
          refuted_by="a per-seed slope of cumulative regret ≥ 1 (linear regret) beyond 2 s.e.", kind="finding"),
    Claim("official_constraint_inactive",
          "In the official environment every context kept by the rejection loop has only fair arms, so even "
          "unconstrained UCB never violates (the constraint is inactive there)",
          f"{R}.{OFF}.tau.max_violation_ucb == 0",
          refuted_by="any positive cumulative violation of unconstrained UCB in the official world", kind="finding"),
    Better("dologb_beats_uniform_official", "DO-LogB earns more expected reward than the uniform-random policy",
           a=f"{R}.{OFF}.tau.methods.dologb.final.reward", b=f"{R}.{OFF}.tau.uniform_reward",
           refuted_by="DO-LogB's cumulative expected reward ≤ the uniform policy's", kind="finding"),
    Bound("dologb_violation_sublinear_binding",
          "Binding world (τ = 0.2): DO-LogB's cumulative violation grows sublinearly (slope < 1)",
          value=f"{R}.{BIND}.tau.methods.dologb.slopes.violation", 
          refuted_by="a per-seed violation slope ≥ 1 beyond 2 s.e. (violation linear over the window)", kind="finding"),
    Better("dologb_fairer_than_ucb_binding",
           "Binding world: DO-LogB's cumulative violation is below unconstrained UCB's",
           a=f"{R}.{BIND}.tau.methods.dologb.final.violation", b=f"{R}.{BIND}.tau.methods.ucb.final.violation",
           higher_is_better=False, refuted_by="DO-LogB's violation ≥ UCB's on most seeds", kind="finding"),
    Better("scaled_radius_fairer_than_ucb_binding",
           "Binding world: DO-LogB with β_t × beta_scale has lower cumulative violation than unconstrained UCB",
           a=f"{R}.{BIND}.tau.methods.dologb_scaled.final.violation", b=f"{R}.{BIND}.tau.methods.ucb.final.violation",
           higher_is_better=False, refuted_by="the scaled variant's violation ≥ UCB's on most seeds", kind="finding"),
    Bound("ucb_violates_linearly_binding",
          "Binding world: unconstrained UCB's cumulative violation grows linearly (slope > 0.9)",
          value=f"{R}.{BIND}.tau.methods.ucb.slopes.violation", 
          refuted_by="a UCB violation slope ≤ 0.9 beyond 2 s.e.", kind="finding"),
    Bound("primal_dual_violates_roundwise_binding",
          "Binding world: the predecessor's primal-dual method (long-term constraint, truncated dual) still "
          "violates the round-wise constraint linearly (slope > 0.9)",
          value=f"{R}.{BIND}.tau.methods.primal_dual.slopes.violation", 
          refuted_by="a primal-dual violation slope ≤ 0.9 beyond 2 s.e.", kind="finding"),
    Bound("tau0_dologb_falls_back_binding",
          "τ = 0 (no arm is fair, Slater fails): DO-LogB's optimistic set eventually empties and it falls back to "
          "the overall UCB argmax, so its violation grows linearly (slope > 0.9)",
          value=f"{R}.{BIND}.tau0.methods.dologb.slopes.violation", 
          refuted_by="a τ = 0 violation slope ≤ 0.9 beyond 2 s.e.", kind="finding"),
]

LABEL = {"dologb": "DO-LogB (official)", "dologb_scaled": "DO-LogB, β×scale (ours)", "ucb": "unconstrained UCB",
         "primal_dual": "primal-dual (ICML'25)", "tabular": "tabular (ours)", "oracle": "oracle θ*"}


class Config(ReportConfig):
    pass


def _mean(v):
    a = np.asarray(v, dtype=float)
    return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")


def curve_figure(curves: pl.DataFrame, scm: str, tau: str, metrics=("regret", "violation", "penalized_regret")):
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.8))
    for ax, key in zip(axes, metrics):
        for i, m in enumerate(curves.filter((pl.col("scm") == scm) & (pl.col("tau") == tau))["method"].unique(maintain_order=True)):
            r = curves.filter((pl.col("scm") == scm) & (pl.col("tau") == tau) & (pl.col("method") == m)
                              & (pl.col("metric") == key)).sort("t")
            y = r["mean"].to_numpy()
            if (y > 0).any():
                ax.plot(r["t"], np.where(y > 0, y, np.nan), label=LABEL.get(m, m), color=f"C{i}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("round t")
        ax.set_title(f"cumulative {key}")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{scm}, {tau}")
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    ev = ctx.input("evaluate")
    res = read_json(ev / "results.json")
    timing = read_json(ev / "timing.json")
    pmeta = read_json(ctx.input("prepare") / "meta.json")
    tmeta = read_json(ctx.input("train") / "meta.json")
    curves = pl.read_parquet(ev / "curves.parquet")
    scms = res["scms"]
    for name, r in scms.items():
        for label, block in r.items():
            if "ucb" in block["methods"]:
                block["max_violation_ucb"] = max(block["methods"]["ucb"]["final"]["violation"])
    metrics = {"results": scms, "horizon": res["horizon"], "seeds": res["seeds"], "slope_window": res["slope_window"],
               "runtime_per_round_s": timing["rows"], "skipped": res["skipped"]}
    rows = []
    for name, r in scms.items():
        for label, block in r.items():
            for m, e in block["methods"].items():
                rows.append({"scm": name, "τ": block["tau"], "method": LABEL.get(m, m),
                             "regret R_T": _mean(e["final"]["regret"]),
                             "violation V_T": _mean(e["final"]["violation"]),
                             "V_T DE": _mean(e["final"]["violation_DE"]), "V_T IE": _mean(e["final"]["violation_IE"]),
                             "V_T SE": _mean(e["final"]["violation_SE"]),
                             "penalized": _mean(e["final"]["penalized_regret"]),
                             "slope R": _mean(e["slopes"]["regret"]), "slope V": _mean(e["slopes"]["violation"]),
                             "empty-set rounds": _mean(e["empty_set_rounds"])})
    table = pl.DataFrame(rows)
    T, S = res["horizon"], len(res["seeds"])
    rep = Report(ctx, "Fair contextual bandits under counterfactual-effect constraints (fair_bandits)", CLAIM)
    sc = "\n".join(f"- `{n}` ({m['file']}): τ ∈ {m['taus']}, K = {m['K']} arms, counterfactual feature "
                   f"`{m['counterfactual_feature']}`; truly fair arms per protected value (τ first): "
                   f"{[[sum(row) for row in f] for f in m['fair_arms']]}; contexts kept by the rejection loop: "
                   f"{[sum(k) for k in m['kept_contexts']]} of 8" for n, m in pmeta["scms"].items())
    rep.section("Setup", f"""
Horizon T = {T}, {S} seeds (paired: every method sees the same contexts, reward uniforms and tie-break
numbers per seed). SCMs (format: `stages/fair_bandits/scm.py`):
{sc}

Methods: DO-LogB exactly as the official code runs it (⌊√T⌋ uniform rounds, UCB argmax inside the optimistic
feasible set |ĉ_k| − ξ_k < τ, overall argmax when it is empty, one-pass OMD on θ, β_t of Zhang & Sugiyama Thm 1);
DO-LogB with β_t × {tmeta['beta_scale']} (our ablation); unconstrained UCB (same learner, no constraint); the
ICML 2025 predecessor's primal-dual rule (UCB − Σλ_k|ĉ_k|, λ ∈ [0, ρ = {tmeta['rho']}], step ρ/√T); a tabular
(non-parametric) variant built the same way (our construction; skipped where the counterfactual context is
outside the support: {tmeta['skipped'] or 'none'}); an oracle that knows θ*. Metrics as the official
simulation.py: regret vs the round's best truly fair arm (least-unfair arm when none is fair, e.g. τ = 0),
violation max_k |effect_k| − τ when positive (and per effect), penalized regret. Slopes: least squares of
log cumulative value on log t over t ∈ {res['slope_window']}.
""")
    rep.table("Results (means over seeds)", table, note="Regret can be negative when a method plays an unfair arm "
              "whose reward exceeds the best fair arm's (then its slope is undefined: nan).")
    for name in scms:
        rep.figure(f"curves_{name}", curve_figure(curves, name, "tau"),
                   f"{name} at its τ: cumulative regret, violation and penalized regret vs t (log-log, mean over seeds; "
                   "non-positive points omitted).")
    if "tau0" in scms.get(BIND, {}):
        rep.figure(f"curves_{BIND}_tau0", curve_figure(curves, BIND, "tau0", ("violation", "penalized_regret")),
                   "Binding world at τ = 0 (no arm can be fair).")
    rep.plot("curves", curves.filter(pl.col("metric").is_in(["regret", "violation", "penalized_regret"])))
    trows = pl.DataFrame(timing["rows"])
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(trows["t"], trows["omd_s"] * 1e6, "-o", label="one-pass OMD update")
    ax.plot(trows["t"], trows["history_mle_s"] * 1e6, "-s", label=f"history MLE ({timing['newton_steps']} Newton steps)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("round t")
    ax.set_ylabel("µs per estimator update (wall-clock)")
    ax.legend()
    rep.figure("time_per_round", fig, "Per-round estimator time vs t (wall-clock on this machine; not used by any claim).")
    rep.plot("time_per_round", trows)
    rep.table("Per-round estimator time (wall-clock, runtime only)", trows)
    rep.section("Reading the results", _reading(scms))
    rep.section("Deviations", """
| what | paper / official code | here | why |
| --- | --- | --- | --- |
| paper body | theorems, non-parametric algorithm, experiments | not consulted (unavailable); the official DO-LogB code is followed | only the abstract could be read |
| horizon, runs | T = 10001, 1 run | default: the official T = 10001 with 5 seeds; `full`: T = 50000 × 10 seeds (the card's 20–50k) | seeds for paired verdicts; longer horizons need a bigger machine |
| counterfactual feature | 1 − a in features, −a in probabilities (quirk) | kept in `official.json` (`one_minus_a`); `binding.json` uses the other value | reported, not silently fixed |
| second world | — | `binding.json` (our choice of θ*, arms, τ = 0.2, i.i.d. contexts) | in the official world the constraint is inactive |
| τ = 0 | rejection loop never terminates | no context redrawn; comparator = least-unfair arm | Slater fails; behaviour reported |
| tabular variant, β-scaled DO-LogB | unknown / absent | our constructions, labelled | issue asks for a non-parametric variant |
| primal-dual | predecessor's step/truncation details | λ ∈ [0, ρ], step ρ/√T, penalty Σλ_k|ĉ_k| | predecessor text only partially read |
| running time | wall-clock per round | wall-clock of the estimator update only, outside claims | budgets are counts |
| H⁻¹ | pinv each round | Sherman–Morrison (same value, H is positive definite) | O(p²) per round |
""")
    rep.section("Discussion", f"""
The paper proves sublinear regret and violation for round-wise counterfactual-fairness constraints without
Slater's condition and runs the official code at T = 10001 (one run). This miniature runs the same logistic
algorithm at T = {T} with {S} seeds and measures the official metrics. What it does not reproduce: the
non-parametric algorithm of the paper (unknown; ours is a stand-in), the theorems' constants, and horizons where
the theoretical confidence radius becomes small enough for the optimistic feasible set to exclude unfair arms
(ξ_k ≈ (β_t/4)·Σ widths stays ≳ 0.3 at t ≈ 10⁴ while effect gaps are a few hundredths in these worlds; the
`full` profile runs T = 50000). The kernel path that ran is listed below, generated from the record.
""")
    rep.finish(CLAIMS, metrics)


def _reading(scms: dict) -> str:
    lines = []
    for name, r in scms.items():
        for label, block in r.items():
            ms = block["methods"]
            parts = [f"{LABEL.get(m, m)}: V_T = {_mean(e['final']['violation']):.3g}, R_T = {_mean(e['final']['regret']):.3g}, "
                     f"empty optimistic set in {_mean(e['empty_set_rounds']):.0f} rounds" for m, e in ms.items()]
            lines.append(f"- **{name}, τ = {block['tau']}**: " + "; ".join(parts) + ".")
    lines.append("")
    lines.append("DO-LogB and unconstrained UCB coincide wherever the optimistic feasible set never excludes an arm "
                 "(identical actions under common random numbers); a claim marked **no** did not hold at this scale.")
    return "\n".join(lines)
