"""evaluate: official metrics per (SCM, τ, method, seed), curves, log-log slopes, per-round time.

From the logged contexts and actions: cumulative regret against each round's best truly fair arm,
violation max|effect| − τ (and per effect), penalized regret, reward; the uniform-random policy's
expected reward (trivial baseline). Slopes of log cumulative value on log t over t ∈ [t_min, T],
t_min = max(2⌊√T⌋, T/20). Per-round wall-clock of the OMD estimator update vs a recompute-from-
history logistic MLE at several t (runtime only: never used by a claim).
Writes results.json, curves.parquet and timing.json.
"""
from __future__ import annotations

import math
import time

import numpy as np
import polars as pl
import torch
from pydantic import Field

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.fair_bandits.methods import OMDEstimator
from stages.fair_bandits.metrics import round_metrics, summarize
from stages.fair_bandits.scm import World, load_scm


class Config(StageConfig):
    seed: int = 0
    timing_ts: list[int] = Field(default=[100, 1000, 10000], min_length=2, max_length=8)
    timing_reps: int = Field(20, ge=1, le=1000)
    mle_newton_steps: int = Field(3, ge=1, le=50, description="Newton steps of the history MLE per round")


def history_mle_step(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, steps: int, lam: float) -> torch.Tensor:
    """Recompute-from-history estimator: `steps` Newton steps of the ridge-logistic MLE on all t rows."""
    for _ in range(steps):
        s = torch.sigmoid(X @ theta)
        grad = X.T @ (s - y) + lam * theta
        hess = (X * (s * (1 - s))[:, None]).T @ X + lam * torch.eye(X.shape[1], dtype=X.dtype)
        theta = theta - torch.linalg.solve(hess, grad)
    return theta


def timing_study(cfg: Config, p: int) -> list[dict]:
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for t in cfg.timing_ts:
        X = torch.randn(t, p, generator=g, dtype=torch.float64)
        X = X / X.norm(dim=1, keepdim=True)
        y = (torch.rand(t, generator=g, dtype=torch.float64) < 0.5).to(torch.float64)
        est = OMDEstimator(1, p, 1.0, 0.01, "cpu")
        t0 = time.perf_counter()
        for r in range(cfg.timing_reps):
            est.update(X[r % t][None], y[r % t][None])
        omd = (time.perf_counter() - t0) / cfg.timing_reps
        theta = torch.zeros(p, dtype=torch.float64)
        t0 = time.perf_counter()
        for _ in range(cfg.timing_reps):
            history_mle_step(theta, X, y, cfg.mle_newton_steps, 1.0)
        mle = (time.perf_counter() - t0) / cfg.timing_reps
        rows.append({"t": t, "omd_s": omd, "history_mle_s": mle})
    return rows


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    prep, trained = ctx.input("prepare"), ctx.input("train")
    pmeta, tmeta = read_json(prep / "meta.json"), read_json(trained / "meta.json")
    contexts = torch.load(prep / "contexts.pt")
    T, seeds = pmeta["horizon"], pmeta["seeds"]
    S = len(seeds)
    t_min = max(2 * int(math.sqrt(T)), T // 20, 1)
    results, curve_rows = {}, []
    p = None
    for name, sm in pmeta["scms"].items():
        world = World(load_scm(prep / f"{name}.scm.json"))
        p = world.p
        logs = torch.load(trained / f"logs_{name}.pt")
        taus = sm["taus"]
        tau_b = torch.tensor([t for t in taus for _ in seeds], dtype=torch.float64)
        ctxs = contexts[name].long()
        uniform = world.mu[ctxs].mean(-1).sum(1)                               # (B,) expected reward
        res = {}
        for ti, tau in enumerate(taus):
            label = "tau" if ti == 0 else "tau0"
            sl = slice(ti * S, (ti + 1) * S)
            res[label] = {"tau": tau, "uniform_reward": uniform[sl].tolist(), "methods": {}}
        for method, log in logs.items():
            summ = summarize(round_metrics(world, tau_b, ctxs, log["act"]), T, t_min)
            for ti, tau in enumerate(taus):
                label = "tau" if ti == 0 else "tau0"
                sl = slice(ti * S, (ti + 1) * S)
                res[label]["methods"][method] = {
                    "final": {k: v[sl] for k, v in summ["final"].items()},
                    "slopes": {k: v[sl] for k, v in summ["slopes"].items()},
                    "empty_set_rounds": log["n_fallback"][sl].tolist()}
                for key, curves in summ["curves"].items():
                    arr = np.asarray(curves[sl])
                    for j, t in enumerate(summ["checkpoints"]):
                        curve_rows.append({"scm": name, "tau": label, "method": method, "metric": key, "t": t,
                                           "mean": float(arr[:, j].mean()),
                                           "se": float(arr[:, j].std(ddof=1) / math.sqrt(S)) if S > 1 else 0.0})
        results[name] = res
    write_json(ctx.out / "results.json", {"horizon": T, "seeds": seeds, "slope_window": [t_min, T],
                                          "scms": results, "skipped": tmeta["skipped"]})
    pl.DataFrame(curve_rows).write_parquet(ctx.out / "curves.parquet")
    write_json(ctx.out / "timing.json", {"rows": timing_study(cfg, p), "newton_steps": cfg.mle_newton_steps,
                                         "reps": cfg.timing_reps})
