"""prepare: the design of the `reps` independent data sets of every size n (Gaussian linear model).

Writes meta.json only: the seed, sizes, β*, σ, k, the folds and how each data set is generated. The
data themselves (reps × n × d floats: ~1 GB at n = 12,800) are not stored: data set r at size n is
regenerated bit-for-bit from its own stream (stages.cv_stability.simulate.draw_datasets, numpy
default_rng([seed, n, r]), float64) by train and evaluate, chunk by chunk. The k-fold partition is
contiguous blocks (simulate.fold_bounds), a uniformly random partition in distribution.
"""
from __future__ import annotations

import math

import torch
from pydantic import Field, model_validator

from kernels.batched_lasso import MAX_D
from stages.common.config import PositiveInt, Seed, StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.cv_stability.simulate import draw_datasets, fold_bounds


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
            raise ValueError(f"ns: sample size {big[0]} is above the bound 50,000 (compute: reps × n × d draws per stage)")
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


GENERATOR = ("numpy default_rng([seed, n, rep]) per data set; x = standard_normal((n, d)), "
             "eps = standard_normal(n), float64; y = x @ beta_star + noise_sd * eps")


def run(cfg: Config, ctx: StageContext) -> None:
    beta_star = torch.tensor(cfg.beta_star, dtype=torch.float64)
    # a fingerprint of the generated data (first point of data set 0 at every n), so that a change
    # of generator shows up as a change of this stage's output
    probe = {str(n): draw_datasets(cfg.seed, n, range(1), beta_star, cfg.noise_sd)[1][0, :3].tolist()
             for n in cfg.ns}
    write_json(ctx.out / "meta.json", {
        "ns": cfg.ns, "reps": cfg.reps, "k": cfg.k, "d": len(cfg.beta_star), "beta_star": cfg.beta_star,
        "noise_sd": cfg.noise_sd, "seed": cfg.seed, "batches": cfg.batches, "generator": GENERATOR,
        "fingerprint_y": probe, "folds": {str(n): fold_bounds(n, cfg.k) for n in cfg.ns}})
