"""evaluate: CV confidence intervals and their exact coverage; Monte-Carlo relative stability.

Part 1 (coverage). For every n, the data sets are regenerated from prepare's seed in chunks of
replications (simulate.draw_datasets, bit-for-bit the data train fitted on). For every replication and contrast (single model or comparison): out-of-fold
losses h_i, R̂, both variance estimators, the CI, and the exact k-fold target
Σ_j (|B_j|/n)(σ² + ‖β̂_A,j − β*‖² − [σ² + ‖β̂_B,j − β*‖²]). Coverage = share of replications whose
CI contains the target. Writes per_rep.parquet and coverage.parquet.

Beside the CV interval, every comparison also gets the conservative Bonferroni interval built from
the two single-model intervals at level 1 − α/2 (cv_inference.bonferroni_difference): valid whenever
the single models are, whatever the comparison's relative stability (method "bonferroni").

Part 2 (relative stability). For every n: B fresh training sets of the CV training size
m = n − n/k and their one-point replacements, every model refitted on both (the Lasso through
kernels.batched_lasso), then γ̂, σ̂² and r̂ = nγ̂/σ̂² (stages.cv_stability.stability). Writes
stability.parquet.

Part 3 (worked example, issue 42). CV inference for Lasso vs OLS on scikit-learn's bundled diabetes
data (stages.cv_stability.real_data; no download): the intervals on one random 10-fold partition and
their spread over further random partitions. Writes real_example.json.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from kernels.batched_lasso import batched_lasso
from kernels.record import KernelRecord
from stages.common.config import Fraction, Seed, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.cv_stability.cv_inference import (bonferroni_difference, ci_covers, coverage_se, cv_estimates,
                                              kfold_target, out_of_fold_losses, z_quantile)
from stages.cv_stability.real_data import load_diabetes_xy, worked_example
from stages.cv_stability.models import CONTRASTS, MODELS, SINGLES, Penalties, fit_models
from stages.cv_stability.simulate import conditional_test_error, draw_datasets, rep_chunks
from stages.cv_stability.stability import contrast_parts, relative_stability, simulate_replace_one

ESTIMATORS = ("out", "in")  # σ̂²_out (all pairs) and σ̂²_in (within fold)


class RealExampleConfig(StageConfig):
    """The worked example on real data (scikit-learn's diabetes set, shipped with the package)."""
    enabled: bool = Field(True, description="run the diabetes worked example")
    folds: int = Field(10, ge=2, le=100, description="k of the k-fold CV")
    partitions: int = Field(50, ge=0, le=2000, description="further random fold partitions (spread of the interval)")
    seed: Seed = Field(3, description="seed of the fold partitions")


class Config(StageConfig):
    seed: Seed = 1
    level: Fraction = Field(0.95, description="CI confidence level 1 − α")
    stability_draws: int = Field(2000, ge=4, le=500_000, description="Monte-Carlo training sets B per n for r(h_n)")
    stability_groups: int = Field(20, ge=2, le=500, description="batch-means groups for the s.e. of r̂ "
                                  "(the claims treat the groups' r̂ as independent seeds)")
    chunk: int = Field(500, ge=1, le=100_000, description="training sets simulated at once")
    lasso_tol: float = Field(1e-10, gt=0, le=1e-2)
    lasso_max_iter: int = Field(10_000, ge=1, le=1_000_000)
    device: DeviceName = "auto"
    real_example: RealExampleConfig = RealExampleConfig()

    @model_validator(mode="after")
    def _check_groups(self):
        if self.stability_draws < 2 * self.stability_groups:
            raise ValueError(f"stability_groups: {self.stability_groups} groups need stability_draws >= "
                             f"{2 * self.stability_groups} (got {self.stability_draws})")
        return self


def coverage_rows(x, y, coefs, bounds, beta_star, noise_sd, level, n):
    """Per-replication CI results for every contrast and estimator at one n."""
    losses = {m: out_of_fold_losses(x, y, coefs[m], bounds) for m in MODELS}          # (R, n)
    errs = {m: conditional_test_error(coefs[m], beta_star, noise_sd) for m in MODELS}  # (R, k)
    single_est = {m: cv_estimates(losses[m], bounds) for m in MODELS}
    z = z_quantile(level)
    rows = []
    for name, (a, b) in CONTRASTS.items():
        h = losses[a] if b is None else losses[a] - losses[b]
        est = cv_estimates(h, bounds)
        target = kfold_target(errs[a], None if b is None else errs[b], bounds)
        for e in ESTIMATORS:
            var = est[f"var_{e}"]
            covered = ci_covers(est["rhat"], var, target, n, level)
            frame = {"n": n, "contrast": name, "kind": "single" if b is None else "comparison", "estimator": e,
                     "rep": np.arange(len(target)), "rhat": est["rhat"].cpu().numpy(),
                     "target": target.cpu().numpy(), "sd": var.sqrt().cpu().numpy()}
            rows.append(pl.DataFrame({**frame, "method": "cv", "covered": covered.cpu().numpy(),
                                      "half_width": (z * var.sqrt() / n**0.5).cpu().numpy()}))
            if b is not None:
                sa, sb = single_est[a], single_est[b]
                lo, hi = bonferroni_difference(sa["rhat"], sa[f"var_{e}"], sb["rhat"], sb[f"var_{e}"], n, level)
                rows.append(pl.DataFrame({**frame, "method": "bonferroni",
                                          "covered": ((lo <= target) & (target <= hi)).cpu().numpy(),
                                          "half_width": ((hi - lo) / 2).cpu().numpy()}))
    return pl.concat(rows)


def summarize_coverage(per_rep: pl.DataFrame) -> pl.DataFrame:
    out = (per_rep.group_by("n", "contrast", "kind", "estimator", "method", maintain_order=True)
           .agg(pl.col("covered").mean().alias("coverage"), pl.len().alias("reps"),
                pl.col("half_width").mean().alias("mean_half_width"),
                ((pl.col("rhat") - pl.col("target")) / (pl.col("sd") / pl.col("n").cast(pl.Float64).sqrt()))
                .std().alias("sd_of_z"),
                pl.col("target").mean().alias("mean_target"),
                (pl.col("sd") / pl.col("n").cast(pl.Float64).sqrt()).mean().alias("mean_se")))
    return out.with_columns(pl.struct("coverage", "reps").map_elements(
        lambda s: coverage_se(s["coverage"], s["reps"]), return_dtype=pl.Float64).alias("mc_se"))


def stability_rows(cfg: Config, meta: dict, pens: Penalties, n: int, beta_star: torch.Tensor,
                   rec: KernelRecord) -> list[dict]:
    """r̂(h_n) for every contrast at sample size n (training size m = n − n//k)."""
    m = n - n // meta["k"]
    lam = pens.at(n)
    parts = {name: ([], [], [], []) for name in CONTRASTS}  # a, S, a', S'
    for start in range(0, cfg.stability_draws, cfg.chunk):
        count = min(cfg.chunk, cfg.stability_draws - start)
        rngs = [np.random.default_rng([cfg.seed, n, b]) for b in range(start, start + count)]  # one per draw
        gram, xty, gram_r, xty_r = simulate_replace_one(rngs, m, beta_star.cpu(), meta["noise_sd"])
        grams = torch.cat([gram, gram_r]).to(beta_star.device)
        xtys = torch.cat([xty, xty_r]).to(beta_star.device)
        coefs, _ = fit_models(grams, xtys, float(m), lam, cfg.lasso_tol, cfg.lasso_max_iter, rec.backend)
        rec.count("batched_lasso")
        if start == 0 and n == meta["ns"][0]:  # Triton path vs reference on these real problems
            rec.parity("batched_lasso", batched_lasso, grams[:64] / m, xtys[:64] / m, lam["lasso"],
                       tol=cfg.lasso_tol, max_iter=cfg.lasso_max_iter,
                       slice=f"first 64 Monte-Carlo training sets (D and D') at n = {n}")
        err = {k: v - beta_star for k, v in coefs.items()}  # u = β̂ − β*, (2·count, d)
        for name, (a, b) in CONTRASTS.items():
            c, av, sv = contrast_parts(err[a], None if b is None else err[b])
            for lst, val in zip(parts[name], (av[:count], sv[:count], av[count:], sv[count:])):
                lst.append(val)
    rows, groups = [], []
    for name, (a, b) in CONTRASTS.items():
        av, sv, ar, sr = (torch.cat(v) for v in parts[name])
        c = 1.0 if b is None else 0.0
        res = relative_stability(c, av, sv, ar, sr, meta["noise_sd"], n, groups=cfg.stability_groups)
        rows.append({"n": n, "contrast": name, "kind": "single" if b is None else "comparison",
                     "m": m, "draws": cfg.stability_draws, **{k: v for k, v in res.items() if k != "r_groups"}})
        groups.append({"n": n, "contrast": name, "group": list(range(len(res["r_groups"]))), "r": res["r_groups"]})
    return rows, groups


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep, trained = ctx.input("prepare"), ctx.input("train")
    meta, tmeta = read_json(prep / "meta.json"), read_json(trained / "meta.json")
    beta_star = torch.tensor(meta["beta_star"], dtype=torch.float64, device=device)
    per_rep = []
    for n in tqdm(meta["ns"], desc="evaluate: CV intervals per n"):
        coefs = torch.load(trained / f"coefs_n{n}.pt")
        bounds = [tuple(b) for b in meta["folds"][str(n)]]
        for part in rep_chunks(meta["reps"], n):  # regenerated chunk by chunk from prepare's seed
            x, y = draw_datasets(meta["seed"], n, part, beta_star, meta["noise_sd"])
            sl = slice(part.start, part.stop)
            rows = coverage_rows(x.to(device), y.to(device), {k: v[sl].to(device) for k, v in coefs.items()},
                                 bounds, beta_star, meta["noise_sd"], cfg.level, n)
            per_rep.append(rows.with_columns(pl.col("rep") + part.start))
    per_rep = pl.concat(per_rep)
    per_rep.write_parquet(ctx.out / "per_rep.parquet")
    coverage = summarize_coverage(per_rep)
    coverage.write_parquet(ctx.out / "coverage.parquet")

    pens = Penalties(**tmeta["scales"])  # the penalty constants train used
    rows, groups = [], []
    for n in tqdm(meta["ns"], desc="evaluate: Monte-Carlo r(h_n) per n"):
        r, g = stability_rows(cfg, meta, pens, n, beta_star, rec)
        rows.extend(r)
        groups.extend(g)
    stability = pl.DataFrame(rows)
    stability.write_parquet(ctx.out / "stability.parquet")
    pl.DataFrame(groups).explode("group", "r").write_parquet(ctx.out / "stability_groups.parquet")
    if cfg.real_example.enabled:   # Part 3: the worked example on real data
        X, y = load_diabetes_xy()
        ex = worked_example(X, y, k=cfg.real_example.folds, lasso_scale=pens.lasso, level=cfg.level,
                            partitions=cfg.real_example.partitions, seed=cfg.real_example.seed,
                            tol=cfg.lasso_tol, max_iter=cfg.lasso_max_iter, backend=rec.backend)
        rec.count("batched_lasso")
        write_json(ctx.out / "real_example.json", ex)
    rec.save(ctx.out)
    write_json(ctx.out / "meta.json", {"level": cfg.level, "reps": meta["reps"], "ns": meta["ns"], "k": meta["k"],
                                       "contrasts": {k: list(v) for k, v in CONTRASTS.items()},
                                       "singles": list(SINGLES), "stability_draws": cfg.stability_draws,
                                       "stability_groups": cfg.stability_groups})
    for row in coverage.filter(pl.col("method") == "cv").iter_rows(named=True):
        ctx.tracker.log({f"coverage/{row['contrast']}/{row['estimator']}/n{row['n']}": row["coverage"]})

