"""prepare: draw `reps` independent data sets of every size n from the Gaussian linear model.

Writes n{n}.pt = {"x": (reps, n, d) float32, "y": (reps, n) float32} and meta.json. The data are
stored at float32 (downstream arithmetic is float64); the k-fold partition is contiguous blocks
(stages.cv_stability.simulate.fold_bounds), a uniformly random partition in distribution.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from kernels.batched_lasso import MAX_D
from stages.common.config import PositiveInt, Seed, StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.cv_stability.simulate import fold_bounds


class Config(StageConfig):
    seed: Seed = 0
    ns: list[int] = Field(default=[200, 800, 3200], min_length=2, max_length=12,
                          description="sample sizes n (strictly increasing, each > 0, at most 50,000)")
    reps: int = Field(400, ge=2, le=20_000, description="independent data sets per n (coverage replications)")
    batches: PositiveInt = Field(5, le=50, description="replication batches (independent streams) that the "
                                 "claims treat as seeds: reps are split into this many interleaved groups")
    k: int = Field(10, ge=2, le=100, description="number of CV folds (2 <= k <= n)")
    beta_star: list[float] = Field(default=[3.0, 1.0, -5.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                                   min_length=1, max_length=MAX_D, description="true coefficients β*")
    noise_sd: float = Field(1.0, gt=0, le=1e3, description="σ of ε")

    @model_validator(mode="after")
    def _check_sizes(self):
        bad = [n for n in self.ns if n <= 0]
        if bad:
            raise ValueError(f"ns: every sample size n must be positive (got {bad[0]})")
        big = [n for n in self.ns if n > 50_000]
        if big:
            raise ValueError(f"ns: sample size {big[0]} is above the bound 50,000 (memory: reps × n × d floats)")
        if self.reps < 2 * self.batches:
            raise ValueError(f"batches: {self.batches} batches need reps >= {2 * self.batches} (got {self.reps})")
        if any(b <= a for a, b in zip(self.ns, self.ns[1:])):
            raise ValueError(f"ns: sample sizes must be strictly increasing (got {self.ns})")
        d = len(self.beta_star)
        for n in self.ns:
            if self.k > n:
                raise ValueError(f"k: {self.k} folds exceed the sample size n = {n} (ns); need 2 <= k <= n")
            if n // self.k < 2:
                raise ValueError(f"k: n = {n} with k = {self.k} folds leaves folds of < 2 points; "
                                 "the within-fold variance needs >= 2 points per fold")
            if n - math.ceil(n / self.k) <= d:
                raise ValueError(f"ns: n = {n} leaves training sets of {n - math.ceil(n / self.k)} points "
                                 f"with k = {self.k}; OLS needs more than d = {d}")
        return self


def run(cfg: Config, ctx: StageContext) -> None:
    beta_star = np.asarray(cfg.beta_star, dtype=np.float64)
    d = beta_star.shape[0]
    for n in tqdm(cfg.ns, desc="prepare: data sets per n"):
        x = np.empty((cfg.reps, n, d), dtype=np.float32)
        y = np.empty((cfg.reps, n), dtype=np.float32)
        for r in range(cfg.reps):
            rng = np.random.default_rng([cfg.seed, n, r])  # an independent stream per data set
            x[r] = rng.standard_normal((n, d), dtype=np.float32)
            eps = rng.standard_normal(n, dtype=np.float32)
            y[r] = x[r].astype(np.float64) @ beta_star + cfg.noise_sd * eps  # Y = Xᵀβ* + ε
        torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, ctx.out / f"n{n}.pt")
    write_json(ctx.out / "meta.json", {
        "ns": cfg.ns, "reps": cfg.reps, "k": cfg.k, "d": d, "beta_star": cfg.beta_star,
        "noise_sd": cfg.noise_sd, "seed": cfg.seed, "batches": cfg.batches,
        "folds": {str(n): fold_bounds(n, cfg.k) for n in cfg.ns}})
