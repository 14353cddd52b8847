"""train: run every learner on every SCM, all (τ, seed) instances at once (the bandit learning).

The four logistic methods share one batch (instances = method × τ × seed); tabular and the oracle
run in their own. Each round is one kernels.fair_round_step call over the whole batch (Triton on
CUDA, the torch reference on CPU; its Triton path is checked under the interpreter on one real
round). Writes logs_<scm>.pt = {method: {"act": (B, T) int16, "n_fallback": (B,), "lam": (B, 3)}}
and meta.json (methods run, skipped ones with the reason).
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator

from kernels.record import KernelRecord
from stages.common.config import StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.fair_bandits.scm import World, load_scm
from stages.fair_bandits.simulate import predraw, run_methods

Method = Literal["dologb", "dologb_scaled", "ucb", "primal_dual", "tabular", "oracle"]


class Config(StageConfig):
    methods: list[Method] = Field(default=["dologb", "dologb_scaled", "ucb", "primal_dual", "tabular", "oracle"],
                                  min_length=1)
    rho: float = Field(10.0, gt=0, le=1e4, description="primal_dual dual cap ρ; dual step ρ/√T")
    beta_scale: float = Field(0.1, gt=0, le=1.0, description="dologb_scaled: multiplier of the radius β_t")
    parity_round: int = Field(200, ge=1, description="round whose real kernel inputs are checked against Triton")
    device: DeviceName = "auto"

    @field_validator("methods")
    @classmethod
    def _m(cls, v):
        return unique_items(v, "methods")


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    contexts = torch.load(prep / "contexts.pt")
    T, seeds = meta["horizon"], meta["seeds"]
    info = {"methods": list(cfg.methods), "skipped": {}, "device": str(device), "rho": cfg.rho,
            "beta_scale": cfg.beta_scale}
    checked = False
    for name, sm in meta["scms"].items():
        world = World(load_scm(prep / f"{name}.scm.json"), device)
        draws = predraw(seeds, T, world.K, device)
        skipped = {}
        out = run_methods(list(cfg.methods), world, sm["taus"], seeds, T, rec.backend, cfg.rho, rec=rec, draws=draws,
                          contexts=contexts[name].long().numpy(), beta_scale=cfg.beta_scale,
                          parity_round=None if checked else min(cfg.parity_round, T), skipped=skipped)
        checked = True
        if skipped:
            info["skipped"][name] = skipped
        logs = {}
        for method, log in out.items():
            logs[method] = {k: v.cpu() for k, v in log.items() if k != "ctx"}
            ctx.tracker.log({f"{name}/{method}/fallback_rounds": float(log["n_fallback"].float().mean())})
        torch.save(logs, ctx.out / f"logs_{name}.pt")
    rec.save(ctx.out)
    write_json(ctx.out / "meta.json", info)
