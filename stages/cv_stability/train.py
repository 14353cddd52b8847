"""train: fit OLS, soft-thresholded OLS (two thresholds) and the Lasso on every (rep, fold).

For each n, the data sets are regenerated from prepare's seed in chunks of replications
(simulate.draw_datasets; nothing of size reps × n is ever held). The training set of fold j is everything outside fold j; its Gram statistics are the
full-sample ones minus the fold's. OLS is a batched solve, ST thresholds it, and all reps × k Lasso
problems go through kernels.batched_lasso in one call. Writes coefs_n{n}.pt = {model: (reps, k, d)}
and meta.json (penalties per n, Lasso iteration counts).
"""
from __future__ import annotations

import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from kernels.batched_lasso import batched_lasso
from kernels.record import KernelRecord
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.cv_stability.models import MODELS, Penalties, fit_models
from stages.cv_stability.simulate import draw_datasets, rep_chunks


class Config(StageConfig):
    st_scale_low: float = Field(1.0, gt=0, le=100.0, description="ST threshold λ_n = c/√n (the lower of the two)")
    st_scale_high: float = Field(2.0, gt=0, le=100.0, description="second ST threshold constant (> st_scale_low)")
    lasso_scale: float = Field(1.0, gt=0, le=100.0, description="Lasso penalty α_n = c/√n (scikit-learn scaling)")
    lasso_tol: float = Field(1e-10, gt=0, le=1e-2, description="ISTA stops when max |Δβ| <= tol")
    lasso_max_iter: int = Field(10_000, ge=1, le=1_000_000)
    device: DeviceName = "auto"

    @model_validator(mode="after")
    def _check_thresholds(self):
        if self.st_scale_high <= self.st_scale_low:
            raise ValueError(f"st_scale_high: must exceed st_scale_low ({self.st_scale_high} <= {self.st_scale_low})")
        return self

    def penalties(self) -> Penalties:
        return Penalties(st_low=self.st_scale_low, st_high=self.st_scale_high, lasso=self.lasso_scale)


def fold_statistics(x: torch.Tensor, y: torch.Tensor, bounds: list[tuple[int, int]]):
    """Training-set Gram statistics for every fold: XᵀX (R, k, d, d), Xᵀy (R, k, d), sizes (k,)."""
    gram_f = torch.stack([x[:, a:b].transpose(1, 2) @ x[:, a:b] for a, b in bounds], 1)
    xty_f = torch.stack([(x[:, a:b].transpose(1, 2) @ y[:, a:b, None])[..., 0] for a, b in bounds], 1)
    n = x.shape[1]
    sizes = torch.tensor([n - (b - a) for a, b in bounds], dtype=x.dtype)
    return gram_f.sum(1, keepdim=True) - gram_f, xty_f.sum(1, keepdim=True) - xty_f, sizes


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    pens = cfg.penalties()
    beta_star = torch.tensor(meta["beta_star"], dtype=torch.float64)
    info = {"models": list(MODELS), "scales": {"st_low": pens.st_low, "st_high": pens.st_high, "lasso": pens.lasso},
            "penalties": {}, "lasso_iters": {}}
    for n in tqdm(meta["ns"], desc="train: fit models on every (rep, fold)"):
        bounds = [tuple(b) for b in meta["folds"][str(n)]]
        stats = [fold_statistics(*draw_datasets(meta["seed"], n, part, beta_star, meta["noise_sd"]), bounds)
                 for part in rep_chunks(meta["reps"], n)]  # regenerated chunk by chunk from the seed
        gram, xty = torch.cat([s[0] for s in stats]).to(device), torch.cat([s[1] for s in stats]).to(device)
        sizes = stats[0][2].to(device)
        lam = pens.at(n)
        coefs, iters = fit_models(gram, xty, sizes.expand(gram.shape[:2]), lam, cfg.lasso_tol,
                                  cfg.lasso_max_iter, rec.backend)
        rec.count("batched_lasso")
        if n == meta["ns"][0]:  # the Triton path vs the reference on this n's first 64 fold problems
            m = sizes.expand(gram.shape[:2])[..., None]
            g, b = (gram / m[..., None]).reshape(-1, *gram.shape[-2:])[:64], (xty / m).reshape(-1, xty.shape[-1])[:64]
            rec.parity("batched_lasso", batched_lasso, g, b, lam["lasso"], tol=cfg.lasso_tol,
                       max_iter=cfg.lasso_max_iter, slice=f"first 64 (rep, fold) Lasso problems at n = {n}")
        torch.save({k: v.contiguous().cpu() for k, v in coefs.items()}, ctx.out / f"coefs_n{n}.pt")
        info["penalties"][str(n)] = lam
        info["lasso_iters"][str(n)] = {"mean": float(iters.float().mean()), "max": int(iters.max())}
        if int(iters.max()) >= cfg.lasso_max_iter:
            raise RuntimeError(f"train@cv_stability: the Lasso did not reach tol={cfg.lasso_tol} within "
                               f"lasso_max_iter={cfg.lasso_max_iter} at n={n}; raise lasso_max_iter")
        ctx.tracker.log({f"lasso_iters_mean/n{n}": info["lasso_iters"][str(n)]["mean"]})
    rec.save(ctx.out)
    write_json(ctx.out / "meta.json", info)
