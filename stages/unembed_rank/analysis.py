"""Analyses of the grid (polars + scipy + sklearn): what drives erank, whether it predicts loss once
the hyperparameters are controlled, and late saturation vs the erank trajectory.

- ``hparam_effects``   per seed: η² of erank explained by the batch-size / weight-decay (/ lr) main
                       effects (two-way ANOVA without interaction, OLS on one-hot levels) and the
                       erank at the extreme levels.
- ``spearman`` / ``partial_spearman``: raw rank correlation and partial rank correlation controlling
                       for the hyperparameters (Pearson correlation of the residuals of the ranks
                       after OLS on the ranks of the controls: the paper's partial Spearman).
- ``strata``           rank correlation within each batch-size and each weight-decay stratum.
- ``delta_r2``         leave-one-out CV R² of loss ~ hyperparameters (one-hot) + metric, minus the
                       same without the metric (the paper's incremental R², 5-fold there).
- ``saturation``       loss rising over the last 20% of the budget; erank change over the same span.
- ``matched_loss``     erank when each run first reaches a common in-domain loss (the worst run's final
                       loss, so every run reaches it), linearly interpolated between logged points: batch
                       size compared at equal progress instead of equal tokens (whose step counts differ
                       by the batch-size ratio).
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl
from scipy import stats
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import LeaveOneOut, cross_val_predict

HPARAMS = ("batch_size", "weight_decay", "lr", "final_lr_frac", "d_model")
DESIGNS = ("main", "tokens", "steps", "sat")  # run flags in_<design> (train.run_specs)
ZERO_OK = ("weight_decay", "final_lr_frac")    # controls that can be 0: log(x + 1e-3)


def varying(frame: pl.DataFrame, cols=HPARAMS) -> list[str]:
    return [c for c in cols if c in frame.columns and frame[c].n_unique() > 1]


def one_hot(frame: pl.DataFrame, cols: list[str]) -> np.ndarray:
    """Main-effect design: intercept + one-hot levels (first level dropped) of each column."""
    parts = [np.ones((frame.height, 1))]
    for c in cols:
        levels = sorted(frame[c].unique().to_list())
        vals = frame[c].to_numpy()
        parts.append(np.stack([(vals == lv).astype(float) for lv in levels[1:]], 1))
    return np.concatenate(parts, 1)


def eta_squared(frame: pl.DataFrame, y: str, cols: list[str]) -> float:
    """Share of the variance of y explained by the main effects of cols (ANOVA without interaction)."""
    target = frame[y].to_numpy().astype(float)
    x = one_hot(frame, cols)
    beta, *_ = np.linalg.lstsq(x, target, rcond=None)
    ss_tot = float(((target - target.mean()) ** 2).sum())
    ss_res = float(((target - x @ beta) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(stats.spearmanr(a, b).statistic)


def residual_ranks(y: np.ndarray, controls: np.ndarray) -> np.ndarray:
    ry = stats.rankdata(y)
    x = np.concatenate([np.ones((len(y), 1)), np.stack([stats.rankdata(c) for c in controls.T], 1)], 1)
    beta, *_ = np.linalg.lstsq(x, ry, rcond=None)
    return ry - x @ beta


def partial_spearman(a: np.ndarray, b: np.ndarray, controls: np.ndarray) -> tuple[float, float]:
    """Partial Spearman ρ(a, b | controls) and its two-sided p-value (t with n − 2 − k dof)."""
    ra, rb = residual_ranks(a, controls), residual_ranks(b, controls)
    if np.allclose(ra, 0) or np.allclose(rb, 0):
        return float("nan"), float("nan")
    rho = float(np.corrcoef(ra, rb)[0, 1])
    dof = len(a) - 2 - controls.shape[1]
    if dof <= 0 or abs(rho) >= 1:
        return rho, float("nan")
    t = rho * math.sqrt(dof / (1 - rho ** 2))
    return rho, float(2 * stats.t.sf(abs(t), dof))


def controls_of(frame: pl.DataFrame) -> np.ndarray:
    cols = varying(frame)
    return np.stack([np.log(frame[c].to_numpy().astype(float) + (1e-3 if c in ZERO_OK else 0.0))
                     for c in cols], 1) if cols else np.zeros((frame.height, 0))


def hparam_effects(res: pl.DataFrame, metric: str = "erank") -> dict:
    """Per seed (lists in seed order): η² of metric from the hyperparameters and extreme-level means."""
    seeds = sorted(res["seed"].unique().to_list())
    bs, wd = sorted(res["batch_size"].unique().to_list()), sorted(res["weight_decay"].unique().to_list())
    out = {"seeds": seeds, "eta2": [], "bs_min": [], "bs_max": [], "wd_min": [], "wd_max": [], "range": []}
    for s in seeds:
        f = res.filter(pl.col("seed") == s)
        out["eta2"].append(eta_squared(f, metric, varying(f)))
        out["bs_min"].append(float(f.filter(pl.col("batch_size") == bs[0])[metric].mean()))
        out["bs_max"].append(float(f.filter(pl.col("batch_size") == bs[-1])[metric].mean()))
        out["wd_min"].append(float(f.filter(pl.col("weight_decay") == wd[0])[metric].mean()))
        out["wd_max"].append(float(f.filter(pl.col("weight_decay") == wd[-1])[metric].mean()))
        out["range"].append(float(f[metric].max() - f[metric].min()))
    return out


def correlations(res: pl.DataFrame, metric: str, loss: str) -> dict:
    """Per seed raw Spearman of metric vs loss; raw and partial Spearman pooled over every run.

    The partial correlation is pooled: within one seed the grid cells *are* the controls (one run
    per cell), so the ranks are often fully explained by them and a per-seed partial ρ is undefined."""
    seeds = sorted(res["seed"].unique().to_list())
    out = {"raw": []}
    for s in seeds:
        f = res.filter(pl.col("seed") == s)
        out["raw"].append(spearman(f[metric].to_numpy(), f[loss].to_numpy()))
    a, b = res[metric].to_numpy(), res[loss].to_numpy()
    out["pooled_raw"] = spearman(a, b)
    out["pooled_partial"], out["pooled_partial_p"] = partial_spearman(a, b, controls_of(res))
    out["pooled_raw_p"] = float(stats.spearmanr(a, b).pvalue) if np.ptp(a) and np.ptp(b) else float("nan")
    return out


def strata(res: pl.DataFrame, metric: str, loss: str) -> pl.DataFrame:
    """Spearman of metric vs loss within each level of each hyperparameter (over the other axes
    and seeds), and across everything."""
    rows = [{"stratum": "all runs", "n": res.height, "rho": spearman(res[metric].to_numpy(), res[loss].to_numpy())}]
    for col in varying(res):
        for level in sorted(res[col].unique().to_list()):
            f = res.filter(pl.col(col) == level)
            rows.append({"stratum": f"{col} = {level:g}", "n": f.height,
                         "rho": spearman(f[metric].to_numpy(), f[loss].to_numpy())})
    return pl.DataFrame(rows)


def delta_r2(res: pl.DataFrame, metric: str, loss: str, cv=None) -> dict:
    """Leave-one-out CV R² of loss from the hyperparameters (one-hot, + seed-free), with and without
    the metric; ΔR² = the metric's incremental out-of-sample R²."""
    y = res[loss].to_numpy().astype(float)
    base = one_hot(res, varying(res))[:, 1:]
    full = np.concatenate([base, res[metric].to_numpy()[:, None]], 1)

    def cv_r2(x: np.ndarray) -> float:
        if x.shape[1] == 0:
            return 0.0
        pred = cross_val_predict(LinearRegression(), x, y, cv=LeaveOneOut() if cv is None else cv)
        return float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())

    r_base, r_full = cv_r2(base), cv_r2(full)
    # share of the variance the hyperparameters leave unexplained that the metric explains out of sample
    rel = (r_full - r_base) / (1 - r_base) if r_base < 1 else float("nan")
    return {"r2_base": r_base, "r2_with_metric": r_full, "delta_r2": r_full - r_base, "rel_delta_r2": rel}


def saturation(history: pl.DataFrame, late: float = 0.8, tol: float = 0.01) -> pl.DataFrame:
    """Per run: the in-domain val loss change over the last (1 − late) of the budget (saturated if it
    rises by more than tol nats) and the erank change over the same span."""
    rows = []
    for name, h in history.sort("step").group_by("run", maintain_order=True):
        h = h.sort("frac")
        i80 = int(np.argmin(np.abs(h["frac"].to_numpy() - late)))
        rise = float(h["val_loss"][-1] - h["val_loss"][i80])
        rows.append({"run": name[0], "loss_rise_last20": rise, "saturated": rise > tol,
                     "erank_change_last20": float(h["erank"][-1] - h["erank"][i80]),
                     "erank_peak_drop": float(h["erank"].max() - h["erank"][-1])})
    return pl.DataFrame(rows)


def saturation_counts(res: pl.DataFrame) -> dict:
    """Low erank (below the median of the final erank over all runs) × saturated."""
    med = float(res["erank"].median())
    low = res["erank"] < med
    sat = res["saturated"]
    n = lambda m: int(m.sum())  # noqa: E731
    sat_er = res.filter(sat)["erank"]
    nosat_er = res.filter(~sat)["erank"]
    # undefined (NaN → the claim reads it as inconclusive) when no run saturates or every run does
    gap = float(nosat_er.mean() - sat_er.mean()) if len(sat_er) and len(nosat_er) else float("nan")
    return {"median_erank": med, "n_runs": res.height, "n_sat": n(sat), "low_sat": n(low & sat),
            "low_nosat": n(low & ~sat), "high_sat": n(~low & sat), "high_nosat": n(~low & ~sat),
            "erank_gap_nosat_minus_sat": gap,
            "n_rank_drop_late": int((res["erank_change_last20"] < 0).sum())}


def first_crossing(history: pl.DataFrame, level: float, cols=("erank", "step", "tokens")) -> pl.DataFrame:
    """Per run: cols linearly interpolated at the first logged interval where the ID val loss falls to
    `level` (NaN when the run never reaches it; the first point when it starts below)."""
    rows = []
    for name, h in history.sort("step").group_by("run", maintain_order=True):
        loss = h["val_loss"].to_numpy().astype(float)
        hit = np.nonzero(loss <= level)[0]
        row = {"run": name[0]}
        for c in cols:
            v = h[c].to_numpy().astype(float)
            if not len(hit):
                row[c] = float("nan")
            elif hit[0] == 0:
                row[c] = float(v[0])
            else:
                i = int(hit[0])
                w = (loss[i - 1] - level) / (loss[i - 1] - loss[i])
                row[c] = float(v[i - 1] + w * (v[i] - v[i - 1]))
        rows.append(row)
    return pl.DataFrame(rows)


def matched_loss(history: pl.DataFrame, res: pl.DataFrame) -> dict:
    """erank at a common ID loss level (the largest final logged loss over all runs): per seed, the mean
    at the extreme batch sizes / weight decays, and the optimizer steps each needed to get there."""
    final = history.sort("step").group_by("run", maintain_order=True).last()
    level = float(final["val_loss"].max())
    at = first_crossing(history, level).join(res.select("run", "seed", "batch_size", "weight_decay"), on="run")
    seeds = sorted(at["seed"].unique().to_list())
    bs, wd = sorted(at["batch_size"].unique().to_list()), sorted(at["weight_decay"].unique().to_list())
    out: dict = {"level": level, "seeds": seeds}
    for key, col, lv in (("bs_min", "batch_size", bs[0]), ("bs_max", "batch_size", bs[-1]),
                         ("wd_min", "weight_decay", wd[0]), ("wd_max", "weight_decay", wd[-1])):
        f = [at.filter((pl.col("seed") == s) & (pl.col(col) == lv)) for s in seeds]
        out[key] = [float(g["erank"].mean()) for g in f]
        out["steps_" + key] = [float(g["step"].mean()) for g in f]
    out["by_batch"] = (at.group_by("batch_size").agg(pl.col("erank").mean(), pl.col("step").mean(),
                                                      pl.col("tokens").mean()).sort("batch_size").to_dicts())
    return out
