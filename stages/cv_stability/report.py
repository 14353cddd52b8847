"""report: coverage tables and figures, r(h_n) vs n, and the claims with their verdicts."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Claim
from stages.common.config import StageConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.cv_stability.cv_inference import coverage_se
from stages.cv_stability.models import COMPARISONS, SINGLES

CLAIM = ("Cross-validation gives asymptotically exact confidence intervals for test error only when the "
         "contrast is relatively stable (r(h_n) = n·γ/σ² → 0). Single models (OLS, soft-thresholding, Lasso) are, "
         "and their CV intervals cover; yet comparisons between them (ST vs OLS, Lasso vs OLS, ST at two "
         "thresholds) are relatively unstable, and their CV intervals under-cover even in a sparse, "
         "low-dimensional Gaussian linear model.")

CLAIMS = [
    Claim("single_models_cover",
          "CV confidence intervals for single models (OLS, ST at two thresholds, Lasso) cover at ≈95% at every n "
          "(within 3 Monte-Carlo s.e. of the nominal level, both variance estimators)",
          "single.min_coverage >= nominal - 3 * mc_se_nominal and single.max_coverage <= nominal + 3 * mc_se_nominal"),
    Claim("comparisons_undercover",
          "CV intervals for ST vs OLS and Lasso vs OLS under-cover at every n (below nominal − 3 s.e., both "
          "estimators) and do not improve with n (coverage gain from the smallest to the largest n < 3 s.e.)",
          "st_vs_ols.max_coverage < nominal - 3 * mc_se_nominal and lasso_vs_ols.max_coverage < nominal - 3 * mc_se_nominal"
          " and st_vs_ols.improvement_z < 3 and lasso_vs_ols.improvement_z < 3"),
    Claim("st_thresholds_undercover",
          "The CV interval comparing ST at two thresholds also under-covers at every n and does not improve with n",
          "st_high_vs_st_low.max_coverage < nominal - 3 * mc_se_nominal and st_high_vs_st_low.improvement_z < 3"),
    Claim("relative_stability",
          "r(h_n) goes to 0 for single models (falls ≥4× from the smallest to the largest n; theory ∝ 1/n) but not "
          "for comparisons (falls < 2×; theory: bounded away from 0)",
          "stability.single_max_ratio < 0.25 and stability.comparison_min_ratio > 0.5"),
]

LABELS = {"ols": "OLS", "st_low": "ST (c=low)", "st_high": "ST (c=high)", "lasso": "Lasso",
          "st_vs_ols": "ST − OLS", "lasso_vs_ols": "Lasso − OLS", "st_high_vs_st_low": "ST high − ST low"}


class Config(StageConfig):
    pass


def comparison_metrics(cov: pl.DataFrame, name: str, n_min: int, n_max: int) -> dict:
    """Max coverage over n and estimators, and the largest z-score of a coverage gain n_min -> n_max."""
    rows = cov.filter(pl.col("contrast") == name)
    zs = []
    for est in ("out", "in"):
        lo = rows.filter((pl.col("estimator") == est) & (pl.col("n") == n_min)).row(0, named=True)
        hi = rows.filter((pl.col("estimator") == est) & (pl.col("n") == n_max)).row(0, named=True)
        se = math.sqrt(lo["mc_se"] ** 2 + hi["mc_se"] ** 2)
        gain = hi["coverage"] - lo["coverage"]
        zs.append(gain / se if se > 0 else (0.0 if gain <= 0 else math.inf))
    return {"max_coverage": float(rows["coverage"].max()), "min_coverage": float(rows["coverage"].min()),
            "improvement_z": float(max(zs))}


def _n_ticks(ax, ns: list[int]) -> None:
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xlabel("n")


def coverage_figure(cov: pl.DataFrame, singles: list[str], comparisons: list[str], level: float, band: float):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, names, title in ((axes[0], singles, "single models"), (axes[1], comparisons, "comparisons")):
        ax.axhline(level, color="k", lw=1)
        ax.axhspan(level - band, level + band, color="0.85", label=f"nominal ± 3 MC s.e.")
        for i, name in enumerate(names):
            for est, style in (("out", "-o"), ("in", "--s")):
                r = cov.filter((pl.col("contrast") == name) & (pl.col("estimator") == est)).sort("n")
                shift = 1 + 0.03 * (2 * i + (est == "in") - len(names))  # spread overlapping bars
                ax.errorbar(r["n"].to_numpy() * shift, r["coverage"], yerr=1.96 * r["mc_se"].to_numpy(),
                            fmt=style, color=f"C{i}", capsize=3, ms=4,
                            label=f"{LABELS[name]} (σ̂_{est})")
        ax.set_xscale("log")
        _n_ticks(ax, cov["n"].unique().sort().to_list())
        ax.set_title(f"CV {int(round(level * 100))}% CI coverage: {title}")
        ax.legend(fontsize=6, loc="lower center", ncol=2)
    low = float((cov["coverage"] - 1.96 * cov["mc_se"]).min())
    axes[0].set_ylim(min(low, level - band) - 0.06, min(1.0, level + band + 0.01))
    axes[0].set_ylabel("coverage (±1.96 MC s.e.)")
    return fig


def stability_figure(stab: pl.DataFrame, singles: list[str], comparisons: list[str]):
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, name in enumerate(singles + comparisons):
        r = stab.filter(pl.col("contrast") == name).sort("n")
        ax.errorbar(r["n"], r["r"], yerr=1.96 * r["r_se"].to_numpy(), fmt="-o" if name in singles else "-s",
                    color=f"C{i}", capsize=3, ms=4, label=LABELS[name])
    ols = stab.filter(pl.col("contrast") == "ols").sort("n")
    ns = ols["n"].to_numpy().astype(float)
    ax.plot(ns, ols["r"][0] * ns[0] / ns, "k:", lw=1, label="∝ 1/n")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _n_ticks(ax, ns.astype(int).tolist())
    ax.set_ylabel("r(h_n) = n·γ / σ²  (±1.96 s.e.)")
    ax.set_title("Relative stability (Monte-Carlo)")
    ax.legend(fontsize=7)
    return fig


def zscore_figure(per_rep: pl.DataFrame, n: int):
    from scipy.stats import norm

    fig, ax = plt.subplots(figsize=(6.5, 4))
    grid = np.linspace(-5, 5, 200)
    ax.plot(grid, norm.pdf(grid), "k", lw=1.2, label="N(0, 1)")
    for i, name in enumerate(("ols", "st_vs_ols", "lasso_vs_ols", "st_high_vs_st_low")):
        r = per_rep.filter((pl.col("contrast") == name) & (pl.col("estimator") == "out") & (pl.col("n") == n))
        z = ((r["rhat"] - r["target"]) / (r["sd"] / math.sqrt(n))).to_numpy()
        ax.hist(z, bins=30, range=(-5, 5), density=True, histtype="step", color=f"C{i}", label=LABELS[name])
    ax.set_xlabel("(R̂ − target) / (σ̂_out / √n)")
    ax.set_title(f"Studentized CV error at n = {n}")
    ax.legend(fontsize=7)
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    ev = ctx.input("evaluate")
    emeta = read_json(ev / "meta.json")
    tmeta = read_json(ctx.input("train") / "meta.json")
    pmeta = read_json(ctx.input("prepare") / "meta.json")
    cov = pl.read_parquet(ev / "coverage.parquet")
    stab = pl.read_parquet(ev / "stability.parquet")
    per_rep = pl.read_parquet(ev / "per_rep.parquet")
    level, reps, ns = emeta["level"], emeta["reps"], emeta["ns"]
    singles, comparisons = list(SINGLES), list(COMPARISONS)
    n_min, n_max = min(ns), max(ns)
    mc_se_nominal = coverage_se(level, reps)

    single_cov = cov.filter(pl.col("kind") == "single")["coverage"]

    def r_at(name: str, n: int) -> float:
        return float(stab.filter((pl.col("contrast") == name) & (pl.col("n") == n))["r"][0])

    ratios = {name: r_at(name, n_max) / r_at(name, n_min) for name in singles + comparisons}
    metrics = {
        "nominal": level, "reps": reps, "ns": ns, "k": pmeta["k"], "mc_se_nominal": mc_se_nominal,
        "single": {"min_coverage": float(single_cov.min()), "max_coverage": float(single_cov.max())},
        **{name: comparison_metrics(cov, name, n_min, n_max) for name in comparisons},
        "coverage": {name: {est: {f"n{row['n']}": row["coverage"] for row in
                                  cov.filter((pl.col("contrast") == name) & (pl.col("estimator") == est))
                                  .sort("n").iter_rows(named=True)} for est in ("out", "in")}
                     for name in singles + comparisons},
        "r": {name: {f"n{n}": r_at(name, n) for n in ns} for name in singles + comparisons},
        "stability": {"single_max_ratio": max(ratios[s] for s in singles),
                      "comparison_min_ratio": min(ratios[c] for c in comparisons),
                      "ratio": ratios},
    }

    rep = Report(ctx, "Cross-validation inference needs relative stability (cv_stability)", CLAIM)
    scales = tmeta["scales"]
    rep.section("Setup", f"""
Y = Xᵀβ* + ε with X ~ N(0, I_{pmeta['d']}), ε ~ N(0, {pmeta['noise_sd']}²), β* = {pmeta['beta_star']}.
For each n ∈ {ns}: **{reps} independent data sets**, k = {pmeta['k']}-fold CV (contiguous folds of i.i.d. points).
Models, refitted on every training split: OLS; ST = soft-threshold of OLS at λ_n = c/√n with c = {scales['st_low']}
("low") and c = {scales['st_high']} ("high"); Lasso with scikit-learn scaling 1/(2m)‖y − Xβ‖² + α_n‖β‖₁,
α_n = {scales['lasso']}/√n, solved by the batched ISTA kernel (`kernels/batched_lasso.py`; all reps × folds at once).

CV inference (Bayle et al. 2020): h_i = out-of-fold loss (single model) or loss difference (comparison);
CI = R̂ ± z σ̂/√n with σ̂² either the all-pairs estimator mean(h²) − R̂² (σ̂_out) or the within-fold one (σ̂_in).
Target: the k-fold test error, the fold average of exact conditional test errors σ² + ‖β̂_j − β*‖² (Gaussian design),
so coverage is exact up to Monte-Carlo error; MC s.e. at the nominal level = {mc_se_nominal:.4f} ({reps} reps).

Relative stability r(h_n) = n·γ(h_n)/σ²(h_n) is estimated by Monte Carlo with {emeta['stability_draws']} fresh training
sets of the CV training size m = n − n/k per n, each refitted after replacing one point; γ and σ² use exact
expectations over the test point (quadratic forms in Gaussian (x, ε)), σ² as an unbiased U-statistic
(see `stages/cv_stability/stability.py`); error bars are batch-means s.e. over groups of draws.
""")
    table = (cov.pivot(on="estimator", index=["contrast", "n"], values="coverage")
             .rename({"out": "coverage σ̂_out", "in": "coverage σ̂_in"})
             .join(cov.filter(pl.col("estimator") == "out").select("contrast", "n", "mc_se", "sd_of_z", "mean_target"),
                   on=["contrast", "n"])
             .join(stab.select("contrast", "n", "r", "r_se"), on=["contrast", "n"])
             .with_columns(pl.col("contrast").replace_strict(LABELS))
             .rename({"sd_of_z": "sd of studentized error (σ̂_out)", "r": "r(h_n)", "r_se": "s.e. r"}))
    rep.table("Coverage and relative stability", table, note=(
        "Coverage: share of replications whose CI contains the k-fold test error; mc_se = √(p(1−p)/reps). "
        "A valid CI has studentized-error s.d. ≈ 1."))
    band = 3 * mc_se_nominal
    rep.figure("coverage_vs_n", coverage_figure(cov, singles, comparisons, level, band),
               "CV CI coverage vs n with ±1.96 Monte-Carlo s.e. bars; grey band: nominal ± 3 MC s.e.")
    rep.figure("r_vs_n", stability_figure(stab, singles, comparisons),
               "Monte-Carlo relative stability r(h_n) vs n (log-log); the dotted line is ∝ 1/n through OLS at the smallest n.")
    rep.figure("studentized_error", zscore_figure(per_rep, n_max),
               f"Distribution of the studentized CV error at n = {n_max}; a valid CI needs ≈ N(0, 1).")
    rep.plot("coverage_vs_n", cov.select("n", "contrast", "estimator", "coverage", "mc_se").sort("contrast", "estimator", "n"))
    rep.plot("r_vs_n", stab.select("n", "contrast", "kind", "r", "r_se", "gamma", "sigma2").sort("contrast", "n"))
    rep.section("Reading the verdicts", _reading(metrics, singles, comparisons, ns, level, band))
    rep.finish(CLAIMS, metrics)


def _reading(m: dict, singles: list[str], comparisons: list[str], ns: list[int], level: float, band: float) -> str:
    """Plain-language summary generated from the measured numbers (no hard-coded results)."""
    lines = []
    lo = level - band
    for name in singles + comparisons:
        covs = [min(m["coverage"][name]["out"][f"n{n}"], m["coverage"][name]["in"][f"n{n}"]) for n in ns]
        below = [n for n, c in zip(ns, covs) if c < lo]
        rs = ", ".join(f"{m['r'][name][f'n{n}']:.3g}" for n in ns)
        status = (f"under-covers (below {lo:.3f}) at n = {below}" if below else f"within or above {lo:.3f} at every n")
        lines.append(f"- **{LABELS[name]}**: lowest coverage per n {', '.join(f'{c:.3f}' for c in covs)} — {status}; "
                     f"r(h_n) = {rs}.")
    lines.append("")
    lines.append("A claim marked **no** did not hold at this scale with these replications; the numbers above "
                 "say where it failed. Single-model r(h_n) shrinks roughly like 1/n; where a single model's r(h_n) "
                 "is not yet small (smallest n), some under-coverage of its interval is consistent with the "
                 "relative-stability condition not yet being met.")
    return "\n".join(lines)
