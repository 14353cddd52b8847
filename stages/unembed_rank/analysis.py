"""Analyses of the grid (polars + scipy + sklearn): what drives erank, whether it predicts loss once
the hyperparameters are controlled, and late saturation vs the erank trajectory.

- ``hparam_effects``   per seed: the range over batch sizes / over weight decays of the level means
                       of erank (effect sizes in erank points), η² of the main effects (context only:
                       with one run per cell it is ~1 by construction) and the erank at the extreme levels.
- ``spearman`` / ``partial_spearman``: raw rank correlation and partial rank correlation controlling
                       for the hyperparameters (Pearson correlation of the residuals of the ranks
                       after OLS on the ranks of the controls: the paper's partial Spearman).
- ``strata``           rank correlation within each batch-size and each weight-decay stratum.
- ``delta_r2``         leave-one-out CV R² of loss ~ hyperparameters (one-hot) + metric, minus the
                       same without the metric (the paper's incremental R², 5-fold there).
- ``saturation``       loss rising over the last 20% of the budget; erank change over the same span.
- ``matched_loss``     erank when each run first reaches a common in-domain loss (the worst run's final
                       loss, so every run reaches it), linearly interpolated between logged points (a
                       guard makes it NaN when the bracketing points differ by > max_gap nats): batch
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
    out = {"seeds": seeds, "eta2": [], "bs_min": [], "bs_max": [], "wd_min": [], "wd_max": [], "range": [],
           "bs_range": [], "wd_range": [], "min_axis_range": []}
    for s in seeds:
        f = res.filter(pl.col("seed") == s)
        out["eta2"].append(eta_squared(f, metric, varying(f)))
        out["bs_min"].append(float(f.filter(pl.col("batch_size") == bs[0])[metric].mean()))
        out["bs_max"].append(float(f.filter(pl.col("batch_size") == bs[-1])[metric].mean()))
        out["wd_min"].append(float(f.filter(pl.col("weight_decay") == wd[0])[metric].mean()))
        out["wd_max"].append(float(f.filter(pl.col("weight_decay") == wd[-1])[metric].mean()))
        out["range"].append(float(f[metric].max() - f[metric].min()))
        # effect sizes in the metric's units: range over each axis's levels of the level means (per seed);
        # min_axis_range = the smaller of the two (both axes drive the metric by at least this much)
        rb = _axis_range(f, "batch_size", metric)
        rw = _axis_range(f, "weight_decay", metric)
        out["bs_range"].append(rb)
        out["wd_range"].append(rw)
        out["min_axis_range"].append(float(min(rb, rw)) if len(wd) > 1 and len(bs) > 1 else float("nan"))
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
    # the same gap within each weight-decay level (saturation and erank both move with weight decay): mean over
    # the levels that have both saturated and unsaturated runs; NaN when no level has both (then the design
    # cannot separate saturation from weight decay)
    within = []
    for lv in sorted(res["weight_decay"].unique().to_list()):
        f = res.filter(pl.col("weight_decay") == lv)
        if 0 < int(f["saturated"].sum()) < f.height:
            within.append(float(f.filter(~pl.col("saturated"))["erank"].mean() - f.filter(pl.col("saturated"))["erank"].mean()))
    return {"median_erank": med, "n_runs": res.height, "n_sat": n(sat), "low_sat": n(low & sat),
            "erank_gap_within_wd": float(np.mean(within)) if within else float("nan"),
            "n_wd_levels_mixed": len(within),
            "low_nosat": n(low & ~sat), "high_sat": n(~low & sat), "high_nosat": n(~low & ~sat),
            "erank_gap_nosat_minus_sat": gap,
            "n_rank_drop_late": int((res["erank_change_last20"] < 0).sum())}


def first_crossing(history: pl.DataFrame, level: float, cols=("erank", "step", "tokens"),
                   max_gap: float = math.inf) -> pl.DataFrame:
    """Per run: cols linearly interpolated at the first logged interval where the ID val loss falls to
    `level` (NaN when the run never reaches it; the first point when it starts below), and ``gap``, the
    loss difference between the two logged points that bracket the crossing. Guard: when that gap exceeds
    max_gap nats the interpolation is not trusted (erank need not move linearly over a long interval) and
    cols are NaN, so a claim on them reads inconclusive."""
    rows = []
    for name, h in history.sort("step").group_by("run", maintain_order=True):
        loss = h["val_loss"].to_numpy().astype(float)
        hit = np.nonzero(loss <= level)[0]
        row = {"run": name[0]}
        gap = float("nan") if not len(hit) else (0.0 if hit[0] == 0 else float(loss[hit[0] - 1] - loss[hit[0]]))
        for c in cols:
            v = h[c].to_numpy().astype(float)
            if not len(hit) or not gap <= max_gap:
                row[c] = float("nan")
            elif hit[0] == 0:
                row[c] = float(v[0])
            else:
                i = int(hit[0])
                w = (loss[i - 1] - level) / (loss[i - 1] - loss[i])
                row[c] = float(v[i - 1] + w * (v[i] - v[i - 1]))
        row["gap"] = gap
        rows.append(row)
    return pl.DataFrame(rows)


def merge_dense(history: pl.DataFrame, dense: pl.DataFrame | None) -> pl.DataFrame:
    """The regular points (run, step, tokens, frac, val_loss, erank) plus the dense early ones, one row per
    (run, step), sorted by step."""
    cols = ["run", "step", "tokens", "frac", "val_loss", "erank"]
    base = history.select(cols).with_columns(pl.col("step").cast(pl.Int64), pl.col("tokens").cast(pl.Int64))
    if dense is not None and dense.height:
        base = pl.concat([base, dense.select(cols).with_columns(pl.col("step").cast(pl.Int64),
                                                                 pl.col("tokens").cast(pl.Int64))])
    return base.unique(["run", "step"], keep="first").sort("run", "step")


def matched_loss(history: pl.DataFrame, res: pl.DataFrame, max_gap: float = math.inf) -> dict:
    """erank at a common ID loss level (the largest final logged loss over the runs): per seed, the mean
    at the extreme batch sizes / weight decays (NaN when a run's crossing fails the max_gap guard), the
    range over batch sizes of the batch-size means, and the optimizer steps each needed to get there."""
    final = history.sort("step").group_by("run", maintain_order=True).last()
    level = float(final["val_loss"].max())
    at = first_crossing(history, level, max_gap=max_gap).join(
        res.select("run", "seed", "batch_size", "weight_decay"), on="run")
    seeds = sorted(at["seed"].unique().to_list())
    bs, wd = sorted(at["batch_size"].unique().to_list()), sorted(at["weight_decay"].unique().to_list())
    out: dict = {"level": level, "seeds": seeds, "max_gap": max_gap,
                 "bracket_gap_max": float(at["gap"].max()), "n_guarded": int((~(at["gap"] <= max_gap)).sum()),
                 "n_runs": at.height}
    for key, col, lv in (("bs_min", "batch_size", bs[0]), ("bs_max", "batch_size", bs[-1]),
                         ("wd_min", "weight_decay", wd[0]), ("wd_max", "weight_decay", wd[-1])):
        f = [at.filter((pl.col("seed") == s) & (pl.col(col) == lv)) for s in seeds]
        out[key] = [_nanmean(g["erank"]) for g in f]
        out["steps_" + key] = [_nanmean(g["step"]) for g in f]
    out["bs_range"] = [_axis_range(at.filter(pl.col("seed") == s), "batch_size", "erank") for s in seeds]
    out["by_batch"] = (at.group_by("batch_size").agg(pl.col("erank").mean(), pl.col("step").mean(),
                                                      pl.col("tokens").mean(), pl.col("gap").max())
                       .sort("batch_size").to_dicts())
    return out


def _nanmean(col: pl.Series) -> float:
    """Mean that stays NaN when any value is NaN (a guarded crossing makes the cell's value unknown)."""
    v = col.to_numpy().astype(float)
    return float(v.mean()) if len(v) else float("nan")


def _axis_range(f: pl.DataFrame, col: str, metric: str) -> float:
    """Range (max − min) over the levels of col of the metric's mean at each level (NaN-propagating)."""
    means = [_nanmean(f.filter(pl.col(col) == lv)[metric]) for lv in sorted(f[col].unique().to_list())]
    return float(np.max(means) - np.min(means)) if len(means) > 1 else float("nan")
